"""Multi-host c10d in network namespaces the test creates: one namespace per
node (10.213.x.i/24 on a veth), the veths' other ends on a bridge in a
namespace of its own, so nothing outside the test's namespaces is touched.
A real 3-node job (2:3); then node 3's link is cut (`ip link set eth0 down`:
no FIN, no RST - only its lease's TTL can tell); the survivors re-rendezvous
and continue; the link is restored and node 3's agent restarted, and the node
rejoins through a scale-up round. Needs root and iproute2."""
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from conftest import HELPERS, Output, bin_path, records, release_workers, wait_records

TASK = os.path.join(HELPERS, "elastic_task.py")
PY = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip"),
    reason="network namespaces need root and iproute2")


def sh(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Net:
    """N namespaces on one bridge; removed by close()."""

    def __init__(self, n, subnet):
        tag = f"crun{os.getpid() % 100000}"
        self.br = f"{tag}br"
        self.ns = [f"{tag}n{i}" for i in range(1, n + 1)]
        self.addr = [f"10.213.{subnet}.{i}" for i in range(1, n + 1)]
        self.made = []
        try:
            sh("netns", "add", self.br)
            self.made.append(self.br)
            sh("-n", self.br, "link", "add", "br0", "type", "bridge")
            sh("-n", self.br, "link", "set", "br0", "up")
            for i, (ns, ip) in enumerate(zip(self.ns, self.addr), 1):
                sh("netns", "add", ns)
                self.made.append(ns)
                sh("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name",
                   f"vb{i}", "netns", self.br)
                sh("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
                sh("-n", ns, "link", "set", "lo", "up")
                sh("-n", ns, "link", "set", "eth0", "up")
                sh("-n", self.br, "link", "set", f"vb{i}", "master", "br0")
                sh("-n", self.br, "link", "set", f"vb{i}", "up")
        except Exception:
            self.close()
            raise

    def link(self, i, up):
        sh("-n", self.ns[i], "link", "set", "eth0", "up" if up else "down")

    def close(self):
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.made = []


@pytest.fixture
def net():
    n = Net(3, 7)
    yield n
    n.close()


def crun_env(tmp):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k not in ("OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE")}
    env["PYTHON_EXEC"] = PY
    env["TMPDIR"] = tmp
    return env


def test_three_hosts_link_cut_and_rejoin(procs, net):
    tmp = tempfile.mkdtemp(prefix="crun-netns-")
    out = os.path.join(tmp, "rec")
    os.mkdir(out)
    try:
        def agent(i, secs):
            return procs.spawn(
                ["ip", "netns", "exec", net.ns[i], bin_path("crun"), "--nnodes=2:3",
                 "--nproc_per_node=2", "--rdzv_backend=c10d",
                 f"--rdzv_endpoint={net.addr[0]}:29400", "--rdzv_id=netjob",
                 "--rdzv_conf=last_call_timeout=1,heartbeat_interval=0.3,lease_ttl=1.5,"
                 "read_timeout=5,join_timeout=60",
                 TASK, "run", out, str(secs)], env=crun_env(tmp))

        # The workers run until release_workers (60 s at most), not a fixed
        # 8 s the scenario had to fit in; the others start once the first
        # serves the store.
        host = agent(0, 60)
        host_out = Output(host).wait_for("serving the rendezvous store")
        n2 = agent(1, 60)
        n3 = agent(2, 60)
        full = wait_records(out, lambda r: r["WORLD_SIZE"] == "6", "WORLD_SIZE=6")
        # Every node advertised its own namespace address for the worker store.
        assert {r["MASTER_ADDR"] for r in full} == {net.addr[0]}
        net.link(2, False)
        # The survivors continue as a 2-node job (all four of its workers up).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            after = [r for r in records(out) if r["WORLD_SIZE"] == "4"]
            if sorted(int(r["RANK"]) for r in after) == [0, 1, 2, 3]:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the survivors did not continue: {records(out)}")
        # Node 3 comes back: link restored, its agent restarted.
        os.killpg(n3.pid, signal.SIGKILL)
        n3.wait(timeout=10)
        net.link(2, True)
        n3b = agent(2, 60)
        # The last round runs on all three nodes (6 more workers): done.
        wait_records(out, lambda r: len([x for x in records(out) if x["WORLD_SIZE"] == "6"])
                     >= 12, "the three nodes' round again", timeout=120)
        release_workers(out)
        for o in (host_out, Output(n2), Output(n3b)):
            rc, _, err = o.finish(120)
            assert rc == 0, err[-3000:]
        recs = records(out)
        after = [r for r in recs if r["WORLD_SIZE"] == "4"]
        assert sorted(int(r["RANK"]) for r in after) == [0, 1, 2, 3]
        # The last round has all three nodes again.
        last_pids = {r["pid"] for r in recs if r["WORLD_SIZE"] == "6"}
        assert len(last_pids) >= 12, recs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
