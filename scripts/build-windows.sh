#!/usr/bin/env bash
# Builds kiln-firstboot.exe for x86_64-pc-windows-gnu (Windows 10 / Server 2016 and later)
# with the `firstboot` profile and copies it to $1. Same source as the Linux binary; std is
# rebuilt with optimize_for_size. panic=abort keeps panic messages (the budget, 600 KiB,
# leaves room for them).
#
#   scripts/build-windows.sh [OUT]     (default target/firstboot/kiln-firstboot.exe)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/windows-env.sh"
out=${1:-target/firstboot/kiln-firstboot.exe}
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
cd "$kiln_root"
win_check_tools

target_dir=target/firstboot/windows
"$debian_cargo" build --locked -p kiln-firstboot --bin kiln-firstboot --profile firstboot \
  --target "$win_target" --target-dir "$target_dir" \
  -Z build-std=std,panic_abort -Z build-std-features=optimize_for_size

bin="$target_dir/$win_target/firstboot/kiln-firstboot.exe"
# A PE32+ console program for x86-64; the builder's PE gate checks the same in Rust.
file -b "$bin" | grep -q '^PE32+ executable (console) x86-64' ||
  win_die "$bin is not a PE32+ x86-64 console executable: $(file -b "$bin")"
mkdir -p "$(dirname "$out")"
# A name of its own: qemu-test (in the background) and size-check may both run this.
cp "$bin" "$out.tmp.$$"
if cmp -s "$out.tmp.$$" "$out"; then rm "$out.tmp.$$"; else mv "$out.tmp.$$" "$out"; fi
echo "build-windows: $out ($(stat -c %s "$out") bytes)"
