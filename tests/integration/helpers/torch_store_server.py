"""Runs PyTorch's own TCPStore server on 127.0.0.1 for the interop tests.

    python torch_store_server.py [--libuv 0|1]

Prints "PORT <n>" once the store listens, then sleeps until killed (or until
stdin closes, so a crashed test never leaves it behind). Works with torch 1.13
(no use_libuv argument: the legacy server, v1 dialect) and 2.x (v2).
"""
import argparse
import datetime
import sys

import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--libuv", type=int, choices=(0, 1), default=None)
    args = ap.parse_args()
    kw = {}
    if args.libuv is not None:
        kw["use_libuv"] = bool(args.libuv)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60), **kw)
    print(f"PORT {store.port}", flush=True)
    sys.stdin.read()  # returns when the test closes our stdin or dies
    del store


if __name__ == "__main__":
    main()
