"""Differential test: the same seeded random operation sequences, spread over a
few connections of crun's client (tests/helpers/store_cli), against PyTorch's
own TCPStore server and against crun-rdzvd; every answer is compared line by
line. v1 runs against torch 1.13's server, v2 against torch 2.x's libuv and
legacy servers.

Cases left out on purpose, because PyTorch's servers differ from each other by
design there and crun follows torch-compat §1.4's recommendation instead:
- GET / MULTI_GET of a missing key (legacy servers close the connection, libuv
  answers an empty value; real clients always WAIT first, so the generator
  only reads keys its model says exist);
- waiters woken by COMPARE_SET (libuv wakes on every COMPARE_SET, legacy never;
  the generator only WAITs on keys that exist, so no wait ever parks);
- ADD on a value with no leading number or on overflow (every server closes
  the connection; the sequence would end there), and queues (libuv only).
"""
import os
import random
import subprocess
import sys

import pytest

from conftest import HELPERS, Procs, start_rdzvd, torch_python, wait_line

sys.path.insert(0, HELPERS)
from storecli import StoreCli, arg  # noqa: E402

from test_client_interop import cli_path  # noqa: E402

NCONN = 3
NOPS = 300
QKEYS = ["q1", "q2"]  # queues (libuv only), also named in CHECKs
KEYS = ["a", "b", "c", "d", "cnt", "x/y", "sp ace", "\x01bin"]
# Values include ADD's stoll edge cases: whitespace, signs, trailing junk.
VALUES = [b"", b"v", b"value-2", b"\x00\xff\x00", b"7", b"-3", b" 12", b"+5", b"42abc",
          b"0", b"-0", b"\n9", b"x" * 300]

CONFIGS = {
    # name: (torch version, use_libuv, dialect)
    "v1-torch113": ("1", None, 1),
    "v2-torch2-libuv": ("2", 1, 2),
    "v2-torch2-legacy": ("2", 0, 2),
}
SEEDS = [1, 2]


def stoll(v):
    """C++ std::stoll as every server's ADD uses it: optional leading
    whitespace, optional sign, digits, trailing junk ignored. None when it
    would throw (no digits, or a value this test keeps away from overflow)."""
    s = v.lstrip(b" \t\n\v\f\r")
    sign = 1
    if s[:1] in (b"+", b"-"):
        sign = -1 if s[:1] == b"-" else 1
        s = s[1:]
    n = 0
    while n < len(s) and s[n:n + 1].isdigit():
        n += 1
    if n == 0 or n > 17:
        return None
    return sign * int(s[:n])


def gen_ops(seed, dialect, queues=False):
    """(connection index, command) pairs, with a model of the key space so
    no op hits a case left out above."""
    rng = random.Random(seed)
    model = {}
    ops = []

    def k():
        return rng.choice(KEYS)

    def existing(n):
        have = sorted(model)
        return [rng.choice(have) for _ in range(n)] if have else []

    kinds = ["set", "get", "add", "cas", "check", "delete", "numkeys", "wait"]
    if dialect == 2:
        kinds += ["append", "mget", "mset", "ping", "listkeys", "barrier"]
    if queues:
        kinds += ["qpush", "qpop", "qlen", "qpush"]
    while len(ops) < NOPS:
        kind = rng.choice(kinds)
        conn = rng.randrange(NCONN)
        if kind == "set":
            key, val = k(), rng.choice(VALUES)
            model[key] = val
            cmd = f"set {arg(key.encode())} {arg(val)}"
        elif kind == "get":
            keys = existing(1)
            if not keys:
                continue
            cmd = f"get {arg(keys[0].encode())}"
        elif kind == "add":
            key = k()
            cur = stoll(model[key]) if key in model else 0
            if cur is None:
                continue
            delta = rng.choice([0, 1, -1, 5, 1000, -77])
            model[key] = str(cur + delta).encode()
            cmd = f"add {arg(key.encode())} {delta}"
        elif kind == "cas":
            key = k()
            cur = model.get(key)
            case = rng.randrange(4)
            if case == 0:
                exp = cur if cur is not None else b""  # the swap happens
            elif case == 1:
                exp = b""  # absent: creates; present: mismatch unless empty
            else:
                exp = rng.choice(VALUES)  # usually a mismatch
            des = rng.choice(VALUES)
            if (cur is None and exp == b"") or (cur is not None and cur == exp):
                model[key] = des
            cmd = f"cas {arg(key.encode())} {arg(exp)} {arg(des)}"
        elif kind == "check":
            pool = KEYS + QKEYS if queues else KEYS
            keys = [rng.choice(pool) for _ in range(rng.randrange(4))]
            cmd = "check " + " ".join(arg(x.encode()) for x in keys)
        elif kind == "delete":
            key = k()
            model.pop(key, None)
            cmd = f"delete {arg(key.encode())}"
        elif kind == "numkeys":
            cmd = "numkeys"
        elif kind == "wait":
            keys = existing(rng.randrange(3))
            cmd = "wait " + " ".join(arg(x.encode()) for x in keys)
        elif kind == "append":
            key, val = k(), rng.choice(VALUES)
            model[key] = model.get(key, b"") + val
            cmd = f"append {arg(key.encode())} {arg(val)}"
        elif kind == "mget":
            keys = existing(1 + rng.randrange(4))
            if not keys:
                continue
            cmd = "mget " + " ".join(arg(x.encode()) for x in keys)
        elif kind == "mset":
            pairs = [(k(), rng.choice(VALUES)) for _ in range(1 + rng.randrange(3))]
            for key, val in pairs:
                model[key] = val
            cmd = "mset " + " ".join(f"{arg(a.encode())} {arg(b)}" for a, b in pairs)
        elif kind == "ping":
            cmd = "ping"
        elif kind == "barrier":
            key = k()
            cur = stoll(model[key]) if key in model else 0
            if cur is None or cur < 0:
                continue  # a count still below 1 after the +1 would park
            model[key] = str(cur + 1).encode()  # world size 1: passes at once
            cmd = f"barrier {arg(key.encode())} 1"
        elif kind == "qpush":
            cmd = f"qpush {rng.choice(QKEYS)} {arg(rng.choice(VALUES))}"
        elif kind == "qpop":
            cmd = f"qpop {rng.choice(QKEYS)}"  # non-blocking: empty is ENOTFOUND
        elif kind == "qlen":
            cmd = f"qlen {rng.choice(QKEYS)}"
        else:
            cmd = "listkeys"
        ops.append((conn, cmd))
    return ops


def run_ops(procs, port, dialect, ops):
    conns = [StoreCli(procs, cli_path(), "127.0.0.1", port, dialect, timeout_ms=20000)
             for _ in range(NCONN)]
    out = []
    for i, (c, cmd) in enumerate(ops):
        out.append(f"{i} {cmd} -> {conns[c].cmd(cmd)}")
        # SET, APPEND, MULTI_SET and QUEUE_PUSH have no reply: the client returns before
        # the server applied them, and the next op may come on another
        # connection. A round trip on the same connection orders them (a
        # server answers one connection's requests in order).
        if cmd.split()[0] in ("set", "append", "mset", "qpush"):
            assert conns[c].cmd("check") == "READY 1"
    for c in conns:
        c.close()
    return out


# One PyTorch process per config holds a fresh server for each seed: PyTorch
# is imported once per config, and every sequence still starts on an empty
# store of its own.
_SERVERS = {}
_SERVER_PROCS = Procs()


@pytest.fixture(autouse=True, scope="module")
def _torch_servers():
    yield
    _SERVERS.clear()
    _SERVER_PROCS.cleanup()


def torch_server_port(config, seed):
    if config not in _SERVERS:
        version, libuv, _ = CONFIGS[config]
        argv = [torch_python(version), os.path.join(HELPERS, "torch_store_server.py"),
                "--count", str(len(SEEDS))]
        if libuv is not None:
            argv += ["--libuv", str(libuv)]
        p = _SERVER_PROCS.spawn(argv, stdin=subprocess.PIPE)
        _SERVERS[config] = [int(wait_line(p.stdout, r"PORT (\d+)", 120).group(1))
                            for _ in SEEDS]
    return _SERVERS[config][SEEDS.index(seed)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_same_answers_as_pytorch(procs, config, seed):
    version, libuv, dialect = CONFIGS[config]
    ops = gen_ops(seed * 1000 + dialect, dialect, queues=libuv == 1)
    torch_port = torch_server_port(config, seed)
    want = run_ops(procs, torch_port, dialect, ops)
    # Every sequence must stay on the paths that keep a connection alive.
    assert not [w for w in want if "ERR" in w and not w.endswith("ERR CRUN_ENOTFOUND")], \
        "generator hit an error case on PyTorch"
    _, _, crun_port = start_rdzvd(procs)
    got = run_ops(procs, crun_port, dialect, ops)
    diff = [f"pytorch: {w}\n   crun: {g}" for w, g in zip(want, got) if w != g]
    assert not diff, f"{len(diff)} of {len(ops)} answers differ:\n" + "\n".join(diff[:20])
