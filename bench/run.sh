#!/usr/bin/env bash
# `make bench`: runs every benchmark script in bench/ side by side with its baseline.
# Each area adds one script named bench/<area>.sh that prints its own table; this runner
# only calls them in a fixed order and fails if one fails. Results go into docs/benchmarks.md
# by hand, with the command that produced them.
#
#   bench/run.sh            all areas
#   bench/run.sh firstboot  one area
set -euo pipefail
cd "$(dirname "$0")/.."
areas=("$@")
if [ ${#areas[@]} -eq 0 ]; then
  for f in bench/*.sh; do
    name=$(basename "$f" .sh)
    [ "$name" = run ] || areas+=("$name")
  done
fi
for a in "${areas[@]}"; do
  echo "=== bench: $a ==="
  bash "bench/$a.sh"
done
