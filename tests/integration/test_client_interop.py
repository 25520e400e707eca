"""crun's store client (through tests/helpers/store_cli) against PyTorch's OWN
TCPStore server: torch 1.13's server (v1 dialect) and torch 2.x's servers
(v2 dialect), libuv and legacy. Every op each server supports, blocking waits
woken by a real PyTorch client, prefixes shared with PyTorch's PrefixStore,
and the wait-timeout behaviour of each dialect.
"""
import os
import sys

import pytest

from conftest import BUILD, HELPERS, torch_python, wait_line

sys.path.insert(0, HELPERS)
from storecli import StoreCli, TorchClient, arg, esc  # noqa: E402

# (torch version, use_libuv or None for 1.13, crun dialect)
SERVERS = {
    "torch113": ("1", None, 1),
    "torch2-libuv": ("2", 1, 2),
    "torch2-legacy": ("2", 0, 2),
}


def cli_path():
    p = os.path.join(BUILD, "tests", "helpers", "store_cli")
    assert os.access(p, os.X_OK), f"{p} is not built (make tests/helpers)"
    return p


def start_torch_server(procs, version, libuv):
    py = torch_python(version)
    argv = [py, os.path.join(HELPERS, "torch_store_server.py")]
    if libuv is not None:
        argv += ["--libuv", str(libuv)]
    p = procs.spawn(argv, stdin=__import__("subprocess").PIPE)
    m = wait_line(p.stdout, r"PORT (\d+)", 120)
    return py, int(m.group(1))


@pytest.fixture(scope="module", params=list(SERVERS))
def server(request):
    """One PyTorch server per kind for the whole module (PyTorch's import
    dominates the run time); every test works under its own prefix and
    checks key counts as differences."""
    from conftest import Procs
    procs = Procs()
    try:
        version, libuv, dialect = SERVERS[request.param]
        py, port = start_torch_server(procs, version, libuv)
        torch = TorchClient(procs, py, "127.0.0.1", port)
        yield {"name": request.param, "py": py, "port": port, "dialect": dialect,
               "libuv": libuv, "torch": torch}
    finally:
        procs.cleanup()


_ns_counter = [0]


@pytest.fixture
def ns():
    """A fresh key prefix per test, so tests sharing a server never meet."""
    _ns_counter[0] += 1
    return f"t{_ns_counter[0]}"


def cli(procs, server, ns, **kw):
    kw.setdefault("prefix", ns)
    return StoreCli(procs, cli_path(), "127.0.0.1", server["port"], server["dialect"], **kw)


def run_script(c, script):
    """Runs (command, expected reply) pairs; reports every mismatch at once.
    An expected "+N" after "numkeys" means N more keys than at the start."""
    base = int(c.cmd("numkeys").split()[1])
    got = []
    for cmd, want in script:
        if want.startswith("+"):
            want = f"INT {base + int(want[1:])}"
        got.append((cmd, c.cmd(cmd), want))
    bad = [f"{cmd!r}: got {g!r}, want {w!r}" for cmd, g, w in got if g != w]
    assert not bad, "\n".join(bad)


CORE = [
    ("set k1 v1", "OK"),
    ("get k1", 'VAL "v1"'),
    ("set k2 \"\"", "OK"),
    ("get k2", 'VAL ""'),
    ("set bin \\x00\\xff\\x22\\x5c", "OK"),
    ("get bin", 'VAL "\\x00\\xff\\"\\\\"'),
    ("add cnt 5", "INT 5"),
    ("add cnt -2", "INT 3"),
    ("get cnt", 'VAL "3"'),
    ("add big 1099511627776", "INT 1099511627776"),
    ("cas k1 v1 v2", 'VAL "v2"'),
    ("cas k1 wrong v3", 'VAL "v2"'),
    ("cas missing \"\" new", 'VAL "new"'),
    ("cas missing2 exp x", 'VAL "exp"'),
    ("check k1 cnt", "READY 1"),
    ("check k1 zz", "READY 0"),
    ("check", "READY 1"),
    ("wait k1 cnt", "OK"),
    ("wait", "OK"),
    ("numkeys", "+6"),
    ("delete k2", "DELETED 1"),
    ("delete k2", "DELETED 0"),
    ("numkeys", "+5"),
    ("addraw init/ 1", "INT 1"),
    ("numkeys", "+6"),
]

V2_EXTRA = [
    ("append k1 _a", "OK"),
    ("append newk x", "OK"),
    ("get k1", 'VAL "v2_a"'),
    ("get newk", 'VAL "x"'),
    ("mset m1 a m2 \"\" m3 \\x01", "OK"),
    ("mget m1 m2 m3 k1", 'VALS "a" "" "\\x01" "v2_a"'),
    ("ping", "OK"),
]

V2_NEWEST = [
    ("listkeys", 'KEYS "big" "bin" "cnt" "k1" "m1" "m2" "m3" "missing" "newk"'),
    ("barrier bar 1", "OK"),
    ("barrier bar 1", "OK"),
    ("get bar", 'VAL "2"'),
]

LIBUV_QUEUES = [
    ("qpush q one", "OK"),
    ("qpush q \\x00two", "OK"),
    ("qlen q", "INT 2"),
    ("qpop q", 'VAL "one"'),
    ("qpop q block", 'VAL "\\x00two"'),
    ("qlen q", "INT 0"),
    ("qpop q", "ERR CRUN_ENOTFOUND"),
]

V1_REFUSED = [(c, "ERR CRUN_EDIALECT") for c in
              ("append k1 x", "mget k1", "mset a b", "ping", "qpush q x", "qpop q", "qlen q",
               "listkeys", "barrier b 1")]


def test_every_op_the_server_supports(procs, server, ns):
    c = cli(procs, server, ns)
    run_script(c, CORE)
    if server["dialect"] == 1:
        run_script(c, V1_REFUSED + [("get k1", 'VAL "v2"')])
    else:
        run_script(c, V2_EXTRA + V2_NEWEST)
        if server["libuv"]:
            run_script(c, LIBUV_QUEUES)
    c.close()


def test_torch_client_reads_what_crun_wrote(procs, server, ns):
    c = cli(procs, server, ns)
    run_script(c, [("set bin \\x00\\xff", "OK"), ("add cnt 7", "INT 7"),
                   ("set k hello", "OK")])
    out = server["torch"].run(f"s = P({ns!r})\n"
                       "print(s.get('bin').hex(), s.get('cnt'), s.get('k'))\n"
                       "s.set('fromtorch', b'\\x01\\x02')\n"
                       "s.add('cnt', 3)\n")
    assert out.split() == ["00ff", "b'7'", "b'hello'"]
    run_script(c, [("get fromtorch", 'VAL "\\x01\\x02"'), ("get cnt", 'VAL "10"')])
    c.close()


def test_blocking_wait_and_get_are_woken_by_a_torch_set(procs, server, ns):
    c = cli(procs, server, ns)
    c.send("wait late1 late2")
    assert not c.pending(0.3), "wait returned before the keys existed"
    server["torch"].run(f"P({ns!r}).set('late1', b'1')\nP({ns!r}).add('late2', 1)\n")
    assert c.read_line(30) == "OK"
    c.send("get late3")
    assert not c.pending(0.3), "get returned before the key existed"
    server["torch"].run(f"P({ns!r}).set('late3', b'x y')\n")
    assert c.read_line(30) == 'VAL "x y"'
    if server["dialect"] == 2:
        c.send("mget late1 late4")
        assert not c.pending(0.3)
        server["torch"].run(f"P({ns!r}).set('late4', b'4')\n")
        assert c.read_line(30) == 'VALS "1" "4"'
    c.close()


def test_prefixes_interoperate_with_prefixstore(procs, server, ns):
    # crun's --prefix ns plus view "p" is PrefixStore("p", PrefixStore(ns, tcp)).
    c = cli(procs, server, ns)
    run_script(c, [("view p", "OK"), ("set k v", "OK"), ("view q", "OK"), ("set k2 w", "OK"),
                   ("view -", "OK")])
    out = server["torch"].run(f"n = {ns!r}\n"
                       "print(P(n, 'p').get('k'), P(n, 'p', 'q').get('k2'),"
                       " store.get(n + '/p/k'))\n"
                       "P(n, 'p').set('fromtorch', b'1')\n"
                       "P(n, 'p', 'q').set('deep', b'2')\n")
    assert out.split() == ["b'v'", "b'w'", "b'v'"]
    run_script(c, [("view p", "OK"), ("get fromtorch", 'VAL "1"'), ("view q", "OK"),
                   ("get deep", 'VAL "2"'), ("check k2 deep", "READY 1"),
                   ("check k", "READY 0")])
    c.close()
    if server["dialect"] == 2:
        # list_keys under a prefix returns the keys without it.
        c2 = cli(procs, server, ns + "/p")
        assert c2.cmd("listkeys") == 'KEYS "fromtorch" "k" "q/deep" "q/k2"'
        c2.close()


def test_wait_timeout_behaviour(procs, server, ns):
    c = cli(procs, server, ns)
    run_script(c, [("set a 1", "OK"), ("optimeout 200", "OK"),
                   ("wait never", "ERR CRUN_ETIMEDOUT")])
    if server["dialect"] == 2:
        # Canceled on the server: the stream stays in sync even after the
        # key appears later (no late STOP_WAITING is sent or mistaken).
        server["torch"].run(f"P({ns!r}).set('never', b'n')\n")
        run_script(c, [("get a", 'VAL "1"'), ("ping", "OK"), ("get never", 'VAL "n"'),
                       ("get never2", "ERR CRUN_ETIMEDOUT"), ("numkeys", "+0"),
                       ("barrier bb 2", "ERR CRUN_ETIMEDOUT"), ("get a", 'VAL "1"')])
    else:
        # v1 has no CANCEL_WAIT: the client drops the connection rather than
        # read a late wake-up as the next answer (PyTorch 1.13's desync), and
        # the next call redials a fresh one: the wake-up the key now sends
        # goes to the closed socket, never into this stream.
        server["torch"].run(f"P({ns!r}).set('never', b'n')\n")
        run_script(c, [("get a", 'VAL "1"'), ("get never", 'VAL "n"'), ("get a", 'VAL "1"')])
    c.close()


def test_many_crun_clients_and_a_torch_client_share_one_counter(procs, server, ns):
    clients = [cli(procs, server, ns) for _ in range(4)]
    for i in range(10):
        for c in clients:
            c.send("add shared 1")
        for c in clients:
            assert c.read_line(30).startswith("INT ")
    out = server["torch"].run(f"print(P({ns!r}).add('shared', 0))\n")
    assert out.strip() == "40"
    for c in clients:
        c.close()


def test_binary_keys_and_values_round_trip(procs, server, ns):
    c = cli(procs, server, ns)
    key = bytes(range(1, 32)) + b"\x7f key"
    val = bytes(range(256))
    assert c.cmd(f"set {arg(key)} {arg(val)}") == "OK"
    assert c.cmd(f"get {arg(key)}") == "VAL " + esc(val)
    out = server["torch"].run(f"print(P({ns!r}).get({key.decode('latin-1')!r}).hex())\n")
    assert out.strip() == val.hex()
    c.close()


def test_a_wrong_dialect_fails_cleanly(procs, server, ns):
    """torch-compat §1.8: the dialects cannot talk to each other. crun's client
    must fail (not hang, not misread), and PyTorch's server must keep serving."""
    if server["name"] == "torch113":
        # The 1.13 server reads VALIDATE as a SET with a huge key length and
        # resets: the v2 greeting never gets its PING echo.
        argv = [cli_path(), "--host", "127.0.0.1", "--port", str(server["port"]),
                "--dialect", "2", "--connect-timeout-ms", "500"]
        out = __import__("subprocess").run(argv, input=b"", capture_output=True, timeout=30)
        assert out.stdout.decode().strip() == "ERR CRUN_ETIMEDOUT"
    elif server["name"] == "torch2-legacy":
        # The 2.x legacy server closes a connection whose first request is
        # not VALIDATE.
        c = StoreCli(procs, cli_path(), "127.0.0.1", server["port"], 1, prefix=ns)
        assert c.cmd("numkeys") in ("ERR CRUN_ECLOSED", "ERR CRUN_ECONNRESET")
        # The next call redials and is refused the same way.
        assert c.cmd("numkeys") in ("ERR CRUN_ECLOSED", "ERR CRUN_ECONNRESET")
        c.close()
    else:
        # libuv re-reads a v1 stream in the v2 numbering: v1 GETNUMKEYS (06)
        # is a v2 WAIT waiting for its key count. The client must time out,
        # not take some other answer for its own.
        c = StoreCli(procs, cli_path(), "127.0.0.1", server["port"], 1, prefix=ns,
                     timeout_ms=300)
        assert c.cmd("numkeys") == "ERR CRUN_ETIMEDOUT"
        # The next call redials a fresh socket and times out the same way.
        assert c.cmd("numkeys") == "ERR CRUN_ETIMEDOUT"
        c.close()
    c = cli(procs, server, ns)
    assert c.cmd("set alive 1") == "OK"
    assert c.cmd("get alive") == 'VAL "1"'
    c.close()
