"""systemd 252 booted as PID 1 of its own namespaces, for test_systemd.

Isolation comes before systemd starts, in this order: new pid, mount, net,
uts, ipc and cgroup namespaces (mounts private); a fresh proc; tmpfs on /tmp,
/run and /var/tmp; overlays on /etc and /var whose upper layers live in the
private /run; /usr an overlay whose top layer is a `make install` staging
tree (read-only); a cgroup view of its own (a subgroup of the host's, made
the namespace's root). Every unit that could touch the host is masked
(tmpfiles, udev, sysctl, binfmt, modules, remount-fs, fsck, swap, random seed,
every sysinit/timers/sockets/local-fs want but journald and sysusers) and so
is every generator (fstab's would mount, gpt-auto's would probe disks). It is
ended by SIGKILL to its PID 1: no shutdown path runs (no umount or swapoff).

A canary file in the host's /tmp and /var/tmp is checked after every boot and
every teardown: systemd-tmpfiles-setup, if it ever ran against the host,
would empty them (it happened once)."""
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

from conftest import wait_until

BOOT_SH = r"""#!/bin/sh
set -eu
stage=$1
mount -t proc proc /proc
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/ovl/etc/u /run/ovl/etc/w /run/ovl/var/u /run/ovl/var/w
mount -t overlay overlay -o "lowerdir=$stage/etc:/etc,upperdir=/run/ovl/etc/u,workdir=/run/ovl/etc/w" /etc
mount -t overlay overlay -o "lowerdir=/var,upperdir=/run/ovl/var/u,workdir=/run/ovl/var/w" /var
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
mount -t overlay overlay -o "lowerdir=$stage/usr:/usr" /usr
mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup
mkdir /sys/fs/cgroup/systemd /sys/fs/cgroup/unified
mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
hostname crun-test
ip link set lo up
m=/etc/systemd/system
for u in /lib/systemd/system/sysinit.target.wants/* /etc/systemd/system/sysinit.target.wants/* \
	/lib/systemd/system/timers.target.wants/* /etc/systemd/system/timers.target.wants/* \
	/lib/systemd/system/sockets.target.wants/* /etc/systemd/system/sockets.target.wants/* \
	/lib/systemd/system/local-fs.target.wants/* /etc/systemd/system/local-fs.target.wants/*; do
	n=$(basename "$u")
	case $n in
	systemd-journald.service | systemd-journald*.socket | systemd-sysusers.service | '*') continue ;;
	esac
	ln -sf /dev/null "$m/$n"
done
for n in systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service \
	systemd-tmpfiles-setup-dev-early.service systemd-tmpfiles-clean.service \
	systemd-tmpfiles-clean.timer systemd-remount-fs.service systemd-fsck-root.service \
	swap.target tmp.mount systemd-udevd.service systemd-udev-trigger.service \
	systemd-udev-settle.service systemd-udevd-kernel.socket systemd-udevd-control.socket \
	systemd-hwdb-update.service ldconfig.service systemd-sysctl.service systemd-binfmt.service \
	systemd-modules-load.service proc-sys-fs-binfmt_misc.automount systemd-random-seed.service \
	systemd-quotacheck.service systemd-pstore.service systemd-boot-update.service \
	systemd-networkd.service systemd-logind.service getty.target console-getty.service \
	systemd-journal-flush.service systemd-update-utmp.service e2scrub_reap.service \
	network-online.target; do
	ln -sf /dev/null "$m/$n"
done
mkdir -p /etc/systemd/system-generators
for g in /lib/systemd/system-generators/*; do
	ln -sf /dev/null "/etc/systemd/system-generators/$(basename "$g")"
done
printf '[Unit]\nRequires=basic.target\nAfter=basic.target\n' > $m/crun-test.target
export container=crun-test
exec /lib/systemd/systemd --system --unit=crun-test.target --show-status=no
"""


class Canaries:
    """A file in the host's /tmp and /var/tmp that must survive every boot."""

    def __init__(self):
        tag = uuid.uuid4().hex
        self.paths = [f"/tmp/crun-systemd-canary-{tag}", f"/var/tmp/crun-systemd-canary-{tag}"]
        for p in self.paths:
            with open(p, "w") as f:
                f.write("if this file is gone, a booted systemd emptied the host's tmp\n")

    def check(self):
        gone = [p for p in self.paths if not os.path.exists(p)]
        assert not gone, f"HOST TMP WAS TOUCHED: canaries gone: {gone}; stop and report"

    def remove(self):
        for p in self.paths:
            if os.path.exists(p):
                os.unlink(p)


def machine_env():
    """The environment of what runs inside the machine: the session's TMPDIR
    (conftest.py) is a folder of the host's /tmp, which the machine's private
    /tmp does not have."""
    return {k: v for k, v in os.environ.items() if k != "TMPDIR"}


def namespaces_refused():
    """The kernel's reason, or None when it gives us the namespaces."""
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount", "--net", "--uts", "--ipc",
                          "--cgroup", "--propagation", "private", "true"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return out.stderr.strip()
    for d in ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"):
        if not os.access(d, os.W_OK):
            return f"{d} is not writable"
    return None


class Machine:
    """One boot: stage (a `make install` DESTDIR) is laid over /usr and /etc."""

    def __init__(self, stage):
        self.stage = stage
        self.cg = f"crun-test-{uuid.uuid4().hex[:12]}"
        self.proc = None
        self.pid1 = None

    def boot(self, timeout=120):
        script = os.path.join(self.stage, "boot.sh")
        with open(script, "w") as f:
            f.write(BOOT_SH)
        for h in ("systemd", "unified"):
            os.mkdir(f"/sys/fs/cgroup/{h}/{self.cg}")
        # The child joins the subgroups before unshare: they become its root.
        cg = self.cg
        self.log = open(os.path.join(self.stage, "boot.log"), "w")

        def enter_cgroups():
            for h in ("systemd", "unified"):
                with open(f"/sys/fs/cgroup/{h}/{cg}/cgroup.procs", "w") as f:
                    f.write("0")

        self.proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount", "--net", "--uts", "--ipc", "--cgroup",
             "--propagation", "private", "sh", script, self.stage],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=enter_cgroups, env=machine_env())
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.pid1 is None:
                self.pid1 = self._find_pid1()
            if self.pid1:
                state = self.sh("systemctl is-system-running", check=False).stdout.strip()
                if state in ("running", "degraded"):
                    return
            time.sleep(0.2)
        raise AssertionError(f"systemd did not come up (state {state!r}, exit "
                             f"{self.proc.poll()}): {self.boot_log()[-3000:]}")

    def _find_pid1(self):
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                kids = f.read().split()
        except FileNotFoundError:
            return None
        for k in kids:
            try:
                with open(f"/proc/{k}/comm") as f:
                    if f.read().strip() == "systemd":
                        return int(k)
            except FileNotFoundError:
                pass
        return None

    def boot_log(self):
        with open(os.path.join(self.stage, "boot.log")) as f:
            return f.read()

    def sh(self, cmd, check=True, timeout=120):
        """Runs cmd (sh -c) inside every namespace of the machine."""
        out = subprocess.run(["nsenter", "-t", str(self.pid1), "-a", "sh", "-c", cmd],
                             capture_output=True, text=True, timeout=timeout,
                             env=machine_env())
        if check:
            assert out.returncode == 0, f"{cmd}: exit {out.returncode}: {out.stdout[-2000:]}" \
                f"{out.stderr[-2000:]}"
        return out

    def show(self, unit, prop):
        return self.sh(f"systemctl show -P {prop} {unit}").stdout.strip()

    def wait_for(self, what, pred, timeout=120):
        """conftest.wait_until, polling less often: each look runs systemctl
        or journalctl inside the machine."""
        return wait_until(pred, what, timeout, interval=0.2)

    def journal(self, unit):
        return self.sh(f"journalctl --no-pager -o cat -u {unit}", check=False).stdout

    def stop(self):
        """SIGKILL to PID 1 ends the pid namespace (no shutdown path runs)."""
        if self.pid1:
            try:
                os.kill(self.pid1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            self.log.close()
        for h in ("systemd", "unified"):
            top = f"/sys/fs/cgroup/{h}/{self.cg}"
            for _ in range(50):  # the kernel frees a cgroup once its last task is reaped
                for d, _dirs, _files in sorted(os.walk(top, topdown=False)) if \
                        os.path.isdir(top) else []:
                    try:
                        os.rmdir(d)
                    except OSError:
                        pass
                if not os.path.isdir(top):
                    break
                time.sleep(0.1)


def stage_install(root, build):
    """`make install` of this tree into a fresh staging directory (not under
    /tmp, which the machine covers), PREFIX=/usr as a package does."""
    covered = ("/tmp/", "/var/tmp/", "/run/")
    base = build
    if os.path.realpath(build).startswith(covered):
        # a clone under /tmp (as CI may make): stage outside what the machine covers
        base = os.path.expanduser("~/.cache/crun")
        os.makedirs(base, exist_ok=True)
    stage = tempfile.mkdtemp(prefix="systemd-stage-", dir=base)
    real = os.path.realpath(stage)
    assert not real.startswith(covered), \
        f"{real}: the machine covers /tmp, /var/tmp and /run; build elsewhere"
    san = "1" if os.environ.get("CRUN_SAN", "0") == "1" else "0"  # as the build was made
    out = subprocess.run(["make", "-C", root, "--no-print-directory", "install",
                          f"DESTDIR={stage}", "PREFIX=/usr", f"BUILD={build}", f"SAN={san}"],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        remove_stage(stage)
        raise AssertionError(f"make install: {out.stdout[-2000:]}{out.stderr[-2000:]}")
    return stage


def remove_stage(stage):
    shutil.rmtree(stage, ignore_errors=True)
