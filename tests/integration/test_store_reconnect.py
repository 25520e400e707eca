"""Store faults that are not node failures (issue 8, items 4 and 5), with real
crun agents on 127.0.0.1. A transient reset of the agents' connections to the
rendezvous store (item 5). `ss -K` destroys the sockets to the store's
port with a RST, as a middlebox or a NIC reset would; the agents' store
clients redial, redo the greeting and re-attach their leases by id, and the
job finishes with its first world: no re-rendezvous, no restart, exit 0.
Before the store client reconnected, the first reset made each agent's lease
monitor fail and every agent exit 1. And the store host SIGSTOPped past the
lease TTL (item 4): on resume no healthy peer is evicted.

The reset test needs `ss -K` (root and CONFIG_INET_DIAG_DESTROY); it is
skipped where that cannot destroy a loopback socket. No wall-clock bound is
asserted."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import HELPERS, Output, bin_path, free_port, records, release_workers, wait_records

TASK = os.path.join(HELPERS, "elastic_task.py")
PY = "/usr/bin/python3"
CONF = "--rdzv_conf=last_call_timeout=1,heartbeat_interval=0.3,lease_ttl=3,join_timeout=60"


def ss_kill(port):
    """Destroys every TCP socket whose peer is 127.0.0.1:port (the clients'
    ends); the kernel sends a RST to the server's end."""
    return subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", str(port)],
                          capture_output=True, timeout=10).returncode


def clients_connected(port, timeout=60):
    """Waits (bounded) until some client has a connection to 127.0.0.1:port
    again: the store clients redialled after a reset."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["ss", "-Htn", "state", "established", "dst", "127.0.0.1",
                              "dport", "=", str(port)], capture_output=True, timeout=10)
        if out.stdout.strip():
            return
        time.sleep(0.05)
    pytest.fail(f"no client reconnected to the store on port {port}")


def ss_kill_works():
    if not shutil.which("ss"):
        return False
    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(1)
    cli = socket.create_connection(lsn.getsockname(), timeout=5)
    srv, _ = lsn.accept()
    try:
        ss_kill(lsn.getsockname()[1])
        srv.settimeout(5)
        try:
            return srv.recv(1) == b""
        except (ConnectionResetError, socket.timeout):
            return True
    finally:
        for s in (cli, srv, lsn):
            s.close()


@pytest.fixture
def out():
    d = tempfile.mkdtemp(prefix="crun-reconnect-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def crun_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k not in ("OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE")}
    env["PYTHON_EXEC"] = PY
    return env


def agent(procs, port, job, secs, out):
    argv = [bin_path("crun"), "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={job}", CONF, "--max_restarts=0",
            TASK, "run", out, str(secs)]
    return procs.spawn(argv, env=crun_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_resetting_the_store_connections_is_not_a_node_failure(procs, out):
    if not ss_kill_works():
        pytest.skip("ss -K cannot destroy sockets here")
    port = free_port()
    # The workers run until the resets are done (release_workers).
    host = agent(procs, port, "reset", 60, out)
    outs = [Output(host).wait_for("serving the rendezvous store")]
    other = agent(procs, port, "reset", 60, out)
    outs.append(Output(other))
    assert wait_records(out, lambda r: r["WORLD_SIZE"] == "4", "WORLD_SIZE=4")
    wait_records(out, lambda r: len(records(out)) >= 4, "4 workers")
    for _ in range(3):
        clients_connected(port)  # each reset hits connections the clients redialled
        ss_kill(port)
        # The stimulus, not an ordering wait: resets more than a heartbeat
        # (0.3 s) apart hit different requests. Back to back, the three hit
        # one parked WAIT, which the client sends at most 3 times: both
        # agents then lost the store ("connection aborted (sent 3 times)").
        time.sleep(0.5)
    clients_connected(port)
    release_workers(out)
    for o in outs:
        rc, _, err = o.finish()
        assert rc == 0, err[-3000:]
        assert "re-rendezvous" not in err and "dead" not in err, err[-3000:]
    recs = records(out)
    assert sorted(int(r["RANK"]) for r in recs) == [0, 1, 2, 3]  # one world, never restarted
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}


def test_a_store_host_stopped_past_the_ttl_evicts_no_one(procs, out):
    """The agent that serves the rendezvous store is SIGSTOPped for twice the
    lease TTL, then continued: its store measures the stall and extends every
    lease by it, so the healthy peer (which kept alive all along, its
    keep-alives queued in the kernel) is not declared dead, and nobody
    restarts. Before, the leases' timers fired on resume and evicted the
    peer: every worker restarted."""
    port = free_port()
    host = agent(procs, port, "stop", 8, out)
    host_out = Output(host).wait_for("serving the rendezvous store")
    other = agent(procs, port, "stop", 8, out)
    assert wait_records(out, lambda r: r["WORLD_SIZE"] == "4", "WORLD_SIZE=4")
    wait_records(out, lambda r: len(records(out)) >= 4, "4 workers")
    os.kill(host.pid, signal.SIGSTOP)
    # The stimulus itself: a stop longer than the lease TTL (3 s), not an
    # ordering wait.
    time.sleep(6)
    os.kill(host.pid, signal.SIGCONT)
    for o in (host_out, Output(other)):
        rc, _, err = o.finish()
        assert rc == 0, err[-3000:]
        assert "re-rendezvous" not in err and "dead" not in err, err[-3000:]
    recs = records(out)
    assert sorted(int(r["RANK"]) for r in recs) == [0, 1, 2, 3]
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
