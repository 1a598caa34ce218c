#!/usr/bin/env bash
# Packages from a newer Debian suite (trixie, sid) on a bookworm host, without touching the
# host's apt: a private apt configuration (its own sources list, lists, status and cache
# under ~/.cache/kiln/apt/SUITE) for amd64 and arm64, verified against the archive's signed
# Release files with the host's debian-archive-keyring. Nothing is installed: callers unpack
# what they get with `dpkg-deb -x`.
#
#   scripts/debian-suite.sh SUITE version PKG[:ARCH]         the suite's candidate version
#   scripts/debian-suite.sh SUITE download DEST PKG[:ARCH]=VERSION...
#                                                            the .debs, into DEST
#
# The lists are fetched when missing or older than a day (KILN_APT_MAX_AGE seconds), once
# at a time (a lock beside them). Needs apt-get and the archive (deb.debian.org, or
# KILN_DEBIAN_MIRROR).
set -euo pipefail

die() { echo "debian-suite: $*" >&2; exit 1; }
suite=${1:?usage: scripts/debian-suite.sh SUITE version PKG | download DEST PKG=VER...}
cmd=${2:?usage: scripts/debian-suite.sh SUITE version PKG | download DEST PKG=VER...}
shift 2
case $suite in
  trixie | forky | sid) ;;
  *) die "unknown suite '$suite' (expected trixie, forky or sid)" ;;
esac
mirror=${KILN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || die "$keyring is missing (package debian-archive-keyring)"

dir=${KILN_APT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/apt}/$suite
mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
printf 'deb [arch=amd64,arm64 signed-by=%s] %s %s main\n' "$keyring" "$mirror" "$suite" >"$dir/sources.list"
[ -e "$dir/status" ] || : >"$dir/status"
opts=(
  -o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::Etc::Preferences=/dev/null" -o Dir::Etc::PreferencesParts=/dev/null
  -o "Dir::State::Lists=$dir/lists" -o "Dir::State::Status=$dir/status" -o "Dir::Cache=$dir/cache"
  -o APT::Architecture=amd64 -o APT::Architectures::=amd64 -o APT::Architectures::=arm64
  -o APT::Sandbox::User=root -o Acquire::Retries=3
)

exec 9>"$dir/.lock"
flock 9
max_age=${KILN_APT_MAX_AGE:-86400}
release=$(find "$dir/lists" -maxdepth 1 -name '*_InRelease' -newermt "-$max_age seconds" 2>/dev/null | head -n 1)
if [ -z "$release" ]; then
  apt-get "${opts[@]}" -qq update >"$dir/update.log" 2>&1 ||
    { cat "$dir/update.log" >&2; die "apt-get update of $suite from $mirror failed"; }
fi
flock -u 9

case $cmd in
  version)
    pkg=${1:?usage: scripts/debian-suite.sh SUITE version PKG[:ARCH]}
    v=$(apt-cache "${opts[@]}" policy "$pkg" | awk '/Candidate:/ {print $2; exit}')
    [ -n "$v" ] && [ "$v" != "(none)" ] || die "$suite has no package $pkg"
    echo "$v"
    ;;
  download)
    dest=${1:?usage: scripts/debian-suite.sh SUITE download DEST PKG=VERSION...}
    shift
    [ "$#" -gt 0 ] || die "download: no package named"
    mkdir -p "$dest"
    (cd "$dest" && apt-get "${opts[@]}" -qq download "$@" 2>"$dir/download.err") ||
      { cat "$dir/download.err" >&2; die "apt-get download $* from $suite failed"; }
    ;;
  *) die "unknown command '$cmd' (expected version or download)" ;;
esac
