"""A well-behaved PyTorch TCPStore client that measures its own latency, for
the attack suite (test_store_attack.py). Runs under torch 1.13 or 2.x and
reads commands on stdin, one per line, answering one line each:

  OPEN host port   -> OPENED            (one TCPStore client, kept open)
  MEASURE n        -> P50 us P99 us MAX us N n ERR e
  QUIT

Each measured op is a set then a get of a small key, as a trainer's store
traffic is; an op that raises counts in ERR and as a 30 s latency.
"""
import sys
import time
from datetime import timedelta

import torch.distributed as dist


def main():
    store = None
    seq = 0
    print("READY", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "OPEN":
            store = dist.TCPStore(cmd[1], int(cmd[2]), is_master=False,
                                  timeout=timedelta(seconds=30))
            print("OPENED", flush=True)
        elif cmd[0] == "MEASURE":
            lat, err = [], 0
            for _ in range(int(cmd[1])):
                seq += 1
                t0 = time.perf_counter()
                try:
                    store.set(f"canary/{seq % 64}", str(seq))
                    assert store.get(f"canary/{seq % 64}") == str(seq).encode()
                except Exception:  # noqa: BLE001 - any failure is what we measure
                    err += 1
                    lat.append(30.0)
                    continue
                lat.append(time.perf_counter() - t0)
            lat.sort()
            n = len(lat)
            print(f"P50 {lat[n // 2] * 1e6:.0f} P99 {lat[min(n - 1, n * 99 // 100)] * 1e6:.0f} "
                  f"MAX {lat[-1] * 1e6:.0f} N {n} ERR {err}", flush=True)
        elif cmd[0] == "QUIT":
            break


if __name__ == "__main__":
    main()
