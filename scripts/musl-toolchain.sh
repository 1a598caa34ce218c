# shellcheck shell=bash
# Sourced, not run: the static musl toolchain that scripts/build-firstboot.sh (kiln-firstboot)
# and scripts/build-dist.sh (kiln's release archives) build with. docs/building.md explains
# every piece ("The static kiln-firstboot", "Release archives: make dist").
#
# The caller defines die() (prints its message and exits) and runs from the repository root.
#
#   musl_debian_rust
#       Checks Debian's compiler and its std sources; sets debian_rustc, debian_cargo.
#   musl_toolchain ARCH LINK_DIR
#       ARCH amd64 or arm64. Sets target (the Rust target triple), cc (the C compiler and
#       linker driver for it) and gcc (the gcc behind it); writes LINK_DIR/libunwind.a, and on
#       arm64 LINK_DIR/musl-gcc.

musl_debian_rust() {
  # Debian's compiler, not rustup's shims that come first on PATH: rustup's toolchains here
  # have neither a musl std nor rust-src to build one.
  debian_rustc=${KILN_DEBIAN_RUSTC:-/usr/bin/rustc}
  debian_cargo=${KILN_DEBIAN_CARGO:-/usr/bin/cargo}
  if [ ! -x "$debian_rustc" ] || [ ! -x "$debian_cargo" ]; then
    die "$debian_rustc or $debian_cargo is missing: run \`make deps\` (installs rustc-web, cargo-web, rust-web-src)"
  fi
  local sysroot
  sysroot=$("$debian_rustc" --print sysroot)
  [ -f "$sysroot/lib/rustlib/src/rust/library/std/Cargo.toml" ] ||
    die "no std sources under $sysroot/lib/rustlib/src/rust/library: run \`make deps\` (installs rust-web-src)"
}

# target, cc and gcc are for the caller.
# shellcheck disable=SC2034
musl_toolchain() {
  local arch=$1 link_dir=$2 specs libgcc_eh
  # The C toolchain for the target: Debian's musl-gcc wrapper on amd64; on arm64 the same
  # wrapper idea, written here (Debian ships the specs with musl-dev:arm64, not a wrapper).
  mkdir -p "$link_dir"
  case "$arch" in
    amd64)
      target=x86_64-unknown-linux-musl
      command -v musl-gcc >/dev/null || die "musl-gcc is missing: run \`make deps\` (installs musl-tools)"
      cc=$(command -v musl-gcc)
      gcc=gcc
      ;;
    arm64)
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
      ;;
    *) die "unknown architecture '$arch' (expected amd64 or arm64)" ;;
  esac

  # musl's std links `-lunwind`. Debian has no LLVM libunwind for musl, so the archive of
  # that name is gcc's own unwinder (libgcc_eh.a) plus scripts/musl/dl_find_object.c, the one
  # glibc function it needs that musl lacks. Nothing of it is linked unless something calls
  # _Unwind_* (a panic=abort binary does, to print a backtrace; kiln unwinds its panics).
  libgcc_eh=$("$gcc" -print-file-name=libgcc_eh.a)
  [ -f "$libgcc_eh" ] || die "$gcc has no libgcc_eh.a (looked at '$libgcc_eh'): run \`make deps\`"
  cp "$libgcc_eh" "$link_dir/libunwind.a.tmp.$$"
  # The member keeps one name (a directory of this run's own holds it): with the process id
  # in its name, as it had, the archive differed on every run and was always replaced.
  mkdir -p "$link_dir/obj.$$"
  "$cc" -O2 -c scripts/musl/dl_find_object.c -o "$link_dir/obj.$$/dl_find_object.o"
  ar rsD "$link_dir/libunwind.a.tmp.$$" "$link_dir/obj.$$/dl_find_object.o"
  rm -rf "$link_dir/obj.$$"
  # Replaced only when it changed, so cargo does not relink for nothing.
  if cmp -s "$link_dir/libunwind.a.tmp.$$" "$link_dir/libunwind.a"; then
    rm "$link_dir/libunwind.a.tmp.$$"
  else
    mv "$link_dir/libunwind.a.tmp.$$" "$link_dir/libunwind.a"
  fi
}
