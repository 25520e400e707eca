#!/usr/bin/env python3
"""The worker-init storm: N simulated ranks (bench/storm) against crun's stores
and PyTorch's TCPStore servers, in one run.

Usage: storm_bench.py [BUILD] [--ranks 1024,4096,...] [--servers a,b] [--resolver local|slow|machine]
                      [--out FILE.md] [--json FILE] [--plot FILE.svg] [--quick]

Past one process's descriptors (N > 19,900) the crun-proxy cell runs
ceil(N / 16,384) bench/storm generators, each driving a slice of the world
(--first/--count) from one common CLOCK_MONOTONIC start; its wall is the first
connect to the last rank done over all of them. Only that cell runs past
~19,900 ranks here: a single server (libuv, crun-rdzvd direct) cannot hold more
connections in one process (RLIMIT_NOFILE 20,000, hard). The root of the proxy
cell holds one connection per proxy (N / 8), 12,288 at N = 98,304.

Servers: crun-rdzvd (v2), crun's worker store as the agent serves it (a standalone
`crun` whose worker reports MASTER_PORT), PyTorch 2.x libuv and legacy (v2), 1.13
(v1). Each (server, N) cell gets a fresh server, so its peak RSS (VmHWM) belongs
to that cell; server CPU seconds are read from /proc around the storm.

The run happens in a private network and mount namespace (loopback only):
  --resolver local  an /etc/hosts-only nsswitch.conf: the reverse lookups that
                    PyTorch 2.x servers make for every accepted client stay local;
  --resolver slow   a stub DNS server on 127.0.0.53 that answers each query after
                    --dns-delay-ms (NXDOMAIN), standing in for a cluster's slow
                    resolver without sending a single query off this machine.
  --resolver machine  no private namespace: the machine's own nsswitch.conf and
                    resolv.conf, so PyTorch 2.x servers' reverse lookups of the 127.x
                    clients go wherever this machine sends them (its DNS server).
"""
import argparse
import json
import math
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import loglog_svg  # noqa: E402
from store_bench import (ROOT, TORCH1, TORCH2, Server, RssSampler, die_with_parent,  # noqa: E402
                         proc_status, raise_nofile)

# Past 19,900 only the proxied root fits one process here (one connection
# per node): those sizes run the crun-proxy cell alone, up to 100k GPUs.
RANKS = (1024, 2048, 4096, 8192, 16384, 19900, 32768, 65536, 98304)
# PyTorch 2.x's legacy server is quadratic in N: it runs up to this N (each
# cell under --legacy-timeout) and is marked left out above it.
LEGACY_MAX_RANKS = 4096
START_TIMEOUT_S = 150
MODEL_N = 98304

# key, label, dialect
SERVERS = [
    ("crun-rdzvd", "crun-rdzvd", 2),
    ("crun-agent", "crun agent store", 2),
    ("crun-proxy", "crun with node-local proxies", 2),
    ("torch2-libuv", "torch 2.x libuv", 2),
    ("torch2-legacy", "torch 2.x legacy", 2),
    ("torch113", "torch 1.13", 1),
]

WORKER = r"""
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(os.environ["MASTER_PORT"] + "\n")
time.sleep(float(sys.argv[2]))
"""


def log(msg):
    print(f"storm_bench: {msg}", file=sys.stderr, flush=True)


def server_argv(key, build, tmp):
    script = os.path.join(HERE, "torch_store_server.py")
    if key == "crun-rdzvd":
        # Default limits: the automatic --max-conns (the fd limit less what
        # the process holds and 64) takes N = 19,900 of 20,000 descriptors.
        return [os.path.join(build, "bin", "crun-rdzvd"), "--host", "127.0.0.1", "--port", "0"]
    if key == "torch113":
        return [TORCH1, script]
    if key == "torch2-legacy":
        return [TORCH2, script, "--libuv", "0"]
    if key == "torch2-libuv":
        return [TORCH2, script, "--libuv", "1"]
    raise ValueError(key)


class AgentStore(Server):
    """`crun --standalone` with one worker that writes MASTER_PORT to a file:
    the store under test is the one that agent serves to its workers."""

    def __init__(self, build, tmp):
        self.portfile = os.path.join(tmp, "master_port")
        # Cells share tmp: a port left by the previous cell's agent would be
        # read at once and the storm sent to a closed port.
        if os.path.exists(self.portfile):
            os.unlink(self.portfile)
        worker = os.path.join(tmp, "report_port.py")
        with open(worker, "w") as f:
            f.write(WORKER)
        super().__init__("crun-agent", [os.path.join(build, "bin", "crun"), "--standalone",
                                        "--nproc_per_node=1", worker, self.portfile, "600"])

    def _read(self):
        for line in self.proc.stdout:
            if len(self.lines) < 200:
                self.lines.append(line.rstrip("\n"))
        self.ready.set()

    def wait_ready(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.alive():
            try:
                with open(self.portfile) as f:
                    txt = f.read().strip()
                if txt:
                    self.port = int(txt)
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False


PROXY_RANKS = 8          # ranks per node-local proxy (one node's GPUs)
PROXIES_PER_FARM = 1500  # ~10 fds each (listener, 8 clients, 1 upstream): < 20,000
GEN_RANKS = 16384        # ranks per storm generator process (< 20,000 fds)...
GEN_SINGLE_MAX = 19900   # ...when one process cannot hold them all (as the cells before)
GEN_START_DELAY_S = 1.0  # the generators' common start, after they are all up


class ProxyFarms:
    """The crun-proxy cell: ceil(N / 8) node-local proxies (store/proxy/proxy.c) in
    store_proxy_farm processes, each proxy with its own listener and its own
    upstream connections to the root store (crun-rdzvd)."""

    def __init__(self, build, tmp, root_port, n):
        self.procs, self.files, self.errs = [], [], []
        total = (n + PROXY_RANKS - 1) // PROXY_RANKS
        for i in range(0, total, PROXIES_PER_FARM):
            f = os.path.join(tmp, f"proxy_ports.{i}")
            if os.path.exists(f):
                os.unlink(f)
            self.files.append(f)
            self.errs.append(open(f + ".err", "w+"))
            self.procs.append(subprocess.Popen(
                [os.path.join(build, "bench", "store_proxy_farm"), "--upstream",
                 f"127.0.0.1:{root_port}", "--proxies", str(min(PROXIES_PER_FARM, total - i)),
                 "--ports-file", f], stdout=subprocess.DEVNULL, stderr=self.errs[-1],
                start_new_session=True, preexec_fn=die_with_parent))
        self.ports_file = os.path.join(tmp, "proxy_ports")

    def wait_ready(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(os.path.exists(f) for f in self.files):
                with open(self.ports_file, "w") as out:
                    for f in self.files:
                        with open(f) as fh:
                            out.write(fh.read())
                return True
            if any(p.poll() is not None for p in self.procs):
                return False
            time.sleep(0.05)
        return False

    def why(self):
        """The first farm's complaint (stderr), for a cell that failed."""
        for e in self.errs:
            e.seek(0)
            txt = e.read().strip()
            if txt:
                return txt[-200:]
        return "?"

    def cpu(self):
        return sum((proc_status(p.pid) or (0, 0, 0))[2] for p in self.procs)

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for e in self.errs:
            e.close()


def run_generators(base_argv, n, timeout_s):
    """ceil(n / GEN_RANKS) storm processes of one world, started together on
    CLOCK_MONOTONIC (Python's monotonic clock on Linux); one JSON result:
    wall from the first connect to the last rank done over all of them."""
    gens = 1 if n <= GEN_SINGLE_MAX else (n + GEN_RANKS - 1) // GEN_RANKS
    if gens == 1:
        p = subprocess.run(base_argv, capture_output=True, text=True, timeout=timeout_s + 30)
        line = next((l for l in p.stdout.splitlines() if l.startswith("{")), None)
        return json.loads(line) if line else {"ok": False, "error": p.stderr[-300:]}
    start = time.monotonic_ns() + int(GEN_START_DELAY_S * 1e9)
    window = (start // 1000) % 50000
    procs = []
    for g in range(gens):
        first = g * GEN_RANKS
        procs.append(subprocess.Popen(
            base_argv + ["--first", str(first), "--count", str(min(GEN_RANKS, n - first)),
                         "--start-at-ns", str(start), "--src-port0", str(window)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout_s + 30 + GEN_START_DELAY_S)
        line = next((l for l in out.splitlines() if l.startswith("{")), None)
        outs.append(json.loads(line) if line else {"ok": False, "error": err[-300:]})
    ok = all(o.get("ok") for o in outs)
    res = {"ranks": n, "generators": gens, "ok": ok,
           "error": "; ".join(o.get("error", "") for o in outs if o.get("error")),
           "done": sum(o.get("done", 0) for o in outs),
           "requests": sum(o.get("requests", 0) for o in outs)}
    if ok:
        t0 = min(o["t_start_ns"] for o in outs)
        sets = [o["t_first_set_ns"] for o in outs if o.get("t_first_set_ns")]
        res["total_s"] = (max(o["t_done_ns"] for o in outs) - t0) / 1e9
        res["connect_s"] = (max(o["t_last_connect_ns"] for o in outs) - t0) / 1e9
        res["start_skew_s"] = (max(o["t_start_ns"] for o in outs) - t0) / 1e9
        # Which waits went out before the first SET is known only in the
        # process that SET: with several, the fan-out is the tail (to the
        # last rank past the barrier), and "parked" is not counted.
        res["fanout_s"] = (max(o["t_last_wake_ns"] for o in outs) - min(sets)) / 1e9 if sets else 0
        res["wake_s"] = res["fanout_s"]
        res["parked"] = 0
    return res


def storm_once(build, key, dialect, n, tmp, timeout_s):
    if key == "crun-agent":
        srv = AgentStore(build, tmp)
    else:
        srv = Server(key, server_argv("crun-rdzvd" if key == "crun-proxy" else key, build, tmp))
    farms = None
    res = {"server": key, "ranks": n}
    try:
        srv.start()
        if not srv.wait_ready(START_TIMEOUT_S):
            res["error"] = "server did not start: " + " | ".join(srv.lines[-3:])
            return res
        target = ["--port", str(srv.port)]
        if key == "crun-proxy":
            farms = ProxyFarms(build, tmp, srv.port, n)
            if not farms.wait_ready(START_TIMEOUT_S):
                res["error"] = "proxies did not start: " + farms.why()
                return res
            target = ["--ports-file", farms.ports_file, "--per-port", str(PROXY_RANKS)]
            proxies_before = farms.cpu()
        before = proc_status(srv.proc.pid)
        argv = [os.path.join(build, "bench", "storm"), *target, "-n", str(n),
                "--dialect", f"v{dialect}", "--timeout-ms", str(int(timeout_s * 1000))]
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        with RssSampler(srv.proc.pid):
            gen = run_generators(argv, n, timeout_s)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        after = proc_status(srv.proc.pid)
        # The load generator's own CPU, user and system apart: a slow connect
        # phase with system time to match is kernel work in the generator
        # (its port search), one without is waiting (retransmits, the server).
        res["gen_user_s"] = round(ru1.ru_utime - ru0.ru_utime, 3)
        res["gen_sys_s"] = round(ru1.ru_stime - ru0.ru_stime, 3)
        if farms:
            # The root's CPU is the cell's server CPU; the proxies' is reported
            # beside it, honestly: together they did the work.
            res["proxies_cpu_s"] = round(farms.cpu() - proxies_before, 3)
            res["proxies"] = (n + PROXY_RANKS - 1) // PROXY_RANKS
            res["root_fds"] = len(os.listdir(f"/proc/{srv.proc.pid}/fd"))
        res.update(gen)
        if before and after:
            res["server_cpu_s"] = round(after[2] - before[2], 3)
            res["server_hwm_mb"] = round(after[1] / 1024, 1)
        res["server_alive"] = srv.alive()
    except subprocess.TimeoutExpired:
        res.update(ok=False, error="storm timed out")
    finally:
        if farms:
            farms.stop()
        srv.stop()
    return res


# ---- the slow resolver stand-in -------------------------------------------------

def dns_stub(addr, delay_s, stop):
    """Answers every DNS query with NXDOMAIN after delay_s (one thread: a
    resolver that serialises, as a loaded one does)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    s.settimeout(0.2)
    while not stop.is_set():
        try:
            q, peer = s.recvfrom(512)
        except socket.timeout:
            continue
        if len(q) < 12:
            continue
        time.sleep(delay_s)
        # Header: same id, QR=1, opcode from the query, RD copied, RA=1, RCODE=3.
        flags = 0x8000 | (q[2] << 8 & 0x7900) | 0x0080 | 3
        s.sendto(q[:2] + flags.to_bytes(2, "big") + q[4:6] + b"\0\0\0\0\0\0" + q[12:], peer)
    s.close()


def machine_resolver():
    """What --resolver machine means on this machine, for the report."""
    def first(path, prefix):
        try:
            with open(path) as f:
                return next((ln.split(None, 1)[1].strip() for ln in f
                             if ln.startswith(prefix)), "?")
        except (OSError, IndexError):
            return "?"
    return (f"the machine's resolver (hosts: {first('/etc/nsswitch.conf', 'hosts:')}, "
            f"nameserver {first('/etc/resolv.conf', 'nameserver')})")


def private_namespace(argv, resolver):
    """Re-runs this script in new network + mount namespaces, loopback up, with
    name lookups pointed where --resolver says. None when that is impossible."""
    if not shutil.which("unshare"):
        return None
    tmp = tempfile.mkdtemp(prefix="crun-storm-ns-")
    nss = os.path.join(tmp, "nsswitch.conf")
    resolv = os.path.join(tmp, "resolv.conf")
    with open(nss, "w") as f:
        f.write("hosts: files\n" if resolver == "local" else "hosts: files dns\n")
    with open(resolv, "w") as f:
        f.write("nameserver 127.0.0.53\noptions timeout:1 attempts:1\n")
    # The namespace's own port space, widened, and TIME_WAITs dropped past a
    # small table: a 98,304-rank cell binds ~37,000 ports (12,288 proxy
    # listeners, their upstream connects, the generators' source ports), and
    # the cell before it leaves as many in TIME_WAIT; with the default
    # 28,232-port range the proxies' connects failed (EADDRNOTAVAIL).
    inner = ("ip link set lo up && echo 1024 65535 > /proc/sys/net/ipv4/ip_local_port_range && "
             "echo 4096 > /proc/sys/net/ipv4/tcp_max_tw_buckets && "
             "mount --bind \"$NSS\" /etc/nsswitch.conf && "
             "mount --bind \"$RESOLV\" /etc/resolv.conf && exec \"$0\" \"$@\"")
    env = dict(os.environ, CRUN_BENCH_NETNS="1", NSS=nss, RESOLV=resolv)
    try:
        return subprocess.call(["unshare", "--net", "--mount", "--propagation", "private",
                                "sh", "-c", inner, sys.executable, os.path.abspath(__file__)]
                               + argv, env=env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- the model and the report ------------------------------------------------------

def fit(points):
    """Least-squares t = a + b*N over (N, t); returns (a, b, max relative error)."""
    n = len(points)
    if n < 2:
        return None
    sx = sum(p[0] for p in points)
    sy = sum(p[1] for p in points)
    sxx = sum(p[0] * p[0] for p in points)
    sxy = sum(p[0] * p[1] for p in points)
    den = n * sxx - sx * sx
    if den == 0:
        return None
    b = (n * sxy - sx * sy) / den
    a = (sy - b * sx) / n
    err = max(abs(a + b * x - y) / y for x, y in points if y > 0)
    return a, b, err


def wake_text(r):
    """The wake fan-out, or why there is none: every rank read N and SET
    :last_worker itself, so no rank was parked when the first SET went out."""
    return f"{r['wake_s']:.3f} s" if r.get("parked") else "- (no rank parked)"


def table(results, ranks, resolver, env_line, legacy_max=LEGACY_MAX_RANKS):
    out = [f"Worker-init storm ({resolver} name lookups; {env_line})", "",
           "| N | " + " | ".join(lbl for _, lbl, _ in SERVERS)
           + " | crun-agent / libuv | proxies' root / libuv |",
           "|---:|" + "---|" * (len(SERVERS) + 2)]
    for n in ranks:
        cells, libuv, agent, proxy = [], None, None, None
        for key, _, _ in SERVERS:
            r = results.get((key, n))
            if not r:
                cells.append("-")
            elif r.get("left_out"):
                cells.append("left out (quadratic)")
            elif not r.get("ok"):
                cells.append(f"failed: {r.get('error', '?')[:40]}")
            else:
                if r.get("generators"):  # several generators: the tail only
                    fan = f"{r['generators']} generators, fan-out (tail) {r['fanout_s']:.3f} s"
                else:
                    fan = f"fan-out {wake_text(r)} (tail {r['fanout_s']:.3f} s)"
                cells.append(f"{r['total_s']:.3f} s, {fan}, "
                             f"CPU {r.get('server_cpu_s', 0):.2f} s, "
                             f"{r.get('server_hwm_mb', 0):.0f} MB"
                             + (f" (root); {r['proxies']} proxies: CPU "
                                f"{r['proxies_cpu_s']:.2f} s" if "proxies" in r else ""))
                if key == "torch2-libuv":
                    libuv = r
                if key == "crun-agent":
                    agent = r
                if key == "crun-proxy":
                    proxy = r
        ratio = "-"
        if libuv and agent:
            ratio = (f"wall {agent['total_s'] / libuv['total_s']:.2f}x, "
                     f"CPU {agent.get('server_cpu_s', 0) / max(libuv.get('server_cpu_s', 0), 1e-3):.2f}x, "
                     + (f"fan-out {agent['wake_s'] / libuv['wake_s']:.2f}x"
                        if agent.get("parked") and libuv.get("parked") else "fan-out -"))
        root = "-"
        if libuv and proxy:
            root = (f"wall {proxy['total_s'] / libuv['total_s']:.2f}x, root CPU "
                    f"{proxy.get('server_cpu_s', 0) / max(libuv.get('server_cpu_s', 0), 1e-3):.2f}x")
        out.append(f"| {n} | " + " | ".join(cells) + f" | {ratio} | {root} |")
    out += ["", "fan-out: from the SET of :last_worker to the last rank that was waiting "
            "for it released (one SET waking every waiter); tail: to the last rank past "
            "the barrier, with those still between their ADDs when the SET went out. "
            f"torch 2.x legacy runs up to N = {legacy_max} (it is quadratic).",
            "", f"Model: wall time t(N) = a + b*N fitted per server on the measured points, "
            f"extrapolated to N = {MODEL_N} (a model, not a measurement):", "",
            "| server | a (s) | b (us/rank) | max error on measured points | t(98,304) |",
            "|---|---:|---:|---:|---:|"]
    for key, lbl, _ in SERVERS:
        pts = [(n, results[(key, n)]["total_s"]) for n in ranks
               if results.get((key, n), {}).get("ok")]
        f = fit(pts)
        if f:
            a, b, err = f
            out.append(f"| {lbl} | {a:.3f} | {b * 1e6:.1f} | {err * 100:.0f} % | "
                       f"{a + b * MODEL_N:.1f} s |")
    out += ["", "Model: server CPU c(N) = a + b*N fitted the same way (with node-local "
            "proxies: the root store's CPU, and the proxies' CPU summed over all of them, "
            "which on a cluster is spread over N/8 nodes):", "",
            "| server | a (s) | b (us/rank) | max error on measured points | c(98,304) |",
            "|---|---:|---:|---:|---:|"]
    cpu_rows = [(lbl, key, "server_cpu_s") for key, lbl, _ in SERVERS]
    cpu_rows.append(("node-local proxies, all together", "crun-proxy", "proxies_cpu_s"))
    for lbl, key, field in cpu_rows:
        pts = [(n, results[(key, n)][field]) for n in ranks
               if results.get((key, n), {}).get("ok") and field in results[(key, n)]]
        f = fit(pts)
        if f:
            a, b, err = f
            out.append(f"| {lbl} | {a:.3f} | {b * 1e6:.1f} | {err * 100:.0f} % | "
                       f"{a + b * MODEL_N:.1f} s |")
    return "\n".join(out) + "\n"


def plot(results, ranks, path, resolver):
    series = [(lbl, [(n, results[(key, n)]["total_s"]) for n in ranks
                     if results.get((key, n), {}).get("ok")]) for key, lbl, _ in SERVERS]
    loglog_svg(path, f"Worker-init storm ({resolver} name lookups)", "ranks N",
               "first connect to last rank done (s)", series)


def main():
    ap = argparse.ArgumentParser(description="worker-init storm benchmark")
    ap.add_argument("build", nargs="?", default=os.environ.get("CRUN_BUILD",
                                                               os.path.join(ROOT, "build")))
    ap.add_argument("--ranks", default=",".join(map(str, RANKS)))
    ap.add_argument("--servers", default=",".join(k for k, _, _ in SERVERS))
    ap.add_argument("--resolver", choices=["local", "slow", "machine"], default="local")
    ap.add_argument("--dns-delay-ms", type=float, default=2.0)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per storm")
    ap.add_argument("--legacy-max-ranks", type=int, default=LEGACY_MAX_RANKS,
                    help="largest N for torch 2.x legacy (quadratic)")
    ap.add_argument("--legacy-timeout", type=float, default=60.0,
                    help="seconds per torch 2.x legacy storm")
    ap.add_argument("--out")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    cfg = ap.parse_args()
    if cfg.resolver != "machine" and os.environ.get("CRUN_BENCH_NETNS") != "1":
        rc = private_namespace(sys.argv[1:], cfg.resolver)
        if rc is not None:
            return rc
        log("cannot create namespaces: refusing to run (PyTorch 2.x would query the "
            "machine's resolver for every client)")
        return 2
    build = os.path.abspath(cfg.build)
    ranks = [int(x) for x in cfg.ranks.split(",") if x]
    wanted = cfg.servers.split(",")
    nofile = raise_nofile()
    stop = threading.Event()
    if cfg.resolver == "slow":
        threading.Thread(target=dns_stub, args=("127.0.0.53", cfg.dns_delay_ms / 1000, stop),
                         daemon=True).start()
    env_line = (f"{os.cpu_count()} CPUs, RLIMIT_NOFILE {nofile}, "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
                + (f", stub resolver delay {cfg.dns_delay_ms} ms" if cfg.resolver == "slow" else "")
                + (", " + machine_resolver() if cfg.resolver == "machine" else ""))
    results = {}
    try:
        with tempfile.TemporaryDirectory(prefix="crun-storm-") as tmp:
            for n in ranks:
                for key, _, dialect in SERVERS:
                    if key not in wanted:
                        continue
                    # One process holds every rank, except with proxies (the
                    # root holds N / 8, each generator GEN_RANKS).
                    if n + 64 > nofile and key != "crun-proxy":
                        log(f"N={n}: {key} needs {n + 64} descriptors in one process; "
                            f"limit {nofile}: not run (single servers stay models)")
                        continue
                    timeout = cfg.timeout
                    if key == "torch2-legacy":
                        if n > cfg.legacy_max_ranks:
                            results[(key, n)] = {"server": key, "ranks": n, "left_out": True}
                            continue
                        timeout = cfg.legacy_timeout
                    r = storm_once(build, key, dialect, n, tmp, timeout)
                    results[(key, n)] = r
                    log(json.dumps(r))
    finally:
        stop.set()
    text = table(results, ranks, cfg.resolver, env_line, cfg.legacy_max_ranks)
    print(text)
    if cfg.out:
        with open(cfg.out, "w") as f:
            f.write(text)
    if cfg.json:
        with open(cfg.json, "w") as f:
            json.dump([r for r in results.values()], f, indent=1)
    if cfg.plot:
        plot(results, ranks, cfg.plot, cfg.resolver)
    failed = [r for r in results.values() if r["server"].startswith("crun") and not r.get("ok")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
