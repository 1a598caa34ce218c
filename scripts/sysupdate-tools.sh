#!/usr/bin/env bash
# Unpacks Debian's systemd-sysupdate and systemd-pull (systemd 254 from bookworm-backports;
# Debian 12's own systemd 252 is built without sysupdate) into DEST, without installing them:
# builder/tests/bake_sysupdate_real.rs runs them from there against a scratch root.
#
#   scripts/sysupdate-tools.sh DEST      (idempotent; prints DEST when ready)
set -euo pipefail

dest=${1:?usage: scripts/sysupdate-tools.sh DEST}
version=254.26-1~bpo12+1
stamp="$dest/.version"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ] && [ -x "$dest/lib/systemd/systemd-sysupdate" ]; then
  echo "$dest"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then SUDO=(); else SUDO=(sudo -E); fi
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
if [ "$codename" != bookworm ]; then
  echo "sysupdate-tools: this script unpacks bookworm-backports packages; found '$codename'" >&2
  exit 1
fi
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "sysupdate-tools: adding bookworm-backports" >&2
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' |
    "${SUDO[@]}" tee /etc/apt/sources.list.d/kiln-backports.sources >/dev/null
  "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-sysupdate-XXXXXX")
trap 'rm -rf "$work"' EXIT
(
  cd "$work"
  # apt verifies the packages against the archive's signed index before handing them over.
  apt-get download -qq "systemd=$version" "libsystemd-shared=$version" "systemd-container=$version" 2>/dev/null ||
    { "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq &&
      apt-get download -qq "systemd=$version" "libsystemd-shared=$version" "systemd-container=$version"; }
)
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"
for deb in "$work"/*.deb; do
  dpkg-deb -x "$deb" "$dest.tmp"
done
echo "$version" >"$dest.tmp/.version"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "$dest"
