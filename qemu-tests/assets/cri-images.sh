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
#   cri-images.sh SANDBOX_REF TEST_REF    prints the archive's path
#
# Cached under $KILN_QEMU_CACHE (as assets.sh) by a hash of this script, pause.c, the names
# and the busybox/gcc versions. Layers are uncompressed tars with fixed owners and times,
# so the same inputs give the same digests.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${KILN_QEMU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/qemu}
sandbox_ref=${1:?usage: cri-images.sh SANDBOX_REF TEST_REF}
test_ref=${2:?usage: cri-images.sh SANDBOX_REF TEST_REF}
die() { echo "cri-images: error: $*" >&2; exit 1; }

command -v gcc >/dev/null || die "gcc is missing (scripts/deps.sh installs build-essential)"
[ -x /bin/busybox ] || die "/bin/busybox is missing (scripts/deps.sh qemu installs busybox-static)"
versions="$(dpkg-query -W -f='${Version}' busybox-static musl-tools 2>/dev/null || echo none) $(gcc -dumpfullversion)"
key=$( { echo "$sandbox_ref $test_ref $versions"; cat "${BASH_SOURCE[0]}" "$here/pause.c"; } |
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
  printf '{"architecture":"amd64","os":"linux","config":{%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"qemu-tests/assets/cri-images.sh (kiln boot tests)"}]}' \
    "$entry" "$ld" >"$cfg"
  cd=$(blob "$cfg")
  man=$tmp/manifest.json
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$cd" "$(size "$cfg")" "$ld" "$(size "$layer")" >"$man"
  md=$(blob "$man")
  printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}' \
    "$md" "$(size "$man")" "$ref" "${ref##*:}"
  rm -f "$layer" "$cfg" "$man"
}

mkdir -p "$tmp/pause" "$tmp/busybox/bin"
# musl when there (scripts/deps.sh installs musl-tools): a 10 KiB pause instead of glibc's 700.
cc=gcc
command -v musl-gcc >/dev/null && cc=musl-gcc
"$cc" -static -Os -s -o "$tmp/pause/pause" "$here/pause.c"
cp /bin/busybox "$tmp/busybox/bin/busybox"
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
