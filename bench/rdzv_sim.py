#!/usr/bin/env python3
"""The 12k-node rendezvous: crun's real round logic for K simulated agents (bench/rdzv_sim.c)
against crun-rdzvd on loopback, beside torchrun's rendezvous (bench/torch_rdzv_sim.py).

Usage: rdzv_sim.py [BUILD] [--ks 1024,2048,...] [--faults-k K] [--torch-ks 8,16,...]
                   [--torch-limit S] [--seed N] [--out FILE.md] [--json FILE] [--plot FILE.svg]

For each K a fresh crun-rdzvd is started (--max-conns 65536: the automatic limit keeps an eighth
of the 20,000 descriptors in reserve) and bench/rdzv_sim runs K agents, one store connection
each, MIN = K - 1, MAX = K, last_call_timeout 0.5 s, lease TTL 10 s, heartbeat 2 s (--conf):
  form  the K agents form a round (the K-th ticket closes it at once);
  fail  one member (seeded) is killed: its connection reset; its lease ends, the survivors'
        monitors see the change and the next round of K - 1 forms (after the 0.5 s last call).
Then at --faults-k, one run each of: 1% of the members cut off (socket left open, never serviced:
their leases lapse after the TTL), --late 1% of the agents started after the first round formed,
and 1% killed while they join (when the last agent has connected).
Reported: seconds, store requests and bytes (sent + received) per agent in the round, "extra
rounds" (rounds between the first and the one after the kill that no injected fault asked for:
a lease that lapsed because its agent was starved of the CPU past the TTL), the
server's CPU seconds and peak RSS over the whole run (both rounds), whether every rank was
unique and 0..n-1. torchrun: K handler objects on threads in one process (see that script),
K doubling from the first --torch-ks value while a run took under --torch-limit / 2.5.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import loglog_svg  # noqa: E402
from store_bench import (TORCH2, Server, RssSampler, proc_status, raise_nofile)  # noqa: E402

KS = (1024, 2048, 4096, 8192, 12288)
# A lease TTL of 10 s, not crun's default 3 s: one thread here plays 12,288 agents on a 2-core
# machine shared with the store, and at the join burst it cannot send every agent's keep-alive
# within 3 s (with 3 s, 12,288 agents lost leases, see the README's scale section).
CONF = ("join_timeout=600,read_timeout=60,last_call_timeout=0.5,heartbeat_interval=2,"
        "lease_ttl=10")


def log(msg):
    print(f"rdzv_sim: {msg}", file=sys.stderr, flush=True)


def sim_once(build, k, extra, seed, timeout_s, conf=CONF):
    srv = Server("crun-rdzvd", [os.path.join(build, "bin", "crun-rdzvd"), "--host", "127.0.0.1",
                                "--port", "0", "--status", "off", "--log-level", "error",
                                "--max-conns", "65536"])
    res = {"k": k, "args": " ".join(extra), "phases": {}}
    try:
        srv.start()
        if not srv.wait_ready(20):
            res["error"] = "crun-rdzvd did not start: " + " | ".join(srv.lines[-3:])
            return res
        before = proc_status(srv.proc.pid)
        argv = [os.path.join(build, "bench", "rdzv_sim"), "--port", str(srv.port), "-k", str(k),
                "--seed", str(seed), "--conf", conf, "--timeout", str(timeout_s)] + extra
        res["cmd"] = " ".join(argv[:1] + ["--port", "P"] + argv[3:])
        t0 = time.monotonic()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        with RssSampler(srv.proc.pid) as rss:
            try:
                p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 30)
                out, err, rc = p.stdout, p.stderr, p.returncode
            except subprocess.TimeoutExpired as e:
                out, err, rc = (e.stdout or b"").decode(), (e.stderr or b"").decode(), 124
        res["wall_s"] = round(time.monotonic() - t0, 2)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        res["sim_cpu_s"] = round(ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime, 2)
        after = proc_status(srv.proc.pid)
        for line in out.splitlines():
            if line.startswith("{"):
                ph = json.loads(line)
                res["phases"][ph["phase"]] = ph
        res["ok"] = rc == 0
        if rc != 0:
            res["error"] = (err.strip().splitlines() or [f"exit {rc}"])[-1][:300]
        if before and after:
            res["server_cpu_s"] = round(after[2] - before[2], 2)
            res["server_hwm_mb"] = round(max(after[1], rss.peak_kb) / 1024, 1)
    finally:
        srv.stop()
    return res


def torch_once(k, limit_s):
    argv = [TORCH2, os.path.join(HERE, "torch_rdzv_sim.py"), str(k), "--timeout", str(limit_s)]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=limit_s + 60)
    except subprocess.TimeoutExpired:
        return {"k": k, "ok": False, "error": "killed"}
    line = next((l for l in p.stdout.splitlines() if l.startswith("{")), None)
    return json.loads(line) if line else {"k": k, "ok": False, "error": p.stderr[-300:]}


def fmt(v, spec="{:.2f}"):
    return "-" if v is None else spec.format(v)


def table(runs, faults, torch, env):
    L = [f"Machine: {env}", "",
         "crun (bench/rdzv_sim: K agents on one event loop, one connection each, "
         "crun-rdzvd on loopback):", "",
         "| K | form s | req/agent | bytes/agent | kill 1: detect s | next round s "
         "| req/agent | bytes/agent | extra rounds | server CPU s | server peak RSS MB | sim CPU s "
         "| ranks |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        f, x = r["phases"].get("form", {}), r["phases"].get("fail", {})
        L.append(f"| {r['k']:,} | {fmt(f.get('t_s'))} | {fmt(f.get('req_per_agent'), '{:.1f}')} "
                 f"| {fmt(f.get('bytes_per_agent'), '{:,.0f}')} | {fmt(x.get('detect_s'))} "
                 f"| {fmt(x.get('reform_s'))} | {fmt(x.get('req_per_agent'), '{:.1f}')} "
                 f"| {fmt(x.get('bytes_per_agent'), '{:,.0f}')} "
                 f"| {x['round'] - f['round'] - 1 if x and f else '-'} "
                 f"| {fmt(r.get('server_cpu_s'))} "
                 f"| {fmt(r.get('server_hwm_mb'), '{:.1f}')} | {fmt(r.get('sim_cpu_s'))} "
                 f"| {'ok' if r.get('ok') else 'FAILED: ' + r.get('error', '')} |")
    if faults:
        L += ["", "Faults (one run each):", "",
              "| K | injected | phase | round of | s | detect s | next round s | ranks |",
              "|---|---|---|---|---|---|---|---|"]
        for r in faults:
            for name, ph in r["phases"].items():
                L.append(f"| {r['k']:,} | {r['args']} | {name} | {ph['n']:,} | "
                         f"{fmt(ph.get('t_s'))} | {fmt(ph.get('detect_s'))} "
                         f"| {fmt(ph.get('reform_s'))} | {'ok' if ph['ranks_ok'] else 'BAD'} |")
            if not r.get("ok"):
                L.append(f"| {r['k']:,} | {r['args']} | FAILED: {r.get('error', '')} |||||| ")
    if torch:
        L += ["", "torchrun 2.x rendezvous (bench/torch_rdzv_sim.py: K DynamicRendezvousHandler "
              "objects on threads in one process, one TCPStore client each, MIN = MAX = K):", "",
              "| K | s | process CPU s | state blob bytes | ranks |", "|---|---|---|---|---|"]
        for t in torch:
            L.append(f"| {t['k']:,} | {fmt(t.get('t_s'))} | {fmt(t.get('cpu_s'))} "
                     f"| {fmt(t.get('state_bytes'), '{:,}')} "
                     f"| {'ok' if t.get('ranks_ok') else 'FAILED: ' + t.get('error', '')} |")
    return "\n".join(L) + "\n"


def plot(runs, torch, path):
    loglog_svg(path, "Rendezvous of K agents (one machine, loopback)", "agents K", "seconds", [
        ("crun: form a round", [(r["k"], r["phases"]["form"]["t_s"]) for r in runs
                                if "form" in r["phases"]]),
        ("crun: next round after a kill",
         [(r["k"], r["phases"]["fail"]["reform_s"]) for r in runs
          if "reform_s" in r["phases"].get("fail", {})]),
        ("torchrun 2.x: form a round", [(t["k"], t["t_s"]) for t in torch if t.get("ok")])])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?", default=os.environ.get("CRUN_BUILD", "build"))
    ap.add_argument("--ks", default=",".join(map(str, KS)))
    ap.add_argument("--faults-k", type=int, default=12288, help="0: no fault runs")
    ap.add_argument("--torch-ks", default="8", help="first K (doubling), or a list")
    ap.add_argument("--torch-limit", type=float, default=120.0, help="0: no torchrun")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--conf", default=CONF, help="the agents' rdzv_conf")
    ap.add_argument("--timeout", type=int, default=180, help="per simulation run, seconds")
    ap.add_argument("--out")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    a = ap.parse_args()
    nofile = raise_nofile()
    ks = [int(x) for x in a.ks.split(",") if x]
    runs, faults, torch = [], [], []
    for k in ks:
        if k + 64 > nofile:
            log(f"K={k}: needs {k + 64} descriptors, the limit is {nofile}: skipped")
            continue
        r = sim_once(a.build, k, ["--kill", "1"], a.seed, a.timeout, a.conf)
        log(json.dumps(r))
        runs.append(r)
    if a.faults_k:
        k, pct = a.faults_k, max(1, a.faults_k // 100)
        for extra in (["--cut", str(pct)], ["--late", str(pct)],
                      ["--kill-join", str(pct)]):
            r = sim_once(a.build, k, extra, a.seed, a.timeout, a.conf)
            log(json.dumps(r))
            faults.append(r)
    if a.torch_limit > 0 and os.path.exists(TORCH2):
        tks = [int(x) for x in a.torch_ks.split(",") if x]
        k = tks[0]
        for i in range(64):
            if len(tks) > 1 and i >= len(tks):
                break
            k = tks[i] if len(tks) > 1 else k
            t = torch_once(k, a.torch_limit)
            log(json.dumps(t))
            torch.append(t)
            if not t.get("ok") or (len(tks) == 1 and t["t_s"] > a.torch_limit / 2.5):
                break
            k *= 2
    env = (f"{os.cpu_count()} CPUs, {os.uname().release}, "
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    md = table(runs, faults, torch, env)
    print(md)
    if a.out:
        with open(a.out, "w") as f:
            f.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"crun": runs, "faults": faults, "torchrun": torch, "machine": env}, f,
                      indent=1)
    if a.plot:
        plot(runs, torch, a.plot)
    bad = [r for r in runs + faults if not r.get("ok")]
    return 1 if bad and not any(r.get("ok") for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
