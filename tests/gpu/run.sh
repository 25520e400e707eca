#!/bin/sh
# run.sh [BUILD]: the GPU suite: builds tests/gpu/gpu_kernels.c against the
# CUDA-enabled libcrun and runs its tests and benchmarks, but only where a
# device is usable; elsewhere it says so and succeeds.
set -eu
B=${1:-${BUILD:-build}}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cd "$ROOT"
if [ ! -e /dev/nvidia0 ] && ! command -v nvidia-smi >/dev/null 2>&1; then
	echo "gpu suite skipped: no device"
	exit 0
fi
if ! nm "$B/lib/libcrun.a" 2>/dev/null | grep -q ' T kernels_cuda_gemm_f32'; then
	echo "gpu suite skipped: no device (libcrun built without CUDA)"
	exit 0
fi
mkdir -p "$B/tests/gpu"
LIBS="$(pkg-config --libs libevent libevent_openssl libevent_pthreads openssl libcjson) -lm -ldl"
cc -std=gnu11 -D_GNU_SOURCE -O2 -g -pthread -I. -Iinclude -I"$CUDA_HOME/include" \
	-o "$B/tests/gpu/gpu_kernels" tests/gpu/gpu_kernels.c "$B/lib/libcrun.a" $LIBS \
	-L"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib64" -lcudart -lstdc++
"$B/tests/gpu/gpu_kernels" --probe || { echo "gpu suite skipped: no device"; exit 0; }
exec "$B/tests/gpu/gpu_kernels"
