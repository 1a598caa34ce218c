#!/usr/bin/env bash
# Builds, once, the container images the boot tests import into the guest's containerd (no
# registry is reachable there), as one OCI image-layout archive that `ctr images import`
# reads (docs/boot-tests.md, "A real pod"):
#
#   SANDBOX_REF  a stand-in for the pause image: pause.c beside this script, static; named
#                as kiln's containerd config names its sandbox image (images/*.toml), so
#                containerd finds it without a pull
#   TEST_REF     busybox-static as /bin/busybox and /bin/sh, the test container's image; its
#                command prints `kiln-cri-smoke:container-ran` and its own cgroup
#
#   cri-images.sh SANDBOX_REF TEST_REF [ARCH]    prints the archive's path
#
# ARCH is amd64 (default) or arm64: for arm64, pause.c is linked static by Debian's
# aarch64-linux-gnu-gcc (with musl-dev:arm64's specs) and busybox is busybox-static:arm64,
# fetched with apt-get download (never installed on the host); the images say arm64.
#
# Cached under $KILN_QEMU_CACHE (as assets.sh) by a hash of this script, pause.c, the names
# and the busybox/gcc versions. Layers are uncompressed tars with fixed owners and times,
# so the same inputs give the same digests.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${KILN_QEMU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/qemu}
sandbox_ref=${1:?usage: cri-images.sh SANDBOX_REF TEST_REF}
test_ref=${2:?usage: cri-images.sh SANDBOX_REF TEST_REF [ARCH]}
arch=${3:-amd64}
die() { echo "cri-images: error: $*" >&2; exit 1; }

case "$arch" in
  amd64)
    command -v gcc >/dev/null || die "gcc is missing (scripts/deps.sh installs build-essential)"
    [ -x /bin/busybox ] || die "/bin/busybox is missing (scripts/deps.sh qemu installs busybox-static)"
    versions="$(dpkg-query -W -f='${Version}' busybox-static musl-tools 2>/dev/null || echo none) $(gcc -dumpfullversion)"
    keyed="$sandbox_ref $test_ref"
    ;;
  arm64)
    musl_specs=/usr/lib/aarch64-linux-musl/musl-gcc.specs
    command -v aarch64-linux-gnu-gcc >/dev/null || die "aarch64-linux-gnu-gcc is missing (make deps)"
    [ -f "$musl_specs" ] || die "$musl_specs is missing (make deps installs musl-dev:arm64)"
    bb_arm64=$(apt-cache policy busybox-static:arm64 | awk '/Candidate:/ {print $2; exit}')
    [ -n "$bb_arm64" ] && [ "$bb_arm64" != "(none)" ] || die "apt-cache has no busybox-static:arm64 (is arm64 added to dpkg? make deps)"
    versions="busybox-static:arm64 $bb_arm64 $(dpkg-query -W -f='${Version}' musl-dev:arm64) $(aarch64-linux-gnu-gcc -dumpfullversion)"
    keyed="$sandbox_ref $test_ref arm64"
    ;;
  *) die "unknown ARCH '$arch' (expected amd64 or arm64)" ;;
esac
key=$( { echo "$keyed $versions"; cat "${BASH_SOURCE[0]}" "$here/pause.c"; } |
       sha256sum | cut -c1-12)
dir=$cache/cri-images/$key
if [ -f "$dir/images.tar" ]; then echo "$dir/images.tar"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/.cri-images.lock"
flock 9
if [ -f "$dir/images.tar" ]; then echo "$dir/images.tar"; exit 0; fi
tmp=$dir.tmp.$$
rm -rf "$tmp"; mkdir -p "$tmp/oci/blobs/sha256"
trap 'rm -rf "$tmp"' EXIT
blobs=$tmp/oci/blobs/sha256

# FILE -> its sha256, stored as a blob.
blob() {
  local d
  d=$(sha256sum "$1" | cut -d' ' -f1)
  cp "$1" "$blobs/$d"
  echo "$d"
}
size() { stat -c %s "$1"; }
layer_tar() { # DIR OUT
  tar -C "$1" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -cf "$2" .
}

# One image: ROOTFS_DIR REF CONFIG_JSON_MEMBERS -> a manifest descriptor line for index.json.
image() {
  local rootfs=$1 ref=$2 entry=$3 layer ld cfg cd man md
  layer=$tmp/layer.tar
  layer_tar "$rootfs" "$layer"
  ld=$(blob "$layer")
  cfg=$tmp/config.json
  printf '{"architecture":"%s","os":"linux","config":{%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"qemu-tests/assets/cri-images.sh (kiln boot tests)"}]}' \
    "$arch" "$entry" "$ld" >"$cfg"
  cd=$(blob "$cfg")
  man=$tmp/manifest.json
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$cd" "$(size "$cfg")" "$ld" "$(size "$layer")" >"$man"
  md=$(blob "$man")
  printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}' \
    "$md" "$(size "$man")" "$arch" "$ref" "${ref##*:}"
  rm -f "$layer" "$cfg" "$man"
}

mkdir -p "$tmp/pause" "$tmp/busybox/bin"
if [ "$arch" = arm64 ]; then
  aarch64-linux-gnu-gcc -specs "$musl_specs" -static -Os -s -o "$tmp/pause/pause" "$here/pause.c"
  mkdir -p "$tmp/dl"
  (cd "$tmp/dl" && apt-get -o APT::Sandbox::User=root download -qq "busybox-static:arm64=$bb_arm64") ||
    die "apt-get download busybox-static:arm64=$bb_arm64 failed"
  dpkg-deb -x "$tmp"/dl/*.deb "$tmp/dl/x"
  cp "$tmp/dl/x/bin/busybox" "$tmp/busybox/bin/busybox"
  rm -rf "$tmp/dl"
  for f in "$tmp/pause/pause" "$tmp/busybox/bin/busybox"; do
    file -b "$f" | grep -q 'ARM aarch64' || die "$f is not an aarch64 binary: $(file -b "$f")"
  done
else
  # musl when there (scripts/deps.sh installs musl-tools): a 10 KiB pause instead of glibc's 700.
  cc=gcc
  command -v musl-gcc >/dev/null && cc=musl-gcc
  "$cc" -static -Os -s -o "$tmp/pause/pause" "$here/pause.c"
  cp /bin/busybox "$tmp/busybox/bin/busybox"
fi
ln -s busybox "$tmp/busybox/bin/sh"
chmod 0755 "$tmp/pause/pause" "$tmp/busybox/bin/busybox"
p=$(image "$tmp/pause" "$sandbox_ref" '"Entrypoint":["/pause"]')
# The test container prints a marker and its cgroup, so the boot test sees where the
# runtime put it (a kubepods slice under the systemd driver).
b=$(image "$tmp/busybox" "$test_ref" '"Entrypoint":["/bin/sh","-c"],"Cmd":["echo kiln-cri-smoke:container-ran; cat /proc/self/cgroup"]')
printf '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci/oci-layout"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s,%s]}' "$p" "$b" >"$tmp/oci/index.json"
layer_tar "$tmp/oci" "$tmp/images.tar"
rm -rf "$tmp/oci" "$tmp/pause" "$tmp/busybox"
mkdir -p "$(dirname "$dir")"; rm -rf "$dir"; mv "$tmp" "$dir"
trap - EXIT
echo "$dir/images.tar"
