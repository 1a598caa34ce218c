#!/usr/bin/env bash
# Builds the boot tests' slow, cacheable inputs in the background while `make test` runs its
# other stages: QEMU's packages, the guest assets (kernels, initramfs, the amd64 and arm64
# Debian bases; the arm64 one runs debootstrap's second stage under qemu-user) and the arm64
# cross build (cri-smoke and the stand-ins, scripts/cross-arm64.sh). Each of those takes its own lock and is idempotent, so qemu-test's
# own calls wait for a running prefetch and redo anything it did not finish; a failed
# prefetch costs nothing but its time.
#
#   scripts/prefetch.sh start LOG    start in the background, output to LOG
#   scripts/prefetch.sh report LOG   one line: how long it took and how it ended
set -uo pipefail
cmd=${1:?usage: scripts/prefetch.sh start|report LOG}
log=${2:?usage: scripts/prefetch.sh start|report LOG}
cd "$(dirname "$0")/.."
case "$cmd" in
start)
  mkdir -p "$(dirname "$log")"
  : >"$log"
  setsid bash -c '
    start=$(date +%s)
    rc=0
    # The arm64 cross build first: the fixture stage needs its stand-ins sooner than qemu-test
    # needs the guest assets.
    scripts/build-cri-smoke-arm64.sh target/cri-smoke/arm64/cri-smoke || rc=$?
    { scripts/deps.sh qemu && qemu-tests/assets/assets.sh all arm64 >/dev/null; } || rc=$?
    echo "prefetch: done in $(( $(date +%s) - start )) s, exit $rc"
  ' >>"$log" 2>&1 </dev/null &
  echo "make test: building the boot tests' assets in the background (log: $log)"
  ;;
report)
  line=$(grep '^prefetch: done' "$log" 2>/dev/null | tail -n 1)
  echo "make test: background ${line#prefetch: }" | sed 's/background $/background prefetch: still running or not started/'
  ;;
*) echo "usage: scripts/prefetch.sh start|report LOG" >&2; exit 2 ;;
esac
