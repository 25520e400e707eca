"""The shipped systemd units, sysusers.d and tmpfiles.d files work as shipped.

A root directory stands for the host: systemd's own systemd-sysusers and
systemd-tmpfiles (--root) apply the shipped configs/sysusers.d and
configs/tmpfiles.d files to it, as they do at boot and on install. The secret
an operator writes there as root (mode 0600, as the configs say) must then be
readable by the user the unit runs as: the program of the unit's ExecStart,
run as that user (setpriv), must get past reading it."""
import json
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


# ---- under a real systemd (systemd_ns.py) -----------------------------------

# What a package's postinst runs for the shipped tmpfiles.d file (at boot,
# systemd-tmpfiles-setup would; it is masked in the machine).
TMPFILES = "! test -e /usr/lib/tmpfiles.d/crun.conf || systemd-tmpfiles --create crun.conf"

@pytest.fixture(scope="module")
def machine():
    """systemd 252 as PID 1 of its own namespaces, with this tree's
    `make install` laid over /usr and /etc, the sysusers.d and tmpfiles.d
    files applied as a package's postinst does. Skips only where the kernel
    refuses the namespaces."""
    from systemd_ns import Canaries, Machine, namespaces_refused, remove_stage, stage_install

    why = namespaces_refused()
    if why:
        print(f"skipped: the kernel refuses the namespaces: {why}")
        pytest.skip(f"namespaces refused: {why}")
    canaries = Canaries()
    stage = stage_install(ROOT, BUILD)
    m = Machine(stage)
    try:
        m.boot()
        canaries.check()
        m.sh(f"systemd-sysusers && {TMPFILES}")
        if os.environ.get("CRUN_SAN", "0") == "1":
            # LeakSanitizer stops the process's threads with ptrace at exit,
            # which the units' SystemCallFilter=@system-service forbids: the
            # process is killed there (SIGSYS) and every clean stop or exit 2
            # reads as a crash. ASan and UBSan stay on; only the exit-time
            # leak scan is off inside the machine (the other suites run it).
            for unit in ("crun-rdzvd.service", "crun-agent@.service"):
                write(m, f"/etc/systemd/system/{unit}.d/san.conf",
                      "[Service]\nEnvironment=ASAN_OPTIONS=detect_leaks=0")
            m.sh("systemctl daemon-reload")
        yield m
    finally:
        m.stop()
        remove_stage(stage)
        try:
            canaries.check()
        finally:
            canaries.remove()


def write(m, path, text, mode="0644"):
    m.sh(f"umask 022; mkdir -p $(dirname {path}); cat > {path} <<'CRUN_EOF'\n{text}\nCRUN_EOF\n"
         f"chmod {mode} {path}")


def rdzvd_json(**limits):
    import json

    return json.dumps({"host": "127.0.0.1", "port": 29400, "status": "127.0.0.1:29401",
                       "auth-secret-file": "/etc/crun/rdzvd.secret", "log-level": "info",
                       "limits": dict({"max-conns": 1000}, **limits)})


def start_rdzvd(m):
    m.sh("test -e /etc/crun/rdzvd.secret || { umask 077; head -c 32 /dev/urandom | "
         "od -An -tx1 | tr -d ' \\n' > /etc/crun/rdzvd.secret; }; "
         + TMPFILES)
    write(m, "/etc/crun/rdzvd.json", rdzvd_json())
    m.sh("systemctl reset-failed crun-rdzvd.service; systemctl start crun-rdzvd.service")


def test_rdzvd_is_ready_with_a_status_as_the_crun_user(machine):
    """Type=notify: start returns once READY=1 came; STATUS= is set; the main
    process runs as the sysusers.d user and read its root-written secret."""
    m = machine
    start_rdzvd(m)
    assert m.show("crun-rdzvd", "ActiveState") == "active"
    assert m.show("crun-rdzvd", "StatusText"), m.journal("crun-rdzvd")
    pid = m.show("crun-rdzvd", "MainPID")
    user = m.sh(f"ps -o user= -p {pid}").stdout.strip()
    assert user == "crun", user


def test_rdzvd_reload_applies_new_limits(machine):
    m = machine
    if m.show("crun-rdzvd", "ActiveState") != "active":
        start_rdzvd(m)
    write(m, "/etc/crun/rdzvd.json", rdzvd_json(**{"max-conns": 777}))
    m.sh("systemctl reload crun-rdzvd.service")
    m.wait_for("the reload's limits line",
               lambda: "max-conns 777" in m.journal("crun-rdzvd"))
    assert m.show("crun-rdzvd", "ActiveState") == "active"


def test_rdzvd_reload_is_a_notice_and_names_a_restart_once(machine):
    """Issue 22.2/22.3 under systemd: a reload applied in full is a notice in
    the journal (priority 5), not a warning; a changed port is named once in
    the unit's StatusText (it said "port, port")."""
    m = machine
    if m.show("crun-rdzvd", "ActiveState") != "active":
        start_rdzvd(m)

    def notices():
        return m.sh("journalctl --no-pager -o cat -p notice..notice -u crun-rdzvd",
                    check=False).stdout
    write(m, "/etc/crun/rdzvd.json", rdzvd_json(**{"max-conns": 778}))
    m.sh("systemctl reload crun-rdzvd.service")
    m.wait_for("the applied reload as a notice",
               lambda: "reload: applied: max-conns; needs a restart: nothing" in notices())
    cfg = json.loads(rdzvd_json(**{"max-conns": 778}))
    cfg["port"] = 29402
    write(m, "/etc/crun/rdzvd.json", json.dumps(cfg))
    m.sh("systemctl reload crun-rdzvd.service")
    m.wait_for("StatusText after the reload",
               lambda: "reloaded" in m.show("crun-rdzvd", "StatusText"))
    assert m.show("crun-rdzvd", "StatusText").endswith("needs a restart: port"), \
        m.show("crun-rdzvd", "StatusText")
    write(m, "/etc/crun/rdzvd.json", rdzvd_json())
    m.sh("systemctl reload crun-rdzvd.service")


def test_rdzvd_stop_leaves_the_unit_inactive_not_failed(machine):
    m = machine
    if m.show("crun-rdzvd", "ActiveState") != "active":
        start_rdzvd(m)
    m.sh("systemctl stop crun-rdzvd.service")
    assert m.show("crun-rdzvd", "ActiveState") == "inactive"
    assert m.show("crun-rdzvd", "Result") == "success"


def test_a_bad_config_fails_once_and_is_not_restarted(machine):
    """Exit 2 (RestartPreventExitStatus=2): failed, and no restart loop."""
    m = machine
    write(m, "/etc/crun/rdzvd.json", '{"port": "not a port"}')
    m.sh("systemctl reset-failed crun-rdzvd.service; systemctl start crun-rdzvd.service",
         check=False)
    m.wait_for("crun-rdzvd failed", lambda: m.show("crun-rdzvd", "ActiveState") == "failed")
    assert m.show("crun-rdzvd", "ExecMainStatus") == "2"
    assert m.show("crun-rdzvd", "NRestarts") == "0"
    # A scheduled restart would show as activating/auto-restart, not failed.
    assert m.show("crun-rdzvd", "SubState") == "failed"


def agent_json(job):
    import json

    return json.dumps({
        "job": {"program": "/bin/sleep", "args": ["600"], "no_python": True,
                "nproc_per_node": "1"},
        "rendezvous": {"backend": "c10d", "endpoint": "127.0.0.1:29400", "id": job,
                       "nnodes": "2"},
        "restart": {"max_restarts": 3},
        "security": {"secret_file": "/etc/crun/rdzvd.secret"},
        "status": {"listen": "127.0.0.1:0"}})


def test_two_agents_are_ready_and_the_watchdog_restarts_a_stopped_one(machine):
    """crun-agent@a and @b (one job of 2 nodes) say READY=1 once their
    workers run and STATUS= with the job; a SIGSTOPped agent stops pinging
    the watchdog and systemd restarts it (WatchdogSec shortened by a drop-in
    so the test does not wait the shipped 30 s)."""
    m = machine
    if m.show("crun-rdzvd", "ActiveState") != "active":
        start_rdzvd(m)
    for i in ("a", "b"):
        write(m, f"/etc/crun/agents/{i}.json", agent_json("job7"))
    write(m, "/etc/systemd/system/crun-agent@.service.d/test.conf",
          "[Service]\nWatchdogSec=3s\nRestartSec=1s")
    m.sh("systemctl daemon-reload && systemctl start --no-block crun-agent@a crun-agent@b")
    try:
        for i in ("a", "b"):
            m.wait_for(f"crun-agent@{i} active",
                       lambda: m.show(f"crun-agent@{i}", "ActiveState") == "active")
            assert m.show(f"crun-agent@{i}", "StatusText"), m.journal(f"crun-agent@{i}")
        pid = m.show("crun-agent@a", "MainPID")
        m.sh(f"kill -STOP {pid}")
        m.wait_for("a watchdog restart of crun-agent@a",
                   lambda: int(m.show("crun-agent@a", "NRestarts")) >= 1)
        assert "Watchdog timeout" in m.journal("crun-agent@a"), m.journal("crun-agent@a")
        m.wait_for("crun-agent@a active again",
                   lambda: m.show("crun-agent@a", "ActiveState") == "active" and
                   m.show("crun-agent@a", "MainPID") != pid)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- a:\n{m.journal('crun-agent@a')[-3000:]}"
                             f"\n--- b:\n{m.journal('crun-agent@b')[-3000:]}") from None
    finally:
        m.sh("systemctl stop crun-agent@a crun-agent@b", check=False)
    for i in ("a", "b"):
        assert m.show(f"crun-agent@{i}", "ActiveState") == "inactive", m.journal(
            f"crun-agent@{i}")
