#!/bin/sh
# deb-check.sh DIR: what `make deb` built in DIR passes lintian with no error
# (E:) and its ELF files are hardened as hardening=+all asks: full RELRO
# (BIND_NOW) and FORTIFY (__*_chk calls) wherever the libc has them; the crun
# package ships its units, sysusers and tmpfiles files and its postinst
# applies them (debhelper saw them).
set -eu
dir=$1
cd "$dir"
changes=$(ls *.changes | head -n 1)
echo "deb-check: lintian $changes"
out=$(lintian --no-tag-display-limit "$changes" 2>&1 || true)
printf '%s\n' "$out"
if printf '%s\n' "$out" | grep -q '^E: '; then
	echo "deb-check: lintian reported errors" >&2
	exit 1
fi
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
crun_deb=$(ls crun_*.deb)
dpkg-deb -c "$crun_deb" > "$tmp/list"
dpkg-deb -e "$crun_deb" "$tmp/ctl"
for f in lib/systemd/system/crun-rdzvd.service lib/systemd/system/crun-agent@.service \
	usr/lib/sysusers.d/crun.conf usr/lib/tmpfiles.d/crun.conf \
	usr/share/bash-completion/completions/crun usr/share/doc/crun/README.md.gz \
	usr/share/doc/crun/docs/; do
	grep -q " \./$f\$" "$tmp/list" || { echo "deb-check: $crun_deb lacks /$f" >&2; fail=1; }
done
for w in deb-systemd-helper systemd-sysusers systemd-tmpfiles; do
	grep -q "$w" "$tmp/ctl/postinst" ||
		{ echo "deb-check: crun's postinst does not run $w" >&2; fail=1; }
done
for deb in *.deb; do
	dpkg-deb -x "$deb" "$tmp/x"
done
for f in $(find "$tmp/x" -type f \( -perm -u+x -o -name '*.so*' \) ); do
	file -b "$f" | grep -q ELF || continue
	name=${f#"$tmp/x"}
	if ! readelf -d "$f" | grep -Eq 'BIND_NOW|FLAGS.*NOW'; then
		echo "deb-check: $name is not linked with -z now" >&2
		fail=1
	fi
	if ! readelf -lW "$f" | grep -q GNU_RELRO; then
		echo "deb-check: $name has no RELRO segment" >&2
		fail=1
	fi
	if ! hardening-check --nopie --nostackprotector --nocfprotection "$f" >"$tmp/hc" 2>&1; then
		cat "$tmp/hc" >&2
		fail=1
	fi
	echo "deb-check: $name hardened"
done
exit $fail
