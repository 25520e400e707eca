#!/usr/bin/env python3
"""A/B runs of the worker-init storm (bench/storm) for the store server's
performance work: several builds of crun-rdzvd and PyTorch 2.x's libuv server
in the same run, interleaved round by round, medians reported.

Usage: storm_ab.py [--ranks 4096,16384] [--rounds 5] [--base PATH]
                   [--servers new,base,libuv] [--strace] [--perf DIR]

  new    BUILD/bin/crun-rdzvd (CRUN_BUILD, default ./build)
  base   the crun-rdzvd binary given by --base (e.g. a copy built from main)
  libuv  PyTorch 2.x's libuv TCPStore server (bench/torch_store_server.py)

Per cell: wall (first connect to the last rank done), the wake fan-out (the
SET of :last_worker to the last of the WAITs parked before it released), the
barrier tail (that SET to the last rank past the barrier, with the ranks that
were still between their ADDs; `setters` of them read N and SET too), the
loopback TCP segments per rank (the namespace's counters, client and server
together), server CPU seconds (utime+stime from
/proc, read 0.5 s after the storm so the teardown counts too) and, with
--strace, the server's system calls per rank (strace -c -f attached for the
storm; a separate, slower run, so its times are not reported) and, with
--perf DIR, a call-graph profile of the server per cell (perf record -g,
DIR/perf-SERVER-N.data). Runs in a
private network and mount namespace with local name lookups, like
storm_bench.py --resolver local.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from store_bench import ROOT, Server, raise_nofile  # noqa: E402
from storm_bench import server_argv  # noqa: E402


def log(msg):
    print(f"storm_ab: {msg}", file=sys.stderr, flush=True)


def cpu_s(pid):
    """utime + stime of pid and its reaped children, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return sum(int(x) for x in fields[11:15]) / tick


# crun-rdzvd's automatic --max-conns now takes N = 19,900 of 20,000
# descriptors; a base built before that (an eighth in reserve: 17,500) needs
# it raised.
PAUSE_S = 3
# The storm holds its connections this long after its result line, so the
# server's CPU is read once before the teardown (the close exchange) and once
# after it.
HOLD_MS = 1000
CRUN_ARGS = ["--host", "127.0.0.1", "--port", "0"]
BASE_ARGS = CRUN_ARGS + ["--max-conns", "65536"]


def argv_for(key, build, base):
    if key == "new":
        return [os.path.join(build, "bin", "crun-rdzvd")] + CRUN_ARGS
    if key == "base":
        return [base] + BASE_ARGS
    if key == "libuv":
        return server_argv("torch2-libuv", build, None)
    raise ValueError(key)


# Loopback segments of the storm (client and server together: the run has
# its own network namespace, so these counters are the storm's alone).
# The last four (JSON only) tell a slow connect phase's SYN retries apart
# from a full accept queue.
SEG_FIELDS = ("Tcp:OutSegs", "TcpExt:TCPPureAcks", "TcpExt:DelayedACKs",
              "TcpExt:TCPOrigDataSent", "Tcp:RetransSegs", "TcpExt:TCPSynRetrans",
              "TcpExt:ListenOverflows", "TcpExt:ListenDrops", "TcpExt:TCPTimeouts")


def tcp_counters():
    """The namespace's TCP counters, {"Tcp:OutSegs": n, ...}."""
    out = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):
        with open(path) as f:
            lines = f.read().splitlines()
        for head, vals in zip(lines[::2], lines[1::2]):
            proto, names = head.split(":", 1)
            for k, v in zip(names.split(), vals.split(":", 1)[1].split()):
                out[f"{proto}:{k}"] = int(v)
    return out


def strace_counts(path):
    counts = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            # % time, seconds, usecs/call, calls, [errors], syscall
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                counts[parts[-1]] = int(parts[3])
    return counts


def one(key, build, base, n, use_strace, tmp, perf_dir=None):
    srv = Server(key, argv_for(key, build, base))
    res = {"server": key, "ranks": n}
    tracer = None
    try:
        srv.start()
        if not srv.wait_ready(150):
            res["error"] = "server did not start: " + " | ".join(srv.lines[-3:])
            return res
        pid = srv.proc.pid
        if key == "libuv":  # the python wrapper's store runs in the same process
            pass
        if use_strace:
            out = os.path.join(tmp, f"strace-{key}-{n}")
            tracer = subprocess.Popen(["strace", "-c", "-f", "-o", out, "-p", str(pid)],
                                      stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        elif perf_dir:
            tracer = subprocess.Popen(["perf", "record", "-g", "-q", "-o",
                                       os.path.join(perf_dir, f"perf-{key}-{n}.data"),
                                       "-p", str(pid)], stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        before = cpu_s(pid)
        segs = tcp_counters()
        argv = [os.path.join(build, "bench", "storm"), "--port", str(srv.port), "-n", str(n),
                "--dialect", "v2", "--timeout-ms", "120000", "--hold-ms", str(HOLD_MS)]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = p.stdout.readline()  # printed when every rank is done, before the teardown
        time.sleep(HOLD_MS / 2000)
        mid, mid_segs = cpu_s(pid), tcp_counters()
        out, err = p.communicate(timeout=200)
        time.sleep(0.5)
        res["server_cpu_s"] = round(cpu_s(pid) - before, 3)
        res["teardown_cpu_s"] = round(cpu_s(pid) - mid, 3)
        after = tcp_counters()
        res["teardown_segments_per_rank"] = round(
            (after["Tcp:OutSegs"] - mid_segs["Tcp:OutSegs"]) / n, 2)
        res["segments_per_rank"] = {k.split(":")[1]: round((after.get(k, 0) - segs.get(k, 0)) / n, 2)
                                    for k in SEG_FIELDS}
        res.update(json.loads(line) if line.startswith("{") else {"ok": False,
                                                                   "error": err[-300:]})
        if tracer:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=60)
            if use_strace:
                res["syscalls"] = strace_counts(out)
    finally:
        if tracer and tracer.poll() is None:
            tracer.kill()
        srv.stop()
    return res


def median(rows, field):
    vals = [r[field] for r in rows if r.get("ok") and field in r]
    return statistics.median(vals) if vals else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("CRUN_BUILD", os.path.join(ROOT, "build")))
    ap.add_argument("--ranks", default="4096,16384")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--servers", default="new,base,libuv")
    ap.add_argument("--base")
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--perf")
    ap.add_argument("--json")
    cfg = ap.parse_args()
    if os.environ.get("CRUN_BENCH_NETNS") != "1":
        tmp = tempfile.mkdtemp(prefix="crun-ab-ns-")
        nss = os.path.join(tmp, "nsswitch.conf")
        with open(nss, "w") as f:
            f.write("hosts: files\n")
        inner = 'ip link set lo up && mount --bind "$NSS" /etc/nsswitch.conf && exec "$0" "$@"'
        env = dict(os.environ, CRUN_BENCH_NETNS="1", NSS=nss)
        return subprocess.call(["unshare", "--net", "--mount", "--propagation", "private", "sh",
                                "-c", inner, sys.executable, os.path.abspath(__file__)]
                               + sys.argv[1:], env=env)
    build = os.path.abspath(cfg.build)
    servers = [s for s in cfg.servers.split(",") if s and (s != "base" or cfg.base)]
    ranks = [int(x) for x in cfg.ranks.split(",") if x]
    raise_nofile()
    rows = []
    with tempfile.TemporaryDirectory(prefix="crun-ab-") as tmp:
        perf_dir = os.path.abspath(cfg.perf) if cfg.perf else None
        for rnd in range(1 if cfg.strace or perf_dir else cfg.rounds):
            for n in ranks:
                # Rotated each round, with a pause: the cell after a large
                # one sometimes meets 20-40 s of SYN retries in the connect
                # phase (whatever server it is), so no server is always there.
                k = rnd % len(servers)
                for key in servers[k:] + servers[:k]:
                    time.sleep(PAUSE_S)
                    r = one(key, build, cfg.base, n, cfg.strace, tmp, perf_dir)
                    r["round"] = rnd
                    rows.append(r)
                    log(json.dumps(r))
    print("| N | server | runs | wall s | wake fan-out s (max) | barrier tail s | setters | "
          "server CPU s (teardown) | segments per rank: out (teardown), pure ACKs, delayed ACKs |"
          + (" syscalls per rank |" if cfg.strace else ""))
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if cfg.strace else ""))
    for n in ranks:
        for key in servers:
            sel = [r for r in rows if r["server"] == key and r["ranks"] == n]
            ok = [r for r in sel if r.get("ok")]
            seg = [r["segments_per_rank"] for r in ok if "segments_per_rank" in r]

            def segmed(f):
                return statistics.median(x[f] for x in seg) if seg else float("nan")
            line = (f"| {n} | {key} | {len(ok)}/{len(sel)} | {median(sel, 'total_s'):.3f} | "
                    f"{median(sel, 'wake_s'):.3f} "
                    f"({max([r.get('wake_s', 0) for r in ok] or [float('nan')]):.3f}) | "
                    f"{median(sel, 'fanout_s'):.3f} | {median(sel, 'setters'):.0f} | "
                    f"{median(sel, 'server_cpu_s'):.3f} ({median(sel, 'teardown_cpu_s'):.3f}) | "
                    f"{segmed('OutSegs'):.2f} ({median(sel, 'teardown_segments_per_rank'):.2f}), "
                    f"{segmed('TCPPureAcks'):.2f}, {segmed('DelayedACKs'):.2f} |")
            if cfg.strace and ok and "syscalls" in ok[0]:
                sc = sorted(ok[0]["syscalls"].items(), key=lambda kv: -kv[1])
                line += " " + ", ".join(f"{k} {v / n:.2f}" for k, v in sc[:9]) + " |"
            print(line)
    if cfg.json:
        with open(cfg.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
