"""Test certificates made with the `openssl` command: a CA, server and client
certificates signed by it (the server's valid for 127.0.0.1 and localhost),
an expired server certificate, one from another CA, and one for the wrong
name. Every key is EC P-256 so generation stays fast."""
import os
import subprocess


def _run(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key(d, name):
    _run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=d)
    os.chmod(os.path.join(d, f"{name}.key"), 0o600)


def _ca(d, name):
    _key(d, name)
    _run("req", "-x509", "-new", "-key", f"{name}.key", "-sha256", "-days", "2",
         "-subj", f"/CN={name}", "-out", f"{name}.pem", cwd=d)


def _leaf(d, name, ca, san, days="2"):
    _key(d, name)
    _run("req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}", "-out", f"{name}.csr",
         cwd=d)
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write(f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n")
    args = ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.pem"]
    _run(*args, "-days", days, cwd=d)


def make(d):
    """Writes the set into directory d; returns {name: (cert, key)} and 'ca'/'other_ca'."""
    _ca(d, "ca")
    _ca(d, "other_ca")
    _leaf(d, "server", "ca", "IP:127.0.0.1,DNS:localhost")
    _leaf(d, "client", "ca", "DNS:client")
    _leaf(d, "wrong_name", "ca", "DNS:elsewhere.example,IP:10.9.9.9")
    _leaf(d, "foreign", "other_ca", "IP:127.0.0.1,DNS:localhost")
    _expired(d)
    p = lambda n: (os.path.join(d, f"{n}.pem"), os.path.join(d, f"{n}.key"))  # noqa: E731
    out = {n: p(n) for n in ("server", "client", "wrong_name", "foreign", "expired")}
    out["ca"] = os.path.join(d, "ca.pem")
    out["other_ca"] = os.path.join(d, "other_ca.pem")
    return out


def _expired(d):
    """A server certificate whose validity ended yesterday: signed with the
    x509 command's -not_before/-not_after when this openssl has them, else
    through `openssl ca` with explicit dates."""
    _key(d, "expired")
    _run("req", "-new", "-key", "expired.key", "-subj", "/CN=expired", "-out", "expired.csr",
         cwd=d)
    with open(os.path.join(d, "expired.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    os.makedirs(os.path.join(d, "ca_db"), exist_ok=True)
    open(os.path.join(d, "ca_db", "index.txt"), "w").close()
    with open(os.path.join(d, "ca_db", "serial"), "w") as f:
        f.write("1000\n")
    with open(os.path.join(d, "ca.cnf"), "w") as f:
        f.write("[ca]\ndefault_ca=c\n[c]\ndatabase=ca_db/index.txt\nserial=ca_db/serial\n"
                "new_certs_dir=ca_db\ndefault_md=sha256\npolicy=p\nunique_subject=no\n"
                "[p]\ncommonName=supplied\n")
    _run("ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key",
         "-in", "expired.csr", "-out", "expired.pem", "-extfile", "expired.ext",
         "-startdate", "20200101000000Z", "-enddate", "20200102000000Z", "-notext", cwd=d)
