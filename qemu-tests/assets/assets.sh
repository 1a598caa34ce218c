#!/usr/bin/env bash
# Builds, once, the guest assets the boot tests need and caches them by version outside the
# repository: a Debian cloud kernel with its modules, a module-loading busybox initramfs and
# debootstrapped Debian trixie bases (systemd 257, the suite whose glibc runs the fixture's
# containerd 2.x and runc 1.3 from sid). A fresh machine rebuilds them; a warm cache is reused.
#
#   assets.sh [all]        kernel, initramfs, base (what every scenario needs)
#   assets.sh kernel | initramfs | base | base-cloudinit
#   assets.sh arm64        the arm64 guest (qemu-system-aarch64 -M virt): Debian's arm64 cloud
#                          kernel, an initramfs with arm64 busybox, a debootstrapped arm64 base
#                          (assets-arm64.sh); prints the KILN_QEMU_ARM64_* paths too
#   assets.sh env          print KILN_QEMU_* paths for the current versions (builds nothing)
#   assets.sh env-arm64    print KILN_QEMU_ARM64_* paths (builds nothing)
#
# Several commands may be given (`assets.sh all arm64`); each prints its paths.
#
# Cache: $KILN_QEMU_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/kiln/qemu. Every asset is
# built in a temporary directory next to its final place and renamed into it, so a killed
# build never leaves a half-made asset behind. debootstrap needs root (or sudo).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${KILN_QEMU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/qemu}
suite=${KILN_GUEST_SUITE:-trixie}
mirror=${KILN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
flavour=cloud-amd64
# apt's architecture qualifier of the kernel package: empty for the host's (amd64),
# `:arm64` for the arm64 guest (select_arm64 in assets-arm64.sh switches).
apt_arch=
if [ "$(id -u)" -eq 0 ]; then SUDO=(); else SUDO=(sudo); fi

log() { echo "qemu-assets: $*" >&2; }
die() { echo "qemu-assets: error: $*" >&2; exit 1; }

# Short content hash of the arguments (strings or files), used in cache keys so a change to
# this script's recipe gives a new key instead of a stale asset.
key_of() { sha256sum | cut -c1-12; }

# The kernel package apt would install today for the cloud flavour (e.g.
# linux-image-6.1.0-56-cloud-amd64) and its Debian version: resolved, never hard-coded.
kpkg=
resolve_kernel() {
  [ -z "$kpkg" ] || return 0
  local meta=linux-image-$flavour$apt_arch
  kpkg=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  if [ -z "$kpkg" ]; then
    "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
    kpkg=$(apt-cache depends "$meta" | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  fi
  kpkg=${kpkg%"$apt_arch"}
  [ -n "$kpkg" ] || die "apt-cache depends $meta named no linux-image-<abi>-$flavour package"
  kdeb_ver=$(apt-cache policy "$kpkg$apt_arch" | awk '/Candidate:/ {print $2; exit}')
  [ -n "$kdeb_ver" ] && [ "$kdeb_ver" != "(none)" ] || die "apt-cache policy $kpkg has no candidate"
  kver=${kpkg#linux-image-}
  kdir=$cache/kernel/${kpkg}_${kdeb_ver}
}

# initramfs key: kernel + busybox version + the init script below.
resolve_initramfs() {
  resolve_kernel
  local bb
  bb=$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || echo none)
  ikey=$( { echo "$kpkg $kdeb_ver $bb"; cat "$here/init"; declare -f build_initramfs; } | key_of)
  idir=$cache/initramfs/$ikey
}

# base key: suite + package set + the recipe, and the kernel whose modules it carries.
# systemd-container: trixie's systemd-sysupdate and systemd-pull (the Flatcar stand-in updates
# its extension with them, as Flatcar's own systemd does); libcurl4t64: systemd-pull downloads
# through it (trixie's name for libcurl4; debootstrap does not resolve the old name).
# libcryptsetup12: systemd dlopens it to set up dm-verity, so a signed sysext (kiln bake
# --sysext-ddi) merges; it is only a Suggests of libsystemd-shared, which minbase skips.
base_packages=systemd-sysv,udev,dbus,kmod,iproute2,ca-certificates,systemd-container,libcurl4t64,libcryptsetup12
# debootstrap does not resolve virtual packages: python3-cryptography needs the
# python3-cffi-backend-api-* that python3-cffi-backend provides, so it is named here.
cloudinit_packages=$base_packages,cloud-init,isc-dhcp-client,python3-cffi-backend
resolve_base() {
  local variant=$1 pkgs=$2
  resolve_kernel
  bkey=$( { echo "$suite $pkgs $kpkg $kdeb_ver $variant"; declare -f build_base configure_base; } | key_of)
  bdir=$cache/$variant/$bkey
}

# Takes the cache lock so parallel test processes build each asset once.
with_lock() {
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9
}

build_kernel() {
  resolve_kernel
  [ -f "$kdir/vmlinuz" ] && return 0
  log "kernel: $kpkg $kdeb_ver"
  local tmp=$kdir.tmp.$$
  rm -rf "$tmp"; mkdir -p "$tmp/dl" "$tmp/root"
  (cd "$tmp/dl" && apt-get -o APT::Sandbox::User=root download -qq "$kpkg$apt_arch=$kdeb_ver") ||
    die "apt-get download $kpkg$apt_arch=$kdeb_ver failed"
  dpkg-deb -x "$tmp"/dl/*.deb "$tmp/root"
  # The package's postinst normally makes modules.dep; do it here for the extracted tree.
  depmod -b "$tmp/root" "$kver"
  mv "$tmp/root/boot/vmlinuz-$kver" "$tmp/vmlinuz"
  mkdir -p "$tmp/lib/modules"
  mv "$tmp/root/lib/modules/$kver" "$tmp/lib/modules/$kver"
  cp "$tmp/root/boot/config-$kver" "$tmp/config"
  echo "$kver" >"$tmp/kver"
  rm -rf "$tmp/dl" "$tmp/root"
  mkdir -p "$(dirname "$kdir")"; rm -rf "$kdir"; mv "$tmp" "$kdir"
}

# Modules the initramfs loads, in dependency order, to reach an ext4 root on virtio-blk.
initramfs_modules=(virtio_pci virtio_blk)

build_initramfs() {
  resolve_initramfs
  [ -f "$idir/initrd.img" ] && return 0
  build_kernel
  log "initramfs: $kver (${initramfs_modules[*]})"
  local tmp=$idir.tmp.$$ tree m
  rm -rf "$tmp"; mkdir -p "$tmp"
  tree=$tmp/tree
  mkdir -p "$tree"/{bin,dev,proc,sys,newroot,lib/modules}
  cp /bin/busybox "$tree/bin/busybox"
  cp "$here/init" "$tree/init"; chmod 0755 "$tree/init"
  : >"$tree/modules.list"
  for m in "${initramfs_modules[@]}"; do
    modprobe -d "$kdir" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
  done | awk '!seen[$0]++' | while read -r path; do
    rel=${path#"$kdir"}
    rel=${rel#/}
    mkdir -p "$tree/$(dirname "$rel")"
    cp "$path" "$tree/$rel"
    echo "/$rel" >>"$tree/modules.list"
  done
  (cd "$tree" && find . | sort | cpio -o -H newc --quiet --reproducible) | gzip -n -1 >"$tmp/initrd.img"
  cp "$tree/modules.list" "$tmp/modules.list"
  rm -rf "$tree"
  mkdir -p "$(dirname "$idir")"; rm -rf "$idir"; mv "$tmp" "$idir"
}

# What makes a debootstrapped tree bootable and quiet on a serial console under test.
configure_base() {
  local root=$1
  echo kiln-node >"$root/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 kiln-node\n' >"$root/etc/hosts"
  printf '/dev/vda / ext4 rw,relatime 0 1\n' >"$root/etc/fstab"
  # An empty machine-id is what a cloud image ships: systemd treats the boot as the first.
  : >"$root/etc/machine-id"
  rm -f "$root/var/lib/dbus/machine-id"
  # systemd-firstboot would prompt on the console at a first boot; nothing answers it there.
  ln -sf /dev/null "$root/etc/systemd/system/systemd-firstboot.service"
  # No login prompts on the console the tests read.
  ln -sf /dev/null "$root/etc/systemd/system/serial-getty@ttyS0.service"
  ln -sf /dev/null "$root/etc/systemd/system/getty@tty1.service"
  # DHCP on the virtio NIC through systemd-networkd (the guest's only network).
  mkdir -p "$root/etc/systemd/network"
  printf '[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n' \
    >"$root/etc/systemd/network/50-dhcp.network"
  mkdir -p "$root/etc/systemd/system/multi-user.target.wants" \
    "$root/etc/systemd/system/network-online.target.wants" \
    "$root/etc/systemd/system/sockets.target.wants"
  ln -sf /lib/systemd/system/systemd-networkd.service \
    "$root/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
  ln -sf /lib/systemd/system/systemd-networkd.socket \
    "$root/etc/systemd/system/sockets.target.wants/systemd-networkd.socket"
  ln -sf /lib/systemd/system/systemd-networkd-wait-online.service \
    "$root/etc/systemd/system/network-online.target.wants/systemd-networkd-wait-online.service"
  # Status lines with a timestamp-free, stable shape on the serial console.
  mkdir -p "$root/etc/systemd/system.conf.d"
  printf '[Manager]\nShowStatus=yes\nDefaultTimeoutStopSec=5s\n' >"$root/etc/systemd/system.conf.d/kiln-test.conf"
  # The journal stays in memory: the disk is a throw-away snapshot anyway.
  mkdir -p "$root/etc/systemd/journald.conf.d"
  printf '[Journal]\nStorage=volatile\n' >"$root/etc/systemd/journald.conf.d/kiln-test.conf"
  passwd -R "$root" -l root >/dev/null 2>&1 || true
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
}

# Leftovers of killed or failed builds; called under the lock, so none is running.
clean_stale() {
  "${SUDO[@]}" rm -rf "$cache"/*/*.tmp.*
}

build_base() {
  local variant=$1 pkgs=$2
  resolve_base "$variant" "$pkgs"
  [ -f "$bdir/root/etc/os-release" ] && return 0
  build_kernel
  log "$variant: debootstrap --variant=minbase --include=$pkgs $suite (about a minute)"
  local tmp=$bdir.tmp.$$
  "${SUDO[@]}" rm -rf "$tmp"; mkdir -p "$tmp"
  "${SUDO[@]}" debootstrap --variant=minbase --include="$pkgs" "$suite" "$tmp/root" "$mirror" \
    >"$tmp/debootstrap.log" 2>&1 || { tail -30 "$tmp/debootstrap.log" >&2; die "debootstrap failed (log: $tmp/debootstrap.log)"; }
  "${SUDO[@]}" bash -c "$(declare -f configure_base); configure_base '$tmp/root'"
  # The kernel's modules, so udev and systemd-modules-load in the guest find overlay,
  # br_netfilter, qemu_fw_cfg and the NIC driver.
  "${SUDO[@]}" mkdir -p "$tmp/root/lib/modules"
  "${SUDO[@]}" cp -a "$kdir/lib/modules/$kver" "$tmp/root/lib/modules/$kver"
  "${SUDO[@]}" du -sm "$tmp/root" | awk '{print $1}' >"$tmp/size-mib"
  mkdir -p "$(dirname "$bdir")"; "${SUDO[@]}" rm -rf "$bdir"; mv "$tmp" "$bdir"
}

print_env() {
  resolve_initramfs
  echo "KILN_QEMU_KERNEL=$kdir/vmlinuz"
  echo "KILN_QEMU_KVER=$kver"
  echo "KILN_QEMU_INITRD=$idir/initrd.img"
  resolve_base base "$base_packages"
  echo "KILN_QEMU_BASE=$bdir/root"
  resolve_base base-cloudinit "$cloudinit_packages"
  echo "KILN_QEMU_BASE_CLOUDINIT=$bdir/root"
}

# shellcheck source=assets-arm64.sh
source "$here/assets-arm64.sh"

[ "$#" -gt 0 ] || set -- all
for cmd in "$@"; do
  case "$cmd" in
    env) print_env ;;
    env-arm64) (select_arm64; print_env_arm64) ;;
    kernel) with_lock; clean_stale; build_kernel ;;
    initramfs) with_lock; build_initramfs ;;
    base) with_lock; build_base base "$base_packages" ;;
    base-cloudinit) with_lock; clean_stale; build_base base-cloudinit "$cloudinit_packages" ;;
    all) with_lock; clean_stale; build_kernel; build_initramfs; build_base base "$base_packages" ;;
    arm64) with_lock; clean_stale; (select_arm64; build_arm64; print_env_arm64) ;;
    *) die "unknown command '$cmd' (expected: all, arm64, kernel, initramfs, base, base-cloudinit, env, env-arm64)" ;;
  esac
  case "$cmd" in env | env-arm64 | arm64) ;; *) print_env ;; esac
done
