"""Security of crun's stores (store/auth.h): crun-rdzvd's secure defaults,
the HMAC challenge in front of every crun-to-crun store, per-job secrets on
one crun-rdzvd, and the two attacks of the security issue against a running
c10d job - first shown to work on an unauthenticated job, then shown to fail
(from an unauthenticated client and from a client authenticated for another
job) while the job finishes.

The intruder is tests/integration/helpers/crunwire.py: raw TCPStore v2 bytes
plus the auth exchange, so it sends exactly what an attacker would. No test
asserts a wall-clock bound."""
import os
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest

import ssl
import sys

from conftest import (BUILD, HELPERS, bin_path, free_port, records, release_workers,
                      start_rdzvd, wait_line, wait_records)

sys.path.insert(0, HELPERS)
import certs as certgen  # noqa: E402
import crunwire  # noqa: E402

STORE_CLI = os.path.join(BUILD, "tests", "helpers", "store_cli")

TASK = os.path.join(HELPERS, "elastic_task.py")
PY = "/usr/bin/python3"
CONF = "--rdzv_conf=last_call_timeout=1,heartbeat_interval=0.3,lease_ttl=1.5,join_timeout=60"
EVIL_ADDR = "10.99.99.99"


@pytest.fixture
def tmp():
    d = tempfile.mkdtemp(prefix="crun-sec-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def secret_file(path, mode=0o600):
    with open(path, "wb") as f:
        f.write(os.urandom(24).hex().encode() + b"\n")
    os.chmod(path, mode)
    return path


def read_secret(path):
    return open(path, "rb").read().rstrip(b"\r\n")


def crun_env(tmpdir, secret=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k not in ("OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE",
                                                      "CRUN_AUTH_SECRET_FILE")}
    env["PYTHON_EXEC"] = PY
    env["TMPDIR"] = tmpdir
    if secret:
        env["CRUN_AUTH_SECRET_FILE"] = secret
    return env


def agent(procs, port, job, out, secs, tmpdir, secret=None, extra=(), by_flag=False):
    """One crun agent of a 2-node c10d job; the secret comes from
    CRUN_AUTH_SECRET_FILE, or with by_flag from --auth_secret_file."""
    if by_flag and secret:
        extra = [f"--auth_secret_file={secret}", *extra]
    argv = [bin_path("crun"), "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={job}", CONF, *extra,
            TASK, "run", out, str(secs)]
    return procs.spawn(argv, env=crun_env(tmpdir, None if by_flag else secret))


def finish(p, timeout=120):
    try:
        o, e = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail("crun agent did not finish in time")
    return p.returncode, o.decode(errors="replace"), e.decode(errors="replace")


# ---- crun-rdzvd's secure defaults ------------------------------------------------

def test_rdzvd_binds_loopback_by_default(procs):
    p = procs.spawn([bin_path("crun-rdzvd"), "--port", "0"])
    m = wait_line(p.stdout, r"crun-rdzvd listening on (\S+):(\d+)", 10)
    assert m.group(1) == "127.0.0.1"


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::"])
def test_rdzvd_refuses_every_interface_without_a_secret(host):
    out = subprocess.run([bin_path("crun-rdzvd"), "--host", host, "--port", "0"],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 2, out
    assert "without authentication" in out.stderr and "--insecure" in out.stderr, out.stderr


def test_rdzvd_serves_every_interface_with_a_secret_or_insecure(procs, tmp):
    sec = secret_file(os.path.join(tmp, "s"))
    for extra in (["--auth-secret-file", sec], ["--insecure"]):
        p = procs.spawn([bin_path("crun-rdzvd"), "--host", "0.0.0.0", "--port", "0", *extra])
        wait_line(p.stdout, r"crun-rdzvd listening on", 10)
        p.terminate()
        p.wait(10)


def test_rdzvd_rejects_a_readable_or_short_secret(tmp):
    loose = secret_file(os.path.join(tmp, "loose"), 0o644)
    short = os.path.join(tmp, "short")
    with open(short, "w") as f:
        f.write("abc\n")
    os.chmod(short, 0o600)
    for flag, path, why in (("--auth-secret-file", loose, "accessible by group or others"),
                            ("--auth-secret-file", short, "shorter than 16"),
                            ("--auth-secrets-dir", tmp, "auth secret file")):
        out = subprocess.run([bin_path("crun-rdzvd"), "--port", "0", flag, path],
                             capture_output=True, text=True, timeout=20)
        assert out.returncode == 2, out
        assert flag in out.stderr and why in out.stderr, out.stderr


# ---- the gate ------------------------------------------------------------------------

def test_gate_on_rdzvd(procs, tmp):
    sec = secret_file(os.path.join(tmp, "s"))
    p, _, port = start_rdzvd(procs, "--auth-secret-file", sec)
    good = crunwire.Wire(port)
    good.auth(read_secret(sec), "j")
    good.hello()
    good.set("/k", "v")
    # Wrong secret: closed without a proof.
    bad = crunwire.Wire(port)
    with pytest.raises(crunwire.Closed):
        bad.auth(b"0" * 32, "j")
    # No secret: a PyTorch-style client's first frame closes it, unanswered.
    raw = crunwire.Wire(port)
    raw.challenge()
    raw.s.sendall(crunwire.VALIDATE + bytes([1]) + crunwire.b("/k") + crunwire.b("evil"))
    assert raw.closed()
    # A replayed answer.
    rec = crunwire.Wire(port)
    frame = rec.auth(read_secret(sec), "j")
    rep = crunwire.Wire(port)
    rep.challenge()
    rep.s.sendall(frame)
    assert rep.closed()
    assert good.get("/k") == b"v"  # untouched
    p.terminate()
    err = p.communicate(timeout=10)[1].decode()
    assert err.count("dropping client 127.0.0.1:") >= 3, err


def test_crun_store_client_with_a_plain_server_fails_clearly(procs, tmp):
    """An agent with a secret against a store without one gives up with a
    message, it does not hang (the server never sends a challenge)."""
    _, _, port = start_rdzvd(procs)
    sec = secret_file(os.path.join(tmp, "s"))
    p = agent(procs, port, "plain", os.path.join(tmp), 1, tmp, secret=sec)
    rc, _, err = finish(p)
    assert rc != 0
    assert "rendezvous" in err, err[-2000:]


def stop_and_log(p):
    """SIGTERM a crun-rdzvd; its stderr (the server's log) once it exited."""
    p.terminate()
    return p.communicate(timeout=20)[1].decode(errors="replace")


@pytest.mark.parametrize("case,client_says,server_says", [
    ("no_secret", "authentication required", "authentication required"),
    ("wrong_secret", "wrong secret", "wrong secret for run id 'authj'"),
])
def test_an_agent_told_why_authentication_failed_on_both_sides(procs, tmp, case, client_says,
                                                               server_says):
    """Issue 22.1: a crun agent without the secret, or with another one,
    against crun-rdzvd that wants one: both sides name the cause, not
    "protocol error" / "permission denied"."""
    sec = secret_file(os.path.join(tmp, "s"))
    p, _, port = start_rdzvd(procs, "--auth-secret-file", sec)
    other = secret_file(os.path.join(tmp, "other")) if case == "wrong_secret" else None
    a = agent(procs, port, "authj", tmp, 1, tmp, secret=other,
              extra=["--rdzv_conf=join_timeout=20"])
    rc, _, err = finish(a)
    log = stop_and_log(p)
    assert rc != 0 and client_says in err, err[-2000:]
    assert "protocol error" not in err and "permission denied" not in err, err[-2000:]
    assert server_says in log, log


def test_a_pytorch_client_without_the_secret_sees_what_it_saw(procs, tmp):
    """Issue 22.1: the wording is crun's; the bytes a PyTorch 2.x client gets
    are unchanged (the challenge, read as a bad ping echo), and the server
    says the client had no secret."""
    torch2 = os.path.expanduser("~/.cache/crun/venv-torch2/bin/python")
    if not os.path.exists(torch2):
        pytest.skip(f"no PyTorch 2.x at {torch2}")
    sec = secret_file(os.path.join(tmp, "s"))
    p, _, port = start_rdzvd(procs, "--auth-secret-file", sec)
    code = ("import datetime, torch.distributed as d\n"
            f"d.TCPStore('127.0.0.1', {port}, is_master=False,"
            " timeout=datetime.timedelta(seconds=3))\n")
    out = subprocess.run([torch2, "-c", code], capture_output=True, text=True, timeout=120)
    log = stop_and_log(p)
    assert out.returncode != 0
    assert "Ping failed, invalid value returned from server" in out.stderr, out.stderr[-2000:]
    assert "authentication required" in log, log


# ---- two jobs on one crun-rdzvd ------------------------------------------------------

def secrets_dir(tmp, *jobs):
    d = os.path.join(tmp, "secrets")
    os.mkdir(d, 0o700)
    return d, {j: secret_file(os.path.join(d, j)) for j in jobs}


def test_two_jobs_with_their_own_secrets_share_one_rdzvd(procs, tmp):
    d, secs = secrets_dir(tmp, "jobA", "jobB")
    _, _, port = start_rdzvd(procs, "--auth-secrets-dir", d)
    outs = {j: tempfile.mkdtemp(dir=tmp) for j in secs}
    ps = [agent(procs, port, j, outs[j], 2, tmp, secret=secs[j]) for j in secs for _ in range(2)]
    # While they run, a client of job A sees only job A.
    wait_records(outs["jobA"], lambda r: True, "a jobA worker")
    wait_records(outs["jobB"], lambda r: True, "a jobB worker")
    a = crunwire.Wire(port)
    a.auth(read_secret(secs["jobA"]), "jobA")
    a.hello()
    keys = a.list_keys()
    assert keys and all(k.startswith("/crun-c10d/jobA/") for k in keys), keys
    with pytest.raises(crunwire.Closed):
        a.get("/crun-c10d/jobB/round")
    # Job A's secret does not open job B.
    b = crunwire.Wire(port)
    with pytest.raises(crunwire.Closed):
        b.auth(read_secret(secs["jobA"]), "jobB")
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
    for j in secs:
        assert sorted(int(r["RANK"]) for r in records(outs[j])) == [0, 1]


# ---- the two attacks against a running c10d job -----------------------------

def current_round(w, pfx):
    return w.add(f"{pfx}/round", 0)


def attack_a(w, pfx):
    """Two SETs end the job: every agent exits 1 despite --max_restarts."""
    rd = current_round(w, pfx)
    try:
        w.set(f"{pfx}/closed", "failed: intruder")
        w.set(f"{pfx}/r{rd}/change", "failed")
    except crunwire.Closed:
        # The first SET alone ends the job, and with it the agent serving
        # the store, which may be gone before the PING that follows each
        # SET is answered (CI: 'closed after 0 of 4 bytes' on the first).
        # The caller proves the effect: every agent exits 1. An
        # authenticated store refuses this client before any SET (in
        # current_round), so the refusal still raises there.
        pass


def attack_b(w, pfx):
    """Hijack the next round: every worker restarts with the intruder's
    MASTER_ADDR and a phantom rank 0 (ticket 1, held by the intruder)."""
    rd = current_round(w, pfx)
    nxt = rd + 1
    assert w.cas(f"{pfx}/round", str(rd), str(nxt)) == str(nxt).encode()
    assert w.add(f"{pfx}/r{nxt}/joined", 1) == 1
    # The closed round (rendezvous/round_int.h): the two agents will draw
    # tickets 2 and 3, closer "1" (the intruder) placed them, and the
    # worker store the head names is the intruder's.
    w.set(f"{pfx}/r{nxt}/a/2", "0 0 2")
    w.set(f"{pfx}/r{nxt}/a/3", "1 1 2")
    w.set(f"{pfx}/r{nxt}/closed",
          '{"attempt":1,"by":1,"nodes":2,"ma":"%s","mp":29999,"sh":""}' % EVIL_ADDR)
    w.set(f"{pfx}/r{rd}/change", "restart intruder")


ATTACKS = {"A": attack_a, "B": attack_b}


def start_job(procs, tmp, port, job, secret=None, secs=6, by_flag=False):
    out = tempfile.mkdtemp(dir=tmp)
    ps = [agent(procs, port, job, out, secs, tmp, secret=secret, extra=["--max_restarts=3"],
                by_flag=by_flag) for _ in range(2)]
    wait_records(out, lambda r: True, "a running worker")
    return out, ps


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_works_on_an_unauthenticated_job(procs, tmp, name):
    """The baseline: without a secret each attack succeeds (why auth exists)."""
    port = free_port()
    out, ps = start_job(procs, tmp, port, "victim")
    w = crunwire.Wire(port)
    w.hello()
    ATTACKS[name](w, "/crun-c10d/victim")
    if name == "A":
        res = [finish(p) for p in ps]
        assert all(rc == 1 for rc, _, _ in res), [e[-1500:] for _, _, e in res]
    else:
        wait_records(out, lambda r: r["MASTER_ADDR"] == EVIL_ADDR, "the intruder's MASTER_ADDR")
        # Shown: the hijacked workers would now wait on the intruder's store
        # until their own timeouts; the procs fixture stops them.


def attacker(kind, port, secs):
    w = crunwire.Wire(port)
    if kind == "other-job":
        w.auth(read_secret(secs["other"]), "other")
    else:
        w.challenge()
    w.hello()
    return w


@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.parametrize("kind", ["unauthenticated", "other-job", "agent-hosted"])
def test_attack_fails_on_an_authenticated_job(procs, tmp, name, kind):
    d, secs = secrets_dir(tmp, "victim", "other")
    if kind == "agent-hosted":
        port = free_port()  # the first agent serves the store, with the secret
    else:
        _, _, port = start_rdzvd(procs, "--auth-secrets-dir", d)
    # The agent-hosted variant takes the secret by flag, the others by env.
    out, ps = start_job(procs, tmp, port, "victim", secret=secs["victim"],
                        by_flag=kind == "agent-hosted")
    w = attacker("other-job" if kind == "other-job" else "unauthenticated", port, secs)
    with pytest.raises(crunwire.Closed):
        ATTACKS[name](w, "/crun-c10d/victim")
    # Refused while the job ran. A write that got through would still show
    # below: a restarted worker's record, or an exit barrier that fails.
    release_workers(out)
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
    recs = records(out)
    assert not [r for r in recs if r["MASTER_ADDR"] == EVIL_ADDR]
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    assert sorted(int(r["RANK"]) for r in recs) == [0, 1]


# Job "other"'s authenticated client against job "victim" through crun's
# store extension (issue 28 item 1): each op names a victim key in one of
# its key fields, its other keys are the intruder's own.
V, O = "/crun-c10d/victim", "/crun-c10d/other"
EXT_ATTACKS = {
    "TRY_GET reads the closed round": lambda w: w.try_get(f"{V}/r0/closed"),
    "WAIT_ANY learns a key exists": lambda w: w.wait_any([f"{O}/x", f"{V}/r0/closed"]),
    "WAIT_ANY_GET_WITH reads an assignment":
        lambda w: w.wait_any_get_with([f"{O}/x"], f"{V}/r0/a/1"),
    "TICKET bumps the round counter": lambda w: w.ticket(f"{V}/round", f"{O}/t", "x"),
    "TICKET writes under the victim": lambda w: w.ticket(f"{O}/n", f"{V}/closed", "x"),
    "GRANT_SET writes closed": lambda w: w.grant_set(60000, "", "", f"{V}/closed",
                                                     "failed: intruder"),
    "GRANT_SET's expiry writes closed": lambda w: w.grant_set(1, f"{V}/closed",
                                                              "failed: intruder", f"{O}/y", "v"),
}


def test_other_jobs_client_cannot_reach_a_job_through_the_extension(procs, tmp):
    d, secs = secrets_dir(tmp, "victim", "other")
    _, _, port = start_rdzvd(procs, "--auth-secrets-dir", d)
    out, ps = start_job(procs, tmp, port, "victim", secret=secs["victim"])
    own = attacker("other-job", port, secs)
    own.ext_hello()
    own.set(f"{O}/x", "1")  # the intruder's own key: the waits above wake on it
    got_through = {}
    for name, attack in EXT_ATTACKS.items():
        w = attacker("other-job", port, secs)
        w.ext_hello()
        try:
            got_through[name] = attack(w)
        except crunwire.Closed:
            pass
        w.close()
    # The intruder's own connection and keys are unaffected.
    assert own.try_get(f"{O}/x") == b"1"
    release_workers(out)
    ends = [finish(p) for p in ps]
    # Both verdicts at once: what got through, and what it did to the job.
    assert not got_through and all(rc == 0 for rc, _, _ in ends), \
        (got_through, [(rc, err[-1500:]) for rc, _, err in ends])
    recs = records(out)
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    assert sorted(int(r["RANK"]) for r in recs) == [0, 1]


def test_crun_warns_once_when_serving_an_open_store_beyond_loopback(procs, tmp):
    port = free_port()
    out = tempfile.mkdtemp(dir=tmp)
    argv = [bin_path("crun"), "--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=warn",
            CONF.replace("join_timeout=60", "join_timeout=60,is_host=1"), TASK, "run", out, "0"]
    rc, _, err = finish(procs.spawn(argv, env=crun_env(tmp)))
    assert rc == 0, err[-2000:]
    assert err.count("has no authentication") == 1, err
    sec = secret_file(os.path.join(tmp, "s"))
    rc, _, err = finish(procs.spawn(argv, env=crun_env(tmp, sec)))
    assert rc == 0, err[-2000:]
    assert "has no authentication" not in err, err


# ---- TLS -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def certs():
    d = tempfile.mkdtemp(prefix="crun-certs-")
    yield certgen.make(d)
    shutil.rmtree(d, ignore_errors=True)


def tls_rdzvd(procs, certs, leaf="server", *extra):
    cert, key = certs[leaf]
    return start_rdzvd(procs, "--tls-cert", cert, "--tls-key", key, *extra)


def cli(port, *args, timeout=30):
    """One store_cli connection: SET then GET; (connected, stdout, stderr)."""
    argv = [STORE_CLI, "--host", "127.0.0.1", "--port", str(port),
            "--connect-timeout-ms", "3000", *args]
    env = dict(os.environ, CRUN_LOG_LEVEL="info")
    out = subprocess.run(argv, input="set k v\nget k\n", capture_output=True, text=True,
                         timeout=timeout, env=env)
    return out.stdout.startswith("CONNECTED"), out.stdout, out.stderr


def client_cert(certs, name="client"):
    return ["--tls-cert", certs[name][0], "--tls-key", certs[name][1]]


def test_tls_good_handshake_and_mutual_tls(procs, certs):
    _, _, port = tls_rdzvd(procs, certs, "server", "--tls-ca", certs["ca"])
    ok, out, err = cli(port, "--tls-ca", certs["ca"], *client_cert(certs))
    assert ok and 'VAL "v"' in out, out + err
    # Mutual TLS: no client certificate, or one from another CA, is refused.
    ok, _, err = cli(port, "--tls-ca", certs["ca"])
    assert not ok and "certificate required" in err, err
    ok, _, err = cli(port, "--tls-ca", certs["ca"], *client_cert(certs, "foreign"))
    assert not ok and "TLS" in err, err


def test_mutual_tls_refusal_reaches_a_client_that_speaks_after_the_drop(procs, certs):
    """TLS 1.3 ends the client's handshake before the server checks its
    certificate, so a client without one speaks first and hears of the
    refusal after. The server must close so that its alert stays readable:
    a close with the client's records unread resets the connection, and the
    client's next send then fails with ECONNRESET instead of naming the
    cause (seen under load as "the server closed every connection")."""
    p, _, port = tls_rdzvd(procs, certs, "server", "--tls-ca", certs["ca"])
    ctx = ssl.create_default_context(cafile=certs["ca"])
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    raw = crunwire.Wire(port)
    s = ctx.wrap_socket(raw.s, server_hostname="127.0.0.1")
    try:
        # The event the race needs, on purpose: the server has dropped us.
        wait_line(p.stderr, r"dropping client .*TLS", 30)
        s.sendall(b"\x00" * 16)  # must not meet a reset
        with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED"):
            s.recv(1)
    finally:
        s.close()


@pytest.mark.parametrize("leaf,trust,why", [
    ("server", "other_ca", "not trusted"),          # wrong CA
    ("foreign", "ca", "not trusted"),               # server cert from another CA
    ("expired", "ca", "expired"),                   # expired server certificate
    ("wrong_name", "ca", "mismatch"),               # certificate for another name
])
def test_tls_bad_server_certificates_fail_clearly(procs, certs, leaf, trust, why):
    _, _, port = tls_rdzvd(procs, certs, leaf)
    ok, _, err = cli(port, "--tls-ca", certs[trust])
    assert not ok and why in err, err


def test_plaintext_client_on_a_tls_port_fails_clearly(procs, certs):
    p, _, port = tls_rdzvd(procs, certs)
    ok, out, err = cli(port)
    assert not ok and "ERR CRUN_EPROTO" in out
    assert "the server speaks TLS: set tls_ca" in err, err
    # A raw TCPStore client gets a TLS alert in the clear, then EOF; the daemon says why.
    w = crunwire.Wire(port)
    w.hello()
    assert w.recv_exact(2) == b"\x15\x03"
    w.recv_exact(5)
    assert w.closed()
    p.terminate()
    assert "wrong version number" in p.communicate(timeout=10)[1].decode()


def test_tls_client_on_a_plaintext_port_fails_clearly(procs, certs):
    _, _, port = start_rdzvd(procs)
    ok, _, err = cli(port, "--tls-ca", certs["ca"])
    assert not ok and "does not speak TLS (it answered in plaintext)" in err, err


@pytest.mark.parametrize("server,client,why", [
    ("tls+auth", "auth", "the server speaks TLS: set tls_ca"),
    ("tls", "plain", "the server speaks TLS: set tls_ca"),
    ("plain", "tls", "does not speak TLS (it answered in plaintext): remove tls_ca"),
    ("auth", "tls+auth", "does not speak TLS (it answered in plaintext): remove tls_ca"),
    ("plain", "auth", "the server requires no secret"),
])
def test_an_agent_configured_for_the_other_side_fails_at_once_naming_it(procs, certs, tmp,
                                                                       server, client, why):
    # issue 28 item 6: the join timeout is 600 s; the agent must end long before, with a
    # message naming the cause (finish()'s 120 s is the hang guard).
    sec = secret_file(os.path.join(tmp, "s"))
    args = ["--auth-secret-file", sec] if "auth" in server else []
    if "tls" in server:
        args += ["--tls-cert", certs["server"][0], "--tls-key", certs["server"][1]]
    _, _, port = start_rdzvd(procs, *args)
    conf = CONF.replace("join_timeout=60", "join_timeout=600")
    if "tls" in client:
        conf += f",tls_ca={certs['ca']}"
    p = agent(procs, port, "mismatch", tmp, 0, tmp, secret=sec if "auth" in client else None,
              extra=[conf])
    rc, _, err = finish(p)
    assert rc != 0
    assert f"127.0.0.1:{port}" in err and why in err, err[-2000:]


def test_tls_1_2_only_when_allowed(procs, certs):
    _, _, port13 = tls_rdzvd(procs, certs)
    _, _, port12 = tls_rdzvd(procs, certs, "server", "--tls-min-version", "1.2")
    for port, works in ((port13, False), (port12, True)):
        ctx = ssl.create_default_context(cafile=certs["ca"])
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        raw = crunwire.Wire(port)
        try:
            s = ctx.wrap_socket(raw.s, server_hostname="127.0.0.1")
            assert works
            assert s.version() == "TLSv1.2"
        except ssl.SSLError:
            assert not works
    ok, out, err = cli(port12, "--tls-ca", certs["ca"], "--tls-min-version", "12")
    assert ok, out + err


def test_tls_and_auth_together_on_rdzvd(procs, certs, tmp):
    sec = secret_file(os.path.join(tmp, "s"))
    _, _, port = tls_rdzvd(procs, certs, "server", "--auth-secret-file", sec)
    ok, out, err = cli(port, "--tls-ca", certs["ca"], "--auth-secret-file", sec)
    assert ok and 'VAL "v"' in out, out + err
    ok, _, err = cli(port, "--tls-ca", certs["ca"])
    assert not ok


def test_c10d_job_over_mutual_tls_with_auth_resists_the_attacks(procs, certs, tmp):
    sec = secret_file(os.path.join(tmp, "s"))
    port = free_port()
    conf = (f"tls_cert={certs['server'][0]},tls_key={certs['server'][1]},"
            f"tls_ca={certs['ca']}")
    out = tempfile.mkdtemp(dir=tmp)
    ps = [agent(procs, port, "tlsjob", out, 4, tmp, secret=sec,
                extra=["--max_restarts=3", CONF + "," + conf]) for _ in range(2)]
    wait_records(out, lambda r: True, "a running worker")
    # A plaintext intruder is hung up on before it can send a store op.
    w = crunwire.Wire(port)
    w.hello()
    with pytest.raises(crunwire.Closed):
        attack_a(w, "/crun-c10d/tlsjob")
    release_workers(out)
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
    assert sorted(int(r["RANK"]) for r in records(out)) == [0, 1]


# ---- the worker SDK's TCP data mesh ------------------------------------------------------

def coll(procs, args, timeout=120):
    p = procs.spawn([os.path.join(BUILD, "tests", "helpers", "coll_launch"), *args])
    try:
        o, e = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail("coll_launch did not finish in time")
    return p.returncode, o.decode(errors="replace"), e.decode(errors="replace")


def test_mesh_with_the_secret_runs_collectives(procs, tmp):
    sec = secret_file(os.path.join(tmp, "s"))
    rc, out, err = coll(procs, ["-n", "3", "--timeout", "100", "--env", "CRUN_PG_TRANSPORT=tcp",
                                "--env", f"CRUN_AUTH_SECRET_FILE={sec}", "--",
                                os.path.join(BUILD, "tests", "helpers", "coll_worker"),
                                "matrix", "quick"])
    assert rc == 0, out[-2000:] + err[-2000:]
    assert len(re_oks(out)) == 3, out[-2000:]


def re_oks(out):
    import re
    return re.findall(r"coll_worker rank (\d+): ok \d+ checks", out)


def test_mesh_peer_without_the_secret_cannot_join(procs, tmp):
    """Two "nodes" of one rank each whose secrets differ: rank 1 cannot
    join rank 0's mesh (both fail, none hangs); with equal secrets they run."""
    s0 = secret_file(os.path.join(tmp, "s0"))
    s1 = secret_file(os.path.join(tmp, "s1"))
    worker = [os.path.join(BUILD, "tests", "helpers", "coll_worker"), "async"]
    launch = os.path.join(BUILD, "tests", "helpers", "coll_launch")
    for second, ok in ((s1, False), (s0, True)):
        common = ["--world", "2", "--master-addr", "127.0.0.1", "--timeout", "60",
                  "--env", "CRUN_PG_TRANSPORT=tcp", "--env", "CRUN_PG_TIMEOUT_MS=8000"]
        a = procs.spawn([launch, "-n", "1", "--rank-base", "0", "--agent-store", *common,
                         "--env", f"CRUN_AUTH_SECRET_FILE={s0}", "--", *worker])
        m = wait_line(a.stdout, r"store on \S+:(\d+)", 20)
        b = procs.spawn([launch, "-n", "1", "--rank-base", "1", "--store-port", m.group(1),
                         *common, "--env", f"CRUN_AUTH_SECRET_FILE={second}", "--", *worker])
        rcs = []
        for p in (a, b):
            try:
                p.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                pytest.fail("mesh ranks did not finish in time")
            rcs.append(p.returncode)
        assert (rcs == [0, 0]) == ok, rcs


def test_crun_rejects_a_bad_secret_or_tls_file_with_exit_2(tmp):
    loose = secret_file(os.path.join(tmp, "loose"), 0o644)
    base = [bin_path("crun"), "--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{free_port()}", "--rdzv_id=bad"]
    for extra, env, why in (
            ([], crun_env(tmp, loose), "accessible by group or others"),
            ([f"--rdzv_conf=auth_secret_file={loose}"], crun_env(tmp), "chmod 600"),
            (["--rdzv_conf=tls_ca=/nonexistent/ca.pem"], crun_env(tmp), "/nonexistent/ca.pem"),
            ([f"--rdzv_conf=tls_cert={loose}"], crun_env(tmp), "tls_cert needs tls_ca"),
            (["--rdzv_conf=tls_min_version=1.1"], crun_env(tmp), "tls_min_version")):
        out = subprocess.run(base + extra + [PY, "-c", "pass"], capture_output=True, text=True,
                             env=env, timeout=60)
        assert out.returncode == 2, (extra, out.stderr)
        assert why in out.stderr, out.stderr


# Secret files crun must refuse before reading a byte (issue 28 item 8): each
# case makes a path (a file, or a directory of per-run-id files) that is bad
# in one way; the message must name the bad file or directory, and why.
def bad_fifo(tmp, as_dir):
    d = os.path.join(tmp, "jobs")
    os.mkdir(d, 0o700)
    os.mkfifo(os.path.join(d, "victim"), 0o600)  # open() on it waits for a writer
    return d if as_dir else os.path.join(d, "victim"), os.path.join(d, "victim")


def bad_symlink(tmp, as_dir):
    real = secret_file(os.path.join(tmp, "real"))
    d = os.path.join(tmp, "jobs")
    os.mkdir(d, 0o700)
    os.symlink(real, os.path.join(d, "victim"))
    return d if as_dir else os.path.join(d, "victim"), os.path.join(d, "victim")


def bad_owner(tmp, as_dir):
    d = os.path.join(tmp, "jobs")
    os.mkdir(d, 0o700)
    f = secret_file(os.path.join(d, "victim"))
    os.chown(f, 65534, 65534)  # nobody's 0600 file: nobody may rewrite it
    return d if as_dir else f, f


def bad_dir(tmp, as_dir):
    d = os.path.join(tmp, "jobs")
    os.mkdir(d)
    f = secret_file(os.path.join(d, "victim"))
    os.chmod(d, 0o777)  # anyone may swap the file for their own
    return d if as_dir else f, d


BAD_SECRETS = {"fifo": (bad_fifo, "not a regular file"),
               "symlink": (bad_symlink, "symbolic link"),
               "other owner": (bad_owner, "owned by uid 65534"),
               "world-writable dir": (bad_dir, "writable by group or others")}


def refuses(argv, env, path, why):
    """The program exits 2 naming `path` and the reason, at once: a hang (a
    FIFO opened for reading waits for a writer) is a failure."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{argv[0]} did not exit: hung on, or accepted, {path}")
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert path in out.stderr and why in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("case", sorted(BAD_SECRETS))
@pytest.mark.parametrize("prog", ["crun-rdzvd --auth-secret-file", "crun-rdzvd --auth-secrets-dir",
                                  "crun auth_secret_file"])
def test_a_bad_secret_path_is_refused_at_once(tmp, prog, case):
    if case == "other owner" and os.geteuid() != 0:
        pytest.skip("chown to nobody needs root")
    make, why = BAD_SECRETS[case]
    as_dir = prog.endswith("dir")
    path, named = make(tmp, as_dir)
    if prog.startswith("crun-rdzvd"):
        argv = [bin_path("crun-rdzvd"), "--port", "0", prog.split()[1], path]
    else:
        argv = [bin_path("crun"), "--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{free_port()}", "--rdzv_id=bad",
                f"--rdzv_conf=auth_secret_file={path}", PY, "-c", "pass"]
    refuses(argv, crun_env(tmp), named, why)


def test_reset_connections_reconnect_with_tls_and_auth(procs, certs, tmp):
    """The store client's redial (after `ss -K` resets every rendezvous
    connection) redoes TLS and the HMAC exchange: no re-rendezvous, exit 0."""
    from test_store_reconnect import clients_connected, ss_kill, ss_kill_works
    if not ss_kill_works():
        pytest.skip("ss -K cannot destroy sockets here")
    sec = secret_file(os.path.join(tmp, "s"))
    port = free_port()
    conf = (f"tls_cert={certs['server'][0]},tls_key={certs['server'][1]},"
            f"tls_ca={certs['ca']}")
    out = tempfile.mkdtemp(dir=tmp)
    extra = ["--max_restarts=0", CONF.replace("lease_ttl=1.5", "lease_ttl=3") + "," + conf]
    ps = [agent(procs, port, "resetsec", out, 6, tmp, secret=sec, extra=extra)
          for _ in range(2)]
    wait_records(out, lambda r: len(records(out)) >= 2, "both workers")
    for _ in range(3):
        clients_connected(port)  # each reset hits connections the clients redialled
        ss_kill(port)
        time.sleep(0.5)  # a stimulus (test_store_reconnect says why), not an ordering wait
    clients_connected(port)
    for p in ps:
        rc, _, err = finish(p)
        assert rc == 0, err[-3000:]
        assert "re-rendezvous" not in err and "dead" not in err, err[-3000:]
    recs = records(out)
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}
    assert sorted(int(r["RANK"]) for r in recs) == [0, 1]


class ResetFront:
    """A TCP front for a store: it resets (RST, SO_LINGER 0) the first `resets`
    connections once their first bytes (a TLS ClientHello) arrive, and relays
    later ones to the store: what `ss -K` does to a redial caught mid-handshake,
    made deterministic."""

    def __init__(self, target_port, resets):
        import socket
        import threading
        self.target, self.left, self.socket = target_port, resets, socket
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.accept_loop, daemon=True)]
        self.threads[0].start()

    def accept_loop(self):
        import struct
        import threading
        while not self.stop.is_set():
            try:
                c, _ = self.lsock.accept()
            except OSError:
                continue
            if self.left > 0:
                self.left -= 1
                c.settimeout(5)
                try:
                    c.recv(4096)
                except OSError:
                    pass
                c.setsockopt(self.socket.SOL_SOCKET, self.socket.SO_LINGER,
                             struct.pack("ii", 1, 0))
                c.close()
                continue
            up = self.socket.create_connection(("127.0.0.1", self.target), timeout=5)
            for a, b in ((c, up), (up, c)):
                t = threading.Thread(target=self.pump, args=(a, b), daemon=True)
                t.start()
                self.threads.append(t)

    def pump(self, a, b):
        a.settimeout(0.2)
        while not self.stop.is_set():
            try:
                d = a.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not d:
                break
            try:
                b.sendall(d)
            except OSError:
                break
        for s in (a, b):
            try:
                s.shutdown(self.socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)
        self.lsock.close()


def test_tls_dial_reset_mid_handshake_is_retried(procs, certs):
    """A connection reset during the TLS handshake is a transport failure,
    retried like a refused connect, not a TLS verdict (failed before: the
    first reset ended the dial with 'TLS handshake ... failed', which is how
    `ss -K` during a redial ended a TLS job)."""
    _, _, port = tls_rdzvd(procs, certs)
    front = ResetFront(port, resets=2)
    try:
        ok, out, err = cli(front.port, "--tls-ca", certs["ca"])
        assert ok and 'VAL "v"' in out, out + err
        assert front.left == 0
    finally:
        front.close()


# ---- strangers before authentication (issue 28, item 3) ------------------------------------
#
# With TLS or a secret a connection is "pre-auth" until it passed both; such connections have
# their own budget (--max-preauth-conns, --max-preauth-per-addr) instead of slots of
# --max-conns, and one deadline from accept (--preauth-timeout) that bytes do not move. The
# strangers connect from 127.0.0.2 (loopback, another source address than the job's).

STRANGER = "127.0.0.2"
# What a stranger trickles: the start of an answer (a 200-byte run id follows, so it never
# completes), or of a ClientHello record (16 KiB announced).
TRICKLE = {"auth": b"CRA1\xc8" + b"j" * 300, "tls": b"\x16\x03\x01\x40\x00" + b"\x01" * 300}


def gate(procs, certs, tmp, mode, *extra):
    """crun-rdzvd behind the gate `mode` (auth, tls, mtls); (proc, port, the agents'
    --rdzv_conf additions, the agents' secret or None, what strangers trickle)."""
    if mode == "auth":
        sec = secret_file(os.path.join(tmp, "s"))
        p, _, port = start_rdzvd(procs, "--auth-secret-file", sec, *extra)
        return p, port, "", sec, TRICKLE["auth"]
    cert, key = certs["server"]
    conf = f",tls_ca={certs['ca']}"
    if mode == "mtls":
        extra = ("--tls-ca", certs["ca"], *extra)
        conf += f",tls_cert={certs['client'][0]},tls_key={certs['client'][1]}"
    p, _, port = tls_rdzvd(procs, certs, "server", *extra)
    return p, port, conf, None, TRICKLE["tls"]


def stranger(port):
    s = socket.socket()
    s.bind((STRANGER, 0))
    s.connect(("127.0.0.1", port))
    return s


def hung_up(s, wait_s):
    """True when the server closed s within wait_s (EOF or reset)."""
    r, _, _ = select.select([s], [], [], wait_s)
    if not r:
        return False
    try:
        while True:
            d = s.recv(4096)
            if not d:
                return True
            r, _, _ = select.select([s], [], [], 0)
            if not r:
                return False
    except ConnectionResetError:
        return True


def metric(status, name):
    """The value of crun_store_events_total{event=name} on the daemon's /metrics."""
    url = status + "/metrics"
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        # labels in any order: store="rendezvous" sits beside event=
        if line.startswith("crun_store_events_total{") and f'event="{name}"' in line:
            return int(line.split()[-1])
    return 0


@pytest.mark.parametrize("mode", ["auth", "tls", "mtls"])
def test_strangers_before_authentication_leave_max_conns_to_the_job(procs, certs, tmp, mode):
    # Room for the job's own connections only; 40 strangers that trickle a byte a second (an
    # idle one would be closed at the deadline anyway) must not take any of it.
    p, port, conf, sec, bytes_ = gate(procs, certs, tmp, mode, "--max-conns", "12")
    status = wait_line(p.stderr, r"status page on (http://\S+)/status", 10).group(1)
    ss = [stranger(port) for _ in range(40)]
    deadline = time.monotonic() + 30
    seen = ("conns_accepted", "refused_max_conns", "refused_preauth", "refused_preauth_addr")
    while sum(metric(status, m) for m in seen) < 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    held = [s for s in ss if not hung_up(s, 0)]
    assert 0 < len(held) <= 16, len(held)  # --max-preauth-per-addr's default
    stop = threading.Event()

    def trickle():
        for i in range(600):
            if stop.wait(1):
                return
            for s in held:
                try:
                    s.send(bytes_[i % len(bytes_):i % len(bytes_) + 1])
                except OSError:
                    pass

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        out = tempfile.mkdtemp(dir=tmp)
        conf_all = CONF.replace("join_timeout=60", "join_timeout=30") + conf
        ps = [agent(procs, port, "busy", out, 0, tmp, secret=sec, extra=[conf_all])
              for _ in range(2)]
        for a in ps:
            rc, _, err = finish(a)
            assert rc == 0, err[-3000:]
        assert sorted(int(r["RANK"]) for r in records(out)) == [0, 1]
        assert metric(status, "refused_max_conns") == 0
    finally:
        stop.set()
        t.join(timeout=10)
        for s in ss:
            s.close()


@pytest.mark.parametrize("mode", ["auth", "tls", "mtls"])
def test_a_trickling_stranger_is_closed_at_the_preauth_deadline(procs, certs, tmp, mode):
    # A byte every 0.2 s used to restart a 10 s timeout; now the deadline counts from accept.
    p, port, _, _, bytes_ = gate(procs, certs, tmp, mode, "--preauth-timeout", "2")
    s = stranger(port)
    try:
        closed = False
        for i in range(250):  # a hang guard: 50 s of trickle, the deadline is 2 s
            try:
                s.send(bytes_[i:i + 1])
            except OSError:
                closed = True
                break
            if hung_up(s, 0.2):
                closed = True
                break
        assert closed, "the trickling stranger was never closed"
    finally:
        s.close()
    p.terminate()
    err = p.communicate(timeout=10)[1].decode()
    assert "within preauth-timeout of accept" in err, err
