# Sourced by scripts/build-windows.sh and scripts/test-windows.sh: Debian's Rust with std
# sources (rustup's toolchains here have no Windows std and no rust-src), the mingw-w64
# linker, and for tests a private Wine prefix. docs/windows.md explains each setting.
# shellcheck shell=bash

kiln_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
win_target=x86_64-pc-windows-gnu
debian_rustc=${KILN_DEBIAN_RUSTC:-/usr/bin/rustc}
debian_cargo=${KILN_DEBIAN_CARGO:-/usr/bin/cargo}

win_die() { echo "$(basename "$0"): $*" >&2; exit 1; }

win_check_tools() {
  [ -x "$debian_rustc" ] && [ -x "$debian_cargo" ] ||
    win_die "$debian_rustc or $debian_cargo is missing: run \`make deps\` (installs rustc-web, cargo-web, rust-web-src)"
  [ -f "$("$debian_rustc" --print sysroot)/lib/rustlib/src/rust/library/std/Cargo.toml" ] ||
    win_die "Debian's rustc has no std sources: run \`make deps\` (installs rust-web-src)"
  command -v x86_64-w64-mingw32-gcc >/dev/null ||
    win_die "x86_64-w64-mingw32-gcc is missing: run \`make deps\` (installs gcc-mingw-w64-x86-64)"
}

# Debian's compiler, explicitly: rustup's shims come first on PATH. RUSTC_BOOTSTRAP=1 lets
# this stable compiler accept -Z build-std, which compiles std for Windows from rust-web-src.
export RUSTC="$debian_rustc" RUSTDOC="${debian_rustc%rustc}rustdoc" RUSTC_BOOTSTRAP=1
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
