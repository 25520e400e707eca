"""Hang forensics (issue 25): each surviving worker's stack before crun stops
it (py-spy, gdb or /proc), a digest in the failure summary, stacks on
demand (GET /stacks, crunctl stacks) and --hang_timeout naming the rank
whose stack differs from the others' in a real PyTorch gloo job."""
import glob
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request

import pytest

from conftest import (HELPERS, TORCH2_VENV, Output, bin_path, free_port, torch_python,
                      wait_line, wait_until)
from etcd_cluster import EtcdCluster

PY = "/usr/bin/python3"
STACK_WORKER = os.path.join(HELPERS, "stack_worker.py")
HANG_WORKER = os.path.join(HELPERS, "hang_worker.py")
PYSPY_DIR = os.path.join(TORCH2_VENV, "bin")


def tool_path(tool, tmp_path):
    """PATH for the agent: py-spy first (the venv's), gdb only (Debian's),
    or neither (an empty directory: the /proc fallback)."""
    if tool == "py-spy":
        assert os.access(os.path.join(PYSPY_DIR, "py-spy"), os.X_OK), \
            "py-spy is missing: run `sh scripts/deps.sh test`"
        return f"{PYSPY_DIR}:/usr/bin:/bin"
    if tool == "gdb":
        assert os.access("/usr/bin/gdb", os.X_OK), "gdb is missing: run `sh scripts/deps.sh test`"
        assert not os.path.exists("/usr/bin/py-spy")
        return "/usr/bin:/bin"
    empty = tmp_path / "nothing"
    empty.mkdir(exist_ok=True)
    return str(empty)


def job_env(tmp_path, tool="py-spy", **extra):
    ready = tmp_path / "ready"
    ready.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "LD_PRELOAD"))}
    env.update(PATH=tool_path(tool, tmp_path), READY_DIR=str(ready),
               CRUN_LOG_LEVEL="info")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def crun(procs, tmp_path, env, *flags, nproc=3, worker=STACK_WORKER, python=PY):
    return procs.spawn([bin_path("crun"), "--standalone", f"--nproc_per_node={nproc}",
                        f"--log_dir={tmp_path / 'logs'}", *flags, python, worker], env=env)


def finish(p, timeout=120):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"crun did not finish within {timeout}s (a hang guard)")
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def stack_file(tmp_path, attempt, local_rank):
    hits = glob.glob(str(tmp_path / "logs" / "*" / f"attempt_{attempt}" / str(local_rank)
                         / "stack.txt"))
    return hits[0] if hits else None


def read(path):
    with open(path) as f:
        return f.read()


def markers(tmp_path, attempt, ranks):
    return all((tmp_path / "ready" / f"{attempt}.{r}").exists() for r in ranks)


# ---- stacks before a kill --------------------------------------------------------------

STUCK = r"stuck_waiting_for_the_batch \(stack_worker\.py:\d+\)"
EXPECT = {  # tool: (digest frame, text in stack.txt)
    "py-spy": (STUCK, "stuck_waiting_for_the_batch"),
    "gdb": (r"\S+ \(\S+:\d+\)", "#0 "),
    "proc": (r"\S+ \(kernel\)", "wchan: "),
}


@pytest.mark.parametrize("tool", sorted(EXPECT))
def test_survivors_stacks_are_taken_before_the_kill(procs, tmp_path, tool):
    """Rank 1 fails once ranks 0 and 2 are stuck: their stacks are in
    attempt_0/{0,2}/stack.txt and the summary says where they were."""
    frame, text = EXPECT[tool]
    # The tool's frames, not its speed: a deadline no load reaches (gdb
    # missed the default 800 ms beside a second full test run).
    p = crun(procs, tmp_path, job_env(tmp_path, tool, FAIL_RANK=1, CRUN_STACKS_DEADLINE_MS=30000))
    rc, out, err = finish(p)
    assert rc == 1, (out, err)
    digest = re.search(rf"crun: stacks: rank 0 was in ({frame}), rank 2 was in ({frame}) "
                       r"when rank 1 failed \(in (\S+)/attempt_0/RANK/stack\.txt\)", err)
    assert digest, err
    assert f"({tool if tool != 'proc' else '/proc only'})" in err, err
    for r in (0, 2):
        assert text in read(stack_file(tmp_path, 0, r))
    assert stack_file(tmp_path, 0, 1) is None  # the failed rank is gone: nothing to take
    # The summary's root cause is still rank 1; the digest comes after it.
    assert err.index("Root Cause") < err.index("crun: stacks:"), err


def test_each_restart_keeps_its_attempts_stacks(procs, tmp_path):
    """--max_restarts=1: rank 1 fails in both attempts; each attempt's
    survivors' stacks are kept under that attempt."""
    p = crun(procs, tmp_path, job_env(tmp_path, FAIL_RANK=1), "--max_restarts=1")
    rc, out, err = finish(p)
    assert rc == 1, (out, err)
    for attempt in (0, 1):
        for r in (0, 2):
            assert "stuck_waiting_for_the_batch" in read(stack_file(tmp_path, attempt, r))
    for attempt in (0, 1):  # the log line of each stop
        assert re.search(rf"rank 0 was in {STUCK}, rank 2 was in {STUCK} when rank 1 failed "
                         rf"\(stacks: \S+/attempt_{attempt}/\*/stack\.txt\)", err), err


@pytest.mark.parametrize("when,taken", [("always", True), ("failure", False),
                                        ("never", False)])
def test_stack_dump_on_stop_for_an_operator_signal(procs, tmp_path, when, taken):
    """SIGTERM to crun: the stacks are taken only with
    --stack_dump_on_stop=always."""
    p = crun(procs, tmp_path, job_env(tmp_path), f"--stack_dump_on_stop={when}", nproc=2)
    wait_until(lambda: markers(tmp_path, 0, (0, 1)), "both ranks stuck")
    os.kill(p.pid, signal.SIGTERM)
    rc, out, err = finish(p)
    assert rc != 0, (out, err)
    for r in (0, 1):
        assert (stack_file(tmp_path, 0, r) is not None) == taken, err
    assert ("when crun got signal 15" in err) == taken, err


def test_never_takes_no_stacks_on_a_failure(procs, tmp_path):
    p = crun(procs, tmp_path, job_env(tmp_path, FAIL_RANK=1), "--stack_dump_on_stop=never")
    rc, out, err = finish(p)
    assert rc == 1 and "crun: stacks:" not in err, (out, err)
    assert stack_file(tmp_path, 0, 0) is None


# ---- on demand -------------------------------------------------------------------------

def crunctl(*args):
    return subprocess.run([bin_path("crunctl"), *args], capture_output=True, text=True,
                          timeout=60)


def test_stacks_on_demand_and_rate_limited(procs, tmp_path):
    """crunctl stacks prints every local rank's stack while the job runs;
    a second capture within 2 s is refused (429); --rank picks one."""
    port = free_port()
    p = crun(procs, tmp_path, job_env(tmp_path), f"--status=127.0.0.1:{port}")
    wait_until(lambda: markers(tmp_path, 0, (0, 1, 2)), "every rank stuck")
    ep = f"127.0.0.1:{port}"
    res = crunctl("stacks", "--endpoint", ep)
    assert res.returncode == 0, res.stderr
    for r in (0, 1, 2):
        assert re.search(rf"=== rank {r} \(local rank {r}, pid \d+\): {STUCK}", res.stdout), \
            res.stdout
    again = crunctl("stacks", "--endpoint", ep, "--rank", "2")
    assert again.returncode == 1 and "HTTP 429" in again.stderr, (again.stdout, again.stderr)
    one = wait_until(lambda: (lambda r: r if r.returncode == 0 else None)(
        crunctl("stacks", "--endpoint", ep, "--rank", "2")), "a capture after the gap",
        interval=0.5)
    assert "=== rank 2 " in one.stdout and "=== rank 0 " not in one.stdout, one.stdout
    bad = crunctl("stacks", "--endpoint", ep, "--rank", "x")
    assert bad.returncode == 2 and "--rank" in bad.stderr, bad.stderr
    assert p.poll() is None  # the workers were not disturbed
    os.kill(p.pid, signal.SIGTERM)
    finish(p)


# ---- --hang_timeout ----------------------------------------------------------------------

def test_hang_names_the_straggler_in_a_gloo_job(procs, tmp_path):
    """PyTorch 1.13, gloo, 3 ranks: rank 1 sleeps before the all_reduce the
    others wait in. --hang_timeout=3 declares the job hung, the digest names
    rank 1 and its function, and the summary's root cause is rank 1."""
    py = torch_python("1")
    env = job_env(tmp_path, SLOW_RANK=1)
    p = crun(procs, tmp_path, env, "--hang_timeout=3", worker=HANG_WORKER, python=py)
    rc, out, err = finish(p, 300)
    assert rc == 1, (out, err)
    m = re.search(r"crun: hung: rank 1 is in (late_for_the_all_reduce \(hang_worker\.py:\d+\)) "
                  r"while ranks 0,2 are in (\S+ \(\S+\)) when no worker made progress", err)
    assert m, err
    assert "all_reduce" in m.group(2), m.group(2)
    assert re.search(r"rank\s+: 1 \(local_rank: 1\)", err), err  # the root cause
    for r in (0, 1, 2):
        assert read(stack_file(tmp_path, 0, r))


@pytest.mark.parametrize("progress", ["BURN", "TALK", "BEAT"])
def test_a_working_job_is_not_hung(procs, tmp_path, progress):
    """CPU time (BURN: every rank computes 4 s) or output (TALK: a line every
    0.2 s while sleeping, for 3 s until rank 1 fails) or heartbeats (BEAT:
    the same with the heartbeat file's mtime) is progress: --hang_timeout=1
    never fires."""
    extra = {"BURN": 4} if progress == "BURN" else {progress: 1, "FAIL_RANK": 1}
    flags = ["--hang_timeout=1"]
    if progress == "TALK":
        flags.append("--redirects=3")  # the output goes to files crun can see
    if progress == "BEAT":
        flags.append("--worker_heartbeat_timeout=60")
    p = crun(procs, tmp_path, job_env(tmp_path, **extra), *flags)
    rc, out, err = finish(p)
    assert "crun: hung" not in err and "--hang_timeout" not in err, err
    assert rc == (0 if progress == "BURN" else 1), (out, err)
    if progress != "BURN":
        assert re.search(r"exitcode\s+: 3 \(pid", err), err  # rank 1's own failure


# ---- the whole job: the job board of the elastic backends -------------------------------

ELASTIC_CONF = ("--rdzv_conf=last_call_timeout=1,heartbeat_interval=0.3,lease_ttl=3,"
                "join_timeout=60")


@pytest.fixture(params=["c10d", "rdzvd", "etcd"])
def elastic(request, procs):
    """(backend, endpoint, rdzvd endpoint or None): c10d with the store an
    agent serves, c10d on a crun-rdzvd, or etcd (one real member)."""
    if request.param == "etcd":
        cluster = EtcdCluster(1)
        try:
            yield "etcd", cluster.endpoints(), None
        finally:
            cluster.close()
    elif request.param == "rdzvd":
        port = free_port()
        d = procs.spawn([bin_path("crun-rdzvd"), "--host", "127.0.0.1", "--port", "0",
                         f"--status=127.0.0.1:{port}"])
        m = wait_line(d.stdout, r"crun-rdzvd listening on (\S+):(\d+)", 10)
        yield "c10d", f"{m.group(1)}:{m.group(2)}", f"127.0.0.1:{port}"
    else:
        yield "c10d", f"127.0.0.1:{free_port()}", None


def elastic_agents(procs, tmp_path, elastic, env, *flags, nnodes=2, nproc=2, job="hangjob"):
    """nnodes crun agents of one job, each with its own log dir, status page
    (returned) and Output reader."""
    backend, ep, _ = elastic
    agents = []
    for i in range(nnodes):
        port = free_port()
        p = procs.spawn([bin_path("crun"), f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
                         f"--rdzv_backend={backend}", f"--rdzv_endpoint={ep}",
                         f"--rdzv_id={job}", ELASTIC_CONF, f"--log_dir={tmp_path / f'logs{i}'}",
                         f"--status=127.0.0.1:{port}", *flags, torch_python("1"), HANG_WORKER],
                        env=env)
        agents.append((Output(p), f"127.0.0.1:{port}"))
    return agents


def test_hang_names_the_straggler_job_wide(procs, tmp_path, elastic):
    """2 agents x 2 gloo ranks (CRUN_HANG_NPROC=4: x 4, the bench's other
    shape): the last global rank sleeps before the all_reduce the others wait
    in. The job-wide digest (from every node's stacks, through the job board)
    names it and its function on the node that kills it, and the time from
    the hang's declaration to the digest is printed."""
    nproc = int(os.environ.get("CRUN_HANG_NPROC", "2"))
    slow, world = 2 * nproc - 1, 2 * nproc
    env = job_env(tmp_path, SLOW_RANK=slow)
    agents = elastic_agents(procs, tmp_path, elastic, env, "--hang_timeout=3", nproc=nproc)
    results = [o.finish(300) for o, _ in agents]
    err = "".join(e for _, _, e in results)
    assert all(rc == 1 for rc, _, _ in results), err
    others = ",".join(str(r) for r in range(slow))
    m = re.search(rf"crun: hung: rank {slow} is in (late_for_the_all_reduce "
                  rf"\(hang_worker\.py:\d+\)) while ranks {others} are in (\S+ \(\S+\)) when "
                  r"no worker made progress", err)
    assert m, err
    assert "all_reduce" in m.group(2), m.group(2)
    took = re.findall(rf"job-wide stacks: {world} ranks on 2 of 2 nodes \(ask \d+\) in (\d+) ms",
                      err)
    assert took, err
    print(f"\n[{elastic[0]}{'/rdzvd' if elastic[2] else ''} 2x{nproc}] hang declared -> "
          f"job-wide digest: {', '.join(took)} ms")
    assert re.search(rf"rank\s+: {slow} \(local_rank: {nproc - 1}\)", err), err  # the root cause
    assert glob.glob(str(tmp_path / "logs*" / "*" / "attempt_0" / "job_stacks.txt")), err


def test_crunctl_stacks_all_gathers_every_node(procs, tmp_path, elastic):
    """While the 2x2 job waits for rank 3: crunctl stacks --all on either
    agent prints all 4 ranks with the job-wide digest; on crun-rdzvd's page
    --job J does the same, and an unknown job is told so. --wait is only a
    hang guard here: the page answers once both nodes did (the default 2.5 s
    was a wall-clock bound a loaded etcd once missed). A wait out of range
    is refused by crunctl (2) and by the page (400). At debug level the
    agents log each step of the job board (printed when a node is missed)."""
    env = job_env(tmp_path, SLOW_RANK=3, CRUN_LOG_LEVEL="debug")
    agents = elastic_agents(procs, tmp_path, elastic, env)
    wait_until(lambda: all((tmp_path / "ready" / str(r)).exists() for r in range(4)),
               "every rank where it waits")
    for flags, needle in [(["--wait", "121"], "--wait: expected more than 0 and at most 120 s"),
                          (["--wait", "5"], "--wait is for --all or --job")]:
        bad = crunctl("stacks", "--endpoint", agents[1][1], *flags)
        assert bad.returncode == 2 and needle in bad.stderr, bad.stderr
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://{agents[1][1]}/stacks?all=1&wait_ms=0", timeout=30)
    assert refused.value.code == 400, refused.value
    assert b"wait_ms: expected 1 to 120000 milliseconds, got '0'" in refused.value.read()
    res = crunctl("stacks", "--all", "--wait", "40", "--endpoint", agents[1][1])
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert re.search(r"job 'hangjob' \(ask \d+\): 4 ranks on 2 of 2 nodes", out), \
        out + "".join(f"\n--- agent {i}:\n" + "".join(o.err)[-4000:]
                      for i, (o, _) in enumerate(agents))
    assert re.search(r"digest: rank 3 is in late_for_the_all_reduce \(hang_worker\.py:\d+\) "
                     r"while ranks 0,1,2 are in", out), out
    for r in range(4):
        assert re.search(rf"=== rank {r} \(node \d \S+, local rank {r % 2}, pid \d+\): \S+", out), out
    rdzvd = elastic[2]
    if rdzvd:
        res = crunctl("stacks", "--endpoint", rdzvd, "--job", "hangjob", "--wait", "40")
        assert res.returncode == 0, res.stderr
        assert "4 ranks on 2 of 2 nodes" in res.stdout and "rank 3 is in late_for" in res.stdout
        bad = crunctl("stacks", "--endpoint", rdzvd, "--job", "nosuch")
        assert bad.returncode == 1, bad.stdout
        assert "HTTP 404: no job 'nosuch' in this store" in bad.stderr, bad.stderr
    for o, _ in agents:
        o.p.send_signal(signal.SIGTERM)
    for o, _ in agents:
        o.finish(60)
