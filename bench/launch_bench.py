#!/usr/bin/env python3
"""Launcher benchmark: crun against torchrun (Debian's 1.13 and PyPI 2.x), in one run.

Usage: launch_bench.py [BUILD] [--out FILE] [--json FILE] [--quick] [--no-netns]
BUILD (or $CRUN_BUILD, default ./build) holds bin/crun, bench/launch_run and
bench/launch_worker.

Measured, each several times, medians reported:
  launch   wall time of `LAUNCHER --standalone --nproc_per_node=N` for N = 1, 2, 4, 8
           with a trivial worker: bench/launch_worker (a C program that exits 0) under
           --no_python for every launcher, and bench/launch_worker.py (empty Python).
  restart  --max_restarts=1: every local rank starts, then local rank 0 exits 1; the
           latency is from that worker's exit (its own CLOCK_MONOTONIC stamp, taken just
           before it exits) to the first worker of attempt 1 starting (its stamp, the
           first thing its main() does).
  RSS      the agent's peak RSS, in separate runs whose workers (launch_worker hold) stay
           up together for a moment: VmHWM of the launcher's /proc status read at its
           exit stop (bench/launch_run.c --trace), plus the peaks of the helpers it forks
           without exec (crun's guard; torchrun has none), sampled while all workers run.
           ru_maxrss of wait4() would fold in the reaped workers and the image before
           exec, so it is shown only for contrast.
Each launch is timed by bench/launch_run (fork to reap, in C); timed runs are not traced.

torchrun 1.13 on Python 3.11 needs --redirects/--tee values without a 0 (torch-compat.md
§4.1), so it gets `--redirects 9:1 --tee 9:1` (rank 9 does not exist: nothing changes).
Both torchruns get --monitor_interval=0.1, 2.x's default; 1.13's default of 5 s would
add up to 5 s to each of its runs. The run happens inside a private network namespace (only
loopback) when possible, so 1.13's --standalone gets its fixed port 29400 and nothing
resolves names over the network; without one, torchrun 1.13 gets
--rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:<free port> instead of --standalone.
Every process started is killed at the end, also on failure.
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
PY_WORKER_EXEC = "/usr/bin/python3"  # the same interpreter runs every Python worker
BUDGET_S = 170             # past this, torchrun cells get one rep each (goal: < 4 min)
RUN_TIMEOUT_S = 90         # one launcher run; launch_run sends SIGTERM, then SIGKILL
NS = (1, 2, 4, 8)
RESTART_NS = (1, 4)
RSS_NS = (1, 8)
LAUNCHERS = ("crun", "torch113", "torch2")
LABEL = {"crun": "crun", "torch113": "torchrun 1.13", "torch2": "torchrun 2.x"}
GOAL_LAUNCH_X = 50.0
GOAL_RESTART_MS = 20.0   # past the failure window
WINDOW_MS = 100.0        # --monitor-interval's default: crun stops the others this long after
                         # the first failure, so that workers failing together are all reported
GOAL_RSS_MB = 5.0


def log(msg):
    print(f"launch_bench: {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, cfg):
        self.cfg = cfg
        self.tmp = tempfile.mkdtemp(prefix="launch_bench_")
        self.crun = os.path.join(cfg.build, "bin", "crun")
        self.runner = os.path.join(cfg.build, "bench", "launch_run")
        self.cworker = os.path.join(cfg.build, "bench", "launch_worker")
        self.pyworker = os.path.join(ROOT, "bench", "launch_worker.py")
        self.record_files = []
        self.live = set()       # launch_run process groups not yet reaped
        self.t0 = time.monotonic()
        self.load0 = os.getloadavg()[0]
        self.versions = {}
        self.failures = []

    def over_budget(self):
        return time.monotonic() - self.t0 > self.cfg.budget

    def argv(self, who, n, worker_args, python=False, restarts=0):
        """The launcher's command line for n workers."""
        if python:
            prog = [self.pyworker] + worker_args
        else:
            prog = ["--no_python", self.cworker] + worker_args
        common = [f"--nproc_per_node={n}", f"--max_restarts={restarts}"]
        if who == "crun":
            return [self.crun, "--standalone"] + common + prog
        if who == "torch2":
            return [TORCH2, "--standalone", "--monitor_interval=0.1"] + common + prog
        if self.cfg.netns:
            rdzv = ["--standalone"]
        else:
            rdzv = ["--nnodes=1", "--rdzv_backend=c10d",
                    f"--rdzv_endpoint=127.0.0.1:{free_port()}",
                    f"--rdzv_id=bench{os.getpid()}_{time.monotonic_ns()}"]
        return ([TORCH1, "-m", "torch.distributed.run"] + rdzv +
                ["--monitor_interval=0.1", "--redirects", "9:1", "--tee", "9:1"] + common + prog)

    def run(self, who, argv, trace=0):
        """One launcher run through launch_run; returns its key=value fields.
        trace: 0, or the number of workers (memory runs, traced)."""
        logf = os.path.join(self.tmp, f"{who}.log")
        cmd = [self.runner, "--timeout", str(RUN_TIMEOUT_S), "--log", logf]
        if trace:
            cmd += ["--trace", "--workers", str(trace)]
        env = dict(os.environ, PYTHON_EXEC=PY_WORKER_EXEC)
        for k in ("OMP_NUM_THREADS", "LOGLEVEL", "TORCHELASTIC_RESTART_COUNT"):
            env.pop(k, None)
        p = subprocess.Popen(cmd + ["--"] + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True, text=True, env=env, cwd=self.tmp)
        self.live.add(p.pid)
        try:
            out, err = p.communicate(timeout=RUN_TIMEOUT_S + 30)
        finally:
            self.kill_group(p.pid)
            p.wait()
            self.live.discard(p.pid)
        fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
        if p.returncode != 0 or "status" not in fields:
            raise RuntimeError(f"launch_run failed ({p.returncode}): {err.strip()}")
        res = {k: int(v) for k, v in fields.items()}
        if res["status"] != 0:
            tail = open(logf, errors="replace").read()[-600:]
            self.failures.append(f"{who}: {' '.join(argv)} exited {res['status']}")
            raise RuntimeError(f"{LABEL[who]} exited {res['status']}: ...{tail}")
        return res

    def kill_group(self, pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def launch_once(self, who, n, i, python):
        r = self.run(who, self.argv(who, n, [], python))
        return {"ms": r["wall_ns"] / 1e6}

    def memory_once(self, who, n, i):
        rec = os.path.join(self.tmp, f"hold_{who}_{n}_{i}.txt")
        self.record_files.append(rec)
        r = self.run(who, self.argv(who, n, ["hold", rec]), trace=n)
        if r["hwm_kb"] <= 0:
            raise RuntimeError(f"{LABEL[who]}: no VmHWM at its exit (ptrace refused?)")
        return {"hwm_mb": r["hwm_kb"] / 1024,
                "total_mb": (r["hwm_kb"] + max(r["helpers_hwm_kb"], 0)) / 1024,
                "helpers": r["helpers"], "maxrss_mb": r["maxrss_kb"] / 1024}

    def restart_once(self, who, n, i):
        rec = os.path.join(self.tmp, f"restart_{who}_{n}_{i}.txt")
        self.record_files.append(rec)
        self.run(who, self.argv(who, n, [rec], restarts=1))
        got = {"ms": restart_latency_ms(rec, n)}
        if who == "crun" and "PET_STACK_DUMP_ON_STOP" not in os.environ:
            # crun's default first waits the failure window and takes the surviving
            # ranks' stacks (gdb for a C worker); the same restart without the capture:
            rec = os.path.join(self.tmp, f"restart_{who}_{n}_{i}_nostacks.txt")
            self.record_files.append(rec)
            argv = self.argv(who, n, [rec], restarts=1)
            self.run(who, argv[:1] + ["--stack_dump_on_stop=never"] + argv[1:])
            got["ms_nostacks"] = restart_latency_ms(rec, n)
        return got

    def interleave(self, reps, once):
        """Runs once(who, i) reps[who] times for every launcher, round-robin and
        spread evenly, so that load from elsewhere on the machine hits every
        launcher alike. Past the budget, torchrun keeps only the reps it has."""
        out = {w: {} for w in reps}
        done = dict.fromkeys(reps, 0)
        rounds = max(reps.values())
        for r in range(rounds):
            for w, want in reps.items():
                while done[w] < ((r + 1) * want) // rounds:
                    if w != "crun" and done[w] and self.over_budget():
                        break
                    for k, v in once(w, done[w]).items():
                        out[w].setdefault(k, []).append(v)
                    done[w] += 1
        return out

    def kill_workers(self):
        """Workers of restart runs that a launcher may have left behind."""
        kill_recorded_workers(self.record_files)

    def cleanup(self):
        for pgid in list(self.live):
            self.kill_group(pgid)
        self.kill_workers()
        if not self.cfg.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)


def restart_latency_ms(path, n):
    exits, starts1 = [], []
    for line in open(path):
        what, attempt, rank, _pid, ns = line.split()
        if what == "E" and attempt == "0":
            exits.append(int(ns))
        elif what == "S" and attempt == "1":
            starts1.append(int(ns))
    if len(exits) != 1 or len(starts1) != n:
        raise RuntimeError(f"{path}: expected one failure and {n} restarted workers")
    return (min(starts1) - exits[0]) / 1e6


def med(xs):
    return statistics.median(xs) if xs else None


def versions(cfg):
    out = {}
    try:
        out["crun"] = subprocess.run([os.path.join(cfg.build, "bin", "crun"), "--version"],
                                     capture_output=True, text=True,
                                     timeout=10).stdout.strip().split("\n")[0]
    except (OSError, subprocess.TimeoutExpired):
        out["crun"] = "?"
    for key, py in (("torch113", TORCH1),
                    ("torch2", os.path.join(os.path.dirname(TORCH2), "python"))):
        try:
            out[key] = "torch " + subprocess.run(
                [py, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            out[key] = "?"
    return out


def collect(b, cfg):
    res = {"launch_c": {}, "launch_py": {}, "restart": {}, "rss": {}}
    who_all = [w for w in LAUNCHERS if w in cfg.launchers]

    def reps(crun, torch):
        return {w: max(crun if w == "crun" else torch, 1) for w in who_all}

    def store(kind, n, out):
        for w, samples in out.items():
            res[kind][(w, n)] = samples

    for n in cfg.ns:
        log(f"launch N={n}, C worker")
        store("launch_c", n, b.interleave(reps(cfg.reps_crun, cfg.reps_torch),
                                          lambda w, i: b.launch_once(w, n, i, False)))
    for n in cfg.py_ns:
        log(f"launch N={n}, Python worker")
        store("launch_py", n, b.interleave(reps(cfg.reps_crun // 2, cfg.reps_torch),
                                           lambda w, i: b.launch_once(w, n, i, True)))
    for n in cfg.restart_ns:
        log(f"restart N={n}")
        store("restart", n, b.interleave(reps(cfg.reps_crun // 2, cfg.reps_torch_restart),
                                         lambda w, i: b.restart_once(w, n, i)))
    for n in cfg.rss_ns:
        log(f"memory N={n}")
        store("rss", n, b.interleave(reps(cfg.reps_rss, cfg.reps_torch_rss),
                                     lambda w, i: b.memory_once(w, n, i)))
    return res


def fmt(v, unit):
    if v is None:
        return "n/a"
    if unit == "ms":
        return f"{v:.1f} ms" if v >= 100 else f"{v:.2f} ms"
    return f"{v:.2f} MB" if v < 10 else f"{v:.0f} MB"


def table(res, cfg, b, elapsed):
    rows = []

    def row(name, cells, unit, key, goal=None, crun_key=None):
        keys = {w: crun_key if crun_key and w == "crun" else key for w in LAUNCHERS}
        vals = {w: med(cells.get(w, {}).get(keys[w], [])) for w in LAUNCHERS}
        reps = {w: len(cells.get(w, {}).get(keys[w], [])) for w in LAUNCHERS}
        torch = [vals[w] for w in ("torch113", "torch2") if vals[w] is not None]
        ratio = "n/a"
        if torch and vals["crun"]:
            ratio = f"{min(torch) / vals['crun']:.0f}x" if min(torch) / vals["crun"] >= 10 \
                else f"{min(torch) / vals['crun']:.1f}x"
        verdict = ""
        if goal:
            ok = goal(vals["crun"], min(torch) if torch else None)
            verdict = "" if ok is None else (" (goal met)" if ok else " (goal MISSED)")
        cols = [fmt(vals[w], unit) + (f" [{reps[w]}]" if vals[w] is not None else "")
                for w in LAUNCHERS]
        rows.append(f"| {name} | " + " | ".join(cols) + f" | {ratio}{verdict} |")

    def launch_goal(c, t):
        return None if c is None or t is None else t / c >= GOAL_LAUNCH_X

    for n in cfg.ns:
        cells = {w: res["launch_c"].get((w, n), {}) for w in LAUNCHERS}
        row(f"launch, N={n}, C worker", cells, "ms", "ms", launch_goal)
    for n in cfg.py_ns:
        cells = {w: res["launch_py"].get((w, n), {}) for w in LAUNCHERS}
        row(f"launch, N={n}, Python worker (no goal)", cells, "ms", "ms")
    for n in cfg.restart_ns:
        cells = {w: res["restart"].get((w, n), {}) for w in LAUNCHERS}
        row(f"restart latency, N={n} (crun: failure window, then the survivors' stacks)",
            cells, "ms", "ms")
        row(f"restart latency, N={n}, crun --stack_dump_on_stop=never", cells, "ms", "ms",
            lambda c, t: None if c is None else c < WINDOW_MS + GOAL_RESTART_MS,
            crun_key="ms_nostacks")
    rss_goal = lambda c, t: None if c is None else c < GOAL_RSS_MB  # noqa: E731
    for n in cfg.rss_ns:
        cells = {w: res["rss"].get((w, n), {}) for w in LAUNCHERS}
        row(f"agent peak RSS, launcher process (VmHWM), N={n}", cells, "MB", "hwm_mb",
            rss_goal)
        row(f"agent peak RSS, + forked helpers (crun: guard), N={n}", cells, "MB",
            "total_mb", rss_goal)
    for n in cfg.rss_ns:
        cells = {w: res["rss"].get((w, n), {}) for w in LAUNCHERS}
        row(f"wait4 ru_maxrss (contrast only), N={n}", cells, "MB", "maxrss_mb")

    head = [
        f"crun launcher benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} CPUs, {elapsed:.0f} s, "
        f"{'private network namespace' if cfg.netns else 'host network namespace'}, "
        f"load average {b.load0:.1f} at start, {os.getloadavg()[0]:.1f} at end)",
        "",
        f"crun: {b.versions.get('crun')}; torchrun 1.13: `/usr/bin/python3 -m "
        f"torch.distributed.run` ({b.versions.get('torch113')}); torchrun 2.x: "
        f"`venv-torch2/bin/torchrun` ({b.versions.get('torch2')}).",
        "Medians; [n] = repetitions. Ratio = the faster torchrun's median / crun's "
        f"(goals: launch >= {GOAL_LAUNCH_X:.0f}x, restart < {GOAL_RESTART_MS:.0f} ms past the {WINDOW_MS:.0f} ms failure window without stacks, "
        f"RSS < {GOAL_RSS_MB:.0f} MB).",
        "",
        "| metric | crun | torchrun 1.13 | torchrun 2.x | ratio vs faster torchrun |",
        "|---|---|---|---|---|",
    ]
    rdzv = ("`--standalone` (port 29400 is private to the namespace)" if cfg.netns else
            "`--rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:<free port>`")
    notes = [
        "",
        "- Command lines: `crun --standalone --nproc_per_node=N [--max_restarts=1] "
        "--no_python launch_worker`; torchrun 2.x the same plus `--monitor_interval=0.1` "
        f"(its default); torchrun 1.13 with {rdzv}, `--monitor_interval=0.1` (its default "
        "is 5 s) and `--redirects 9:1 --tee 9:1` (the Python 3.11 bug, torch-compat.md §4.1).",
        "- C worker: bench/launch_worker.c under --no_python; Python worker: "
        f"bench/launch_worker.py under {PY_WORKER_EXEC} (PYTHON_EXEC, for every launcher). "
        "The launch goal is judged on the trivial C worker: with Python workers the "
        f"time is mostly N interpreter start-ups sharing {os.cpu_count()} CPUs, the same "
        "work under every launcher.",
        "- Launch: wall time from fork to reap of the launcher (bench/launch_run.c).",
        "- Restart: rank 0 exits 1 once all N ranks run; latency = its exit stamp to the "
        "first attempt-1 worker's start stamp (CLOCK_MONOTONIC, taken by the workers). crun, "
        "as torchrun, stops the other workers one --monitor-interval (0.1 s) after the first "
        "failure, so that workers failing together are all reported; by default it then takes "
        "the surviving ranks' stacks first (py-spy for Python workers, else gdb, at most 0.8 s; "
        "docs/usage.md). The second row is crun with --stack_dump_on_stop=never.",
        "- RSS: VmHWM of the launcher's own image read at its exit (ptrace exit stop): "
        "the agent alone, without workers. crun also forks a guard (no exec) that kills "
        "worker groups if crun is SIGKILLed; its peak, sampled while all N workers run "
        "(`launch_worker hold`), is added in the second row (an upper bound: most of its "
        "pages are shared with crun). torchrun forks no helpers. wait4's ru_maxrss is "
        "not the agent alone: the kernel folds in reaped children (RUSAGE_BOTH) and the "
        "pre-exec image; shown only for contrast.",
    ]
    if b.failures:
        notes.append("- Failed runs: " + "; ".join(b.failures))
    return "\n".join(head + rows + notes) + "\n"


def main():
    ap = argparse.ArgumentParser(description="crun vs torchrun launcher benchmark")
    ap.add_argument("build", nargs="?", default=os.environ.get("CRUN_BUILD",
                                                               os.path.join(ROOT, "build")))
    ap.add_argument("--out", help="also write the markdown table to this file")
    ap.add_argument("--json", help="also write the raw samples as JSON to this file")
    ap.add_argument("--quick", action="store_true", help="one torchrun rep, N=1,8 (smoke)")
    ap.add_argument("--no-netns", action="store_true", help="run in the current namespace")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the logs")
    ap.add_argument("--launchers", default=",".join(LAUNCHERS))
    ap.add_argument("--ns", default=",".join(map(str, NS)))
    ap.add_argument("--py-ns", default="1,8", help="N for the Python-worker rows")
    ap.add_argument("--restart-ns", default=",".join(map(str, RESTART_NS)))
    ap.add_argument("--reps-crun", type=int, default=30)
    ap.add_argument("--rss-ns", default=",".join(map(str, RSS_NS)))
    ap.add_argument("--reps-rss", type=int, default=5)
    ap.add_argument("--reps-torch", type=int, default=3)
    ap.add_argument("--reps-torch-restart", type=int, default=3)
    ap.add_argument("--reps-torch-rss", type=int, default=1)
    ap.add_argument("--budget", type=float, default=BUDGET_S,
                    help="seconds after which torchrun rows stop at their first rep")
    cfg = ap.parse_args()
    private_tmpdir(keep=cfg.keep)
    if not cfg.no_netns and os.environ.get("CRUN_BENCH_NETNS") != "1":
        rc = in_own_netns(__file__, sys.argv[1:])
        if rc is not None:
            return rc
        log("cannot create a network namespace; torchrun 1.13 gets an explicit c10d port")
    cfg.netns = os.environ.get("CRUN_BENCH_NETNS") == "1"
    cfg.build = os.path.abspath(cfg.build)
    cfg.launchers = cfg.launchers.split(",")
    cfg.ns, cfg.py_ns, cfg.restart_ns = ints(cfg.ns), ints(cfg.py_ns), ints(cfg.restart_ns)
    cfg.rss_ns = ints(cfg.rss_ns)
    if cfg.quick:
        cfg.reps_torch, cfg.reps_torch_rss, cfg.reps_crun, cfg.reps_rss = 1, 1, 6, 2
        cfg.reps_torch_restart = 1
        cfg.ns, cfg.py_ns, cfg.restart_ns, cfg.rss_ns = (1, 8), (1,), (1,), (8,)
    for p in ("bin/crun", "bench/launch_run", "bench/launch_worker"):
        if not os.access(os.path.join(cfg.build, p), os.X_OK):
            log(f"{cfg.build}/{p} is not built (make BUILD=... all)")
            return 1
    for who, path in (("torch113", TORCH1), ("torch2", TORCH2)):
        if who in cfg.launchers and not os.access(path, os.X_OK):
            log(f"{path} missing: {LABEL[who]} skipped")
            cfg.launchers.remove(who)

    b = Bench(cfg)
    rc = 0
    try:
        b.versions = versions(cfg)
        try:
            res = collect(b, cfg)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            log(f"aborted: {e}")
            return 1
        text = table(res, cfg, b, time.monotonic() - b.t0)
        print(text)
        if cfg.out:
            os.makedirs(os.path.dirname(os.path.abspath(cfg.out)), exist_ok=True)
            with open(cfg.out, "w") as f:
                f.write(text)
        if cfg.json:
            with open(cfg.json, "w") as f:
                json.dump({k: {f"{w}/{n}": v for (w, n), v in d.items()}
                           for k, d in res.items()}, f, indent=1)
    finally:
        b.cleanup()
    return rc


if __name__ == "__main__":
    sys.exit(main())
