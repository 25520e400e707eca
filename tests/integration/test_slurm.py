"""`srun --ntasks-per-node=1 crun --nproc_per_node=2 prog` on a real Slurm
(Debian's slurm-wlm and munge): a private two-node cluster on this host (two
slurmd), in a mount namespace whose /etc/hosts names the nodes. crun takes
the node count, the rendezvous host and the run id from the allocation."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import BUILD, HELPERS, bin_path, free_port

NEEDED = ("slurmctld", "slurmd", "srun", "munged", "unshare")


def test_srun_crun_needs_no_rendezvous_flags(tmp_path, procs):
    missing = [p for p in NEEDED if not shutil.which(p)]
    assert not missing, f"{missing} missing: run `sh scripts/deps.sh test`"
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost n1 n2 " + os.uname().nodename + "\n")
    d = tmp_path / "slurm"
    inner = ('mount --bind "$0" /etc/hosts && exec sh "$@"')
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", inner, str(hosts),
           os.path.join(HELPERS, "slurm_cluster.sh"), str(d), str(free_port()),
           str(free_port()), str(free_port()), "--",
           "srun", "-N2", "--ntasks-per-node=1", "--time=2", "--kill-on-bad-exit=1",
           bin_path("crun"), "--nproc_per_node=2", os.path.join(BUILD, "examples", "rank_env")]
    p = procs.spawn(cmd)
    try:
        out, err = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("srun crun did not finish within 180 s")
    out, err = out.decode(errors="replace"), err.decode(errors="replace")
    assert p.returncode == 0, f"rc={p.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    env = {}
    for m in re.finditer(r"^rank (\d+): (\w+)=(.*)$", out, re.M):
        env.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
    assert sorted(env) == [0, 1, 2, 3], out[-2000:]
    assert {e["WORLD_SIZE"] for e in env.values()} == {"4"}
    assert {e["GROUP_WORLD_SIZE"] for e in env.values()} == {"2"}
    run_ids = {e["TORCHELASTIC_RUN_ID"] for e in env.values()}
    assert len(run_ids) == 1 and run_ids.pop().isdigit()       # SLURM_JOB_ID
    assert sorted(int(e["GROUP_RANK"]) for e in env.values()) == [0, 0, 1, 1]
    assert out.count("store check ok") == 4, out[-2000:]
