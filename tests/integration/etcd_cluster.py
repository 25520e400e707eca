"""Real etcd clusters for crun's tests and benchmarks: Debian's etcd-server
(/usr/bin/etcd) members on loopback ports, each in its own data directory,
optionally with TLS certificates made here with openssl. Members can be
killed, frozen (SIGSTOP: a partitioned member that still holds its sockets)
and thawed; the leader is found through the JSON gateway. Everything lives
under one temporary directory that close() removes, also after a failure."""
import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request

ETCD = "/usr/bin/etcd"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certs(d):
    """A CA, one server certificate for 127.0.0.1/localhost, one client
    certificate; returns their paths."""
    def run(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True)
    p = {k: os.path.join(d, k) for k in ("ca.key", "ca.crt", "srv.key", "srv.crt", "cli.key",
                                          "cli.crt", "ext.cnf")}
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=crun-test-ca",
        "-keyout", p["ca.key"], "-out", p["ca.crt"])
    with open(p["ext.cnf"], "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                "extendedKeyUsage=serverAuth,clientAuth\n")
    for who, cn in (("srv", "127.0.0.1"), ("cli", "crun-agent")):
        csr = os.path.join(d, who + ".csr")
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
            "-keyout", p[who + ".key"], "-out", csr)
        run("x509", "-req", "-in", csr, "-CA", p["ca.crt"], "-CAkey", p["ca.key"],
            "-CAcreateserial", "-days", "2", "-extfile", p["ext.cnf"], "-out", p[who + ".crt"])
    return p


class Member:
    def __init__(self, name, client_port, peer_port, d):
        self.name, self.client_port, self.peer_port, self.dir = name, client_port, peer_port, d
        self.proc = None
        self.frozen = False


class EtcdCluster:
    def __init__(self, n=1, tls=False):
        if not os.access(ETCD, os.X_OK):
            raise RuntimeError(f"{ETCD} is missing: install Debian's etcd-server")
        self.dir = tempfile.mkdtemp(prefix=f"crun-etcd-{os.getpid()}-")
        self.tls = tls
        self.certs = make_certs(self.dir) if tls else None
        self.members = [Member(f"m{i}", _free_port(), _free_port(), os.path.join(self.dir, f"m{i}"))
                        for i in range(n)]
        self.scheme = "https" if tls else "http"
        self.cluster = ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)
        for m in self.members:
            self.start(m)
        self.wait_ready()

    # ---- endpoints --------------------------------------------------------------------

    def endpoints(self, first=None):
        """The member list for --rdzv_endpoint; `first` leads it (agents
        send their requests there until it fails)."""
        ms = [first] + [m for m in self.members if m is not first] if first else self.members
        return ",".join(f"127.0.0.1:{m.client_port}" for m in ms)

    def url(self, m):
        return f"{self.scheme}://127.0.0.1:{m.client_port}"

    def rdzv_conf(self):
        """The rdzv_conf items an agent needs for this cluster."""
        if not self.tls:
            return ""
        c = self.certs
        return f"protocol=https,cacert={c['ca.crt']},cert={c['cli.crt']},key={c['cli.key']}"

    # ---- processes --------------------------------------------------------------------

    def start(self, m):
        url = self.url(m)
        argv = [ETCD, "--name", m.name, "--data-dir", m.dir,
                "--listen-client-urls", url, "--advertise-client-urls", url,
                "--listen-peer-urls", f"http://127.0.0.1:{m.peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{m.peer_port}",
                "--initial-cluster", self.cluster, "--initial-cluster-state",
                "existing" if os.path.exists(m.dir) else "new",
                "--log-level", "warn"]
        if self.tls:
            c = self.certs
            argv += ["--cert-file", c["srv.crt"], "--key-file", c["srv.key"],
                     "--trusted-ca-file", c["ca.crt"], "--client-cert-auth"]
        log = open(os.path.join(self.dir, f"{m.name}.log"), "ab")
        m.proc = subprocess.Popen(argv, stdout=log, stderr=log, close_fds=True)
        log.close()
        m.frozen = False

    def kill(self, m):
        if m.frozen:
            self.thaw(m)
        m.proc.kill()
        m.proc.wait(timeout=30)

    def freeze(self, m):
        """SIGSTOP: the member keeps its sockets but answers nothing, as a
        partitioned host would."""
        m.proc.send_signal(signal.SIGSTOP)
        m.frozen = True

    def thaw(self, m):
        m.proc.send_signal(signal.SIGCONT)
        m.frozen = False

    def close(self):
        for m in self.members:
            if m.proc and m.proc.poll() is None:
                if m.frozen:
                    m.proc.send_signal(signal.SIGCONT)
                m.proc.kill()
                m.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- the gateway ------------------------------------------------------------------

    def call(self, m, path, body, timeout=2.0):
        req = urllib.request.Request(self.url(m) + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        ctx = None
        if self.tls:
            ctx = ssl.create_default_context(cafile=self.certs["ca.crt"])
            ctx.load_cert_chain(self.certs["cli.crt"], self.certs["cli.key"])
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            return json.loads(r.read())

    def status(self, m):
        return self.call(m, "/v3/maintenance/status", {})

    def leader(self, timeout=60):
        """The member that is leader (asks every live one), waiting for an
        election if there is none."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.members:
                if m.frozen or m.proc.poll() is not None:
                    continue
                try:
                    st = self.status(m)
                except OSError:
                    continue
                lid = st.get("leader")
                for x in self.members:
                    if x.proc.poll() is None and not x.frozen:
                        try:
                            if self.status(x)["header"]["member_id"] == lid:
                                return x
                        except OSError:
                            pass
            time.sleep(0.1)
        raise TimeoutError("no etcd leader")

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        for m in self.members:
            while True:
                try:
                    self.call(m, "/v3/kv/range", {"key": base64.b64encode(b"x").decode()})
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        self.leader(timeout)

    def keys(self, prefix):
        """Every key under prefix (any member that answers)."""
        k = prefix.encode()
        end = k[:-1] + bytes([k[-1] + 1])
        for m in self.members:
            if m.frozen or m.proc.poll() is not None:
                continue
            try:
                res = self.call(m, "/v3/kv/range", {"key": base64.b64encode(k).decode(),
                                                    "range_end": base64.b64encode(end).decode(),
                                                    "keys_only": True})
            except OSError:
                continue
            return [base64.b64decode(kv["key"]).decode(errors="replace")
                    for kv in res.get("kvs", [])]
        raise OSError("no etcd member answers")
