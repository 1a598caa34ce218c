#!/usr/bin/env bash
# Builds the arm64 (aarch64-unknown-linux-gnu) test equipment of the boot tests and the fixture
# mirror in one cargo invocation, and prints the directory holding the programs:
#
#   scripts/cross-arm64.sh      -> target/cross/arm64/aarch64-unknown-linux-gnu/debug
#                                  (kubelet, crictl, kubeadm, cri-smoke)
#
# Debian's rustc-web compiles, against Debian's own prebuilt arm64 std (the rlibs of
# libstd-rust-web-dev:arm64 of exactly the installed rustc-web version, unpacked with dpkg -x
# into a cache and passed as --sysroot; nothing is installed on the host), and Debian's
# aarch64-linux-gnu-gcc links against the cross glibc of libc6-dev-arm64-cross (bookworm's 2.36,
# the guest's). Earlier scripts rebuilt std twice for this target with -Z build-std (once for the
# stand-ins, once for cri-smoke, about 360 s of CPU in `make test`); test programs do not need a
# size-optimised std. One package selection for both callers (scripts/build-standins.sh and
# scripts/build-cri-smoke-arm64.sh), so the second call is a no-op, and a lock makes a
# concurrent one (the background prefetch and the fixture stage) wait instead of building twice.
#
# The dev profile, lean: no debug info and the dependencies unoptimised. The programs mostly wait
# on containerd and systemd in the guest.
#
# Needs (make deps): rustc-web, cargo-web, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross,
# protobuf-compiler (k8s-cri's build script), apt-get with Debian's archive reachable (once per
# rustc-web version, for the std package).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
die() { echo "cross-arm64: $*" >&2; exit 1; }

debian_rustc=${KILN_DEBIAN_RUSTC:-/usr/bin/rustc}
debian_cargo=${KILN_DEBIAN_CARGO:-/usr/bin/cargo}
[ -x "$debian_rustc" ] && [ -x "$debian_cargo" ] ||
  die "$debian_rustc or $debian_cargo is missing: run \`make deps\` (installs rustc-web, cargo-web)"
command -v aarch64-linux-gnu-gcc >/dev/null ||
  die "aarch64-linux-gnu-gcc is missing: run \`make deps\` (installs gcc-aarch64-linux-gnu)"
[ -f /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] ||
  die "/usr/aarch64-linux-gnu has no ld-linux-aarch64.so.1: run \`make deps\` (installs libc6-dev-arm64-cross)"

target=aarch64-unknown-linux-gnu
target_dir=$root/target/cross/arm64
mkdir -p "$target_dir"
exec 9>"$target_dir.lock"
flock 9

# The std of the installed compiler, for the target: the same source package and version.
std_pkg=libstd-rust-web-dev
# The host's own architecture by name: with the arm64 package installed too, the bare name
# would print both versions.
version=$(dpkg-query -W -f='${Version}' "$std_pkg:$(dpkg --print-architecture)" 2>/dev/null) ||
  die "$std_pkg (amd64) is not installed: run \`make deps\` (rustc-web brings it)"
[ -n "$version" ] || die "$std_pkg (amd64) is not installed: run \`make deps\`"
cache=${KILN_RUST_STD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/rust-std}
sysroot=$cache/$target-$version/usr
if [ ! -d "$sysroot/lib/rustlib/$target/lib" ]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download "$std_pkg:arm64=$version" >/dev/null 2>"$tmp/apt.err") || {
    cat "$tmp/apt.err" >&2
    die "apt-get download $std_pkg:arm64=$version failed: arm64 must be a dpkg architecture and the lists current (\`make deps\` does both)"
  }
  mkdir "$tmp/root"
  dpkg -x "$tmp"/"${std_pkg}"_*_arm64.deb "$tmp/root"
  [ -f "$(ls "$tmp/root/usr/lib/rustlib/$target/lib"/libstd-*.rlib 2>/dev/null | head -n 1)" ] ||
    die "$std_pkg:arm64=$version holds no libstd rlib for $target"
  rm -rf "$cache/$target-$version"
  mv "$tmp/root" "$cache/$target-$version"
fi

# RUSTFLAGS reach only the target's units when --target is given: build scripts and
# proc-macros still use the host's std.
# Stable cargo and rustc: no RUSTC_BOOTSTRAP from a caller (scripts/windows-env.sh sets it).
unset RUSTC_BOOTSTRAP CARGO_BUILD_RUSTFLAGS CARGO_ENCODED_RUSTFLAGS
RUSTC="$debian_rustc" RUSTDOC="${debian_rustc%rustc}rustdoc" RUSTFLAGS="--sysroot=$sysroot" \
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
  "$debian_cargo" build -q --locked -p cri-smoke -p standin-kubelet -p standin-kubeadm \
  --target "$target" --target-dir "$target_dir" \
  --config 'profile.dev.debug=0' --config 'profile.dev.package."*".opt-level=0' \
  --config 'profile.dev.package."*".debug=0' >&2
echo "$target_dir/$target/debug"
