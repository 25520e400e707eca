#!/usr/bin/env python3
"""Cost of the store's security: runs build/bench/secure_bench in every mode
(none, auth, tls, auth+tls), interleaved, REPEAT times, and prints the
medians as a markdown table (store ops/s, connections/s, rendezvous time of K
nodes). Makes its own secret and certificates (with the openssl command, via
tests/integration/helpers/certs.py) in a temporary directory.

    bench/security_bench.py [--repeat N] [--threads T] [--seconds S] [--k K]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration", "helpers"))
import certs  # noqa: E402

MODES = ["none", "auth", "tls", "both"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=2)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--build", default=os.environ.get("CRUN_BUILD", os.path.join(ROOT, "build")))
    a = ap.parse_args()
    exe = os.path.join(a.build, "bench", "secure_bench")
    d = tempfile.mkdtemp(prefix="crun-secbench-")
    try:
        certs.make(d)
        secret = os.path.join(d, "secret")
        with open(secret, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        os.chmod(secret, 0o600)
        res = {m: {"ops": [], "connect": [], "rdzv": []} for m in MODES}
        for _ in range(a.repeat):
            for m in MODES:
                out = subprocess.run([exe, "--mode", m, "--secret", secret, "--certs", d,
                                      "--threads", str(a.threads), "--seconds", str(a.seconds),
                                      "--k", str(a.k)], capture_output=True, text=True,
                                     timeout=600, check=True)
                for line in out.stdout.splitlines():
                    j = json.loads(line)
                    assert not j["error"], j
                    key = {"ops": "ops_per_s", "connect": "connects_per_s",
                           "rdzv": "seconds"}[j["bench"]]
                    res[m][j["bench"]].append(j[key])
        print(f"median of {a.repeat} interleaved runs; {a.threads} client threads, "
              f"{a.seconds} s each; rendezvous of {a.k} nodes in one process")
        print("| protection | store ops/s (SET+GET) | connections/s | rendezvous time |")
        print("|---|---|---|---|")
        name = {"none": "none", "auth": "HMAC auth", "tls": "TLS 1.3", "both": "TLS 1.3 + auth"}
        for m in MODES:
            r = res[m]
            print(f"| {name[m]} | {statistics.median(r['ops']):,.0f} | "
                  f"{statistics.median(r['connect']):,.0f} | "
                  f"{statistics.median(r['rdzv']) * 1000:.0f} ms |")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
