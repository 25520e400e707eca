"""The shipped systemd units, sysusers.d and tmpfiles.d files work as shipped.

A root directory stands for the host: systemd's own systemd-sysusers and
systemd-tmpfiles (--root) apply the shipped configs/sysusers.d and
configs/tmpfiles.d files to it, as they do at boot and on install. The secret
an operator writes there as root (mode 0600, as the configs say) must then be
readable by the user the unit runs as: the program of the unit's ExecStart,
run as that user (setpriv), must get past reading it."""
import os
import shlex
import shutil
import subprocess
import tempfile

import pytest

from conftest import BUILD, ROOT, wait_line

CONFIGS = os.path.join(ROOT, "configs")
# The first uid systemd hands a DynamicUser= service (61184..65519).
DYNAMIC_UID = 61184


def unit_settings(unit):
    """[Service] settings of a shipped unit: name -> last value."""
    out = {}
    with open(os.path.join(CONFIGS, "systemd", unit)) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith(("#", "[")) and "=" in line:
                k, v = line.split("=", 1)
                out[k] = v
    return out


def passwd_entry(root, user):
    """(uid, gid) of user in root's /etc/passwd, or None."""
    path = os.path.join(root, "etc", "passwd")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        for line in f:
            parts = line.split(":")
            if parts[0] == user:
                return int(parts[2]), int(parts[3])
    return None


@pytest.fixture
def host_root():
    """A stand-in for the host's / that another user may traverse (pytest's
    tmp_path is under a 0700 directory), with the shipped sysusers.d and
    tmpfiles.d files where a package puts them."""
    root = tempfile.mkdtemp(prefix="crun-systemd-")
    try:
        os.chmod(root, 0o755)
        for kind in ("sysusers.d", "tmpfiles.d"):
            dst = os.path.join(root, "usr", "lib", kind)
            os.makedirs(dst)
            src = os.path.join(CONFIGS, kind)
            for name in sorted(os.listdir(src)) if os.path.isdir(src) else []:
                shutil.copy(os.path.join(src, name), dst)
        os.makedirs(os.path.join(root, "etc", "crun", "agents"))
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def boot_setup(root):
    """What boot (and a package's postinst) runs before the units start."""
    for argv in (["systemd-sysusers", f"--root={root}"],
                 ["systemd-tmpfiles", f"--root={root}", "--create"]):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"{argv}: {out.stderr}"


def service_user(root, unit):
    """(uid, gid) the unit runs as in root, failing if its User= is missing."""
    s = unit_settings(unit)
    if s.get("DynamicUser") == "yes":
        return DYNAMIC_UID, DYNAMIC_UID
    user = s.get("User", "root")
    ids = passwd_entry(root, user)
    assert ids, f"{unit} has User={user} but nothing creates that user " \
        f"(configs/sysusers.d has {os.listdir(os.path.join(root, 'usr/lib/sysusers.d'))})"
    return ids


def exec_start(root, unit, instance):
    """The unit's ExecStart with the host's paths mapped into root and BUILD."""
    argv = shlex.split(unit_settings(unit)["ExecStart"].replace("%i", instance))
    argv[0] = os.path.join(BUILD, "bin", os.path.basename(argv[0]))
    return [a.replace("/etc/crun/", os.path.join(root, "etc", "crun") + "/") for a in argv]


def install_config(root, example, dest, secret_key):
    """An example config at dest in root (as `make install` or an operator
    puts it), its secret file written by root with mode 0600; returns the
    secret's path."""
    import json

    with open(os.path.join(CONFIGS, "examples", example)) as f:
        text = f.read()
    text = text.replace('"/etc/crun/', '"' + os.path.join(root, "etc", "crun") + "/")
    cfg = json.loads(text)
    path = os.path.join(root, dest)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)
    secret = cfg.get(secret_key[0], {}).get(secret_key[1]) if len(secret_key) == 2 \
        else cfg[secret_key[0]]
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    return secret


def as_user(uid, gid, argv):
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv]


def test_crun_rdzvd_service_reads_its_secret_as_shipped(host_root, procs):
    """crun-rdzvd.service with the shipped rdzvd.json and its 0600 secret
    starts listening (it said "Permission denied" and exited 2 as a
    DynamicUser)."""
    install_config(host_root, "rdzvd.json", "etc/crun/rdzvd.json", ("auth-secret-file",))
    boot_setup(host_root)
    uid, gid = service_user(host_root, "crun-rdzvd.service")
    argv = exec_start(host_root, "crun-rdzvd.service", "")
    # Loopback and free ports for the test; the flags win over the file.
    p = procs.spawn(as_user(uid, gid, argv + ["--host", "127.0.0.1", "--port", "0",
                                              "--status", "off"]))
    try:
        wait_line(p.stdout, r"crun-rdzvd listening on", 30)
    except AssertionError:
        p.wait(timeout=30)
        pytest.fail(f"crun-rdzvd as uid {uid} exited {p.returncode}: "
                    f"{p.stderr.read().decode(errors='replace')[-1500:]}")


def test_crun_agent_service_reads_its_job_secret_as_shipped(host_root):
    """crun-agent@job42 with the example job config and its 0600 secret gets
    past the secret (--print-config checks it) as the unit's user."""
    install_config(host_root, "job-c10d.json", "etc/crun/agents/job42.json",
                   ("security", "secret_file"))
    boot_setup(host_root)
    uid, gid = service_user(host_root, "crun-agent@.service")
    argv = exec_start(host_root, "crun-agent@.service", "job42")
    # This host may have no GPU: the flag wins over the config's "gpu".
    out = subprocess.run(as_user(uid, gid, argv + ["--nproc_per_node", "1", "--print-config"]),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"crun-agent as uid {uid}: {out.stderr[-1500:]}"
