"""The agent's runtime against a hostile host (issue 28): wall-clock steps
under --worker_heartbeat_timeout (an LD_PRELOAD shim shifts the agent's
CLOCK_REALTIME, gettimeofday() and time(); file mtimes keep the kernel's real
time, as after a real `date -s`), a worker's detached grandchild that
ignores SIGTERM, and a log directory on a full file system."""
import os
import re
import subprocess

import pytest

from conftest import BUILD, bin_path

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
    return agent_env(LD_PRELOAD=SHIFT, CRUN_TEST_CLOCK_SHIFT_S=shift_s)


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
