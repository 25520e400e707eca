"""Runs PyTorch's own TCPStore server on 127.0.0.1 for the interop tests.

    python torch_store_server.py [--libuv 0|1] [--count N]

Prints "PORT <n>" once the store listens (a line for each of N servers of
their own, default 1: one import of PyTorch for several fresh stores), then
sleeps until killed (or until stdin closes, so a crashed test never leaves it
behind). Works with torch 1.13
(no use_libuv argument: the legacy server, v1 dialect) and 2.x (v2).
"""
import argparse
import datetime
import sys

import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--libuv", type=int, choices=(0, 1), default=None)
    ap.add_argument("--count", type=int, choices=range(1, 17), default=1)
    args = ap.parse_args()
    kw = {}
    if args.libuv is not None:
        kw["use_libuv"] = bool(args.libuv)
    stores = []
    for _ in range(args.count):
        stores.append(dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=60), **kw))
        print(f"PORT {stores[-1].port}", flush=True)
    sys.stdin.read()  # returns when the test closes our stdin or dies
    del stores


if __name__ == "__main__":
    main()
