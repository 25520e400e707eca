#!/bin/sh
# bench/run.sh BUILD: every benchmark, one after another (`make bench` calls it).
# Each entry is one command; add new benchmarks to the list below.
set -e
BUILD=${1:-${CRUN_BUILD:-build}}
cd "$(dirname "$0")/.."

# PyTorch TCPStore servers (1.13, 2.x legacy, 2.x libuv) against crun-rdzvd.
/usr/bin/python3 bench/store_bench.py "$BUILD" --out "$BUILD/bench/store.md"
