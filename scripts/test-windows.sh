#!/usr/bin/env bash
# Runs kiln-firstboot's test suite built for x86_64-pc-windows-gnu under Wine (`make
# test-windows`). Extra arguments go to `cargo test` (e.g. a test name filter).
#
# Three Wine 8 traps are handled here (docs/windows.md):
# - Rust's std needs ProcessPrng from bcryptprimitives.dll, which Wine 8.0 lacks: a small
#   stand-in DLL (scripts/wine/bcryptprimitives.c) is built into the private prefix.
# - A crash inside a test starts winedbg, which crashes as well, and Wine then exits 0 with no
#   output: winedbg is disabled (WINEDLLOVERRIDES) so a crash fails, and this script fails
#   unless every test binary cargo ran printed its own `test result: ok` line.
# - Now and then Wine fails to start a binary at all (exit 1, no output): the runner
#   (scripts/wine/run-test.sh) retries such a start once, and says so; so does the prefix's
#   wineboot --init below.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/windows-env.sh"
cd "$kiln_root"
win_check_tools
command -v wine >/dev/null || win_die "wine is missing: run \`make deps\` (installs wine, wine64)"

# A prefix of our own under target/, so a developer's ~/.wine is never touched.
export WINEPREFIX=${KILN_WINEPREFIX:-$kiln_root/target/wine-prefix}
export WINEARCH=win64 WINEDEBUG=-all WINEDLLOVERRIDES="winedbg.exe=d;mscoree,mshtml="
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER="$kiln_root/scripts/wine/run-test.sh"
# wineboot can fail the way any Wine start can (the runner's note; CI saw it once, output
# discarded): one failure is retried (wineboot --init completes a partial prefix), its output
# is kept in target/wineboot.log and printed for each failed attempt.
if [ ! -f "$WINEPREFIX/system.reg" ]; then
  echo "test-windows: creating the Wine prefix $WINEPREFIX"
  boot_log="$kiln_root/target/wineboot.log"
  mkdir -p "$WINEPREFIX"
  for attempt in 1 2; do
    rc=0
    wineboot --init >"$boot_log" 2>&1 || rc=$?
    wineserver -w || true
    [ "$rc" -eq 0 ] && [ -f "$WINEPREFIX/system.reg" ] && break
    echo "test-windows: wineboot --init exited $rc (attempt $attempt, system.reg" \
      "$([ -f "$WINEPREFIX/system.reg" ] && echo written || echo missing)); its output:" >&2
    tail -n 40 "$boot_log" >&2
    wineserver -k 2>/dev/null || true
    [ "$attempt" -eq 2 ] && win_die "wineboot --init failed twice for $WINEPREFIX (log: $boot_log)"
  done
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
# Test by test: every test the Linux suite runs ran under Wine too, or is declared in
# scripts/wine-not-run.tsv with its reason. An empty `#![cfg(unix)]` binary is not a pass.
linux_list="$kiln_root/target/firstboot/test-linux-list.txt"
cargo test --locked -p kiln-firstboot -- --list --format terse >"$linux_list" 2>&1 ||
  win_die "listing the Linux tests failed (log: $linux_list)"
python3 - "$linux_list" "$log" "$kiln_root/scripts/wine-not-run.tsv" <<'PY'
import re, sys
linux_list, wine_log, declared_path = sys.argv[1:]
def tests(path, pattern):
    """(suite, test) pairs: suite from cargo's `Running` lines, tests by `pattern`."""
    suite, found = None, set()
    for line in open(path, errors="replace"):
        m = re.match(r"\s+Running (unittests )?(\S+)", line)
        if m:
            p = m.group(2)
            suite = ("lib" if p.endswith("lib.rs") else "main") if m.group(1) else p.rsplit("/", 1)[-1][:-3]
            continue
        m = re.match(pattern, line.rstrip())
        if m and suite:
            found.add((suite, m.group(1)))
    return found
linux = tests(linux_list, r"(\S+): test$")
wine = tests(wine_log, r"test (.+) \.\.\. ok$")
declared = {}
for l in open(declared_path):
    if l.startswith("#") or not l.strip():
        continue
    s, t, why = l.rstrip("\n").split("\t", 2)
    declared[(s, t)] = why
missing = linux - wine
if not linux:
    sys.exit("test-windows: FAIL the Linux test list is empty; cannot compare")
def covers(d, m):
    """A declared (suite, test) covers a missing one: the same test, a whole suite (`*`), or
    every test of one module of it (`MODULE::*`)."""
    if d[0] != m[0]:
        return False
    if d[1] == "*" or d[1] == m[1]:
        return True
    return d[1].endswith("::*") and m[1].startswith(d[1][:-1])
undeclared = sorted(m for m in missing if not any(covers(d, m) for d in declared))
used = {d for d in declared if any(covers(d, m) for m in missing)}
stale = sorted(set(declared) - used)
by_suite = {}
for s, t in missing:
    # it's tests are reported per tests/ file (MODULE::), the lib's per suite.
    key = f"{s} {t.split('::', 1)[0]}" if s == "it" else s
    by_suite.setdefault(key, []).append((s, t))
for key in sorted(by_suite):
    why = "; ".join(dict.fromkeys(next((declared[d] for d in declared if covers(d, m)), "?") for m in sorted(by_suite[key])))
    print(f"test-windows: NOT RUN under Wine: {key}: {len(by_suite[key])} of its Linux tests ({why})")
ran_both = len(linux & wine)
print(f"test-windows: {ran_both} of {len(linux)} Linux tests also passed under Wine; {len(wine - linux)} Windows-only tests passed")
if undeclared:
    print("test-windows: FAIL these Linux tests did not run under Wine and scripts/wine-not-run.tsv does not say why:", file=sys.stderr)
    for s, t in undeclared:
        print(f"  {s}\t{t}", file=sys.stderr)
    sys.exit(1)
if stale:
    print("test-windows: FAIL scripts/wine-not-run.tsv lists tests that are not missing under Wine (remove them):", file=sys.stderr)
    for s, t in stale:
        print(f"  {s}\t{t}", file=sys.stderr)
    sys.exit(1)
PY
echo "test-windows: ok, $ran test binaries under Wine, each with its own 'test result: ok' line"
