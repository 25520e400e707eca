"""Node health: --node_check (a GEMM and a ring all_reduce on every node after
each round, before the workers; the table shared through the worker store)
and --max_node_failures (a node whose workers keep failing leaves the job).

Real crun agents on loopback with distinct --local_addr; the slow node is
really slower: its agent runs in a cgroup v1 `cpu` group with a 5 % quota
(cpu.cfs_quota_us), so the check's own GFLOP/s decide, far from the 50 %
threshold. No test asserts a wall-clock bound; waits are for records, log
lines and exits, with generous hang guards."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request
import uuid

import pytest

from conftest import (HELPERS, Output, bin_path, free_port, records, release_workers,
                      wait_records)
from etcd_cluster import EtcdCluster

TASK = os.path.join(HELPERS, "node_health_task.py")
PY = "/usr/bin/python3"
CONF = "--rdzv_conf=last_call_timeout=1,heartbeat_interval=0.3,lease_ttl=1.5,join_timeout=60"
CPU_CGROUP = "/sys/fs/cgroup/cpu"
ROW = re.compile(r"node check: (\d+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+(\d+) (\w+)(.*)")
HEAD = re.compile(r"node check of round (-?\d+): (\d+) nodes in (\d+) ms, median ([\d.]+) GFLOP/s")


@pytest.fixture
def out():
    d = tempfile.mkdtemp(prefix="crun-health-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def throttle(procs):
    """A cgroup v1 cpu group limited to 5 % of one CPU (this machine is
    shared: a healthy node may get only part of a core, so the slow one gets
    far less). Removed (after every process was killed) at the end."""
    if not os.access(os.path.join(CPU_CGROUP, "cgroup.procs"), os.W_OK):
        pytest.fail(f"cgroup v1 cpu controller not writable at {CPU_CGROUP}")
    path = os.path.join(CPU_CGROUP, f"crun-test-{uuid.uuid4().hex[:12]}")
    os.mkdir(path)
    with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
        f.write("100000")
    with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
        f.write("5000")
    yield path
    procs.cleanup()
    os.rmdir(path)


@pytest.fixture(scope="module")
def _etcd():
    c = EtcdCluster(1)
    yield c
    c.close()


@pytest.fixture(params=["c10d", "etcd"])
def elastic(request):
    """The elastic backend and its endpoint for a job: c10d (the first agent
    serves the rendezvous store: it is pinned, never excluded) or etcd (no
    node serves it)."""
    if request.param == "etcd":
        return "etcd", request.getfixturevalue("_etcd").endpoints()
    return "c10d", None


def env(**extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    e.update({k: str(v) for k, v in extra.items()})
    return e


def crun(procs, out, args, cgroup=None, **extra):
    """A crun agent (its Output) running node_health_task.py OUT, optionally
    started inside `cgroup`."""
    argv = [bin_path("crun"), "--nproc_per_node=1", "--status=127.0.0.1:0", *args,
            PY, TASK, out]
    if cgroup:
        argv = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *argv]
    return Output(procs.spawn(argv, env=env(**extra)))


def elastic_agent(procs, out, port, job, addr, args, nnodes="2:3", elastic=("c10d", None),
                  conf=CONF, **kw):
    backend, ep = elastic
    job = f"{job}-{port}"  # one etcd serves every test of the module
    return crun(procs, out, [f"--nnodes={nnodes}", f"--rdzv_backend={backend}",
                             f"--rdzv_endpoint={ep or f'127.0.0.1:{port}'}",
                             f"--rdzv_id={job}", conf, f"--local_addr={addr}", *args], **kw)


def status_url(o):
    o.wait_for("status page on")
    return re.search(r"status page on (http://\S+)/status", "".join(o.err)).group(1)


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return r.read().decode()


def metric(text, name):
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} not on /metrics: {text[-2000:]}"
    return float(m.group(1))


def tables(err):
    """Every node check table in an agent's log: [(round, ms, median, rows)]."""
    found, cur = [], None
    for line in err.splitlines():
        h = HEAD.search(line)
        if h:
            cur = (int(h.group(1)), int(h.group(3)), float(h.group(4)), [])
            found.append(cur)
            continue
        r = ROW.search(line)
        if r and cur:
            cur[3].append({"rank": int(r.group(1)), "node": r.group(2),
                           "gflops": float(r.group(3)), "gbps": float(r.group(4)),
                           "failures": int(r.group(5)), "status": r.group(6),
                           "rest": r.group(7).replace(" (this node)", "")})
    return found


def final_round(out, n):
    """The records of the job's last round: n ranks with WORLD_SIZE n."""
    return wait_records(out, lambda r: len({x["RANK"] for x in records(out)
                                            if x["WORLD_SIZE"] == str(n)}) == n,
                        f"{n} workers of a {n}-node round", timeout=120)


def finish_all(*outs):
    return [o.finish(120) for o in outs]


def test_throttled_node_leaves_and_the_others_form_a_new_round(procs, out, throttle, elastic):
    port = free_port()
    host = elastic_agent(procs, out, port, "thr", "127.0.0.1", ["--node_check"], elastic=elastic)
    host.wait_for("joined rendezvous")
    url = status_url(host)
    peer = elastic_agent(procs, out, port, "thr", "127.0.0.2", ["--node_check"], elastic=elastic)
    slow = elastic_agent(procs, out, port, "thr", "127.0.0.3", ["--node_check"], cgroup=throttle,
                elastic=elastic)
    final_round(out, 2)
    rc, _, err = slow.finish(120)
    assert rc == 2, err[-3000:]
    assert re.search(r"this node \('\S+@127\.0\.0\.3'\) leaves the job: GEMM at [\d.]+ GFLOP/s "
                     r"is below 50% of the median", err), err[-3000:]
    st = json.loads(get(url, "/status"))["node_check"]
    assert st["enabled"] and st["threshold_pct"] == 50
    assert [n["status"] for n in st["nodes"]] == ["ok", "ok"]
    assert not any(n["excluded"] for n in st["nodes"])
    assert all(n["gflops"] > 0 and n["gbps"] > 0 for n in st["nodes"])
    m = get(url, "/metrics")
    assert metric(m, "crun_agent_nodes_excluded_total") == 1
    assert metric(m, "crun_agent_node_checks_total") == 2
    release_workers(out)
    for rc, _, e in finish_all(host, peer):
        assert rc == 0, e[-3000:]
    # Round 0's table, the same on every node: the throttled node is far below.
    first = {o: tables(e)[0] for o, e in (("host", host.finish(1)[2]), ("slow", err))}
    assert first["host"][3] == first["slow"][3]
    _, ms, med, rows = first["host"]
    slow_row = next(r for r in rows if r["node"].endswith("@127.0.0.3"))
    ratio = slow_row["gflops"] / med
    assert ratio < 0.5 and "EXCLUDED" in slow_row["rest"], rows
    print(f"node check of 3 nodes: {ms} ms; throttled node at {ratio:.3f} of the median "
          f"({slow_row['gflops']} / {med} GFLOP/s)")
    # The excluded node's workers never ran; the other two's ran once, in
    # the 2-node round.
    assert {r["WORLD_SIZE"] for r in records(out)} == {"2"}


def test_spare_takes_the_place_of_a_throttled_node(procs, out, throttle):
    """MIN 1, MAX 2: the host and the throttled node form round 0; a spare
    started once that round closed joins the host after the exclusion and
    runs in the 2-node round the host opens. Rounds close at MAX only (a
    last call that outlasts the test): with a 1 s one, the host under SAN
    closed round 0 alone before the throttled node had joined."""
    port = free_port()
    at_max = CONF.replace("last_call_timeout=1,", "last_call_timeout=120,")
    host = elastic_agent(procs, out, port, "spare", "127.0.0.1", ["--node_check"], nnodes="1:2",
                         conf=at_max, NODE_HEALTH_NAME="host")
    host.wait_for("joined rendezvous")
    slow = elastic_agent(procs, out, port, "spare", "127.0.0.3", ["--node_check"], nnodes="1:2",
                         conf=at_max, cgroup=throttle, NODE_HEALTH_NAME="slow")
    host.wait_for("round 0 complete: 2 nodes")
    spare = elastic_agent(procs, out, port, "spare", "127.0.0.2", ["--node_check"], nnodes="1:2",
                          conf=at_max, NODE_HEALTH_NAME="spare")
    last = final_round(out, 2)
    rc, _, err = slow.finish(120)
    assert rc == 2, err[-3000:]
    assert "leaves the job: GEMM at" in err, err[-3000:]
    release_workers(out)
    for rc, _, e in finish_all(host, spare):
        assert rc == 0, e[-3000:]
    two = [r for r in records(out) if r["WORLD_SIZE"] == "2"]
    assert sorted(r["NODE_HEALTH_NAME"] for r in two) == ["host", "spare"], two
    assert last


def test_slow_node_is_named_but_kept_when_min_does_not_allow(procs, out, throttle):
    """Static: MIN is every node, so the throttled one is named, not excluded
    (three nodes: the median is a healthy node's, the ratio not marginal)."""
    port = free_port()
    common = ["--nnodes=3", "--master_addr=127.0.0.1", f"--master_port={port}", "--node_check"]
    n0 = crun(procs, out, [*common, "--node_rank=0"])
    url = status_url(n0)
    n1 = crun(procs, out, [*common, "--node_rank=1"])
    n2 = crun(procs, out, [*common, "--node_rank=2"], cgroup=throttle)
    final_round(out, 3)
    st = json.loads(get(url, "/status"))["node_check"]
    slow = st["nodes"][2]
    assert not slow["excluded"] and "GEMM at" in slow["why"], json.dumps(st)
    assert slow["gflops"] < st["median_gflops"] * 0.5, json.dumps(st)
    release_workers(out)
    for rc, _, e in finish_all(n0, n1, n2):
        assert rc == 0, e[-3000:]
        assert "(kept: fewer than MIN nodes would remain)" in e, e[-3000:]
    _, ms, med, rows = tables(n0.finish(1)[2])[0]
    print(f"node check of 3 static nodes: {ms} ms; throttled node at "
          f"{rows[2]['gflops'] / med:.3f} of the median")


def test_node_whose_workers_keep_failing_is_retired(procs, out, elastic):
    port = free_port()
    args = ["--max_node_failures=2", "--max_restarts=5"]
    host = elastic_agent(procs, out, port, "ret", "127.0.0.1", args, elastic=elastic)
    host.wait_for("joined rendezvous")
    url = status_url(host)
    peer = elastic_agent(procs, out, port, "ret", "127.0.0.2", args, elastic=elastic)
    bad = elastic_agent(procs, out, port, "ret", "127.0.0.3", args, elastic=elastic, NODE_HEALTH_BAD=1)
    final_round(out, 2)
    rc, _, err = bad.finish(120)
    assert rc == 2, err[-3000:]
    assert re.search(r"this node \('\S+@127\.0\.0\.3'\) leaves the job: its workers failed in 2 "
                     r"attempts \(--max_node_failures=2\)", err), err[-3000:]
    # Its workers ran (and failed) in exactly two attempts.
    assert len([r for r in records(out) if r["NODE_HEALTH_BAD"] == "1"]) == 2
    m = get(url, "/metrics")
    assert metric(m, "crun_agent_nodes_excluded_total") == 1
    assert metric(m, "crun_agent_node_failures_total") == 0
    release_workers(out)
    for rc, _, e in finish_all(host, peer):
        assert rc == 0, e[-3000:]
    last = [r for r in records(out) if r["WORLD_SIZE"] == "2"]
    assert sorted(int(r["RANK"]) for r in last) == [0, 1]
    assert not any(r["NODE_HEALTH_BAD"] for r in last)
