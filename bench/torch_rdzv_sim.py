#!/usr/bin/env python3
"""torchrun's rendezvous for K agents in ONE process, for rdzv_sim.py's comparison.

Usage (with a PyTorch 2.x interpreter): torch_rdzv_sim.py K [--timeout S] [--last-call S]

This is a simulation, not K torchruns: one TCPStore server (PyTorch's default, libuv in 2.x) and
K DynamicRendezvousHandler objects -- the handler torchrun's c10d backend builds, with its
C10dRendezvousBackend -- each on its own thread with its own TCPStore client connection, all
with MIN = MAX = K, calling next_rendezvous() at once. What it leaves out of a real torchrun:
the process start, the worker spawn, and the GIL is shared by every handler (real agents run in
parallel), so its times are a lower bound on PyTorch's algorithm only while the store is not the
bottleneck. The handler's state is one pickled blob that every agent compare-and-sets; its final
size is reported (bytes each read or write of it moves).

Prints one JSON line: {"k", "ok", "t_s" (start to the last next_rendezvous() returned),
"cpu_s" (this process: server and clients together), "state_bytes", "ranks_ok"}.
"""
import argparse
import json
import os
import sys
import threading
import time
from datetime import timedelta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("k", type=int)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--last-call", type=float, default=1.0)
    a = ap.parse_args()

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (DynamicRendezvousHandler,
                                                                         RendezvousTimeout)

    threading.stack_size(512 * 1024)
    tmo = timedelta(seconds=a.timeout)
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=tmo)
    port = server.port
    run_id = "sim"
    results = [None] * a.k
    errors = []
    go = threading.Event()

    def agent(i):
        try:
            store = TCPStore("127.0.0.1", port, is_master=False, timeout=tmo)
            backend = C10dRendezvousBackend(store, run_id)
            h = DynamicRendezvousHandler.from_backend(
                run_id, store, backend, a.k, a.k, local_addr="127.0.0.1",
                timeout=RendezvousTimeout(join=tmo, last_call=timedelta(seconds=a.last_call),
                                          close=timedelta(seconds=30)))
            go.wait()
            info = h.next_rendezvous()
            results[i] = (info.rank, info.world_size, time.monotonic())
        except Exception as e:   # reported, the run fails
            errors.append(f"agent {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(a.k)]
    for t in threads:
        t.start()
    time.sleep(0.5)          # every handler built before the clock starts
    cpu0 = time.process_time()
    t0 = time.monotonic()
    go.set()
    end = t0 + a.timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    done = [r for r in results if r]
    ok = len(done) == a.k and not errors
    ranks = sorted(r[0] for r in done)
    out = {"k": a.k, "ok": ok, "t_s": round(max(r[2] for r in done) - t0, 3) if ok else None,
           "cpu_s": round(time.process_time() - cpu0, 2),
           "ranks_ok": ok and ranks == list(range(a.k)) and all(r[1] == a.k for r in done)}
    try:
        state = server.get(f"torch.rendezvous.{run_id}")
        out["state_bytes"] = len(state)
    except Exception:        # noqa: BLE001 - a missing key is reported as 0
        out["state_bytes"] = 0
    if not ok:
        out["error"] = errors[0] if errors else f"{len(done)} of {a.k} done in {a.timeout} s"
    print(json.dumps(out), flush=True)
    os._exit(0 if ok else 1)     # handler keep-alive threads would hold the exit


if __name__ == "__main__":
    sys.exit(main())
