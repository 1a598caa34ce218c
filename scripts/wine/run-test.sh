#!/usr/bin/env bash
# Cargo's runner for Windows test binaries under Wine (scripts/test-windows.sh).
#
# Wine 8 now and then fails to start a program at all: it exits 1 having printed nothing,
# not even the test harness's `running N tests` line (seen once in ~40 runs of the suite,
# on a binary with no tests). Such a start is retried once, and the retry is said on stderr.
# A binary that printed anything, or fails the same way twice, fails as it is.
set -uo pipefail
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
for attempt in 1 2; do
  wine "$@" >"$out" 2>"$err"
  rc=$?
  if [ "$rc" -eq 0 ] || [ -s "$out" ] || [ "$attempt" -eq 2 ]; then
    break
  fi
  echo "test-windows: wine exited $rc with no output starting $1; retrying once" >&2
  cat "$err" >&2
done
cat "$out"
cat "$err" >&2
exit "$rc"
