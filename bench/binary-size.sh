#!/usr/bin/env bash
# Binary size of kiln-firstboot: the shipped static musl build against the two other ways
# of making it static (docs/building.md), all built from the same tree in this run. The
# baseline is the plain glibc static build with rustup's prebuilt std.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
out=target/firstboot/bench
mkdir -p "$out"
for v in glibc musl-abort musl; do
  KILN_FIRSTBOOT_VARIANT=$v scripts/build-firstboot.sh "$out/kiln-firstboot-$v" >/dev/null 2>&1 ||
    { echo "binary-size: building variant $v failed; rerun: KILN_FIRSTBOOT_VARIANT=$v scripts/build-firstboot.sh" >&2; exit 1; }
done
base=$(stat -c %s "$out/kiln-firstboot-glibc")
echo "kiln-firstboot at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), profile firstboot, stripped"
printf '%-12s %12s %10s %10s\n' variant bytes KiB vs-glibc
for v in glibc musl-abort musl; do
  s=$(stat -c %s "$out/kiln-firstboot-$v")
  printf '%-12s %12d %10d %10s\n' "$v" "$s" $(( (s + 1023) / 1024 )) "$(awk -v a="$s" -v b="$base" 'BEGIN { printf "%.3f", a / b }')"
  budget=; [ "$v" = musl ] && budget="<= 409600"
  record "linux_amd64.$v.bytes" "$s" bytes ${budget:+"$budget"}
done
# The shipped arm64 build and the Windows .exe, as `make firstboot` / `make windows` make them.
KILN_FIRSTBOOT_ARCH=arm64 scripts/build-firstboot.sh "$out/kiln-firstboot-arm64" >/dev/null 2>&1 ||
  { echo "binary-size: the arm64 build failed; rerun: KILN_FIRSTBOOT_ARCH=arm64 scripts/build-firstboot.sh" >&2; exit 1; }
scripts/build-windows.sh "$out/kiln-firstboot.exe" >/dev/null 2>&1 ||
  { echo "binary-size: the Windows build failed; rerun: scripts/build-windows.sh" >&2; exit 1; }
for f in arm64:kiln-firstboot-arm64:409600 windows:kiln-firstboot.exe:614400; do
  IFS=: read -r what file budget <<<"$f"
  s=$(stat -c %s "$out/$file")
  printf '%-12s %12d %10d %10s\n' "$what" "$s" $(( (s + 1023) / 1024 )) "-"
  record "$what.shipped.bytes" "$s" bytes "<= $budget"
done
