"""Worker for the elastic (c10d) tests, one process per rank under crun.

    elastic_task.py run OUT SECS [CRASH_RANK UNTIL]
        writes OUT/<pid>.json (RANK, WORLD_SIZE, GROUP_RANK, restart count,
        MASTER_*), then: rank CRASH_RANK exits 1 after 0.3 s while
        TORCHELASTIC_RESTART_COUNT < UNTIL (-1 = every attempt); every other
        rank sleeps SECS (bounded) and exits 0, or sooner once OUT/go exists
        (a test that has done what it needed the job running for writes it:
        an event instead of a fixed sleep).
"""
import json
import os
import sys
import time

out, secs = sys.argv[2], float(sys.argv[3])
crash_rank = int(sys.argv[4]) if len(sys.argv) > 4 else -2
until = int(sys.argv[5]) if len(sys.argv) > 5 else 0
rank = int(os.environ["RANK"])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rec = {k: os.environ.get(k) for k in (
    "RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_RANK",
    "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT")}
rec["pid"] = os.getpid()
tmp = os.path.join(out, f"{os.getpid()}.tmp")
with open(tmp, "w") as f:
    json.dump(rec, f)
os.rename(tmp, os.path.join(out, f"{os.getpid()}.json"))
if rank == crash_rank and (until < 0 or restart < until):
    time.sleep(0.3)
    print(f"elastic_task rank {rank} crashing in attempt {restart}", file=sys.stderr, flush=True)
    sys.exit(1)
end = time.monotonic() + min(secs, 60)
go = os.path.join(out, "go")
while time.monotonic() < end and not os.path.exists(go):
    time.sleep(0.05)
