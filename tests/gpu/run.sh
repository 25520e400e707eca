#!/bin/sh
# run.sh [BUILD]: the GPU suite in one call. Builds crun with CUDA (make
# WITH_CUDA=1, all cores), then runs every GPU correctness test and the GPU
# benchmarks beside their baselines (cuBLAS, a raw NCCL loop):
#   gpu_kernels  SGEMM / tensor-core GEMM over many shapes, every dtype x op
#                of the reductions, the IPC all_reduce kernel, all against
#                CPU references; then GEMM vs cuBLAS 1024..8192
#   gpu_nccl     the nccl backend with one rank per GPU: every collective,
#                host and device buffers, async, abort, IPC thresholds; then
#                the SDK's all_reduce vs a raw NCCL loop (and IPC vs NCCL)
#   dist_matmul  --backend nccl --gemm gpu, one rank per GPU, through crun
#   fragments_sim  (CPU, where numpy is) a model of the GEMM index math
# A program that finds no usable device prints "skipped: no CUDA device"
# and exits 77: counted as skipped, never as passed. With $OUT set, the
# results table goes to $OUT/gpu-results.md and the logs next to it.
# Bounded: every step has a timeout; the whole suite stays under 8 minutes.
# GPU_QUICK=1 leaves the benchmarks out (what `make test` runs).
set -u
B=${1:-${BUILD:-build}}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cd "$ROOT" || exit 1
T0=$(date +%s)
RES_DIR=${OUT:-$B/tests/gpu}
mkdir -p "$RES_DIR" "$B/tests/gpu"
RESULTS=$RES_DIR/gpu-results.md
: > "$RESULTS"
export GPU_RESULTS=$RESULTS
# Nothing carries a runpath (STYLE §7): the test programs in tests/gpu/ find
# libcrun-cuda.so.0 through the normal search path, as an installed program
# would, and the GPU object finds CUDA's libraries in ld.so.cache or here.
B_ABS=$(cd "$B" 2>/dev/null && pwd || echo "$ROOT/$B")
export LD_LIBRARY_PATH="$B_ABS/lib:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# GPU_QUICK=1 comes from `make gpu-check`, which has built $B already (with
# its own SAN setting, which a second make here must not undo).
if [ "${GPU_QUICK:-0}" != 1 ]; then
	echo "gpu suite: building (WITH_CUDA=1) under $B"
	if ! timeout 300 make -j"$(nproc)" BUILD="$B" WITH_CUDA=1 all >"$RES_DIR/build.log" 2>&1; then
		tail -30 "$RES_DIR/build.log"
		echo "gpu suite: build FAILED"
		exit 1
	fi
	echo "gpu suite: built in $(($(date +%s) - T0)) s"
fi

NGPU=0
if command -v nvidia-smi >/dev/null 2>&1; then
	NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
GPUS="$NGPU GPU(s) per nvidia-smi"
if [ "$NGPU" -lt 1 ]; then
	NGPU=1 # let the programs find out (and skip) themselves
	GPUS="no GPU listed by nvidia-smi"
fi
[ "$NGPU" -le 8 ] || NGPU=8

pass=0 fail=0 skip=0
summary=""
# step NAME TIMEOUT_S CMD...: runs one program, files it under pass, fail or skip.
step() {
	name=$1 tmo=$2
	shift 2
	s0=$(date +%s)
	timeout -k 10 "$tmo" "$@" >"$RES_DIR/$name.log" 2>&1
	rc=$?
	case $rc in
	0) pass=$((pass + 1)) verdict=passed ;;
	77) skip=$((skip + 1)) verdict="skipped: no CUDA device" ;;
	124 | 137) fail=$((fail + 1)) verdict="FAILED (timed out after $tmo s)" ;;
	*) fail=$((fail + 1)) verdict="FAILED (exit $rc)" ;;
	esac
	grep -v '^|' "$RES_DIR/$name.log" | tail -8
	echo "gpu suite: $name: $verdict ($(($(date +%s) - s0)) s)"
	summary="$summary
| $name | $verdict | $(($(date +%s) - s0)) s |"
}

{
	echo "# crun GPU suite"
	echo
	echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname), $GPUS"
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
		sed 's/^/    /'
	echo
} >>"$RESULTS"

# The CPU model of the GEMM index math (tests/gpu/fragments_sim.py) where
# some python has numpy: cheap, and it runs on hosts without a GPU too.
for py in python3 "$HOME/.cache/crun/venv-torch2/bin/python"; do
	if "$py" -c 'import numpy' >/dev/null 2>&1; then
		step fragments_sim 60 "$py" tests/gpu/fragments_sim.py
		break
	fi
done
# GPU_QUICK=1 (make test): correctness only, no benchmarks.
NOBENCH=
[ "${GPU_QUICK:-0}" = 1 ] && NOBENCH=--no-bench
step gpu_kernels 240 "$B/tests/gpu/gpu_kernels" $NOBENCH
step gpu_nccl 180 "$B/tests/gpu/gpu_nccl" --nranks "$NGPU" --port $((20000 + $$ % 20000)) \
	$NOBENCH
if [ $skip -eq 0 ]; then
	step dist_matmul 60 "$B/bin/crun" --nproc_per_node "$NGPU" \
		--master_port $((20000 + ($$ + 7) % 20000)) --no_python \
		"$B/examples/dist_matmul" --backend nccl --gemm gpu 2048
fi

{
	echo
	echo "| step | verdict | time |"
	echo "|---|---|---|$summary"
	echo
	echo "$pass passed, $fail failed, $skip skipped in $(($(date +%s) - T0)) s"
} >>"$RESULTS"
echo "gpu suite: $pass passed, $fail failed, $skip skipped in $(($(date +%s) - T0)) s" \
	"(table: $RESULTS)"
[ $fail -eq 0 ]
