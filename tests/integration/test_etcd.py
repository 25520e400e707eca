"""The etcd rendezvous backend against real etcd servers (Debian's etcd-server)
on loopback ports: one member (keys under the default and a custom prefix);
a three-member cluster whose leader is killed while a job runs and while a
rendezvous round is open (the job goes on, the round completes); a member
frozen with SIGSTOP as a partitioned host would be, while agents talk to it;
an https cluster with certificates made by the test (and a wrong CA failing
cleanly); etcd user/password authentication.

The elastic scenarios shared with c10d (kill an agent, scale up, spares,
restarts exhausted) run over both backends in test_elastic.py. No test
asserts a wall-clock bound."""
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from conftest import HELPERS, bin_path, records, wait_records
from etcd_cluster import EtcdCluster

TASK = os.path.join(HELPERS, "elastic_task.py")
PY = "/usr/bin/python3"
# A lease must outlive a fail-over: a frozen member costs one request
# timeout (2 s) before the next member is asked.
CONF = "last_call_timeout=1,heartbeat_interval=0.5,lease_ttl=10,join_timeout=120"


@pytest.fixture
def out():
    d = tempfile.mkdtemp(prefix="crun-etcd-out-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def cluster1():
    c = EtcdCluster(1)
    yield c
    c.close()


@pytest.fixture
def cluster3():
    c = EtcdCluster(3)
    yield c
    c.close()


def crun_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k not in ("OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE")}
    env["PYTHON"] = PY
    return env


def agent(procs, cl, job, nnodes, args, conf="", endpoints=None, nproc=2, extra=()):
    c = ",".join(x for x in (CONF, cl.rdzv_conf(), conf) if x)
    argv = [bin_path("crun"), f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
            "--rdzv_backend=etcd", f"--rdzv_endpoint={endpoints or cl.endpoints()}",
            f"--rdzv_id={job}", f"--rdzv_conf={c}", *extra, *args]
    return procs.spawn(argv, env=crun_env())


def finish(p, timeout=180):
    try:
        o, e = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail("crun agent did not finish in time")
    return p.returncode, o.decode(errors="replace"), e.decode(errors="replace")


def ranks_of(recs):
    return sorted(int(r["RANK"]) for r in recs)


def one_attempt_of_four(out):
    """The job ran once on 2x2: no re-rendezvous, no restart."""
    recs = records(out)
    assert ranks_of(recs) == [0, 1, 2, 3], recs
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in recs}) == 1


def test_one_member_two_nodes_and_prefixes(procs, cluster1, out):
    ps = [agent(procs, cluster1, "one", 2, [TASK, "run", out, "0.2"]) for _ in range(2)]
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
        assert "serving the rendezvous store" not in err
    one_attempt_of_four(out)
    keys = cluster1.keys("/crun/rdzv/one/")
    assert "/crun/rdzv/one/r0/closed" in keys and "/crun/rdzv/one/closed" in keys
    # A custom prefix, and the same run id elsewhere stays apart.
    out2 = tempfile.mkdtemp(dir=out)
    ps = [agent(procs, cluster1, "one", 2, [TASK, "run", out2, "0.2"],
                conf="key_prefix=/site/jobs/one") for _ in range(2)]
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
    assert "/site/jobs/one/r0/closed" in cluster1.keys("/site/jobs/")


def test_spent_run_id_is_an_error(procs, cluster1, out):
    a = agent(procs, cluster1, "spent", 1, [TASK, "run", out, "0.1"])
    rc, _, err = finish(a)
    assert rc == 0, err[-2000:]
    b = agent(procs, cluster1, "spent", 1, [TASK, "run", out, "0.1"])
    rc, _, err = finish(b)
    assert rc != 0 and "run id already used" in err, err[-2000:]


def test_leader_killed_while_job_runs(procs, cluster3, out):
    # The agents talk to the leader first: its death breaks their
    # connections, their lease keep-alives and their watches.
    leader = cluster3.leader()
    ps = [agent(procs, cluster3, "lead-job", 2, [TASK, "run", out, "8"],
                endpoints=cluster3.endpoints(first=leader)) for _ in range(2)]
    wait_records(out, lambda r: r["WORLD_SIZE"] == "4", "WORLD_SIZE=4", timeout=120)
    cluster3.kill(leader)
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
        assert "is over" not in err, err[-3000:]  # no peer change was seen
    one_attempt_of_four(out)


def test_leader_killed_during_a_round(procs, cluster3, out):
    # The first agent holds ticket 1 of an open round (it needs 2 nodes);
    # the leader dies; the second agent joins through the new one.
    leader = cluster3.leader()
    eps = cluster3.endpoints(first=leader)
    a = agent(procs, cluster3, "lead-round", 2, [TASK, "run", out, "0.5"], endpoints=eps)
    prefix = "/crun/rdzv/lead-round/"
    deadline = 600
    while deadline and "/crun/rdzv/lead-round/r0/node/1" not in cluster3.keys(prefix):
        deadline -= 1
        a.poll()
        assert a.returncode is None
        time.sleep(0.1)
    cluster3.kill(leader)
    b = agent(procs, cluster3, "lead-round", 2, [TASK, "run", out, "0.5"], endpoints=eps)
    for p in (a, b):
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
    one_attempt_of_four(out)


def test_partitioned_member(procs, cluster3, out):
    # Every agent lists the frozen member first, so each of its requests and
    # its watch start there and must move on.
    first = cluster3.members[0]
    ps = [agent(procs, cluster3, "freeze", 2, [TASK, "run", out, "10"],
                endpoints=cluster3.endpoints(first=first)) for _ in range(2)]
    wait_records(out, lambda r: r["WORLD_SIZE"] == "4", "WORLD_SIZE=4", timeout=120)
    cluster3.freeze(first)
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
    one_attempt_of_four(out)
    # A round run while that member is still frozen.
    out2 = tempfile.mkdtemp(dir=out)
    ps = [agent(procs, cluster3, "freeze2", 2, [TASK, "run", out2, "0.2"],
                endpoints=cluster3.endpoints(first=first)) for _ in range(2)]
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
    one_attempt_of_four(out2)
    cluster3.thaw(first)


def test_https_cluster_with_client_certificates(procs, out):
    cl = EtcdCluster(3, tls=True)
    try:
        leader = cl.leader()
        ps = [agent(procs, cl, "tls", 2, [TASK, "run", out, "3"],
                    endpoints=cl.endpoints(first=leader)) for _ in range(2)]
        wait_records(out, lambda r: r["WORLD_SIZE"] == "4", "WORLD_SIZE=4", timeout=120)
        cl.kill(leader)
        for p in ps:
            rc, _, err = finish(p)
            assert rc == 0, err[-3000:]
        one_attempt_of_four(out)
        # A CA that did not sign the members: refused, named, no hang.
        c = cl.certs
        bad = (f"{CONF},join_timeout=2,protocol=https,cacert={c['cli.crt']},"
               f"cert={c['cli.crt']},key={c['cli.key']}")
        p = procs.spawn([bin_path("crun"), "--nnodes=1", "--rdzv_backend=etcd",
                         f"--rdzv_endpoint={cl.endpoints()}", "--rdzv_id=badca",
                         f"--rdzv_conf={bad}", TASK, "run", out, "0.1"], env=crun_env())
        rc, _, err = finish(p)
        assert rc != 0 and "rendezvous" in err, err[-2000:]
        # A file that is not there: exit 2 naming the key.
        p = procs.spawn([bin_path("crun"), "--nnodes=1", "--rdzv_backend=etcd",
                         f"--rdzv_endpoint={cl.endpoints()}",
                         "--rdzv_conf=protocol=https,cacert=/nonexistent/ca.pem",
                         TASK, "run", out, "0.1"], env=crun_env())
        rc, _, err = finish(p)
        assert rc == 2 and "cacert" in err, err[-2000:]
    finally:
        cl.close()


def test_username_and_password(procs, cluster1, out):
    ctl = ["/usr/bin/etcdctl", f"--endpoints={cluster1.endpoints()}"]
    env = dict(os.environ, ETCDCTL_API="3")
    for args in (["user", "add", "root:rootpw"], ["user", "add", "agent:s3cret"],
                 ["role", "add", "rdzv"],
                 ["role", "grant-permission", "rdzv", "--prefix=true", "readwrite", "/crun/"],
                 ["user", "grant-role", "agent", "rdzv"], ["auth", "enable"]):
        subprocess.run(ctl + args, check=True, capture_output=True, env=env)
    pw = os.path.join(out, "pw")
    with open(pw, "w") as f:
        f.write("s3cret\n")
    wrong = os.path.join(out, "wrong")
    with open(wrong, "w") as f:
        f.write("nope\n")
    rec = tempfile.mkdtemp(dir=out)
    ps = [agent(procs, cluster1, "auth", 2, [TASK, "run", rec, "0.2"],
                conf=f"username=agent,password_file={pw}") for _ in range(2)]
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
    one_attempt_of_four(rec)
    p = agent(procs, cluster1, "auth2", 1, [TASK, "run", rec, "0.1"],
              conf=f"username=agent,password_file={wrong},join_timeout=5")
    rc, _, err = finish(p)
    assert rc != 0 and "permission denied" in err, err[-2000:]
    p = agent(procs, cluster1, "auth3", 1, [TASK, "run", rec, "0.1"],
              conf="join_timeout=5")
    rc, _, err = finish(p)
    assert rc != 0, err[-2000:]
