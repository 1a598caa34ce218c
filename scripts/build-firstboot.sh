#!/usr/bin/env bash
# Builds kiln-firstboot as a static, size-optimised Linux binary and copies it to $1.
#
# The default way (docs/building.md explains why): Debian's rustc-web compiler rebuilds std
# itself (`-Z build-std`, allowed on a stable compiler through RUSTC_BOOTSTRAP=1) for
# x86_64-unknown-linux-musl with std's size features, links it with Debian's musl-gcc, and
# produces a non-PIE static executable. rustup's stable toolchain keeps building and testing
# the workspace as usual; only this release binary goes through here.
#
#   scripts/build-firstboot.sh [OUT]
#
# KILN_FIRSTBOOT_ARCH picks the node architecture (musl variants only):
#   amd64       (default) x86_64-unknown-linux-musl, linked by Debian's musl-gcc
#   arm64       aarch64-unknown-linux-musl, linked by Debian's aarch64-linux-gnu-gcc with the
#               specs of Debian's musl-dev:arm64 (a Multi-Arch package made for this), and
#               run once under qemu-aarch64-static before it is kept
#
# KILN_FIRSTBOOT_VARIANT picks another way, for measurements and as a fallback:
#   musl        (default) panic=immediate-abort, no unwind tables, std with optimize_for_size
#   musl-abort  panic=abort: a panic still prints its message before aborting
#   glibc       rustup's stable std with glibc's static C runtime; needs no Debian Rust but is
#               about 1 MiB, over the 400 KiB budget (make size-check fails with it)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-target/firstboot/kiln-firstboot}
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
variant=${KILN_FIRSTBOOT_VARIANT:-musl}
arch=${KILN_FIRSTBOOT_ARCH:-amd64}
cd "$root"

die() { echo "build-firstboot: $*" >&2; exit 1; }
# shellcheck source=scripts/musl-toolchain.sh
. "$root/scripts/musl-toolchain.sh"

case "$arch" in
  amd64) run=() ;;
  arm64)
    [ "$variant" != glibc ] || die "KILN_FIRSTBOOT_VARIANT=glibc builds amd64 only"
    command -v qemu-aarch64-static >/dev/null ||
      die "qemu-aarch64-static is missing: run \`make deps\` (installs qemu-user-static)"
    run=(qemu-aarch64-static)
    ;;
  *) die "unknown KILN_FIRSTBOOT_ARCH '$arch' (expected amd64 or arm64)" ;;
esac

case "$variant" in
  glibc)
    target=x86_64-unknown-linux-gnu
    target_dir=target
    # --target keeps RUSTFLAGS away from build scripts and proc-macros.
    RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
      cargo build --locked -p kiln-firstboot --bin kiln-firstboot --profile firstboot --target "$target"
    ;;
  musl | musl-abort)
    # Debian's rustc with std sources, and the C toolchain and libunwind.a for the target
    # (scripts/musl-toolchain.sh, shared with scripts/build-dist.sh).
    musl_debian_rust
    link_dir="$root/target/firstboot/link/$arch"
    musl_toolchain "$arch" "$link_dir"

    # immediate-abort: a panic is one trap instruction, with no message, formatting or
    # unwinding machinery behind it; and so no unwind tables are needed either (-33 KiB).
    if [ "$variant" = musl ]; then
      panic="-Zunstable-options -C panic=immediate-abort -C force-unwind-tables=no"
    else
      panic=""
    fi
    # One target dir per variant and architecture: each keeps its own prebuilt std warm, and
    # the two architectures build at once (`make -j2 firstboot`) without waiting on one
    # directory's lock.
    target_dir=target/firstboot/$variant
    [ "$arch" = amd64 ] || target_dir=$target_dir-$arch
    # relocation-model=static: musl-gcc's specs cannot link a static-pie (no rcrt1.o, always
    # a dynamic loader), so the binary is a classic static executable.
    # -z noseparate-code: the ELF headers, code and read-only data share one read+execute
    # segment, as GNU ld laid out every binary before 2.31, instead of three page-aligned ones
    # with padding between them in the file (8 KiB on amd64, measured: 415216 -> 407024 bytes,
    # issue 37). What it gives up is keeping the read-only data non-executable, a hardening
    # step against code-reuse attacks; in a non-PIE static executable at a fixed address that
    # step buys little, since every gadget's address is already known.
    # -z norelro: no GNU_RELRO segment. Only a dynamic loader makes RELRO read-only after
    # relocating (musl's ldso/dynlink.c); a static musl executable has none, and
    # `strace -e trace=mprotect kiln-firstboot --version` shows no mprotect of it at all. What
    # the segment did cost: the linker starts the read-write segment so that RELRO ends on a
    # page boundary, so the file grew in whole 4 KiB steps (issue 37: 12 bytes of room left
    # before the next one, at 407024 bytes). -z common-page-size=64: with RELRO gone GNU ld
    # still padded the file to a page to spare one page of memory; now the read-write data
    # follows the code in the file (docs/building.md, item 8).
    # Size, not speed, for the code LLVM emits (docs/building.md, item 10): no inlining beyond
    # what opt-level z forces (-inline-threshold=0), and the machine outliner, which replaces
    # instruction sequences repeated across functions by calls to one copy (what clang's -Oz
    # does by default on arm64). amd64 409,504 -> 400,576 bytes (issue 37: room for the
    # containerd configuration restart and warm pools). kiln-firstboot spends its time
    # waiting on systemd, the network and kubelet, not in its own code.
    codegen="-C llvm-args=-inline-threshold=0 -C llvm-args=-enable-machine-outliner=always"
    RUSTC="$debian_rustc" RUSTDOC="${debian_rustc%rustc}rustdoc" RUSTC_BOOTSTRAP=1 \
      CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_LINKER="$cc" \
      CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER="$cc" \
      RUSTFLAGS="$panic $codegen -C target-feature=+crt-static -C relocation-model=static -C link-self-contained=no -C link-arg=-Wl,-z,noseparate-code -C link-arg=-Wl,-z,norelro -C link-arg=-Wl,-z,common-page-size=64 -L native=$link_dir" \
      "$debian_cargo" build --locked -p kiln-firstboot --bin kiln-firstboot --profile firstboot \
      --target "$target" --target-dir "$target_dir" \
      -Z build-std=std,panic_abort -Z build-std-features=optimize_for_size
    ;;
  *) die "unknown KILN_FIRSTBOOT_VARIANT '$variant' (expected musl, musl-abort or glibc)" ;;
esac

bin="$target_dir/$target/firstboot/kiln-firstboot"
# A static binary has no program interpreter; one that slipped through would not start on a
# node whose libc differs.
if readelf -lW "$bin" | grep -q 'INTERP'; then
  die "$bin is dynamically linked (it has a PT_INTERP program header); expected a static executable"
fi
# And it has to start: a binary that links but cannot run (a wrong C runtime, a bad unwinder
# shim) fails here rather than on a node.
"${run[@]}" "$bin" --version | grep -q '^kiln-firstboot ' ||
  die "$bin --version did not print 'kiln-firstboot <version>'${run:+ (run under ${run[*]})}"
mkdir -p "$(dirname "$out")"
# A name of its own: qemu-test (in the background) and size-check may both run this.
cp "$bin" "$out.tmp.$$"
if cmp -s "$out.tmp.$$" "$out"; then rm "$out.tmp.$$"; else mv "$out.tmp.$$" "$out"; fi
echo "build-firstboot: $out ($variant, $arch, $(stat -c %s "$out") bytes)"
