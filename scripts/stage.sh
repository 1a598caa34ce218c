#!/usr/bin/env bash
# Times one stage of `make test` and prints the table of every stage so far when a stage fails
# or when asked for the table (`make test` prints it at its end), so CI's log says where the
# time went (docs/building.md, "What make test costs").
#
#   scripts/stage.sh LOG NAME COMMAND [ARG…]   run COMMAND, append "NAME<TAB>SECONDS<TAB>STATUS"
#   scripts/stage.sh LOG --table               print the table
set -uo pipefail
log=${1:?usage: scripts/stage.sh LOG NAME COMMAND… | LOG --table}
shift
table() {
  [ -s "$log" ] || return 0
  echo "make test: stage times"
  awk -F'\t' '{ printf "  %-14s %6d s  %s\n", $1, $2, $3; total += $2 }
              END { printf "  %-14s %6d s  (%d min %d s)\n", "total", total, total / 60, total % 60 }' "$log"
}
if [ "${1:-}" = "--table" ]; then
  table
  exit 0
fi
name=${1:?stage name}
shift
mkdir -p "$(dirname "$log")"
start=$(date +%s)
"$@"
rc=$?
end=$(date +%s)
if [ "$rc" -eq 0 ]; then status=ok; else status="FAILED (exit $rc)"; fi
printf '%s\t%s\t%s\n' "$name" "$((end - start))" "$status" >>"$log"
if [ "$rc" -ne 0 ]; then
  table >&2
fi
exit "$rc"
