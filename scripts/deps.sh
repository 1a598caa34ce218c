#!/usr/bin/env bash
# Installs what kiln's build, tests, benchmarks and demo need on a fresh Debian/Ubuntu machine.
# Idempotent: packages already present are not touched, and apt is not even called when
# nothing is missing. Works as root or through sudo.
#
#   scripts/deps.sh            the base set (build, unit tests, bake tools, validators, and
#                              the static kiln-firstboot: Debian's Rust with std sources + musl)
#   scripts/deps.sh qemu       + QEMU (x86-64 and aarch64), kernel tools, debootstrap (boot
#                              tests, demo; the arm64 guest's base is debootstrapped through
#                              qemu-user-static's binfmt entry)
#   scripts/deps.sh windows    + mingw-w64 and Wine (kiln-firstboot.exe and its tests)
set -euo pipefail

if [ "$(id -u)" -eq 0 ]; then SUDO=(); else SUDO=(sudo -E); fi
export DEBIAN_FRONTEND=noninteractive

base=(
  build-essential pkg-config ca-certificates curl git
  squashfs-tools squashfs-tools-ng zstd tar gzip unzip file xz-utils
  systemd systemd-container
  hyperfine valgrind time
  minisign openssl python3 bc
  groff-base                         # man pages are rendered in a test (kiln man)
  cloud-init ignition python3-venv   # real validators of `kiln render` output (docs/render.md)
  containerd gnupg                   # bake tests: containerd parses the Windows config, gpg signs SHA256SUMS
  busybox-static cpio kmod e2fsprogs
  gdisk fdisk                        # sgdisk and sfdisk: the kiln image tests build GPT and MBR base disks
  cryptsetup-bin                     # veritysetup checks the dm-verity tree of a signed sysext DDI (bake/ddi)
  xfsprogs btrfs-progs               # kiln image writes xfs and btrfs roots (builder/tests/image_fs.rs)
  musl-tools
  protobuf-compiler                  # tools/cri-smoke: k8s-cri compiles the CRI protos with protoc
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross   # arm64 stand-ins of the fixture mirror
  docker-registry skopeo umoci apache2-utils    # registry tests (issue 16): a real registry, independent OCI clients, htpasswd -B
)
# The release kiln-firstboot is built by Debian's rustc with `-Z build-std` for musl
# (scripts/build-firstboot.sh, docs/building.md): rustup's toolchains have no rust-src.
# The arm64 one links against Debian's musl-dev:arm64 (Multi-Arch: same, made for
# cross-linking with gcc-aarch64-linux-gnu) and is run once under qemu-aarch64-static.
firstboot=(rustc-web cargo-web rust-web-src musl-tools gcc-aarch64-linux-gnu musl-dev:arm64 qemu-user-static)
# grub-pc-bin, grub-efi-amd64-bin and grub2-common give grub-mkimage and GRUB's BIOS and EFI
# images for the vendor-style boot disks (qemu-tests/src/bootdisk.rs), ovmf the UEFI firmware
# the Flatcar-style one boots with; never grub-pc or grub-efi-amd64, whose scripts would set
# up the host's own bootloader.
qemu=(busybox-static cpio kmod e2fsprogs squashfs-tools erofs-utils debootstrap zstd dosfstools mtools genisoimage openssl util-linux grub-pc-bin grub2-common grub-efi-amd64-bin ovmf)
windows=(rustc-web cargo-web rust-web-src gcc-mingw-w64-x86-64 wine64 wine)

want=("${base[@]}" "${firstboot[@]}")
backports=()
for set in "$@"; do
  case "$set" in
    base) ;;
    qemu) want+=("${qemu[@]}"); backports+=(qemu-system-x86 qemu-system-arm qemu-utils) ;;
    windows) want+=("${windows[@]}") ;;
    *) echo "deps.sh: unknown set '$set' (expected: qemu, windows)" >&2; exit 2 ;;
  esac
done

missing() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
  done
}

apt_get() {
  "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 -y --no-install-recommends "$@"
}

updated=0
update_once() {
  if [ "$updated" -eq 0 ]; then
    "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
    updated=1
  fi
}

mapfile -t need < <(missing "${want[@]}" | sort -u)
# musl-dev:arm64 is a foreign-architecture package: dpkg must know arm64 before apt can see it.
if printf '%s\n' "${need[@]}" | grep -q ':arm64$' && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "deps: adding the arm64 architecture to dpkg (for musl-dev:arm64)"
  "${SUDO[@]}" dpkg --add-architecture arm64
fi
if [ "${#need[@]}" -gt 0 ]; then
  echo "deps: installing ${need[*]}"
  update_once
  apt_get install -qq "${need[@]}" >/dev/null
fi

if [ "${#backports[@]}" -gt 0 ]; then
  # Debian 12's own qemu-system-x86 (7.2) cannot sit beside the qemu-utils 10.0 that these
  # machines ship, so QEMU comes from bookworm-backports (see docs/boot-tests.md).
  mapfile -t bneed < <(missing "${backports[@]}")
  if [ "${#bneed[@]}" -gt 0 ] || ! command -v qemu-system-x86_64 >/dev/null ||
    ! command -v qemu-system-aarch64 >/dev/null; then
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    if [ "$codename" = bookworm ] && ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
      echo "deps: adding bookworm-backports for QEMU"
      printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' |
        "${SUDO[@]}" tee /etc/apt/sources.list.d/kiln-backports.sources >/dev/null
      updated=0
    fi
    update_once
    if [ "$codename" = bookworm ]; then
      apt_get install -qq -t bookworm-backports "${backports[@]}" >/dev/null
    else
      apt_get install -qq "${backports[@]}" >/dev/null
    fi
  fi
fi

# cloudbase-init (PyPI) in its own venv: the render tests run its real user-data plugin on
# kiln's Windows user data (builder/tests/render_validators.rs).
CBI_VENV=/opt/kiln/cloudbase-init
if ! "$CBI_VENV/bin/python" -c 'import cloudbaseinit' 2>/dev/null; then
  echo "deps: installing cloudbase-init into $CBI_VENV"
  "${SUDO[@]}" /usr/bin/python3 -m venv "$CBI_VENV"
  "${SUDO[@]}" "$CBI_VENV/bin/pip" install -q --disable-pip-version-check cloudbase-init==1.1.9 >/dev/null
fi

# spdx-tools (PyPI) in its own venv: the bake tests validate every SBOM with its
# `pyspdxtools` (builder/tests/bake_sbom.rs, docs/bake.md).
SPDX_VENV=/opt/kiln/spdx-tools
if ! "$SPDX_VENV/bin/pyspdxtools" --help >/dev/null 2>&1; then
  echo "deps: installing spdx-tools into $SPDX_VENV"
  "${SUDO[@]}" /usr/bin/python3 -m venv "$SPDX_VENV"
  "${SUDO[@]}" "$SPDX_VENV/bin/pip" install -q --disable-pip-version-check spdx-tools==0.8.3 >/dev/null
fi

# Rust tools the gates use; the toolchain itself comes from rustup on these machines.
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "deps: installing cargo-nextest"
  cargo install --locked cargo-nextest >/dev/null
fi
echo "deps: ok"
