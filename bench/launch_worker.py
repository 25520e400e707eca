"""The Python worker of bench/launch_bench.py: the same protocol as
bench/launch_worker.c (see there). Without arguments it does nothing; it is
the trivial Python worker of the launch rows, timed with interpreter start-up."""
import os
import sys
import time


def record(path, what, attempt, rank, ns):
    with open(path, "a") as f:
        f.write(f"{what} {attempt} {rank} {os.getpid()} {ns}\n")


def main():
    start_ns = time.monotonic_ns()  # CLOCK_MONOTONIC, as in the C worker
    if len(sys.argv) < 2:
        return 0
    path = sys.argv[1]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    record(path, "S", attempt, rank, start_ns)
    if attempt != 0:
        return 0
    if rank == 0:
        world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        for _ in range(20000):  # bounded: 20 s
            with open(path) as f:
                if sum(line.startswith("S 0 ") for line in f) >= world:
                    break
            time.sleep(0.001)
        record(path, "E", attempt, rank, time.monotonic_ns())
        os._exit(1)
    time.sleep(60)  # the launcher stops us long before
    return 0


if __name__ == "__main__":
    sys.exit(main())
