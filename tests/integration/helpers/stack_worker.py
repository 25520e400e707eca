"""A worker for test_hang.py that gets stuck in a function with a known
name: each rank enters stuck_waiting_for_the_batch() and only then drops
a marker (READY_DIR/<attempt>.<rank>); FAIL_RANK waits for every marker of
its attempt, then exits 3 (so the others are certainly inside the function
when crun stops them). TALK=1: the stuck ranks print a line every 0.2 s
(output is progress), BEAT=1: they touch $CRUN_HEARTBEAT_FILE as often;
either way, after 15 lines (3 s) drop a second marker
(<attempt>.<rank>.talked) that FAIL_RANK then waits for; BURN=S: every rank computes for S seconds, then exits
0 (CPU time is progress)."""
import os
import sys
import time


def marker(rank, suffix=""):
    return os.path.join(os.environ["READY_DIR"],
                        f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}.{rank}{suffix}")


def stuck_waiting_for_the_batch(rank):
    open(marker(rank), "w").close()
    talk = os.environ.get("TALK") == "1"
    beat = os.environ.get("BEAT") == "1"
    for i in range(3000):  # 10 min at most: the test's hang guard ends it sooner
        time.sleep(0.2)
        if talk:
            print(f"rank {rank} still waiting {i}", flush=True)
        if beat:
            os.utime(os.environ["CRUN_HEARTBEAT_FILE"])
        if (talk or beat) and i == 15:
            open(marker(rank, ".talked"), "w").close()


def wait_for_the_others(rank, world):
    suffix = ".talked" if "1" in (os.environ.get("TALK"), os.environ.get("BEAT")) else ""
    for _ in range(6000):
        if all(os.path.exists(marker(r, suffix)) for r in range(world) if r != rank):
            return
        time.sleep(0.01)
    sys.exit(9)


def burn(seconds):
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1
    return x


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if os.environ.get("BURN"):
        burn(float(os.environ["BURN"]))
        return 0
    if rank == int(os.environ.get("FAIL_RANK", "-1")):
        wait_for_the_others(rank, world)
        return 3
    stuck_waiting_for_the_batch(rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
