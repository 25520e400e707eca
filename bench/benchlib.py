"""benchlib.py: what the launcher-level benchmarks (launch_bench.py,
rdzv_vs_torchrun.py) share: where torchrun lives, free ports, re-running a
script in a private network namespace, a TMPDIR that goes with the run, and
killing the workers a launcher run may have left behind; and the log-log SVG plot of the scale benchmarks
(storm_bench.py, rdzv_sim.py)."""
import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH1 = "/usr/bin/python3"
TORCH2 = os.path.join(os.environ.get("CRUN_TORCH2_VENV",
                                     os.path.expanduser("~/.cache/crun/venv-torch2")),
                      "bin", "torchrun")


def private_tmpdir(keep=False):
    """Points TMPDIR (and this process's tempfile) at a folder of this run's,
    removed when the script exits unless keep: what the launchers leave there
    (crun's and torchrun's default log folders, torchelastic_*, one per
    launch) goes with it (a `make bench-ab` left 930 folders in /tmp). Call it
    before starting anything, so every child inherits it."""
    d = tempfile.mkdtemp(prefix="crun-bench-")
    os.environ["TMPDIR"] = d
    tempfile.tempdir = d
    if not keep:
        atexit.register(shutil.rmtree, d, True)
    return d


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ints(s):
    return tuple(int(x) for x in s.split(",") if x)


def in_own_netns(script, argv):
    """Re-runs `script` in a new network namespace with only loopback up, so
    torchrun's fixed ports and reverse-DNS lookups stay private. Returns its
    exit code, or None when namespaces are unavailable."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        return None
    try:
        probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if probe.returncode != 0:
        return None
    env = dict(os.environ, CRUN_BENCH_NETNS="1")
    inner = "ip link set lo up && exec \"$0\" \"$@\""
    return subprocess.call(["unshare", "--net", "sh", "-c", inner, sys.executable,
                            os.path.abspath(script)] + argv, env=env)


def kill_recorded_workers(record_files):
    """SIGKILLs every launch_worker whose pid a record file lists (lines of 5
    fields, pid 4th): workers of killed runs that left their agent's group."""
    for rec in record_files:
        try:
            with open(rec) as f:
                lines = f.read().split("\n")
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) != 5:
                continue
            try:
                pid = int(parts[3])
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"launch_worker" in f.read():
                        os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass


def loglog_svg(path, title, xlabel, ylabel, series):
    """Draws series [(title, [(x, y), ...]), ...] with gnuplot on log axes into the SVG at path.
    False (and nothing drawn) when gnuplot is missing or no series has a point."""
    if not shutil.which("gnuplot"):
        print(f"no plot {path}: gnuplot not found (apt-get install gnuplot-nox)",
              file=sys.stderr)
        return False
    with tempfile.TemporaryDirectory() as tmp:
        parts = []
        for i, (label, pts) in enumerate(series):
            if not pts:
                continue
            dat = os.path.join(tmp, f"{i}.dat")
            with open(dat, "w") as f:
                f.writelines(f"{x} {max(y, 0.001)}\n" for x, y in pts)
            parts.append(f"'{dat}' using 1:2 with linespoints title '{label}'")
        if not parts:
            return False
        script = (f"set terminal svg size 720,440 dynamic\nset output '{path}'\n"
                  f"set title '{title}'\nset logscale xy\nset xlabel '{xlabel}'\n"
                  f"set ylabel '{ylabel}'\nset key top left\nset grid\nplot "
                  + ", ".join(parts) + "\n")
        subprocess.run(["gnuplot"], input=script, text=True, check=False, timeout=60)
    return True
