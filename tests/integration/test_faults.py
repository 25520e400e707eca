"""Fault injection on the elastic c10d rendezvous with real crun agents on
127.0.0.1 (issue 8): kill -9 and SIGSTOP of ticket 1 while its round is open,
a ticket holder that dies before writing its record, kill -9 and SIGSTOP of
the agent serving the rendezvous store, kill -9 of a worker, a node that
comes back two rounds late (the SIGSTOP repro), a worker failure after a
peer entered the exit barrier, an exit barrier that times out, and scale-up
after a counted restart with C SDK (dist_matmul) and PyTorch gloo workers.

Each case records the job's outcome, the time from the fault to its
detection (an agent's log line) and to recovery (the first worker of the
next round), and checks that no process of the case outlives it. The table
is printed at the end of the module; CRUN_FAULTS_TABLE=<file> also writes it
as Markdown. Times are measured, never asserted: the CPUs are shared.

A bounded random-fault soak (test_random_fault_soak) runs CRUN_SOAK_ROUNDS
rounds (default 6) of random kill/stop/join on CRUN_SOAK_AGENTS agents
(default 6) and checks the invariants after each one; its seed is printed and
can be replayed with CRUN_SOAK_SEED.
"""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from conftest import (HELPERS, BUILD, bin_path, free_port, records, release_workers,
                      start_rdzvd, torch_python)

sys.path.insert(0, HELPERS)
from storecli import StoreCli  # noqa: E402

TASK = os.path.join(HELPERS, "elastic_task.py")
PY = "/usr/bin/python3"
TTL = 1.5
CONF = (f"last_call_timeout=1,heartbeat_interval=0.3,lease_ttl={TTL},join_timeout=60,"
        "read_timeout=60")

RESULTS = []
AGENTS = []  # the current test's, for failure messages


def logs():
    return "\n".join(f"--- {a.name}:\n{a.text()[-1500:]}" for a in AGENTS)


@pytest.fixture(autouse=True, scope="module")
def _table():
    yield
    if not RESULTS:
        return
    lines = ["| case | outcome | detect (s) | recover (s) | orphans |",
             "|---|---|---|---|---|"]
    for case, outcome, det, rec, orph in RESULTS:
        f = (lambda x: "-" if x is None else f"{x:.2f}")
        lines.append(f"| {case} | {outcome} | {f(det)} | {f(rec)} | {orph} |")
    text = "\n".join(lines)
    print("\n" + text)
    dst = os.environ.get("CRUN_FAULTS_TABLE")
    if dst:
        with open(dst, "w") as fh:
            fh.write(text + "\n")


@pytest.fixture
def tmp():
    AGENTS.clear()
    d = tempfile.mkdtemp(prefix="crun-faults-")
    os.mkdir(os.path.join(d, "rec"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def crun_env(tmpdir, py=PY):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k not in ("OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE")}
    env["PYTHON_EXEC"] = py
    env["TMPDIR"] = tmpdir
    return env


class Agent:
    """One crun agent; its stderr is collected with arrival times."""

    def __init__(self, procs, tmpdir, port, job, nnodes, worker, nproc=2, conf=CONF,
                 extra=(), py=PY, name="", argv=None):
        if argv is None:
            argv = [bin_path("crun"), f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
                    "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                    f"--rdzv_id={job}", f"--rdzv_conf={conf}", *extra, *worker]
        self.name = name
        self.p = procs.spawn(argv, env=crun_env(tmpdir, py))
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()
        AGENTS.append(self)

    def _read(self):
        for line in iter(self.p.stderr.readline, b""):
            self.lines.append((time.time(), line.decode(errors="replace")))

    def text(self):
        return "".join(x for _, x in self.lines)

    def when(self, pattern, after=0.0):
        rx = re.compile(pattern)
        for t, line in list(self.lines):
            if t >= after and rx.search(line):
                return t
        return None

    def wait_for(self, pattern, timeout=60, after=0.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.when(pattern, after)
            if t is not None:
                return t
            if self.p.poll() is not None and self.when(pattern, after) is None:
                self.t.join(timeout=2)
                t = self.when(pattern, after)
                if t is not None:
                    return t
                pytest.fail(f"{self.name} exited {self.p.returncode} before '{pattern}':\n"
                            f"{self.text()[-3000:]}")
            time.sleep(0.02)
        pytest.fail(f"{self.name}: '{pattern}' not seen:\n{self.text()[-3000:]}")

    def finish(self, timeout=90):
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not finish:\n{self.text()[-3000:]}")
        self.t.join(timeout=5)
        return self.p.returncode

    def kill_tree(self, sig=signal.SIGKILL):
        """The whole node gets sig: the agent and every descendant (workers
        run in process groups of their own)."""
        pids = descendants(self.p.pid)
        if sig == signal.SIGCONT:
            pids.reverse()  # the agent last: its workers run again first
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def descendants(root):
    """root and every process below it (parents first), from /proc."""
    children = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().split(") ")[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    out, todo = [], [root]
    while todo and len(out) < 4096:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def task(tmpdir, secs, crash_rank=-2, until=0):
    return [TASK, "run", os.path.join(tmpdir, "rec"), str(secs), str(crash_rank), str(until)]


def recs(tmpdir):
    return records(os.path.join(tmpdir, "rec"))


def release(tmpdir):
    """The last round's workers have all written their records: they may end
    now instead of sleeping out their SECS (the outcome checks follow)."""
    release_workers(os.path.join(tmpdir, "rec"))


def rec_times(tmpdir, pred):
    d = os.path.join(tmpdir, "rec")
    out = []
    for r in recs(tmpdir):
        if pred(r):
            try:
                out.append(os.path.getmtime(os.path.join(d, f"{r['pid']}.json")))
            except OSError:
                pass
    return sorted(out)


def wait_recs(tmpdir, pred, n, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = [r for r in recs(tmpdir) if pred(r)]
        if len(got) >= n:
            return got
        time.sleep(0.05)
    pytest.fail(f"fewer than {n} worker records with {what}: {recs(tmpdir)}\n{logs()}")


def orphans(tag):
    """Processes whose command line mentions this case's private directory."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if tag in cmd and int(pid) != os.getpid():
            found.append((int(pid), cmd[:200]))
    return found


def no_orphans(tmpdir, timeout=15):
    deadline = time.monotonic() + timeout
    left = orphans(tmpdir)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = orphans(tmpdir)
    return left


def report(case, outcome, t0, detect, recover, tmpdir):
    left = no_orphans(tmpdir)
    RESULTS.append((case, outcome, None if detect is None else detect - t0,
                    None if recover is None else recover - t0, len(left)))
    assert not left, f"{case}: processes outlived the job: {left}"


def ranks_unique(rs):
    ranks = sorted(int(r["RANK"]) for r in rs)
    return ranks == list(range(len(ranks)))


def store_cli(procs, port, job):
    return StoreCli(procs, os.path.join(BUILD, "tests", "helpers", "store_cli"), "127.0.0.1",
                    port, 2, prefix=f"crun-c10d/{job}")


# ---- ticket 1 -------------------------------------------------------------------------

@pytest.mark.parametrize("sig", ["KILL", "STOP"])
def test_ticket_1_dies_while_its_round_is_open(procs, tmp, sig):
    """Issue 8, item 1: before, ticket 1 alone closed the round, so its death
    left the others waiting for join_timeout. Now they start over at once
    (kill -9: the lease ends with the connection; SIGSTOP: after the TTL)."""
    _, _, port = start_rdzvd(procs)
    conf = CONF.replace("last_call_timeout=1", "last_call_timeout=3")
    a = Agent(procs, tmp, port, "t1", "2:4", task(tmp, 3), conf=conf, name="A")
    a.wait_for(r"as ticket 1\b")
    b = Agent(procs, tmp, port, "t1", "2:4", task(tmp, 3), conf=conf, name="B")
    b.wait_for(r"as ticket 2\b")
    t0 = time.time()
    a.kill_tree(getattr(signal, "SIG" + sig))
    c = Agent(procs, tmp, port, "t1", "2:4", task(tmp, 3), conf=conf, name="C")
    detect = b.wait_for(r"round 0 (ended before it closed|was abandoned)", after=t0)
    wait_recs(tmp, lambda r: r["GROUP_WORLD_SIZE"] == "2", 4, "2 nodes")
    recover = rec_times(tmp, lambda r: r["GROUP_WORLD_SIZE"] == "2")[0]
    if sig == "STOP":
        # Ticket 1 comes back: it joins late and the job grows to 3 nodes.
        a.kill_tree(signal.SIGCONT)
        wait_recs(tmp, lambda r: r["GROUP_WORLD_SIZE"] == "3", 6, "3 nodes", timeout=90)
        agents = (a, b, c)
    else:
        agents = (b, c)
    release(tmp)
    for x in agents:
        assert x.finish() == 0, x.text()[-3000:]
    # Dropping a dead ticket is no worker failure: nothing was counted.
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs(tmp)} == {"0"}
    report(f"{sig.lower()} ticket 1, round open", f"{len(agents)} agents exit 0", t0, detect,
           recover, tmp)


def test_ticket_holder_dead_before_its_record(procs, tmp):
    """A ticket drawn and never followed by a record (the holder died right
    after ADD): before, multi_get of every record failed the round."""
    _, _, port = start_rdzvd(procs)
    cli = store_cli(procs, port, "norec")
    cli.send("add r0/joined 1")
    cli.read_line(10)
    t0 = time.time()
    ags = [Agent(procs, tmp, port, "norec", "2:3", task(tmp, 1), name=n) for n in "BC"]
    wait_recs(tmp, lambda r: True, 4, "any")
    recover = rec_times(tmp, lambda r: True)[0]
    for x in ags:
        assert x.finish() == 0, x.text()[-3000:]
    rs = recs(tmp)
    assert {r["GROUP_WORLD_SIZE"] for r in rs} == {"2"}
    assert ranks_unique(rs)
    report("ticket holder dead before its record", "2 agents exit 0", t0, None, recover, tmp)


# ---- the store host --------------------------------------------------------------------

@pytest.mark.parametrize("sig", ["KILL", "STOP"])
def test_store_host_lost_is_said_within_the_ttl(procs, tmp, sig):
    """Issue 8, item 4: the agent serving the rendezvous store dies (or
    stops). The others say so naming it, and exit 1, without waiting for
    read_timeout (60 s here) and without blaming 'another node'."""
    port = free_port()
    host = Agent(procs, tmp, port, "sh", "3", task(tmp, 30), name="host")
    host.wait_for("serving the rendezvous store")
    others = [Agent(procs, tmp, port, "sh", "3", task(tmp, 30), name=n) for n in "BC"]
    wait_recs(tmp, lambda r: True, 6, "the first round")
    t0 = time.time()
    host.kill_tree(getattr(signal, "SIG" + sig))
    detect = min(o.wait_for("lost the rendezvous store", timeout=40, after=t0) for o in others)
    for o in others:
        assert o.finish(timeout=40) == 1, o.text()[-3000:]
        done = time.time() if o is others[0] else max(done, time.time())
        err = o.text()
        assert "served by the agent on host" in err, err[-3000:]
        assert "failed on another node" not in err, err[-3000:]
    done = time.time()
    if sig == "STOP":
        host.kill_tree(signal.SIGKILL)
    host.finish(timeout=20)
    report(f"{sig.lower()} store host", "others exit 1 naming it", t0, detect, done, tmp)


# ---- workers ---------------------------------------------------------------------------

def test_worker_killed_restarts_every_node_with_one_attempt(procs, tmp):
    port = free_port()
    ags = [Agent(procs, tmp, port, "wk", "2", task(tmp, 4), extra=["--max_restarts=2"],
                 name=n) for n in "AB"]
    first = wait_recs(tmp, lambda r: True, 4, "the first round")
    victim = next(r for r in first if r["RANK"] == "3")
    t0 = time.time()
    os.kill(victim["pid"], signal.SIGKILL)
    detect = min(a.wait_for("restarting workers", after=t0) for a in ags)
    wait_recs(tmp, lambda r: r["TORCHELASTIC_RESTART_COUNT"] == "1", 4, "attempt 1")
    recover = rec_times(tmp, lambda r: r["TORCHELASTIC_RESTART_COUNT"] == "1")[0]
    release(tmp)
    for a in ags:
        assert a.finish() == 0, a.text()[-3000:]
    assert ranks_unique([r for r in recs(tmp) if r["TORCHELASTIC_RESTART_COUNT"] == "1"])
    report("kill -9 worker", "restart (attempt 1), exit 0", t0, detect, recover, tmp)


# ---- a node back two rounds late ---------------------------------------------------------

def test_node_stopped_past_its_lease_rejoins_two_rounds_late(procs, tmp):
    """Issue 8, item 2 (the repro): three agents --nnodes=2:3, the second one
    stopped past its lease and continued. Before, it came back with its
    round-0 group rank, which a survivor held in round 1: every agent exited
    1 within a second."""
    port = free_port()
    # A serves the store (it joined before the others started); B and C
    # join it: the first round of three (round 0, or round 1 when a last
    # call closed round 0 before C came) gives group ranks 0, 1, 2.
    ags = [Agent(procs, tmp, port, "late", "2:3", task(tmp, 60), extra=["--max_restarts=3"],
                 name="A")]
    ags[0].wait_for("joined rendezvous")
    ags += [Agent(procs, tmp, port, "late", "2:3", task(tmp, 60), extra=["--max_restarts=3"],
                  name=n) for n in "BC"]
    wait_recs(tmp, lambda r: r["GROUP_WORLD_SIZE"] == "3", 6, "3 nodes")
    # The victim holds group rank 1: a survivor takes rank 1 in the next
    # round, the rank the victim still carries when it comes back.
    victim = next(a for a in ags if a.when(r"round \d+ complete: 3 nodes, group_rank=1 "))
    assert victim.when("serving the rendezvous store") is None, logs()
    t0 = time.time()
    victim.kill_tree(signal.SIGSTOP)
    detect = min(a.wait_for(r"round \d+ is over: dead", after=t0) for a in ags
                 if a is not victim)
    # Stopped past its lease (the survivors saw it dead) and two rounds
    # behind once the survivors' round runs.
    wait_recs(tmp, lambda r: r["GROUP_WORLD_SIZE"] == "2" and
              os.path.getmtime(os.path.join(tmp, "rec", f"{r['pid']}.json")) > t0, 4,
              "the survivors' round of 2 nodes")
    victim.kill_tree(signal.SIGCONT)
    t1 = time.time()
    wait_recs(tmp, lambda r: r["GROUP_WORLD_SIZE"] == "3" and
              os.path.getmtime(os.path.join(tmp, "rec", f"{r['pid']}.json")) > t1, 6,
              "3 nodes again", timeout=90)
    recover = rec_times(tmp, lambda r: r["GROUP_WORLD_SIZE"] == "3")[-1]
    release(tmp)
    for a in ags:
        assert a.finish() == 0, a.text()[-3000:]
    again = [r for r in recs(tmp) if r["GROUP_WORLD_SIZE"] == "3" and
             os.path.getmtime(os.path.join(tmp, "rec", f"{r['pid']}.json")) > t1]
    assert sorted({int(r["RANK"]) for r in again}) == list(range(6)), again
    report("SIGSTOP node past TTL, back 2 rounds late", "3 agents exit 0", t0, detect,
           recover, tmp)


# ---- exit barrier ----------------------------------------------------------------------------

FAIL_LATE_ONCE = """
import json, os, sys, time
out = sys.argv[1]
rec = {k: os.environ.get(k) for k in ("RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "WORLD_SIZE",
                                      "TORCHELASTIC_RESTART_COUNT")}
rec["pid"] = os.getpid()
with open(os.path.join(out, "%d.tmp" % os.getpid()), "w") as f:
    json.dump(rec, f)
os.rename(os.path.join(out, "%d.tmp" % os.getpid()), os.path.join(out, "%d.json" % os.getpid()))
if os.environ["GROUP_RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    # Fail once group rank 0's worker is reaped (its /proc entry, kept
    # while it is a zombie, is gone): its agent is in the exit barrier.
    end = time.monotonic() + 60  # a hang guard
    peer = None
    while time.monotonic() < end:
        if peer is None:
            for n in os.listdir(out):
                if n.endswith(".json"):
                    with open(os.path.join(out, n)) as f:
                        r = json.load(f)
                    if r["GROUP_RANK"] == "0" and r["TORCHELASTIC_RESTART_COUNT"] == "0":
                        peer = r["pid"]
        elif not os.path.exists("/proc/%d" % peer):
            break
        time.sleep(0.02)
    print("worker failing late in attempt 0", file=sys.stderr, flush=True)
    sys.exit(1)
time.sleep(0.1)
"""


def test_failure_after_peer_entered_barrier_wakes_it(procs, tmp):
    """Issue 8, item 9: group rank 0's worker finishes and its agent enters
    the exit barrier; then the worker of group rank 1 fails (restarts left).
    Rank 0 wakes at once and both restart together (attempt 1 on both),
    instead of waiting for the barrier timeout."""
    port = free_port()
    script = os.path.join(tmp, "late.py")
    with open(script, "w") as fh:
        fh.write(FAIL_LATE_ONCE)
    w = [script, os.path.join(tmp, "rec")]
    ags = [Agent(procs, tmp, port, "bar", "2", w, nproc=1, extra=["--max_restarts=1"],
                 name=n) for n in "AB"]
    t0 = None
    deadline = time.monotonic() + 60
    while t0 is None and time.monotonic() < deadline:
        for a in ags:
            t0 = t0 or a.when("worker failing late")
        time.sleep(0.02)
    assert t0 is not None, [a.text()[-2000:] for a in ags]
    done = next(a for a in ags if a.when("worker failing late") is None)
    detect = done.wait_for("restarting workers|round 0 is over", after=t0 - 1)
    wait_recs(tmp, lambda r: r["TORCHELASTIC_RESTART_COUNT"] == "1", 2, "attempt 1")
    recover = rec_times(tmp, lambda r: r["TORCHELASTIC_RESTART_COUNT"] == "1")[0]
    for a in ags:
        assert a.finish() == 0, a.text()[-3000:]
    # The round-0 barrier the restart left behind must not hold the host
    # (waiting for round 0's departures) once round 1 has ended the job.
    for a in ags:
        assert "not every agent left" not in a.text(), a.text()[-3000:]
    report("worker failure after peer entered exit barrier", "both restart, exit 0", t0,
           detect, recover, tmp)


def test_barrier_timeout_is_not_success(procs, tmp):
    """Issue 8, item 9: A is done, B's worker hangs past the barrier timeout
    (join_timeout). Before: A exited 0 with 'exit barrier: timed out -'."""
    port = free_port()
    conf = CONF.replace("join_timeout=60", "join_timeout=3")
    a = Agent(procs, tmp, port, "hang", "2", task(tmp, 0.1), nproc=1, conf=conf, name="A")
    # A must be the one serving the store (the first to bind the endpoint;
    # under SAN, B started at once could win it).
    a.wait_for(r" W serving the rendezvous store on ", timeout=60)
    b = Agent(procs, tmp, port, "hang", "2", task(tmp, 30), nproc=1, conf=conf, name="B")
    wait_recs(tmp, lambda r: True, 2, "both workers")
    t0 = time.time()
    rc = a.finish(timeout=60)
    err = a.text()
    assert rc == 1, err[-3000:]
    assert "exit barrier: timed out" in err, err[-3000:]
    assert "timed out -" not in err, err[-3000:]
    # A serves the store and leaves: it tells B that the barrier failed, so
    # B stops its hung worker and fails with that reason (before, B was never
    # told and A lingered 10 s for B to hang up).
    try:
        assert "serving the rendezvous store" in err, err[-3000:]
        assert b.finish(timeout=60) == 1, b.text()[-3000:]
    except BaseException:
        b.kill_tree()  # its worker sleeps 30 s in a process group of its own
        raise
    assert "failed on another node: failed: exit barrier: timed out" in b.text(), \
        b.text()[-3000:]
    report("exit barrier timed out (peer hung)", "exit 1", t0, None, None, tmp)


# ---- scale-up after a counted restart ------------------------------------------------------

def _scale_up(procs, tmp, worker, py, nproc, case):
    """Two nodes, one counted restart, then a third node joins: every node
    must run the same attempt (TORCHELASTIC_RESTART_COUNT, store prefixes)
    or the workers of the grown job cannot find each other."""
    port = free_port()
    marker = os.path.join(tmp, "failed-once")
    env_worker = worker(marker)
    ags = [Agent(procs, tmp, port, "grow", "2:3", env_worker, nproc=nproc, py=py,
                 extra=["--max_restarts=3"], name=n) for n in "AB"]
    t0 = min(a.wait_for("restarting workers", timeout=120) for a in ags)
    # The 2-node job runs attempt 1 (its workers wait for a third node)...
    for a in ags:
        a.wait_for(r"complete: 2 nodes.*attempt=1", timeout=120)
    # ...when the third node joins: a new round, the attempt stays 1. The
    # clock starts before C does: its join, and the others seeing it, can
    # take less time than this thread needs to get the CPU back.
    t0 = time.time()
    c = Agent(procs, tmp, port, "grow", "2:3", env_worker, nproc=nproc, py=py,
              extra=["--max_restarts=3"], name="C")
    detect = min(a.wait_for(r"round \d+ is over: join", timeout=60, after=t0) for a in ags)
    recover = c.wait_for(r"round \d+ complete: 3 nodes", timeout=120)
    for a in (*ags, c):
        assert a.finish(timeout=180) == 0, a.text()[-4000:]
    att = {re.findall(r"attempt=(\d+)", a.text())[-1] for a in (*ags, c)}
    assert att == {"1"}, att
    report(case, "3 agents exit 0, attempt 1 everywhere", t0, detect, recover, tmp)


DIST_MATMUL_ONCE = """
import os, subprocess, sys, time
marker = sys.argv[1]
if os.environ["RANK"] == "0" and not os.path.exists(marker):
    open(marker, "w").close()
    sys.exit(3)
if os.environ["GROUP_WORLD_SIZE"] != "3":
    time.sleep(60)  # until the third node joins (the agents stop us)
sys.exit(subprocess.call([sys.argv[2], "60"]))
"""

GLOO_ONCE = """
import os, sys, time
marker = sys.argv[1]
if os.environ["RANK"] == "0" and not os.path.exists(marker):
    open(marker, "w").close()
    sys.exit(3)
if os.environ["GROUP_WORLD_SIZE"] != "3":
    time.sleep(60)  # until the third node joins (the agents stop us)
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
n = dist.get_world_size()
assert int(t[0]) == n * (n + 1) // 2, t
dist.barrier()
dist.destroy_process_group()
"""


def test_scale_up_after_counted_restart_dist_matmul(procs, tmp):
    prog = os.path.join(BUILD, "examples", "dist_matmul")
    script = os.path.join(tmp, "once.py")
    with open(script, "w") as fh:
        fh.write(DIST_MATMUL_ONCE)
    _scale_up(procs, tmp, lambda m: [script, m, prog], PY, 1,
              "scale-up after counted restart (dist_matmul)")


def test_scale_up_after_counted_restart_gloo(procs, tmp):
    py = torch_python("2")
    script = os.path.join(tmp, "once.py")
    with open(script, "w") as fh:
        fh.write(GLOO_ONCE)
    _scale_up(procs, tmp, lambda m: [script, m], py, 1,
              "scale-up after counted restart (PyTorch 2 gloo)")


# ---- random faults -------------------------------------------------------------------------

SOAK_WORKER = """
import json, os, sys, time
out = sys.argv[1]
rec = {k: os.environ.get(k) for k in ("RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "WORLD_SIZE",
                                      "TORCHELASTIC_RESTART_COUNT")}
rec["pid"] = os.getpid()
with open(os.path.join(out, "%d.tmp" % os.getpid()), "w") as f:
    json.dump(rec, f)
os.rename(os.path.join(out, "%d.tmp" % os.getpid()), os.path.join(out, "%d.json" % os.getpid()))
end = time.monotonic() + 900
while time.monotonic() < end:
    time.sleep(0.2)
"""


def test_random_fault_soak(procs, tmp):
    """Rounds of random faults (kill -9 or SIGSTOP of a non-store agent, a
    node joining) on N agents; after each, the job settles and every node of
    the newest round must agree on round, attempt and world size, ranks must
    be 0..W-1 and unique, and no worker of an older round may be alive."""
    seed = int(os.environ.get("CRUN_SOAK_SEED", random.randrange(1 << 30)))
    rounds = int(os.environ.get("CRUN_SOAK_ROUNDS", "6"))
    n = int(os.environ.get("CRUN_SOAK_AGENTS", "6"))
    rng = random.Random(seed)
    print(f"soak seed {seed} ({rounds} rounds, {n} agents): CRUN_SOAK_SEED={seed}")
    port = free_port()
    job = f"soak{seed}"
    script = os.path.join(tmp, "soak.py")
    with open(script, "w") as fh:
        fh.write(SOAK_WORKER)
    mk = (lambda name: Agent(procs, tmp, port, job, f"2:{n}",
                             [script, os.path.join(tmp, "rec")], nproc=1, name=name))
    host = mk("host")
    host.wait_for("serving the rendezvous store")
    live = [host] + [mk(f"a{i}") for i in range(1, n)]
    stopped = []
    t_start = time.time()
    try:
        for rnd in range(rounds):
            settle(tmp, live, seed, rnd)
            kind = rng.choice(["kill", "stop", "join"] if len(live) > 2 else ["join"])
            if kind == "join" and len(live) >= n:
                kind = rng.choice(["kill", "stop"])
            if kind == "join":
                if stopped:
                    s = stopped.pop()
                    s.kill_tree(signal.SIGCONT)
                    if s.p.poll() is None:
                        live.append(s)
                else:
                    live.append(mk(f"j{rnd}"))
            else:
                victim = rng.choice(live[1:])
                live.remove(victim)
                if kind == "kill":
                    victim.kill_tree()
                else:
                    victim.kill_tree(signal.SIGSTOP)
                    stopped.append(victim)
            live = [a for a in live if a.p.poll() is None]
        settle(tmp, live, seed, rounds)
    except BaseException:
        print(f"soak FAILED with seed {seed}: rerun with CRUN_SOAK_SEED={seed}")
        raise
    for s in stopped:
        s.kill_tree()
    for a in live:
        a.kill_tree(signal.SIGTERM)
    for a in live + stopped:
        a.finish(timeout=60)
    RESULTS.append((f"random soak seed {seed}: {rounds} rounds, {n} agents",
                    "invariants held", None, time.time() - t_start, len(no_orphans(tmp))))


def settle(tmp, live, seed, rnd, timeout=90):
    """Waits until every live agent runs the same, newest round, then checks
    the invariants on its worker records."""
    deadline = time.monotonic() + timeout
    want = len(live)
    last = None
    while time.monotonic() < deadline:
        rounds = []
        for a in live:
            m = re.findall(r"round (\d+) complete: (\d+) nodes?, group_rank=(\d+) "
                           r"world_size=(\d+) attempt=(\d+)", a.text())
            rounds.append(m[-1] if m else None)
        if all(rounds) and len({r[0] for r in rounds}) == 1 and int(rounds[0][1]) == want:
            rd, nodes, _, ws, att = rounds[0]
            rs = [r for r in recs(tmp) if r["GROUP_WORLD_SIZE"] == nodes and
                  alive(r["pid"])]
            if len(rs) == int(ws):
                last = (rd, rs)
                break
        time.sleep(0.1)
    if last is None:
        pytest.fail(f"soak seed {seed} round {rnd}: the job did not settle on {want} nodes:\n" +
                    "\n".join(f"{a.name}: {a.text()[-800:]}" for a in live))
    rd, rs = last
    assert sorted(int(r["RANK"]) for r in rs) == list(range(len(rs))), (seed, rnd, rs)
    assert len({r["TORCHELASTIC_RESTART_COUNT"] for r in rs}) == 1, (seed, rnd, rs)
    assert len({r["WORLD_SIZE"] for r in rs}) == 1, (seed, rnd, rs)
    gr = sorted({int(r["GROUP_RANK"]) for r in rs})
    assert gr == list(range(len(live))), (seed, rnd, rs)
    # No worker of an older round is alive.
    old = [r for r in recs(tmp) if alive(r["pid"]) and r not in rs]
    deadline = time.monotonic() + 20
    while old and time.monotonic() < deadline:
        time.sleep(0.1)
        old = [r for r in old if alive(r["pid"])]
    if old:
        print(f"soak seed {seed} round {rnd}: workers of older rounds alive: {old}\n"
              f"{[proc_info(r['pid']) for r in old]}\n{logs()}")
    assert not old, (seed, rnd, old)


def proc_info(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            st = fh.read().split(") ")[-1].split()
        with open(f"/proc/{st[1]}/cmdline", "rb") as fh:
            parent = fh.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        return {"state": st[0], "ppid": st[1], "pgrp": st[2], "parent": parent}
    except OSError as e:
        return str(e)


def alive(pid):
    """Running: not gone, not a zombie, and not frozen with its stopped node
    (SIGSTOP of a node stops its workers too; its agent stops them when it
    continues)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][0] not in "ZXTt"
    except OSError:
        return False


# ---- static multi-node restarts -------------------------------------------------------------

def test_static_multi_node_restart_is_coordinated(procs, tmp):
    """Issue 8, item 8: a worker failure on node 1 of a static 2-node job
    restarts the workers of BOTH nodes into attempt 1 (node 0 clears its
    store only once every node stopped). Before: node 1 restarted alone while
    node 0's attempt-0 workers went on."""
    port = free_port()
    ags = [Agent(procs, tmp, port, None, None, None, name=f"node{rank}", argv=[
        bin_path("crun"), "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={port}", "--max_restarts=1",
        *task(tmp, 4, 2, 1)]) for rank in (0, 1)]  # global rank 2 fails in attempt 0
    t0 = ags[1].wait_for("restarting workers", timeout=60)
    detect = ags[0].wait_for("restarting workers", timeout=60)
    wait_recs(tmp, lambda r: r["TORCHELASTIC_RESTART_COUNT"] == "1", 4, "attempt 1 on both")
    recover = rec_times(tmp, lambda r: r["TORCHELASTIC_RESTART_COUNT"] == "1")[-1]
    release(tmp)
    for a in ags:
        assert a.finish() == 0, a.text()[-3000:]
    again = [r for r in recs(tmp) if r["TORCHELASTIC_RESTART_COUNT"] == "1"]
    assert sorted(int(r["RANK"]) for r in again) == [0, 1, 2, 3], again
    report("static 2 nodes: worker failure on node 1", "both nodes restart, exit 0", t0,
           detect, recover, tmp)


# ---- link cuts between network namespaces ----------------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                    reason="network namespaces need root and iproute2")
@pytest.mark.parametrize("who", ["node", "store host"])
def test_link_cut_netns(procs, tmp, who):
    """A node's link goes down (no FIN, no RST: only timeouts can tell).
    A cut-off node: the others evict it after its lease TTL and go on as a
    2-node job; it says it lost the rendezvous store and exits 1. A cut-off
    store host: the others say so within about a TTL, naming it, and exit 1
    (with c10d the job cannot outlive its store host)."""
    from test_elastic_netns import Net
    net = Net(3, 8)
    try:
        ags = []
        for i in range(3):
            argv = ["ip", "netns", "exec", net.ns[i], bin_path("crun"), "--nnodes=2:3",
                    "--nproc_per_node=2", "--rdzv_backend=c10d",
                    f"--rdzv_endpoint={net.addr[0]}:29400", "--rdzv_id=cut",
                    f"--rdzv_conf={CONF}", *task(tmp, 30)]
            ags.append(Agent(procs, tmp, None, None, None, None, name=f"n{i}", argv=argv))
            if i == 0:
                ags[0].wait_for("serving the rendezvous store")
        wait_recs(tmp, lambda r: r["GROUP_WORLD_SIZE"] == "3", 6, "3 nodes")
        cut = 0 if who == "store host" else 2
        others = [a for i, a in enumerate(ags) if i != cut]
        t0 = time.time()
        net.link(cut, False)
        if who == "node":
            detect = min(a.wait_for(r"round \d+ is over: dead", after=t0) for a in others)
            wait_recs(tmp, lambda r: r["GROUP_WORLD_SIZE"] == "2", 4, "2 nodes")
            recover = rec_times(tmp, lambda r: r["GROUP_WORLD_SIZE"] == "2")[0]
            assert ags[cut].finish(timeout=60) == 1, ags[cut].text()[-3000:]
            assert "lost the rendezvous store" in ags[cut].text()
            for a in others:
                a.kill_tree(signal.SIGTERM)
                a.finish(timeout=60)
            outcome = "survivors go on as 2 nodes; cut node exits 1"
        else:
            detect = min(a.wait_for("lost the rendezvous store", timeout=60, after=t0)
                         for a in others)
            for a in others:
                assert a.finish(timeout=60) == 1, a.text()[-3000:]
                assert "served by the agent on host" in a.text(), a.text()[-3000:]
            recover = time.time()
            # The cut-off host cannot tell a cut from its peers' deaths, but
            # says what the cut means instead of waiting in silence.
            ags[cut].wait_for("serves the rendezvous store and is alone", timeout=60, after=t0)
            ags[cut].kill_tree()
            ags[cut].finish(timeout=30)
            outcome = "others exit 1 naming it; the host says it is alone"
        report(f"link cut of the {who} (netns)", outcome, t0, detect, recover, tmp)
    finally:
        for a in AGENTS:
            if a.p.poll() is None:
                a.kill_tree()
        net.close()
