"""A raw crun store client for the security tests: the HMAC challenge/response
of store/auth.h and a few TCPStore v2 ops (crun_wire torch-compat §1), so a
test can act as an intruder with exactly the bytes it chooses. Every read has
a deadline (the socket timeout)."""
import hashlib
import hmac
import os
import socket
import struct

MAGIC = b"CRA1"
VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)
OP = {"SET": 1, "CAS": 2, "GET": 3, "ADD": 4, "NUMKEYS": 7, "DELETE": 8, "LIST": 17,
      "PING": 13}


def mac(secret, label, nonce_s, nonce_c, job):
    msg = label + b"\0" + nonce_s + nonce_c + bytes([len(job)]) + job
    return hmac.new(secret, msg, hashlib.sha256).digest()


def b(x):
    x = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(x)) + x


class Closed(Exception):
    """The server closed the connection."""


class Wire:
    def __init__(self, port, host="127.0.0.1", timeout=10):
        self.s = socket.create_connection((host, port), timeout=timeout)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self):
        self.s.close()

    def send(self, data):
        """Sends data; a server that closed (a reset, a broken pipe) is Closed,
        as when a read finds it gone (SAN run: a SET that ended the job took
        its server down before the PING behind it was sent)."""
        try:
            self.s.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise Closed(f"closed while sending: {e}") from e

    def recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            try:
                chunk = self.s.recv(n - len(buf))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise Closed(f"closed after {len(buf)} of {n} bytes")
            buf += chunk
        return buf

    def challenge(self):
        ch = self.recv_exact(37)
        assert ch[:4] == MAGIC and ch[4] == 0, ch
        return ch[5:]

    def answer(self, secret, job, nonce_s, nonce_c=None):
        job = job.encode()
        nonce_c = nonce_c or os.urandom(32)
        frame = MAGIC + bytes([len(job)]) + job + nonce_c + mac(secret, b"crun-auth-v1 client",
                                                                nonce_s, nonce_c, job)
        return frame, nonce_c

    def auth(self, secret, job=""):
        """Full exchange; checks the server's proof. Raises Closed if refused."""
        nonce_s = self.challenge()
        frame, nonce_c = self.answer(secret, job, nonce_s)
        self.send(frame)
        proof = self.recv_exact(36)
        want = mac(secret, b"crun-auth-v1 server", nonce_s, nonce_c, job.encode())
        assert proof == MAGIC + want, "server proof is wrong"
        return frame

    def hello(self):
        self.send(VALIDATE)

    def set(self, key, val):
        self.send(bytes([OP["SET"]]) + b(key) + b(val))
        self.ping()  # SET has no reply: a PING proves it was taken

    def ping(self):
        self.send(bytes([OP["PING"]]) + struct.pack("<I", 7))
        assert struct.unpack("<I", self.recv_exact(4))[0] == 7

    def get(self, key):
        self.send(bytes([OP["GET"]]) + b(key))
        n = struct.unpack("<Q", self.recv_exact(8))[0]
        return self.recv_exact(n)

    def add(self, key, delta):
        self.send(bytes([OP["ADD"]]) + b(key) + struct.pack("<q", delta))
        return struct.unpack("<q", self.recv_exact(8))[0]

    def cas(self, key, expected, desired):
        self.send(bytes([OP["CAS"]]) + b(key) + b(expected) + b(desired))
        n = struct.unpack("<Q", self.recv_exact(8))[0]
        return self.recv_exact(n)

    def num_keys(self):
        self.send(bytes([OP["NUMKEYS"]]))
        return struct.unpack("<q", self.recv_exact(8))[0]

    def list_keys(self):
        self.send(bytes([OP["LIST"]]))
        n = struct.unpack("<q", self.recv_exact(8))[0]
        out = []
        for _ in range(n):
            ln = struct.unpack("<Q", self.recv_exact(8))[0]
            out.append(self.recv_exact(ln).decode(errors="replace"))
        return out

    # crun's store extension (store/store_ext.h), after hello().
    def ext_hello(self, version=5):
        self.send(bytes([0x80]) + struct.pack("<II", 0x4352554E, version))
        return struct.unpack("<I", self.recv_exact(4))[0]

    def _bytes(self):
        n = struct.unpack("<Q", self.recv_exact(8))[0]
        return self.recv_exact(n)

    def try_get(self, key):
        self.send(bytes([0x87]) + b(key))
        found = self.recv_exact(1)[0]
        return self._bytes() if found else None

    def wait_any(self, keys):
        self.send(bytes([0x86]) + struct.pack("<Q", len(keys)) + b"".join(map(b, keys)))
        self.recv_exact(1)
        return struct.unpack("<Q", self.recv_exact(8))[0]

    def wait_any_get_with(self, keys, with_key, wait_ms=1000):
        self.send(bytes([0x8B]) + struct.pack("<QQQ", 0, wait_ms, len(keys)) +
                       b"".join(map(b, keys)) + b(with_key))
        self.recv_exact(1)
        idx = struct.unpack("<Q", self.recv_exact(8))[0]
        val = self._bytes()
        found = self.recv_exact(1)[0]
        return idx, val, self._bytes() if found else None

    def ticket(self, counter, prefix, val):
        self.send(bytes([0x89]) + b(counter) + b(prefix) + b(val))
        return struct.unpack("<q", self.recv_exact(8))[0]

    def grant_set(self, ttl_ms, expiry_key, expiry_val, key, val):
        self.send(bytes([0x8A]) + struct.pack("<Q", ttl_ms) + b(expiry_key) +
                       b(expiry_val) + b(key) + b(val))
        return struct.unpack("<Q", self.recv_exact(8))[0]

    def closed(self, timeout=10):
        """True when the server has closed the connection (EOF or reset)."""
        self.s.settimeout(timeout)
        try:
            return self.s.recv(1) == b""
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False
