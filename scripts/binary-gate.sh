#!/usr/bin/env bash
# Runs the builder's own inspection gate (`kiln inspect`, goblin) on the two kiln-firstboot
# binaries this workspace ships, and checks what the issues promise of them:
#   Linux:   ELF, x86-64, static (no interpreter, no needed libraries)
#   Windows: PE32+, x86-64, console subsystem
#   scripts/binary-gate.sh KILN LINUX_BIN WINDOWS_EXE
set -euo pipefail
kiln=$1 linux=$2 exe=$3
fail() { echo "binary-gate: FAIL $*" >&2; exit 1; }

out=$("$kiln" inspect --json --os linux --arch amd64 "$linux") || fail "$linux: kiln inspect refused it: $out"
grep -q '"format":"elf"' <<<"$out" || fail "$linux: expected an ELF file, found: $out"
grep -q '"machine":"x86-64"' <<<"$out" || fail "$linux: expected machine x86-64, found: $out"
grep -q '"linkage":"static"' <<<"$out" || fail "$linux: expected a static binary, found: $out"
grep -q '"needed":\[\]' <<<"$out" || fail "$linux: expected no needed libraries, found: $out"
echo "binary-gate: ok $linux: static ELF x86-64"

out=$("$kiln" inspect --json --os windows --arch amd64 "$exe") || fail "$exe: kiln inspect refused it: $out"
grep -q '"format":"pe"' <<<"$out" || fail "$exe: expected a PE file, found: $out"
grep -q '"is_64":true' <<<"$out" || fail "$exe: expected PE32+, found: $out"
grep -q '"machine":"x86-64"' <<<"$out" || fail "$exe: expected machine x86-64, found: $out"
grep -q '"subsystem":"console"' <<<"$out" || fail "$exe: expected the console subsystem, found: $out"
echo "binary-gate: ok $exe: PE32+ x86-64 console"
