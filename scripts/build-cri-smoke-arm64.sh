#!/usr/bin/env bash
# Builds tools/cri-smoke (the boot tests' CRI client, docs/boot-tests.md "A real pod") for the
# arm64 guest and copies it to $1 (default target/cri-smoke/arm64/cri-smoke).
#
# The same way scripts/build-standins.sh builds the arm64 stand-in kubelet: Debian's rustc
# rebuilds std for aarch64-unknown-linux-gnu (-Z build-std, RUSTC_BOOTSTRAP=1; rustup's
# toolchains here have no aarch64 std), Debian's aarch64-linux-gnu-gcc links it against the
# cross glibc of libc6-dev-arm64-cross (bookworm's 2.36, the guest's). The protos are compiled
# by the host's protoc in k8s-cri's build script. The binary is then run once under
# qemu-aarch64-static with the cross glibc, so one that cannot start fails here.
#
# Needs (make deps): rustc-web, cargo-web, rust-web-src, gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross, protobuf-compiler, qemu-user-static.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-target/cri-smoke/arm64/cri-smoke}
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
cd "$root"
die() { echo "build-cri-smoke-arm64: $*" >&2; exit 1; }

debian_rustc=${KILN_DEBIAN_RUSTC:-/usr/bin/rustc}
debian_cargo=${KILN_DEBIAN_CARGO:-/usr/bin/cargo}
[ -x "$debian_rustc" ] && [ -x "$debian_cargo" ] ||
  die "$debian_rustc or $debian_cargo is missing: run \`make deps\` (installs rustc-web, cargo-web, rust-web-src)"
command -v aarch64-linux-gnu-gcc >/dev/null ||
  die "aarch64-linux-gnu-gcc is missing: run \`make deps\` (installs gcc-aarch64-linux-gnu)"
command -v qemu-aarch64-static >/dev/null ||
  die "qemu-aarch64-static is missing: run \`make deps\` (installs qemu-user-static)"
sysroot=/usr/aarch64-linux-gnu
[ -f "$sysroot/lib/ld-linux-aarch64.so.1" ] ||
  die "$sysroot has no ld-linux-aarch64.so.1: run \`make deps\` (installs libc6-dev-arm64-cross)"

target=aarch64-unknown-linux-gnu
# Lean: no debug info and the dependencies unoptimised (the workspace's dev profile builds
# them at opt-level 2 with debug info). Measured cold on 2 busy cores: 10 min 22 s wall,
# 3 min 18 s user, against 28 min 46 s and 11 min 48 s with the workspace's settings. The
# client mostly waits on containerd, so the pod check's time in the guest is unchanged.
target_dir=target/cri-smoke/arm64-lean
RUSTC="$debian_rustc" RUSTDOC="${debian_rustc%rustc}rustdoc" RUSTC_BOOTSTRAP=1 \
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
  "$debian_cargo" build -q --locked -p cri-smoke --target "$target" --target-dir "$target_dir" \
  --config 'profile.dev.debug=0' --config 'profile.dev.package."*".opt-level=0' \
  --config 'profile.dev.package."*".debug=0' \
  -Z build-std=std,panic_abort

bin=$target_dir/$target/debug/cri-smoke
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
