#!/usr/bin/env bash
# Size gate: fails when a binary is over its budget. Prints the real size either way so the
# number in docs/benchmarks.md can be checked against CI's log.
set -euo pipefail
bin=$1 budget_kib=$2
[ -f "$bin" ] || { echo "check-size: $bin does not exist (build it first)" >&2; exit 1; }
size=$(stat -c %s "$bin")
kib=$(( (size + 1023) / 1024 ))
kind=$(file -b "$bin" | cut -d, -f1-2)
if [ "$size" -gt $(( budget_kib * 1024 )) ]; then
  echo "check-size: FAIL $bin is $size bytes ($kib KiB), over its budget of $budget_kib KiB [$kind]" >&2
  exit 1
fi
echo "check-size: ok $bin is $size bytes ($kib KiB) of a $budget_kib KiB budget [$kind]"
