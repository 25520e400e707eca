"""What one big rendezvous holds of crun-rdzvd's default budgets (issue 26).

    /usr/bin/python3 bench/store_share_bench.py BUILD [-k 12288]

Starts crun-rdzvd with its default limits (and --status), runs bench/rdzv_sim
with K simulated agents of one job against it, and samples `crunctl usage`
while the round forms; prints the job's peak keys, key bytes, value bytes and
waiters next to its share (job-share % of each budget), its refusals, and the
daemon's peak RSS. A measurement, not a test: the samples may miss a short
peak, so the figures are a lower bound on what the job held.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.environ.get("CRUN_BUILD", "build"))
    ap.add_argument("-k", type=int, default=12288)
    ap.add_argument("--timeout", type=int, default=300)
    a = ap.parse_args()
    d = subprocess.Popen([os.path.join(a.build, "bin", "crun-rdzvd"), "--port", "0",
                          "--status", "127.0.0.1:0"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    sim = None
    try:
        port = status = None
        while status is None:  # the two lines come first; EOF ends it
            line = d.stdout.readline()
            if not line:
                sys.exit("crun-rdzvd did not start")
            m = re.search(r"listening on \S+:(\d+)", line)
            port = int(m.group(1)) if m else port
            m = re.search(r"status on http://(\S+)/status", line)
            status = m.group(1) if m else None
        sim = subprocess.Popen([os.path.join(a.build, "bench", "rdzv_sim"), "--port", str(port),
                                "-k", str(a.k), "--sources", "8", "--timeout",
                                str(a.timeout)], stdout=subprocess.PIPE, text=True)
        peak, deadline = None, time.monotonic() + a.timeout + 30
        while sim.poll() is None and time.monotonic() < deadline:
            out = subprocess.run([os.path.join(a.build, "bin", "crunctl"), "usage", "--json",
                                  "--endpoint", status], capture_output=True, text=True)
            for row in json.loads(out.stdout or '{"usage": []}')["usage"]:
                if peak is None or row["used"]["keys"] > peak["used"]["keys"]:
                    peak = row
            time.sleep(0.2)
        with open(f"/proc/{d.pid}/status") as f:
            hwm = [ln.split()[1] for ln in f if ln.startswith("VmHWM:")][0]
        print(sim.communicate(timeout=60)[0].strip())
        print(f"k={a.k} rc={sim.returncode} crun-rdzvd peak RSS {int(hwm) / 1024:.1f} MiB")
        for b in ("keys", "key_bytes", "value_bytes", "waiters"):
            u, lim = peak["used"][b], peak["limit"][b]
            print(f"  {b:12} {u:>12,} of the job's {lim:>13,} ({100 * u / lim:.2f} %), "
                  f"refused {peak['refused'][b]}")
    finally:
        if sim and sim.poll() is None:
            sim.kill()
            sim.wait()
        os.killpg(d.pid, signal.SIGTERM)
        d.wait(timeout=20)


if __name__ == "__main__":
    main()
