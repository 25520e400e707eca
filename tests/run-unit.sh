#!/bin/sh
# run-unit.sh BIN...: runs every Check binary, lets each print its own summary
# line (CI reads them), and fails if any binary failed.
failed=0
for t in "$@"; do
	echo "== $(basename "$t")"
	CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-60} "$t" || failed=$((failed + 1))
done
if [ "$failed" -ne 0 ]; then
	echo "unit: $failed test binaries failed"
	exit 1
fi
echo "unit: all $# test binaries passed"
