"""Real PyTorch gloo jobs (all_reduce, all_gather, broadcast, results checked
in tests/integration/helpers/launch_worker.py) run unchanged under crun, for
Debian's PyTorch 1.13 (store dialect v1, /worker/attempt_<n>/ prefix) and
PyPI's 2.x (v2, no prefix): --standalone with 4 workers, and the static
backend as two crun agents x 2 workers on 127.0.0.1."""
import os
import shutil
import tempfile
import subprocess

import pytest

from conftest import HELPERS, bin_path, free_port, torch_python

JOB = os.path.join(HELPERS, "launch_worker.py")



_TMP = {}


@pytest.fixture(autouse=True, scope="module")
def _private_tmpdir():
    """crun's default log dir is a new $TMPDIR/torchelastic_*: keep them all
    in one directory removed after the module."""
    _TMP["dir"] = tempfile.mkdtemp(prefix="crun-launch-")
    yield
    shutil.rmtree(_TMP.pop("dir"), ignore_errors=True)

def env_for(py, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k != "OMP_NUM_THREADS"}
    env["PYTHON_EXEC"] = py
    env["TMPDIR"] = _TMP["dir"]
    env.update({k: str(v) for k, v in extra.items()})
    return env


def finish(p, timeout=150):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail("crun did not finish in time")
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def ok_lines(out):
    return sorted(ln for ln in out.splitlines() if ln.startswith("launch_worker ok"))


@pytest.mark.parametrize("version", ["1", "2"])
def test_gloo_job_standalone_4_workers(procs, version):
    py = torch_python(version)
    p = procs.spawn([bin_path("crun"), "--standalone", "--nproc_per_node=4", JOB],
                    env=env_for(py))
    rc, out, err = finish(p)
    assert rc == 0, err[-3000:]
    assert ok_lines(out) == [f"launch_worker ok rank={r} world=4 restart=0" for r in range(4)]


@pytest.mark.parametrize("version", ["1", "2"])
def test_gloo_job_static_two_agents_of_two(procs, version):
    py = torch_python(version)
    port = free_port()
    agents = [procs.spawn([bin_path("crun"), "--nnodes=2", f"--node-rank={n}",
                           "--nproc-per-node=2", "--master-addr=127.0.0.1",
                           f"--master-port={port}", JOB], env=env_for(py))
              for n in (1, 0)]
    results = [finish(p) for p in agents]
    for rc, out, err in results:
        assert rc == 0, err[-3000:]
    (_, out1, _), (_, out0, _) = results
    assert ok_lines(out0) == [f"launch_worker ok rank={r} world=4 restart=0" for r in (0, 1)]
    assert ok_lines(out1) == [f"launch_worker ok rank={r} world=4 restart=0" for r in (2, 3)]


@pytest.mark.parametrize("version", ["1", "2"])
def test_gloo_job_restarts_on_a_clean_store(procs, version):
    # Rank 2 fails in attempt 0; attempt 1 must rendezvous afresh (1.13
    # through its attempt prefix, 2.x on the store crun cleared between
    # attempts) and pass every collective.
    py = torch_python(version)
    p = procs.spawn([bin_path("crun"), "--standalone", "--nproc_per_node=3",
                     "--max_restarts=1", JOB],
                    env=env_for(py, LAUNCH_FAIL_RANK=2, LAUNCH_FAIL_UNTIL_RESTART=1))
    rc, out, err = finish(p)
    assert rc == 0, err[-3000:]
    assert ok_lines(out) == [f"launch_worker ok rank={r} world=3 restart=1" for r in range(3)]
