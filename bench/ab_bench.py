#!/usr/bin/env python3
"""crun against an earlier crun, in one run: did a change cost speed or memory?

Usage: ab_bench.py --before REV_OR_BUILD [--after BUILD] [--rounds N] [--out FILE] [--quick]
(`make bench-ab BEFORE=<commit>` calls it.)

--before is a build folder (holding bin/crun) or a git revision; a revision is checked out
as a detached worktree under AFTER/ab/<rev> and built there with `make all` (kept for the
next run). Both builds then go through the same measurements, in rounds whose order
alternates (before, after; after, before; ...), so a machine that grows busier in the
middle of the run weighs on both alike. Each measurement runs one of crun's own
benchmarks on crun only (no torchrun or PyTorch servers: they are not what changed):

  launch    launch_bench.py: `crun --standalone --nproc_per_node=8` with a C worker (ms),
            the restart latency at 8 workers (ms; no failure window and no stack capture
            for both, see SAME_RESTART), the agent's peak RSS at 8 (MB)
  store     store_bench.py: crun-rdzvd (v2 dialect) ops/s at 1, 16 and 64 connections,
            and the server's RSS holding 10,000 idle connections (MB)
  rdzv      rdzv_bench (in-process clients, the build's own library): seconds to form a
            round of K = 256 and 1,024, store requests per node
  agents    rdzv_vs_torchrun.py: K = 8 and 32 real agents on c10d, seconds to the last
            worker's start, loopback bytes per agent

The load generators (store_load, launch_run, launch_worker) are the after build's for
both, so only the programs under test differ. The table shows each build's median over
the rounds and after/before; "noise" is the larger relative spread (max-min over median)
of the two builds' rounds, so a ratio inside 1 +- noise is no change that this run can see.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# The restart path both builds share: a later crun waits its failure window
# (--monitor-interval, torchrun's 0.1 s poll, so that workers failing together
# are all reported) and takes the surviving ranks' stacks first; an earlier one
# may have done neither. With no window (0) and no capture, both do the same work
# (an earlier crun ignores PET_* names it does not know, as torchrun does).
SAME_RESTART = {"PET_MONITOR_INTERVAL": "0", "PET_STACK_DUMP_ON_STOP": "never"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"


def log(msg):
    print(f"ab_bench: {msg}", file=sys.stderr, flush=True)


def build_before(rev, after):
    """A git revision -> its build folder (worktree under AFTER/ab/, built once)."""
    if os.access(os.path.join(rev, "bin", "crun"), os.X_OK):
        return os.path.abspath(rev)
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = os.path.join(after, "ab", sha)
    if not os.path.isdir(tree):
        log(f"checking out {sha} in {tree}")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", tree, sha],
                       check=True, capture_output=True)
    log(f"building {sha} (make all)")
    subprocess.run(["make", "-s", "-C", tree, f"-j{os.cpu_count()}", "all"], check=True,
                   stdout=subprocess.DEVNULL)
    return os.path.join(tree, "build")


def hybrid(build, after, tmp, name):
    """A folder whose programs and library are BUILD's and whose load generators are AFTER's."""
    d = os.path.join(tmp, name)
    os.makedirs(d)
    for sub, src in (("bin", build), ("lib", build), ("bench", after)):
        if os.path.exists(os.path.join(src, sub)):
            os.symlink(os.path.join(src, sub), os.path.join(d, sub))
    return d


def run_json(argv, out, timeout, env=None):
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, env=env)
    if r.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"{os.path.basename(argv[1])} failed ({r.returncode}): "
                           + " | ".join(r.stderr.strip().splitlines()[-3:]))
    with open(out) as f:
        return json.load(f)


def launch(build, tmp, quick):
    out = os.path.join(tmp, "launch.json")
    reps = ["--reps-crun", "6", "--reps-rss", "2"] if quick else ["--reps-crun", "20"]
    j = run_json([PY, os.path.join(ROOT, "bench", "launch_bench.py"), build, "--launchers",
                  "crun", "--ns", "8", "--py-ns", "", "--restart-ns", "8", "--rss-ns", "8",
                  "--json", out, *reps], out, 600, env=dict(os.environ, **SAME_RESTART))
    got = {}
    for kind, field, label in (("launch_c", "ms", "launch N=8 (ms)"),
                               ("restart", "ms", "restart N=8, no window, no stacks (ms)"),
                               ("rss", "total_mb", "agent RSS N=8 (MB)")):
        samples = (j.get(kind, {}).get("crun/8") or {}).get(field) or []
        if samples:
            got[label] = statistics.median(samples)
    return got


def store(build, tmp, quick):
    out = os.path.join(tmp, "store.json")
    j = run_json([PY, os.path.join(ROOT, "bench", "store_bench.py"), build, "--servers",
                  "crun-v2", "--passes", "1", "--json", out]
                 + (["--quick", "--idle", "2000"] if quick else []), out, 600)
    r = j.get("crun-v2", {})
    got = {}
    for n, res in sorted(r.get("load", {}).items(), key=lambda kv: int(kv[0])):
        if res and res.get("ops_per_s"):
            got[f"store ops/s, {n} conns"] = res["ops_per_s"]
    idle = r.get("idle") or {}
    if idle.get("rss_held_kb"):
        got["store RSS, idle conns (MB)"] = idle["rss_held_kb"] / 1024
    return got


def rdzv(build, ks):
    r = subprocess.run([os.path.join(build, "bench", "rdzv_bench"), *map(str, ks)],
                       capture_output=True, text=True, timeout=600)
    got = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            x = json.loads(line)
            if x.get("ok") == x.get("k"):
                got[f"rdzv K={x['k']} (ms)"] = x["seconds"] * 1e3
                got[f"rdzv K={x['k']} requests/node"] = x["requests_per_node"]
    if r.returncode != 0 or not got:
        raise RuntimeError(f"rdzv_bench failed ({r.returncode}): {r.stderr.strip()[-200:]}")
    return got


def agents(build, tmp, ks, quick):
    out = os.path.join(tmp, "agents.json")
    j = run_json([PY, os.path.join(ROOT, "bench", "rdzv_vs_torchrun.py"), build, "--torch", "",
                  "--backends", "c10d", "--ks-crun", ",".join(map(str, ks)), "--reps-crun",
                  "1" if quick else "3", "--rss-max-k", "0", "--json", out], out, 600)
    got = {}
    for k in ks:
        r = j.get(f"crun/{k}") or {}
        if r.get("ok"):
            got[f"{k} agents (ms)"] = r["s"] * 1e3
            got[f"{k} agents, bytes/agent"] = r["bytes"] / k
    return got


def measure(name, build, own, tmp, cfg):
    got, t0 = {}, time.monotonic()
    for what, fn in (("launch", lambda: launch(build, tmp, cfg.quick)),
                     ("store", lambda: store(build, tmp, cfg.quick)),
                     ("rdzv", lambda: rdzv(own, cfg.rdzv_ks)),
                     ("agents", lambda: agents(build, tmp, cfg.agent_ks, cfg.quick))):
        try:
            got.update(fn())
        except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as e:
            log(f"{name}: {what}: {e}")
    log(f"{name}: {len(got)} numbers in {time.monotonic() - t0:.0f} s")
    return got


def table(rounds, labels, cfg):
    rows = [f"| measure | before {labels['before']} | after {labels['after']} "
            "| after/before | noise |", "|---|---|---|---|---|"]
    keys = list(rounds["after"][0]) if rounds["after"] else []
    for k in keys:
        med, spread = {}, []
        for who in ("before", "after"):
            xs = [r[k] for r in rounds[who] if k in r]
            if not xs:
                break
            med[who] = statistics.median(xs)
            spread.append((max(xs) - min(xs)) / med[who] if med[who] else 0)
        if len(med) < 2:
            rows.append(f"| {k} | - | {med.get('after', '-')} | - | - |")
            continue
        fmt = (lambda v: f"{v:,.0f}") if max(med.values()) >= 100 else (lambda v: f"{v:.2f}")
        ratio = med["after"] / med["before"] if med["before"] else float("nan")
        rows.append(f"| {k} | {fmt(med['before'])} | {fmt(med['after'])} | {ratio:.2f} "
                    f"| ±{max(spread) * 100:.0f} % |")
    head = (f"crun {labels['after']} against crun {labels['before']}, {cfg.rounds} rounds in "
            f"alternating order, {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f} at the end, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")
    return head + "\n\n" + "\n".join(rows) + "\n"


def describe(build):
    tree = os.path.dirname(os.path.abspath(build))
    r = subprocess.run(["git", "-C", tree, "describe", "--always", "--dirty"],
                       capture_output=True, text=True)
    return r.stdout.strip() or tree


def main():
    ap = argparse.ArgumentParser(description="crun against an earlier crun, in one run")
    ap.add_argument("--before", required=True, help="a build folder or a git revision")
    ap.add_argument("--after", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rdzv-ks", default="256,1024")
    ap.add_argument("--agent-ks", default="8,32")
    ap.add_argument("--quick", action="store_true", help="short cells, one round (smoke)")
    ap.add_argument("--out", help="also write the markdown table to this file")
    cfg = ap.parse_args()
    cfg.rdzv_ks = [int(x) for x in cfg.rdzv_ks.split(",")]
    cfg.agent_ks = [int(x) for x in cfg.agent_ks.split(",")]
    if cfg.quick:
        cfg.rounds, cfg.rdzv_ks, cfg.agent_ks = 1, cfg.rdzv_ks[:1], cfg.agent_ks[:1]
    after = os.path.abspath(cfg.after)
    before = build_before(cfg.before, after)
    labels = {"before": describe(before), "after": describe(after)}
    rounds = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="crun-ab-") as tmp:
        builds = {who: (hybrid(b, after, tmp, who), b)
                  for who, b in (("before", before), ("after", after))}
        for i in range(cfg.rounds):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for who in order:
                with tempfile.TemporaryDirectory(dir=tmp) as work:
                    rounds[who].append(measure(f"round {i + 1} {who}", *builds[who], work, cfg))
    text = table(rounds, labels, cfg)
    print(text)
    if cfg.out:
        os.makedirs(os.path.dirname(os.path.abspath(cfg.out)), exist_ok=True)
        with open(cfg.out, "w") as f:
            f.write(text)
    return 0 if rounds["after"] and rounds["after"][0] else 1


if __name__ == "__main__":
    sys.exit(main())
