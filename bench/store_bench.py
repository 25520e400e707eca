#!/usr/bin/env python3
"""Store benchmark: crun-rdzvd against PyTorch's TCPStore servers, in one run.

Usage: store_bench.py [BUILD] [--quick] [--out FILE] [--no-netns] [--servers a,b,...]
BUILD (or $CRUN_BUILD, default ./build) holds bin/crun-rdzvd and bench/store_load.

For each server -- crun-rdzvd (v1 and v2 dialect), torch 1.13 legacy (v1), torch 2.x
legacy (v2), torch 2.x libuv (v2) -- it runs bench/store_load at 1, 16 and 64
connections, samples the server's RSS and CPU time from /proc, then holds 10,000 idle
connections with 16 loaded ones alongside. It prints markdown tables (ops/s, p50/p99,
RSS, crun/PyTorch ratios against the best PyTorch server per row) and kills every
server it started, always.

It runs inside a fresh network namespace (unshare --net, loopback only) when it can:
PyTorch 2.x's server resolves each client's address with a blocking reverse-DNS
lookup on its event loop, which would otherwise query the host's resolver.
"""
import argparse
import ctypes
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH1 = "/usr/bin/python3"
TORCH2 = os.path.join(os.environ.get("CRUN_TORCH2_VENV",
                                     os.path.expanduser("~/.cache/crun/venv-torch2")),
                      "bin", "python")
TOTAL_BUDGET_S = 285      # the whole run stays under 5 minutes
START_TIMEOUT_S = 150     # importing torch 2.x is slow on a busy 2-core machine
IDLE = 10000
CONNS = (1, 16, 64)

# name, label, dialect, how to start it
SERVERS = [
    ("crun-v1", "crun-rdzvd (v1)", 1, "crun"),
    ("crun-v2", "crun-rdzvd (v2)", 2, "crun"),
    ("torch113", "torch 1.13 legacy", 1, "torch113"),
    ("torch2-legacy", "torch 2.x legacy", 2, "torch2-legacy"),
    ("torch2-libuv", "torch 2.x libuv", 2, "torch2-libuv"),
]


def log(msg):
    print(f"store_bench: {msg}", file=sys.stderr, flush=True)


def raise_nofile():
    """Children inherit it: each server must hold 10,000+ sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def die_with_parent():
    """preexec_fn: SIGKILL this child when the benchmark dies, however it dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def on_term(signum, frame):
    raise SystemExit(128 + signum)      # runs every finally: servers get stopped


class Server:
    """One server process, started in its own session; stop() kills its group."""

    def __init__(self, key, argv):
        self.key = key
        self.argv = argv
        self.proc = None
        self.port = None
        self.version = ""
        self.lines = []
        self.ready = threading.Event()

    def start(self):
        # The torch wrapper exits by itself when this process dies.
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True, text=True,
                                     preexec_fn=die_with_parent)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            self._read_lines()
        except (ValueError, OSError):  # stop() closed the pipe under us
            pass
        self.ready.set()

    def _read_lines(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if len(self.lines) < 200:
                self.lines.append(line)
            m = re.search(r"listening on \S*?:(\d+)\b", line)
            if m and not self.ready.is_set():
                self.port = int(m.group(1))
                v = re.search(r"torch=(\S+)", line)
                self.version = v.group(1) if v else ""
                self.ready.set()
        self.ready.set()          # EOF: the process died; port stays None

    def wait_ready(self, timeout):
        self.ready.wait(timeout)
        return self.port is not None and self.proc.poll() is None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=5)
            except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        try:
            self.proc.stdout.close()
        except (OSError, ValueError):
            pass


def server_argv(kind, build):
    script = os.path.join(ROOT, "bench", "torch_store_server.py")
    if kind == "crun":
        return [os.path.join(build, "bin", "crun-rdzvd"), "--host", "127.0.0.1", "--port", "0"]
    if kind == "torch113":
        return [TORCH1, script]
    if kind == "torch2-legacy":
        return [TORCH2, script, "--libuv", "0"]
    return [TORCH2, script, "--libuv", "1"]


def proc_status(pid):
    """(VmRSS kB, VmHWM kB, cpu seconds) of pid, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            st = f.read()
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    rss = re.search(r"VmRSS:\s+(\d+)", st)
    hwm = re.search(r"VmHWM:\s+(\d+)", st)
    tick = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / tick      # utime + stime
    return (int(rss.group(1)) if rss else 0, int(hwm.group(1)) if hwm else 0, cpu)


class RssSampler:
    """Samples the server's VmRSS every 50 ms while a run is in progress."""

    def __init__(self, pid):
        self.pid = pid
        self.peak_kb = 0
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop_ev.is_set():
            s = proc_status(self.pid)
            if s:
                self.peak_kb = max(self.peak_kb, s[0])
            self.stop_ev.wait(0.05)

    def __enter__(self):
        self.th.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.th.join(2)


def run_load(load_bin, srv, dialect, args, timeout):
    """One store_load run; returns its JSON dict plus the server's RSS and CPU."""
    argv = [load_bin, "--host", "127.0.0.1", "--port", str(srv.port),
            "--dialect", str(dialect), "--label", srv.key] + args
    held, out = {}, []
    with RssSampler(srv.proc.pid) as sampler:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def watch_stderr():
            for line in p.stderr:
                if "ready in" in line and "holding" in line:
                    time.sleep(0.3)      # let the server settle, then read RSS once
                    s = proc_status(srv.proc.pid)
                    held["rss_kb"] = s[0] if s else None
                elif line.startswith("store_load: measuring"):
                    held["cpu0"] = proc_status(srv.proc.pid)
                elif line.startswith("store_load: measured"):
                    held["cpu1"] = proc_status(srv.proc.pid)
                held.setdefault("lines", []).append(line.rstrip())

        def read_stdout():
            out.extend(p.stdout)

        ths = [threading.Thread(target=f, daemon=True) for f in (watch_stderr, read_stdout)]
        for th in ths:
            th.start()
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for th in ths:
            th.join(5)
    after = proc_status(srv.proc.pid)
    res = {}
    for line in out:
        if line.startswith("{"):
            try:
                res = json.loads(line)
            except ValueError:
                pass
    if not res:
        res = {"error": f"store_load gave no result (rc={p.returncode}): "
                        f"{' | '.join(held.get('lines', [])[-3:])}"}
    res["rss_peak_kb"] = max(sampler.peak_kb, after[0] if after else 0)
    res["rss_held_kb"] = held.get("rss_kb")
    res["rss_after_kb"] = after[0] if after else None
    c0, c1 = held.get("cpu0"), held.get("cpu1")
    # Server CPU seconds over the measured window only (CLK_TCK resolution).
    res["server_cpu_s"] = (c1[2] - c0[2]) if c0 and c1 else None
    res["server_alive"] = srv.alive()
    return res


def load_args(cfg, n):
    return ["--conns", str(n), "--warmup", str(cfg.warmup), "--duration", str(cfg.duration),
            "--max-time", str(cfg.warmup + cfg.duration + 30), "--keys", "1000",
            "--value-size", str(cfg.value_size), "--mix", cfg.mix, "--get", cfg.get]


def median_run(runs):
    """The run with the median ops/s (its latencies come with it), plus the spread."""
    good = sorted((r for r in runs if ok(r)), key=lambda r: r["ops_per_s"])
    if not good:
        return runs[-1] if runs else {"error": "not run"}
    med = dict(good[len(good) // 2])
    med["runs"] = len(runs)
    med["ops_min"] = good[0]["ops_per_s"]
    med["ops_max"] = good[-1]["ops_per_s"]
    cpus = sorted(r["server_cpu_s"] / r["ops"] for r in good if r.get("server_cpu_s"))
    med["cpu_us_per_op"] = 1e6 * cpus[len(cpus) // 2] if cpus else None
    return med


def idle_test(key, dialect, srv, load_bin, cfg, budget_s):
    args = load_args(cfg, 16)
    args[args.index("--duration") + 1] = str(cfg.idle_duration)
    args[args.index("--max-time") + 1] = f"{min(100, budget_s - 5):.0f}"
    res = run_load(load_bin, srv, dialect, ["--idle", str(cfg.idle), "--hold", "1"] + args,
                   timeout=min(110, budget_s))
    log(f"{key} idle={cfg.idle}: {json.dumps(res.get('idle'))} "
        f"rss_held={res.get('rss_held_kb')} kB, load {summ(res)}")
    return res


def summ(res):
    if "ops_per_s" not in res:
        return res.get("error", "no result")
    e = res.get("errors", {})
    bad = {k: v for k, v in e.items() if v}
    return (f"{res['ops_per_s']:.0f} ops/s p50 {res['p50_us']:.0f} us p99 {res['p99_us']:.0f} us"
            f" rss {res['rss_peak_kb'] / 1024:.1f} MB{' errors ' + str(bad) if bad else ''}")


# ---- tables ----------------------------------------------------------------

def mb(kb):
    return "n/a" if kb is None else f"{kb / 1024:.1f}"


def cell(res):
    if not res or "ops_per_s" not in res or not res.get("ops"):
        return "failed"
    bad = sum(res.get("errors", {}).values())
    flag = f" ({bad} err)" if bad else ""
    return f"{res['ops_per_s']:,.0f} ({res['p50_us']:.0f}/{res['p99_us']:.0f}){flag}"


def ok(res):
    return bool(res) and res.get("ops", 0) > 0 and not res.get("error")


def tables(results, cfg, env):
    lines = []
    keys = [k for k, *_ in SERVERS if k in results]
    torch_keys = [k for k in keys if k.startswith("torch")]
    crun_keys = [k for k in keys if k.startswith("crun")]
    label = {k: lab for k, lab, *_ in SERVERS}
    lines.append(f"Run: {env}. Mix set:get:add:check = {cfg.mix}, {cfg.value_size}-byte values, "
                 f"1000 keys, GET mode `{cfg.get}`; each cell is the median of {cfg.passes} "
                 f"pass(es) of {cfg.duration} s measured after {cfg.warmup} s warm-up.")
    lines.append("")
    lines.append("### Throughput: ops/s (p50/p99 latency in µs)")
    lines.append("")
    hdr = "| conns | " + " | ".join(label[k] for k in keys)
    if crun_keys and torch_keys:
        hdr += " | best PyTorch | " + " | ".join(
            f"{label[k].split(' ')[0]} {label[k].split(' ')[1]} / best" for k in crun_keys)
    lines.append(hdr + " |")
    lines.append("|" + "---|" * (hdr.count("|")))
    for n in CONNS:
        row = [str(n)] + [cell(results[k]["load"].get(n)) for k in keys]
        if crun_keys and torch_keys:
            cands = [(results[k]["load"][n]["ops_per_s"], k) for k in torch_keys
                     if ok(results[k]["load"].get(n))]
            if cands:
                best_ops, best = max(cands)
                best_p99 = results[best]["load"][n]["p99_us"]
                row.append(label[best])
                for k in crun_keys:
                    res = results[k]["load"].get(n)
                    if ok(res):
                        row.append(f"**{res['ops_per_s'] / best_ops:.2f}x** ops, p99 "
                                   f"{res['p99_us']:.0f} vs {best_p99:.0f} µs")
                    else:
                        row.append("failed")
            else:
                row += ["none"] + ["n/a"] * len(crun_keys)
        lines.append("| " + " | ".join(row) + " |")
    if crun_keys and torch_keys:
        lines.append("")
        lines.append("Per server core (steadier than ops/s on a shared machine): the most "
                     "efficient PyTorch server's CPU µs/op divided by crun's, so 2.00x means "
                     "crun serves twice the ops per CPU second.")
        lines.append("")
        lines.append("| conns | most efficient PyTorch (µs/op) | " + " | ".join(
            f"{label[k]} (µs/op)" for k in crun_keys) + " |")
        lines.append("|---|---|" + "---|" * len(crun_keys))
        for n in CONNS:
            cands = [(results[k]["load"][n]["cpu_us_per_op"], k) for k in torch_keys
                     if ok(results[k]["load"].get(n)) and
                     results[k]["load"][n].get("cpu_us_per_op")]
            if not cands:
                continue
            best_cpu, best = min(cands)
            row = [str(n), f"{label[best]} ({best_cpu:.1f})"]
            for k in crun_keys:
                res = results[k]["load"].get(n)
                c = res.get("cpu_us_per_op") if ok(res) else None
                row.append(f"**{best_cpu / c:.2f}x** ({c:.1f})" if c else "n/a")
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("### Server CPU per op, memory, spread over the passes")
    lines.append("")
    lines.append("Server CPU µs/op is the server's user+system time over the measured window "
                 "divided by the ops: what one server core can sustain, independent of the "
                 "load generator sharing the machine.")
    lines.append("")
    lines.append("| server | version | CPU µs/op at 1 / 16 / 64 conns | ops/s range at 1 / 16 / 64 conns | "
                 "client CPU µs/op at 64 | RSS at start (MB) | peak RSS, 64 conns (MB) |")
    lines.append("|---|---|---|---|---|---|---|")
    for k in keys:
        r = results[k]
        cpu, rng = [], []
        for n in CONNS:
            res = r["load"].get(n, {})
            cpu.append(f"{res['cpu_us_per_op']:.1f}" if res.get("cpu_us_per_op") else "n/a")
            rng.append(f"{res['ops_min'] / 1000:.0f}k–{res['ops_max'] / 1000:.0f}k"
                       if res.get("ops_min") is not None else "n/a")
        r64 = r["load"].get(64, {})
        ccpu = r64.get("client_cpu_us_per_op")
        lines.append(f"| {label[k]} | {r['version'] or 'n/a'} | {' / '.join(cpu)} | "
                     f"{' / '.join(rng)} | {ccpu if ccpu is not None else 'n/a'} | "
                     f"{mb(r['rss_base_kb'])} | {mb(r64.get('rss_peak_kb'))} |")
    lines.append("")
    lines.append(f"### {cfg.idle:,} idle connections (v1: silent; v2: VALIDATE + PING each), "
                 "16 loaded connections alongside")
    lines.append("")
    lines.append("| server | idle ready | connect time (s) | answered at end | RSS at start (MB) | "
                 "RSS holding idle (MB) | growth (MB) | ops/s (p50/p99 µs) alongside |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for k in keys:
        r = results[k]
        i = r.get("idle") or {}
        ii = i.get("idle") or {}
        held = i.get("rss_held_kb")
        peak = i.get("rss_peak_kb")
        base = r.get("rss_base_kb")
        growth = (f"{(max(held or 0, peak or 0) - base) / 1024:.1f}"
                  if base is not None and (held or peak) else "n/a")
        if not ii:
            lines.append(f"| {label[k]} | {i.get('error', 'failed')} | | | {mb(base)} | | | |")
            continue
        lines.append(f"| {label[k]} | {ii.get('ready')}/{ii.get('requested')} | "
                     f"{ii.get('connect_ms', 0) / 1000:.1f} | {ii.get('answered')} | {mb(base)} | "
                     f"{mb(held)} (peak {mb(peak)}) | {growth} | {cell(i)} |")
    lines.append("")
    lines.append("RSS of a PyTorch server is that of the Python process hosting its daemon thread, "
                 "libtorch included; the growth column isolates what the connections cost.")
    return "\n".join(lines)


def goal_lines(results):
    out = []
    torch_keys = [k for k in results if k.startswith("torch")]
    for k in (k for k in results if k.startswith("crun")):
        r = results[k]
        verdicts = []
        for n in (16, 64):
            res = r["load"].get(n)
            cands = [results[t]["load"][n] for t in torch_keys if ok(results[t]["load"].get(n))]
            if not ok(res) or not cands:
                verdicts.append(f"{n} conns: n/a")
                continue
            best = max(cands, key=lambda x: x["ops_per_s"])
            ratio = res["ops_per_s"] / best["ops_per_s"]
            good = ratio >= 2 and res["p99_us"] < best["p99_us"]
            cpus = [c["cpu_us_per_op"] for c in cands if c.get("cpu_us_per_op")]
            eff = (f", per core {min(cpus) / res['cpu_us_per_op']:.2f}x"
                   if cpus and res.get("cpu_us_per_op") else "")
            verdicts.append(f"{n} conns {ratio:.2f}x{eff}, p99 {res['p99_us']:.0f} vs "
                            f"{best['p99_us']:.0f} µs: {'MET' if good else 'MISSED'}")
        i = r.get("idle") or {}
        ii = i.get("idle") or {}
        rss = max(i.get("rss_held_kb") or 0, i.get("rss_peak_kb") or 0)
        held = ii.get("answered") == ii.get("requested") and ii.get("requested")
        verdicts.append(f"{ii.get('requested', '?')} idle: {ii.get('answered', 0)} answered, RSS "
                        f"{rss / 1024:.1f} MB: {'MET' if held and rss < 64 * 1024 else 'MISSED'}")
        out.append(f"- goal, {k}: " + "; ".join(verdicts))
    return "\n".join(out)


# ---- main ----------------------------------------------------------------------

def in_own_netns(argv):
    """Re-runs this script in a new network namespace with only loopback up."""
    if os.environ.get("CRUN_BENCH_NETNS") == "1" or not shutil.which("unshare"):
        return None
    env = dict(os.environ, CRUN_BENCH_NETNS="1")
    inner = "ip link set lo up && exec \"$0\" \"$@\""
    cmd = ["unshare", "--net", "sh", "-c", inner, sys.executable, os.path.abspath(__file__)]
    try:
        probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if probe.returncode != 0 or not shutil.which("ip"):
        return None
    p = subprocess.Popen(cmd + argv, env=env)
    # unshare and sh exec, so p is the inner benchmark: pass a stop on to it.
    forward = lambda signum, frame: p.send_signal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return p.wait()


def main():
    ap = argparse.ArgumentParser(description="crun-rdzvd vs PyTorch TCPStore benchmark")
    ap.add_argument("build", nargs="?", default=os.environ.get("CRUN_BUILD",
                                                               os.path.join(ROOT, "build")))
    ap.add_argument("--quick", action="store_true", help="short cells (smoke test)")
    ap.add_argument("--out", help="also write the markdown tables to this file")
    ap.add_argument("--json", help="also write the raw results as JSON to this file")
    ap.add_argument("--no-netns", action="store_true", help="run in the current namespace")
    ap.add_argument("--servers", default=",".join(k for k, *_ in SERVERS))
    ap.add_argument("--mix", default="20:50:20:10")
    ap.add_argument("--get", choices=["raw", "torch"], default="raw")
    ap.add_argument("--value-size", type=int, default=64)
    ap.add_argument("--idle", type=int, default=IDLE)
    ap.add_argument("--passes", type=int, default=None,
                    help="load passes over all servers; the table shows the median (default 3)")
    cfg = ap.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    if not cfg.no_netns and os.environ.get("CRUN_BENCH_NETNS") != "1":
        rc = in_own_netns(sys.argv[1:])
        if rc is not None:
            return rc
        log("cannot create a network namespace; running in the host's "
            "(PyTorch 2.x will send reverse-DNS queries for 127.0.0.1)")
    netns = os.environ.get("CRUN_BENCH_NETNS") == "1"
    cfg.build = os.path.abspath(cfg.build)
    cfg.warmup, cfg.duration, cfg.idle_duration = (0.2, 0.5, 0.5) if cfg.quick else (0.5, 2, 2)
    if cfg.passes is None:
        cfg.passes = 1 if cfg.quick else 3
    wanted = cfg.servers.split(",")
    load_bin = os.path.join(cfg.build, "bench", "store_load")
    if not os.access(load_bin, os.X_OK):
        log(f"{load_bin} is not built (make BUILD=... all)")
        return 2
    nofile = raise_nofile()
    if nofile < cfg.idle + 200:
        log(f"RLIMIT_NOFILE is {nofile}; idle test reduced")
        cfg.idle = max(0, nofile - 200)

    t0 = time.monotonic()
    load_deadline = t0 + TOTAL_BUDGET_S - 100   # the idle tests need up to ~80 s
    servers, results = {}, {}
    env = (f"{os.cpu_count()} CPUs, loopback"
           f"{' in a private network namespace' if netns else ''}, "
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
           f"load average {os.getloadavg()[0]:.1f} at the start")
    try:
        # Start every server up front (the torch imports overlap), then measure
        # them in turn, in passes that rotate the order: the machine is shared,
        # and the median of the passes is what the table shows.
        for key, _, dialect, kind in SERVERS:
            if key not in wanted:
                continue
            argv = server_argv(kind, cfg.build)
            results[key] = {"key": key, "dialect": dialect, "version": "", "load": {},
                            "runs": {n: [] for n in CONNS}, "idle": None, "rss_base_kb": None}
            if not os.access(argv[0], os.X_OK):
                log(f"{key}: {argv[0]} missing, skipped")
                results[key]["idle"] = {"error": f"{os.path.basename(argv[0])} missing"}
                continue
            servers[key] = Server(key, argv)
            servers[key].start()
        active = []
        for key, _, dialect, kind in SERVERS:
            srv = servers.get(key)
            if srv is None:
                continue
            if not srv.wait_ready(max(5, t0 + START_TIMEOUT_S - time.monotonic())):
                log(f"{key}: did not come up: {' | '.join(srv.lines[-5:])}")
                results[key]["idle"] = {"error": "did not start"}
                srv.stop()
                continue
            if kind == "crun":
                srv.version = "this tree"
            results[key]["version"] = srv.version
            st = proc_status(srv.proc.pid)
            results[key]["rss_base_kb"] = st[0] if st else None
            log(f"{key}: port {srv.port}, {srv.version}")
            active.append((key, dialect, srv))
        for p in range(cfg.passes):
            order = active[p % max(1, len(active)):] + active[:p % max(1, len(active))]
            for n in CONNS:
                for key, dialect, srv in order:
                    if time.monotonic() > load_deadline or not srv.alive():
                        continue
                    res = run_load(load_bin, srv, dialect, load_args(cfg, n),
                                   timeout=cfg.warmup + cfg.duration + 40)
                    results[key]["runs"][n].append(res)
                    log(f"pass {p + 1} {key} conns={n}: {summ(res)}")
        for key, dialect, srv in active:
            r = results[key]
            r["load"] = {n: median_run(r["runs"][n]) for n in CONNS}
            left = t0 + TOTAL_BUDGET_S - time.monotonic()
            if left < 25 or not srv.alive():
                r["idle"] = {"error": "skipped: time budget spent or server died"}
            else:
                r["idle"] = idle_test(key, dialect, srv, load_bin, cfg, left)
            srv.stop()
    finally:
        for srv in servers.values():
            srv.stop()
    env += f", load average {os.getloadavg()[0]:.1f} at the end"
    md = tables(results, cfg, env)
    goals = goal_lines(results)
    print(md)
    print()
    print(goals)
    log(f"done in {time.monotonic() - t0:.0f} s")
    if cfg.out:
        with open(cfg.out, "w") as f:
            f.write(md + "\n\n" + goals + "\n")
    if cfg.json:
        with open(cfg.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
