"""The GPU object's build and tests/gpu/run.sh, checked on a host without a
GPU (issue 27).

- The object carries sm_80 and sm_90 machine code and compute_90 PTX, which
  the driver JITs on any newer GPU (B200 is 10.0); before, the only PTX was
  the newest nvcc knows (compute_121), which JITs on nothing older than it.
- The GPU's integer AVG divides in int64, as the CPU path does.
- run.sh counts a program's "skipped" as a skip only where no GPU is listed:
  with a (fake) nvidia-smi listing one, a skip is a failure, and the reason
  printed is the real load or CUDA error. Before, it said "skipped: no CUDA
  device" and exited 0.
"""
import os
import re
import stat
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT

GPU_OBJECT = os.path.join(BUILD, "lib", "libcrun-cuda.so.0")
RUN_SH = os.path.join(ROOT, "tests", "gpu", "run.sh")


def need_gpu_object():
    if not os.path.exists(GPU_OBJECT):
        pytest.skip("built with WITH_CUDA=0: no GPU object")


def test_gpu_object_carries_sass_and_portable_ptx():
    need_gpu_object()
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "gpu", "fatbin_archs.py"),
                          GPU_OBJECT, "elf80", "elf90", "ptx90"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_gpu_integer_avg_divides_like_the_cpu_path():
    """tests/gpu/host_div runs div_kernel's element arithmetic on the host:
    before, i8 over 128 ranks divided by -128 and u8 over 256 by zero."""
    need_gpu_object()
    out = subprocess.run([os.path.join(BUILD, "tests", "gpu", "host_div")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"host_div: \d+ checks, 0 disagreements", out.stdout), out.stdout


def fake_nvidia_smi(tmp_path, listing):
    """An nvidia-smi that answers -L with `listing` (and nothing else)."""
    d = tmp_path / "fakebin"
    d.mkdir()
    p = d / "nvidia-smi"
    p.write_text('#!/bin/sh\n[ "$1" = -L ] && printf "%s" "$FAKE_SMI_L"\nexit 0\n')
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return dict(os.environ, PATH=f"{d}:{os.environ['PATH']}", FAKE_SMI_L=listing)


@pytest.mark.parametrize("listing,want_rc", [
    ("GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n", 1),
    ("", 0),
], ids=["gpu_listed", "none_listed"])
def test_run_sh_skip_is_a_failure_only_where_a_gpu_is_listed(tmp_path, listing, want_rc):
    need_gpu_object()
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this host has an NVIDIA driver: the programs would not skip")
    env = fake_nvidia_smi(tmp_path, listing)
    env.update(GPU_NO_BUILD="1", OUT=str(tmp_path / "out"))
    out = subprocess.run(["sh", RUN_SH, BUILD], capture_output=True, text=True, timeout=600,
                         env=env, cwd=ROOT)
    text = out.stdout + out.stderr
    assert out.returncode == want_rc, text[-3000:]
    verdicts = re.findall(r"^gpu suite: verdict: .*$", text, re.M)
    assert len(verdicts) == 1, text[-3000:]
    # The reason is CUDA's own words, not a blanket "no CUDA device".
    assert re.search(r"gpu_kernels: .*cudaGetDeviceCount: .*\(cuda\w+\)", text), text[-3000:]
    if want_rc:
        assert re.search(r"gpu_kernels: FAILED \(skipped, but nvidia-smi lists 1 GPU", text), \
            text[-3000:]
