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
    # Debian's compiler, not rustup's shims that come first on PATH: rustup's toolchains here
    # have neither a musl std nor rust-src to build one.
    debian_rustc=${KILN_DEBIAN_RUSTC:-/usr/bin/rustc}
    debian_cargo=${KILN_DEBIAN_CARGO:-/usr/bin/cargo}
    [ -x "$debian_rustc" ] && [ -x "$debian_cargo" ] ||
      die "$debian_rustc or $debian_cargo is missing: run \`make deps\` (installs rustc-web, cargo-web, rust-web-src)"
    sysroot=$("$debian_rustc" --print sysroot)
    [ -f "$sysroot/lib/rustlib/src/rust/library/std/Cargo.toml" ] ||
      die "no std sources under $sysroot/lib/rustlib/src/rust/library: run \`make deps\` (installs rust-web-src)"
    # The C toolchain for the target: Debian's musl-gcc wrapper on amd64; on arm64 the same
    # wrapper idea, written here (Debian ships the specs with musl-dev:arm64, not a wrapper).
    link_dir="$root/target/firstboot/link/$arch"
    mkdir -p "$link_dir"
    if [ "$arch" = amd64 ]; then
      target=x86_64-unknown-linux-musl
      command -v musl-gcc >/dev/null || die "musl-gcc is missing: run \`make deps\` (installs musl-tools)"
      cc=$(command -v musl-gcc)
      gcc=gcc
    else
      target=aarch64-unknown-linux-musl
      specs=/usr/lib/aarch64-linux-musl/musl-gcc.specs
      command -v aarch64-linux-gnu-gcc >/dev/null ||
        die "aarch64-linux-gnu-gcc is missing: run \`make deps\` (installs gcc-aarch64-linux-gnu)"
      [ -f "$specs" ] || die "$specs is missing: run \`make deps\` (installs musl-dev:arm64)"
      cc=$link_dir/musl-gcc
      printf '#!/bin/sh\nexec aarch64-linux-gnu-gcc "$@" -specs %s\n' "$specs" >"$cc.tmp.$$"
      chmod +x "$cc.tmp.$$"
      mv "$cc.tmp.$$" "$cc"
      gcc=aarch64-linux-gnu-gcc
    fi

    # musl's std links `-lunwind`. Debian has no LLVM libunwind for musl, so the archive of
    # that name is gcc's own unwinder (libgcc_eh.a) plus scripts/musl/dl_find_object.c, the one
    # glibc function it needs that musl lacks. Nothing of it is linked unless something calls
    # _Unwind_* (a panic=abort binary does, to print a backtrace).
    libgcc_eh=$("$gcc" -print-file-name=libgcc_eh.a)
    [ -f "$libgcc_eh" ] || die "$gcc has no libgcc_eh.a (looked at '$libgcc_eh'): run \`make deps\`"
    cp "$libgcc_eh" "$link_dir/libunwind.a.tmp.$$"
    "$cc" -O2 -c scripts/musl/dl_find_object.c -o "$link_dir/dl_find_object.$$.o"
    ar rsD "$link_dir/libunwind.a.tmp.$$" "$link_dir/dl_find_object.$$.o"
    rm -f "$link_dir/dl_find_object.$$.o"
    # Replaced only when it changed, so cargo does not relink for nothing.
    if cmp -s "$link_dir/libunwind.a.tmp.$$" "$link_dir/libunwind.a"; then
      rm "$link_dir/libunwind.a.tmp.$$"
    else
      mv "$link_dir/libunwind.a.tmp.$$" "$link_dir/libunwind.a"
    fi

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
