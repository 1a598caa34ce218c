#!/usr/bin/env bash
# Prints, at the end of `make test`, every check that did not run because KILN_TEST_OPT_OUT
# named it (testkit/optout.rs records them), or says that every check ran.
#
#   scripts/opted-out.sh LOG
set -euo pipefail
log=${1:?usage: scripts/opted-out.sh LOG}
if [ ! -s "$log" ]; then
  echo "make test: every check ran (KILN_TEST_OPT_OUT=${KILN_TEST_OPT_OUT:-})"
  exit 0
fi
n=$(sort -u "$log" | wc -l)
echo "make test: $n check(s) did NOT run (KILN_TEST_OPT_OUT=${KILN_TEST_OPT_OUT:-}):"
sort -u "$log" | while IFS=$'\t' read -r check place test why; do
  echo "  - $check: $test ($place): $why"
done
