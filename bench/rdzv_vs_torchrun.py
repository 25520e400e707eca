#!/usr/bin/env python3
"""Rendezvous with K real agents: crun against torchrun (2.x and Debian's 1.13), in one run.

Usage: rdzv_vs_torchrun.py [BUILD] [--out FILE] [--ks-crun 2,4,...] [--ks-torch 2,4,...]
                           [--torch-limit S] [--no-netns] [--keep] [--backends c10d,etcd]
BUILD (or $CRUN_BUILD, default ./build) holds bin/crun and bench/launch_worker.

For each launcher and K, K real agent processes are started on 127.0.0.1, one after another,
each its own process group, all with MIN = MAX = K:
  LAUNCHER --nnodes=K --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:PORT
           --rdzv_id=bench --rdzv_conf=last_call_timeout=T --no_python launch_worker hold FILE
(torchruns also get --monitor_interval=0.1; 1.13 gets --redirects 9:1 --tee 9:1, see
torch-compat.md §4.1). torchrun only takes an integer last_call_timeout, so it gets 1 and crun
0.1; with MIN = MAX the K-th join closes the round and the last call never runs.
Every torchrun agent whose endpoint host is local tries to serve the store; all but one fail to
bind and fall back to clients (its normal way). crun does the same with its own store.

Measured per run:
  time    from just before the first agent is started to the last worker's start, the worker's
          own CLOCK_MONOTONIC stamp (bench/launch_worker "hold": its first act); Python's
          time.monotonic_ns() reads the same clock.
  spawned when this script's K-th Popen() returned (the cost of starting K processes from
          Python, part of the time above).
  bytes   the loopback counters of /proc/net/dev (rx) before the first start and after the
          last agent is reaped: the whole lifetime of the K agents, TCP/IP headers included.
          Only meaningful inside the private network namespace this script makes for itself
          (unshare --net, only lo up); with --no-netns, other loopback traffic counts too.
  RSS     sum over the K agents of their peak RSS. crun: from one extra run (not timed) in
          which every agent runs under bench/launch_run --trace: VmHWM read at the agent's exit
          stop plus the peaks of the helpers it forks (its guard). torchrun: ru_maxrss of
          wait4(), which is the larger of the agent's peak, its worker's (~1 MB) and the
          image it was forked from (this script, ~15 MB): exact for agents of 200+ MB, and
          tracing K torchruns would slow the very runs that are timed.
crun runs every K (median of --reps-crun runs); torchrun runs once per K, K doubling while its
previous run took less than --torch-limit / 2.5 (the next one is predicted to exceed the limit
otherwise); a run not done within --torch-limit is killed and reported as such.
Every process started is killed at the end (process groups, then stray workers), also on failure.
--agent-uids N runs crun's agents under N uids (61000...; needs root): every agent holds an
inotify instance, and one user may hold only fs.inotify.max_user_instances (128 by default), so
K >= 128 agents of one user on one machine fail ("too many open files").
--backends c10d,etcd also runs crun with --rdzv_backend=etcd against a one-member etcd
(/usr/bin/etcd) this script starts in the same namespace (its loopback bytes count too), with a
fresh --rdzv_id per run.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import (ROOT, TORCH1, TORCH2, free_port, in_own_netns, ints, kill_recorded_workers,
                      private_tmpdir)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from etcd_cluster import EtcdCluster  # noqa: E402
LABEL = {"crun": "crun", "crun-etcd": "crun on etcd", "torch2": "torchrun 2.x",
         "torch113": "torchrun 1.13"}
KS_CRUN = (2, 4, 8, 16, 32, 64, 128, 256)
AGENT_UID0 = 61000  # --agent-uids: the first uid
KS_TORCH = (2, 4, 8, 16, 32)
CRUN_LIMIT_S = 30
EXIT_WAIT_S = 30       # after the last worker started, how long the agents get to exit
BUDGET_S = 170         # past this, no new torchrun K is started (goal: whole run < 4 min)


def log(msg):
    print(f"rdzv_vs_torchrun: {msg}", file=sys.stderr, flush=True)


def mem_available_mb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0


def lo_bytes():
    """Bytes received on lo (every loopback byte is sent and received once)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[0])
    return 0


class Bench:
    def __init__(self, cfg):
        self.cfg = cfg
        self.tmp = tempfile.mkdtemp(prefix="rdzv_vs_torchrun_")
        if cfg.agent_uids:
            os.chmod(self.tmp, 0o1777)  # agents of other uids write here
        self.crun = os.path.join(cfg.build, "bin", "crun")
        self.worker = os.path.join(cfg.build, "bench", "launch_worker")
        self.runner = os.path.join(cfg.build, "bench", "launch_run")
        self.live = {}          # pid -> Popen of agents not yet reaped
        self.records = []
        self.runs = 0
        self.failures = []      # crun runs that failed among reps that did not all fail
        self.etcd = EtcdCluster(1) if "etcd" in cfg.backends else None

    def argv(self, who, k, port, rec):
        rdzv = [f"--nnodes={k}", "--nproc_per_node=1", "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=bench"]
        prog = ["--no_python", self.worker, "hold", rec]
        if who == "crun-etcd":
            rdzv = [f"--nnodes={k}", "--nproc_per_node=1", "--rdzv_backend=etcd",
                    f"--rdzv_endpoint={self.etcd.endpoints()}", f"--rdzv_id=bench{self.runs}"]
            return [self.crun] + rdzv + ["--rdzv_conf=last_call_timeout=0.1"] + prog
        if who == "crun":
            return [self.crun] + rdzv + ["--rdzv_conf=last_call_timeout=0.1"] + prog
        torch = ["--rdzv_conf=last_call_timeout=1", "--monitor_interval=0.1"]
        if who == "torch2":
            return [TORCH2] + rdzv + torch + prog
        return ([TORCH1, "-m", "torch.distributed.run"] + rdzv + torch +
                ["--redirects", "9:1", "--tee", "9:1"] + prog)

    def starts(self, rec):
        try:
            with open(rec) as f:
                return [int(l.split()[4]) for l in f if l.startswith("S ")]
        except OSError:
            return []

    def reap(self, pid, block):
        """wait4() one agent; returns (done, status, maxrss_kb)."""
        try:
            rpid, status, ru = os.wait4(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self.live.pop(pid, None)
            return True, -1, 0
        if rpid == 0:
            return False, 0, 0
        self.live.pop(pid).returncode = os.waitstatus_to_exitcode(status)
        return True, os.waitstatus_to_exitcode(status), ru.ru_maxrss

    def run_once(self, who, k, limit, traced=False):
        """One round of K agents; returns a result dict (ok False on timeout/failure).
        traced: every agent runs under bench/launch_run --trace, which reads its VmHWM at
        its exit stop (and its forked helpers' peaks); rss_mb is then their sum."""
        self.runs += 1
        port = free_port()
        rec = os.path.join(self.tmp, f"{who}_{k}_{self.runs}.txt")
        self.records.append(rec)
        spread = self.cfg.agent_uids if who.startswith("crun") else 0
        if spread:
            os.close(os.open(rec, os.O_CREAT | os.O_WRONLY, 0o666))
            os.chmod(rec, 0o666)
        argv = self.argv(who, k, port, rec)
        env = dict(os.environ)
        for v in ("OMP_NUM_THREADS", "LOGLEVEL", "TORCHELASTIC_RESTART_COUNT"):
            env.pop(v, None)
        b0 = lo_bytes()
        t0 = time.monotonic_ns()
        pids = []
        try:
            outs = []
            for i in range(k):
                name = os.path.join(self.tmp, f"{who}_{k}_{self.runs}_{i}")
                cmd = argv
                if traced:
                    cmd = [self.runner, "--trace", "--workers", "1", "--timeout",
                           str(int(limit) + EXIT_WAIT_S), "--log", name + ".log", "--"] + argv
                    outs.append(name + ".out")
                logf = open(name + (".out" if traced else ".log"), "wb")
                uid = {"user": AGENT_UID0 + i % spread,
                       "group": AGENT_UID0 + i % spread} if spread else {}
                p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=env, cwd=self.tmp, **uid)
                logf.close()
                self.live[p.pid] = p
                pids.append(p.pid)
            t_spawned = time.monotonic_ns() - t0
            deadline = t0 + int(limit * 1e9)
            failed = None
            pending, rss, bad = list(pids), [], []
            while True:
                st = self.starts(rec)
                if len(st) >= k:
                    break
                if time.monotonic_ns() > deadline:
                    failed = f"{len(st)}/{k} workers started after {limit:.0f} s"
                    break
                # Reaped here too, so that wait4()'s rusage of an agent done early
                # (its worker held and exited before the last one started) is kept.
                pending = self.reap_some(pending, rss, bad)
                if bad:
                    failed = f"{len(bad)} agent(s) exited non-zero (first: {bad[0]})"
                    break
                time.sleep(0.005)
            if failed:
                return {"ok": False, "why": failed, "k": k}
            t_all = max(st[:k]) - t0
            exit_deadline = time.monotonic() + EXIT_WAIT_S
            while pending and time.monotonic() < exit_deadline:
                pending = self.reap_some(pending, rss, bad)
                if pending:
                    time.sleep(0.01)
            rss_kb = sum(rss)
            if traced and not pending:
                rss_kb = 0
                for out in outs:
                    f = dict(kv.split("=", 1) for kv in open(out).read().split() if "=" in kv)
                    if int(f.get("status", -1)) != 0 or int(f.get("hwm_kb", -1)) <= 0:
                        return {"ok": False, "k": k, "why": f"launch_run: {f or 'no output'}"}
                    rss_kb += int(f["hwm_kb"]) + max(int(f["helpers_hwm_kb"]), 0)
            if pending:
                return {"ok": False, "k": k,
                        "why": f"{len(pending)} agents still running {EXIT_WAIT_S} s after "
                               "their workers started"}
            return {"ok": True, "k": k, "s": t_all / 1e9, "spawn_s": t_spawned / 1e9,
                    "bytes": lo_bytes() - b0, "rss_mb": rss_kb / 1024, "bad_exits": len(bad)}
        finally:
            self.kill(pids)

    def reap_some(self, pending, rss, bad):
        """Reaps the agents of pending that have exited; returns those still running."""
        left = []
        for pid in pending:
            done, status, kb = self.reap(pid, False)
            if not done:
                left.append(pid)
                continue
            rss.append(kb)
            if status != 0:
                bad.append(status)
        return left

    def kill(self, pids):
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in pids:
            if pid in self.live:
                self.reap(pid, True)

    def cleanup(self):
        self.kill(list(self.live))
        if self.etcd:
            self.etcd.close()
        kill_recorded_workers(self.records)  # workers that left their agent's group
        if not self.cfg.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)


def collect(b, cfg, t_start):
    res = {}
    for who in [{"c10d": "crun", "etcd": "crun-etcd"}[x] for x in cfg.backends]:
        collect_crun(b, cfg, who, res)
    collect_torch(b, cfg, t_start, res)
    return res


def collect_crun(b, cfg, who, res):
    for k in cfg.ks_crun:
        runs = [b.run_once(who, k, CRUN_LIMIT_S) for _ in range(cfg.reps_crun)]
        ok = [r for r in runs if r["ok"]]
        for r in runs:
            if not r["ok"]:
                b.failures.append(f"{LABEL[who]} K={k}: {r['why']}")
        if not ok:
            res[(who, k)] = runs[0]
            log(f"{LABEL[who]} K={k}: {runs[0]['why']}")
            break
        mem = {"ok": False, "why": "not traced", "bad_exits": 0}
        if k <= cfg.rss_max_k:
            mem = b.run_once(who, k, CRUN_LIMIT_S, traced=True)
            if not mem["ok"]:
                log(f"{LABEL[who]} K={k} traced: {mem['why']}")
                b.failures.append(f"{LABEL[who]} K={k}, traced: {mem['why']}")
                mem["bad_exits"] = 0
        res[(who, k)] = {"ok": True, "k": k, "n": len(ok),
                            "s": statistics.median(r["s"] for r in ok),
                            "spawn_s": statistics.median(r["spawn_s"] for r in ok),
                            "bytes": statistics.median(r["bytes"] for r in ok),
                            "rss_mb": mem["rss_mb"] if mem["ok"] else None,
                            "bad_exits": max(r["bad_exits"] for r in ok + [mem])}
        log(f"{LABEL[who]} K={k}: {res[(who, k)]}")


def collect_torch(b, cfg, t_start, res):
    for who in cfg.torch:
        for k in cfg.ks_torch:
            if time.monotonic() - t_start > BUDGET_S:
                log(f"{LABEL[who]}: budget spent, stopping before K={k}")
                break
            r = b.run_once(who, k, cfg.torch_limit)
            r["n"] = 1
            res[(who, k)] = r
            log(f"{LABEL[who]} K={k}: {r}")
            if not r["ok"] or r["s"] > cfg.torch_limit / 2.5:
                break
            nxt = [n for n in cfg.ks_torch if n > k]
            if nxt and r["rss_mb"] / k * nxt[0] > mem_available_mb() / 2:
                log(f"{LABEL[who]}: K={nxt[0]} would need ~{r['rss_mb'] / k * nxt[0]:.0f} MB, "
                    "over half of MemAvailable: stopping")
                res[(who, nxt[0])] = {"ok": False, "k": nxt[0],
                                      "why": "skipped: would need over half the free memory"}
                break


def table(res, cfg, elapsed, failures):
    rows = ["| launcher | K | all K spawned (s) | all K workers started (s) | loopback bytes "
            "| bytes / agent | agents' peak RSS, total (MB) | RSS / agent (MB) |",
            "|---|---|---|---|---|---|---|---|"]
    for (who, k), r in res.items():
        if not r["ok"]:
            rows.append(f"| {LABEL[who]} | {k} | | not done: {r['why']} | | | | |")
            continue
        rss = ("| - | - |" if r["rss_mb"] is None else
               f"| {r['rss_mb']:,.1f} | {r['rss_mb'] / k:.1f} |")
        rows.append(f"| {LABEL[who]} | {k} | {r['spawn_s']:.3f} | {r['s']:.3f} "
                    f"| {r['bytes']:,.0f} | "
                    f"{r['bytes'] / k:,.0f} {rss}".replace(",", " "))
    notes = [f"crun: median of {cfg.reps_crun} runs per K (RSS: one more, traced, run for "
             f"K <= {cfg.rss_max_k}: K tracers polling at 2 kHz load 2 cores too much beyond)"
             f"; torchrun: one run per K, stopped at "
             f"the first K whose run took over {cfg.torch_limit / 2.5:.0f} s (the next, twice "
             f"as many agents, would pass the {cfg.torch_limit:.0f} s limit) or failed.",
             "Bytes: " + ("loopback of a private network namespace (only these agents)."
                          if cfg.netns else "loopback of the host namespace (other traffic "
                          "included; run without --no-netns for clean numbers)."),
             f"Whole run: {elapsed:.0f} s."]
    if failures:
        notes.append("Failed crun runs (a K whose runs all failed ends the crun rows): " +
                     "; ".join(failures))
    bad = [f"{LABEL[w]} K={k}" for (w, k), r in res.items() if r["ok"] and r["bad_exits"]]
    if bad:
        notes.append("Agents that exited non-zero after all workers started: " + ", ".join(bad))
    return "\n".join(rows) + "\n\n" + "\n".join("- " + n for n in notes) + "\n"


def main():
    ap = argparse.ArgumentParser(description="K real agents: crun vs torchrun rendezvous")
    ap.add_argument("build", nargs="?", default=os.environ.get("CRUN_BUILD",
                                                               os.path.join(ROOT, "build")))
    ap.add_argument("--out", help="also write the markdown table to this file")
    ap.add_argument("--json", help="also write the results as JSON to this file "
                    "({launcher/K: medians})")
    ap.add_argument("--ks-crun", default=",".join(map(str, KS_CRUN)))
    ap.add_argument("--ks-torch", default=",".join(map(str, KS_TORCH)))
    ap.add_argument("--torch", default="torch2,torch113", help="torchruns to run")
    ap.add_argument("--reps-crun", type=int, default=3)
    ap.add_argument("--rss-max-k", type=int, default=64,
                    help="largest K whose crun agents get a traced run for their RSS")
    ap.add_argument("--torch-limit", type=float, default=60.0,
                    help="seconds a torchrun round may take before it is killed")
    ap.add_argument("--no-netns", action="store_true", help="run in the current namespace")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the logs")
    ap.add_argument("--agent-uids", type=int, default=0,
                    help="run crun's agents under this many uids (from %d on, as root): one "
                    "user may hold only fs.inotify.max_user_instances (128) inotify "
                    "instances and every agent holds one" % AGENT_UID0)
    ap.add_argument("--backends", default="c10d",
                    help="crun's rendezvous backends to run: c10d, etcd or both")
    cfg = ap.parse_args()
    private_tmpdir(keep=cfg.keep)
    if not cfg.no_netns and os.environ.get("CRUN_BENCH_NETNS") != "1":
        rc = in_own_netns(__file__, sys.argv[1:])
        if rc is not None:
            return rc
        log("cannot create a network namespace; loopback bytes include other traffic")
    cfg.netns = os.environ.get("CRUN_BENCH_NETNS") == "1"
    cfg.build = os.path.abspath(cfg.build)
    cfg.ks_crun, cfg.ks_torch = ints(cfg.ks_crun), ints(cfg.ks_torch)
    cfg.torch = [w for w in cfg.torch.split(",") if w]
    cfg.backends = [x for x in cfg.backends.split(",") if x in ("c10d", "etcd")]
    if cfg.agent_uids and os.geteuid() != 0:
        log("--agent-uids needs root: every agent runs as this user (K >= 128 may fail)")
        cfg.agent_uids = 0
    for p in ("bin/crun", "bench/launch_worker", "bench/launch_run"):
        if not os.access(os.path.join(cfg.build, p), os.X_OK):
            log(f"{cfg.build}/{p} is not built (make BUILD=... all)")
            return 1
    for who, path in (("torch113", TORCH1), ("torch2", TORCH2)):
        if who in cfg.torch and not os.access(path, os.X_OK):
            log(f"{path} missing: {LABEL[who]} skipped")
            cfg.torch.remove(who)

    t_start = time.monotonic()
    b = Bench(cfg)
    try:
        res = collect(b, cfg, t_start)
        text = table(res, cfg, time.monotonic() - t_start, b.failures)
        print(text)
        if cfg.out:
            os.makedirs(os.path.dirname(os.path.abspath(cfg.out)), exist_ok=True)
            with open(cfg.out, "w") as f:
                f.write(text)
        if cfg.json:
            with open(cfg.json, "w") as f:
                json.dump({f"{who}/{k}": v for (who, k), v in res.items()}, f, indent=1)
    finally:
        b.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
