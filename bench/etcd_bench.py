#!/usr/bin/env python3
"""The etcd rendezvous backend beside c10d, in one run.

Usage: etcd_bench.py [BUILD] [--ks 2,16,...] [--failover-reps N] [--out FILE]

1. In-process rounds: bench/rdzv_bench (K rendezvous clients, one thread and
   connection each, the agent's own join code) against a crun store and then
   against a one-member etcd, for each K; one JSON line each, plus etcd's own
   count of gRPC requests it handled (its /metrics) per node.
2. Fail-over: a three-member cluster; bench/etcd_failover adds to a counter
   back to back, keeps a lease and has a second handle blocked on a key,
   talking to the leader first; after 2 s the leader is killed (SIGKILL) or
   frozen (SIGSTOP, as a partitioned host). Reported: the longest stall of
   the adds, whether the lease survived and the counter stayed exact, and how
   late the blocked waiter woke after the final set.
Real agents: bench/rdzv_vs_torchrun.py --backends c10d,etcd.
Runs in its own network namespace (only lo) when it can, so the loopback bytes are its own.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

from benchlib import ROOT, in_own_netns
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from etcd_cluster import EtcdCluster  # noqa: E402


def log(msg):
    print(f"etcd_bench: {msg}", file=sys.stderr, flush=True)


def grpc_handled(cl):
    """Sum of etcd's grpc_server_handled_total (every member)."""
    n = 0
    for m in cl.members:
        with urllib.request.urlopen(cl.url(m) + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("grpc_server_handled_total{"):
                    n += float(line.rsplit(" ", 1)[1])
    return n


def in_process(build, ks):
    rows = []
    exe = os.path.join(build, "bench", "rdzv_bench")
    for k in ks:
        r = subprocess.run([exe, str(k)], capture_output=True, text=True, timeout=900)
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        log(rows[-1])
    cl = EtcdCluster(1)
    try:
        for k in ks:
            before = grpc_handled(cl)
            r = subprocess.run([exe, "--etcd", cl.endpoints(), str(k)], capture_output=True,
                               text=True, timeout=1800)
            if r.returncode != 0 or not r.stdout.strip():
                rows.append({"backend": "etcd", "k": k, "ok": 0, "why": r.stderr[-300:]})
                log(rows[-1])
                break
            row = json.loads(r.stdout.strip().splitlines()[-1])
            row["requests"] = grpc_handled(cl) - before
            row["requests_per_node"] = row["requests"] / k
            rows.append(row)
            log(row)
    finally:
        cl.close()
    return rows


def failover(build, reps):
    exe = os.path.join(build, "bench", "etcd_failover")
    rows = []
    for how in ("kill", "freeze"):
        for _ in range(reps):
            cl = EtcdCluster(3)
            try:
                leader = cl.leader()
                p = subprocess.Popen([exe, cl.endpoints(first=leader), "8"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                time.sleep(2)
                (cl.kill if how == "kill" else cl.freeze)(leader)
                o, e = p.communicate(timeout=120)
                row = json.loads(o.strip().splitlines()[-1]) if o.strip() else {"why": e}
                row["how"] = how
                rows.append(row)
                log(row)
            finally:
                cl.close()
    return rows


def table(ip, fo):
    out = ["| K | c10d (s) | etcd (s) | c10d requests / node | etcd requests / node "
           "| c10d loopback bytes / node | etcd loopback bytes / node |",
           "|---|---|---|---|---|---|---|"]
    by = {(r.get("backend", "c10d"), r["k"]): r for r in ip}
    for k in sorted({r["k"] for r in ip}):
        c, e = by.get(("c10d", k)), by.get(("etcd", k))
        es = (f"{e['seconds']:.3f}" if e and e.get("ok") == k else
              f"failed: {e.get('why', '')[:80] if e else 'not run'}")
        cr = f"{c['requests_per_node']:.1f}"
        cb = f"{c['lo_bytes_per_node']:,.0f}".replace(",", " ")
        out.append(f"| {k} | {c['seconds']:.3f} | {es} | {cr} | "
                   f"{e['requests_per_node']:.1f} | {cb} | "
                   f"{e['lo_bytes_per_node']:,.0f} |".replace(",", " ")
                   if e and e.get("ok") == k else
                   f"| {k} | {c['seconds']:.3f} | {es} | {cr} | | {cb} | |")
    out += ["", "| leader | stall of back-to-back adds (ms) | lease kept | counter exact "
            "| waiter woke (ms after the set) |", "|---|---|---|---|---|"]
    for r in fo:
        if "max_gap_ms" not in r:
            out.append(f"| {r['how']} | failed: {r.get('why', '')[:80]} | | | |")
            continue
        out.append(f"| {'killed (SIGKILL)' if r['how'] == 'kill' else 'frozen (SIGSTOP)'} "
                   f"| {r['max_gap_ms']} | {'yes' if r['lease_kept'] else 'NO'} "
                   f"| {'yes' if r['counter_ok'] else 'NO'} | {r['waiter_lag_ms']} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.environ.get("CRUN_BUILD",
                                                               os.path.join(ROOT, "build")))
    ap.add_argument("--ks", default="2,16,64,256,1024")
    ap.add_argument("--failover-reps", type=int, default=3)
    ap.add_argument("--out")
    cfg = ap.parse_args()
    # A private network namespace (only lo): the loopback bytes are this run's alone.
    if os.environ.get("CRUN_BENCH_NETNS") != "1":
        rc = in_own_netns(__file__, sys.argv[1:])
        if rc is not None:
            return rc
        log("cannot create a network namespace; loopback bytes include other traffic")
    ks = [int(x) for x in cfg.ks.split(",") if x]
    t0 = time.monotonic()
    text = table(in_process(cfg.build, ks), failover(cfg.build, cfg.failover_reps))
    text += f"\nWhole run: {time.monotonic() - t0:.0f} s.\n"
    print(text)
    if cfg.out:
        with open(cfg.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
