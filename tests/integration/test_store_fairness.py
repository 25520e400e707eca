"""Store fairness (issue 26): one client or one job filling crun-rdzvd's key
space must not lock the other jobs out. Before, the budgets were global: once
one client had filled max-total-key-bytes, a normal PyTorch client that
connected afterwards and set one small key was reset, and so was every other
job's rendezvous. Now a connection may add conn-share % of each budget, a job
may hold job-share %, and the last reserve % is kept for crun's rendezvous
keys; a refused client is closed (the torch protocol has no error reply), the
daemon logs "store full: ..." naming the job and the budget and counts it
per job in /metrics (crun_store_refused_total{job,budget}).

The daemon, the canary and the raw-socket helpers are test_store_attack.py's.
"""
import json
import os
import re
import subprocess
import urllib.request

import pytest

from conftest import bin_path
from test_store_attack import (MIB, Daemon, _torch_python, assert_rss_under, canary1,  # noqa: F401
                               raw, send_until_closed, under_attack, v1_str)

KEY_BYTES = 32 * MIB   # the daemon's max-total-key-bytes in these tests
KEY_LEN = 64 * 1024    # each flood key; a connection's share is 128 of them

# One TCPStore client of the job a key names: set, get, exit 0; an exception
# (the daemon closed it) exits 1 with the traceback on stderr. TCPStore (1.13
# and 2.x) puts "/" before every key, so "crun-c10d/A/x" reaches the daemon
# as crun's /crun-c10d/A/x, a key of job A.
CLIENT = """
import sys
from datetime import timedelta
import torch.distributed as dist
s = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False, timeout=timedelta(seconds=20))
s.set(sys.argv[3], "small")
assert s.get(sys.argv[3]) == b"small"
print("CLIENT OK", flush=True)
"""


def torch_client(version, port, key, script=CLIENT):
    """Runs one PyTorch client to its end; True when it printed CLIENT OK."""
    out = subprocess.run([_torch_python(version), "-c", script, "127.0.0.1", str(port), key],
                         capture_output=True, text=True, timeout=120)
    return out.returncode == 0 and "CLIENT OK" in out.stdout


def big_key(name):
    """name padded to a flood key's size less the "/" TCPStore adds: on a
    store with a global budget only, the room the canary's keys left after a
    flood (under one flood key) cannot take it, so it fails there for sure."""
    return name + "k" * (KEY_LEN - 1 - len(name))


# A client of a job at its share: it reads one of the flooder's keys, checks,
# waits for it (present), counts the keys and deletes one - none of which
# adds to the key space, so none is refused (etcd's NOSPACE and Redis's
# maxmemory keep reads and deletes working too).
READER = """
import sys
from datetime import timedelta
import torch.distributed as dist
s = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False, timeout=timedelta(seconds=20))
k = sys.argv[3]
assert s.get(k) == b""
if hasattr(s, "check"):  # 2.x only
    assert s.check([k])
s.wait([k])
n = s.num_keys()
assert n >= 256, n
assert s.delete_key(k)
assert not s.delete_key(k)
print("CLIENT OK", flush=True)
"""


def flood_frames(job, start=0, n=4000):
    """v1 SETs of 64 KiB keys of job `job` with empty values."""
    for i in range(start, start + n):
        head = b"/crun-c10d/%s/%06d" % (job.encode(), i)
        yield b"\x00" + v1_str(head + b"k" * (KEY_LEN - len(head))) + v1_str(b"")


def flood(port, job, start=0):
    s = raw(port)
    try:
        return send_until_closed(s, flood_frames(job, start))
    finally:
        s.close()


def metrics(d):
    with urllib.request.urlopen(f"http://{d.status_addr}/metrics", timeout=10) as r:
        return r.read().decode()


def refused(text, job, budget):
    m = re.search(r'crun_store_refused_total\{store="rendezvous",job="%s",budget="%s"\} (\d+)'
                  % (re.escape(job), budget), text)
    return int(m.group(1)) if m else 0


@pytest.mark.parametrize("version", ["1", "2"])
def test_one_flooding_connection_leaves_its_job_and_other_jobs_writing(procs, canary1, version):
    """4,000 SETs of 64 KiB keys of job A from one client: it is closed after
    its connection's 8 MiB (a quarter of 32 MiB), the canary (keys of no job)
    keeps its latency, and afterwards a PyTorch client of job A and one of
    job B each set and read a small key. Before: the flooder filled all 32 MiB
    and both clients were reset."""
    d = Daemon(procs, "--max-total-key-bytes", str(KEY_BYTES), "--status", "127.0.0.1:0")
    rss0 = d.status("VmRSS")

    def attack(started):
        s = raw(d.port)
        started.set()
        try:
            return send_until_closed(s, flood_frames("A"))
        finally:
            s.close()

    base, hit, closed = under_attack(canary1, d, attack, f"torch {version}")
    assert closed, "the key flooder was not closed"
    assert torch_client(version, d.port, big_key("crun-c10d/A/after")), \
        "job A's own client was reset"
    assert torch_client(version, d.port, big_key("crun-c10d/B/after")), \
        "job B's client was reset"
    peak = assert_rss_under(d, rss0, KEY_BYTES)
    text = metrics(d)
    assert refused(text, "A", "key_bytes") == 1, text[-3000:]
    assert refused(text, "B", "key_bytes") == 0
    log, m = d.stop()
    assert ("store full: this connection (job 'A') added 8 MiB of its 8 MiB key_bytes"
            in log), log[-3000:]
    assert m.get("drop_key_bytes") == 1, m
    print(f"torch {version}: peak RSS {peak / MIB:.1f} MiB (from {rss0 / MIB:.1f}), "
          f"refusals {m['drop_key_bytes']}, canary p99 {base['p99']} us before, "
          f"{hit['p99']} us under the flood")


def test_a_job_at_its_share_is_refused_another_job_is_not(procs):
    """Job A floods from one connection after another until it holds its
    16 MiB (half of 32 MiB): its next flooder and its next PyTorch client are
    refused ("store full: job 'A' used 16 MiB of its 16 MiB key_bytes"),
    counted for job A in /metrics; job B's client still writes, and reads,
    deletes and waits of job A still work."""
    d = Daemon(procs, "--max-total-key-bytes", str(KEY_BYTES), "--status", "127.0.0.1:0")
    for i in range(3):  # 8 MiB, 8 MiB, then nothing left of A's 16 MiB
        assert flood(d.port, "A", start=1000 * i)
    assert not torch_client("2", d.port, "crun-c10d/A/after"), "job A over its share wrote"
    assert torch_client("2", d.port, "crun-c10d/B/after"), "job B's client was reset"
    assert torch_client("1", d.port, "crun-c10d/B/v1"), "job B's v1 client was reset"
    # The flooders' keys stay (they may be legitimate: crunctl drop frees
    # them), and job A still reads, waits and deletes.
    used = metrics(d)
    assert re.search(r'crun_store_job_used\{store="rendezvous",job="A",budget="keys"\} 256\n',
                     used), used[-3000:]
    first = next(flood_frames("A"))[9:-8].decode()  # the op, u64 len, key, u64 0
    for version in ("1", "2"):
        assert torch_client(version, d.port, first[1:], READER), f"torch {version}: read failed"
        assert torch_client("2", d.port, "crun-c10d/A/again"), "the deleted key left no room"
        first = next(flood_frames("A", start=1))[9:-8].decode()
    text = metrics(d)
    assert refused(text, "A", "key_bytes") == 4, text[-3000:]  # 3 flooders, 1 client
    assert refused(text, "B", "key_bytes") == 0
    log, m = d.stop()
    assert "store full: job 'A' used 16 MiB of its 16 MiB key_bytes" in log, log[-3000:]
    assert m.get("drop_key_bytes") == 4, m


def run_job(procs, port, tmp_path, rdzv_id, torch=None):
    """A two-node c10d job of run id rdzv_id through the daemon at port: both
    agents rendezvous and exit 0. torch "1"/"2": the workers train
    (launch_worker.py: gloo all_reduce, all_gather, broadcast, checked) under
    that PyTorch; else they run elastic_task.py to its end."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k != "TORCHELASTIC_ERROR_FILE"}
    if torch:
        env.update(PYTHON_EXEC=_torch_python(torch), TMPDIR=str(tmp_path))
        job = [os.path.join(os.path.dirname(__file__), "helpers", "launch_worker.py")]
    else:
        out = tmp_path / rdzv_id
        out.mkdir()
        (out / "go").write_text("")
        job = [os.path.join(os.path.dirname(__file__), "helpers", "elastic_task.py"), "run",
               str(out), "5"]
    agents = [procs.spawn([bin_path("crun"), "--nnodes=2", "--nproc_per_node=1",
                           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                           f"--rdzv_id={rdzv_id}", *job], env=env) for _ in range(2)]
    oks = []
    for a in agents:
        try:
            out, err = a.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail(f"job {rdzv_id} did not finish")
        assert a.returncode == 0, err.decode(errors="replace")[-3000:]
        oks += [ln for ln in out.decode(errors="replace").splitlines()
                if ln.startswith("launch_worker ok")]
    if torch:
        assert sorted(oks) == [f"launch_worker ok rank={r} world=2 restart=0" for r in (0, 1)]


@pytest.mark.parametrize("version", ["1", "2"])
def test_two_jobs_on_one_daemon_one_floods_the_others_rendezvous_and_training_finish(
        procs, tmp_path, version):
    """Job A's flooders (one connection after another) take what they may of
    the key space; job B's two-node rendezvous through the same daemon then
    forms and its gloo training (PyTorch 1.13 or 2.x) finishes. Before: A's
    first flooder filled the global budget and B's agents were reset
    ("rendezvous failed: ... COMPARE_SET ... server closed the connection")."""
    d = Daemon(procs, "--max-total-key-bytes", str(KEY_BYTES))
    for i in range(3):
        assert flood(d.port, "A", start=1000 * i)
    run_job(procs, d.port, tmp_path, "B", torch=version)
    log, m = d.stop()
    assert "store full: job 'A' used 16 MiB of its 16 MiB key_bytes" in log, log[-3000:]
    assert m.get("drop_key_bytes") == 3, m


def test_reserve_keeps_room_for_a_rendezvous_after_user_keys_filled_the_store(procs, tmp_path):
    """Plain keys (no job) from many connections fill what the reserve leaves;
    a two-node c10d rendezvous through the same daemon still forms and its
    job finishes, because crun's /crun-c10d/ keys may use the reserve."""
    d = Daemon(procs, "--max-keys", "2000", "--job-share", "100", "--conn-share", "100",
               "--reserve", "10")
    s = raw(d.port)
    frames = (b"\x00" + v1_str(b"user/%d" % i) + v1_str(b"") for i in range(4000))
    assert send_until_closed(s, frames), "the user-key flooder was not closed"
    s.close()
    run_job(procs, d.port, tmp_path, "fair")
    log, m = d.stop()
    assert "the last 200 keys are kept for crun's rendezvous keys" in log, log[-3000:]
    assert m.get("drop_keys") == 1, m


def crunctl(d, *args, token=None):
    argv = [bin_path("crunctl"), args[0], "--endpoint", d.status_addr, *args[1:]]
    if token:
        argv += ["--token-file", str(token)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def usage_of(d, job):
    out = crunctl(d, "usage", "--json")
    assert out.returncode == 0, out.stderr
    rows = [r for r in json.loads(out.stdout)["usage"] if r["job"] == job]
    return rows[0] if rows else None


def token_file(path, text):
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_crunctl_usage_shows_who_holds_what_and_only_the_admin_token_drops_a_job(
        procs, tmp_path):
    """crunctl usage names job A's 256 flood keys (16 MiB) and its refusal;
    crunctl drop --job A without the token, or with a wrong one, is refused
    and A's keys stay; with crun-rdzvd's --admin-token-file it deletes them,
    the store's accounting (key bytes, A's share) goes back to 0 and A writes
    again. A daemon without --admin-token-file refuses every drop."""
    tok = token_file(tmp_path / "admin", "s3cret-admin-token-0123456789")
    bad = token_file(tmp_path / "bad", "not-the-admin-token-0123456789")
    d = Daemon(procs, "--max-total-key-bytes", str(KEY_BYTES), "--status", "127.0.0.1:0",
               "--admin-token-file", str(tok))
    for i in range(3):
        assert flood(d.port, "A", start=1000 * i)
    a = usage_of(d, "A")
    assert a["used"]["keys"] == 256 and a["used"]["key_bytes"] == 16 * MIB, a
    assert a["limit"]["key_bytes"] == 16 * MIB and a["refused"]["key_bytes"] == 3, a
    table = crunctl(d, "usage")
    assert table.returncode == 0 and re.search(r"^A +256 +16777216 +0 +0 +3$", table.stdout,
                                               re.M), table.stdout
    out = crunctl(d, "drop", "--job", "A")
    assert out.returncode == 2 and "--token-file" in out.stderr, out.stderr
    out = crunctl(d, "drop", "--job", "A", token=bad)
    assert out.returncode == 1 and "HTTP 401" in out.stderr, out.stderr
    assert usage_of(d, "A")["used"]["keys"] == 256
    out = crunctl(d, "drop", "--job", "A", token=tok)
    assert out.returncode == 0 and '"dropped_keys":256' in out.stdout, (out.stdout, out.stderr)
    a = usage_of(d, "A")
    assert a is None or (a["used"]["keys"] == 0 and a["used"]["key_bytes"] == 0), a
    assert re.search(r'crun_store_key_bytes\{store="rendezvous"\} 0\n', metrics(d))
    out = crunctl(d, "drop", "--job", "A", token=tok)
    assert out.returncode == 1 and "HTTP 404" in out.stderr, out.stderr
    assert torch_client("2", d.port, big_key("crun-c10d/A/after")), "job A cannot write again"
    log, _ = d.stop()
    assert "refusing a drop from" in log and "dropped 256 keys of job 'A'" in log, log[-3000:]
    off = Daemon(procs, "--status", "127.0.0.1:0")
    out = crunctl(off, "drop", "--job", "A", token=tok)
    assert out.returncode == 1 and "HTTP 403" in out.stderr, out.stderr
    off.stop()
