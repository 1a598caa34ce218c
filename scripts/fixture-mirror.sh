#!/usr/bin/env bash
# Builds the offline fixture mirror every kiln test, demo and boot test can share:
#
#   scripts/fixture-mirror.sh OUTDIR
#
# OUTDIR/upstream/        a stand-in for the upstream download sites, in their layouts:
#                         - real Debian binaries (containerd 2.x, runc, CNI plugins from
#                           sid, amd64 and arm64 .debs) repacked in upstream's archive
#                           layouts;
#                         - stand-ins built from this workspace (scripts/build-standins.sh)
#                           where Debian has no package: kubelet/kubectl (the stand-in
#                           kubelet), kubeadm (the kubeadm join double) and crictl
#                           for linux amd64 and arm64, and every Windows amd64 executable
#                           (kubelet.exe, kubeadm.exe, kubectl.exe, crictl.exe, containerd's
#                           and the CNI plugins' .exe files) as real PE32+ programs
# OUTDIR/artifacts.lock   a fixture lock for them, signed with a test key made now; it covers
#                         every name/os/arch the real lock (images/artifacts.lock) covers
# OUTDIR/keys/            that test key pair (fixture.pub, fixture.key: a throwaway test key)
# OUTDIR/mirror/          a mirror filled by a real `kiln mirror sync` from a loopback server
#
# Use it:  kiln fetch OUTDIR/artifacts.lock --trusted-key OUTDIR/keys/fixture.pub \
#            --mirror OUTDIR/mirror --cache DIR
#
# Environment:
#   KILN_BIN      kiln binary (default: build target/debug/kiln)
#   STANDINS      a directory made by scripts/build-standins.sh (default: run it into
#                 target/standins/out; cargo rebuilds nothing when nothing changed)
#   KUBELET_BIN   overrides the linux/amd64 stand-in kubelet and kubectl (any ELF for amd64)
#   DEB_CACHE     where downloaded .debs are kept (default ${XDG_CACHE_HOME:-~/.cache}/kiln/debs)
#   KILN_FIXTURE_SUITE  the Debian suite of containerd, runc and the CNI plugins (default sid)
#
# Needs: apt-get (Debian archive access), dpkg-deb, curl, tar, gzip, sha256sum, minisign,
# python3 (the loopback server), and what scripts/build-standins.sh needs. The .debs are
# downloaded once and reused.
set -euo pipefail

out=${1:?usage: scripts/fixture-mirror.sh OUTDIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
deb_cache=${DEB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/debs}
mkdir -p "$deb_cache"

if [ -z "${KILN_BIN:-}" ]; then
  (cd "$root" && cargo build -q -p kiln)
  KILN_BIN=$root/target/debug/kiln
fi
if [ -z "${STANDINS:-}" ]; then
  STANDINS=$root/target/standins/out
  "$root/scripts/build-standins.sh" "$STANDINS" >/dev/null
fi
KUBELET_BIN=${KUBELET_BIN:-$STANDINS/linux-amd64/kubelet}

pkgs=(containerd runc containernetworking-plugins)
# The suite they come from: the newest, whose containerd 2.x, runc 1.3 and CNI plugins 1.9
# are what kiln's lock ships (images/artifacts.lock); bookworm's containerd 1.6 is not.
# sid's runc needs glibc 2.38, so the boot tests' guests are Debian trixie.
suite=${KILN_FIXTURE_SUITE:-sid}

# amd64 and arm64 of the same version, through a private apt configuration
# (scripts/debian-suite.sh: the archive's signed metadata, nothing installed on the host).
# One directory per package version, so a newer upload never mixes with an older one.
declare -A deb
fetch_debs() {
  local p v arch d
  for p in "${pkgs[@]}"; do
    v=$("$root/scripts/debian-suite.sh" "$suite" version "$p")
    for arch in amd64 arm64; do
      d=$deb_cache/$suite/$p/$v/$arch
      if ! compgen -G "$d/*.deb" >/dev/null; then
        rm -rf "$d.tmp"
        if "$root/scripts/debian-suite.sh" "$suite" download "$d.tmp" "$p:$arch=$v"; then
          mv "$d.tmp" "$d"
        else
          rm -rf "$d.tmp"
          echo "fixture-mirror: no $arch build of $p $v in $suite; its $arch entries are skipped" >&2
          continue
        fi
      fi
      deb[$arch]+=" $(compgen -G "$d/*.deb")"
    done
  done
}
# Test suites run this script in parallel on a shared cache: one fetch at a time (a cold
# cache once failed with two runs moving the same temp file).
exec 9>"$deb_cache/.lock"
flock 9
fetch_debs
flock -u 9
exec 9>&-

work=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

up=$out/upstream
rm -rf "$up" "$out/mirror"
mkdir -p "$up"

# Reproducible archives: sorted names, fixed owner and mtime, gzip without a timestamp.
targz() { # OUT DIR NAMES...
  local dest=$1 dir=$2
  shift 2
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu \
    -C "$dir" -cf - "$@" | gzip -n -1 >"$dest"
}

declare -A ver
for arch in amd64 arm64; do
  x=$work/$arch
  mkdir -p "$x"
  for f in ${deb[$arch]:-}; do
    dpkg-deb -x "$f" "$x"
    name=$(dpkg-deb -f "$f" Package)
    v=$(dpkg-deb -f "$f" Version)
    v=${v%%[~+-]*}
    ver[$name]=$v
  done
  if [ -x "$x/usr/bin/containerd" ]; then
    mkdir -p "$x/ctd/bin"
    cp "$x/usr/bin/containerd" "$x/usr/bin/containerd-shim-runc-v2" "$x/usr/bin/ctr" "$x/ctd/bin/"
    targz "$up/containerd-${ver[containerd]}-linux-$arch.tar.gz" "$x/ctd" bin
  fi
  if [ -x "$x/usr/sbin/runc" ]; then
    cp "$x/usr/sbin/runc" "$up/runc.$arch"
  fi
  if [ -d "$x/usr/lib/cni" ]; then
    (cd "$x/usr/lib/cni" && targz "$up/cni-plugins-linux-$arch-v${ver[containernetworking-plugins]}.tgz" . ./bridge ./host-local ./loopback ./portmap ./bandwidth ./firewall)
  fi
done
# Kubernetes' own layout: release/<version>/bin/<os>/<arch>/<binary>. On Linux the kubeadm
# double (tools/standin-kubeadm) plays kubeadm and the stand-in kubelet plays kubelet and
# kubectl; on Windows the stand-in kubelet plays all three (the kubeadm double needs unix
# sockets, and kiln runs no kubeadm on Windows). None is upstream; the lock's `verified` says so.
# Its version: the images' kubernetes.version plus "-standin" (v1.36.4-standin in the lock, as
# upstream's kubelet is v1.36.4 in kiln's release lock; the download path has the "v" once).
kube_v=$(awk -F'"' '/^\[/ { k = ($0 == "[kubernetes]") } k && /^version *=/ { print $2; exit }' "$root/images/ubuntu.toml")
[ -n "$kube_v" ] || { echo "fixture-mirror: no [kubernetes] version in $root/images/ubuntu.toml" >&2; exit 1; }
kube_v=${kube_v#v}-standin
for arch in amd64 arm64; do
  d=$up/release/v$kube_v/bin/linux/$arch
  mkdir -p "$d"
  src=$STANDINS/linux-$arch/kubelet
  [ "$arch" = amd64 ] && src=$KUBELET_BIN
  for b in kubelet kubectl; do install -m 0755 "$src" "$d/$b"; done
  install -m 0755 "$STANDINS/linux-$arch/kubeadm" "$d/kubeadm"
done
d=$up/release/v$kube_v/bin/windows/amd64
mkdir -p "$d"
for b in kubelet kubeadm kubectl; do install -m 0755 "$STANDINS/windows-amd64/kubelet.exe" "$d/$b.exe"; done

# crictl: upstream's tarballs hold the one binary at the top.
crictl_v=1.34.0-standin
for arch in amd64 arm64; do
  mkdir -p "$work/crictl-$arch"
  install -m 0755 "$STANDINS/linux-$arch/crictl" "$work/crictl-$arch/crictl"
  targz "$up/crictl-v$crictl_v-linux-$arch.tar.gz" "$work/crictl-$arch" crictl
done
mkdir -p "$work/crictl-win"
install -m 0755 "$STANDINS/windows-amd64/crictl.exe" "$work/crictl-win/crictl.exe"
targz "$up/crictl-v$crictl_v-windows-amd64.tar.gz" "$work/crictl-win" crictl.exe

# The image credential providers the real lock pins, in their upstream layouts
# (artifacts.k8s.io's binaries/<project>/<version>/…), each the stand-in provider
# (tools/standin-kubelet, credential-provider) under the provider's name.
cp_v=v1.31.7-standin
gcp_v=v35.0.0-standin
for arch in amd64 arm64; do
  d=$up/cloud-provider-aws/$cp_v/linux/$arch
  mkdir -p "$d"
  install -m 0755 "$STANDINS/linux-$arch/credential-provider" "$d/ecr-credential-provider-linux-$arch"
  d=$up/cloud-provider-gcp/$gcp_v/auth-provider-gcp/linux/$arch
  mkdir -p "$d"
  install -m 0755 "$STANDINS/linux-$arch/credential-provider" "$d/auth-provider-gcp"
done

# Windows containerd (bin/*.exe) and CNI plugins (./*.exe), upstream's layouts, each .exe
# the named PE stand-in.
win_ctd=(containerd.exe containerd-shim-runhcs-v1.exe ctr.exe)
win_cni=(win-bridge.exe win-overlay.exe host-local.exe)
mkdir -p "$work/ctd-win/bin" "$work/cni-win"
for b in "${win_ctd[@]}"; do install -m 0755 "$STANDINS/windows-amd64/tool.exe" "$work/ctd-win/bin/$b"; done
for b in "${win_cni[@]}"; do install -m 0755 "$STANDINS/windows-amd64/tool.exe" "$work/cni-win/$b"; done
targz "$up/containerd-${ver[containerd]}-windows-amd64.tar.gz" "$work/ctd-win" bin
(cd "$work/cni-win" && targz "$up/cni-plugins-windows-amd64-v${ver[containernetworking-plugins]}.tgz" . "${win_cni[@]/#/./}")

# The fixture lock.
lock=$out/artifacts.lock
entry() { # NAME VERSION OS ARCH FORMAT FILE MEMBERS...
  local name=$1 version=$2 os=$3 arch=$4 format=$5 file=$6
  shift 6
  [ -e "$up/$file" ] || return 0
  {
    echo
    echo "[[artifact]]"
    echo "name = \"$name\""
    echo "version = \"$version\""
    echo "os = \"$os\""
    echo "arch = \"$arch\""
    echo "format = \"$format\""
    echo "url = \"$base/$file\""
    echo "size = $(stat -c %s "$up/$file")"
    echo "sha256 = \"$(sha256sum "$up/$file" | cut -d' ' -f1)\""
    local how="apt-get download from $suite (signed archive metadata, scripts/debian-suite.sh)"
    case $os/$name in
      linux/kubeadm) echo "verified = \"fixture: the workspace's kubeadm join double (tools/standin-kubeadm) built for $os/$arch by scripts/build-standins.sh; not upstream\"" ;;
      */kube*) echo "verified = \"fixture: the workspace's stand-in kubelet (tools/standin-kubelet) built for $os/$arch by scripts/build-standins.sh, under the name $name; not upstream\"" ;;
      */ecr-credential-provider | */auth-provider-gcp) echo "verified = \"fixture: the workspace's stand-in credential provider (tools/standin-kubelet) built for $os/$arch by scripts/build-standins.sh, under the name $name; not upstream\"" ;;
      */crictl) echo "verified = \"fixture: the workspace's crictl stand-in (tools/standin-kubelet) built for $os/$arch by scripts/build-standins.sh; Debian 12 has no cri-tools; not upstream\"" ;;
      windows/*) echo "verified = \"fixture: PE stand-ins built with mingw by scripts/build-standins.sh in upstream's $name archive layout; not upstream\"" ;;
      *) echo "verified = \"fixture: repacked by scripts/fixture-mirror.sh from Debian's $arch $name package fetched with $how\"" ;;
    esac
    echo "members = ["
    local m
    for m in "$@"; do echo "  { from = \"${m%%=*}\", to = \"${m#*=}\" },"; done
    echo "]"
  } >>"$lock"
}

# A loopback stand-in for the upstream download sites, so `kiln mirror sync` does real HTTP.
python3 - "$up" "$work/port" <<'PY' &
import functools, http.server, sys
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
handler = functools.partial(Quiet, directory=sys.argv[1])
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
open(sys.argv[2] + ".tmp", "w").write(str(srv.server_address[1]))
import os; os.rename(sys.argv[2] + ".tmp", sys.argv[2])
srv.serve_forever()
PY
server_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.05; done
base="http://127.0.0.1:$(cat "$work/port")"

echo "# kiln fixture lock: Debian binaries in upstream layouts, and stand-ins where Debian has none." >"$lock"
echo "# Generated by scripts/fixture-mirror.sh; signed with the throwaway key in keys/." >>"$lock"
echo "version = 1" >>"$lock"
for arch in amd64 arm64; do
  for b in kubelet kubeadm kubectl; do
    entry "$b" "v$kube_v" linux "$arch" binary "release/v$kube_v/bin/linux/$arch/$b" "$b=bin/$b"
  done
done
for b in kubelet kubeadm kubectl; do
  entry "$b" "v$kube_v" windows amd64 binary "release/v$kube_v/bin/windows/amd64/$b.exe" "$b.exe=$b.exe"
done
for arch in amd64 arm64; do
  entry containerd "${ver[containerd]}" linux "$arch" tar.gz "containerd-${ver[containerd]}-linux-$arch.tar.gz" \
    bin/containerd=bin/containerd bin/containerd-shim-runc-v2=bin/containerd-shim-runc-v2 bin/ctr=bin/ctr
done
entry containerd "${ver[containerd]}" windows amd64 tar.gz "containerd-${ver[containerd]}-windows-amd64.tar.gz" \
  bin/containerd.exe=containerd.exe bin/containerd-shim-runhcs-v1.exe=containerd-shim-runhcs-v1.exe bin/ctr.exe=ctr.exe
for arch in amd64 arm64; do
  entry runc "${ver[runc]}" linux "$arch" binary "runc.$arch" "runc.$arch=bin/runc"
done
v=${ver[containernetworking-plugins]}
for arch in amd64 arm64; do
  entry cni-plugins "$v" linux "$arch" tar.gz "cni-plugins-linux-$arch-v$v.tgz" \
    ./bridge=libexec/cni/bridge ./host-local=libexec/cni/host-local ./loopback=libexec/cni/loopback \
    ./portmap=libexec/cni/portmap ./bandwidth=libexec/cni/bandwidth ./firewall=libexec/cni/firewall
done
entry cni-plugins "$v" windows amd64 tar.gz "cni-plugins-windows-amd64-v$v.tgz" \
  ./win-bridge.exe=cni/bin/win-bridge.exe ./win-overlay.exe=cni/bin/win-overlay.exe ./host-local.exe=cni/bin/host-local.exe
for arch in amd64 arm64; do
  entry crictl "$crictl_v" linux "$arch" tar.gz "crictl-v$crictl_v-linux-$arch.tar.gz" crictl=bin/crictl
done
entry crictl "$crictl_v" windows amd64 tar.gz "crictl-v$crictl_v-windows-amd64.tar.gz" crictl.exe=crictl.exe
for arch in amd64 arm64; do
  entry ecr-credential-provider "$cp_v" linux "$arch" binary \
    "cloud-provider-aws/$cp_v/linux/$arch/ecr-credential-provider-linux-$arch" \
    "ecr-credential-provider-linux-$arch=libexec/kiln/credential-providers/ecr-credential-provider"
  entry auth-provider-gcp "$gcp_v" linux "$arch" binary \
    "cloud-provider-gcp/$gcp_v/auth-provider-gcp/linux/$arch/auth-provider-gcp" \
    "auth-provider-gcp=libexec/kiln/credential-providers/auth-provider-gcp"
done

mkdir -p "$out/keys"
rm -f "$out/keys/fixture.key" "$out/keys/fixture.pub"
minisign -G -W -p "$out/keys/fixture.pub" -s "$out/keys/fixture.key" -c "kiln fixture test key" >/dev/null
"$KILN_BIN" --quiet lock sign "$lock" --secret-key "$out/keys/fixture.key"
"$KILN_BIN" --quiet mirror sync --to "$out/mirror" --lock "$lock" --trusted-key "$out/keys/fixture.pub"
"$KILN_BIN" --quiet mirror verify "$out/mirror" --trusted-key "$out/keys/fixture.pub"
echo "fixture-mirror: $out (lock $lock, key $out/keys/fixture.pub, mirror $out/mirror)"
