#!/bin/sh
# check-pure.sh OBJ...: fails when an object that must stay a pure core
# (STYLE 7a: decisions in pure code, effects at the edge) uses any symbol
# libc does not define: no crun helper, no logging, no JSON, no sockets. The
# symbols are what `nm -u` lists; libc's are what its shared object exports.
# Sanitizer builds add their own hooks, which are allowed.
set -u
cc=${CC:-cc}
libc=$($cc -print-file-name=libc.so.6)
[ -f "$libc" ] || { echo "check-pure: cannot find libc.so.6 ($libc)"; exit 1; }
defs=$(nm -D --defined-only "$libc" | awk '{ sub(/@.*/, "", $3); print $3 }' | sort -u)
bad=0
for o in "$@"; do
	for sym in $(nm -u "$o" | awk '{ print $2 }'); do
		case "$sym" in
		__asan_* | __ubsan_* | __sanitizer_* | _GLOBAL_OFFSET_TABLE_) continue ;;
		esac
		if ! printf '%s\n' "$defs" | grep -qx "$sym"; then
			echo "check-pure: $o uses $sym, which is not libc's"
			bad=1
		fi
	done
done
[ $bad -eq 0 ] && echo "check-pure: ok ($*)"
exit $bad
