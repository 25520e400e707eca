"""A persistent PyTorch TCPStore client for the interop tests, so PyTorch is
imported once per server rather than once per snippet.

    python torch_store_client.py HOST PORT

Connects as a plain client (no world-size check-in), prints "READY", then reads
one JSON-encoded snippet of Python per line and execs it with `store` (the
TCPStore) and `P(prefix, ...)` (nested PrefixStores, outermost argument first)
in scope. After each snippet it prints "DONE" + JSON of what the snippet
printed, or "FAIL" + JSON of the traceback. Exits when stdin closes.
"""
import contextlib
import datetime
import io
import json
import sys
import traceback

import torch.distributed as dist


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))

    def P(*prefixes):
        s = store
        for p in prefixes:
            s = dist.PrefixStore(p, s)
        return s

    env = {"store": store, "P": P, "dist": dist}
    print("READY", flush=True)
    for line in sys.stdin:
        code = json.loads(line)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(code, env)
            print("DONE " + json.dumps(out.getvalue()), flush=True)
        except Exception:
            print("FAIL " + json.dumps(traceback.format_exc()), flush=True)


if __name__ == "__main__":
    main()
