#!/usr/bin/env bash
# Runs kiln-firstboot's test suite built for x86_64-pc-windows-gnu under Wine (`make
# test-windows`). Extra arguments go to `cargo test` (e.g. a test name filter).
#
# Two Wine 8 traps are handled here (docs/windows.md):
# - Rust's std needs ProcessPrng from bcryptprimitives.dll, which Wine 8.0 lacks: a small
#   stand-in DLL (scripts/wine/bcryptprimitives.c) is built into the private prefix.
# - A crash inside a test starts winedbg, which crashes as well, and Wine then exits 0 with no
#   output: winedbg is disabled (WINEDLLOVERRIDES) so a crash fails, and this script fails
#   unless every test binary cargo ran printed its own `test result: ok` line.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/windows-env.sh"
cd "$kiln_root"
win_check_tools
command -v wine >/dev/null || win_die "wine is missing: run \`make deps\` (installs wine, wine64)"

# A prefix of our own under target/, so a developer's ~/.wine is never touched.
export WINEPREFIX=${KILN_WINEPREFIX:-$kiln_root/target/wine-prefix}
export WINEARCH=win64 WINEDEBUG=-all WINEDLLOVERRIDES="winedbg.exe=d;mscoree,mshtml="
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=wine
if [ ! -f "$WINEPREFIX/system.reg" ]; then
  echo "test-windows: creating the Wine prefix $WINEPREFIX"
  mkdir -p "$WINEPREFIX"
  wineboot --init >/dev/null 2>&1 || win_die "wineboot --init failed for $WINEPREFIX"
  wineserver -w
fi
sys32="$WINEPREFIX/drive_c/windows/system32"
[ -d "$sys32" ] || win_die "$sys32 does not exist after wineboot: delete $WINEPREFIX and retry"
x86_64-w64-mingw32-gcc -O2 -shared -o "$WINEPREFIX/bcryptprimitives.dll.tmp" \
  scripts/wine/bcryptprimitives.c -ladvapi32
mv "$WINEPREFIX/bcryptprimitives.dll.tmp" "$sys32/bcryptprimitives.dll"

log="$kiln_root/target/firstboot/test-windows.log"
mkdir -p "$(dirname "$log")"
set +e
"$debian_cargo" test --locked -p kiln-firstboot --target "$win_target" \
  --target-dir target/firstboot/windows-test -Z build-std=std,panic_abort "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e

ran=$(grep -cE '^ +(Running|Doc-tests) ' "$log" || true)
ok=$(grep -cE '^test result: ok\. ' "$log" || true)
results=$(grep -cE '^test result: ' "$log" || true)
if [ "$rc" -ne 0 ]; then
  echo "test-windows: FAIL cargo test exited $rc (log: $log)" >&2
  exit 1
fi
if [ "$ran" -eq 0 ] || [ "$ok" -ne "$ran" ] || [ "$results" -ne "$ran" ]; then
  echo "test-windows: FAIL $ran test binaries ran but $ok printed 'test result: ok' ($results result lines);" \
    "a binary that crashed under Wine can exit 0 without one (log: $log)" >&2
  exit 1
fi
echo "test-windows: ok, $ran test binaries under Wine, each with its own 'test result: ok' line"
