#!/usr/bin/env bash
# Builds tools/cri-smoke (the boot tests' CRI client, docs/boot-tests.md "A real pod") for the
# arm64 guest and copies it to $1 (default target/cri-smoke/arm64/cri-smoke).
#
# scripts/cross-arm64.sh compiles it with the arm64 stand-ins in one cargo invocation (Debian's
# rustc against Debian's prebuilt arm64 std, linked by Debian's aarch64-linux-gnu-gcc against
# the cross glibc of libc6-dev-arm64-cross: bookworm's 2.36, the guest's). The protos are
# compiled by the host's protoc in k8s-cri's build script. The binary is then run once under
# qemu-aarch64-static with the cross glibc, so one that cannot start fails here.
#
# Needs (make deps): what scripts/cross-arm64.sh needs, and qemu-user-static.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-target/cri-smoke/arm64/cri-smoke}
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
cd "$root"
die() { echo "build-cri-smoke-arm64: $*" >&2; exit 1; }

command -v qemu-aarch64-static >/dev/null ||
  die "qemu-aarch64-static is missing: run \`make deps\` (installs qemu-user-static)"
sysroot=/usr/aarch64-linux-gnu
bin=$("$root/scripts/cross-arm64.sh")/cri-smoke
file -b "$bin" | grep -q 'ARM aarch64' || die "$bin is not an aarch64 program: $(file -b "$bin")"
# It starts and parses its command line: --help prints the usage and exits 2.
set +e
usage=$(qemu-aarch64-static -L "$sysroot" "$bin" --help 2>&1)
status=$?
set -e
[ "$status" -eq 2 ] && grep -q -- '--image' <<<"$usage" ||
  die "$bin --help under qemu-aarch64-static exited $status without its usage: $usage"
# Stripped: every boot copies it into its disk.
mkdir -p "$(dirname "$out")"
aarch64-linux-gnu-strip -o "$out.tmp.$$" "$bin"
if cmp -s "$out.tmp.$$" "$out"; then rm "$out.tmp.$$"; else mv "$out.tmp.$$" "$out"; fi
echo "build-cri-smoke-arm64: $out ($(stat -c %s "$out") bytes)"
