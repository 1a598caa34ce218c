#!/usr/bin/env bash
# Times one stage of `make test` and prints the table of every stage so far when a stage fails
# or when asked for the table (`make test` prints it at its end), so CI's log says where the
# time went (docs/building.md, "What make test costs").
#
#   scripts/stage.sh LOG --begin               note the run's start (the table's wall total)
#   scripts/stage.sh LOG NAME COMMAND [ARG…]   run COMMAND, append
#                                              "NAME<TAB>SECONDS<TAB>STATUS<TAB>CPU%"
#   scripts/stage.sh LOG --start NAME COMMAND…  the same in the background, in a process group
#                                              of its own, its output kept in
#                                              DIR/stage-NAME.out (DIR: LOG's directory);
#                                              it ends itself if the make that started it
#                                              is gone
#   scripts/stage.sh LOG --join NAME           wait for a background stage, print its output,
#                                              exit with its status
#   scripts/stage.sh LOG --stop NAME           end a background stage (a stage beside it failed)
#   scripts/stage.sh LOG --table               print the table
#
# CPU% is how busy the whole machine was during the stage (/proc/stat, every core, the
# background prefetch and any stage running beside it included): 100% means no core was idle,
# so only less work makes that stage faster; a low figure means the stage waits (on guests, the
# network, one core) and could overlap with another. Stages that ran beside one another each
# show their own wall time, so the table's wall total, not the sum, is what the run took.
set -uo pipefail
log=${1:?usage: scripts/stage.sh LOG NAME COMMAND… | LOG --begin|--table | LOG --start|--join|--stop NAME}
shift
dir=$(dirname "$log")
table() {
  [ -s "$log" ] || return 0
  echo "make test: stage times"
  local begin
  begin=$(cat "$log.begin" 2>/dev/null || true)
  awk -F'\t' -v wall="$([ -n "$begin" ] && echo $(( $(date +%s) - begin )))" '
    { printf "  %-24s %6d s  %4s cpu  %s\n", $1, $2, ($4 == "" ? "-" : $4 "%"), $3; total += $2 }
    END {
      printf "  %-24s %6d s\n", "sum of the stages", total
      if (wall != "") printf "  %-24s %6d s  (%d min %d s)\n", "total (wall clock)", wall, wall / 60, wall % 60
    }' "$log"
}
case "${1:-}" in
--table)
  table
  exit 0
  ;;
--begin)
  mkdir -p "$dir"
  date +%s >"$log.begin"
  exit 0
  ;;
--start)
  name=${2:?--start NAME COMMAND…}
  shift 2
  mkdir -p "$dir"
  rm -f "$dir/stage-$name.rc" "$dir/stage-$name.pid"
  # The make that runs this recipe: when it is gone (Ctrl-C, a kill), nothing will --join or
  # --stop the stage, so the stage ends itself.
  watch=$PPID
  while [ "$watch" -gt 1 ] && [ "$(cat "/proc/$watch/comm" 2>/dev/null)" != make ]; do
    watch=$(awk '{ print $4 }' "/proc/$watch/stat" 2>/dev/null || echo 1)
  done
  [ "$watch" -gt 1 ] || watch=
  # setsid: its own process group, so --stop ends QEMU, nextest and every test with it.
  setsid bash -c '
    out=$1 rc=$2 watch=$3 watcher=
    shift 3
    if [ -n "$watch" ]; then
      ( while kill -0 "$watch" 2>/dev/null; do sleep 2; done; kill -TERM -- "-$$" ) &
      watcher=$!
    fi
    "$@" >"$out" 2>&1 </dev/null
    status=$?
    [ -z "$watcher" ] || kill "$watcher" 2>/dev/null
    echo "$status" >"$rc.tmp" && mv "$rc.tmp" "$rc"' \
    bash "$dir/stage-$name.out" "$dir/stage-$name.rc" "$watch" "$0" "$log" "$name (beside)" "$@" &
  echo $! >"$dir/stage-$name.pid"
  echo "make test: $name runs in the background beside the next stages (output: $dir/stage-$name.out)"
  exit 0
  ;;
--join)
  name=${2:?--join NAME}
  rc_file=$dir/stage-$name.rc
  pid=$(cat "$dir/stage-$name.pid" 2>/dev/null || true)
  [ -n "$pid" ] || { echo "stage: $name was not started" >&2; exit 1; }
  [ -f "$rc_file" ] || echo "make test: waiting for $name"
  while [ ! -f "$rc_file" ] && kill -0 "$pid" 2>/dev/null; do sleep 2; done
  cat "$dir/stage-$name.out" 2>/dev/null
  rc=$(cat "$rc_file" 2>/dev/null || echo "killed")
  [ "$rc" = stopped ] && rc=killed
  rm -f "$dir/stage-$name.pid"
  if [ "$rc" != 0 ]; then
    echo "make test: $name failed (exit $rc)" >&2
    table >&2
    [ "$rc" = killed ] && exit 1
    exit "$rc"
  fi
  exit 0
  ;;
--stop)
  name=${2:?--stop NAME}
  pid=$(cat "$dir/stage-$name.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    echo "make test: stopping $name (its output so far: $dir/stage-$name.out)" >&2
    kill -TERM -- "-$pid" 2>/dev/null
    for _ in 1 2 3 4 5; do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null
  fi
  [ -f "$dir/stage-$name.rc" ] || echo stopped >"$dir/stage-$name.rc"
  exit 0
  ;;
esac
name=${1:?stage name}
shift
mkdir -p "$dir"
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
