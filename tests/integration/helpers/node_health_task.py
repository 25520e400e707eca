"""Worker for test_node_health.py, one process per rank under crun.

    node_health_task.py OUT
        writes OUT/<pid>.json (RANK, WORLD_SIZE, GROUP_RANK, restart count,
        NODE_HEALTH_BAD, NODE_HEALTH_NAME: the test's name for the node), then exits 1 at once on a node whose agent has
        NODE_HEALTH_BAD=1 in its environment (a bad node: its workers always
        fail there); elsewhere waits until OUT/go exists (the test writes it
        once it saw what it needed; bounded at 120 s, a hang guard) and exits 0.
"""
import json
import os
import sys
import time

out = sys.argv[1]
rec = {k: os.environ.get(k) for k in (
    "RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
    "NODE_HEALTH_BAD", "NODE_HEALTH_NAME")}
rec["pid"] = os.getpid()
tmp = os.path.join(out, f"{os.getpid()}.tmp")
with open(tmp, "w") as f:
    json.dump(rec, f)
os.rename(tmp, os.path.join(out, f"{os.getpid()}.json"))
if os.environ.get("NODE_HEALTH_BAD") == "1":
    print(f"node_health_task rank {rec['RANK']}: failing on the bad node", file=sys.stderr,
          flush=True)
    sys.exit(1)
end = time.monotonic() + 120
go = os.path.join(out, "go")
while time.monotonic() < end and not os.path.exists(go):
    time.sleep(0.05)
sys.exit(0 if os.path.exists(go) else 3)
