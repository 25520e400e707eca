#!/bin/sh
# run.sh [BUILD]: the GPU suite in one call. Builds crun with CUDA (make
# WITH_CUDA=1, all cores) unless GPU_NO_BUILD=1 (a machine with no apt and
# no network, given a carried build/), then runs every GPU correctness test
# and the GPU benchmarks beside their baselines (cuBLAS, a raw NCCL loop):
#   fatbin_archs   (CPU) the GPU object carries sm_80/sm_90 code and the
#                  compute_90 PTX that newer GPUs JIT
#   host_div       (CPU) the GPU AVG's integer division vs the CPU path
#   gpu_kernels    SGEMM / tensor-core GEMM over many shapes (partial
#                  vectors too), every dtype x op of the reductions, integer
#                  AVG over up to 1000 ranks, the IPC all_reduce kernel, all
#                  against CPU references; then GEMM vs cuBLAS
#   gpu_nccl       the nccl backend with one rank per GPU (one rank where
#                  there is one GPU): every collective, host and device
#                  buffers, async, abort, IPC thresholds, all_reduce of a
#                  GEMM's output still being written on the default stream;
#                  then the benchmarks
#   gpu_ipc_procs  the IPC all_reduce kernel between 2 processes on GPU 0
#   gpu_nccl_narrow  (2+ GPUs) each rank sees only its own GPU
#                  (CUDA_VISIBLE_DEVICES=<rank>): device LOCAL_RANK % visible
#   dist_matmul    examples/dist_matmul --backend nccl (host buffers, staged
#                  by the NCCL backend), one rank per GPU, through crun
#   fragments_sim  (CPU, where numpy is) a model of the GEMM index math
# A program that finds no usable device prints "skipped: <why>" (the
# dlerror or CUDA text) and exits 77: a skip where nvidia-smi lists no GPU,
# a FAILURE where it lists one (a GPU that cannot be used is news). Never
# counted as passed.
# Bounded: the steps' timeouts add up to 215 s (GPU_BUDGET_S), each step
# gets at most what is left of that and 2 s to die after its TERM, so the
# suite ends within 4 minutes besides the build (GPU_NO_BUILD=1: none). The
# last line is the one verdict: "gpu suite: verdict: PASSED|FAILED|SKIPPED".
# With $OUT set, the results table goes to $OUT/gpu-results.md, the logs
# next to it. GPU_QUICK=1 leaves the benchmarks out (what `make test` runs).
set -u
B=${1:-${BUILD:-build}}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
BUDGET=${GPU_BUDGET_S:-215}
cd "$ROOT" || exit 1
RES_DIR=${OUT:-$B/tests/gpu}
mkdir -p "$RES_DIR" "$B/tests/gpu"
RESULTS=$RES_DIR/gpu-results.md
: >"$RESULTS"
export GPU_RESULTS=$RESULTS

# Nothing carries a runpath (STYLE §7): the test programs find
# libcrun-cuda.so.0 through the search path, as an installed program would,
# and CUDA's libraries in ld.so.cache, under $CUDA_HOME, or where the
# PyTorch wheels put them (site-packages/nvidia/<part>/lib, torch/lib) on a
# machine that has PyTorch and no CUDA toolkit.
B_ABS=$(cd "$B" 2>/dev/null && pwd || echo "$ROOT/$B")
LIBS="$B_ABS/lib:$CUDA_HOME/lib64"
for py in python3 "$HOME/.cache/crun/venv-torch2/bin/python"; do
	command -v "$py" >/dev/null 2>&1 || continue
	for d in $("$py" -c 'import site, sys
for p in site.getsitepackages() + [site.getusersitepackages()]: print(p)' 2>/dev/null); do
		for l in "$d"/nvidia/*/lib "$d"/torch/lib; do
			[ -d "$l" ] && LIBS="$LIBS:$l"
		done
	done
done
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# GPU_QUICK=1 comes from `make gpu-check`, which has built $B already (with
# its own SAN setting, which a second make here must not undo).
# No nvcc here but a carried build with the GPU object: use it as it is.
if [ "${GPU_NO_BUILD:-0}" != 1 ] && [ -e "$B/lib/libcrun-cuda.so.0" ] &&
	! command -v nvcc >/dev/null 2>&1 && [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
	echo "gpu suite: no nvcc: running the build under $B as it is"
	GPU_NO_BUILD=1
fi
if [ "${GPU_QUICK:-0}" != 1 ] && [ "${GPU_NO_BUILD:-0}" != 1 ]; then
	echo "gpu suite: building (WITH_CUDA=1) under $B"
	b0=$(date +%s)
	if ! timeout 300 make -j"$(nproc)" BUILD="$B" WITH_CUDA=1 all >"$RES_DIR/build.log" 2>&1; then
		tail -30 "$RES_DIR/build.log"
		echo "gpu suite: verdict: FAILED (the build failed)"
		exit 1
	fi
	echo "gpu suite: built in $(($(date +%s) - b0)) s"
fi
T0=$(date +%s)

LISTED=0
if command -v nvidia-smi >/dev/null 2>&1; then
	LISTED=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
NGPU=$LISTED
GPUS="$LISTED GPU(s) per nvidia-smi"
if [ "$NGPU" -lt 1 ]; then
	NGPU=1 # let the programs find out (and skip) themselves
	GPUS="no GPU listed by nvidia-smi"
fi
[ "$NGPU" -le 8 ] || NGPU=8

pass=0 fail=0 skip=0
summary=""
# step NAME TIMEOUT_S CMD...: runs one program within what is left of the
# budget, files it under pass, fail or skip.
step() {
	name=$1 tmo=$2
	shift 2
	left=$((BUDGET - ($(date +%s) - T0)))
	[ "$tmo" -le "$left" ] || tmo=$left
	s0=$(date +%s)
	if [ "$tmo" -lt 1 ]; then
		echo "not run: the suite's ${BUDGET} s budget is spent" >"$RES_DIR/$name.log"
		rc=124
	else
		timeout -k 2 "$tmo" "$@" >"$RES_DIR/$name.log" 2>&1
		rc=$?
	fi
	why=$(grep -m1 '^skipped: ' "$RES_DIR/$name.log" | sed 's/^skipped: //')
	case $rc in
	0) pass=$((pass + 1)) verdict=passed ;;
	77)
		if [ "$LISTED" -gt 0 ]; then
			fail=$((fail + 1))
			verdict="FAILED (skipped, but nvidia-smi lists $LISTED GPU(s): $why)"
		else
			skip=$((skip + 1)) verdict="skipped: $why"
		fi
		;;
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

PY=
for py in python3 "$HOME/.cache/crun/venv-torch2/bin/python"; do
	command -v "$py" >/dev/null 2>&1 && { PY=$py; break; }
done
if [ -n "$PY" ] && [ -e "$B/lib/libcrun-cuda.so.0" ]; then
	step fatbin_archs 5 "$PY" tests/gpu/fatbin_archs.py "$B/lib/libcrun-cuda.so.0" \
		elf80 elf90 ptx90
fi
# (CPU) the GPU AVG division against the CPU path.
[ -x "$B/tests/gpu/host_div" ] && step host_div 5 "$B/tests/gpu/host_div"
# The CPU model of the GEMM index math where some python has numpy.
for py in python3 "$HOME/.cache/crun/venv-torch2/bin/python"; do
	if "$py" -c 'import numpy' >/dev/null 2>&1; then
		step fragments_sim 15 "$py" tests/gpu/fragments_sim.py
		break
	fi
done
# GPU_QUICK=1 (make test): correctness only, no benchmarks.
NOBENCH=
[ "${GPU_QUICK:-0}" = 1 ] && NOBENCH=--no-bench
step gpu_kernels 70 "$B/tests/gpu/gpu_kernels" $NOBENCH
step gpu_nccl 55 "$B/tests/gpu/gpu_nccl" --nranks "$NGPU" --port $((20000 + $$ % 20000)) \
	$NOBENCH
if [ $skip -eq 0 ]; then
	step gpu_ipc_procs 15 "$B/tests/gpu/gpu_kernels" --ipc-procs
	# One visible GPU per rank (CUDA_VISIBLE_DEVICES=<rank>): only where
	# there are several, else it is the gpu_nccl run again.
	[ "$LISTED" -ge 2 ] && step gpu_nccl_narrow 20 "$B/tests/gpu/gpu_nccl" --narrow \
		--nranks "$NGPU" --no-bench --port $((20000 + ($$ + 3) % 20000))
	step dist_matmul 30 "$B/bin/crun" --nproc_per_node "$NGPU" \
		--master_port $((20000 + ($$ + 7) % 20000)) --no_python \
		"$B/examples/dist_matmul" --backend nccl 1024
fi

if [ $fail -gt 0 ]; then
	v=FAILED
elif [ $pass -gt 0 ] && [ $skip -eq 0 ]; then
	v=PASSED
else
	v=SKIPPED
fi
line="$v ($pass passed, $fail failed, $skip skipped in $(($(date +%s) - T0)) s, $GPUS)"
{
	echo
	echo "| step | verdict | time |"
	echo "|---|---|---|$summary"
	echo
	echo "$line"
} >>"$RESULTS"
echo "gpu suite: table in $RESULTS"
echo "gpu suite: verdict: $line"
[ $fail -eq 0 ]
