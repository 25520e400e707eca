"""The core loads and runs where there is no CUDA (issues 14 and 15).

libcrun.so.0, libcrun.a and every program must not name a CUDA or NCCL
library in NEEDED, whatever the linker's --as-needed default; CUDA lives in
libcrun-cuda.so.0, which the SDK dlopens. With the CUDA directory hidden (a
tmpfs over it in a private mount namespace, LD_LIBRARY_PATH empty) a job
still runs on the cpu backend, `nccl` fails with CRUN_ENOTSUP naming the
missing library, and `auto` falls back to cpu and says so once per process.
Before this change libcrun.so.0 listed libcudart.so.13 in NEEDED.
"""
import glob
import os
import re
import subprocess

import pytest

from conftest import BUILD, ROOT, bin_path, free_port

GPU_LIB = re.compile(r"lib(cuda|cudart|nccl|cublas|nvrtc)[^ ]*\.so")
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
GPU_OBJECT = os.path.join(BUILD, "lib", "libcrun-cuda.so.0")


def dynamic(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def needed(path):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic(path))


def core_files():
    files = [os.path.join(BUILD, "lib", "libcrun.so.0")]
    for d in ("bin", "examples", "bench", "tests/helpers"):
        files += [f for f in glob.glob(os.path.join(BUILD, d, "*"))
                  if os.path.isfile(f) and os.access(f, os.X_OK)]
    return files


def test_core_names_no_cuda_library():
    bad = {f: [n for n in needed(f) if GPU_LIB.search(n) or "crun-cuda" in n]
           for f in core_files()}
    assert not {f: n for f, n in bad.items() if n}, bad


def test_no_build_host_runpath_in_what_gets_installed():
    files = core_files()[:1] + glob.glob(os.path.join(BUILD, "bin", "*"))
    if os.path.exists(GPU_OBJECT):
        files.append(GPU_OBJECT)
    for f in files:
        assert not re.search(r"\((RUNPATH|RPATH)\)", dynamic(f)), f"{f} has a runpath"


def test_no_as_needed_cannot_pull_cuda_into_the_core():
    """The core's link lines carry no CUDA library at all, so a linker
    without --as-needed cannot add one; and a program linked against libcrun
    with --no-as-needed stays clean too."""
    dry = subprocess.run(["make", "-n", "-B", f"BUILD={BUILD}",
                          os.path.join(BUILD, "lib", "libcrun.so.0"),
                          os.path.join(BUILD, "bin", "crun")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr[-2000:]
    links = [l for l in dry.stdout.splitlines()
             if "libcrun.so.0" in l and "-shared" in l or "bin/crun " in l + " "]
    assert links, dry.stdout[-2000:]
    for l in links:
        assert not re.search(r"-l(cudart|nccl|cublas)\b", l), l
    exe = os.path.join(BUILD, "gpu_loading_probe")
    src = os.path.join(BUILD, "gpu_loading_probe.c")
    with open(src, "w") as f:
        f.write('#include "crun/crun.h"\nint main(void) { return crun_version() ? 0 : 1; }\n')
    cc = subprocess.run(["cc", "-I", os.path.join(ROOT, "include"), "-o", exe, src,
                         "-Wl,--no-as-needed", "-L" + os.path.join(BUILD, "lib"), "-lcrun"],
                        capture_output=True, text=True, timeout=120)
    assert cc.returncode == 0, cc.stderr
    assert not [n for n in needed(exe) if GPU_LIB.search(n)], needed(exe)


def test_gpu_object_exports_only_its_versioned_doors():
    if not os.path.exists(GPU_OBJECT):
        pytest.skip("built with WITH_CUDA=0: no GPU object")
    out = subprocess.run(["nm", "-D", "--defined-only", GPU_OBJECT], capture_output=True,
                         text=True, timeout=60)
    syms = {l.split()[-1].split("@")[0] for l in out.stdout.splitlines() if " T " in l}
    assert syms == {"crun_cuda_kernels_v1", "crun_cuda_pg_backend_v1"}, syms
    assert set(needed(GPU_OBJECT)) >= {"libcudart.so.13", "libnccl.so.2"}


def run_job(backend, hide_cuda, nproc=2, extra_env=None):
    """dist_matmul through crun with `backend`; with hide_cuda, in a private
    mount namespace where the CUDA directory is an empty tmpfs."""
    env = dict(os.environ, LD_LIBRARY_PATH="", CRUN_LOG_LEVEL="info", **(extra_env or {}))
    argv = [bin_path("crun"), "--nproc_per_node", str(nproc), "--master_port",
            str(free_port()), "--no_python", os.path.join(BUILD, "examples", "dist_matmul"),
            "--backend", backend, "48"]
    if hide_cuda:
        real = os.path.realpath(CUDA_HOME)
        script = 'mount -t tmpfs none "$0" && exec "$@"'
        argv = ["unshare", "-m", "sh", "-c", script, real] + argv
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def can_hide_cuda():
    real = os.path.realpath(CUDA_HOME)
    if not os.path.isdir(real):
        return  # no CUDA on this host at all: every run is CPU-only anyway
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            'mount -t tmpfs none "$0" && ls -A "$0"', real],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0 or probe.stdout.strip():
        pytest.skip(f"cannot hide {real} in a mount namespace: {probe.stderr.strip()}")


def test_cpu_backend_runs_with_cuda_out_of_reach(can_hide_cuda):
    out = run_job("cpu", hide_cuda=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "max relative error vs single-process product 0: OK" in out.stdout + out.stderr


def test_nccl_names_what_is_missing_when_cuda_is_out_of_reach(can_hide_cuda):
    out = run_job("nccl", hide_cuda=True, nproc=1)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "crun_init: not supported" in text, text[-2000:]
    if os.path.exists(GPU_OBJECT):
        # The object is found next to libcrun; what it needs is not.
        assert re.search(r"lib(cudart|nccl)\.so\.\d+: cannot open shared object file", text), \
            text[-2000:]
    else:
        assert "libcrun-cuda.so.0" in text, text[-2000:]


def test_auto_falls_back_to_cpu_and_says_so_once(can_hide_cuda):
    out = run_job("auto", hide_cuda=True)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-2000:]
    said = re.findall(r"crun-worker\[(\d+)\] I backend auto: using cpu \((.*)\)", text)
    pids = [p for p, _ in said]
    assert len(pids) == 2 and len(set(pids)) == 2, text[-2000:]  # once per worker


def test_nccl_without_a_device_gives_the_cuda_error():
    if not os.path.exists(GPU_OBJECT):
        pytest.skip("built with WITH_CUDA=0: no GPU object")
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this host has an NVIDIA driver: tests/gpu/run.sh covers it")
    out = run_job("nccl", hide_cuda=False, nproc=1)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert re.search(r"crun_init: not supported \(nccl backend unavailable: "
                     r"cudaGetDeviceCount: .*\(cuda\w+\)\)", text), text[-2000:]
