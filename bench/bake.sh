#!/usr/bin/env bash
# bench/bake.sh: kiln bake against its baselines, side by side in one run (docs/benchmarks.md).
#
#   sysext: `kiln bake --format sysext` (extract + gate + hash + SBOM + kiln's squashfs
#           writer) vs `mksquashfs` alone packing the very same tree with the same
#           compression (zstd 15, 128 KiB blocks), in three cache states: warm, upgrade and
#           cold, as for rootfs;
#   rootfs: `kiln bake --format rootfs` (extract + gate + hash + SBOM + tar.zst) vs
#           `tar -I 'zstd -T0'` packing the same tree, in three cache states: warm (bake
#           cache and chunk cache from an identical earlier bake), upgrade (caches from a
#           bake where kubelet had other bytes) and cold (`--no-cache`);
#   same work: each baseline run beside the rest of what a cold bake does, by standard tools
#           (inflating the upstream archives, one sha256 + SHA1 pass over every file), to
#           show what the cold budget asks; with the CPU time (user + system) of every command;
#   memory: peak RSS of both bakes (GNU time), with >= 500 MiB of inputs.
#
# Inputs: a store and an unsigned lock whose artifacts are big ELF files (a whole real ELF,
# git, with real machine code from this machine's libraries appended), in upstream layouts.
# Env: KILN (default target/release/kiln), RUNS (default 3), SIZE_MIB (default 520).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
KILN=${KILN:-target/release/kiln}
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-520}   # sum of the artifact sizes below at scale 1
[ -x "$KILN" ] || cargo build --release -p kiln >/dev/null
for t in mksquashfs unsquashfs hyperfine zstd /usr/bin/time; do
  command -v "$t" >/dev/null || { echo "bench/bake.sh: $t missing (make deps)" >&2; exit 1; }
done
W=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench-bake.XXXXXX")
trap 'rm -rf "$W"' EXIT

# A pool of real machine code to cut the artifacts from.
pool=$W/pool
find /usr/lib/x86_64-linux-gnu /usr/bin /usr/libexec -type f -size +200k 2>/dev/null | sort |
  head -400 | xargs cat > "$pool" 2>/dev/null || true
pool_size=$(stat -c %s "$pool")
[ "$pool_size" -gt $(( 300 * 1048576 )) ] || { echo "bench/bake.sh: only $pool_size bytes of machine code found" >&2; exit 1; }
git_size=$(stat -c %s /usr/bin/git)
mk_elf() { # name size_mib: a whole real ELF (git) with machine code from the pool appended
  local out=$1 mib=$2 off=$(( ($RANDOM * 4096) % (pool_size / 2) ))
  local rest=$(( mib * 1048576 - git_size )); [ "$rest" -gt 0 ] || rest=1
  # head closes the pipe early on purpose: SIGPIPE upstream is expected.
  { cat /usr/bin/git; tail -c +"$off" "$pool" | head -c "$rest" || true; } > "$out"
}
scale() { local m=$(( $1 * SIZE_MIB / 508 )); echo $(( m < 1 ? 1 : m )); }
a=$W/art; mkdir -p "$a/ctd/bin" "$a/cni" "$a/crictl"
mk_elf "$a/kubelet" "$(scale 140)"; mk_elf "$a/kubeadm" "$(scale 90)"; mk_elf "$a/kubectl" "$(scale 70)"
mk_elf "$a/runc.amd64" "$(scale 15)"
mk_elf "$a/ctd/bin/containerd" "$(scale 70)"; mk_elf "$a/ctd/bin/containerd-shim-runc-v2" "$(scale 12)"; mk_elf "$a/ctd/bin/ctr" "$(scale 30)"
for p in bridge host-local loopback portmap bandwidth firewall; do mk_elf "$a/cni/$p" "$(scale 6)"; done
mk_elf "$a/crictl/crictl" "$(scale 45)"
mk_elf "$W/kiln-firstboot" 1
tar -C "$a/ctd" -czf "$a/containerd.tar.gz" bin
tar -C "$a/cni" -czf "$a/cni.tgz" ./bridge ./host-local ./loopback ./portmap ./bandwidth ./firewall
tar -C "$a/crictl" -czf "$a/crictl.tar.gz" crictl
total=$(du -cb "$a/kubelet" "$a/kubeadm" "$a/kubectl" "$a/runc.amd64" "$a/ctd/bin" "$a/cni" "$a/crictl" | tail -1 | cut -f1)

store=$W/store; mkdir -p "$store/blobs/sha256" "$store/index"
lock=$W/artifacts.lock; echo "version = 1" > "$lock"
entry() { # name version format file members...
  local name=$1 ver=$2 fmt=$3 file=$4; shift 4
  local sha; sha=$(sha256sum "$file" | cut -d' ' -f1)
  cp "$file" "$store/blobs/sha256/$sha"
  printf '\n[[artifact]]\nname = "%s"\nversion = "%s"\nos = "linux"\narch = "amd64"\nformat = "%s"\nurl = "https://bench.invalid/%s"\nsize = %s\nsha256 = "%s"\nverified = "bench input"\n' \
    "$name" "$ver" "$fmt" "$(basename "$file")" "$(stat -c %s "$file")" "$sha" >> "$lock"
  for m in "$@"; do printf '[[artifact.members]]\nfrom = "%s"\nto = "%s"\n' "${m%%=*}" "${m#*=}" >> "$lock"; done
}
# kube* carry the images' kubernetes.version (bake requires them equal); the rest are labels.
kv=$(awk -F'"' '/^\[/ { k = ($0 == "[kubernetes]") } k && /^version *=/ { print $2; exit }' images/ubuntu.toml)
entry kubelet "$kv" binary "$a/kubelet" kubelet=bin/kubelet
entry kubeadm "$kv" binary "$a/kubeadm" kubeadm=bin/kubeadm
entry kubectl "$kv" binary "$a/kubectl" kubectl=bin/kubectl
entry runc 1.5.1 binary "$a/runc.amd64" runc.amd64=bin/runc
entry containerd 2.3.4 tar.gz "$a/containerd.tar.gz" bin/containerd=bin/containerd bin/containerd-shim-runc-v2=bin/containerd-shim-runc-v2 bin/ctr=bin/ctr
entry cni-plugins 1.9.1 tar.gz "$a/cni.tgz" ./bridge=libexec/cni/bridge ./host-local=libexec/cni/host-local ./loopback=libexec/cni/loopback ./portmap=libexec/cni/portmap ./bandwidth=libexec/cni/bandwidth ./firewall=libexec/cni/firewall
entry crictl 1.36.0 tar.gz "$a/crictl.tar.gz" crictl=bin/crictl
# The same lock with a kubelet of other bytes: the bake before an upgrade.
lock_old=$W/artifacts-old.lock; mk_elf "$a/kubelet-old" "$(scale 140)"
# (mk_elf makes both the same size, so only the digest differs.)
sed "s/$(sha256sum "$a/kubelet" | cut -d' ' -f1)/$(sha256sum "$a/kubelet-old" | cut -d' ' -f1)/" "$lock" > "$lock_old"
cp "$a/kubelet-old" "$store/blobs/sha256/$(sha256sum "$a/kubelet-old" | cut -d' ' -f1)"

bake() { # format image out [extra flags: default --cache $W/cache]
  [ $# -gt 3 ] || set -- "$@" --cache "$W/cache"
  "$KILN" -q bake "images/$2.toml" --format "$1" --arch amd64 --out "$3" --lock "$lock" \
    --allow-unsigned --store "$store" --firstboot "$W/kiln-firstboot" "${@:4}"
}
export SOURCE_DATE_EPOCH=1704067200
bake sysext flatcar "$W/warm" >/dev/null   # warm the page cache and the bake cache
bake rootfs ubuntu "$W/warm" >/dev/null
# The upgrade's starting point: caches filled by a bake of the old kubelet only. Each timed
# run starts from a hard-linked copy (entries are replaced by rename, never edited).
lock=$lock_old bake rootfs ubuntu "$W/old" --cache "$W/cache-old" >/dev/null
lock=$lock_old bake sysext flatcar "$W/old" --cache "$W/cache-old" >/dev/null
raw=$W/warm/kubernetes-$kv-x86-64.raw
tree=$W/tree; unsquashfs -q -d "$tree" "$raw" >/dev/null
tree2=$W/tree2; mkdir -p "$tree2"; tar --zstd -xf "$W/warm/ubuntu-$kv-amd64.tar.zst" -C "$tree2"
echo "inputs: $(( total / 1048576 )) MiB of binaries in $(ls "$store/blobs/sha256" | wc -l) artifacts; sysext tree $(du -sm "$tree" | cut -f1) MiB"

export KILN W lock store
# The work a cold bake does that packing an extracted tree does not, done by standard tools
# beside the baseline on the same cores: inflating the three upstream archives (`gzip -dc`)
# and one sha256 + SHA1 pass over every file (Python's hashlib: OpenSSL's SHA-NI code). Not a
# budget: it shows what the cold budget asks of any tool that starts from upstream archives.
same_work() { # TREE BASELINE-COMMAND...
  local tree=$1 p1 p2; shift
  # Each side fails loudly: a gzip that fails, or a tree with nothing to hash, is no floor.
  ( for f in "$a/containerd.tar.gz" "$a/cni.tgz" "$a/crictl.tar.gz"; do gzip -dc "$f" >/dev/null || exit 1; done ) & p1=$!
  python3 -c 'import hashlib, os, sys
n_bytes = 0
for root, _, names in os.walk(sys.argv[1]):
    for n in names:
        p = os.path.join(root, n)
        if os.path.islink(p):
            continue
        s2, s1 = hashlib.sha256(), hashlib.sha1()
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                s2.update(chunk); s1.update(chunk); n_bytes += len(chunk)
sys.exit(0 if n_bytes else f"same_work: nothing to hash in {sys.argv[1]}")' "$tree" & p2=$!
  local r=0
  "$@" || r=1
  wait "$p1" || r=1
  wait "$p2" || r=1
  return "$r"
}
export a
hyperfine -S bash --style basic --runs "$RUNS" --export-json "$W/sysext.json" \
  -p true -n "mksquashfs (same tree, zstd)" "mksquashfs $tree $W/base.raw -noappend -quiet -no-progress -no-xattrs -all-root -comp zstd -b 131072" \
  -p true -n "kiln bake --format sysext (warm)" "$(declare -f bake); bake sysext flatcar $W/o1" \
  -p "rm -rf $W/cache-up && cp -al $W/cache-old $W/cache-up" \
  -n "kiln bake --format sysext (upgrade: new kubelet)" "$(declare -f bake); bake sysext flatcar $W/o8 --cache $W/cache-up" \
  -p true -n "kiln bake --format sysext --no-cache (cold)" "$(declare -f bake); bake sysext flatcar $W/o5 --no-cache" \
  -p true -n "mksquashfs + the cold bake's other work by standard tools" "$(declare -f same_work); same_work $tree mksquashfs $tree $W/base4.raw -noappend -quiet -no-progress -no-xattrs -all-root -comp zstd -b 131072"
hyperfine -S bash --style basic --runs "$RUNS" --export-json "$W/rootfs.json" \
  -p true -n "tar -I 'zstd -T0' (same tree)" "tar -I 'zstd -T0' -cf $W/base.tar.zst -C $tree2 ." \
  -p true -n "kiln bake --format rootfs (warm)" "$(declare -f bake); bake rootfs ubuntu $W/o2" \
  -p "rm -rf $W/cache-up && cp -al $W/cache-old $W/cache-up" \
  -n "kiln bake --format rootfs (upgrade: new kubelet)" "$(declare -f bake); bake rootfs ubuntu $W/o7 --cache $W/cache-up" \
  -p true -n "kiln bake --format rootfs --no-cache (cold)" "$(declare -f bake); bake rootfs ubuntu $W/o6 --no-cache" \
  -p true -n "tar zstd + the cold bake's other work by standard tools" "$(declare -f same_work); same_work $tree2 tar -I 'zstd -T0' -cf $W/base4.tar.zst -C $tree2 ."
rss() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -1; }
rratio() { python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']; i=int(sys.argv[2]); print(f'{r[i][\"mean\"]:.2f} s ± {r[i][\"stddev\"] or 0:.2f} vs {r[0][\"mean\"]:.2f} s ± {r[0][\"stddev\"] or 0:.2f}: ratio {r[i][\"mean\"]/r[0][\"mean\"]:.2f}x')" "$1" "$2"; }
ratio_of() { python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']; print(r[int(sys.argv[2])]['mean']/r[0]['mean'])" "$1" "$2"; }
# Warm and upgrade bakes reuse kiln's caches while the baseline compresses everything: they
# are labelled "with cache"; only the cold bake (--no-cache) is like for like.
# 0 the baseline, 1 warm, 2 upgrade, 3 cold, 4 the baseline + the same other work
record_hyperfine "$W/sysext.json" sysext.time
record_hyperfine "$W/rootfs.json" rootfs.time
record_hyperfine_cpu "$W/sysext.json" sysext.cpu
record_hyperfine_cpu "$W/rootfs.json" rootfs.cpu
for f in sysext rootfs; do
  record "$f.ratio.warm_with_cache" "$(ratio_of "$W/$f.json" 1)" x "<= 1.0"
  record "$f.ratio.upgrade_with_cache" "$(ratio_of "$W/$f.json" 2)" x "<= 1.0"
  record "$f.ratio.cold_like_for_like" "$(ratio_of "$W/$f.json" 3)" x "<= 1.0"
  record "$f.ratio.same_work_by_standard_tools" "$(ratio_of "$W/$f.json" 4)" x
  record "$f.ratio.cold_over_same_work" "$(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']; print(r[3]['mean']/r[4]['mean'])" "$W/$f.json")" x
done
echo "sysext warm (with kiln's cache; the baseline has none): $(rratio "$W/sysext.json" 1) (budget <= 1.0x)"
echo "sysext upgrade (with the cache of the previous bake): $(rratio "$W/sysext.json" 2) (budget <= 1.0x)"
echo "sysext cold (no cache, like for like): $(rratio "$W/sysext.json" 3) (budget <= 1.0x)"
echo "sysext: mksquashfs + the cold bake's other work by standard tools: $(rratio "$W/sysext.json" 4)"
cmp -s "$W/o1/kubernetes-$kv-x86-64.raw" "$W/o5/kubernetes-$kv-x86-64.raw" || { echo "bench/bake.sh: warm and cold sysext differ" >&2; exit 1; }
echo "sysext size: kiln $(stat -c %s "$W/o1/kubernetes-$kv-x86-64.raw") bytes vs mksquashfs $(stat -c %s "$W/base.raw") bytes"
echo "rootfs warm (with kiln's cache; the baseline has none): $(rratio "$W/rootfs.json" 1) (budget <= 1.0x)"
echo "rootfs upgrade (with the cache of the previous bake): $(rratio "$W/rootfs.json" 2) (budget <= 1.0x)"
echo "rootfs cold (no cache, like for like): $(rratio "$W/rootfs.json" 3) (budget <= 1.0x)"
echo "rootfs: tar zstd + the cold bake's other work by standard tools: $(rratio "$W/rootfs.json" 4)"
record sysext.bytes.kiln "$(stat -c %s "$W/o1/kubernetes-$kv-x86-64.raw")" bytes
record sysext.bytes.mksquashfs "$(stat -c %s "$W/base.raw")" bytes
kz=$(stat -c %s "$W/o2/ubuntu-$kv-amd64.tar.zst")
frames=$(zstd -lv "$W/o2/ubuntu-$kv-amd64.tar.zst" 2>/dev/null | sed -n 's/# Zstandard Frames: //p')
for z in "-T0" "--single-thread"; do # the same tar stream as one frame, both zstd modes
  one=$(zstd -dcq "$W/o2/ubuntu-$kv-amd64.tar.zst" | zstd -3 "$z" -q -c | wc -c)
  echo "rootfs size: kiln $kz bytes ($frames frames) vs one zstd -3 $z frame of the same tar stream $one bytes: $(python3 -c "print(f'{($kz/$one-1)*100:+.2f} %')")"
done
# Attestation (issue 39): a warm rootfs bake that also signs (provenance, the layer's
# signature, the DSSE envelope) and `kiln verify --rebuild` of that layer (a warm rebuild,
# the same bake cache through KILN_BAKE_CACHE, plus comparing the bytes), each against the
# warm bake alone. Budgets: signing <= 1.02x, verify --rebuild <= 1.1x.
"$KILN" -q key generate "$W/attest"
bake rootfs ubuntu "$W/a2" --cache "$W/cache" --attest-key "$W/attest.key" >/dev/null
hyperfine -S bash --style basic --runs "$RUNS" --export-json "$W/attest.json" \
  -n "kiln bake --format rootfs (warm)" "$(declare -f bake); bake rootfs ubuntu $W/a1" \
  -n "kiln bake --format rootfs (warm) --attest-key" "$(declare -f bake); bake rootfs ubuntu $W/a2 --cache $W/cache --attest-key $W/attest.key" \
  -n "kiln verify --rebuild (warm)" "KILN_BAKE_CACHE=$W/cache $KILN -q verify --rebuild $W/a2/ubuntu-$kv-amd64.tar.zst --lock $lock --allow-unsigned --store $store --firstboot $W/kiln-firstboot"
record_hyperfine "$W/attest.json" attest.time
record attest.ratio.sign_and_provenance "$(ratio_of "$W/attest.json" 1)" x "<= 1.02"
record attest.ratio.verify_rebuild "$(ratio_of "$W/attest.json" 2)" x "<= 1.1"
echo "rootfs warm with --attest-key: $(rratio "$W/attest.json" 1) (budget <= 1.02x)"
echo "kiln verify --rebuild, warm: $(rratio "$W/attest.json" 2) (budget <= 1.1x)"
# The signed sysext (issue 39, --sysext-ddi): a warm sysext bake that also writes the DDI
# (the squashfs copied into the image, its dm-verity tree hashed, the root hash signed),
# against the same warm sysext bake with --attest-key alone. Budget <= 1.15x.
bake sysext flatcar "$W/d1" --cache "$W/cache" --attest-key "$W/attest.key" >/dev/null
bake sysext flatcar "$W/d2" --cache "$W/cache" --attest-key "$W/attest.key" --sysext-ddi >/dev/null
hyperfine -S bash --style basic --runs "$RUNS" --export-json "$W/ddi.json" \
  -n "kiln bake --format sysext (warm) --attest-key" "$(declare -f bake); bake sysext flatcar $W/d1 --cache $W/cache --attest-key $W/attest.key" \
  -n "kiln bake --format sysext (warm) --attest-key --sysext-ddi" "$(declare -f bake); bake sysext flatcar $W/d2 --cache $W/cache --attest-key $W/attest.key --sysext-ddi"
record_hyperfine "$W/ddi.json" ddi.time
record ddi.ratio.signed_image "$(ratio_of "$W/ddi.json" 1)" x "<= 1.15"
echo "sysext warm with --sysext-ddi: $(rratio "$W/ddi.json" 1) (budget <= 1.15x)"
peak() { # METRIC LABEL COMMAND...: print and record one peak RSS
  local metric=$1 label=$2 kib; shift 2
  kib=$(rss "$@")
  echo "peak RSS $label: $((kib / 1024)) MiB"
  case "$metric" in kiln.*) record "rss.$metric" "$kib" KiB "<= 262144" ;; *) record "rss.$metric" "$kib" KiB ;; esac
}
bake_args=(--arch amd64 --lock "$lock" --allow-unsigned --store "$store" --firstboot "$W/kiln-firstboot")
peak kiln.sysext_cold "kiln bake sysext (budget <= 256 MiB; cold, no cache; the whole bake, one process)" \
  "$KILN" -q bake images/flatcar.toml --format sysext --out "$W/o3" "${bake_args[@]}" --no-cache
peak kiln.sysext_warm "kiln bake sysext (budget <= 256 MiB; warm cache)" \
  "$KILN" -q bake images/flatcar.toml --format sysext --out "$W/o3" "${bake_args[@]}" --cache "$W/cache"
peak mksquashfs "mksquashfs" mksquashfs "$tree" "$W/base2.raw" -noappend -quiet -no-progress -no-xattrs -all-root -comp zstd
peak kiln.rootfs_cold "kiln bake rootfs (budget <= 256 MiB; cold, no cache)" \
  "$KILN" -q bake images/ubuntu.toml --format rootfs --out "$W/o4" "${bake_args[@]}" --no-cache
peak kiln.rootfs_warm "kiln bake rootfs (budget <= 256 MiB; warm cache)" \
  "$KILN" -q bake images/ubuntu.toml --format rootfs --out "$W/o4" "${bake_args[@]}" --cache "$W/cache"
peak tar_zstd "tar -I 'zstd -T0'" tar -I 'zstd -T0' -cf "$W/base3.tar.zst" -C "$tree2" .
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
