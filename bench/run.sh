#!/bin/sh
# bench/run.sh BUILD: every benchmark, one after another (`make bench` calls it).
# Each entry is one command; add new benchmarks to the list below.
set -e
BUILD=${1:-${CRUN_BUILD:-build}}
cd "$(dirname "$0")/.."

# PyTorch TCPStore servers (1.13, 2.x legacy, 2.x libuv) against crun-rdzvd.
/usr/bin/python3 bench/store_bench.py "$BUILD" --out "$BUILD/bench/store.md"

# Collectives: crun's CPU backend (coll_bench) against gloo on PyTorch 1.13 and 2.x.
/usr/bin/python3 bench/gloo_bench.py compare "$BUILD" --out "$BUILD/bench/collectives.md"

# Launcher: crun against torchrun 1.13 and 2.x (launch time, restart latency, agent RSS).
/usr/bin/python3 bench/launch_bench.py "$BUILD" --out "$BUILD/bench/launch.md"

# Rendezvous: K clients in one process (rdzv_bench), then K real agents, crun vs torchrun.
"$BUILD/bench/rdzv_bench" 16 64 256 1024
/usr/bin/python3 bench/rdzv_vs_torchrun.py "$BUILD" --backends c10d,etcd --agent-uids 4 \
	--out "$BUILD/bench/rdzv_vs_torchrun.md"
