#!/bin/sh
# demo.sh BUILD: what `make demo` runs. A real multi-process job on this
# machine: crun starts 4 C workers (examples/rank_env) that print their rank
# environment and exercise the worker store the agent serves; then, when
# PyTorch is installed, a gloo all_reduce/all_gather/broadcast job unchanged
# from torchrun.
set -eu
build=${1:-build}
crun=$build/bin/crun
here=$(cd "$(dirname "$0")/.." && pwd)

echo "== crun --standalone --nproc_per_node=4 --tee=3 $build/examples/rank_env"
"$crun" --standalone --nproc_per_node=4 --tee=3 "$build/examples/rank_env"

py=${PYTHON:-/usr/bin/python3}
if "$py" -c 'import torch' 2>/dev/null; then
	echo
	echo "== PYTHON=$py crun --standalone --nproc_per_node=4 tests/integration/helpers/launch_worker.py"
	PYTHON=$py "$crun" --standalone --nproc_per_node=4 --tee=3 \
		"$here/tests/integration/helpers/launch_worker.py"
fi
echo
echo "demo: all workers succeeded"
