"""The worker SDK's collectives across real processes: every collective x
dtype x op x count (0, 1, non-divisible, ring-sized) against references the
ranks compute locally (tests/helpers/coll_worker.c), world sizes 1-8, over
shared memory and over TCP on loopback; subgroups; async overlap; a killed,
aborting or absent peer turns into errors on every survivor, never a hang;
the distributed matmul example; and C ranks sharing a store hosted by
PyTorch's own TCPStore (both versions).

Ranks are started by tests/helpers/coll_launch (fork/exec, torchrun's
environment, rank 0 hosting the store unless a store is given).
"""
import os
import re
import socket
import subprocess

import pytest

from conftest import BUILD, torch_python


def helper(name):
    p = os.path.join(BUILD, "tests", "helpers", name)
    assert os.access(p, os.X_OK), f"{p} is not built"
    return p


def launch(procs, n, args, extra=(), env=None, timeout_s=150, prog=None):
    """Runs coll_launch; returns (returncode, stdout text, stderr text)."""
    argv = [helper("coll_launch"), "-n", str(n), "--timeout", str(timeout_s - 10), *extra]
    for k, v in (env or {}).items():
        argv += ["--env", f"{k}={v}"]
    argv += ["--", prog or helper("coll_worker"), *args]
    p = procs.spawn(argv)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"coll_launch did not finish within {timeout_s}s")
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def assert_all_ok(n, rc, out, err):
    assert rc == 0, f"rc={rc}\n{out[-3000:]}\n{err[-3000:]}"
    oks = re.findall(r"coll_worker rank (\d+): ok (\d+) checks", out)
    assert sorted(int(r) for r, _ in oks) == list(range(n)), out[-3000:]
    assert all(int(c) > 0 for _, c in oks)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])
def test_matrix_over_shared_memory(procs, n):
    # Full op coverage up to 4 ranks; sampled ops (every dtype and count
    # still) beyond, to keep 8 processes on 2 cores quick.
    args = ["matrix"] if n <= 4 else ["matrix", "quick"]
    assert_all_ok(n, *launch(procs, n, args, env={"CRUN_PG_TRANSPORT": "shm"}))


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_matrix_over_tcp_loopback(procs, n):
    args = ["matrix"] if n <= 3 else ["matrix", "quick"]
    assert_all_ok(n, *launch(procs, n, args, env={"CRUN_PG_TRANSPORT": "tcp"}))


def test_matrix_with_tiny_rings_and_the_ring_algorithm_everywhere(procs):
    # 4 KiB rings force every message to wrap and stream; threshold 0 runs
    # the ring algorithms even for tiny counts (count < ranks falls back).
    env = {"CRUN_SHM_RING_BYTES": "4096", "CRUN_PG_RING_THRESHOLD": "0"}
    assert_all_ok(4, *launch(procs, 4, ["matrix", "quick"], env=env))


def test_matrix_in_agent_store_mode(procs):
    assert_all_ok(3, *launch(procs, 3, ["matrix", "quick"], extra=["--agent-store"]))


@pytest.mark.parametrize("n,transport", [(4, "shm"), (5, "shm"), (4, "tcp")])
def test_subgroups(procs, n, transport):
    assert_all_ok(n, *launch(procs, n, ["subgroup"], env={"CRUN_PG_TRANSPORT": transport}))


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_async_work_overlaps_and_keeps_order(procs, transport):
    assert_all_ok(3, *launch(procs, 3, ["async"], env={"CRUN_PG_TRANSPORT": transport}))


def results(out):
    return {int(r): code for r, code in re.findall(r"coll_worker rank (\d+): result (\S+)", out)}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("victim", [0, 2])
def test_a_killed_peer_fails_every_survivor(procs, transport, victim):
    rc, out, err = launch(procs, 4, ["kill", str(victim)], env={"CRUN_PG_TRANSPORT": transport},
                          timeout_s=60)
    assert rc == 1, f"{out}\n{err}"  # the victim exits 9, survivors 0
    assert f"coll_launch: rank {victim} exit 9" in out
    got = results(out)
    assert sorted(got) == sorted(set(range(4)) - {victim}), out
    assert all(v in ("CRUN_EPEER", "CRUN_ETIMEDOUT") for v in got.values()), out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_abort_cancels_local_work_and_fails_the_peers(procs, transport):
    rc, out, err = launch(procs, 3, ["abort", "1"], env={"CRUN_PG_TRANSPORT": transport},
                          timeout_s=60)
    assert rc == 0, f"{out}\n{err}"
    got = results(out)
    assert got[1] == "CRUN_ECANCELED", out
    assert got[0] == got[2] == "CRUN_EPEER", out


def test_an_absent_peer_times_out_instead_of_hanging(procs):
    rc, out, err = launch(procs, 3, ["timeout", "0"], timeout_s=60)
    assert rc == 0, f"{out}\n{err}"
    got = results(out)
    assert got[0] == "skipped"
    assert {got[1], got[2]} <= {"CRUN_ETIMEDOUT", "CRUN_EPEER"}, out
    assert "CRUN_ETIMEDOUT" in (got[1], got[2]), out


@pytest.mark.parametrize("n", [1, 2, 4])
def test_dist_matmul_example_matches_the_single_process_product(procs, n):
    prog = os.path.join(BUILD, "examples", "dist_matmul")
    rc, out, err = launch(procs, n, ["256"], prog=prog)
    assert rc == 0, f"{out}\n{err}"
    assert re.search(r"dist_matmul: n=256 world=%d: .*total [\d.]+ ms" % n, out), out
    assert "max relative error vs single-process product" in out and ": OK" in out, out
    # C[i][j] = i*n + (n-1)/2 for A = arange(n*n)/n, B = ones
    assert "tensor([[2.5550e+02" in out or "tensor([[1.2750e+02" in out, out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TORCH_STORE = r"""
import sys, time, datetime
import torch.distributed as dist
port, n = int(sys.argv[1]), int(sys.argv[2])
s = dist.TCPStore("127.0.0.1", port, n, True, datetime.timedelta(seconds=60),
                  wait_for_workers=False)
print("store up", flush=True)
# The C ranks' world group keys live where PyTorch 2.x puts group keys.
s.wait(["default_pg/0//crun/a0/host/0"], datetime.timedelta(seconds=60))
print("saw crun keys", flush=True)
time.sleep(100)
"""


@pytest.mark.parametrize("version", ["1", "2"])
def test_c_ranks_share_a_pytorch_tcpstore(procs, version):
    py = torch_python(version)
    port = free_port()
    store = procs.spawn([py, "-c", TORCH_STORE, str(port), "3"])
    line = store.stdout.readline().decode()
    assert "store up" in line, line
    env = {"CRUN_STORE_DIALECT": "1" if version == "1" else "2"}
    rc, out, err = launch(procs, 3, ["matrix", "quick"], extra=["--store-port", str(port)],
                          env=env)
    assert_all_ok(3, rc, out, err)
    assert "saw crun keys" in store.stdout.readline().decode()


def test_dist_matmul_under_crun_as_two_nodes_of_two_workers(procs):
    # The demo: crun (static rendezvous, agent store) on this machine
    # as 2 nodes x 2 workers; blocks are split by global rank, so a wrong
    # split (by local rank) would fail the check against the full product.
    from conftest import bin_path
    crun = bin_path("crun")
    prog = os.path.join(BUILD, "examples", "dist_matmul")
    port = free_port()
    nodes = []
    for node_rank in (1, 0):
        nodes.append(procs.spawn([crun, "--nnodes", "2", "--nproc_per_node", "2",
                                  "--node_rank", str(node_rank), "--master_addr", "127.0.0.1",
                                  "--master_port", str(port), "--tee", "3", "--no_python",
                                  prog, "200"]))
    outs = []
    for p in nodes:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("crun did not finish within 120s")
        outs.append(out.decode(errors="replace") + err.decode(errors="replace"))
        assert p.returncode == 0, outs[-1][-3000:]
    node0 = outs[1]
    assert re.search(r"dist_matmul: n=200 world=4: ", node0), node0[-3000:]
    assert re.search(r"max relative error vs single-process product \S+: OK", node0), node0


class NetnsHosts:
    """Two network namespaces joined by a veth pair, standing in for two
    hosts (10.77.<k>.1 and 10.77.<k>.2); removed at teardown."""

    def __init__(self):
        k = os.getpid() % 200 + 20
        self.names = [f"crun-sdk-{os.getpid()}-a", f"crun-sdk-{os.getpid()}-b"]
        self.addrs = [f"10.77.{k}.1", f"10.77.{k}.2"]
        va, vb = f"csa{os.getpid() % 100000}", f"csb{os.getpid() % 100000}"
        a, b = self.names
        cmds = [["ip", "netns", "add", a], ["ip", "netns", "add", b],
                ["ip", "link", "add", va, "type", "veth", "peer", "name", vb],
                ["ip", "link", "set", va, "netns", a], ["ip", "link", "set", vb, "netns", b],
                ["ip", "-n", a, "addr", "add", self.addrs[0] + "/24", "dev", va],
                ["ip", "-n", b, "addr", "add", self.addrs[1] + "/24", "dev", vb],
                ["ip", "-n", a, "link", "set", va, "up"], ["ip", "-n", b, "link", "set", vb, "up"],
                ["ip", "-n", a, "link", "set", "lo", "up"], ["ip", "-n", b, "link", "set", "lo", "up"]]
        for c in cmds:
            r = subprocess.run(c, capture_output=True, text=True, timeout=20)
            if r.returncode != 0:
                self.close()
                pytest.fail(f"cannot build the namespace hosts ({' '.join(c)}): {r.stderr}")

    def close(self):
        for n in self.names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=20)


@pytest.fixture
def netns_hosts():
    h = NetnsHosts()
    yield h
    h.close()


@pytest.mark.parametrize("mode", ["matrix", "subgroup"])
def test_collectives_across_namespace_hosts_over_tcp(procs, netns_hosts, mode):
    # 2 hosts x 2 ranks: same-host pairs use shared memory, cross-host
    # pairs TCP over the veth link (the host id includes the net namespace).
    (a, b), (addr_a, _) = netns_hosts.names, netns_hosts.addrs
    common = ["--world", "4", "--master-addr", addr_a, "--timeout", "100",
              "--env", "CRUN_LOG_LEVEL=debug", "--env", "CRUN_LOG_SUBSYS=pg"]
    worker = [helper("coll_worker"), mode] + (["quick"] if mode == "matrix" else [])
    node_a = procs.spawn(["ip", "netns", "exec", a, helper("coll_launch"), "-n", "2",
                          "--rank-base", "0", "--agent-store", *common, "--", *worker])
    m = re.search(r"store on \S+:(\d+)", node_a.stdout.readline().decode())
    assert m, "node a did not start its store"
    node_b = procs.spawn(["ip", "netns", "exec", b, helper("coll_launch"), "-n", "2",
                          "--rank-base", "2", "--store-port", m.group(1), *common,
                          "--", *worker])
    out, err = "", ""
    for p in (node_a, node_b):
        try:
            o, e = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("namespace ranks did not finish within 120s")
        out += o.decode(errors="replace")
        err += e.decode(errors="replace")
        assert p.returncode == 0, o.decode(errors="replace") + e.decode(errors="replace")
    oks = sorted(int(r) for r in re.findall(r"coll_worker rank (\d+): ok \d+ checks", out))
    assert oks == [0, 1, 2, 3], out
    # The world group: same-namespace pairs on shm, the rest over TCP.
    links = set(re.findall(r"pg 0: rank (\d) reaches rank (\d) over (\w+)", err))
    want = {(str(i), str(j), "shm" if i // 2 == j // 2 else "tcp")
            for i in range(4) for j in range(4) if i != j}
    assert links == want, err[-3000:]
