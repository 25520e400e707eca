"""The torchrun-compatible launcher: real `crun` processes, tiny Python
workers (tests/integration/helpers/launch_task.py) run under /usr/bin/python3.
Covers the worker environment contract, flags, exit codes, restarts, the
failure summary, signals, orphans and logs."""
import json
import os
import re
import shutil
import socket
import tempfile
import signal
import subprocess
import sys
import time

import pytest

from conftest import BUILD, HELPERS, bin_path, free_port, torch_python

sys.path.insert(0, HELPERS)
from storecli import StoreCli  # noqa: E402

TASK = os.path.join(HELPERS, "launch_task.py")
PY = "/usr/bin/python3"



_TMP = {}


@pytest.fixture(autouse=True, scope="module")
def _private_tmpdir():
    """crun's default log dir is a new $TMPDIR/torchelastic_*: keep them all
    in one directory removed after the module."""
    _TMP["dir"] = tempfile.mkdtemp(prefix="crun-launch-")
    yield
    shutil.rmtree(_TMP.pop("dir"), ignore_errors=True)

def crun_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k not in ("OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE")}
    env["PYTHON_EXEC"] = PY
    env["TMPDIR"] = _TMP["dir"]
    env.update({k: str(v) for k, v in extra.items()})
    return env


# Every crun scenario runs twice: under crun, and under embed_crun, which is
# crun's own main with the agent embedded through libcrun's API (poll mode in
# its own poll() loop, workers started by a spawn hook, signals read from a
# signalfd and passed on with crun_agent_stop). Only the "crun" side changes.
_LAUNCHER = {}


@pytest.fixture(autouse=True, params=["crun", "embed"])
def crun_launcher(request):
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params if callspec else {}
    if request.param == "embed" and "torchrun" in (params.get("which"), params.get("launcher")):
        pytest.skip("torchrun's own run: nothing is embedded")
    _LAUNCHER["crun"] = (bin_path("crun") if request.param == "crun"
                         else os.path.join(BUILD, "tests", "helpers", "embed_crun"))
    assert os.access(_LAUNCHER["crun"], os.X_OK), f"{_LAUNCHER['crun']} is not built"
    yield request.param
    _LAUNCHER.clear()


def launcher_argv(which):
    """The command of a launcher under comparison: crun (or its embedded twin,
    see crun_launcher), or the real torchrun 2.x of the test venv (fails
    loudly when it is missing)."""
    if which == "crun":
        return [_LAUNCHER["crun"]]
    return [torch_python("2"), "-m", "torch.distributed.run"]


def start(procs, args, env=None, which="crun", **kw):
    return procs.spawn([*launcher_argv(which), *args], env=env or crun_env(), **kw)


def run(procs, args, env=None, timeout=60, which="crun"):
    p = start(procs, args, env, which)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"crun {args} did not finish within {timeout}s")
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def wait_files(d, suffix, n, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = [f for f in os.listdir(d) if f.endswith(suffix)]
        if len(got) >= n:
            return sorted(got)
        time.sleep(0.02)
    pytest.fail(f"only {os.listdir(d)} in {d}, wanted {n} *{suffix}")


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def load_envs(d, n):
    wait_files(d, ".json", n)
    return {int(f.split(".")[0]): json.load(open(os.path.join(d, f)))
            for f in os.listdir(d) if f.endswith(".json")}


# ---- environment ---------------------------------------------------------------

def test_standalone_env_matches_torchrun_contract(procs, tmp_path):
    rc, out, err = run(procs, ["--standalone", "--nproc_per_node=3", "--max_restarts=2",
                               TASK, "env", str(tmp_path)])
    assert rc == 0, err
    envs = load_envs(tmp_path, 3)
    assert sorted(envs) == [0, 1, 2]
    run_ids = {e["TORCHELASTIC_RUN_ID"] for e in envs.values()}
    assert len(run_ids) == 1 and len(run_ids.pop()) == 36  # a uuid4
    ports = {e["MASTER_PORT"] for e in envs.values()}
    assert len(ports) == 1
    for r, e in envs.items():
        assert e["LOCAL_RANK"] == str(r) and e["RANK"] == str(r) and e["ROLE_RANK"] == str(r)
        assert e["GROUP_RANK"] == "0" and e["GROUP_WORLD_SIZE"] == "1"
        assert e["LOCAL_WORLD_SIZE"] == "3" and e["WORLD_SIZE"] == "3"
        assert e["ROLE_WORLD_SIZE"] == "3" and e["ROLE_NAME"] == "default"
        assert e["MASTER_ADDR"] == "127.0.0.1" and int(e["MASTER_PORT"]) > 0
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert e["TORCHELASTIC_MAX_RESTARTS"] == "2"
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert e["NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert e["OMP_NUM_THREADS"] == "1"
        ef = e["TORCHELASTIC_ERROR_FILE"]
        assert ef.endswith(f"/attempt_0/{r}/error.json"), ef
        assert os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(ef)))) \
            .startswith(e["TORCHELASTIC_RUN_ID"] + "_")
    assert "Setting OMP_NUM_THREADS environment variable for each process to be 1" in err


def test_inherited_values_win_over_defaults(procs, tmp_path):
    env = crun_env(OMP_NUM_THREADS=7, NCCL_ASYNC_ERROR_HANDLING=0, MY_VAR="kept")
    rc, _, err = run(procs, ["--nproc_per_node=2", f"--master_port={free_port()}",
                             "--role=trainer", "--rdzv_id=job7", TASK, "env", str(tmp_path)], env)
    assert rc == 0, err
    assert "Setting OMP_NUM_THREADS" not in err
    for r, e in load_envs(tmp_path, 2).items():
        assert e["OMP_NUM_THREADS"] == "7" and e["NCCL_ASYNC_ERROR_HANDLING"] == "0"
        assert e["MY_VAR"] == "kept" and e["ROLE_NAME"] == "trainer"
        assert e["TORCHELASTIC_RUN_ID"] == "job7"


def test_static_two_agents_heterogeneous_nproc(procs, tmp_path):
    port = free_port()
    common = ["--nnodes=2", f"--master_port={port}", "--master_addr=127.0.0.1"]
    a1 = start(procs, [*common, "--node_rank=1", "--nproc_per_node=3", TASK, "env", str(tmp_path)])
    a0 = start(procs, [*common, "--node_rank=0", "--nproc_per_node=1", TASK, "env", str(tmp_path)])
    assert a0.wait(timeout=60) == 0, a0.stderr.read().decode()
    assert a1.wait(timeout=60) == 0, a1.stderr.read().decode()
    envs = load_envs(tmp_path, 4)
    want = {0: (0, 0), 1: (1, 0), 2: (1, 1), 3: (1, 2)}  # rank: (group rank, local rank)
    for r, e in envs.items():
        g, lr = want[r]
        assert (e["GROUP_RANK"], e["LOCAL_RANK"]) == (str(g), str(lr))
        assert e["WORLD_SIZE"] == "4" and e["GROUP_WORLD_SIZE"] == "2"
        assert e["LOCAL_WORLD_SIZE"] == ("1" if g == 0 else "3")
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == str(port)
        assert e["TORCHELASTIC_RUN_ID"] == "none" and e["ROLE_RANK"] == str(r)


def test_pet_env_aliases_and_cli_precedence(procs, tmp_path):
    d1, d2 = tmp_path / "a", tmp_path / "b"
    d1.mkdir()
    d2.mkdir()
    env = crun_env(PET_NPROC_PER_NODE=2, PET_STANDALONE=1, PET_MAX_RESTARTS=4)
    rc, _, err = run(procs, [TASK, "env", str(d1)], env)
    assert rc == 0, err
    envs = load_envs(d1, 2)
    assert len(envs) == 2 and envs[0]["TORCHELASTIC_MAX_RESTARTS"] == "4"
    rc, _, err = run(procs, ["--nproc-per-node", "3", "--max-restarts=1", TASK, "env", str(d2)], env)
    assert rc == 0, err
    envs = load_envs(d2, 3)
    assert len(envs) == 3 and envs[0]["TORCHELASTIC_MAX_RESTARTS"] == "1"


def test_both_spellings_and_abbreviations(procs, tmp_path):
    rc, _, err = run(procs, ["--standalone", "--nproc_per", "2", "--max-restarts", "0",
                             "--local_ranks_filter=0", "--tee", "3", TASK, "print"])
    assert rc == 0, err
    assert "[default0]:err-line rank=0" in err and "rank=1" not in err


INOTIFY_HOLDER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 4096:
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        break
    fds.append(fd)
print(len(fds), ctypes.get_errno(), flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("tee", ["0", "3"])
def test_a_user_out_of_inotify_instances_still_runs_jobs(procs, tmp_path, tee):
    """One user may hold fs.inotify.max_user_instances (128) inotify instances,
    and every agent took one at start: the 129th agent of a user on a machine
    failed with 'too many open files' before its workers ran (failed before).
    Now no job needs one: teed output comes through a pipe the agent reads."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run as a user of its own")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    holder = procs.spawn([*as_nobody, sys.executable, "-c", INOTIFY_HOLDER])
    got = holder.stdout.readline().decode().split()
    assert got and int(got[0]) > 0 and got[1] == "24", f"holder: {got}"  # EMFILE
    logs = tempfile.mkdtemp(prefix="crun-inotify-")  # pytest's tmp_path is root's only
    try:
        os.chmod(logs, 0o777)
        p = procs.spawn([*as_nobody, *launcher_argv("crun"), "--standalone",
                         "--nproc_per_node=2", "--max_restarts=0", "--log_dir", logs,
                         "--tee", tee, TASK, "print"], env=crun_env())
        out, err = p.communicate(timeout=60)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    out, err = out.decode(errors="replace"), err.decode(errors="replace")
    assert p.returncode == 0, err
    assert "err-line rank=0" in err and "err-line rank=1" in err, err
    if tee == "3":
        assert "[default0]:err-line rank=0" in err, err

# ---- command line ------------------------------------------------------------------

@pytest.mark.parametrize("args,env,needle", [
    (["--nproc_per_node=0"], {}, "--nproc_per_node"),
    (["--nproc-per-node=lots"], {}, "--nproc-per-node"),
    (["--max_restarts=-1"], {}, "--max_restarts"),
    (["--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1:2379,,x"], {}, "--rdzv_endpoint"),
    (["--rdzv_backend=etcd-v2", "--rdzv_conf=protocol=gopher"], {}, "protocol"),
    # c10d is supported (tests/integration/test_elastic.py); its rdzv_conf is checked.
    (["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:1", "--rdzv_conf=bogus=1"], {},
     "--rdzv_conf"),
    (["--rdzv_backend=zookeeper"], {}, "--rdzv_backend"),
    (["--logs_specs=x"], {}, "--logs_specs"),
    (["--numa-binding=nodes"], {}, "--numa-binding"),
    (["--event_log_handler=kafka"], {}, "--event_log_handler"),
    (["--run_path=1"], {}, "--run_path"),
    ([], {"LOGLEVEL": "LOUD"}, "LOGLEVEL"),
    (["--bogus=1"], {}, "--bogus"),
    (["--master_port=70000"], {}, "--master_port"),
    (["--nnodes=1:2"], {}, "--nnodes"),
    (["--nnodes=2", "--node_rank=2"], {}, "--node_rank"),
    (["-m", "--no_python"], {}, "--no-python"),
    (["--redirects=5"], {}, "--redirects"),
    (["--tee", "0:9"], {}, "--tee"),
    (["--signals_to_handle=SIGNOPE"], {}, "--signals_to_handle"),
    (["--shutdown_timeout=soon"], {}, "--shutdown_timeout"),
    (["--nproc_per_node"], {}, "--nproc_per_node"),
    ([], {"PET_NPROC_PER_NODE": "x"}, "PET_NPROC_PER_NODE"),
    ([], {"PET_STANDALONE": "yes"}, "PET_STANDALONE"),
    ([], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "x"}, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),
])
def test_bad_flags_exit_2_naming_the_flag(procs, args, env, needle):
    rc, out, err = run(procs, [*args, TASK, "print"], crun_env(**env))
    assert rc == 2, (rc, err)
    assert needle in err, err


def test_missing_program_exits_2(procs):
    rc, _, err = run(procs, ["--nproc_per_node=2"])
    assert rc == 2 and "training_script" in err


def test_nproc_gpu_without_gpus_and_cpu_auto(procs, tmp_path):
    has_gpu = os.path.isdir("/proc/driver/nvidia/gpus") or any(
        n[len("nvidia"):].isdigit() for n in os.listdir("/dev") if n.startswith("nvidia"))
    rc, _, err = run(procs, ["--nproc_per_node=gpu", "--standalone", TASK, "print"])
    if has_gpu:
        assert rc == 0, err
    else:
        assert rc == 2 and "gpu" in err
    rc, out, err = run(procs, ["--nproc_per_node=cpu", "--standalone", TASK, "print"])
    assert rc == 0, err
    assert out.count("out-line") == os.cpu_count()


def test_help_and_version(procs):
    rc, out, _ = run(procs, ["--help"])
    assert rc == 0 and "--nproc_per_node" in out and "--max_restarts" in out
    rc, out, _ = run(procs, ["--version"])
    assert rc == 0 and out.startswith("crun ")


def test_options_end_at_the_program(procs, tmp_path):
    script = tmp_path / "args.py"
    # One write per worker: both share crun's stdout (as under torchrun).
    script.write_text("import sys, os\n"
                      "sys.stdout.write(f\"ARGS {os.environ['LOCAL_RANK']} {sys.argv[1:]}\\n\")\n")
    rc, out, err = run(procs, ["--standalone", "--nproc_per_node=2", str(script),
                               "--nproc_per_node=9", "-m", "x${local_rank}y"])
    assert rc == 0, err
    assert "ARGS 0 ['--nproc_per_node=9', '-m', 'x0y']" in out
    assert "ARGS 1 ['--nproc_per_node=9', '-m', 'x1y']" in out


def test_module_mode_runs_python_dash_m(procs, tmp_path):
    (tmp_path / "mymod.py").write_text("import sys\nprint('MOD', '-u' in sys.orig_argv)\n")
    env = crun_env(PYTHONPATH=str(tmp_path))
    rc, out, err = run(procs, ["--standalone", "-m", "mymod"], env)
    assert rc == 0, err
    assert "MOD True" in out  # -u as torchrun


def test_elf_and_shell_scripts_run_directly(procs, tmp_path):
    rc, out, err = run(procs, ["--standalone", "--nproc_per_node=2", "/bin/echo", "hi"])
    assert rc == 0, err
    assert out.count("hi\n") == 2
    sh = tmp_path / "w.sh"
    sh.write_text("#!/bin/sh\necho \"sh rank $RANK\"\n")
    sh.chmod(0o755)
    rc, out, err = run(procs, ["--standalone", "--nproc_per_node=2", str(sh)])
    assert rc == 0, err
    assert "sh rank 0" in out and "sh rank 1" in out
    rc, out, err = run(procs, ["--standalone", "--no_python", "echo", "np"])
    assert rc == 0 and "np" in out


def test_exec_failure_is_127_with_errno_text(procs):
    rc, _, err = run(procs, ["--standalone", "--nproc_per_node=2", "--no_python",
                             "/nonexistent/prog"])
    assert rc == 1
    assert "exitcode  : 127" in err
    assert "No such file or directory" in err
    assert "/nonexistent/prog FAILED" in err


# ---- failures and restarts ------------------------------------------------------------

def test_restart_recovers_with_restart_count(procs, tmp_path):
    rc, out, err = run(procs, ["--standalone", "--nproc_per_node=2", "--max_restarts=2",
                               f"--log_dir={tmp_path}", TASK, "exit", "3", "1", "1"])
    assert rc == 0, err
    assert "attempt 1 rank 0" in out and "attempt 1 rank 1" in out
    assert "restarting workers" in err
    runs = os.listdir(tmp_path)
    assert len(runs) == 1
    assert sorted(os.listdir(tmp_path / runs[0])) == ["attempt_0", "attempt_1"]


@pytest.mark.parametrize("redirect", [False, True])
def test_restarts_exhausted_prints_root_cause_and_exits_1(procs, redirect):
    # Without a redirect the worker writes to crun's own stderr (its lines are
    # above the summary); with one, the summary reads its stderr.log back.
    rc, out, err = run(procs, ["--standalone", "--nproc_per_node=2", "--max_restarts=1",
                               *(["--redirects=2"] if redirect else []),
                               TASK, "exit", "3", "1", "99"])
    assert rc == 1
    assert "attempt 1 rank 1" in out
    assert f"{TASK} FAILED" in err
    block = err[err.index("Root Cause (first observed failure):"):]
    assert "rank      : 1 (local_rank: 1)" in block
    assert "exitcode  : 3 (pid: " in block
    assert "error_file: <N/A>" in block
    assert "rank 1 exits 3" in (block if redirect else err)  # the failed worker's stderr
    assert "Failures:\n  <NO_OTHER_FAILURES>" in err  # rank 0 was stopped, not failed
    assert err.count("=" * 60) >= 2 and "-" * 60 in err


@pytest.mark.parametrize("which", ["crun", "torchrun"])
def test_summary_lists_every_failed_rank(procs, tmp_path, which):
    # Issue 11.6: both ranks exited 2, crun said "Failures: <NO_OTHER_FAILURES>".
    # The ranks ignore SIGTERM so that a quick stop cannot turn a failure
    # into a stopped worker under either launcher.
    rc, _, err = run(procs, ["--standalone", "--nproc_per_node=2", TASK, "fail_together",
                             str(tmp_path), "2"], which=which)
    assert rc == 1
    assert "<NO_OTHER_FAILURES>" not in err, err[-3000:]
    for r in (0, 1):
        assert f"rank      : {r} (local_rank: {r})" in err
    assert err.count("exitcode  : 2 (pid: ") == 2


def read_until(stream, pattern, timeout_s):
    """Reads a pipe (select, never blocking past the deadline) until pattern
    shows up in what was read."""
    import select
    deadline, got = time.monotonic() + timeout_s, b""
    while not re.search(pattern.encode(), got):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream.fileno()], [], [], left)[0]:
            pytest.fail(f"no {pattern!r} within {timeout_s}s in {got[-2000:]!r}")
        chunk = os.read(stream.fileno(), 65536)
        if not chunk:
            pytest.fail(f"EOF before {pattern!r}: {got[-2000:]!r}")
        got += chunk


def test_stopped_worker_is_reported_and_still_stoppable(procs, tmp_path, crun_launcher):
    # Issue 11.3: a stopped worker held the job silently; a stop signal to
    # its group stayed pending until the grace period ran out.
    p = start(procs, ["--standalone", "--nproc_per_node=2", "--shutdown_timeout=600", TASK,
                      "trap", str(tmp_path), "0"])
    wait_files(tmp_path, ".ready", 2)
    pid = int((tmp_path / "1.ready").read_text())
    os.kill(pid, signal.SIGSTOP)
    if crun_launcher == "crun":
        read_until(p.stderr, rf"worker 1 \(pid {pid}\) is stopped by SIGSTOP", 30)
    else:
        # Poll mode takes no SIGCHLD, so a stop is not reported when it
        # happens; the agent asks before it signals, which must still work.
        wait_stopped(pid, 30)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 1  # far below the 600 s grace
    assert (tmp_path / "1.sig").read_text().split() == ["15"]


def wait_stopped(pid, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.02)
    pytest.fail(f"pid {pid} did not stop")


def test_worker_exit_code_is_not_passed_through(procs):
    rc, _, _ = run(procs, ["--standalone", TASK, "exit", "7", "-1", "99"])
    assert rc == 1


def test_error_file_message_and_copy_to_agent_error_file(procs, tmp_path):
    own = tmp_path / "agent_error.json"
    rc, _, err = run(procs, ["--standalone", "--nproc_per_node=2", TASK, "errfile"],
                     crun_env(TORCHELASTIC_ERROR_FILE=own))
    assert rc == 1
    assert "boom line" in err and "ValueError: launch_task boom" in err
    assert "/attempt_0/0/error.json" in err
    data = json.loads(own.read_text())
    assert data["message"]["message"] == "ValueError: launch_task boom"
    assert data["message"]["errorCode"] == 1


def test_sigkill_not_sent_by_crun_names_the_oom_killer(procs):
    rc, _, err = run(procs, ["--standalone", "--nproc_per_node=2", TASK, "selfkill"])
    assert rc == 1
    assert "exitcode  : -9" in err
    assert "Signal 9 (SIGKILL)" in err and "OOM killer" in err


# ---- signals and orphans -------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_are_forwarded_and_crun_exits_1(procs, tmp_path, sig):
    p = start(procs, ["--standalone", "--nproc_per_node=2", TASK, "trap", str(tmp_path), "0"])
    wait_files(tmp_path, ".ready", 2)
    p.send_signal(sig)
    assert p.wait(timeout=30) == 1
    for r in (0, 1):
        assert (tmp_path / f"{r}.sig").read_text().split() == [str(int(sig))]


def test_signals_to_handle_is_configurable(procs, tmp_path):
    p = start(procs, ["--standalone", "--signals_to_handle=SIGUSR1,SIGTERM", TASK, "trap",
                      str(tmp_path), "0"])
    wait_files(tmp_path, ".ready", 1)
    p.send_signal(signal.SIGUSR1)
    assert p.wait(timeout=30) == 1
    assert (tmp_path / "0.sig").read_text().split() == [str(int(signal.SIGUSR1))]


def test_shutdown_timeout_then_sigkill(procs, tmp_path):
    p = start(procs, ["--standalone", "--nproc_per_node=2", "--shutdown_timeout=0.5", TASK,
                      "trap", str(tmp_path), "1"])
    wait_files(tmp_path, ".ready", 2)
    pids = [int((tmp_path / f"{r}.ready").read_text()) for r in (0, 1)]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 1
    assert not any(pid_alive(x) for x in pids)
    assert (tmp_path / "0.sig").read_text().split() == ["15"]


def test_second_sigint_skips_the_grace_period(procs, tmp_path):
    p = start(procs, ["--standalone", "--nproc_per_node=2", "--shutdown_timeout=600", TASK,
                      "trap", str(tmp_path), "1"])
    wait_files(tmp_path, ".ready", 2)
    p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # both workers saw the first one
        if all((tmp_path / f"{r}.sig").exists() for r in (0, 1)):
            break
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=30) == 1  # far below the 600 s grace


@pytest.mark.parametrize("target", ["pid", "pgid"])
def test_no_worker_or_grandchild_survives_sigkill_of_the_agent(procs, tmp_path, target):
    # "pgid": kill -9 -PGID of crun's group took the guard along (issue 8.7).
    p = start(procs, ["--standalone", "--nproc_per_node=2", TASK, "grandchild", str(tmp_path)])
    wait_files(tmp_path, ".ready", 2)
    pids = []
    for r in (0, 1):
        pids += [int(x) for x in (tmp_path / f"{r}.pids").read_text().split()]
    assert all(pid_alive(x) for x in pids)
    if target == "pgid":
        os.killpg(os.getpgid(p.pid), signal.SIGKILL)
    else:
        os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(pid_alive(x) for x in pids):
        time.sleep(0.05)
    assert not [x for x in pids if pid_alive(x)]


# ---- logs --------------------------------------------------------------------------------

def test_redirect_and_tee_write_torchrun_log_layout(procs, tmp_path):
    rc, out, err = run(procs, ["--standalone", "--nproc_per_node=2", f"--log_dir={tmp_path}",
                               "--redirects=1", "--tee=2", TASK, "print"])
    assert rc == 0, err
    assert "out-line" not in out  # redirected only
    assert "[default0]:err-line rank=0" in err and "[default1]:err-line rank=1" in err
    (run_dir,) = os.listdir(tmp_path)
    for r in (0, 1):
        d = tmp_path / run_dir / "attempt_0" / str(r)
        assert (d / "stdout.log").read_text() == f"out-line rank={r}\n"
        assert (d / "stderr.log").read_text() == f"err-line rank={r}\n"


def test_per_rank_redirect_map_and_prefix_template(procs, tmp_path):
    env = crun_env(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="<$role_name:$rank:${local_rank}> ")
    rc, out, err = run(procs, ["--standalone", "--nproc_per_node=2", f"--log_dir={tmp_path}",
                               "--tee=0:1", "-r", "1:3", TASK, "print"], env)
    assert rc == 0, err
    assert "<default:0:0> out-line rank=0" in out
    assert "err-line rank=0\n" in err and "[default" not in err
    assert "rank=1" not in out + err


BYTES = b"progress 1\rprogress 2\r" + b"L" * 300000 + b"\nline two\ntail without newline"


@pytest.mark.parametrize("which", ["crun", "torchrun"])
@pytest.mark.parametrize("mode", ["plain", "redirect", "tee"])
def test_output_passes_through_as_written(procs, tmp_path, which, mode):
    # Issue 11.2: crun cut a 300,000-byte line every 16,384 bytes, held \r
    # progress back and added a final newline, on the console and in files.
    flags = {"plain": [], "redirect": ["--redirects=3"], "tee": ["--tee=3"]}[mode]
    p = start(procs, ["--standalone", "--nproc_per_node=1", f"--log_dir={tmp_path}", *flags,
                      TASK, "bytes"], which=which)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err[-3000:]
    if mode == "plain":
        assert out == BYTES and BYTES in err
    if mode == "redirect":
        assert BYTES not in out
    if mode != "plain":
        (logs,) = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs
                   if f == "stdout.log"]
        assert open(logs, "rb").read() == BYTES  # whole, nothing added
        assert open(logs.replace("stdout.log", "stderr.log"), "rb").read() == BYTES
    if mode == "tee" and which == "crun":
        # The prefix at line starts only; \r and the unfinished line kept.
        # (torchrun's tail reads text lines: \r becomes a line end there.)
        want = b"[default0]:" + BYTES.replace(b"\n", b"\n[default0]:")
        assert out == want and want in err


def _spawn_in_pty(cmd, env):
    """Starts cmd as the session leader of a new pty, like a login shell
    would: the pty is its controlling terminal."""
    import pty
    import termios
    master, slave = pty.openpty()

    def ctty():
        os.setsid()
        import fcntl
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    p = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env,
                         preexec_fn=ctty, close_fds=True)
    os.close(slave)
    return p, master


@pytest.mark.parametrize("which", ["crun", "torchrun"])
@pytest.mark.parametrize("mode", ["plain", "tee"])
def test_worker_owns_the_terminal_like_under_torchrun(procs, tmp_path, which, mode):
    # Issue 11.2/11.3: a worker saw a pipe instead of the terminal, and
    # input() stopped it with SIGTTIN (its own group in crun's session).
    flags = ["--tee=3", f"--log_dir={tmp_path / 'logs'}"] if mode == "tee" else []
    p, master = _spawn_in_pty([*launcher_argv(which), "--standalone", "--nproc_per_node=1", *flags,
                               TASK, "tty", str(tmp_path)], crun_env())
    procs.procs.append(p)
    try:
        wait_files(tmp_path, ".tty", 1)
        # A teed stdout is a file under both launchers; stdin stays the tty.
        assert (tmp_path / "0.tty").read_text() == ("True True" if mode == "plain"
                                                     else "True False")
        os.write(master, b"typed by the user\n")
        assert p.wait(timeout=60) == 0
        assert (tmp_path / "0.input").read_text() == "typed by the user"
    finally:
        os.close(master)


@pytest.mark.parametrize("which", ["crun", "torchrun"])
@pytest.mark.parametrize("mode", ["plain", "tee"])
def test_blocked_console_never_blocks_the_stores(procs, tmp_path, which, mode):
    # Issue 8.6: `crun ... flooding_app | sleep 12` stopped store replies for
    # every node: lines went to a blocking stdout on the loop that serves the
    # stores. Here nobody reads crun's stdout while a client uses the store.
    n = 60000  # ~7 MB: far past the pipe and crun's console queue
    flags = ["--tee=3", f"--log_dir={tmp_path / 'logs'}"] if mode == "tee" else []
    p = start(procs, ["--standalone", "--nproc_per_node=2", *flags, TASK, "flood",
                      str(tmp_path), str(n)], which=which)
    wait_files(tmp_path, "port", 1)
    port = int((tmp_path / "port").read_text())
    if mode == "tee":  # the worker wrote it all to its file; crun is copying
        wait_files(tmp_path, "flooded", 1)
    time.sleep(1)  # let the console queue and the pipe fill up
    lat = []
    cli = StoreCli(procs, os.path.join(BUILD, "tests", "helpers", "store_cli"), "127.0.0.1", port, 2,
                   timeout_ms=20000, connect_timeout_ms=20000)
    for i in range(20):
        t0 = time.monotonic()
        assert cli.cmd(f"set blocked/k{i} v{i}", 30) == "OK"
        assert cli.cmd(f"get blocked/k{i}", 30) == f'VAL "v{i}"'
        lat.append(time.monotonic() - t0)
    cli.close()
    print(f"{which} {mode}: store set+get under a blocked console: "
          f"median {sorted(lat)[len(lat) // 2] * 1000:.1f} ms, max {max(lat) * 1000:.1f} ms")
    (tmp_path / "go").write_text("")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    if mode == "tee":
        (logs,) = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "logs") for f in fs
                   if f == "stdout.log" and os.path.basename(d) == "0"]
        assert open(logs, "rb").read().count(b"\n") == n  # the file lost nothing
        if which == "crun":
            dropped = [int(x) for x in re.findall(rb"\[crun: (\d+) lines dropped\]", out)]
            # A line counts where it starts (its prefix): one whose start was
            # printed and whose rest was dropped shows as "[default0]:flo".
            assert dropped and sum(dropped) + out.count(b"[default0]:") == n
    else:
        assert out.count(b"\n") == n  # the worker wrote to the pipe itself


@pytest.mark.parametrize("which", ["crun", "torchrun"])
def test_hostname_in_the_prefix_template(procs, which):
    # Issue 11.5: ${hostname} was printed literally.
    env = crun_env(TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="<${hostname}:${rank}>")
    rc, out, err = run(procs, ["--standalone", "--nproc_per_node=1", "--tee=3", TASK, "print"],
                       env, which=which)
    assert rc == 0, err
    assert f"<{socket.gethostname()}:0>out-line rank=0" in out


@pytest.mark.parametrize("which", ["crun", "torchrun"])
def test_virtual_local_rank_keeps_inherited_devices(procs, tmp_path, which):
    # Issue 11.4: with CUDA_VISIBLE_DEVICES=4,5 the workers got 0 and 1.
    env = crun_env(CUDA_VISIBLE_DEVICES="4,5")
    rc, _, err = run(procs, ["--standalone", "--nproc_per_node=2", "--virtual-local-rank",
                             TASK, "env", str(tmp_path)], env, which=which)
    assert rc == 0, err
    envs = load_envs(tmp_path, 2)
    assert [(envs[r]["LOCAL_RANK"], envs[r]["CUDA_VISIBLE_DEVICES"]) for r in (0, 1)] == \
        [("0", "4"), ("0", "5")]


@pytest.mark.parametrize("which", ["crun", "torchrun"])
def test_default_log_dir_names_match_torchrun(procs, tmp_path, which):
    # Issue 11.10: torchelastic_XXXXXXXX left two literal X's.
    env = crun_env(TMPDIR=tmp_path)
    rc, _, err = run(procs, ["--standalone", "--redirects=1", TASK, "print"], env, which=which)
    assert rc == 0, err
    (base,) = os.listdir(tmp_path)
    assert re.fullmatch(r"torchelastic_[a-z0-9_]{8}", base), base
    (run_dir,) = os.listdir(tmp_path / base)
    assert re.fullmatch(r"[0-9a-f-]{36}_[a-z0-9_]{8}", run_dir), run_dir  # <uuid run id>_


@pytest.mark.parametrize("which", ["crun", "torchrun"])
def test_loglevel_is_honoured(procs, which):
    # Issue 11.10: LOGLEVEL=INFO shows the launcher's INFO lines, the default
    # (WARNING) does not.
    args = ["--standalone", "--nproc_per_node=1", TASK, "print"]
    rc, _, quiet = run(procs, args, crun_env(LOGLEVEL="WARNING"), which=which)
    assert rc == 0, quiet
    rc, _, chatty = run(procs, args, crun_env(LOGLEVEL="INFO"), which=which)
    assert rc == 0, chatty
    noise = [ln for ln in chatty.splitlines() if "rank=0" not in ln]
    assert len(noise) >= 3 and all("rank=0" in ln for ln in quiet.splitlines() if ln), quiet


@pytest.mark.parametrize("which", ["crun", "torchrun"])
def test_python_env_does_not_pick_the_interpreter(procs, tmp_path, which):
    # Issue 11.7: an unrelated $PYTHON changed crun's interpreter; torchrun
    # uses PYTHON_EXEC or its own. crun: PYTHON_EXEC, else python3.
    script = tmp_path / "who.py"
    script.write_text("import sys\nprint('EXE', sys.executable)\n")
    env = crun_env(PYTHON="/bin/false")
    del env["PYTHON_EXEC"]
    rc, out, err = run(procs, ["--standalone", str(script)], env, which=which)
    assert rc == 0, err
    assert "EXE " in out and "/bin/false" not in out
    env["PYTHON_EXEC"] = PY
    rc, out, err = run(procs, ["--standalone", str(script)], env, which=which)
    assert rc == 0 and f"EXE {PY}" in out, err


@pytest.mark.parametrize("which", ["crun", "torchrun"])
def test_duplicate_filters_write_torchruns_files(procs, tmp_path, which):
    # Issue 11.9: matching lines of teed streams, prefixed, in
    # <run>/attempt_<n>/filtered_std{out,err}.log.
    rc, _, err = run(procs, ["--standalone", "--nproc-per-node=2", "--tee=3",
                             f"--log-dir={tmp_path}", "--duplicate-stdout-filters=out-line",
                             "--duplicate-stderr-filters=nothing", TASK, "print"], which=which)
    assert rc == 0, err
    (run_dir,) = os.listdir(tmp_path)
    attempt = tmp_path / run_dir / "attempt_0"
    assert sorted((attempt / "filtered_stdout.log").read_text().splitlines()) == \
        ["[default0]:out-line rank=0", "[default1]:out-line rank=1"]
    assert (attempt / "filtered_stderr.log").read_text() == ""


@pytest.mark.skipif(os.path.isdir("/sys/bus/pci/drivers/nvidia"), reason="this machine has GPUs")
@pytest.mark.parametrize("which,needle", [("crun", "fewer NVIDIA GPUs"),
                                          ("torchrun", "No accelerator available")])
def test_numa_binding_without_gpus_fails_clearly(procs, which, needle):
    # Issue 11.9 (the mapping itself: test_agent_core/test_agent_api on a fake sysfs).
    rc, out, err = run(procs, ["--standalone", "--numa-binding=node", TASK, "print"],
                       which=which)
    assert rc == 1 and needle in err, err[-2000:]
    assert "out-line" not in out  # nothing started


def test_log_dir_dev_null_sets_empty_error_file(procs, tmp_path):
    rc, _, err = run(procs, ["--standalone", "--log_dir=/dev/null", TASK, "env", str(tmp_path)])
    assert rc == 0, err
    assert load_envs(tmp_path, 1)[0]["TORCHELASTIC_ERROR_FILE"] == ""


# ---- static exit barrier ------------------------------------------------------------------

def test_static_node0_leaves_last(procs, tmp_path):
    port = free_port()
    common = ["--nnodes=2", f"--master_port={port}", "--nproc_per_node=1"]
    slow = tmp_path / "slow.sh"
    slow.write_text("#!/bin/sh\n[ \"$GROUP_RANK\" = 1 ] && sleep 1\nexit 0\n")
    slow.chmod(0o755)
    a0 = start(procs, [*common, "--node_rank=0", str(slow)])
    a1 = start(procs, [*common, "--node_rank=1", str(slow)])
    deadline = time.monotonic() + 60
    while a0.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    # Node 1's worker is the slow one, yet node 0 (serving the store) waits
    # for it: node 1 passes the whole exit barrier against node 0's store.
    assert a0.returncode == 0, a0.stderr.read().decode()
    assert a1.wait(timeout=30) == 0
    err1 = a1.stderr.read().decode()
    assert "exit barrier" not in err1, err1


def test_store_port_in_use_fails_with_exit_1(procs):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc, _, err = run(procs, [f"--master_port={port}", TASK, "print"])
    assert rc == 1
    assert str(port) in err and "agent store" in err


def test_static_join_timeout_names_the_missing_agents(procs):
    rc, _, err = run(procs, ["--nnodes=2", "--node_rank=1", f"--master_port={free_port()}",
                             "--rdzv_conf=timeout=1", TASK, "print"])
    assert rc == 1
    assert "rendezvous failed" in err and "agent store" in err


def test_static_duplicate_node_rank_is_refused(procs):
    port = free_port()
    common = ["--nnodes=3", f"--master_port={port}", "--rdzv_conf=timeout=20", TASK, "print"]
    a0 = start(procs, ["--node_rank=0", *common])
    b1 = start(procs, ["--node_rank=1", *common])
    c1 = start(procs, ["--node_rank=1", *common])
    deadline = time.monotonic() + 30
    while b1.poll() is None and c1.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    loser = b1 if b1.poll() is not None else c1
    assert loser.wait(timeout=5) == 1
    assert "--node_rank=1" in loser.stderr.read().decode()
    for p in (a0, b1, c1):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=30) == 1


# ---- torchrun 2.x parity (issue 11): the same command under crun and torchrun ----------------

LAUNCHERS = ["crun", "torchrun"]


def start_with(procs, which, args, env=None):
    return start(procs, args, env, which)  # crun_env sets PYTHON_EXEC for both


def run_with(procs, which, args, env=None, timeout=180):
    return run(procs, args, env, timeout, which)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_two_plain_single_node_runs_do_not_collide(procs, tmp_path, launcher):
    """Item 1: no --master-port/--rdzv-endpoint and one node: a free port and a
    uuid run id, so two runs on one host overlap (failed before: both bound
    29500 and the second exited 1 with 'address already in use')."""
    ps = [start_with(procs, launcher, ["--nproc-per-node=2", TASK, "hold", str(tmp_path), "4"])
          for _ in range(2)]
    for p in ps:
        assert p.wait(timeout=180) == 0, p.stderr.read().decode()
    envs = [json.load(open(f)) for f in tmp_path.glob("*.json")]
    assert len(envs) == 4
    run_ids = {e["TORCHELASTIC_RUN_ID"] for e in envs}
    assert len(run_ids) == 2 and all(len(r) == 36 for r in run_ids), run_ids
    assert len({e["MASTER_PORT"] for e in envs}) == 2


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("flags", [
    ["--log-line-prefix-template=[x${local_rank}]", "--tee=3"],
    ["--logs-specs=default"],
    ["--duplicate-stdout-filters=out-line", "--duplicate_stderr_filters", "err-line,,x"],
    ["--event-log-handler", "null"],
    ["--numa-binding=node"] if os.path.isdir("/proc/driver/nvidia/gpus") else ["--role=r"],
], ids=["prefix-template", "logs-specs", "duplicate-filters", "event-null", "numa-or-role"])
def test_torchrun_2x_flags_are_accepted(procs, launcher, flags):
    rc, out, err = run_with(procs, launcher, [*flags, "--nproc-per-node=2", TASK, "print"])
    assert rc == 0, err
    assert "out-line rank=0" in out and "out-line rank=1" in out
    if "--tee=3" in flags:
        assert "[x0]" in out + err and "[x1]" in out + err


FLAG_ERRORS = {
    "logs-specs": (["--logs-specs=x"], "torchrun.logs_specs"),
    "numa-choice": (["--numa-binding=nodes"], "--numa-binding"),
    "completion-shell": (["--print-completion=fish"], "--print-completion"),
    "xpu": (["--nproc-per-node=xpu"], "xpu"),  # no Intel XPU on the test machines
}

# torchrun's __main__ once per case, in one interpreter: what `python -m
# torch.distributed.run ARGS` runs, less importing torch (~2 s of CPU) again
# for every case. Each case gets its own stderr (fd 2, so logging handlers
# made at import time are caught too) and the exit status the interpreter
# would give it: SystemExit's code, or 1 and the traceback.
TORCHRUN_CASES = r"""
import json, os, runpy, sys, tempfile, traceback
cases, res = json.loads(sys.argv[1]), {}
for name, argv in cases.items():
    with tempfile.TemporaryFile() as f:
        sys.stdout.flush(); sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        sys.argv = ["torchrun", *argv]
        try:
            runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            rc = 1
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        res[name] = [rc, f.read().decode(errors="replace")]
print("CASES " + json.dumps(res))
"""
_TORCHRUN_ERRS = {}


def torchrun_flag_errors():
    if not _TORCHRUN_ERRS:
        cases = {k: [*flags, TASK, "print"] for k, (flags, _) in FLAG_ERRORS.items()}
        out = subprocess.run([torch_python("2"), "-c", TORCHRUN_CASES, json.dumps(cases)],
                             capture_output=True, text=True, timeout=180, env=crun_env())
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("CASES ")]
        assert out.returncode == 0 and line, out.stdout[-2000:] + out.stderr[-2000:]
        _TORCHRUN_ERRS.update(json.loads(line[0][len("CASES "):]))
    return _TORCHRUN_ERRS


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("case", list(FLAG_ERRORS))
def test_torchrun_2x_flag_errors(procs, launcher, case):
    flags, needle = FLAG_ERRORS[case]
    if launcher == "torchrun":
        rc, err = torchrun_flag_errors()[case]
    else:
        rc, _, err = run_with(procs, launcher, [*flags, TASK, "print"])
    assert rc != 0 and needle.lower() in err.lower(), err[-2000:]
    if launcher == "crun":
        assert rc == 2


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_run_path_runs_the_script_with_runpy(procs, tmp_path, launcher):
    script = tmp_path / "rp.py"
    script.write_text("import sys\nprint('RP', __name__, sys.argv[1:], flush=True)\n")
    rc, out, err = run_with(procs, launcher, ["--run-path", str(script), "a", "-m"])
    assert rc == 0, err
    assert "RP __main__ ['a', '-m']" in out


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("mode", ["--standalone", "--master-port"])
def test_unknown_rdzv_conf_keys_are_ignored(procs, launcher, mode):
    """Item 8: torchrun ignores keys its static/standalone path does not read;
    crun warns once (failed before: exit 2, 'not supported by the static
    backend' even for --standalone)."""
    args = ["--standalone"] if mode == "--standalone" else [f"--master-port={free_port()}"]
    rc, _, err = run_with(procs, launcher,
                          [*args, "--rdzv-conf=is_host=1,bogus_key=2", TASK, "print"])
    assert rc == 0, err
    if launcher == "crun":
        assert err.count("bogus_key") == 1, err
        assert ("static backend" in err) == (mode != "--standalone"), err


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_event_log_handler_console_prints_agent_events(procs, launcher):
    rc, _, err = run_with(procs, launcher,
                          ["--event-log-handler=console", "--standalone", TASK, "print"])
    assert rc == 0, err
    events = [json.loads(ln[ln.index("{"):]) for ln in err.splitlines()
              if '"source": "AGENT"' in ln]
    assert events, err
    assert all("name" in e and "timestamp" in e for e in events)


def test_every_torchrun_option_is_accepted(procs):
    """Each option string of torchrun 2.x's own parser is in crun's option
    table (its generated bash completion lists the table)."""
    out = subprocess.run(
        [torch_python("2"), "-c",
         "from torch.distributed.run import get_args_parser as g\n"
         "print(' '.join(s for a in g()._actions for s in a.option_strings))"],
        capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    rc, comp, err = run(procs, ["--print-completion", "bash"])
    assert rc == 0, err
    missing = [o for o in out.stdout.split() if f" {o} " not in f" {comp.replace(chr(34), ' ')} "]
    assert not missing, missing


def test_bash_completion_script_works(procs, tmp_path):
    rc, comp, err = run(procs, ["--print-completion", "bash"])
    assert rc == 0, err
    script = tmp_path / "crun.bash"
    script.write_text(comp)
    probe = (f"source {script}\n"
             "COMP_WORDS=(crun --rdzv-back); COMP_CWORD=1; _crun_complete; echo \"A:${COMPREPLY[*]}\"\n"
             "COMP_WORDS=(crun --numa-binding ''); COMP_CWORD=2; _crun_complete; "
             "echo \"B:${COMPREPLY[*]}\"\n")
    res = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert "A:--rdzv-backend" in res.stdout
    assert "B:node socket exclusive core-complex" in res.stdout


def test_zsh_and_tcsh_completion_scripts_load(procs, tmp_path):
    """The shells themselves read the generated scripts (zsh parses its
    _arguments spec file; tcsh registers the completion)."""
    rc, z, err = run(procs, ["--print-completion", "zsh"])
    assert rc == 0, err
    (tmp_path / "_crun").write_text(z)
    res = subprocess.run(["zsh", "-n", str(tmp_path / "_crun")], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 0, res.stderr
    assert z.startswith("#compdef crun") and "--rdzv-backend=" in z
    rc, t, err = run(procs, ["--print-completion", "tcsh"])
    assert rc == 0, err
    (tmp_path / "crun.tcsh").write_text(t)
    res = subprocess.run(["tcsh", "-f", "-c", f"source {tmp_path / 'crun.tcsh'}; complete crun"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and "n/--numa-binding/(node socket exclusive core-complex)/" \
        in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("prog", ["crun", "crun-agent"])
def test_man_page_is_generated_from_the_table(procs, tmp_path, prog):
    """For packaging: `PROG --print-man > PROG.1`; groff reads it without a
    warning and every flag of --help is in it."""
    p = procs.spawn([bin_path(prog), "--print-man"])
    page, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    (tmp_path / "page.1").write_bytes(page)
    res = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(tmp_path / "page.1")],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and not res.stderr, res.stderr
    p = procs.spawn([bin_path(prog), "--help"])
    helptext, _ = p.communicate(timeout=30)
    flags = set(re.findall(r"^  (--[a-z-]+)", helptext.decode(), re.M))
    assert flags and all(f.replace("-", "\\-") in page.decode() for f in flags)


@pytest.mark.parametrize("how", ["by-path", "on-PATH"])
def test_a_venvs_crun_uses_the_venvs_python(procs, tmp_path, how):
    """python3 beside crun as invoked (venv/bin/crun -> venv/bin/python3) comes
    before python3 on PATH, as torchrun runs under its own interpreter."""
    vbin = tmp_path / "venv" / "bin"
    vbin.mkdir(parents=True)
    (vbin / "crun").symlink_to(launcher_argv("crun")[0])
    marker = tmp_path / "used"
    (vbin / "python3").write_text(f"#!/bin/sh\necho $$ >> {marker}\nexec {PY} \"$@\"\n")
    (vbin / "python3").chmod(0o755)
    env = crun_env()
    env.pop("PYTHON", None)
    env.pop("PYTHON_EXEC", None)
    if how == "on-PATH":
        env["PATH"] = f"{vbin}:{env['PATH']}"
    argv0 = str(vbin / "crun") if how == "by-path" else "crun"
    p = procs.spawn([argv0, "--standalone", "--nproc_per_node=2", TASK, "print"], env=env)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    assert len(marker.read_text().split()) == 2


TIMER_WORKER = """\
import os, sys, time
from torch.distributed.elastic.timer import FileTimerClient, configure, expires
configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
rank = int(os.environ["RANK"])
with expires(after=2):
    if rank == 1:
        print("rank 1 hangs", flush=True)
        time.sleep(60)
print(f"done {rank}", flush=True)
"""


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_torchelastic_file_timer_kills_an_expired_worker(procs, tmp_path, launcher):
    """torchrun's expiry-timer protocol (issue 12, hung workers): with
    TORCHELASTIC_ENABLE_FILE_TIMER=1 the launcher serves the FIFO named by
    TORCHELASTIC_TIMER_FILE and kills a worker whose timer expired."""
    script = tmp_path / "timer.py"
    script.write_text(TIMER_WORKER)
    env = crun_env(TORCHELASTIC_ENABLE_FILE_TIMER=1, PYTHON_EXEC=torch_python("2"))
    t0 = time.monotonic()
    rc, out, err = run_with(procs, launcher, ["--nproc-per-node=2", str(script)], env)
    # crun fails the job (exit 1) naming the killed rank; torchrun 2.15 itself
    # ended with -9 here (measured), so only "it failed" is compared.
    assert rc != 0 and "done 1" not in out, err[-3000:]
    assert time.monotonic() - t0 < 55  # killed, not slept out
    if launcher == "crun":
        assert rc == 1 and "done 0" in out and "rank 1 hangs" in out, out
        assert "expiry timer 'timer.py" in err or "expiry timer" in err, err[-2000:]
        assert not list(tmp_path.glob("*.fifo"))


# ---- torchrun parity, third round (issue 29): the same command under both launchers -------

@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_run_path_records_the_exception_in_the_error_file(procs, tmp_path, launcher):
    """Item 1: torchrun wraps --run-path's entry in @record, so a raise lands in
    attempt_0/RANK/error.json and the summary shows the traceback (crun wrote
    no error file and said 'To enable traceback see ...')."""
    script = tmp_path / "w.py"
    script.write_text("import os\nif os.environ['RANK'] == '1':\n"
                      "    raise ValueError('w.py boom on ' + os.environ['RANK'])\n")
    logs = tmp_path / "logs"
    rc, _, err = run_with(procs, launcher, ["--nproc-per-node=2", f"--log-dir={logs}",
                                            "--run-path", str(script)])
    assert rc == 1, err[-3000:]
    files = list(logs.glob("*/attempt_0/1/error.json"))
    assert len(files) == 1, err[-3000:]
    data = json.loads(files[0].read_text())
    assert data["message"]["message"] == "ValueError: w.py boom on 1"
    assert "w.py" in data["message"]["extraInfo"]["py_callstack"]
    assert float(data["message"]["extraInfo"]["timestamp"]) > 0
    block = err[err.index("Root Cause (first observed failure):"):]
    assert f"error_file: {files[0]}" in block
    assert "traceback : Traceback (most recent call last):" in block
    assert "ValueError: w.py boom on 1" in block and "To enable traceback" not in block


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_nproc_cpu_counts_the_cpus_the_process_may_run_on(procs, tmp_path, launcher):
    """Item 2: under taskset -c 0 torchrun (sched_getaffinity) starts one worker
    per usable CPU; crun counted the online CPUs and oversubscribed."""
    if len(os.sched_getaffinity(0)) < 2 or 0 not in os.sched_getaffinity(0):
        pytest.skip("needs CPU 0 and at least one other usable CPU")
    argv = ["taskset", "-c", "0", *launcher_argv(launcher), "--nproc-per-node=cpu",
            TASK, "env", str(tmp_path)]
    p = procs.spawn(argv, env=crun_env())
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err.decode()[-3000:]
    envs = load_envs(tmp_path, 1)
    assert sorted(envs) == [0] and envs[0]["LOCAL_WORLD_SIZE"] == "1", envs.keys()


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_standalone_accepts_an_elastic_nnodes_with_min_1(procs, tmp_path, launcher):
    """Item 3: torchrun runs --standalone --nnodes=1:2 (crun refused it, exit 2).
    last_call_timeout=1 only spares torchrun its 30 s last call."""
    rc, out, err = run_with(procs, launcher, ["--standalone", "--nnodes=1:2",
                                              "--rdzv-conf=last_call_timeout=1",
                                              "--nproc-per-node=2", TASK, "env", str(tmp_path)])
    assert rc == 0, err[-3000:]
    envs = load_envs(tmp_path, 2)
    assert {e["WORLD_SIZE"] for e in envs.values()} == {"2"}
    assert {e["GROUP_WORLD_SIZE"] for e in envs.values()} == {"1"}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_log_dir_that_is_a_file_is_named(procs, tmp_path, launcher):
    """Item 5: torchrun says 'log_dir: PATH is a file'; crun said only
    'Not a directory'."""
    f = tmp_path / "not-a-dir"
    f.write_text("x")
    rc, out, err = run_with(procs, launcher, [f"--log-dir={f}", TASK, "print"])
    assert rc != 0 and "out-line" not in out
    assert f"log_dir: {f} is a file" in err, err[-2000:]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_workers_failing_together_are_all_listed(procs, tmp_path, launcher):
    """Item 4: two workers that cannot open a missing script fail at the same
    moment; torchrun (which looks every --monitor-interval) lists both, crun
    SIGTERMed the second while it was failing and said <NO_OTHER_FAILURES>.
    Five runs: the race went crun's way only now and then."""
    for _ in range(5):
        rc, _, err = run_with(procs, launcher, ["--standalone", "--nproc-per-node=2",
                                                str(tmp_path / "missing.py")])
        assert rc == 1
        assert "<NO_OTHER_FAILURES>" not in err, err[-3000:]
        for r in (0, 1):
            assert f"rank      : {r} (local_rank: {r})" in err
        assert err.count("exitcode  : 2 (pid: ") == 2, err[-3000:]


@pytest.mark.parametrize("torchrun_node", [0, 1])
def test_a_static_job_mixing_torchrun_and_crun_fails_naming_torchrun(procs, torchrun_node,
                                                                     crun_launcher):
    """Item 7: torchrun on one node, crun on the other hung silently on both
    (each waited for its own launcher's keys until the 60 s join timeout
    given here). crun now sees torchrun's torchelastic/role_info record
    without its own beside it and fails at once naming torchrun; its own
    record makes torchrun's rank assignment fail too instead of waiting."""
    port = free_port()
    common = ["--nnodes=2", f"--master-port={port}", "--master-addr=127.0.0.1",
              "--rdzv-conf=timeout=60", "--nproc-per-node=1"]
    node = {r: ("torchrun" if r == torchrun_node else "crun") for r in (0, 1)}
    ps = {r: start(procs, [*common, f"--node-rank={r}", TASK, "print"], which=node[r])
          for r in (0, 1)}
    crun_rank = 1 - torchrun_node
    _, err = ps[crun_rank].communicate(timeout=120)
    err = err.decode(errors="replace")
    assert ps[crun_rank].returncode == 1, err[-3000:]
    assert f"node_rank {torchrun_node} runs torchrun" in err, err[-3000:]
    # torchrun fails too, within the hang guard: a node 0 on crun's role_info
    # record (KeyError: 'role'), a node 1 on crun's answer or on the store
    # that left with crun's node 0.
    _, terr = ps[torchrun_node].communicate(timeout=120)
    assert ps[torchrun_node].returncode != 0, terr.decode(errors="replace")[-3000:]
    if torchrun_node == 0:
        assert b"KeyError: 'role'" in terr, terr.decode(errors="replace")[-3000:]
