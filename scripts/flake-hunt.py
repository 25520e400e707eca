#!/usr/bin/env python3
"""flake-hunt.py: runs chosen test suites RUNS times with CPU hogs beside them
and prints how often each test failed (issue 23). What `make flake-hunt`
runs; it is not part of `make test`.

    flake-hunt.py --build DIR [--runs N] [--hogs K] [--san 0|1] SUITE...

A SUITE is `unit:<binary>` (a Check binary under DIR/tests, e.g.
unit:test_rdzv_c10d) or `integration:<file>[::<pytest -k expression>]` (a
module under tests/integration, e.g. integration:test_faults.py or
integration:test_elastic.py::restarts_exhausted,kill_agent: commas are
"or", so that a make variable needs no spaces). The hogs are K busy loops
at this process's own priority: a race that needs a quiet machine shows up
as a failure count above 0. Every test that ran is listed, failed or not;
a suite that could not run at all (a crash, no summary) counts as one
failure of the pseudo-test "<suite>:<no result>". Exit status: 0 when
nothing failed, 1 when something did, 2 on a bad argument.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Check's verbose lines: file:line:{P,F,E}:tcase:test:iteration: message
CHECK_LINE = re.compile(r"^[^:\s]+:\d+:([PFE]):[^:]+:([^:]+):\d+:")
# A hang guard per run, generous: the suites bound their own waits.
RUN_LIMIT_S = 1800


def start_hogs(k):
    """K busy loops, same nice level as us; killed by pid in stop_hogs."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def stop_hogs(hogs):
    for h in hogs:
        h.kill()
    for h in hogs:
        h.wait()


def run_unit(build, name, san):
    """One run of a Check binary: {test: passed?}."""
    exe = os.path.join(build, "tests", name)
    env = dict(os.environ, CK_VERBOSITY="verbose",
               CK_TIMEOUT_MULTIPLIER="3" if san else os.environ.get("CK_TIMEOUT_MULTIPLIER", "1"))
    env.setdefault("CK_DEFAULT_TIMEOUT", "60")
    try:
        p = subprocess.run([exe], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=RUN_LIMIT_S)
        out = p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace")
    res, fails = {}, []
    for line in out.splitlines():
        m = CHECK_LINE.match(line)
        if m:
            ok = m.group(1) == "P"
            res[m.group(2)] = res.get(m.group(2), True) and ok
            if not ok:
                fails.append(line)
    return res, fails


def run_integration(build, spec, san):
    """One run of a pytest module (optionally -k filtered): {test: passed?}."""
    mod, _, expr = spec.partition("::")
    path = os.path.join(ROOT, "tests", "integration", mod)
    with tempfile.TemporaryDirectory(prefix="crun-flake-hunt-") as d:
        xml = os.path.join(d, "junit.xml")
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                f"--junitxml={xml}", path] + (["-k", expr.replace(",", " or ")] if expr else [])
        env = dict(os.environ, CRUN_BUILD=build, CRUN_SAN="1" if san else "0")
        try:
            p = subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=RUN_LIMIT_S)
            out = p.stdout.decode(errors="replace")
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace")
        res, fails = {}, []
        if not os.path.exists(xml):
            return res, [out[-2000:]]
        for tc in ET.parse(xml).getroot().iter("testcase"):
            name = tc.get("name")
            bad = tc.find("failure") is not None or tc.find("error") is not None
            skipped = tc.find("skipped") is not None
            if skipped and not bad:
                continue
            res[name] = res.get(name, True) and not bad
            if bad:
                fails.append(f"{name}: " + (tc.find("failure") if tc.find("failure") is not None
                                            else tc.find("error")).get("message", "")[:300])
        return res, fails


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="the build folder (build, build-san)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--san", type=int, choices=(0, 1), default=0)
    ap.add_argument("--log", help="append every failure's lines to this file")
    ap.add_argument("suites", nargs="+", metavar="SUITE")
    a = ap.parse_args(argv)
    if a.runs < 1 or a.hogs < 0:
        ap.error("--runs must be >= 1 and --hogs >= 0")
    for s in a.suites:
        kind, _, name = s.partition(":")
        if kind not in ("unit", "integration") or not name:
            ap.error(f"suite '{s}': expected unit:<binary> or integration:<file>[::<-k expr>]")
        if kind == "unit" and not os.access(os.path.join(a.build, "tests", name), os.X_OK):
            ap.error(f"suite '{s}': {os.path.join(a.build, 'tests', name)} is not built")
        if kind == "integration" and not os.path.exists(
                os.path.join(ROOT, "tests", "integration", name.partition("::")[0])):
            ap.error(f"suite '{s}': no such file under tests/integration")
    return a


def main(argv):
    a = parse_args(argv)
    build = os.path.abspath(a.build)
    counts = {}  # (suite, test) -> [failures, runs]
    log = open(a.log, "a") if a.log else None
    hogs = start_hogs(a.hogs)
    t0 = time.monotonic()
    try:
        for i in range(a.runs):
            for s in a.suites:
                kind, _, name = s.partition(":")
                res, fails = (run_unit if kind == "unit" else run_integration)(build, name, a.san)
                if not res:
                    res = {"<no result>": False}
                for test, ok in res.items():
                    c = counts.setdefault((s, test), [0, 0])
                    c[0] += 0 if ok else 1
                    c[1] += 1
                bad = [t for t, ok in res.items() if not ok]
                print(f"run {i + 1}/{a.runs} {s}: {len(res) - len(bad)} passed, "
                      f"{len(bad)} failed{': ' + ', '.join(bad) if bad else ''}", flush=True)
                if log and fails:
                    log.write(f"== run {i + 1} {s}\n" + "\n".join(fails) + "\n")
                    log.flush()
    finally:
        stop_hogs(hogs)
        if log:
            log.close()
    width = max(len(t) for _, t in counts)
    swidth = max(len(s.split("::")[0]) for s, _ in counts)
    print(f"\nflake-hunt: {a.runs} runs, {a.hogs} hogs, SAN={a.san}, "
          f"{time.monotonic() - t0:.0f} s")
    print(f"{'suite':<{swidth}} {'test':<{width}}  failed/runs")
    for (s, t), (f, n) in sorted(counts.items()):
        print(f"{s.split('::')[0]:<{swidth}} {t:<{width}}  {f}/{n}{'  <-' if f else ''}")
    total = sum(f for f, _ in counts.values())
    print(f"flake-hunt: {total} failures in {len(counts)} tests")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
