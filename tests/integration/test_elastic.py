"""The elastic c10d rendezvous: several real crun agents on 127.0.0.1 form one
job through --rdzv_backend=c10d. The agent whose endpoint address binds serves
the rendezvous store in-process. Covers: 2 nodes x 2, elastic 1:3 with a late
joiner (scale-up), kill -9 of an agent mid-job, a worker crash restarting the
job on every node, restarts exhausted (every agent exits non-zero naming the
root cause), the store-serving node exiting last, conflicting settings and a
real PyTorch gloo job under both PyTorch versions.

Every scenario runs over both elastic backends: c10d (the store served by an
agent) and etcd (one real etcd member for the module, etcd_cluster.py);
the few about the agent-served rendezvous store are c10d's alone.

Short timings through --rdzv_conf keep the module fast; no test asserts a
wall-clock bound."""
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import (HELPERS, Output, bin_path, free_port, records, release_workers,
                      start_rdzvd, torch_python, wait_records)
from etcd_cluster import EtcdCluster

TASK = os.path.join(HELPERS, "elastic_task.py")
JOB = os.path.join(HELPERS, "launch_worker.py")
PY = "/usr/bin/python3"
CONF = "--rdzv_conf=last_call_timeout=1,heartbeat_interval=0.3,lease_ttl=1.5,join_timeout=60"

_TMP = {}


@pytest.fixture(autouse=True, scope="module")
def _private_tmpdir():
    _TMP["dir"] = tempfile.mkdtemp(prefix="crun-elastic-")
    yield
    shutil.rmtree(_TMP.pop("dir"), ignore_errors=True)


@pytest.fixture
def out():
    d = tempfile.mkdtemp(dir=_TMP["dir"])
    yield d


def crun_env(py=PY, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k not in ("OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE")}
    env["PYTHON_EXEC"] = py
    env["TMPDIR"] = _TMP["dir"]
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture(scope="module")
def _etcd():
    c = EtcdCluster(1)
    yield c
    c.close()


@pytest.fixture(autouse=True, params=["c10d", "etcd"])
def backend(request):
    """The rendezvous backend of this run of the scenario."""
    _TMP["backend"] = request.param
    _TMP["etcd"] = request.getfixturevalue("_etcd") if request.param == "etcd" else None
    yield request.param


def c10d_only():
    if _TMP["backend"] != "c10d":
        pytest.skip("about the rendezvous store an agent serves (c10d only)")


def agent(procs, port, job, nnodes, args, nproc=2, extra=(), env=None):
    etcd = _TMP["backend"] == "etcd"
    ep = _TMP["etcd"].endpoints() if etcd else f"127.0.0.1:{port}"
    argv = [bin_path("crun"), f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
            f"--rdzv_backend={_TMP['backend']}", f"--rdzv_endpoint={ep}", f"--rdzv_id={job}",
            CONF, *extra, *args]
    return procs.spawn(argv, env=env or crun_env())


def finish(p, timeout=90, followed=None):
    """Waits for p's exit: (rc, stdout, stderr); followed: p's Output, when
    the test has been reading p's output."""
    if followed:
        return followed.finish(timeout)
    try:
        o, e = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail("crun agent did not finish in time")
    return p.returncode, o.decode(errors="replace"), e.decode(errors="replace")


def wait_line_in(p, buf, pattern, timeout=30):
    """Waits until `pattern` shows up in stderr (collected by a reader)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pattern in "".join(buf):
            return
        time.sleep(0.05)
    pytest.fail(f"'{pattern}' not seen: {''.join(buf)[-2000:]}")


def reader(p):
    buf = []

    def run():
        for line in iter(p.stderr.readline, b""):
            buf.append(line.decode(errors="replace"))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return buf, t


def first_agent(procs, port, job, nnodes, args, **kw):
    """An agent that has joined the job's first round before anyone else
    starts (with c10d it then serves the rendezvous store, its endpoint
    bound): (process, Output), for finish(followed=)."""
    p = agent(procs, port, job, nnodes, args, **kw)
    return p, Output(p).wait_for("joined rendezvous")


def ranks_of(recs):
    return sorted(int(r["RANK"]) for r in recs)


def test_two_nodes_of_two(procs, out, backend):
    port = free_port()
    ps = [agent(procs, port, "two", 2, [TASK, "run", out, "0.2"]) for _ in range(2)]
    res = [finish(p) for p in ps]
    for rc, _, err in res:
        assert rc == 0, err[-3000:]
    recs = records(out)
    assert ranks_of(recs) == [0, 1, 2, 3]
    assert {r["WORLD_SIZE"] for r in recs} == {"4"}
    assert {r["GROUP_WORLD_SIZE"] for r in recs} == {"2"}
    # Global ranks are the prefix sums of the group ranks.
    for r in recs:
        assert int(r["RANK"]) == 2 * int(r["GROUP_RANK"]) + int(r["LOCAL_RANK"])
    # One worker store for the job, served by group rank 0.
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in recs}) == 1
    assert any("serving the rendezvous store" in e for _, _, e in res) == (backend == "c10d")


def test_heterogeneous_nproc_prefix_sums(procs, out):
    port = free_port()
    ps = [agent(procs, port, "het", 2, [TASK, "run", out, "0.2"], nproc=n) for n in (1, 3)]
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
    recs = records(out)
    assert ranks_of(recs) == [0, 1, 2, 3]
    assert {r["WORLD_SIZE"] for r in recs} == {"4"}
    by_group = {}
    for r in recs:
        by_group.setdefault(r["GROUP_RANK"], []).append(int(r["RANK"]))
    assert sorted(len(v) for v in by_group.values()) == [1, 3]
    assert sorted(by_group["0"])[0] == 0
    assert sorted(by_group["1"])[0] == len(by_group["0"])


def test_store_node_exits_last(procs, out):
    c10d_only()
    port = free_port()
    host, host_out = first_agent(procs, port, "last", 2, [TASK, "run", out, "0.2"])
    other = agent(procs, port, "last", 2, [TASK, "run", out, "0.2"])
    done = {}

    def waiter(name, p):
        p.wait(timeout=90)
        done[name] = time.monotonic()
    ts = [threading.Thread(target=waiter, args=(n, p)) for n, p in (("host", host),
                                                                      ("other", other))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(100)
    rc_h, _, err_h = finish(host, followed=host_out)
    rc_o, _, err_o = finish(other)
    assert rc_h == 0 and rc_o == 0, err_h[-2000:] + err_o[-2000:]
    assert "serving the rendezvous store" in err_h
    assert done["host"] >= done["other"]


def test_worker_crash_restarts_every_node(procs, out):
    port = free_port()
    # Rank 3 (on the second node) crashes in attempt 0 only.
    ps = [agent(procs, port, "crash", 2, [TASK, "run", out, "1", "3", "1"],
                extra=["--max_restarts=2"]) for _ in range(2)]
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
    recs = records(out)
    first = [r for r in recs if r["TORCHELASTIC_RESTART_COUNT"] == "0"]
    second = [r for r in recs if r["TORCHELASTIC_RESTART_COUNT"] == "1"]
    assert ranks_of(first) == [0, 1, 2, 3]
    # Every node restarted its workers, with the count raised everywhere.
    assert ranks_of(second) == [0, 1, 2, 3]
    assert not [r for r in recs if int(r["TORCHELASTIC_RESTART_COUNT"]) > 1]


def test_restarts_exhausted_every_agent_fails_with_root_cause(procs, out):
    port = free_port()
    ps = [agent(procs, port, "exhaust", 2, [TASK, "run", out, "30", "3", "-1"],
                extra=["--max_restarts=1"]) for _ in range(2)]
    res = [finish(p) for p in ps]
    for rc, _, err in res:
        assert rc != 0, err[-3000:]
    # The failing node prints torchrun's summary; the others name the failing
    # node and rank too.
    errs = [e for _, _, e in res]
    assert sum("the job failed on another node" in e for e in errs) == 1, errs
    for e in errs:
        assert "rank 3" in e or "rank: 3" in e, e[-3000:]
    # Two attempts (restart 0 and 1) ran, none after the budget was spent.
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in records(out)} == {"0", "1"}


FAIL_ON_FILE = """import os, sys, time
out = sys.argv[1]
open(os.path.join(out, "failer.ready"), "w").close()
end = time.monotonic() + 120  # a hang guard: the test writes out/fail
while time.monotonic() < end and not os.path.exists(os.path.join(out, "fail")):
    time.sleep(0.05)
print("failer exits 3 on purpose", file=sys.stderr, flush=True)
sys.exit(3)
"""


def test_peer_gets_the_reason_after_the_failed_host_left(procs, out):
    # Issue 23: the surviving node printed "the job failed on another node: "
    # with an empty reason. The node serving the store (B) fails its job
    # while the other agent (A) is stopped, so that A reads the failure only
    # once B has left with its store: A's parked monitor wait was answered
    # with the reason (closed) before B left, and A must print that, not
    # what a second read from the gone store leaves (nothing). B's own
    # monitor must not acknowledge B's failure for A either: B waits for A
    # (close_timeout) and says that nobody read it.
    c10d_only()
    port = free_port()
    failer = os.path.join(out, "failer.py")
    with open(failer, "w") as f:
        f.write(FAIL_ON_FILE)
    # A long heartbeat: A's monitor sits in one wait, so SIGSTOP finds it
    # parked there; close_timeout=3 only bounds how long B waits for an ack.
    conf = ("--rdzv_conf=last_call_timeout=1,heartbeat_interval=30,lease_ttl=90,"
            "join_timeout=60,close_timeout=3")
    b, b_out = first_agent(procs, port, "reason", 2, [failer, out], nproc=1,
                           extra=[conf, "--max_restarts=0"])
    a = agent(procs, port, "reason", 2, [TASK, "run", out, "60"], nproc=1, extra=[conf])
    a_out = Output(a).wait_for("joined rendezvous")
    wait_records(out, lambda r: True, "A's worker")
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(out, "failer.ready")):
        assert time.monotonic() < deadline, "B's worker never started"
        time.sleep(0.05)
    os.kill(a.pid, signal.SIGSTOP)
    try:
        open(os.path.join(out, "fail"), "w").close()
        rc_b, _, err_b = finish(b, followed=b_out)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    rc_a, _, err_a = finish(a, followed=a_out)
    assert rc_b != 0 and rc_a != 0, err_b[-3000:] + err_a[-3000:]
    assert "failer exits 3 on purpose" in err_b, err_b[-3000:]
    lines = [ln for ln in err_a.splitlines() if "the job failed on another node:" in ln]
    assert lines, err_a[-3000:]
    for ln in lines:
        assert "exitcode 3" in ln, err_a[-3000:]
    assert "not every agent saw the failure" in err_b, err_b[-3000:]


def test_elastic_late_joiner_scales_up(procs, out):
    port = free_port()
    a = agent(procs, port, "grow", "1:3", [TASK, "run", out, "3"])
    wait_records(out, lambda r: r["WORLD_SIZE"] == "2", "WORLD_SIZE=2 (one node)")
    b = agent(procs, port, "grow", "1:3", [TASK, "run", out, "3"])
    wait_records(out, lambda r: len([x for x in records(out) if x["WORLD_SIZE"] == "4"]) >= 4,
                 "4 workers of the grown job")
    release_workers(out)
    for p in (a, b):
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
    recs = records(out)
    grown = [r for r in recs if r["WORLD_SIZE"] == "4"]
    assert ranks_of(grown) == [0, 1, 2, 3]
    # A scale-up round is not a restart.
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    # The first node kept group rank 0: the grown job's worker store is the
    # one the first node served alone.
    alone = {r["MASTER_PORT"] for r in recs if r["WORLD_SIZE"] == "2"}
    assert {r["MASTER_PORT"] for r in grown} == alone


def test_spare_waits_when_max_reached(procs, out):
    port = free_port()
    ps = [agent(procs, port, "spare", "1:2", [TASK, "run", out, "2"]) for _ in range(2)]
    wait_records(out, lambda r: r["WORLD_SIZE"] == "4", "WORLD_SIZE=4")
    spare = agent(procs, port, "spare", "1:2", [TASK, "run", out, "2"])
    buf, t = reader(spare)
    wait_line_in(spare, buf, "waiting as a spare")
    release_workers(out)
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
    spare.wait(timeout=60)
    t.join(10)
    assert spare.returncode == 0, "".join(buf)[-3000:]
    assert max(int(r["WORLD_SIZE"]) for r in records(out)) == 4


def test_kill_agent_mid_job_survivors_finish(procs, out):
    port = free_port()
    host, host_out = first_agent(procs, port, "kill", "2:3", [TASK, "run", out, "4"])
    others = [agent(procs, port, "kill", "2:3", [TASK, "run", out, "4"]) for _ in range(2)]
    full = wait_records(out, lambda r: r["WORLD_SIZE"] == "6", "WORLD_SIZE=6")
    assert full
    victim = others[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    wait_records(out, lambda r: len([x for x in records(out) if x["WORLD_SIZE"] == "4"]) >= 4,
                 "4 workers of the survivors' round")
    release_workers(out)
    for p, followed in ((host, host_out), (others[0], None)):
        rc, _, err = finish(p, followed=followed)
        assert rc == 0, err[-3000:]
        assert "re-rendezvous" in err or "dead" in err, err[-3000:]
    after = [r for r in records(out) if r["WORLD_SIZE"] == "4"]
    assert ranks_of(after) == [0, 1, 2, 3]
    # Node loss is not a restart.
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in after} == {"0"}


def test_conflicting_max_is_an_error(procs, out):
    port = free_port()
    # b comes once a has joined: the job's settings are a's.
    a, a_out = first_agent(procs, port, "conflict", "2:2", [TASK, "run", out, "1"])
    b = agent(procs, port, "conflict", "2:3", [TASK, "run", out, "1"])
    rc, _, err = finish(b, timeout=60)
    assert rc != 0
    assert "conflicting settings" in err, err[-2000:]
    a.send_signal(signal.SIGTERM)
    finish(a, followed=a_out)


def test_run_id_reuse_after_close_is_an_error(procs, out):
    # Against a store that outlives the job (crun-rdzvd), a second job with a
    # spent run id is told so instead of hanging (etcd: test_etcd.py).
    c10d_only()
    srv, _, rport = start_rdzvd(procs)
    a = agent(procs, rport, "reuse", "1:1", [TASK, "run", out, "0.1"])
    rc, _, err = finish(a)
    assert rc == 0, err[-2000:]
    assert "serving the rendezvous store" not in err
    b = agent(procs, rport, "reuse", "1:1", [TASK, "run", out, "0.1"])
    rc, _, err = finish(b)
    assert rc != 0
    assert "run id already used" in err, err[-2000:]
    srv.send_signal(signal.SIGTERM)
    srv.wait(timeout=10)


@pytest.mark.parametrize("version", ["1", "2"])
def test_gloo_job_two_nodes_of_two(procs, version):
    py = torch_python(version)
    port = free_port()
    ps = [agent(procs, port, f"gloo{version}", 2, [JOB], env=crun_env(py)) for _ in range(2)]
    res = [finish(p, timeout=150) for p in ps]
    oks = []
    for rc, o, err in res:
        assert rc == 0, err[-3000:]
        oks += [ln for ln in o.splitlines() if ln.startswith("launch_worker ok")]
    assert sorted(oks) == [f"launch_worker ok rank={r} world=4 restart=0" for r in range(4)]
