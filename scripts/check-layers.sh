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
	service) echo "common store rendezvous service" ;;
	worker_sdk) echo "common store kernels worker_sdk" ;;
	agent) echo "common store rendezvous service agent" ;;
	esac
}
bad=0
for m in common kernels store rendezvous service worker_sdk agent; do
	ok=$(allowed $m)
	for f in $(ls $m/*.c $m/*.h $m/*.cu $m/*/*.c $m/*/*.h 2>/dev/null); do
		for inc in $(grep -hoE '^#include "[a-z_]+/' "$f" | sed -E 's/#include "([a-z_]+)\//\1/'); do
			[ "$inc" = crun ] && continue
			case " $ok " in
			*" $inc "*) ;;
			*) echo "check-layers: $f includes $inc/ (upward from $m)"; bad=1 ;;
			esac
		done
	done
done
# Who may start a store server (include store/server.h): STYLE §1 has
# agent -> store(server, tls); service/ (below agent) shows a server's
# counters on the status page and serves crun-rdzvd's rows of its limits;
# cmd/, tests/ and bench/ may use anything. Two
# library files host a store themselves, each for PyTorch parity; no other
# file of rendezvous/ or worker_sdk/ may. One line per file: path, then why.
server_hosts='
rendezvous/c10d.c the c10d host serves the rendezvous store in-process (torchrun is_host)
rendezvous/c10d.h the c10d options carry the config of the store that host serves
worker_sdk/env.c rank 0 hosts the worker store without an agent store (PyTorch rank 0)
'
for f in $(grep -lE '^#include "store/server(_int)?\.h"' rendezvous/*.[ch] worker_sdk/*.[ch] \
	kernels/*.[ch] common/*.[ch] 2>/dev/null); do
	case "$server_hosts" in
	*"
$f "*) ;;
	*) echo "check-layers: $f includes store/server.h (only agent/, cmd/, tests/, bench/ and the hosts listed in $0 start a store server)"; bad=1 ;;
	esac
done
# A module's subfolders are its private parts (store/client/, store/server/,
# ...): a header of one (client_int.h) is included by its own folder's files
# only; the module's interface is the headers at its root. tests/ and bench/
# may look inside.
for f in $(ls common/*.[ch] kernels/*.[ch] store/*.[ch] store/*/*.[ch] rendezvous/*.[ch] \
	rendezvous/*/*.[ch] service/*.[ch] service/*/*.[ch] worker_sdk/*.[ch] worker_sdk/*/*.[ch] agent/*.[ch] agent/*/*.[ch] \
	cmd/*.c 2>/dev/null); do
	for inc in $(grep -hoE '^#include "[a-z_]+/[a-z_]+/' "$f" | sed -E 's/#include "//'); do
		case "$f" in
		"$inc"*) ;;
		*) echo "check-layers: $f includes ${inc}... (private to that folder)"; bad=1 ;;
		esac
	done
done
[ $bad -eq 0 ] && echo "check-layers: ok"
exit $bad
