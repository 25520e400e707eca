"""The worker store's allowlist across network namespaces (one per host, on a
bridge in a namespace of its own; nothing outside the test's namespaces is
touched): a 2-node c10d job on hosts 1 and 2, host 3 outside the round.
Group rank 0's worker store (MASTER_ADDR:MASTER_PORT) listens on its
advertised address only and accepts loopback and the round's nodes: the
workers of both nodes get through, host 3 is refused at accept (and the
agent logs it). worker_store_allow_any is the way out for NAT; a real
PyTorch gloo job still runs across the namespaces. Needs root and iproute2."""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import HELPERS, bin_path, records, release_workers, torch_python, wait_records

from test_elastic_netns import Net

PROBE = os.path.join(HELPERS, "store_probe.py")
JOB = os.path.join(HELPERS, "launch_worker.py")
PY = "/usr/bin/python3"
CONF = ("--rdzv_conf=last_call_timeout=1,heartbeat_interval=0.3,lease_ttl=1.5,read_timeout=5,"
        "join_timeout=60")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip"),
    reason="network namespaces need root and iproute2")


@pytest.fixture
def net():
    n = Net(3, 9)
    yield n
    n.close()


def crun_env(tmp, py=PY):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k not in ("OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE")}
    env["PYTHON_EXEC"] = py
    env["TMPDIR"] = tmp
    # gloo picks its interface from the host name, which names no address
    # inside a test namespace.
    env["GLOO_SOCKET_IFNAME"] = "eth0"
    return env


def agent(procs, net, i, args, tmp, py=PY):
    return procs.spawn(
        ["ip", "netns", "exec", net.ns[i], bin_path("crun"), "--nnodes=2",
         "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint={net.addr[0]}:29400",
         "--rdzv_id=allow", CONF, *args], env=crun_env(tmp, py))


def finish(p, timeout=150):
    try:
        o, e = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail("crun agent did not finish in time")
    return p.returncode, o.decode(errors="replace"), e.decode(errors="replace")


@pytest.mark.parametrize("allow_any", [False, True])
def test_worker_store_admits_the_round_and_refuses_other_hosts(procs, net, allow_any):
    """With --worker_store_allow_any (NAT) host 3 gets through instead."""
    tmp = tempfile.mkdtemp(prefix="crun-allow-")
    out = os.path.join(tmp, "rec")
    os.mkdir(out)
    extra = ["--worker_store_allow_any"] if allow_any else []
    try:
        ps = [agent(procs, net, i, [*extra, PROBE, "--worker", out, "6"], tmp) for i in (0, 1)]
        recs = wait_records(out, lambda r: True, "a worker", timeout=90)
        recs = wait_records(out, lambda r: len(records(out)) == 2, "both workers", timeout=90)
        # Both nodes' workers reached the one worker store, on the address of
        # group rank 0: whichever node drew the first ticket (not always the
        # rendezvous host: the other node may draw first).
        masters = {r["MASTER_ADDR"] for r in recs}
        assert len(masters) == 1 and masters <= {net.addr[0], net.addr[1]}, recs
        assert {r["probe"] for r in recs} == {"accepted"}, recs
        master, port = recs[0]["MASTER_ADDR"], recs[0]["MASTER_PORT"]
        # Host 3 is outside the round: refused at accept.
        outsider = subprocess.run(["ip", "netns", "exec", net.ns[2], sys.executable, PROBE,
                                   master, port], capture_output=True, text=True,
                                  timeout=60)
        want = "accepted" if allow_any else "refused"
        assert outsider.stdout.startswith(want), outsider.stdout + outsider.stderr
        release_workers(out)  # the worker store was needed up to here
        res = [finish(p) for p in ps]
        for rc, _, err in res:
            assert rc == 0, err[-3000:]
        refused = any(f"refusing client {net.addr[2]}:" in e for _, _, e in res)
        assert refused != allow_any, [e[-2000:] for _, _, e in res]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_pytorch_gloo_job_runs_across_hosts_with_the_allowlist(procs, net):
    py = torch_python("2")
    tmp = tempfile.mkdtemp(prefix="crun-allow-")
    try:
        ps = [agent(procs, net, i, [JOB], tmp, py=py) for i in (0, 1)]
        oks = []
        res = [finish(p, timeout=200) for p in ps]
        for rc, o, err in res:
            assert rc == 0, "\n".join(e[-3000:] for _, _, e in res)
            oks += [ln for ln in o.splitlines() if ln.startswith("launch_worker ok")]
        assert sorted(oks) == [f"launch_worker ok rank={r} world=2 restart=0" for r in range(2)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
