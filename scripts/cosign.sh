#!/usr/bin/env bash
# Unpacks Debian's cosign (trixie: bookworm has none) into DEST without installing it, for
# builder/tests/bake_provenance.rs, which verifies kiln's signatures and provenance with the
# real tool, offline (--insecure-ignore-tlog: no Rekor, no Fulcio; the key is kiln's).
# Through scripts/debian-suite.sh: the archive's signed metadata, a private apt state.
#
#   scripts/cosign.sh DEST      (idempotent; prints DEST/cosign when ready)
set -euo pipefail

dest=${1:?usage: scripts/cosign.sh DEST}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=${KILN_COSIGN_VERSION:-2.5.0-2+b5}
stamp="$dest/.version"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ] && [ -x "$dest/cosign" ]; then
  echo "$dest/cosign"
  exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-cosign-XXXXXX")
trap 'rm -rf "$work"' EXIT
"$root/scripts/debian-suite.sh" trixie download "$work" "cosign:amd64=$version" >&2
dpkg-deb -x "$work"/cosign_*.deb "$work/x"
"$work/x/usr/bin/cosign" version >/dev/null 2>&1 ||
  { echo "cosign.sh: the unpacked cosign does not run" >&2; exit 1; }
mkdir -p "$dest"
install -m 0755 "$work/x/usr/bin/cosign" "$dest/cosign.tmp"
mv "$dest/cosign.tmp" "$dest/cosign"
echo "$version" >"$stamp"
echo "$dest/cosign"
