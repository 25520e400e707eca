#!/bin/sh
# demo.sh BUILD: what `make demo` runs. A real multi-process job on this
# machine: crun starts 4 C workers (examples/rank_env) that print their rank
# environment and exercise the worker store the agent serves; then the
# distributed matmul example on 2 nodes x 2 workers; then, when
# PyTorch is installed, a gloo all_reduce/all_gather/broadcast job unchanged
# from torchrun.
set -eu
build=${1:-build}
crun=$build/bin/crun
here=$(cd "$(dirname "$0")/.." && pwd)

echo "== crun --standalone --nproc_per_node=4 --tee=3 $build/examples/rank_env"
"$crun" --standalone --nproc_per_node=4 --tee=3 "$build/examples/rank_env"

# The distributed matmul of the lecture notes, as 2 nodes x 2 workers with
# the static backend: two crun agents on this machine, node 0 serving the
# store at a free port.
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 29517)
echo
echo "== 2 nodes x 2 workers: crun --nnodes=2 --node_rank={0,1} --nproc_per_node=2 --master_port=$port --no_python $build/examples/dist_matmul"
"$crun" --nnodes=2 --node_rank=1 --nproc_per_node=2 --master_addr=127.0.0.1 \
	--master_port="$port" --no_python "$build/examples/dist_matmul" > /dev/null &
node1=$!
"$crun" --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_addr=127.0.0.1 \
	--master_port="$port" --tee=3 --local_ranks_filter=0 --no_python "$build/examples/dist_matmul"
wait "$node1"

py=${PYTHON:-/usr/bin/python3}
if "$py" -c 'import torch' 2>/dev/null; then
	echo
	echo "== PYTHON_EXEC=$py crun --standalone --nproc_per_node=4 tests/integration/helpers/launch_worker.py"
	PYTHON_EXEC=$py "$crun" --standalone --nproc_per_node=4 --tee=3 \
		"$here/tests/integration/helpers/launch_worker.py"
fi
echo
echo "demo: all workers succeeded"
