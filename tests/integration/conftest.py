"""Shared fixtures for crun's integration and interop tests.

Every test talks only to 127.0.0.1 (or to network namespaces it creates), bounds
every loop in count and time, and kills every process it started, also on
failure: processes go through `procs.spawn`, which the fixture reaps.
"""
import functools
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CRUN_BUILD", os.path.join(ROOT, "build"))
TORCH1_PYTHON = "/usr/bin/python3"
TORCH2_VENV = os.environ.get(
    "CRUN_TORCH2_VENV", os.path.expanduser("~/.cache/crun/venv-torch2"))
TORCH2_PYTHON = os.path.join(TORCH2_VENV, "bin", "python")
HELPERS = os.path.join(ROOT, "tests", "integration", "helpers")

# What the processes a test starts leave in $TMPDIR (crun's and torchrun's
# default log folders, torchelastic_*; PyTorch's own temporary files) goes
# into one folder of the session's, removed at its end: a run leaves nothing
# behind in /tmp (it left about 650 folders before). pytest's own tmp_path
# root stays where it was (tempfile fixed it first), so socket paths under
# it keep their length. Machines with a private /tmp drop the variable
# (systemd_ns.machine_env).
tempfile.gettempdir()
SESSION_TMP = tempfile.mkdtemp(prefix="crun-test-")
os.environ["TMPDIR"] = SESSION_TMP


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(SESSION_TMP, ignore_errors=True)


def bin_path(name):
    p = os.path.join(BUILD, "bin", name)
    assert os.access(p, os.X_OK), f"{p} is not built"
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.lru_cache(maxsize=None)
def torch_python(version):
    """The interpreter for PyTorch `version` ("1" = Debian's 1.13, v1 store
    dialect; "2" = PyPI 2.x in the venv, v2 dialect). Fails loudly, never
    skips, when that PyTorch is missing. The check imports torch (1-2 s of
    CPU): it runs once a session per version (a failure is not cached, so
    every later caller fails loudly too)."""
    py = TORCH1_PYTHON if version == "1" else TORCH2_PYTHON
    want = "1." if version == "1" else "2."
    out = subprocess.run([py, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0 or not out.stdout.startswith(want):
        pytest.fail(f"PyTorch {version}.x is required at {py} but is missing "
                    f"(run `sh scripts/deps.sh test`): {out.stderr[-500:]}")
    return py


class Procs:
    """Starts processes in their own session and kills every one of them
    (and their process groups) at teardown."""

    def __init__(self):
        self.procs = []

    def spawn(self, argv, **kw):
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(argv, **kw)
        self.procs.append(p)
        return p

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for f in (p.stdout, p.stderr, p.stdin):
                if f:
                    f.close()


@pytest.fixture
def procs():
    ps = Procs()
    yield ps
    ps.cleanup()


def wait_line(stream, pattern, timeout_s):
    """Reads lines from a pipe until one matches; returns the match."""
    deadline = time.monotonic() + timeout_s
    rx = re.compile(pattern)
    seen = []
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        line = line.decode(errors="replace") if isinstance(line, bytes) else line
        seen.append(line)
        m = rx.search(line)
        if m:
            return m
    raise AssertionError(f"no line matching {pattern!r} within {timeout_s}s; got {seen[-20:]}")


def records(d):
    """Every JSON record that workers wrote into directory d."""
    out = []
    for f in glob.glob(os.path.join(d, "*.json")):
        with open(f) as fh:
            out.append(json.load(fh))
    return out


def wait_records(d, pred, what, timeout=60):
    """Polls d (bounded by timeout) until some record satisfies pred."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = [x for x in records(d) if pred(x)]
        if r:
            return r
        time.sleep(0.05)
    pytest.fail(f"no worker record with {what} in {d}: {records(d)}")


def release_workers(d):
    """Ends the SECS sleep of every elastic_task.py (or store_probe.py
    --worker) worker writing into d (they poll d/go): for a test that has seen
    what it kept the job running for. Workers started later (a restart)
    still write their record first."""
    open(os.path.join(d, "go"), "w").close()


class Output:
    """Collects a process's stdout and stderr from now on (reader threads), so
    that a test can wait for a line - the event an order depends on, such as
    the first agent serving the rendezvous store - and still read all of it
    once the process ended."""

    def __init__(self, p):
        self.p, self.out, self.err = p, [], []
        self.threads = [threading.Thread(target=self._read, args=(f, buf), daemon=True)
                        for f, buf in ((p.stdout, self.out), (p.stderr, self.err)) if f]
        for t in self.threads:
            t.start()

    @staticmethod
    def _read(f, buf):
        for line in iter(f.readline, b""):
            buf.append(line.decode(errors="replace"))

    def wait_for(self, pattern, timeout=60):
        """Waits (bounded: a hang guard) until pattern is in stderr."""
        deadline = time.monotonic() + timeout
        while pattern not in "".join(self.err):
            if time.monotonic() >= deadline or (self.p.poll() is not None and
                                                not any(t.is_alive() for t in self.threads)):
                pytest.fail(f"{pattern!r} not seen: {''.join(self.err)[-2000:]}")
            time.sleep(0.02)
        return self

    def finish(self, timeout=90):
        """Waits for the exit: (returncode, stdout, stderr)."""
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail("process did not finish in time")
        for t in self.threads:
            t.join(10)
        return self.p.returncode, "".join(self.out), "".join(self.err)


def start_rdzvd(procs, *extra):
    p = procs.spawn([bin_path("crun-rdzvd"), "--host", "127.0.0.1", "--port", "0", *extra])
    m = wait_line(p.stdout, r"crun-rdzvd listening on (\S+):(\d+)", 10)
    return p, m.group(1), int(m.group(2))


@pytest.fixture
def rdzvd(procs):
    """A running crun-rdzvd on 127.0.0.1; yields (proc, host, port)."""
    p, host, port = start_rdzvd(procs)
    yield p, host, port
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            assert p.wait(timeout=10) == 0, "crun-rdzvd did not exit 0 on SIGTERM"
        except subprocess.TimeoutExpired:
            pytest.fail("crun-rdzvd did not exit within 10s of SIGTERM")


def wait_until(pred, what, timeout=60, interval=0.02):
    """Polls pred every interval (bounded by timeout) until it returns
    something true, which it returns; else fails naming what (a callable:
    called at the failure, e.g. to show the logs as they are then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval)
    pytest.fail(f"timed out waiting for {what() if callable(what) else what}")
