#!/usr/bin/env bash
# Builds the stand-in binaries of the fixture mirror for every platform the real lock covers,
# from this workspace (upstream kubelet, crictl and the Windows releases cannot be downloaded
# here; docs/mirror.md "The fixture mirror" says what each stand-in is):
#
#   scripts/build-standins.sh OUTDIR
#
# OUTDIR/linux-amd64/{kubelet,crictl}      tools/standin-kubelet, rustup's stable toolchain (release),
#                                          or the programs in $KILN_STANDINS_AMD64 when it names a
#                                          directory holding them (`make test` names target/debug,
#                                          which its build-tests stage has just built)
# OUTDIR/linux-amd64/kubeadm               tools/standin-kubeadm (the kubeadm join double), the same
# OUTDIR/linux-arm64/{kubelet,crictl,kubeadm} the same sources for aarch64-unknown-linux-gnu,
#                                          built by scripts/cross-arm64.sh (Debian's rustc and its
#                                          prebuilt arm64 std, Debian's aarch64-linux-gnu-gcc)
# OUTDIR/windows-amd64/{kubelet,crictl}.exe the same source for x86_64-pc-windows-gnu (mingw,
#                                          as scripts/build-windows.sh builds kiln-firstboot.exe)
# OUTDIR/windows-amd64/tool.exe            a tiny C program (mingw) that names itself and says
#                                          it is a stand-in: containerd.exe, ctr.exe, the
#                                          runhcs shim and the Windows CNI plugins are copies
#
# Needs (make deps): rustc-web, cargo-web, rust-web-src, gcc-mingw-w64-x86-64, and what
# scripts/cross-arm64.sh needs. Outputs are replaced only when their bytes
# changed, so a rebuild that changed nothing leaves the files (and their mtimes) alone.
set -euo pipefail

out=${1:?usage: scripts/build-standins.sh OUTDIR}
source "$(dirname "${BASH_SOURCE[0]}")/windows-env.sh"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
cd "$kiln_root"
die() { echo "build-standins: $*" >&2; exit 1; }

win_check_tools
command -v aarch64-linux-gnu-gcc >/dev/null ||
  die "aarch64-linux-gnu-gcc is missing: run \`make deps\` (installs gcc-aarch64-linux-gnu)"

put() { # SRC DEST: copy when different
  mkdir -p "$(dirname "$2")"
  if ! cmp -s "$1" "$2"; then
    cp "$1" "$2.tmp.$$"
    mv -f "$2.tmp.$$" "$2"
  fi
}

# linux/amd64: the workspace's own toolchain (the stand-in kubelet the boot tests run).
if [ -n "${KILN_STANDINS_AMD64:-}" ]; then
  for b in kubelet crictl kubeadm credential-provider; do
    [ -x "$KILN_STANDINS_AMD64/$b" ] || die "KILN_STANDINS_AMD64=$KILN_STANDINS_AMD64 holds no $b program"
  done
  amd64=$KILN_STANDINS_AMD64
else
  (unset RUSTC RUSTDOC RUSTC_BOOTSTRAP && cargo build -q --locked --release -p standin-kubelet -p standin-kubeadm)
  amd64=target/release
fi
for b in kubelet crictl kubeadm credential-provider; do put "$amd64/$b" "$out/linux-amd64/$b"; done

# linux/arm64: one cross build with the arm64 cri-smoke (scripts/cross-arm64.sh).
arm64=$(scripts/cross-arm64.sh)
for b in kubelet crictl kubeadm credential-provider; do put "$arm64/$b" "$out/linux-arm64/$b"; done

# windows/amd64: Debian's compiler with std rebuilt for the target, the firstboot profile
# (small, panic=abort) and the same build-std flags as kiln-firstboot, so the Windows std build
# is shared with scripts/build-windows.sh.
cross() { # TARGET TARGET_DIR PACKAGE...
  local target=$1 dir=$2 pkgs=() p
  shift 2
  for p in "$@"; do pkgs+=(-p "$p"); done
  "$debian_cargo" build -q --locked "${pkgs[@]}" --profile firstboot \
    --target "$target" --target-dir "$dir" \
    -Z build-std=std,panic_abort -Z build-std-features=optimize_for_size
}
# Windows: the stand-in kubelet only (the kubeadm double is unix-only; kiln runs no kubeadm
# on Windows, and the fixture mirror ships the stand-in kubelet as kubeadm.exe).
cross "$win_target" target/firstboot/windows standin-kubelet
for b in kubelet crictl; do
  put "target/firstboot/windows/$win_target/firstboot/$b.exe" "$out/windows-amd64/$b.exe"
done

# Every other Windows executable of the matrix: one honest PE that says what it is.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/tool.c" <<'C'
/* A stand-in for a Windows release binary in kiln's fixture mirror (scripts/build-standins.sh).
   It is not the upstream program: it prints its own name and says so. */
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
  const char *name = argv[0], *p;
  for (p = argv[0]; *p; p++)
    if (*p == '\\' || *p == '/') name = p + 1;
  if (argc > 1 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-v") == 0)) {
    printf("%s (kiln fixture stand-in, not upstream)\n", name);
    return 0;
  }
  fprintf(stderr, "%s: kiln fixture stand-in built by scripts/build-standins.sh; it does nothing\n", name);
  return 2;
}
C
# No timestamps in the PE header (-Wl,--no-insert-timestamp): same source, same bytes.
x86_64-w64-mingw32-gcc -Os -s -Wl,--no-insert-timestamp -o "$tmp/tool.exe" "$tmp/tool.c"
put "$tmp/tool.exe" "$out/windows-amd64/tool.exe"
echo "build-standins: $out"
