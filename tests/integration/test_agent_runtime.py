"""The agent's runtime against a hostile host (issue 28): wall-clock steps
under --worker_heartbeat_timeout (an LD_PRELOAD shim shifts the agent's
CLOCK_REALTIME, gettimeofday() and time(); file mtimes keep the kernel's real
time, as after a real `date -s`), a worker's detached grandchild that
ignores SIGTERM, and a log directory on a full file system."""
import contextlib
import os
import re
import shutil
import subprocess

import pytest

from conftest import BUILD, bin_path, wait_line

PY = "/usr/bin/python3"
SHIFT = os.path.join(BUILD, "tests", "preload", "clock_shift.so")
HB_WORKER = os.path.join(BUILD, "tests", "helpers", "hb_worker")


def agent_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "LD_PRELOAD"))}
    env["PYTHON_EXEC"] = PY
    env.update({k: str(v) for k, v in extra.items()})
    return env


def finish(p, timeout):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"crun did not finish within {timeout}s (a hang guard)")
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")


# ---- wall-clock steps and --worker_heartbeat_timeout ------------------------------------

def shifted_env(shift_s):
    assert os.access(SHIFT, os.R_OK), f"{SHIFT} is not built"
    preload = SHIFT
    if os.environ.get("CRUN_SAN") == "1":
        # A sanitized crun refuses to start unless ASan's runtime is the
        # first library loaded: put it before the shim.
        asan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                              text=True, check=True).stdout.strip()
        preload = f"{asan}:{SHIFT}"
    return agent_env(LD_PRELOAD=preload, CRUN_TEST_CLOCK_SHIFT_S=shift_s)


@pytest.mark.parametrize("shift_s", [3600, -3600])
def test_healthy_worker_survives_a_wall_clock_step(procs, tmp_path, shift_s):
    """The agent's wall clock is an hour off the file mtimes: a worker that
    beats every 50 ms for 3 s (three timeouts) is not killed."""
    p = procs.spawn([bin_path("crun"), "--standalone", "--nproc_per_node=1",
                     "--worker_heartbeat_timeout=1", f"--log_dir={tmp_path / 'logs'}",
                     HB_WORKER, "60", "-1"], env=shifted_env(shift_s))
    rc, out, err = finish(p, 120)
    assert "sent no heartbeat" not in err, err
    assert rc == 0 and "rank 0 done after 60 beats" in out, (rc, out, err)


@pytest.mark.parametrize("shift_s", [3600, -3600])
def test_hung_worker_is_killed_despite_a_wall_clock_step(procs, tmp_path, shift_s):
    """Rank 0 beats twice, then hangs (30 s, then it exits 4 by itself): the
    agent kills it as hung, whichever way its wall clock is off."""
    p = procs.spawn([bin_path("crun"), "--standalone", "--nproc_per_node=1",
                     "--worker_heartbeat_timeout=1", f"--log_dir={tmp_path / 'logs'}",
                     HB_WORKER, "2", "0"], env=shifted_env(shift_s))
    rc, out, err = finish(p, 120)
    assert "rank 0 hangs" in out, (out, err)
    assert re.search(r"worker rank 0 .*sent no heartbeat for \d+\.\d s", err), err
    assert rc == 1 and "no heartbeat from rank 0" in err, err


def test_poll_mode_host_sleeps_right_across_a_wall_clock_step(procs, tmp_path):
    """embed_crun (the agent in the host's poll loop) has a hung worker
    under --worker_heartbeat_timeout=1 when its wall clock steps back an
    hour: the timeout it gives the host's poll() stays right, so the check
    timer runs and the worker is killed as hung (it told the host to sleep
    an hour: the worker lived on until it exited by itself)."""
    step = tmp_path / "step"
    env = shifted_env(-3600)
    env["CRUN_TEST_CLOCK_SHIFT_FILE"] = str(step)
    p = procs.spawn([os.path.join(BUILD, "tests", "helpers", "embed_crun"), "--standalone",
                     "--nproc_per_node=1", "--worker_heartbeat_timeout=1",
                     f"--log_dir={tmp_path / 'logs'}", HB_WORKER, "2", "0"], env=env)
    wait_line(p.stdout, r"rank 0 hangs", 60)
    step.touch()
    rc, _, err = finish(p, 120)
    assert re.search(r"worker rank 0 .*sent no heartbeat", err), err
    assert rc == 1, err


FLOOD = """\
import sys
for i in range(100000):
    sys.stdout.write(f"flood line {i:06d} " + "x" * 40 + "\\n")
sys.stdout.flush()
"""


def test_stalled_console_flush_ends_after_a_wall_clock_step(procs, tmp_path):
    """Nobody reads crun's stdout while a teed worker floods it (~6 MB), and
    the agent's wall clock is an hour ahead: the bounded waits for a slow
    console (cond waits with a deadline) still end, so crun exits. With the
    deadline on CLOCK_REALTIME each wait lasted an hour."""
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    p = procs.spawn([bin_path("crun"), "--standalone", "--nproc_per_node=1", "--tee=1",
                     f"--log_dir={tmp_path / 'logs'}", str(script)],
                    env=shifted_env(3600), stderr=subprocess.DEVNULL)
    try:
        rc = p.wait(timeout=120)  # stdout is never read: crun must give up on it
    except subprocess.TimeoutExpired:
        pytest.fail("crun did not exit within 120 s with a stalled console (a hang guard)")
    assert rc == 0


# ---- a worker's detached grandchild (crun is the subreaper) ------------------------------

MARK = "crun-test-orphan"
ORPHAN = f"""\
import os, signal, sys, time
out, tag, mode = sys.argv[1], sys.argv[2], sys.argv[3]
def on_term(sig, frame):
    open(os.path.join(out, tag + ".term"), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore" else on_term)
with open(os.path.join(out, tag + ".tmp"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(out, tag + ".tmp"), os.path.join(out, tag + ".gc"))
time.sleep(60)  # bounded: a broken test leaves nothing for long  {MARK}
"""

# Whether pid is a live grandchild of these tests: run by the test and, as
# source, by the workers of the next attempt.
ALIVE = f"""\
def marked_alive(pid):
    try:
        with open(f"/proc/{{pid}}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        with open(f"/proc/{{pid}}/cmdline", "rb") as f:
            return b"{MARK}" in f.read()
    except OSError:
        return False
"""
exec(ALIVE)

FORKER = ALIVE + """\
import os, subprocess, sys, time
out = sys.argv[1]
attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
left = [f for f in sorted(os.listdir(out)) if f.endswith(".gc")  # earlier attempts'
        and int(f.split("-")[0]) < int(attempt)
        and marked_alive(int(open(os.path.join(out, f)).read()))]
with open(os.path.join(out, f"seen-{attempt}-{rank}"), "w") as f:
    f.write(" ".join(left))
tag = f"{attempt}-{rank}"
subprocess.Popen([sys.executable, "-c", open(sys.argv[2]).read(), out, tag, sys.argv[4]],
                 start_new_session=True, stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
# Every rank's grandchild of this attempt ignores SIGTERM before it says so:
# only then does any rank exit (a rank's exit stops the others).
tags = [f"{attempt}-{r}.gc" for r in range(int(os.environ["LOCAL_WORLD_SIZE"]))]
for _ in range(3000):
    if all(os.path.exists(os.path.join(out, t)) for t in tags):
        break
    time.sleep(0.01)
sys.exit(int(sys.argv[3]))
"""


@contextlib.contextmanager
def orphan_job(procs, tmp_path, flags, code, mode):
    """Runs crun over forker.py workers that exit `code` after starting a
    detached grandchild (`mode`: "ignore" SIGTERM, or "term": exit on it);
    yields (rc, stderr, out dir, grandchild pids). Any grandchild left is
    killed, also when the test fails."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "orphan.py").write_text(ORPHAN)
    (tmp_path / "forker.py").write_text(FORKER)
    pids = []
    try:
        p = procs.spawn([bin_path("crun"), "--standalone", "--shutdown_timeout=1", *flags,
                         str(tmp_path / "forker.py"), str(out), str(tmp_path / "orphan.py"),
                         str(code), mode], env=agent_env())
        rc, _, err = finish(p, 120)
        pids += [int((out / f).read_text()) for f in os.listdir(out) if f.endswith(".gc")]
        yield rc, err, out, pids
    finally:
        for x in pids:
            if marked_alive(x):
                os.kill(x, 9)


def test_detached_grandchildren_die_with_their_attempt(procs, tmp_path):
    """Each worker starts a setsid()'d grandchild that ignores SIGTERM, then
    fails. The grandchildren of attempt 0 are gone before attempt 1 starts
    (its workers look), and none is left once crun has exited; crun names
    their pids."""
    with orphan_job(procs, tmp_path, ["--nproc_per_node=2", "--max_restarts=1"], 1,
                    "ignore") as (rc, err, out, pids):
        assert rc == 1, err
        assert len(pids) == 4, (os.listdir(out), err)
        assert [(out / f"seen-1-{r}").read_text() for r in (0, 1)] == ["", ""], err
        assert not [x for x in pids if marked_alive(x)], err
        for x in pids:
            assert re.search(rf"left behind .*with SIGTERM: pids [0-9, ]*\b{x}\b", err), err
        assert "did not exit within 1000 ms of SIGTERM: sending SIGKILL" in err, err


@pytest.mark.parametrize("mode", ["term", "ignore"])
def test_a_successful_workers_grandchild_gets_sigterm_first(procs, tmp_path, mode):
    """The worker exits 0 and leaves a detached grandchild: at crun's end it
    gets SIGTERM, named in a log line, and SIGKILL only if it ignores that;
    the job still succeeds and nothing is left."""
    with orphan_job(procs, tmp_path, ["--nproc_per_node=1"], 0, mode) as (rc, err, out, pids):
        assert rc == 0 and len(pids) == 1, (rc, os.listdir(out), err)
        assert not marked_alive(pids[0]), err
        assert re.search(rf"left behind .*with SIGTERM: pids {pids[0]}$", err, re.M), err
        killed = "of SIGTERM: sending SIGKILL" in err
        assert (out / "0-0.term").exists() == (mode == "term") and killed == (mode == "ignore"), err


# ---- a full log file system ----------------------------------------------------------------

LINES = """\
import sys
for i in range(int(sys.argv[1])):
    print(f"line {i:05d} " + "y" * 50)
"""


def test_teed_console_copy_survives_a_full_log_dir(procs, tmp_path):
    """--log_dir is a 64 KiB tmpfs (a mount namespace of the test's own) and
    the teed worker prints ~200 KB: every line still reaches the console,
    the job succeeds, and one warning names the file that could not grow.
    (A file system turned read-only under the job takes the same path, a
    failed write; remounting a tmpfs with files open for writing is refused,
    so only the full one is tested.)"""
    if os.geteuid() != 0:
        pytest.skip("needs root for a mount namespace with a tmpfs")
    n = 3000
    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "lines.py").write_text(LINES)
    p = procs.spawn(["unshare", "-m", "sh", "-c",
                     'mount -t tmpfs -o size=64k crun-full "$0" && exec "$@"', str(logs),
                     bin_path("crun"), "--standalone", "--nproc_per_node=1", "--tee=3",
                     f"--log_dir={logs}", str(tmp_path / "lines.py"), str(n)],
                    env=agent_env())
    rc, out, err = finish(p, 120)
    assert rc == 0, err[-3000:]
    got = re.findall(r"^\[default0\]:line (\d{5}) y{50}$", out, re.M)
    assert got == [f"{i:05d}" for i in range(n)], (len(got), err[-3000:])
    warned = [x for x in err.splitlines() if "cannot write" in x]
    assert len(warned) == 1, err[-3000:]
    assert re.search(r"'\S+/0/stdout\.log': No space left on device", warned[0]), warned


GROUP_CHILD = """\
import subprocess, sys
# A background child in the worker's own process group, left running.
child = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(f"child {child.pid}", flush=True)
"""


@pytest.mark.parametrize("code", [0, 1])
def test_a_background_child_left_by_its_worker_is_named(procs, tmp_path, code):
    """A worker exits leaving a child in its process group. Failed (1): the
    agent SIGKILLs what is left of the group at once. Succeeded (0): it is
    left running, as under torchrun, and stopped as an orphan at the job's
    end (SIGTERM first). Either way the log names the pids, and nothing
    outlives crun."""
    (tmp_path / "bg.py").write_text(GROUP_CHILD + f"sys.exit({code})\n")
    p = procs.spawn([bin_path("crun"), "--standalone", "--nproc_per_node=1",
                     str(tmp_path / "bg.py")], env=agent_env())
    rc, out, err = finish(p, 120)
    (child,) = re.findall(r"child (\d+)", out)
    assert rc == code, err
    fate = "exited with 0" if code == 0 else "failed"
    assert re.search(rf"worker 0 \(pid \d+\) {fate} leaving pids {child} in its process group",
                     err), err
    if code == 0:  # (a SIGKILLed one may be named too: not dead yet when crun looks)
        assert re.search(rf"left behind \(orphans adopted by crun\) with SIGTERM: pids {child}\b",
                         err), err
    try:
        with open(f"/proc/{child}/cmdline", "rb") as f:
            assert not f.read().startswith(b"sleep\0"), "the group's child outlived crun"
    except FileNotFoundError:
        pass


RESTART_WORKER = """\
#!/bin/sh
# Attempt 0: rank 1 says it runs, rank 0 waits for that and fails; attempt 1: both succeed.
[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] || exit 0
if [ "$LOCAL_RANK" = 1 ]; then touch "$1/running"; exec sleep 60; fi
i=0
while [ ! -e "$1/running" ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i + 1)); done
exit 1
"""


def test_a_restart_that_leaves_nothing_behind_reads_no_process_table(procs, tmp_path):
    """Finding what workers left behind reads every process's stat under /proc,
    and a restart of N workers did it N + 1 times (at each reap), a cost that
    grows with the node's processes. Whatever a worker leaves descends from a
    child the agent adopted, so with no child it does not know it skips the
    scan: a restart with nothing left behind opens /proc not once (the
    agent's loop thread, traced by strace; the orphan tests above still see
    what is left)."""
    strace = shutil.which("strace")
    assert strace, "strace is not installed (scripts/deps.sh installs it)"
    worker = tmp_path / "worker.sh"
    worker.write_text(RESTART_WORKER)
    worker.chmod(0o755)
    trace = tmp_path / "trace"
    # LeakSanitizer cannot stop a process that strace already traces.
    env = agent_env(ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0")
    p = procs.spawn([strace, "-qq", "-e", "trace=openat", "-o", str(trace), bin_path("crun"),
                     "--standalone", "--nproc_per_node=2", "--max_restarts=1",
                     "--stack_dump_on_stop=never", "--no_python", str(worker), str(tmp_path)],
                    env=env)
    rc, out, err = finish(p, 120)
    assert rc == 0, err
    assert "restarting workers (attempt 1 of 1 restarts)" in err, err
    scans = [line for line in trace.read_text().splitlines()
             if '"/proc", ' in line and "O_DIRECTORY" in line]
    assert scans == [], scans
