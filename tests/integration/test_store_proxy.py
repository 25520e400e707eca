"""The node-local store proxy (store/proxy/proxy.c) with real clients: PyTorch 2.x
(v2) and 1.13 (v1) TCPStore clients reach a crun store (crun-rdzvd) through
one proxy of bench/store_proxy_farm; every operation, coalesced waits, a
client killed mid-wait, a malformed frame, and the store dying. The end-to-end
job (two crun agents, rdzv_conf worker_store=proxy, a gloo all_reduce) is at
the bottom. No timing asserts: every wait is bounded and event-driven."""
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from conftest import BUILD, HELPERS, bin_path, free_port, start_rdzvd, torch_python

JOB = os.path.join(HELPERS, "launch_worker.py")


class Farm:
    def __init__(self, procs, tmp_path, root_port, n=1):
        self.ports_file = tmp_path / "proxy_ports"
        self.proc = procs.spawn([os.path.join(BUILD, "bench", "store_proxy_farm"),
                                 "--upstream", f"127.0.0.1:{root_port}", "--proxies", str(n),
                                 "--ports-file", str(self.ports_file)])
        for _ in range(400):
            if self.ports_file.exists():
                break
            assert self.proc.poll() is None, self.proc.stderr.read()
            time.sleep(0.025)
        self.ports = [int(x) for x in self.ports_file.read_text().split()]
        assert len(self.ports) == n

    def stop(self):
        """SIGTERM; returns (exit code, the summed counters)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=20)
        line = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
        return self.proc.returncode, json.loads(line[-1]) if line else None


@pytest.fixture
def proxied(procs, tmp_path):
    """(root proc, root port, farm of one proxy, proxy port)."""
    root, _, rport = start_rdzvd(procs)
    farm = Farm(procs, tmp_path, rport)
    yield root, rport, farm, farm.ports[0]


def run_py(version, code, *args, timeout=120):
    py = torch_python(version)
    p = subprocess.run([py, "-c", code, *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


OPS2 = r"""
import datetime, json, sys, threading, time
import torch.distributed as d
port, rport = int(sys.argv[1]), int(sys.argv[2])
T = datetime.timedelta(seconds=30)
s = d.TCPStore("127.0.0.1", port, is_master=False, timeout=T)
r = {}
s.set("a", "1"); r["get"] = s.get("a").decode()
r["add"] = [s.add("c", 5), s.add("c", -2)]
r["cas_ok"] = s.compare_set("a", "1", "2").decode()
r["cas_no"] = s.compare_set("a", "1", "3").decode()
r["cas_absent"] = s.compare_set("none", "x", "y").decode()
r["del"] = [s.delete_key("a"), s.delete_key("a")]
s.multi_set(["x", "y"], ["1", "2"]); r["mget"] = [v.decode() for v in s.multi_get(["x", "y"])]
s.append("x", "z"); r["append"] = s.get("x").decode()
r["check"] = [s.check(["x"]), s.check(["nope"])]
def late():
    s2 = d.TCPStore("127.0.0.1", port, is_master=False, timeout=T)
    time.sleep(0.3)
    s2.set("late", "v")
threading.Thread(target=late).start()
s.wait(["late"]); r["wait"] = s.get("late").decode()
try:
    s.wait(["never"], datetime.timedelta(seconds=0.5)); r["timeout"] = "no"
except Exception as e:
    r["timeout"] = type(e).__name__
r["after_timeout"] = s.get("x").decode()
s.queue_push("q", "i1"); r["qlen"] = s.queue_len("q"); r["qpop"] = s.queue_pop("q").decode()
r["keys"] = sorted(s.list_keys())
r["num_keys"] = s.num_keys()
big = bytes(range(256)) * (4 << 12)  # 4 MiB, in many TCP segments both ways
s.set("big", big); r["big"] = s.get("big") == big and s.multi_get(["big", "x"])[0] == big
root = d.TCPStore("127.0.0.1", rport, is_master=False, timeout=T)
r["root_sees"] = root.get("x").decode()
print(json.dumps(r))
"""


def test_torch2_operations_through_the_proxy(proxied):
    _, rport, farm, port = proxied
    r = run_py("2", OPS2, port, rport)
    assert r["get"] == "1"
    assert r["add"] == [5, 3]
    assert (r["cas_ok"], r["cas_no"], r["cas_absent"]) == ("2", "2", "x")
    assert r["del"] == [True, False]
    assert r["mget"] == ["1", "2"] and r["append"] == "1z"
    assert r["check"] == [True, False]
    assert r["wait"] == "v" and r["timeout"] == "DistStoreError"
    assert r["after_timeout"] == "1z"  # the stream stayed in step after CANCEL_WAIT
    assert (r["qlen"], r["qpop"]) == (1, "i1")
    assert {"x", "y", "c", "late"} <= set(r["keys"])
    assert r["root_sees"] == "1z"
    assert r["big"]
    rc, st = farm.stop()
    assert rc == 0 and st["dropped"] == 0
    assert st["passthrough"] == 1  # the queue ops moved that one client
    assert st["local_replies"] >= 3  # VALIDATE, PING and CANCEL_WAIT answered here


OPS1 = r"""
import datetime, json, sys, threading, time
import torch.distributed as d
port = int(sys.argv[1])
T = datetime.timedelta(seconds=30)
s = d.TCPStore("127.0.0.1", port, is_master=False, timeout=T)
r = {}
s.set("a", "1"); r["get"] = s.get("a").decode()
r["add"] = s.add("c", 7)
r["cas"] = s.compare_set("a", "1", "2").decode()
r["del"] = s.delete_key("a")
r["num_keys"] = s.num_keys()
def late():
    s2 = d.TCPStore("127.0.0.1", port, is_master=False, timeout=T)
    time.sleep(0.3)
    s2.set("late1", "w")
threading.Thread(target=late).start()
s.wait(["late1"]); r["wait"] = s.get("late1").decode()
print(json.dumps(r))
"""


def test_torch113_operations_through_the_proxy(proxied):
    _, _, farm, port = proxied
    r = run_py("1", OPS1, port)
    assert r == {"get": "1", "add": 7, "cas": "2", "del": True, "num_keys": r["num_keys"],
                 "wait": "w"}
    assert r["num_keys"] == 1  # "c" (after "a" was deleted)
    rc, st = farm.stop()
    assert rc == 0 and st["dropped"] == 0 and st["passthrough"] == 0
    # 1.13 opens a second, idle (watch callback) connection per store object.
    assert st["accepted"] == 4


WAITERS = r"""
import datetime, json, sys, threading
import torch.distributed as d
port, n = int(sys.argv[1]), int(sys.argv[2])
T = datetime.timedelta(seconds=60)
stores = [d.TCPStore("127.0.0.1", port, is_master=False, timeout=T) for _ in range(n)]
got = []
def w(s):
    s.add("ready", 1)
    s.wait(["go"])
    got.append(s.get("go").decode())
ts = [threading.Thread(target=w, args=(s,)) for s in stores]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps(got))
"""

SETTER = r"""
import datetime, sys, time
import torch.distributed as d
port, n = int(sys.argv[1]), int(sys.argv[2])
s = d.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
while s.add("ready", 0) < n:
    time.sleep(0.02)
time.sleep(0.5)  # let the last ADDer reach its WAIT (no correctness depends on it)
s.set("go", "now")
"""


def test_many_waiters_of_both_dialects_released_by_one_set(proxied, procs):
    _, _, farm, port = proxied
    n = 12
    w2 = procs.spawn([torch_python("2"), "-c", WAITERS, str(port), str(n)])
    w1 = procs.spawn([torch_python("1"), "-c", WAITERS, str(port), str(n)])
    run_py("2", SETTER + "\nprint('{}')", port, 2 * n)
    for p in (w1, w2):
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err.decode()[-3000:]
        assert json.loads(out.decode().splitlines()[-1]) == ["now"] * n
    rc, st = farm.stop()
    assert rc == 0
    assert st["waits"] >= 2 * n
    # Waits that found "go" missing shared upstream WAITs: one per distinct
    # key list pending at a time, never one per waiter.
    assert st["upstream_waits"] < n, st


KILLED = r"""
import datetime, sys
import torch.distributed as d
s = d.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
               timeout=datetime.timedelta(seconds=120))
s.add("victim_ready", 1)
s.wait(["k_never_before_kill"])
"""


def test_a_client_killed_mid_wait_leaves_the_others_working(proxied, procs):
    _, _, farm, port = proxied
    victim = procs.spawn([torch_python("2"), "-c", KILLED, str(port)])
    code = r"""
import datetime, json, sys, time
import torch.distributed as d
s = d.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
               timeout=datetime.timedelta(seconds=60))
while s.add("victim_ready", 0) < 1:
    time.sleep(0.02)
print(json.dumps("ready"), flush=True)
sys.stdin.readline()
s.set("k_never_before_kill", "1")
s2 = d.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
                timeout=datetime.timedelta(seconds=60))
s2.wait(["k_never_before_kill"])
print(json.dumps(s2.get("k_never_before_kill").decode()))
"""
    other = procs.spawn([torch_python("2"), "-c", code, str(port)], stdin=subprocess.PIPE)
    assert json.loads(other.stdout.readline()) == "ready"
    time.sleep(0.3)  # the victim's WAIT follows its ADD; either order is fine below
    victim.kill()
    victim.wait(timeout=10)
    other.stdin.write(b"go\n")
    other.stdin.flush()
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err.decode()[-3000:]
    assert json.loads(out.decode().splitlines()[-1]) == "1"
    rc, st = farm.stop()
    assert rc == 0 and st["dropped"] == 0


def v2_conn(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + struct.pack("<I", 77))
    assert s.recv(4) == struct.pack("<I", 77)
    return s


def test_a_malformed_frame_closes_that_client_only(proxied):
    _, _, farm, port = proxied
    good = v2_conn(port)
    bad = v2_conn(port)
    # SET with a key length of 2^40: over the key limit, refused before its bytes.
    bad.sendall(b"\x01" + struct.pack("<Q", 1 << 40))
    assert bad.recv(16) == b""
    # The other client still gets answers: ADD "k" +2.
    good.sendall(b"\x04" + struct.pack("<Q", 1) + b"k" + struct.pack("<q", 2))
    assert struct.unpack("<q", good.recv(8))[0] == 2
    good.close()
    bad.close()
    rc, st = farm.stop()
    assert rc == 0 and st["dropped"] == 1


def test_losing_the_store_closes_every_local_client(proxied, procs):
    root, _, farm, port = proxied
    code = r"""
import datetime, json, sys, time
import torch.distributed as d
s = d.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
               timeout=datetime.timedelta(seconds=100))
s.set("up", "1")
print(json.dumps("waiting"), flush=True)
t = time.monotonic()
try:
    s.wait(["never"])
    print(json.dumps("woke"))
except Exception as e:
    print(json.dumps([type(e).__name__, time.monotonic() - t < 60]))
"""
    waiter = procs.spawn([torch_python("2"), "-c", code, str(port)])
    assert json.loads(waiter.stdout.readline()) == "waiting"
    raw = v2_conn(port)
    time.sleep(0.3)
    root.kill()
    out, err = waiter.communicate(timeout=90)
    name, early = json.loads(out.decode().splitlines()[-1])
    assert early, "the client only noticed at its own timeout"
    assert name in ("DistNetworkError", "DistError", "RuntimeError", "DistStoreError"), name
    raw.settimeout(20)
    assert raw.recv(16) == b""
    raw.close()
    # The listener is gone too: new workers fail at once, as against a dead store.
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            time.sleep(0.05)
        except ConnectionRefusedError:
            break
    else:
        pytest.fail("the proxy still accepts connections after losing its store")
    rc, st = farm.stop()
    assert rc == 3  # the farm reports the lost upstream


# ---- upstream connections: one per proxy ----------------------------------------------

def established_to(port):
    """Established TCP connections whose local port is `port` (the server's
    side of each), from /proc/net/tcp{,6}: what the root holds."""
    n = 0
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(f).read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for ln in lines:
            fields = ln.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                n += 1
    return n


def v2_keys(op, *keys):
    return bytes([op]) + struct.pack("<Q", len(keys)) + b"".join(
        struct.pack("<Q", len(k)) + k for k in keys)


@pytest.mark.parametrize("ext", ["5", "4"])
def test_the_root_holds_one_connection_per_proxy(procs, tmp_path, ext):
    """A 64-rank storm (bench/storm: barrier, NCCL id) through 8 proxies,
    then two waits on distinct missing keys pending at every proxy. Against a
    store that offers MUX (extension version 5) a proxy keeps its waits on
    its one shared connection, so the root holds exactly 8; against
    `crun-rdzvd --ext-version 4` each pending wait has a connection of its
    own (the root holds 8 + 16), and both pass the same."""
    root, _, rport = start_rdzvd(procs, "--ext-version", ext)
    farm = Farm(procs, tmp_path, rport, n=8)
    argv = [os.path.join(BUILD, "bench", "storm"), "--ports-file", str(farm.ports_file),
            "-n", "64", "--dialect", "v2", "--prefix", f"/conns{ext}/", "--timeout-ms", "60000"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and res["ok"] and res["done"] == 64, res
    waiters = []
    for i, port in enumerate(farm.ports):
        for j in range(2):
            w = v2_conn(port)
            w.sendall(v2_keys(6, f"hold{i}.{j}".encode()))  # WAIT
            waiters.append(w)
    want = 8 if ext == "5" else 8 + 16
    # The proxies send their WAITs as the requests arrive. Wait for the
    # count itself, not for "at least": a CI run under load read 25 of 24 on
    # its first look past 23 (one connection more, for a moment, whose owner
    # was not identified). The bound is only a hang guard.
    for _ in range(1200):
        held = established_to(rport)
        if held == want:
            break
        time.sleep(0.025)
    setter = v2_conn(rport)
    for i in range(8):
        for j in range(2):
            setter.sendall(b"\x01" + struct.pack("<Q", 7) + f"hold{i}.{j}".encode()
                           + struct.pack("<Q", 1) + b"1")  # SET
    for w in waiters:
        assert w.recv(1) == b"\x00"  # STOP_WAITING
        w.close()
    setter.close()
    rc, st = farm.stop()
    assert rc == 0 and st["dropped"] == 0, st
    assert held == want, (held, st)
    assert st["upstream_waits"] >= 16, st
    assert root.poll() is None


# ---- the end-to-end job -------------------------------------------------------------

def env_for(py, tmp):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k != "OMP_NUM_THREADS"}
    env.update(PYTHON_EXEC=py, TMPDIR=str(tmp), CRUN_LOG_LEVEL="info")
    return env


def run_two_agents(procs, run_id, env, extra, restart, timeout):
    """Two crun agents of a 2x2 c10d job with worker_store=proxy running
    launch_worker.py; every agent exits 0 and every rank reports ok in
    attempt `restart`. Returns [(rc, stdout, stderr)] per agent."""
    port = free_port()
    argv = [bin_path("crun"), "--nnodes=2", "--nproc-per-node=2", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={run_id}", *extra,
            "--rdzv_conf=worker_store=proxy,join_timeout=60", JOB]
    agents = [procs.spawn(argv, env=env) for _ in range(2)]
    results = []
    for p in agents:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail("crun did not finish in time")
        results.append((p.returncode, out.decode(errors="replace"), err.decode(errors="replace")))
    for rc, _, err in results:
        assert rc == 0, err[-3000:]
    oks = sorted(ln for _, out, _ in results for ln in out.splitlines()
                 if ln.startswith("launch_worker ok"))
    assert oks == [f"launch_worker ok rank={r} world=4 restart={restart}" for r in range(4)]
    return results


@pytest.mark.parametrize("version", ["1", "2"])
def test_two_agents_run_a_gloo_job_with_worker_store_proxy(procs, tmp_path, version):
    results = run_two_agents(procs, "proxyjob", env_for(torch_python(version), tmp_path), [],
                             0, 180)
    # Exactly one agent (not group rank 0) put a proxy in front of its workers.
    proxies = [err for _, _, err in results if "worker store proxy on 127.0.0.1:" in err]
    assert len(proxies) == 1, [e[-2000:] for _, _, e in results]
    # ...and its two workers did reach the store through it.
    m = re.search(r"worker store proxy: (\d+) connections, (\d+) requests", proxies[0])
    assert m and int(m.group(1)) >= 2 and int(m.group(2)) > 0, proxies[0][-2000:]


@pytest.mark.parametrize("version", ["1", "2"])
def test_a_restart_gets_a_fresh_proxy_and_passes(procs, tmp_path, version):
    # Rank 2 (group rank 1's node, whose workers use its proxy, or group
    # rank 0's, whichever drew which ticket) fails in attempt 0; attempt 1
    # needs a new proxy per node and a clean store, and passes everything.
    env = dict(env_for(torch_python(version), tmp_path), LAUNCH_FAIL_RANK="2",
               LAUNCH_FAIL_UNTIL_RESTART="1")
    results = run_two_agents(procs, "proxyrestart", env, ["--max_restarts=1"], 1, 240)
    # One proxy per attempt on the node that is not group rank 0.
    starts = sum(err.count("worker store proxy on 127.0.0.1:") for _, _, err in results)
    assert starts == 2, [e[-2000:] for _, _, e in results]


def test_a_bad_worker_store_value_exits_2_naming_the_key(procs):
    p = subprocess.run([bin_path("crun"), "--nnodes=1", "--rdzv_backend=c10d",
                        f"--rdzv_endpoint=127.0.0.1:{free_port()}",
                        "--rdzv_conf=worker_store=sideways", "/bin/true"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "worker_store=sideways" in p.stderr


# ---- across hosts (network namespaces) ------------------------------------------------

PROBE = os.path.join(HELPERS, "store_probe.py")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                    reason="network namespaces need root and iproute2")
def test_across_hosts_each_node_uses_its_proxy_and_outsiders_are_refused(procs, tmp_path):
    """Hosts 1 and 2 run a job with worker_store=proxy: group rank 0's
    workers reach its store, the other node's workers their own node's
    proxy (MASTER_ADDR = that node's address); host 3 cannot use the proxy."""
    from test_elastic_netns import Net
    net = Net(3, 13)
    try:
        out = tmp_path / "rec"
        out.mkdir()
        env = env_for("/usr/bin/python3", tmp_path)
        ps = [procs.spawn(["ip", "netns", "exec", net.ns[i], bin_path("crun"), "--nnodes=2",
                           "--nproc_per_node=1", "--rdzv_backend=c10d",
                           f"--rdzv_endpoint={net.addr[0]}:29400", "--rdzv_id=proxynet",
                           "--rdzv_conf=worker_store=proxy,join_timeout=60,read_timeout=5",
                           PROBE, "--worker", str(out), "6"], env=env) for i in (0, 1)]
        deadline = time.monotonic() + 90
        recs = []
        while time.monotonic() < deadline and len(recs) < 2:
            recs = [json.loads(f.read_text()) for f in out.glob("*.json")]
            time.sleep(0.1)
        assert len(recs) == 2, recs
        assert {r["probe"] for r in recs} == {"accepted"}, recs
        # Each worker's MASTER_ADDR is its own node's address: the real
        # store on group rank 0's node, the proxy on the other.
        assert sorted(r["MASTER_ADDR"] for r in recs) == sorted(net.addr[:2]), recs
        assert len({r["MASTER_PORT"] for r in recs}) == 2, recs
        # Host 3 is neither in the round nor local to the proxy's node:
        # refused by the real store and by the proxy alike.
        for r in recs:
            probe = subprocess.run(["ip", "netns", "exec", net.ns[2], sys.executable, PROBE,
                                    r["MASTER_ADDR"], r["MASTER_PORT"]],
                                   capture_output=True, text=True, timeout=60)
            assert probe.stdout.startswith("refused"), (r, probe.stdout, probe.stderr)
        errs = []
        for p in ps:
            try:
                _, err = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                pytest.fail("crun did not finish in time")
            errs.append(err.decode(errors="replace"))
            assert p.returncode == 0, errs[-1][-3000:]
        proxies = [m for e in errs
                   for m in re.findall(r"worker store proxy on (\S+):(\d+) to", e)]
        assert len(proxies) == 1, [e[-2000:] for e in errs]
        assert {"MASTER_ADDR": proxies[0][0], "MASTER_PORT": proxies[0][1]}.items() <= \
            next(r for r in recs if r["MASTER_PORT"] == proxies[0][1]).items(), (proxies, recs)
    finally:
        net.close()
