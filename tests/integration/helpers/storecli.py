"""Python side of tests/helpers/store_cli.c: one StoreCli is one crun client
connection (a store_cli process) that the interop and differential tests feed
commands to, one line in, one line out. Also runs small PyTorch client
snippets against a store. Every read has a deadline; processes are started
through the conftest `procs` fixture, which kills them at teardown.
"""
import json
import os
import select
import subprocess
import time


class StoreCli:
    def __init__(self, procs, cli_path, host, port, dialect, prefix=None, timeout_ms=20000,
                 connect_timeout_ms=10000):
        argv = [cli_path, "--host", host, "--port", str(port), "--dialect", str(dialect),
                "--timeout-ms", str(timeout_ms), "--connect-timeout-ms",
                str(connect_timeout_ms)]
        if prefix is not None:
            argv += ["--prefix", prefix]
        self.p = procs.spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        self.buf = b""
        first = self.read_line(connect_timeout_ms / 1000 + 10)
        assert first == "CONNECTED", f"store_cli did not connect: {first!r}"

    def send(self, line):
        self.p.stdin.write(line.encode() + b"\n")
        self.p.stdin.flush()

    def read_line(self, timeout_s=30):
        deadline = time.monotonic() + timeout_s
        fd = self.p.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"store_cli gave no line within {timeout_s}s")
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                err = self.p.stderr.read().decode(errors="replace") if self.p.poll() is not None else ""
                raise AssertionError(f"store_cli exited; stderr: {err[-2000:]}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def cmd(self, line, timeout_s=30):
        self.send(line)
        return self.read_line(timeout_s)

    def pending(self, wait_s):
        """True when a result line arrives within wait_s (without consuming it)."""
        if b"\n" in self.buf:
            return True
        r, _, _ = select.select([self.p.stdout.fileno()], [], [], wait_s)
        return bool(r)

    def close(self):
        """Ends the session; store_cli must exit 0 (under SAN=1 that also
        means no leak or memory error was reported)."""
        self.p.stdin.close()
        try:
            rc = self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            raise AssertionError("store_cli did not exit after stdin closed")
        err = self.p.stderr.read().decode(errors="replace")
        assert rc == 0, f"store_cli exited {rc}: {err[-3000:]}"


def esc(b):
    """bytes -> store_cli's output quoting ("..." with \\xHH escapes)."""
    out = []
    for c in b:
        if c in (0x22, 0x5C):
            out.append("\\" + chr(c))
        elif 0x20 <= c < 0x7F:
            out.append(chr(c))
        else:
            out.append("\\x%02x" % c)
    return '"' + "".join(out) + '"'


def arg(b):
    """bytes -> one store_cli input token."""
    if not b:
        return '""'
    out = []
    for c in b:
        if 0x21 <= c < 0x7F and c != 0x5C and c != 0x22:
            out.append(chr(c))
        else:
            out.append("\\x%02x" % c)
    return "".join(out)


class TorchClient:
    """A persistent PyTorch client (helpers/torch_store_client.py) that runs
    snippets with `store` and `P(prefix, ...)` in scope; run() returns what a
    snippet printed."""

    def __init__(self, procs, py, host, port):
        here = os.path.dirname(os.path.abspath(__file__))
        self.p = procs.spawn([py, os.path.join(here, "torch_store_client.py"), host, str(port)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        self.reader = StoreCli.__new__(StoreCli)
        self.reader.p = self.p
        self.reader.buf = b""
        first = self.reader.read_line(120)
        assert first == "READY", f"torch client did not start: {first!r}"

    def run(self, code, timeout_s=60):
        self.p.stdin.write(json.dumps(code).encode() + b"\n")
        self.p.stdin.flush()
        line = self.reader.read_line(timeout_s)
        kind, _, payload = line.partition(" ")
        assert kind == "DONE", f"torch client failed: {json.loads(payload)}"
        return json.loads(payload)
