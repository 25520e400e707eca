"""A PyTorch gloo job, unchanged from what one would run under torchrun:
all_reduce, all_gather and broadcast with checked results. Prints one
"launch_worker ok rank=R world=W restart=N" line per rank on success.
Env: LAUNCH_FAIL_RANK / LAUNCH_FAIL_UNTIL_RESTART make that rank exit 3
while TORCHELASTIC_RESTART_COUNT is below the given count (restart tests)."""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    fail_rank = os.environ.get("LAUNCH_FAIL_RANK")
    if fail_rank is not None and int(fail_rank) == rank and \
            restart < int(os.environ.get("LAUNCH_FAIL_UNTIL_RESTART", "1")):
        print(f"rank {rank} failing on purpose in attempt {restart}", file=sys.stderr, flush=True)
        sys.exit(3)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    assert dist.get_rank() == rank and dist.get_world_size() == world

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2, t

    out = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(out, torch.tensor([float(rank), float(rank * 10)]))
    for r, o in enumerate(out):
        assert o.tolist() == [float(r), float(r * 10)], (r, o)

    b = torch.tensor([42.0 + restart]) if rank == 0 else torch.zeros(1)
    dist.broadcast(b, src=0)
    assert b.item() == 42.0 + restart, b

    dist.barrier()
    # One write per line: the ranks share the launcher's stdout (crun and
    # torchrun alike hand it to them), and print() writes the newline apart.
    sys.stdout.write(f"launch_worker ok rank={rank} world={world} restart={restart}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
