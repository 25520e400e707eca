"""A real PyTorch gloo job where one rank is late: SLOW_RANK sleeps in
late_for_the_all_reduce() while every other rank waits in all_reduce. Each
rank drops READY_DIR/<rank> once it is where it hangs."""
import os
import sys
import time

import torch
import torch.distributed as dist


def late_for_the_all_reduce(rank):
    open(os.path.join(os.environ["READY_DIR"], str(rank)), "w").close()
    time.sleep(600)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    if rank == int(os.environ["SLOW_RANK"]):
        late_for_the_all_reduce(rank)
    else:
        open(os.path.join(os.environ["READY_DIR"], str(rank)), "w").close()
    dist.all_reduce(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
