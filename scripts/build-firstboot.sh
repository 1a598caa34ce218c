#!/usr/bin/env bash
# Builds kiln-firstboot as a static, size-optimised Linux binary and copies it to $1.
#
# Today: the `firstboot` profile (opt-level z, fat LTO, one codegen unit, panic=abort, strip)
# with glibc's static C runtime (`-C target-feature=+crt-static` on x86_64-unknown-linux-gnu).
# --target keeps RUSTFLAGS away from build scripts and proc-macros.
set -euo pipefail
out=${1:-target/firstboot/kiln-firstboot}
target=x86_64-unknown-linux-gnu
RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
  cargo build --locked -p kiln-firstboot --bin kiln-firstboot --profile firstboot --target "$target"
mkdir -p "$(dirname "$out")"
cp "target/$target/firstboot/kiln-firstboot" "$out.tmp"
mv "$out.tmp" "$out"
