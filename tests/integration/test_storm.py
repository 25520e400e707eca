"""The worker-init storm at small N as a correctness test (no timing asserts):
bench/storm plays N ranks' init_process_group traffic (handshake, init/
check-in, store-based barrier with one SET waking N-1 waiters, the NCCL
unique-id exchange) against crun-rdzvd and against the store a crun agent
serves its workers; every rank must finish with the right answers."""
import json
import os
import subprocess
import time

import pytest

from conftest import BUILD, bin_path, wait_line

N = 300


def storm(port, n, dialect, prefix):
    argv = [os.path.join(BUILD, "bench", "storm"), "--port", str(port), "-n", str(n),
            "--dialect", dialect, "--prefix", prefix, "--timeout-ms", "60000"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and res["ok"], res
    assert res["done"] == n
    # v2: VALIDATE + PING, then ADD, ADD +1, ADD +0, WAIT, WAIT + GET of the id
    # (rank 0: one SET instead), plus one SET of :last_worker by each rank
    # that read N.
    per_rank = 8 if dialect == "v2" else 6
    assert n * per_rank <= res["requests"] < n * (per_rank + 1), res
    return res


@pytest.mark.parametrize("dialect", ["v1", "v2"])
def test_storm_against_crun_rdzvd(rdzvd, dialect):
    _, _, port = rdzvd
    storm(port, N, dialect, f"/storm-{dialect}/")
    # A second job on the same daemon starts from a clean barrier of its own.
    storm(port, N // 3, dialect, f"/storm-{dialect}-2/")


def test_storm_against_the_agent_worker_store(procs, tmp_path):
    portfile = tmp_path / "port"
    worker = tmp_path / "w.py"
    worker.write_text("import os, sys, time\n"
                      "open(sys.argv[1], 'w').write(os.environ['MASTER_PORT'])\n"
                      "time.sleep(60)\n")
    agent = procs.spawn([bin_path("crun"), "--standalone", "--nproc_per_node=1", str(worker),
                         str(portfile)])
    port = None
    for _ in range(600):
        if portfile.exists() and portfile.read_text():
            port = int(portfile.read_text())
            break
        assert agent.poll() is None, agent.stderr.read()
        time.sleep(0.05)
    assert port, "the worker never reported MASTER_PORT"
    storm(port, N, "v2", "/default_pg/")


@pytest.mark.parametrize("dialect", ["v1", "v2"])
def test_storm_through_node_local_proxies(rdzvd, procs, tmp_path, dialect):
    """8 ranks per proxy (bench/store_proxy_farm), the proxies to crun-rdzvd:
    the same answers as direct, with one upstream WAIT per proxy at most."""
    _, _, port = rdzvd
    n = N
    ports_file = tmp_path / "ports"
    farm = procs.spawn([os.path.join(BUILD, "bench", "store_proxy_farm"), "--upstream",
                        f"127.0.0.1:{port}", "--proxies", str((n + 7) // 8),
                        "--ports-file", str(ports_file)])
    for _ in range(400):
        if ports_file.exists():
            break
        assert farm.poll() is None, farm.stderr.read()
        time.sleep(0.025)
    argv = [os.path.join(BUILD, "bench", "storm"), "--ports-file", str(ports_file), "-n", str(n),
            "--dialect", dialect, "--prefix", f"/proxied-{dialect}/", "--timeout-ms", "60000"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and res["ok"] and res["done"] == n, res
    farm.terminate()
    fout, _ = farm.communicate(timeout=20)
    st = json.loads(fout.decode().strip().splitlines()[-1])
    assert farm.returncode == 0 and st["dropped"] == 0 and st["passthrough"] == 0, st
    assert st["accepted"] == n
    # Every rank waits twice (barrier, NCCL id); at most one WAIT per proxy
    # and key list goes upstream.
    assert st["waits"] == 2 * n - 1
    assert st["upstream_waits"] <= 2 * ((n + 7) // 8), st
