# The arm64 guest of the boot tests, sourced by assets.sh (functions only): what
# `qemu-system-aarch64 -M virt` boots directly with -kernel, no firmware.
#
# - kernel: Debian's linux-image-<abi>-cloud-arm64 (an uncompressed arm64 `Image`; the PL011
#   console, PCIe host bridge and ext4 are built in, virtio is modules), cached like amd64's
#   under kernel/<package>_<version>/ (build_kernel with apt's `:arm64` qualifier);
# - initramfs: the same /init with busybox-static:arm64 (apt-get download of the foreign
#   package, never installed on the host) and the same virtio modules from the arm64 tree;
# - base: `debootstrap --arch=arm64` of the same package set. Its second stage runs arm64
#   dpkg and maintainer scripts on the host through qemu-user's binfmt_misc entry
#   (qemu-user-binfmt, pulled in by qemu-user-static), registered here if the host has not.
#
# Keys: everything that goes into an asset (package versions, this recipe's functions, the
# shared init script and configure_base), so the arm64 assets rebuild only when one changes.
# amd64's keys do not include this file: adding arm64 did not rebuild them.

select_arm64() {
  flavour=cloud-arm64
  apt_arch=:arm64
  kpkg=
}

# busybox-static:arm64's candidate version (the initramfs key) and its .deb, downloaded
# into $1 when given.
arm64_busybox_version() {
  apt-cache policy busybox-static:arm64 | awk '/Candidate:/ {print $2; exit}'
}

resolve_initramfs_arm64() {
  resolve_kernel
  a_bb=$(arm64_busybox_version)
  [ -n "$a_bb" ] && [ "$a_bb" != "(none)" ] ||
    die "apt-cache policy busybox-static:arm64 has no candidate: is arm64 added to dpkg (make deps)?"
  a_ikey=$( { echo "$kpkg $kdeb_ver busybox-static:arm64 $a_bb ${initramfs_modules[*]}"; cat "$here/init"; declare -f build_initramfs_arm64; } | key_of)
  a_idir=$cache/initramfs-arm64/$a_ikey
}

build_initramfs_arm64() {
  resolve_initramfs_arm64
  [ -f "$a_idir/initrd.img" ] && return 0
  build_kernel
  log "initramfs-arm64: $kver, busybox-static:arm64 $a_bb (${initramfs_modules[*]})"
  local tmp=$a_idir.tmp.$$ tree path rel
  rm -rf "$tmp"; mkdir -p "$tmp/dl"
  tree=$tmp/tree
  mkdir -p "$tree"/{bin,dev,proc,sys,newroot,lib/modules}
  (cd "$tmp/dl" && apt-get -o APT::Sandbox::User=root download -qq "busybox-static:arm64=$a_bb") ||
    die "apt-get download busybox-static:arm64=$a_bb failed"
  dpkg-deb -x "$tmp"/dl/*.deb "$tmp/dl/x"
  cp "$tmp/dl/x/bin/busybox" "$tree/bin/busybox"
  file -b "$tree/bin/busybox" | grep -q 'ARM aarch64' || die "busybox-static:arm64 is not an aarch64 binary"
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
  [ -s "$tree/modules.list" ] || die "modprobe found none of ${initramfs_modules[*]} in $kdir"
  (cd "$tree" && find . | sort | cpio -o -H newc --quiet --reproducible) | gzip -n -1 >"$tmp/initrd.img"
  cp "$tree/modules.list" "$tmp/modules.list"
  rm -rf "$tree" "$tmp/dl"
  mkdir -p "$(dirname "$a_idir")"; rm -rf "$a_idir"; mv "$tmp" "$a_idir"
}

resolve_base_arm64() {
  resolve_kernel
  a_bkey=$( { echo "$suite arm64 $base_packages $kpkg $kdeb_ver"; declare -f build_base_arm64 configure_base configure_arm64; } | key_of)
  a_bdir=$cache/base-arm64/$a_bkey
}

# The host runs arm64 programs through qemu-user (debootstrap's second stage chroots into
# the arm64 tree and runs its dpkg): mount binfmt_misc and register qemu-user-binfmt's
# aarch64 entry unless the host already has one. The entry's F flag makes the kernel open
# the interpreter now, so it also works inside the chroot. This is the state a Debian host
# with qemu-user-binfmt is in after boot (systemd-binfmt.service); it is left registered.
ensure_binfmt_aarch64() {
  local bm=/proc/sys/fs/binfmt_misc conf=/usr/lib/binfmt.d/qemu-aarch64.conf
  [ -e "$bm/register" ] || "${SUDO[@]}" mount -t binfmt_misc binfmt_misc "$bm" ||
    die "cannot mount binfmt_misc on $bm (debootstrap --arch=arm64 needs it to run arm64 programs)"
  if [ ! -e "$bm/qemu-aarch64" ]; then
    if [ -f "$conf" ]; then
      log "registering $conf with binfmt_misc"
      grep -v '^#' "$conf" | "${SUDO[@]}" tee "$bm/register" >/dev/null ||
        die "binfmt_misc refused $conf"
    elif command -v update-binfmts >/dev/null && [ -f /usr/share/binfmts/qemu-aarch64 ]; then
      # bookworm's own qemu-user-static registers through binfmt-support instead.
      "${SUDO[@]}" update-binfmts --enable qemu-aarch64 || die "update-binfmts --enable qemu-aarch64 failed"
    else
      die "no binfmt entry for qemu-aarch64 ($conf or /usr/share/binfmts/qemu-aarch64): run \`make deps\` (installs qemu-user-static)"
    fi
  fi
  grep -qx enabled "$bm/qemu-aarch64" || die "the binfmt_misc entry qemu-aarch64 is disabled"
}

# What the arm64 guest needs beyond configure_base: no login prompt on the PL011 console.
configure_arm64() {
  local root=$1
  ln -sf /dev/null "$root/etc/systemd/system/serial-getty@ttyAMA0.service"
}

build_base_arm64() {
  resolve_base_arm64
  [ -f "$a_bdir/root/etc/os-release" ] && return 0
  build_kernel
  ensure_binfmt_aarch64
  log "base-arm64: debootstrap --arch=arm64 --variant=minbase --include=$base_packages $suite (second stage under qemu-user: several minutes)"
  local tmp=$a_bdir.tmp.$$
  "${SUDO[@]}" rm -rf "$tmp"; mkdir -p "$tmp"
  "${SUDO[@]}" debootstrap --arch=arm64 --variant=minbase --include="$base_packages" "$suite" "$tmp/root" "$mirror" \
    >"$tmp/debootstrap.log" 2>&1 || { tail -30 "$tmp/debootstrap.log" >&2; die "debootstrap --arch=arm64 failed (log: $tmp/debootstrap.log)"; }
  "${SUDO[@]}" bash -c "$(declare -f configure_base configure_arm64); configure_base '$tmp/root'; configure_arm64 '$tmp/root'"
  file -b "$tmp/root/lib/systemd/systemd" | grep -q 'ARM aarch64' || die "the arm64 base's systemd is not an aarch64 binary"
  "${SUDO[@]}" mkdir -p "$tmp/root/lib/modules"
  "${SUDO[@]}" cp -a "$kdir/lib/modules/$kver" "$tmp/root/lib/modules/$kver"
  "${SUDO[@]}" du -sm "$tmp/root" | awk '{print $1}' >"$tmp/size-mib"
  mkdir -p "$(dirname "$a_bdir")"; "${SUDO[@]}" rm -rf "$a_bdir"; mv "$tmp" "$a_bdir"
}

build_arm64() {
  build_kernel
  build_initramfs_arm64
  build_base_arm64
}

print_env_arm64() {
  resolve_initramfs_arm64
  resolve_base_arm64
  echo "KILN_QEMU_ARM64_KERNEL=$kdir/vmlinuz"
  echo "KILN_QEMU_ARM64_KVER=$kver"
  echo "KILN_QEMU_ARM64_INITRD=$a_idir/initrd.img"
  echo "KILN_QEMU_ARM64_BASE=$a_bdir/root"
}
