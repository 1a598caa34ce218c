#!/usr/bin/env bash
# Unpacks Debian trixie's systemd-repart (systemd 257) with trixie's own libc and the
# libraries it loads into DEST, without installing anything, and writes DEST/systemd-repart,
# a wrapper that starts it through trixie's dynamic loader. The bake::ddi tests compare
# kiln's signed sysext DDI with what this repart writes from the same squashfs, seed and key.
#
#   scripts/repart-257.sh DEST      (idempotent; prints DEST when ready)
set -euo pipefail

dest=${1:?usage: scripts/repart-257.sh DEST}
here=$(cd "$(dirname "$0")" && pwd)
# systemd-repart's NEEDED libraries and the ones libsystemd-shared dlopens for a signed,
# verity-protected image (libcryptsetup and what it needs).
pkgs=(systemd-repart libsystemd-shared libc6 libgcc-s1 libcryptsetup12 libdevmapper1.02.1
  libargon2-1 libjson-c5 libfdisk1 libblkid1 libmount1 libssl3t64 libseccomp2 libacl1 libcap2
  libcrypt1 libselinux1 libpcre2-8-0 libudev1 liblz4-1 libzstd1 liblzma5 zlib1g libaudit1
  libcap-ng0 libkmod2 libapparmor1 libgcrypt20 libgpg-error0 libpam0g libxxhash0)

want=()
for p in "${pkgs[@]}"; do
  want+=("$p=$("$here/debian-suite.sh" trixie version "$p")")
done
stamp="$dest/.versions"
if [ -x "$dest/systemd-repart" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${want[*]}" ]; then
  echo "$dest"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-repart-XXXXXX")
trap 'rm -rf "$work"' EXIT
# apt checks each .deb against the suite's signed index (scripts/debian-suite.sh).
"$here/debian-suite.sh" trixie download "$work/debs" "${want[@]}" >/dev/null
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp/root"
for deb in "$work"/debs/*.deb; do
  dpkg-deb -x "$deb" "$dest.tmp/root"
done
cat >"$dest.tmp/systemd-repart" <<'EOF'
#!/bin/sh
# trixie's systemd-repart through trixie's loader and libraries (scripts/repart-257.sh).
r=$(dirname "$(readlink -f "$0")")/root
lib=$r/usr/lib/x86_64-linux-gnu
exec "$r/usr/lib64/ld-linux-x86-64.so.2" --library-path "$lib:$lib/systemd" "$r/usr/bin/systemd-repart" "$@"
EOF
chmod +x "$dest.tmp/systemd-repart"
"$dest.tmp/systemd-repart" --version >/dev/null
echo "${want[*]}" >"$dest.tmp/.versions"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "$dest"
