#!/bin/sh
# deps.sh [build|test|deb|bench]: installs the Debian packages crun needs that
# are missing, with apt-get (through sudo when not root), and says so. "build"
# is what `make` needs; "test" adds what `make test` needs (PyTorch 1.13, etcd,
# pytest, clang's fuzzer runtime, iproute2, a venv with PyTorch 2.x from PyPI);
# "deb" adds debhelper for `make deb`, lintian and devscripts (hardening-check)
# for `make deb-check`; "bench" adds gnuplot for `make bench-scale`.
set -eu
what=${1:-build}

build_pkgs="build-essential pkg-config libevent-dev libcjson-dev libssl-dev check"
test_pkgs="python3 python3-venv python3-pytest python3-torch etcd-server etcd-client \
clang libclang-rt-14-dev iproute2 procps psmisc \
python3-prometheus-client python3-jsonschema zsh tcsh groff-base man-db slurm-wlm munge gdb strace"
deb_pkgs="debhelper dpkg-dev fakeroot lintian devscripts"
bench_pkgs="gnuplot-nox"
pkgs=$build_pkgs
[ "$what" = test ] && pkgs="$build_pkgs $test_pkgs"
[ "$what" = deb ] && pkgs="$build_pkgs $deb_pkgs"
[ "$what" = bench ] && pkgs="$build_pkgs $test_pkgs $bench_pkgs"

missing=
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done

if [ -n "$missing" ]; then
	echo "deps: installing missing Debian packages:$missing"
	sudo=
	[ "$(id -u)" -ne 0 ] && sudo=sudo
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update -qq
	# shellcheck disable=SC2086
	$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
	echo "deps: installed:$missing"
fi

if [ "$what" = test ] || [ "$what" = bench ]; then
	# PyTorch 2.x (the v2 store dialect) lives in a venv outside the clone
	# so that CI's fresh clones reuse it. The interop tests fail loudly when
	# it is missing: they never skip.
	venv=${CRUN_TORCH2_VENV:-$HOME/.cache/crun/venv-torch2}
	if ! "$venv/bin/python" -c 'import torch, sys; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 else 1)' 2>/dev/null; then
		echo "deps: creating $venv with PyTorch 2.x from PyPI (one-time, a few GB)"
		mkdir -p "$(dirname "$venv")"
		/usr/bin/python3 -m venv "$venv"
		"$venv/bin/pip" install -q --disable-pip-version-check 'torch>=2.1' numpy ||
			echo "deps: WARNING: PyTorch 2.x install failed; the v2 interop tests will fail"
	fi
	# py-spy (Python frames in stack captures, test_hang.py) in the same venv.
	if [ ! -x "$venv/bin/py-spy" ]; then
		"$venv/bin/pip" install -q --disable-pip-version-check py-spy ||
			echo "deps: WARNING: py-spy install failed; the py-spy stack tests will fail"
	fi
fi
