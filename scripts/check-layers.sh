#!/bin/sh
# check-layers.sh: fails on any #include that points upward in the module
# graph of ../shared/STYLE.md §1 (common is the leaf; cmd is the top).
set -u
allowed() {
	case "$1" in
	common) echo "common" ;;
	kernels) echo "common kernels" ;;
	store) echo "common store" ;;
	rendezvous) echo "common store rendezvous" ;;
	worker_sdk) echo "common store kernels worker_sdk" ;;
	agent) echo "common store rendezvous agent" ;;
	esac
}
bad=0
for m in common kernels store rendezvous worker_sdk agent; do
	ok=$(allowed $m)
	for f in $(ls $m/*.c $m/*.h $m/*.cu 2>/dev/null); do
		for inc in $(grep -hoE '^#include "[a-z_]+/' "$f" | sed -E 's/#include "([a-z_]+)\//\1/'); do
			[ "$inc" = crun ] && continue
			case " $ok " in
			*" $inc "*) ;;
			*) echo "check-layers: $f includes $inc/ (upward from $m)"; bad=1 ;;
			esac
		done
	done
done
[ $bad -eq 0 ] && echo "check-layers: ok"
exit $bad
