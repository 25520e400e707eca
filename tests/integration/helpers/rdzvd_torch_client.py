"""Real PyTorch TCPStore clients for tests/integration/test_rdzvd.py, run under
either interpreter (Debian's torch 1.13 speaks the v1 dialect, the venv's 2.x
speaks v2) against a crun-rdzvd. Every mode asserts what PyTorch's own server
would answer, prints a line per check and "ALL OK" at the end; any failure
raises and exits non-zero.

usage: rdzvd_torch_client.py MODE HOST PORT [ARGS...]
       rdzvd_torch_client.py serve
           the same, one request a line on stdin (a JSON list: MODE, HOST,
           PORT, ARGS...), each answered by its output and "END <rc>":
           PyTorch is imported once for a whole test module, and every
           request still makes TCPStore clients of its own.
"""
import datetime
import json
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

T = datetime.timedelta
V2 = not torch.__version__.startswith("1.")


def connect(host, port, timeout_s=30):
    return dist.TCPStore(host, port, is_master=False, timeout=T(seconds=timeout_s))


def ok(name):
    print("CHECK", name, flush=True)


def expect_timeout(fn):
    """PyTorch raises RuntimeError (1.13: "Socket Timeout") or its subclass
    DistStoreError (2.x) when a wait runs out."""
    try:
        fn()
    except RuntimeError as e:
        return str(e)
    raise AssertionError("expected a timeout")


def mode_ops(host, port):
    s = connect(host, port)
    s.set("k1", b"v1")
    assert s.get("k1") == b"v1"
    s.set("k1", "v1b")
    assert s.get("k1") == b"v1b"
    s.set("empty", b"")
    assert s.get("empty") == b""
    ok("set/get")

    assert s.add("cnt", 5) == 5
    assert s.add("cnt", -2) == 3
    assert s.get("cnt") == b"3"
    assert s.add("big", 1 << 40) == 1 << 40
    assert s.add("cnt", 0) == 3
    ok("add")

    assert s.compare_set("k1", b"v1b", b"v2") == b"v2"
    assert s.compare_set("k1", b"wrong", b"v3") == b"v2"
    assert s.get("k1") == b"v2"
    assert s.compare_set("missing", b"", b"new") == b"new"
    assert s.compare_set("missing2", b"exp", b"x") == b"exp"
    ok("compare_set")

    s.wait(["k1", "cnt"])
    s.wait(["k1"], T(seconds=5))
    ok("wait present")

    # keys: k1 empty cnt big missing
    assert s.num_keys() == 5, s.num_keys()
    assert s.delete_key("empty") is True
    assert s.delete_key("empty") is False
    assert s.num_keys() == 4
    ok("num_keys/delete_key")

    if hasattr(s, "check"):
        assert s.check(["k1", "cnt"]) is True
        assert s.check(["k1", "nope"]) is False
        ok("check")
    if hasattr(s, "append"):
        s.append("ap", b"a")
        s.append("ap", b"bc")
        assert s.get("ap") == b"abc"
        ok("append")
    if hasattr(s, "multi_set"):
        s.multi_set(["m1", "m2"], [b"1", b"22"])
        assert s.multi_get(["m2", "m1", "k1"]) == [b"22", b"1", b"v2"]
        ok("multi_get/multi_set")
    if hasattr(s, "queue_push"):
        s.queue_push("q", b"x")
        s.queue_push("q", "yy")
        assert s.queue_len("q") == 2
        before = s.num_keys()
        assert s.queue_pop("q") == b"x"
        assert s.queue_pop("q", block=False) == b"yy"
        assert s.queue_len("q") == 0
        try:
            s.queue_pop("q", block=False)
            raise AssertionError("pop of an empty queue did not raise")
        except RuntimeError:
            pass
        assert s.num_keys() == before
        ok("queue")
    if hasattr(s, "list_keys"):
        keys = sorted(s.list_keys())
        assert keys == sorted(["k1", "cnt", "big", "missing", "ap", "m1", "m2"]), keys
        ok("list_keys")
    if hasattr(s, "barrier"):
        s.barrier("solo", 1)
        ok("barrier")
    print("ALL OK", flush=True)


def mode_get(host, port, key, timeout_s):
    """Blocking get of one key: prints WAITING, then the value."""
    s = connect(host, port, float(timeout_s))
    s.set("waiter/ready", b"1")
    print("WAITING", flush=True)
    v = s.get(key)
    print("VALUE", v.decode(), flush=True)
    print("ALL OK", flush=True)


def mode_set(host, port, key, value):
    s = connect(host, port)
    s.set(key, value.encode())
    print("ALL OK", flush=True)


def mode_wait_timeout(host, port):
    s = connect(host, port)
    msg = expect_timeout(lambda: s.wait(["never"], T(seconds=1)))
    ok("wait timeout: " + msg.splitlines()[0][:80])
    if V2:
        # 2.x cancels the wait, so the connection stays in sync.
        s.set("after", b"x")
        assert s.get("after") == b"x"
        ok("usable after timeout")
    # A blocking get on a missing key times out too (WAIT inside get).
    s2 = connect(host, port, 1)
    expect_timeout(lambda: s2.get("never3"))
    ok("get timeout")
    print("ALL OK", flush=True)


def mode_many(host, port, n):
    """n clients, each its own TCPStore (connection) in its own thread."""
    n = int(n)
    errors = []
    barrier = threading.Barrier(n)

    def worker(rank):
        try:
            s = connect(host, port)
            barrier.wait(timeout=60)
            s.add("joined", 1)
            s.set(f"rank/{rank}", str(rank * rank))
            for peer in range(n):
                assert s.get(f"rank/{peer}") == str(peer * peer).encode()
            s.wait(["rank/%d" % (n - 1)])
            if hasattr(s, "barrier"):
                s.barrier("all", n, T(seconds=60))
            assert int(s.get("joined")) == n
            if hasattr(s, "multi_get"):
                vals = s.multi_get([f"rank/{p}" for p in range(n)])
                assert vals == [str(p * p).encode() for p in range(n)]
            for _ in range(20):
                s.add("ops", 1)
        except Exception as e:  # reported below; the thread must not hang
            errors.append(f"rank {rank}: {e!r}")

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "worker threads hung"
    assert not errors, errors
    s = connect(host, port)
    assert s.add("ops", 0) == 20 * n
    ok(f"{n} clients")
    print("ALL OK", flush=True)


def mode_prefix(host, port):
    s = connect(host, port)
    p = dist.PrefixStore("pfx", s)
    p.set("a", b"b")
    assert s.get("pfx/a") == b"b"
    assert p.get("a") == b"b"
    assert p.add("n", 2) == 2
    assert s.get("pfx/n") == b"2"
    inner = dist.PrefixStore("inner", s)
    outer = dist.PrefixStore("outer", inner)
    outer.set("x", b"y")
    assert s.get("inner/outer/x") == b"y"
    assert p.compare_set("a", b"b", b"c") == b"c"
    p.wait(["a"])
    assert p.delete_key("a") is True
    ok("PrefixStore")
    print("ALL OK", flush=True)


def mode_blocking_extras(host, port):
    """2.x only: a blocking queue_pop and a barrier woken by other clients."""
    a, b = connect(host, port), connect(host, port)
    got = []
    t = threading.Thread(target=lambda: got.append(a.queue_pop("jobs")))
    t.start()
    time.sleep(0.3)
    b.queue_push("jobs", b"job1")
    t.join(timeout=30)
    assert got == [b"job1"], got
    ok("blocking queue_pop")
    done = []
    t = threading.Thread(target=lambda: done.append(a.barrier("bar", 2, T(seconds=30))))
    t.start()
    time.sleep(0.3)
    assert not done
    b.barrier("bar", 2, T(seconds=30))
    t.join(timeout=30)
    assert done == [None]
    ok("barrier of two")
    msg = expect_timeout(lambda: a.barrier("lonely", 2, T(seconds=1)))
    a.set("after", b"1")
    assert a.get("after") == b"1"
    ok("barrier timeout: " + msg.splitlines()[0][:60])
    print("ALL OK", flush=True)


MODES = {
    "ops": mode_ops,
    "get": mode_get,
    "set": mode_set,
    "wait_timeout": mode_wait_timeout,
    "many": mode_many,
    "prefix": mode_prefix,
    "blocking_extras": mode_blocking_extras,
}


def serve():
    for line in sys.stdin:
        mode, host, port, *args = json.loads(line)
        try:
            MODES[mode](host, int(port), *args)
            rc = 0
        except BaseException:  # noqa: B036 - reported as this request's failure
            traceback.print_exc(file=sys.stdout)
            rc = 1
        print(f"END {rc}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
        sys.exit(0)
    mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    MODES[mode](host, port, *sys.argv[4:])
