#!/usr/bin/env bash
# Makes the offline fixture mirror for the boot tests, the test suites (`make unit` names it
# in KILN_FIXTURE_MIRROR) and the demo (scripts/fixture-mirror.sh) when it is missing or older
# than its inputs: the generators, images/ubuntu.toml (its Kubernetes version), the stand-ins'
# sources and kiln's supply code (it signs the lock and fills the mirror). A stamp file in the
# mirror records the hash of those inputs.
#
#   qemu-tests/assets/fixture.sh [OUTDIR]      (default target/fixture-mirror)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/fixture-mirror}
stamp=$( { sha256sum scripts/fixture-mirror.sh scripts/build-standins.sh images/ubuntu.toml
           find tools/standin-kubelet tools/standin-kubeadm builder/src/supply -type f -not -path '*/target/*' |
             sort | xargs sha256sum; } |
         sha256sum | cut -c1-16)
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if [ -d "$out/mirror" ] && [ "$(cat "$out/.kiln-inputs" 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
echo "fixture: (re)making $out (inputs $stamp)" >&2
KILN_BIN=${KILN_BIN:-target/debug/kiln} scripts/fixture-mirror.sh "$out" >&2
echo "$stamp" >"$out/.kiln-inputs"
