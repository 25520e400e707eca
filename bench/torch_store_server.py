#!/usr/bin/env python3
"""Serve a PyTorch TCPStore on 127.0.0.1 for the store benchmark.

Run it with the interpreter whose PyTorch you want to measure:
  /usr/bin/python3 bench/torch_store_server.py                  # 1.13, legacy daemon, v1
  venv-torch2/bin/python bench/torch_store_server.py --libuv 1  # 2.x libuv daemon, v2
  venv-torch2/bin/python bench/torch_store_server.py --libuv 0  # 2.x legacy daemon, v2
Prints one line `torch_store_server listening on 127.0.0.1:PORT torch=VER backend=NAME pid=PID`
when ready, then serves until SIGTERM/SIGINT, until its parent process dies, or until
--max-seconds pass, whichever comes first. The daemon is a thread of this process, so
this process's RSS is the server's RSS (it includes libtorch itself).
"""
import argparse
import datetime
import os
import signal
import sys
import threading


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--libuv", choices=["0", "1"], default=None,
                    help="2.x only: 1 = libuv daemon, 0 = legacy daemon")
    ap.add_argument("--max-seconds", type=float, default=900.0)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    kw = {}
    backend = "legacy"
    if args.libuv is not None:
        if torch.__version__.startswith("1."):
            sys.exit("torch_store_server: --libuv needs PyTorch 2.x")
        kw["use_libuv"] = args.libuv == "1"
        backend = "libuv" if kw["use_libuv"] else "legacy"
    store = dist.TCPStore(args.host, args.port, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60), **kw)
    if args.libuv is not None and hasattr(store, "libuvBackend"):
        backend = "libuv" if store.libuvBackend else "legacy"

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())

    def watch_parent(ppid):
        # Exits with the parent that started it (a benchmark killed hard must not
        # leave servers behind); an orphan at start is bounded by --max-seconds.
        while not done.wait(0.5):
            if os.getppid() != ppid:
                done.set()

    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    print(f"torch_store_server listening on {args.host}:{store.port} "
          f"torch={torch.__version__} backend={backend} pid={os.getpid()}", flush=True)
    done.wait(args.max_seconds)
    # os._exit: the TCPStore destructor may block joining its daemon thread while
    # thousands of benchmark connections are still open.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
