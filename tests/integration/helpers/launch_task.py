"""Worker for the launcher tests (started by crun, one process per rank).

    launch_task.py env OUT              dump os.environ as JSON to OUT/<RANK>.json
    launch_task.py exit CODE RANK UNTIL  rank RANK (or every rank for -1) exits CODE
                                         while TORCHELASTIC_RESTART_COUNT < UNTIL;
                                         others then sleep (to be stopped); else exit 0
    launch_task.py errfile               rank 0 writes an @record-style error file, exits 1
    launch_task.py trap OUT IGNORE       record forwarded signals in OUT/<RANK>.sig and exit 0;
                                         IGNORE=1: ignore SIGTERM/SIGINT instead (stay up)
    launch_task.py grandchild OUT        start a grandchild `sleep`, record both pids, sleep
    launch_task.py selfkill              rank 0 SIGKILLs itself; others sleep
    launch_task.py chunks N              write N long lines in small flushed pieces
    launch_task.py print                 one stdout and one stderr line
    launch_task.py bytes                 exact bytes: \r progress, a 300,000-byte line, no
                                         final newline (the same on stdout and stderr)
    launch_task.py flood OUT N           rank 0 writes MASTER_PORT to OUT/port, N stdout lines,
                                         OUT/flooded; then every rank waits for OUT/go
    launch_task.py tty OUT               write isatty() of stdin/stdout to OUT/<RANK>.tty,
                                         read one line (input()) into OUT/<RANK>.input
    launch_task.py fail_together OUT CODE ignore SIGTERM, wait until every local rank is
                                         ready, then all exit CODE at once
    launch_task.py hold OUT N            like env, then wait until OUT holds N env files
                                         (so concurrent runs provably overlap)
Every sleep is bounded (60 s) so nothing outlives a broken test for long.
"""
import json
import os
import signal
import subprocess
import sys
import time

rank = int(os.environ.get("RANK", "-1"))
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def ready(out):
    with open(os.path.join(out, f"{rank}.ready.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(out, f"{rank}.ready.tmp"), os.path.join(out, f"{rank}.ready"))


def sleep(s=60):
    end = time.monotonic() + s
    while time.monotonic() < end:
        time.sleep(0.05)


mode = sys.argv[1]
if mode == "env":
    out = sys.argv[2]
    with open(os.path.join(out, f"{rank}.json.tmp"), "w") as f:
        json.dump(dict(os.environ), f)
    os.rename(os.path.join(out, f"{rank}.json.tmp"), os.path.join(out, f"{rank}.json"))
elif mode == "exit":
    code, who, until = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    print(f"attempt {restart} rank {rank}", flush=True)
    if restart < until:
        if who in (-1, rank):
            print(f"rank {rank} exits {code}", file=sys.stderr, flush=True)
            sys.exit(code)
        sleep()
elif mode == "errfile":
    if rank == 0:
        with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
            json.dump({"message": {"message": "ValueError: launch_task boom",
                                   "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  boom line\nValueError: launch_task boom",
                                                 "timestamp": str(int(time.time()))}}}, f)
        sys.exit(1)
    sleep()
elif mode == "trap":
    out, ignore = sys.argv[2], sys.argv[3] == "1"

    def on_sig(signum, frame):
        with open(os.path.join(out, f"{rank}.sig"), "a") as f:
            f.write(f"{signum}\n")
        if not ignore:
            sys.exit(0)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(s, on_sig)
    ready(out)
    sleep()
elif mode == "grandchild":
    out = sys.argv[2]
    child = subprocess.Popen(["sleep", "60"])
    with open(os.path.join(out, f"{rank}.pids"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    ready(out)
    sleep()
elif mode == "selfkill":
    if rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    sleep()
elif mode == "chunks":
    for i in range(int(sys.argv[2])):
        ch = "ab"[rank % 2]
        for _ in range(20):
            sys.stdout.write(ch * 50)
            sys.stdout.flush()
            time.sleep(0.001)
        sys.stdout.write("\n")
        sys.stdout.flush()
elif mode == "hold":
    out, want = sys.argv[2], int(sys.argv[3])
    with open(os.path.join(out, f"{os.getpid()}.json.tmp"), "w") as f:
        json.dump(dict(os.environ), f)
    os.rename(os.path.join(out, f"{os.getpid()}.json.tmp"),
              os.path.join(out, f"{os.getpid()}.json"))
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if sum(n.endswith(".json") for n in os.listdir(out)) >= want:
            break
        time.sleep(0.05)
    else:
        sys.exit("the other run never started")
elif mode == "print":
    print(f"out-line rank={rank}", flush=True)
    print(f"err-line rank={rank}", file=sys.stderr, flush=True)
elif mode == "bytes":
    data = b"progress 1\rprogress 2\r" + b"L" * 300000 + b"\nline two\ntail without newline"
    for f in (sys.stdout.buffer, sys.stderr.buffer):
        f.write(data)
        f.flush()
elif mode == "flood":
    out, n = sys.argv[2], int(sys.argv[3])
    if rank == 0:
        with open(os.path.join(out, "port.tmp"), "w") as f:
            f.write(os.environ["MASTER_PORT"])
        os.rename(os.path.join(out, "port.tmp"), os.path.join(out, "port"))
        line = "x" * 100
        for i in range(n):
            sys.stdout.write(f"flood {i} {line}\n")
        sys.stdout.flush()
        open(os.path.join(out, "flooded"), "w").close()
    end = time.monotonic() + 60
    while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < end:
        time.sleep(0.05)
elif mode == "tty":
    out = sys.argv[2]
    # Written then renamed: the test reads the file as soon as it exists
    # (SAN run: it read an empty one).
    with open(os.path.join(out, f"{rank}.tty.tmp"), "w") as f:
        f.write(f"{sys.stdin.isatty()} {sys.stdout.isatty()}")
    os.rename(os.path.join(out, f"{rank}.tty.tmp"), os.path.join(out, f"{rank}.tty"))
    line = input()
    with open(os.path.join(out, f"{rank}.input.tmp"), "w") as f:
        f.write(line)
    os.rename(os.path.join(out, f"{rank}.input.tmp"), os.path.join(out, f"{rank}.input"))
elif mode == "fail_together":
    out, code = sys.argv[2], int(sys.argv[3])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready(out)
    end = time.monotonic() + 60
    n = int(os.environ["LOCAL_WORLD_SIZE"])
    while time.monotonic() < end and sum(
            os.path.exists(os.path.join(out, f"{r}.ready")) for r in range(n)) < n:
        time.sleep(0.01)
    sys.exit(code)
else:
    sys.exit(f"unknown mode {mode}")
