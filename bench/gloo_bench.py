"""gloo_bench.py: PyTorch gloo's side of bench/coll_bench.c: the same
collectives, sizes and columns (time per call = slowest rank's mean, algbw,
busbw with nccl-tests' bus factors), so one run can print both tables.
Runs as one rank under any torchrun-style launcher (crun, torchrun,
tests/helpers/coll_launch), with either PyTorch version:

    coll_launch -n 4 -- /usr/bin/python3 bench/gloo_bench.py -b 8 -e 268435456
    coll_launch -n 4 -- ~/.cache/crun/venv-torch2/bin/python bench/gloo_bench.py
"""
import argparse
import time

import torch
import torch.distributed as dist

BUS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def make_op(name, nbytes, n):
    count = nbytes // 4
    if name == "all_reduce":
        t = torch.zeros(count)
        return lambda: dist.all_reduce(t)
    if name == "broadcast":
        t = torch.zeros(count)
        return lambda: dist.broadcast(t, 0)
    if name == "reduce":
        t = torch.zeros(count)
        return lambda: dist.reduce(t, 0)
    per = count // n
    if per == 0:
        return None
    if name == "all_gather":
        t = torch.zeros(per)
        out = [torch.zeros(per) for _ in range(n)]
        return lambda: dist.all_gather(out, t)
    if name == "reduce_scatter":  # gloo has no reduce_scatter in 1.13: skip it
        if not hasattr(dist, "reduce_scatter_tensor"):
            return None
        t, out = torch.zeros(per * n), torch.zeros(per)

        def rs():
            try:
                dist.reduce_scatter_tensor(out, t)
            except RuntimeError:
                return "unsupported"
        return rs
    if name == "all_to_all":
        t, out = torch.zeros(per * n), torch.zeros(per * n)

        def a2a():
            try:
                dist.all_to_all_single(out, t)
            except RuntimeError:
                return "unsupported"
        return a2a
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", type=int, default=8)
    ap.add_argument("-e", type=int, default=256 << 20)
    ap.add_argument("-f", type=int, default=2)
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("-w", type=int, default=5)
    ap.add_argument("-c", default="all_reduce")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    colls = list(BUS) if a.c == "all" else a.c.split(",")
    if rank == 0:
        print(f"# gloo (torch {torch.__version__}): {n} ranks, f32, {a.n} iters (+{a.w} warm-up)")
        print(f"{'# collective':<14} {'size(B)':>12} {'count':>12} {'n':>4} {'time(us)':>12} "
              f"{'algbw(GB/s)':>10} {'busbw(GB/s)':>10}")
    for c in colls:
        b = a.b
        while b <= a.e:
            op = make_op(c, b, n)
            if op is None or b < 4:
                b *= a.f
                continue
            big = b >= (16 << 20)
            iters, warm = (max(a.n // 4, 2), 1) if big else (a.n, a.w)
            if op() == "unsupported":
                if rank == 0:
                    print(f"{c:<14} unsupported by gloo in this PyTorch")
                break
            for _ in range(warm - 1):
                op()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                op()
            t = torch.tensor([(time.perf_counter() - t0) / iters * 1e6], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            us = t.item()
            if rank == 0:
                algbw = b / us / 1e3
                print(f"{c:<14} {b:>12} {b // 4:>12} {n:>4} {us:>12.2f} {algbw:>10.3f} "
                      f"{algbw * BUS[c](n):>10.3f}", flush=True)
            b *= a.f
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
