#!/usr/bin/env bash
# Unpacks the tools that check kiln's signatures and provenance from outside kiln (issue 39)
# into DEST, without installing anything:
#   DEST/cosign   Debian trixie's cosign (bookworm has none): verify-blob, verify,
#                 verify-attestation, offline (--insecure-ignore-tlog; the key is kiln's)
#   DEST/oras     Debian trixie's oras: `oras discover` lists what refers to a pushed layer
#   DEST/venv     a venv (Debian's python3) with in-toto-attestation from PyPI: the in-toto
#                 project's own Statement v1 and SLSA Provenance v1 schemas, for
#                 testkit/in_toto_check.py
# The .debs come through scripts/debian-suite.sh (the archive's signed metadata, a private
# apt state); the wheels through pip with pinned versions.
#
#   scripts/attest-tools.sh DEST      (idempotent; prints DEST when ready)
set -euo pipefail

dest=${1:?usage: scripts/attest-tools.sh DEST}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cosign=${KILN_COSIGN_VERSION:-2.5.0-2+b5}
oras=${KILN_ORAS_VERSION:-1.2.0-1+b9}
wheels="in-toto-attestation==0.9.3 protobuf==7.36.2"
version="cosign=$cosign oras=$oras $wheels"
stamp="$dest/.version"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ] && [ -x "$dest/cosign" ] && [ -x "$dest/oras" ] && [ -x "$dest/venv/bin/python" ]; then
  echo "$dest"
  exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-attest-tools-XXXXXX")
trap 'rm -rf "$work"' EXIT
"$root/scripts/debian-suite.sh" trixie download "$work" "cosign:amd64=$cosign" "oras:amd64=$oras" >&2
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/x"; done
for t in cosign oras; do
  "$work/x/usr/bin/$t" version >/dev/null 2>&1 ||
    { echo "attest-tools.sh: the unpacked $t does not run" >&2; exit 1; }
done
mkdir -p "$dest"
rm -rf "$dest/venv"
# A venv is not relocatable: it is made where it stays (scripts/deps.sh installs python3-venv).
/usr/bin/python3 -m venv "$dest/venv"
# shellcheck disable=SC2086 # the wheel list is words
"$dest/venv/bin/pip" install --quiet --disable-pip-version-check $wheels >&2 ||
  { rm -rf "$dest/venv"; echo "attest-tools.sh: pip could not fetch $wheels" >&2; exit 1; }
for t in cosign oras; do
  install -m 0755 "$work/x/usr/bin/$t" "$dest/$t.tmp"
  mv "$dest/$t.tmp" "$dest/$t"
done
echo "$version" >"$stamp"
echo "$dest"
