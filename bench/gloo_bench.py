"""gloo_bench.py: PyTorch gloo's side of bench/coll_bench.c: the same
collectives, sizes and columns (time per call = slowest rank's mean, algbw,
busbw with nccl-tests' bus factors), so one run can print both tables.
Runs as one rank under any torchrun-style launcher (crun, torchrun,
tests/helpers/coll_launch), with either PyTorch version:

    coll_launch -n 4 -- /usr/bin/python3 bench/gloo_bench.py -b 8 -e 268435456
    coll_launch -n 4 -- ~/.cache/crun/venv-torch2/bin/python bench/gloo_bench.py

`gloo_bench.py compare BUILD [--ranks 2,4] [--repeats 2] [--out FILE]` is the
side-by-side driver (`make bench` runs it): for each world size it runs
BUILD/bench/coll_bench and this script under both PyTorch versions through
BUILD/tests/helpers/coll_launch, keeps each size's best of --repeats runs
(the dev machine is shared and noisy), and prints a markdown table with the
issue's goals checked: busbw at 64 MiB >= 3x gloo's, 8-byte latency <= half.
"""
import argparse
import os
import re
import subprocess
import sys
import time

BUS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def make_op(name, nbytes, n):
    import torch
    import torch.distributed as dist

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
    import torch
    import torch.distributed as dist
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


ROW = re.compile(r"^all_reduce\s+(\d+)\s+\d+\s+\d+\s+([\d.]+)\s+[\d.]+\s+([\d.]+)")
TORCH2 = os.path.expanduser("~/.cache/crun/venv-torch2/bin/python")


def run_rows(argv, timeout_s):
    """{size: (time_us, busbw)} from one benchmark run."""
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
    rows = {}
    for line in out.stdout.splitlines():
        m = ROW.match(line)
        if m:
            rows[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    return rows


def best(runs):
    sizes = set().union(*runs)
    return {b: min((r[b] for r in runs if b in r), key=lambda t: t[0]) for b in sizes}


def compare(argv):
    ap = argparse.ArgumentParser(prog="gloo_bench.py compare")
    ap.add_argument("build")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    launch = os.path.join(a.build, "tests", "helpers", "coll_launch")
    if not os.access(launch, os.X_OK):  # `make bench` builds `all`, not the test helpers
        subprocess.run(["make", "--no-print-directory", f"BUILD={a.build}", launch], check=True)
    sizes = ["-b", "8", "-e", str(a.max_bytes), "-f", "2", "-n", "20", "-w", "5"]
    here = os.path.abspath(__file__)
    impls = [("crun", [os.path.join(a.build, "bench", "coll_bench")]),
             ("gloo 1.13", ["/usr/bin/python3", here]), ("gloo 2.x", [TORCH2, here])]
    lines = []
    for n in [int(x) for x in a.ranks.split(",")]:
        res = {}
        for name, prog in impls:
            runs = [run_rows([launch, "-n", str(n), "--timeout", "900", "--", *prog, *sizes], 1000)
                    for _ in range(a.repeats)]
            res[name] = best(runs)
        lines.append(f"\n### all_reduce, f32, {n} ranks on one host (best of {a.repeats})\n")
        lines.append("| size (B) | crun time (us) | crun busbw (GB/s) | gloo 1.13 time | "
                     "gloo 1.13 busbw | gloo 2.x time | gloo 2.x busbw |")
        lines.append("|---:|---:|---:|---:|---:|---:|---:|")
        for b in sorted(res["crun"]):
            cells = [f"{b}"]
            for name, _ in impls:
                t, bw = res[name].get(b, (float("nan"), float("nan")))
                cells += [f"{t:.1f}", f"{bw:.3f}"]
            lines.append("| " + " | ".join(cells) + " |")
        for g in ("gloo 1.13", "gloo 2.x"):
            big = 64 << 20
            if big in res["crun"] and big in res[g]:
                ratio = res["crun"][big][1] / max(res[g][big][1], 1e-9)
                lines.append(f"\ngoal busbw@64MiB >= 3x {g}: {ratio:.2f}x "
                             f"{'MET' if ratio >= 3 else 'NOT MET'}")
            if 8 in res["crun"] and 8 in res[g]:
                ratio = res["crun"][8][0] / res[g][8][0]
                lines.append(f"goal latency@8B <= 0.5x {g}: {ratio:.3f}x "
                             f"{'MET' if ratio <= 0.5 else 'NOT MET'}")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "compare":
        compare(sys.argv[2:])
    else:
        main()
