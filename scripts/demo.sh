#!/usr/bin/env bash
# `make demo`: kiln's main job, offline, end to end. Builds kiln and the static
# kiln-firstboot, makes the offline fixture mirror (Debian's real containerd/runc/CNI in
# upstream layouts + the stand-in kubelet, signed lock), bakes images/ubuntu.toml from it,
# installs the layer into a debootstrapped Debian base, boots that under QEMU with an AWS
# IMDSv2 stand-in, and prints the boot timeline and the node's final status.
# Nothing is canned: every line comes from the run. docs/boot-tests.md explains the parts.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says what it does, and the one before it how long it took.
t_step=
t_all=$SECONDS
step() {
  if [ -n "$t_step" ]; then printf '   (%d s)\n' $((SECONDS - t_step)); fi
  t_step=$SECONDS
  if [ $# -gt 0 ]; then printf '\n== %s\n' "$*"; fi
}
trap 'step; printf "\n== demo: %d s in all\n" $((SECONDS - t_all))' EXIT

step "dependencies (QEMU from bookworm-backports, debootstrap, mtools …)"
scripts/deps.sh qemu

step "build kiln, the static kiln-firstboot (amd64, arm64) and the boot harness"
if [ ! -x target/debug/kiln ]; then
  echo "   first build: cargo compiles about 300 crates, 5-8 minutes on 2 cores (later runs: seconds)"
fi
make --no-print-directory firstboot
cargo build --locked -p kiln -p kiln-qemu-tests -p cri-smoke --bins
ls -l target/firstboot/kiln-firstboot | awk '{print "  kiln-firstboot: " $5 " bytes, static"}'

step "guest assets (cached in ${KILN_QEMU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/qemu})"
assets=$(qemu-tests/assets/assets.sh all)
set -a; eval "$assets"; set +a
echo "$assets" | sed 's/^/  /'

fixture=${KILN_FIXTURE_MIRROR:-target/fixture-mirror}
step "offline fixture mirror ($fixture)"
qemu-tests/assets/fixture.sh "$fixture"
target/debug/kiln mirror verify "$fixture/mirror" --trusted-key "$fixture/keys/fixture.pub"
export KILN_FIXTURE_MIRROR=$(cd "$fixture" && pwd)

step "bake, install, boot"
target/debug/kiln-boot-demo
