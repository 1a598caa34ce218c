#!/usr/bin/env bash
# kiln's release archives (`make dist`): for each architecture a static (musl) kiln, packed
# with kiln-firstboot for every node platform, the man pages, shell completions and the
# default image definitions; then SHA256SUMS over the archives and, with a key, its minisign
# signature. Every archive is unpacked again and its kiln run in a root that holds nothing
# but the archive (no libc, no shell) before the script succeeds. docs/building.md,
# "Release archives: make dist", explains each step.
#
#   scripts/build-dist.sh [ARCH...]      ARCH: amd64, arm64 (default: both)
#
# Writes target/dist/kiln-<version>-linux-<arch>.tar.gz, target/dist/SHA256SUMS and, when
# KILN_DIST_KEY names a minisign secret key, target/dist/SHA256SUMS.minisig (checked with
# KILN_DIST_PUBKEY if set, else with the public key minisign -R recreates from the secret
# one). SOURCE_DATE_EPOCH (default: the last commit's time) is every file's mtime in the
# archives. Needs root (chroot, a private mount namespace) for the self-check.
set -euo pipefail
umask 022

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
die() { echo "build-dist: $*" >&2; exit 1; }
# shellcheck source=scripts/musl-toolchain.sh
. "$root/scripts/musl-toolchain.sh"

arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(amd64 arm64)
for arch in "${arches[@]}"; do
  case "$arch" in amd64 | arm64) ;; *) die "unknown architecture '$arch' (expected amd64 or arm64)" ;; esac
done
dist=target/dist
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
[[ "$epoch" =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH '$epoch' is not a number of seconds"
command -v qemu-aarch64-static >/dev/null ||
  die "qemu-aarch64-static is missing: run \`make deps\` (installs qemu-user-static)"
if [ -n "${KILN_DIST_KEY:-}" ]; then
  [ -f "$KILN_DIST_KEY" ] || die "KILN_DIST_KEY names $KILN_DIST_KEY, which is not a file"
  command -v minisign >/dev/null || die "minisign is missing: run \`make deps\`"
fi
# The check root's namespaces: its own mounts (/dev/null, /proc) and process ids.
ns=(unshare --mount --propagation private --pid --fork)
# Without root, a user namespace (where the kernel allows them) gives chroot and mounts.
[ "$(id -u)" -eq 0 ] || ns+=(--map-root-user)

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-dist.XXXXXX")
trap 'rm -rf "$work"' EXIT

musl_debian_rust

# kiln-firstboot for every node platform, through its own make targets: they rebuild only
# what changed, so an archive never carries a kiln-firstboot older than its sources.
${MAKE:-make} --no-print-directory firstboot
firstboot_amd64=target/firstboot/kiln-firstboot
firstboot_arm64=target/firstboot/arm64/kiln-firstboot
firstboot_exe=target/firstboot/kiln-firstboot.exe
if [ -f "$firstboot_exe" ]; then
  if [ -n "$(find firstboot Cargo.lock -newer "$firstboot_exe" -type f -print -quit)" ]; then
    echo "build-dist: warning: $firstboot_exe is older than firstboot/'s sources; \`make windows\` rebuilds it" >&2
  fi
else
  echo "build-dist: note: no $firstboot_exe, so the archives carry no Windows kiln-firstboot (\`make windows\` builds it)" >&2
fi

# Runs the binary of an architecture on this (amd64) machine.
runner() { if [ "$1" = arm64 ]; then echo qemu-aarch64-static; fi; }

# kiln for one architecture: Debian's rustc rebuilds std for musl (-Z build-std, with
# panic_unwind: kiln catches its panics), the C parts (ring, zstd) are compiled by the musl
# gcc, and the result is a static, non-PIE executable. Prints the binary's path.
build_kiln() {
  local arch=$1 link_dir="$root/$dist/link/$1" target cc gcc t T
  musl_toolchain "$arch" "$link_dir"
  t=${target//-/_}
  T=${t^^}
  env RUSTC="$debian_rustc" RUSTDOC="${debian_rustc%rustc}rustdoc" RUSTC_BOOTSTRAP=1 \
    "CARGO_TARGET_${T}_LINKER=$cc" "CC_$t=$cc" "AR_$t=${gcc%gcc}ar" \
    RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static -C link-self-contained=no -L native=$link_dir" \
    "$debian_cargo" build --locked -p kiln --bin kiln --release \
    --target "$target" --target-dir "$dist/build-$arch" \
    -Z build-std=std,panic_unwind >&2
  echo "$dist/build-$arch/$target/release/kiln"
}

# The archive's tree, in $work/stage/<name>/.
stage() {
  local arch=$1 bin=$2 name=$3 tree="$work/stage/$3" f
  local run
  run=$(runner "$arch")
  rm -rf "$tree"
  install -d -m 0755 "$tree/bin" "$tree/lib/kiln/linux-amd64" "$tree/lib/kiln/linux-arm64" \
    "$tree/share/man/man1" "$tree/share/man/man8" "$tree/share/bash-completion/completions" \
    "$tree/share/zsh/site-functions" "$tree/share/fish/vendor_completions.d" "$tree/share/kiln"
  install -m 0755 "$bin" "$tree/bin/kiln"
  install -m 0755 "$firstboot_amd64" "$tree/lib/kiln/linux-amd64/kiln-firstboot"
  install -m 0755 "$firstboot_arm64" "$tree/lib/kiln/linux-arm64/kiln-firstboot"
  if [ -f "$firstboot_exe" ]; then
    install -d -m 0755 "$tree/lib/kiln/windows-amd64"
    install -m 0755 "$firstboot_exe" "$tree/lib/kiln/windows-amd64/kiln-firstboot.exe"
  fi
  # Man pages and completions come from the packed binary itself (what `make man` writes,
  # from the same clap definition), so they describe exactly the kiln beside them.
  rm -rf "$work/man"
  $run "$bin" --quiet man --out "$work/man"
  for f in "$work/man"/*.1; do install -m 0644 "$f" "$tree/share/man/man1/"; done
  install -m 0644 "$work/man/kiln-firstboot.8" "$tree/share/man/man8/"
  $run "$bin" completions bash >"$tree/share/bash-completion/completions/kiln"
  $run "$bin" completions zsh >"$tree/share/zsh/site-functions/_kiln"
  $run "$bin" completions fish >"$tree/share/fish/vendor_completions.d/kiln.fish"
  install -m 0644 README.md "$tree/"
  for f in LICENSE*; do [ ! -f "$f" ] || install -m 0644 "$f" "$tree/"; done
  # The default image definitions and the signed lock, as committed (git's file list: no
  # editor leftovers).
  git ls-files -z images | while IFS= read -r -d '' f; do
    install -D -m 0644 "$f" "$tree/share/kiln/$f"
  done
  chmod -R u=rwX,go=rX "$tree"
}

# A reproducible archive: sorted names, one mtime, owner root, no gzip timestamp.
pack() {
  local name=$1 out="$dist/$1.tar.gz"
  tar --sort=name --format=gnu --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
    -C "$work/stage" -cf - "$name" | gzip -9n >"$out.tmp.$$"
  mv "$out.tmp.$$" "$out"
}

# Runs a command in the check root: chrooted, with /dev/null bound from the host and a /proc
# of its own (kiln finds kiln-firstboot through /proc/self/exe), in namespaces that end with
# the command.
in_root() {
  local dir=$1
  shift
  # shellcheck disable=SC2016 # $0 and $@ are the inner shell's
  "${ns[@]}" --mount-proc="$dir/proc" -- sh -c 'mount --bind /dev/null "$0/dev/null" && exec chroot "$0" "$@"' "$dir" "$@"
}

# Unpacks an archive into an otherwise empty root and runs its kiln there.
check() {
  local arch=$1 name=$2 version=$3 dir="$work/root-$1" top kiln run=() out code
  top="/$name"
  rm -rf "$dir"
  mkdir -p "$dir/tmp" "$dir/dev" "$dir/proc"
  chmod 1777 "$dir/tmp"
  : >"$dir/dev/null"
  tar -xzf "$dist/$name.tar.gz" -C "$dir"
  kiln="$dir$top/bin/kiln"
  # arm64 programs run under qemu-user, itself a static program: the root stays without a libc.
  install -m 0755 "$(command -v qemu-aarch64-static)" "$dir/qemu-aarch64-static"
  [ "$arch" = amd64 ] || run=(/qemu-aarch64-static)
  echo "check $name:"
  echo "  file: $(file -b "$kiln")"
  file -b "$kiln" | grep -q 'statically linked' || die "$kiln is not statically linked: $(file -b "$kiln")"
  ! readelf -lW "$kiln" | grep -q INTERP || die "$kiln has a program interpreter (PT_INTERP)"
  local libc
  libc=$(find "$dir" \( -name 'libc.*' -o -name 'libc-*' -o -name 'ld-*.so*' -o -name 'ld-linux*' -o -name 'ld-musl*' \) -print)
  [ -z "$libc" ] || die "the check root is meant to hold no C library, but has: $libc"
  echo "  root: $(find "$dir" -type f | wc -l) files, no libc, no shell (/bin: $(ls "$dir/bin" 2>/dev/null || echo none))"

  out=$(in_root "$dir" "${run[@]}" "$top/bin/kiln" --version) ||
    die "$name: bin/kiln --version does not run in a root without a libc: $out"
  echo "  \$ kiln --version: $out"
  [ "$out" = "kiln $version" ] || die "$name: kiln --version printed '$out', expected 'kiln $version'"

  # The default lock against the release key compiled into kiln: offline, ed25519, TOML.
  out=$(in_root "$dir" "${run[@]}" "$top/bin/kiln" lock verify "$top/share/kiln/images/artifacts.lock") ||
    die "$name: kiln lock verify of the shipped lock failed: $out"
  echo "  \$ kiln lock verify share/kiln/images/artifacts.lock: $out"

  # kiln's ELF/PE gate on the kiln-firstboot binaries it ships, each for its own platform.
  local fb=(--os linux --arch amd64 "$top/lib/kiln/linux-amd64/kiln-firstboot"
    --os linux --arch arm64 "$top/lib/kiln/linux-arm64/kiln-firstboot")
  [ ! -f "$dir$top/lib/kiln/windows-amd64/kiln-firstboot.exe" ] ||
    fb+=(--os windows --arch amd64 "$top/lib/kiln/windows-amd64/kiln-firstboot.exe")
  local i
  for ((i = 0; i < ${#fb[@]}; i += 5)); do
    out=$(in_root "$dir" "${run[@]}" "$top/bin/kiln" inspect "${fb[@]:i:5}") ||
      die "$name: kiln inspect ${fb[*]:i:5} failed: $out"
    echo "  \$ kiln inspect ${fb[*]:i:4} ${fb[i + 4]#"$top/"}: $out"
  done

  # The bake's own choice of kiln-firstboot (`kiln plan`): for each platform, the one in this
  # archive's lib/kiln/<os>-<arch>/, found from the kiln binary's own place.
  local img want w
  for img in ubuntu windows; do
    want=("$top/lib/kiln/linux-amd64/kiln-firstboot" "$top/lib/kiln/linux-arm64/kiln-firstboot")
    if [ "$img" = windows ]; then
      [ -f "$dir$top/lib/kiln/windows-amd64/kiln-firstboot.exe" ] || continue
      want=("$top/lib/kiln/windows-amd64/kiln-firstboot.exe")
    fi
    out=$(in_root "$dir" "${run[@]}" "$top/bin/kiln" --json plan "$top/share/kiln/images/$img.toml" \
      --lock "$top/share/kiln/images/artifacts.lock" --store /tmp/no-store) ||
      die "$name: kiln plan of share/kiln/images/$img.toml failed: $out"
    for w in "${want[@]}"; do
      [[ "$out" == *"\"firstboot\":\"$w\",\"firstboot_exists\":true"* ]] ||
        die "$name: kiln plan of $img.toml does not ship $w: $out"
    done
    echo "  \$ kiln plan share/kiln/images/$img.toml: ships ${want[*]#"$top/"}"
  done

  # The shipped Linux kiln-firstboot binaries start in the same root (arm64 under qemu).
  local fb_amd64 fb_arm64
  fb_amd64=$(in_root "$dir" "$top/lib/kiln/linux-amd64/kiln-firstboot" --version) ||
    die "$name: lib/kiln/linux-amd64/kiln-firstboot does not run in a root without a libc"
  fb_arm64=$(in_root "$dir" /qemu-aarch64-static "$top/lib/kiln/linux-arm64/kiln-firstboot" --version) ||
    die "$name: lib/kiln/linux-arm64/kiln-firstboot does not run in a root without a libc"
  out="$fb_amd64, $fb_arm64"
  echo "  \$ kiln-firstboot --version (amd64, arm64): $out"

  # A panic unwinds (kiln catches them: std's panic_unwind over gcc's unwinder and
  # scripts/musl/dl_find_object.c): printing to a full stdout panics in println!, kiln's
  # catch_unwind takes it and resumes it, and the process exits 101. A broken unwinder
  # aborts instead (134).
  code=0
  out=$(in_root "$dir" "${run[@]}" "$top/bin/kiln" contract 2>&1 >/dev/full) || code=$?
  if [ "$code" -ne 101 ] || [[ "$out" != *"failed printing to stdout"* ]]; then
    die "$name: a panic did not unwind: kiln contract >/dev/full exited $code (expected 101): $out"
  fi
  echo "  \$ kiln contract >/dev/full: exit $code (the panic unwound through catch_unwind)"
}

declare -A bins
version=""
for arch in "${arches[@]}"; do
  echo "build-dist: building kiln for linux/$arch (musl, static)"
  bins[$arch]=$(build_kiln "$arch")
  bin=${bins[$arch]}
  # Static and starting, before anything is packed.
  ! readelf -lW "$bin" | grep -q INTERP || die "$bin has a program interpreter: expected a static executable"
  v=$($(runner "$arch") "$bin" --version) || die "$bin --version failed"
  v=${v#kiln }
  [ -z "$version" ] || [ "$v" = "$version" ] || die "kiln versions differ between architectures: $version, $v"
  version=$v
done

archives=()
for arch in "${arches[@]}"; do
  name="kiln-$version-linux-$arch"
  stage "$arch" "${bins[$arch]}" "$name"
  pack "$name"
  archives+=("$name.tar.gz")
done

for arch in "${arches[@]}"; do
  check "$arch" "kiln-$version-linux-$arch" "$version"
done

(cd "$dist" && sha256sum "${archives[@]}" >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS &&
  sha256sum --quiet -c SHA256SUMS)
rm -f "$dist/SHA256SUMS.minisig"
if [ -n "${KILN_DIST_KEY:-}" ]; then
  # Signed beside, checked, then put in place: a signature that does not verify is not kept.
  minisign -S -s "$KILN_DIST_KEY" -m "$dist/SHA256SUMS" -x "$work/SHA256SUMS.minisig" \
    -t "kiln $version release archives: SHA256SUMS (source date $epoch)"
  pub=${KILN_DIST_PUBKEY:-$work/dist.pub}
  [ -n "${KILN_DIST_PUBKEY:-}" ] || minisign -R -s "$KILN_DIST_KEY" -p "$pub" >/dev/null
  minisign -V -q -p "$pub" -m "$dist/SHA256SUMS" -x "$work/SHA256SUMS.minisig" ||
    die "the signature of SHA256SUMS does not verify with $pub (not kept)"
  cp "$work/SHA256SUMS.minisig" "$dist/SHA256SUMS.minisig"
  signed="signed: $dist/SHA256SUMS.minisig (key $(sed -n 's/.*minisign public key //p' "$pub"))"
else
  signed="UNSIGNED: set KILN_DIST_KEY=<minisign secret key> (make dist), or run \`minisign -S -s KEY -m $dist/SHA256SUMS\`"
fi

echo "build-dist: done"
for arch in "${arches[@]}"; do
  name="kiln-$version-linux-$arch"
  printf '  %-34s %10s bytes (bin/kiln %s bytes, %s MiB)\n' "$name.tar.gz" \
    "$(stat -c %s "$dist/$name.tar.gz")" "$(stat -c %s "${bins[$arch]}")" \
    "$(awk -v s="$(stat -c %s "${bins[$arch]}")" 'BEGIN { printf "%.1f", s / 1048576 }')"
done
echo "  $dist/SHA256SUMS $signed"
sed 's/^/    /' "$dist/SHA256SUMS"
