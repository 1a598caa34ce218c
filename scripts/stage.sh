#!/usr/bin/env bash
# Times one stage of `make test` and prints the table of every stage so far when a stage fails
# or when asked for the table (`make test` prints it at its end), so CI's log says where the
# time went (docs/building.md, "What make test costs").
#
#   scripts/stage.sh LOG NAME COMMAND [ARG…]   run COMMAND, append
#                                              "NAME<TAB>SECONDS<TAB>STATUS<TAB>CPU%"
#
# CPU% is how busy the whole machine was during the stage (/proc/stat, every core, the
# background prefetch included): 100% means no core was idle, so only less work makes that
# stage faster; a low figure means the stage waits (on guests, the network, one core) and
# could overlap with another.
#   scripts/stage.sh LOG --table               print the table
set -uo pipefail
log=${1:?usage: scripts/stage.sh LOG NAME COMMAND… | LOG --table}
shift
table() {
  [ -s "$log" ] || return 0
  echo "make test: stage times"
  awk -F'\t' '{ printf "  %-14s %6d s  %4s cpu  %s\n", $1, $2, ($4 == "" ? "-" : $4 "%"), $3; total += $2 }
              END { printf "  %-14s %6d s  (%d min %d s)\n", "total", total, total / 60, total % 60 }' "$log"
}
if [ "${1:-}" = "--table" ]; then
  table
  exit 0
fi
name=${1:?stage name}
shift
mkdir -p "$(dirname "$log")"
# busy and all jiffies of every core so far (idle and iowait are not busy)
ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat 2>/dev/null; }
read -r busy0 all0 < <(ticks || echo "0 0")
start=$(date +%s)
"$@"
rc=$?
end=$(date +%s)
read -r busy1 all1 < <(ticks || echo "0 0")
cpu=
[ "$((all1 - all0))" -gt 0 ] && cpu=$(( 100 * (busy1 - busy0) / (all1 - all0) ))
if [ "$rc" -eq 0 ]; then status=ok; else status="FAILED (exit $rc)"; fi
printf '%s\t%s\t%s\t%s\n' "$name" "$((end - start))" "$status" "$cpu" >>"$log"
if [ "$rc" -ne 0 ]; then
  table >&2
fi
exit "$rc"
