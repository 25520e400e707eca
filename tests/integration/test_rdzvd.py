"""crun-rdzvd against real PyTorch TCPStore clients, both dialects: Debian's
torch 1.13 (v1) and the venv's torch 2.x (v2). Every op each client API has,
blocking get woken by another client, wait timeouts, many clients, PrefixStore,
mixed versions on one key space; and the daemon itself: --help, bad flags,
signals, limits, and a garbage frame that closes only its own connection.
"""
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import time

import pytest

from conftest import (HELPERS, Procs, bin_path, free_port, records, start_rdzvd, torch_python,
                      wait_line, wait_until)

CLIENT = os.path.join(HELPERS, "rdzvd_torch_client.py")
VERSIONS = ["1", "2"]


# One `rdzvd_torch_client.py serve` per version for the module: importing
# PyTorch (1-3 s of CPU) once instead of for every request; each request still
# makes its own TCPStore clients against the test's own crun-rdzvd.
_CLIENTS = {}


@pytest.fixture(autouse=True, scope="module")
def _torch_clients():
    yield
    ps = Procs()
    ps.procs = list(_CLIENTS.values())
    _CLIENTS.clear()
    ps.cleanup()


def _drop_client(version):
    ps = Procs()
    ps.procs = [_CLIENTS.pop(version)]
    ps.cleanup()


def run_client(version, mode, host, port, *args, timeout=180):
    if version not in _CLIENTS:
        _CLIENTS[version] = subprocess.Popen(
            [torch_python(version), CLIENT, "serve"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    p = _CLIENTS[version]
    p.stdin.write((json.dumps([mode, host, port, *map(str, args)]) + "\n").encode())
    p.stdin.flush()
    # os.read, not readline: select() cannot see lines already buffered.
    deadline, buf, rc = time.monotonic() + timeout, b"", None
    while rc is None and time.monotonic() < deadline:
        if not select.select([p.stdout], [], [], deadline - time.monotonic())[0]:
            break
        chunk = os.read(p.stdout.fileno(), 65536)
        if not chunk:
            break
        buf += chunk
        m = re.search(rb"(?:^|\n)END (-?\d+)\n", buf)
        if m:
            rc, buf = int(m.group(1)), buf[:m.start()]
    out = buf.decode(errors="replace")
    if rc != 0:
        _drop_client(version)  # the next request gets a fresh interpreter
    assert rc == 0 and "ALL OK" in out, (
        f"torch {version} client mode {mode} failed (rc={rc}, None: no answer within "
        f"{timeout}s or the client died):\n{out[-6000:]}")
    return out


def spawn_client(procs, version, mode, host, port, *args):
    py = torch_python(version)
    return procs.spawn([py, CLIENT, mode, host, str(port), *map(str, args)])


def raw(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, f"connection closed after {len(buf)} of {n} bytes"
        buf += chunk
    return buf


def assert_closed(s):
    try:
        assert s.recv(1) == b"", "expected the server to close this connection"
    except ConnectionResetError:
        pass


def v1_set(s, key, val):
    s.sendall(b"\x00" + struct.pack("<Q", len(key)) + key + struct.pack("<Q", len(val)) + val)


def v1_numkeys(s):
    s.sendall(b"\x06")
    return struct.unpack("<q", recv_exact(s, 8))[0]


# ---- PyTorch clients ----------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_every_client_op(rdzvd, version):
    _, host, port = rdzvd
    out = run_client(version, "ops", host, port)
    for name in ("set/get", "add", "compare_set", "num_keys/delete_key"):
        assert f"CHECK {name}" in out
    if version == "2":
        for name in ("check", "append", "multi_get/multi_set", "queue", "list_keys",
                     "barrier"):
            assert f"CHECK {name}" in out, f"torch 2.x lacks {name}? {out}"


@pytest.mark.parametrize("version", VERSIONS)
def test_blocking_get_is_woken_by_another_client(rdzvd, procs, version):
    _, host, port = rdzvd
    waiter = spawn_client(procs, version, "get", host, port, "late", 120)
    wait_line(waiter.stdout, r"WAITING", 120)
    # The waiter's TCPStore is connected and blocked in get(): set the key.
    run_client(version, "set", host, port, "late", "hello")
    m = wait_line(waiter.stdout, r"VALUE (\S+)", 60)
    assert m.group(1) == "hello"
    assert waiter.wait(timeout=60) == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_wait_timeouts(rdzvd, version):
    _, host, port = rdzvd
    out = run_client(version, "wait_timeout", host, port)
    assert "CHECK get timeout" in out
    if version == "2":
        assert "CHECK usable after timeout" in out


@pytest.mark.parametrize("version", VERSIONS)
def test_many_clients(rdzvd, version):
    _, host, port = rdzvd
    assert "CHECK 32 clients" in run_client(version, "many", host, port, 32, timeout=300)


@pytest.mark.parametrize("version", VERSIONS)
def test_prefix_store(rdzvd, version):
    _, host, port = rdzvd
    run_client(version, "prefix", host, port)


def test_blocking_queue_pop_and_barrier_torch2(rdzvd):
    _, host, port = rdzvd
    out = run_client("2", "blocking_extras", host, port)
    assert "CHECK barrier of two" in out


def test_both_versions_share_one_key_space(rdzvd, procs):
    _, host, port = rdzvd
    waiter = spawn_client(procs, "2", "get", host, port, "from113", 120)
    wait_line(waiter.stdout, r"WAITING", 120)
    run_client("1", "set", host, port, "from113", "v1-dialect")
    assert wait_line(waiter.stdout, r"VALUE (\S+)", 60).group(1) == "v1-dialect"
    assert waiter.wait(timeout=60) == 0


# ---- the daemon -----------------------------------------------------------------

def test_help_documents_every_flag():
    out = subprocess.run([bin_path("crun-rdzvd"), "--help"], capture_output=True, text=True,
                         timeout=10)
    assert out.returncode == 0
    for flag in ("--host", "--port", "--max-key-bytes", "--max-value-bytes",
                 "--max-keys-per-request", "--max-conns", "--max-conn-buffer-bytes",
                 "--max-total-value-bytes", "--backlog", "--log-level", "--help",
                 "--version"):
        assert flag in out.stdout, flag
    ver = subprocess.run([bin_path("crun-rdzvd"), "--version"], capture_output=True,
                         text=True, timeout=10)
    assert ver.returncode == 0 and ver.stdout.startswith("crun-rdzvd ")


@pytest.mark.parametrize("argv,named", [
    (["--bogus"], "--bogus"),
    (["--port", "70000"], "--port"),
    (["--port", "x"], "--port"),
    (["--max-conns", "0"], "--max-conns"),
    (["--max-key-bytes", "-1"], "--max-key-bytes"),
    (["--log-level", "loud"], "--log-level"),
    (["--port"], "--port"),
    (["stray"], "stray"),
])
def test_bad_flag_exits_2_naming_it(argv, named):
    out = subprocess.run([bin_path("crun-rdzvd"), *argv], capture_output=True, text=True,
                         timeout=10)
    assert out.returncode == 2, out
    assert named in out.stderr, out.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_0_after_closing_clients(procs, sig):
    p, _, port = start_rdzvd(procs)
    clients = [raw(port) for _ in range(3)]
    v1_set(clients[0], b"/k", b"v")
    assert v1_numkeys(clients[0]) == 1
    p.send_signal(sig)
    assert p.wait(timeout=10) == 0
    for c in clients:
        assert_closed(c)
        c.close()


def test_busy_port_exits_1(procs, rdzvd):
    _, _, port = rdzvd
    out = subprocess.run([bin_path("crun-rdzvd"), "--host", "127.0.0.1", "--port", str(port)],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 1
    assert str(port) in out.stderr


def test_port_flag_binds_that_port(procs):
    port = free_port()
    p = procs.spawn([bin_path("crun-rdzvd"), "--host", "127.0.0.1", "--port", str(port)])
    m = wait_line(p.stdout, r"crun-rdzvd listening on (\S+):(\d+)", 10)
    assert m.group(1) == "127.0.0.1" and int(m.group(2)) == port
    s = raw(port)
    assert v1_numkeys(s) == 0
    s.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_garbage_frame_closes_only_that_connection(rdzvd, procs, version):
    p, host, port = rdzvd
    waiter = spawn_client(procs, version, "get", host, port, "after-garbage", 120)
    wait_line(waiter.stdout, r"WAITING", 120)
    bad = raw(port)
    bad.sendall(b"\x00\xce\xf7\x85\x3c\x63garbage")  # v2 handshake, then no such op
    assert_closed(bad)
    bad.close()
    bad = raw(port)
    bad.sendall(b"\xee" * 16)  # no such op in v1
    assert_closed(bad)
    bad.close()
    run_client(version, "set", host, port, "after-garbage", "still-served")
    assert wait_line(waiter.stdout, r"VALUE (\S+)", 60).group(1) == "still-served"
    assert waiter.wait(timeout=60) == 0
    assert p.poll() is None


def test_limits_from_flags_close_the_offender(procs):
    p, host, port = start_rdzvd(procs, "--max-key-bytes", "16", "--max-conns", "3")
    good = raw(port)
    v1_set(good, b"/0123456789abcde", b"ok")
    bad = raw(port)
    v1_set(bad, b"/0123456789abcdef", b"too long")
    assert_closed(bad)
    bad.close()
    assert v1_numkeys(good) == 1
    # max-conns 3: good + two more; the fourth is closed at accept.
    extra = [raw(port), raw(port)]
    assert v1_numkeys(extra[1]) == 1
    over = raw(port)
    assert_closed(over)
    over.close()
    assert v1_numkeys(good) == 1
    for s in extra + [good]:
        s.close()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 0
    err = p.stderr.read().decode()
    assert "dropping client 127.0.0.1:" in err, err
    assert "max_conns" in err, err


def test_every_interface_is_dual_stack(procs):
    # Serving beyond loopback without a secret needs --insecure (test_security.py).
    p = procs.spawn([bin_path("crun-rdzvd"), "--host", "", "--insecure", "--port", "0"])
    port = int(wait_line(p.stdout, r"crun-rdzvd listening on \S+:(\d+)", 10).group(1))
    s = raw(port)
    assert v1_numkeys(s) == 0
    s.close()
    if socket.has_ipv6:
        try:
            s6 = socket.create_connection(("::1", port), timeout=10)
        except OSError:
            return  # no IPv6 loopback on this machine: the IPv4 fallback was checked
        s6.sendall(b"\x06")
        assert recv_exact(s6, 8) == b"\0" * 8
        s6.close()


def test_notify_socket_gets_ready(procs, tmp_path):
    path = str(tmp_path / "notify.sock")
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(path)
    ns.settimeout(10)
    try:
        p = procs.spawn([bin_path("crun-rdzvd"), "--host", "127.0.0.1", "--port", "0"],
                        env={**os.environ, "NOTIFY_SOCKET": path})
        wait_line(p.stdout, r"crun-rdzvd listening on", 10)
        assert ns.recv(64) == b"READY=1"
    finally:
        ns.close()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_holds_10k_idle_connections_in_little_memory(procs):
    """The benchmark goal, as a check: 10,000 idle clients (half silent v1
    callback connections, half v2 after VALIDATE + PING) under 64 MB RSS."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    n = min(10000, hard - 256)
    if soft < n + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 256), hard))
    p, _, port = start_rdzvd(procs)
    conns = []
    try:
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i % 2:
                s.sendall(b"\x00\xce\xf7\x85\x3c\x0d\x01\x00\x00\x00")
            conns.append(s)
        for s in conns[1::2]:
            assert recv_exact(s, 4) == b"\x01\x00\x00\x00"
        probe = raw(port)
        v1_set(probe, b"/still", b"here")
        assert v1_numkeys(probe) == 1
        probe.close()
        rss = rss_kib(p.pid)
        assert rss < 64 * 1024, f"{n} idle connections took {rss} KiB"
        print(f"{n} idle connections: crun-rdzvd RSS {rss} KiB")
    finally:
        for s in conns:
            s.close()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 0


# ---- crun-rdzvd restarted while a round forms (issue 28, item 2) ---------------------------

TASK = os.path.join(HELPERS, "elastic_task.py")
# A last call long enough that the round is still open when the test kills
# crun-rdzvd on its event (it closes 3 s after MIN joined, not before).
RESTART_CONF = ("--rdzv_conf=heartbeat_interval=0.3,lease_ttl=1.5,last_call_timeout=3,"
                "join_timeout=30")


class Agent:
    """A crun agent of the restart tests; its stderr goes to a file the test
    reads for the agent's events."""

    def __init__(self, procs, d, name, port, nnodes, task_args):
        self.log = os.path.join(d, f"{name}.err")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PET_") and k != "TORCHELASTIC_ERROR_FILE"}
        env["PYTHON_EXEC"] = "/usr/bin/python3"
        with open(self.log, "wb") as f:
            self.p = procs.spawn(
                [bin_path("crun"), f"--nnodes={nnodes}", "--nproc_per_node=1",
                 "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                 "--rdzv_id=rdzvd-restart", RESTART_CONF, "--max_restarts=1",
                 TASK, "run", *task_args], stderr=f, env=env)

    def text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def finish(self, timeout=60):
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"agent did not finish: {self.text()[-3000:]}")


def joined(agent, rnd):
    return re.search(rf"joined rendezvous '\S+' round {rnd} as ticket \d+", agent.text())


def restart_rdzvd(procs, rd, port, while_down=None):
    """Kills crun-rdzvd (-9: no goodbye) and starts a new, empty one on its
    port, as systemd's Restart= would (once while_down() says so)."""
    rd.kill()
    rd.wait(timeout=10)
    if while_down:
        while_down()
    p = procs.spawn([bin_path("crun-rdzvd"), "--host", "127.0.0.1", "--port", str(port)])
    wait_line(p.stdout, r"crun-rdzvd listening on", 10)
    return p, time.monotonic()


@pytest.mark.parametrize("when", ["job start", "job start, down a while", "round after a failure",
                                  "scale-up"])
def test_rdzvd_restart_while_a_round_forms(procs, tmp_path, when):
    """crun-rdzvd is killed and started again (empty) on its port while a round
    is open: at the job's start (A joined, B not started yet), in the round
    after a worker failure (attempt 1), and in the round a late third node
    opened; and at the job's start with the daemon down until A said so
    (longer than the client's own redial). The agents whose lease the new
    store does not know take a new one, join the round the store now has,
    and the job forms and finishes 0 with the attempt it had. (Before: they
    waited in the forgotten round and every agent exited 1 at join_timeout;
    A exited 1 at once when the daemon stayed down past its redial.)"""
    rd, _, port = start_rdzvd(procs)
    out = tmp_path / "out"
    out.mkdir()
    secs = ["60"]
    if when == "round after a failure":
        secs += ["0", "1"]  # rank 0 fails in attempt 0 only
    # MAX above the nodes the round gets: it closes by its last call only
    nnodes = "2" if when.startswith("job start") else "2:4"
    a = Agent(procs, tmp_path, "A", port, nnodes, [str(out), *secs])
    agents = [a]

    def outage_seen():
        wait_until(lambda: "does not answer" in a.text() or a.p.poll() is not None,
                 "A to notice the outage")
        assert a.p.poll() is None, a.text()[-3000:]
    if when.startswith("job start"):
        wait_until(lambda: joined(a, 0), "A to join round 0")
        rd, t_back = restart_rdzvd(procs, rd, port, outage_seen if "down" in when else None)
        agents.append(Agent(procs, tmp_path, "B", port, nnodes, [str(out), *secs]))
        want = {"WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0"}
    elif when == "round after a failure":
        agents.append(Agent(procs, tmp_path, "B", port, nnodes, [str(out), *secs]))
        wait_until(lambda: any(joined(x, 1) for x in agents), "a join of round 1")
        rd, t_back = restart_rdzvd(procs, rd, port)
        want = {"WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "1"}
    else:
        agents.append(Agent(procs, tmp_path, "B", port, nnodes, [str(out), *secs]))
        wait_until(lambda: len(records(str(out))) >= 2, "the first round's workers")
        agents.append(Agent(procs, tmp_path, "C", port, nnodes, [str(out), *secs]))
        wait_until(lambda: joined(agents[2], 1), "C to join round 1")
        rd, t_back = restart_rdzvd(procs, rd, port)
        want = {"WORLD_SIZE": "3", "TORCHELASTIC_RESTART_COUNT": "0"}
    n = int(want["WORLD_SIZE"])

    def formed():
        recs = [r for r in records(str(out)) if all(r[k] == v for k, v in want.items())]
        return sorted(int(r["RANK"]) for r in recs) == list(range(n))
    wait_until(formed, lambda: f"a round with {want} after the restart: "
             + " | ".join(x.text()[-1500:] for x in agents), timeout=45)
    print(f"{when}: the round formed {time.monotonic() - t_back:.2f} s after crun-rdzvd "
          "was back")
    # The restart hit the open round (not one that had closed already).
    assert any("the store forgot round" in x.text() for x in agents), \
        " | ".join(x.text()[-1500:] for x in agents)
    open(out / "go", "w").close()
    for x in agents:
        assert x.finish() == 0, x.text()[-3000:]
    rd.send_signal(signal.SIGTERM)
    assert rd.wait(timeout=10) == 0
