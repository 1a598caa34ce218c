#!/usr/bin/env bash
# Runs the builder's own inspection gate (`kiln inspect`, goblin) on the two kiln-firstboot
# binaries this workspace ships, and checks what the issues promise of them:
#   Linux:   ELF, x86-64 (and aarch64 for the arm64 one), static (no interpreter, no needed
#            libraries)
#   Windows: PE32+, x86-64, console subsystem
#   scripts/binary-gate.sh KILN LINUX_BIN WINDOWS_EXE [LINUX_ARM64_BIN]
set -euo pipefail
kiln=$1 linux=$2 exe=$3 linux_arm64=${4:-}
fail() { echo "binary-gate: FAIL $*" >&2; exit 1; }

# static_elf FILE ARCH MACHINE: kiln's own gate accepts FILE as a linux/ARCH binary, and it
# is a static ELF for MACHINE with no needed libraries.
static_elf() {
  local bin=$1 arch=$2 machine=$3 out
  out=$("$kiln" inspect --json --os linux --arch "$arch" "$bin") || fail "$bin: kiln inspect refused it: $out"
  grep -q '"format":"elf"' <<<"$out" || fail "$bin: expected an ELF file, found: $out"
  grep -q "\"machine\":\"$machine\"" <<<"$out" || fail "$bin: expected machine $machine, found: $out"
  grep -q '"linkage":"static"' <<<"$out" || fail "$bin: expected a static binary, found: $out"
  grep -q '"needed":\[\]' <<<"$out" || fail "$bin: expected no needed libraries, found: $out"
  echo "binary-gate: ok $bin: static ELF $machine"
}

static_elf "$linux" amd64 x86-64
if [ -n "$linux_arm64" ]; then
  static_elf "$linux_arm64" arm64 aarch64
  # And the gate refuses it for the wrong architecture, naming both.
  if out=$("$kiln" inspect --json --os linux --arch amd64 "$linux_arm64" 2>&1); then
    fail "$linux_arm64: kiln inspect accepted an aarch64 binary as linux/amd64: $out"
  fi
  grep -q 'aarch64' <<<"$out" || fail "$linux_arm64: the wrong-architecture refusal does not name aarch64: $out"
fi

out=$("$kiln" inspect --json --os windows --arch amd64 "$exe") || fail "$exe: kiln inspect refused it: $out"
grep -q '"format":"pe"' <<<"$out" || fail "$exe: expected a PE file, found: $out"
grep -q '"is_64":true' <<<"$out" || fail "$exe: expected PE32+, found: $out"
grep -q '"machine":"x86-64"' <<<"$out" || fail "$exe: expected machine x86-64, found: $out"
grep -q '"subsystem":"console"' <<<"$out" || fail "$exe: expected the console subsystem, found: $out"
echo "binary-gate: ok $exe: PE32+ x86-64 console"
