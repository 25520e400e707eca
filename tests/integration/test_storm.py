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
    # A rank is a waiter parked before the first SET of :last_worker, one
    # that read N and SET it, or one that read less but whose WAIT went out
    # after that SET; each is released once, the parked ones no later than
    # the last rank (wake_s <= fanout_s).
    assert res["setters"] >= 1 and res["parked"] + res["setters"] <= n, res
    assert res["woken"] == n, res
    assert 0 < res["wake_s"] <= res["fanout_s"] or res["parked"] == 0, res
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


def start_farm(procs, port, proxies, ports_file):
    """bench/store_proxy_farm with `proxies` proxies to the store at port,
    once its ports file is written."""
    farm = procs.spawn([os.path.join(BUILD, "bench", "store_proxy_farm"), "--upstream",
                        f"127.0.0.1:{port}", "--proxies", str(proxies),
                        "--ports-file", str(ports_file)])
    for _ in range(400):
        if ports_file.exists():
            break
        assert farm.poll() is None, farm.stderr.read()
        time.sleep(0.025)
    return farm


def stop_farm(farm):
    """SIGTERM; the farm's summed counters."""
    farm.terminate()
    fout, _ = farm.communicate(timeout=20)
    return json.loads(fout.decode().strip().splitlines()[-1])


@pytest.mark.parametrize("dialect", ["v1", "v2"])
def test_storm_through_node_local_proxies(rdzvd, procs, tmp_path, dialect):
    """8 ranks per proxy (bench/store_proxy_farm), the proxies to crun-rdzvd:
    the same answers as direct, with one upstream WAIT per proxy at most."""
    _, _, port = rdzvd
    n = N
    ports_file = tmp_path / "ports"
    farm = start_farm(procs, port, (n + 7) // 8, ports_file)
    argv = [os.path.join(BUILD, "bench", "storm"), "--ports-file", str(ports_file), "-n", str(n),
            "--dialect", dialect, "--prefix", f"/proxied-{dialect}/", "--timeout-ms", "60000"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and res["ok"] and res["done"] == n, res
    st = stop_farm(farm)
    assert farm.returncode == 0 and st["dropped"] == 0 and st["passthrough"] == 0, st
    assert st["accepted"] == n
    # Every rank waits twice (barrier, NCCL id); at most one WAIT per proxy
    # and key list goes upstream.
    assert st["waits"] == 2 * n - 1
    assert st["upstream_waits"] <= 2 * ((n + 7) // 8), st


def test_one_world_over_several_generators_through_proxies(rdzvd, procs, tmp_path):
    """The 98,304-rank cell's shape at N = 300: three bench/storm processes
    drive slices of one world (--first/--count) from a common start, through
    38 proxies that each hold one connection to the root. Each slice
    finishes with the right answers; the barrier counts the whole world (one
    slice alone could not pass it), and only the slice holding rank 0 SETs
    the NCCL id."""
    _, _, port = rdzvd
    n, proxies = N, (N + 7) // 8
    ports_file = tmp_path / "ports"
    farm = start_farm(procs, port, proxies, ports_file)
    start = time.monotonic_ns() + 300_000_000  # CLOCK_MONOTONIC, as the generators'
    slices = [(0, 100), (100, 100), (200, 100)]
    gens = [subprocess.Popen(
        [os.path.join(BUILD, "bench", "storm"), "--ports-file", str(ports_file), "-n", str(n),
         "--first", str(first), "--count", str(count), "--start-at-ns", str(start),
         "--src-port0", "1234", "--prefix", "/world/", "--timeout-ms", "60000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for first, count in slices]
    res = []
    for g in gens:
        out, err = g.communicate(timeout=90)
        assert g.returncode == 0, err
        res.append(json.loads(out.strip().splitlines()[-1]))
    for r, (first, count) in zip(res, slices):
        assert r["ok"] and r["first"] == first and r["count"] == count and r["done"] == count, r
        assert r["t_start_ns"] >= start and r["t_last_wake_ns"] > 0, r
    assert sum(r["setters"] for r in res) >= 1
    # Every rank: VALIDATE, PING, 3 ADDs, WAIT; WAIT + GET of the id or (rank 0) its SET.
    assert sum(r["requests"] for r in res) >= 8 * n
    assert min(r["t_done_ns"] for r in res) > max(r["t_start_ns"] for r in res)
    st = stop_farm(farm)
    assert farm.returncode == 0 and st["accepted"] == n and st["dropped"] == 0, st
    assert st["upstream_conns"] == proxies, st


def test_a_slice_past_the_world_exits_2(tmp_path):
    argv = [os.path.join(BUILD, "bench", "storm"), "--port", "1", "-n", "10", "--first", "8",
            "--count", "3"]
    assert subprocess.run(argv, capture_output=True, timeout=20).returncode == 2
