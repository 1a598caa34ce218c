#!/usr/bin/env bash
# bench/image.sh: `kiln image` against `qemu-img convert` of the same base to the same
# format, side by side in one run (docs/benchmarks.md, issue 19). The baseline is the floor:
# reading the base and writing the output once, with no partition table, mount or install.
#
# Base: a 2 GiB GPT disk (1 MiB ESP, the rest an x86-64 root ext4 filled by mkfs.ext4 -d with
# DATA_MIB of this machine's binaries), as qcow2 (what cloud vendors ship) and as raw.
# Layer: a stand-in of the ubuntu layer's shape and size (an install manifest, image.env,
# LAYER_MIB of ELF content in usr/bin, 8 MiB zstd frames), with its SHA256SUMS: baking the real one needs the
# artifact store that bench/bake.sh builds.
# A third command converts a disk holding the same content as kiln's output (kiln's output
# itself, made once in the base's format): what writing OUT's bytes costs qemu-img.
# Needs root (kiln image's loop mount). Env: KILN (default target/release/kiln), RUNS
# (default 3), DATA_MIB (default 400), LAYER_MIB (default 300).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
KILN=${KILN:-target/release/kiln}
RUNS=${RUNS:-3}
DATA_MIB=${DATA_MIB:-400}
LAYER_MIB=${LAYER_MIB:-300}
[ -x "$KILN" ] || cargo build --release -p kiln >/dev/null
for t in qemu-img sgdisk mkfs.ext4 hyperfine zstd /usr/bin/time; do
  command -v "$t" >/dev/null || { echo "bench/image.sh: $t missing (make deps)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "bench/image.sh: kiln image needs root (loop devices)" >&2; exit 1; }
W=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench-image.XXXXXX")
trap 'rm -rf "$W"' EXIT

# The base's root tree: real binaries up to DATA_MIB.
mkdir -p "$W/tree/usr/bin" "$W/tree/etc" "$W/tree/usr/lib/systemd/system" "$W/tree/etc/systemd/system"
n=0; budget=$((DATA_MIB * 1048576))
while IFS= read -r f; do
  s=$(stat -c %s "$f"); [ $((n + s)) -le "$budget" ] || break
  cp "$f" "$W/tree/usr/bin/$(basename "$f").$n"; n=$((n + s))
done < <(find /usr/lib/x86_64-linux-gnu /usr/bin /usr/libexec -type f -size +64k 2>/dev/null | sort)
truncate -s 2G "$W/base.raw"
sgdisk -n1:2048:+1M -t1:EF00 -n2:4096:0 -t2:4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709 -c2:root "$W/base.raw" >/dev/null
start=$(sgdisk -i2 "$W/base.raw" | awk '/First sector/ {print $3}')
end=$(sgdisk -i2 "$W/base.raw" | awk '/Last sector/ {print $3}')
mkfs.ext4 -q -F -L root -d "$W/tree" "$W/root.ext4" $(( (end - start + 1) / 2 ))k
dd if="$W/root.ext4" of="$W/base.raw" bs=512 seek="$start" conv=notrunc,sparse status=none
rm -rf "$W/tree" "$W/root.ext4"
qemu-img convert -f raw -O qcow2 "$W/base.raw" "$W/base.qcow2"

# The layer.
python3 - "$W" "$LAYER_MIB" <<'PY'
import hashlib, io, os, sys, tarfile
w, mib = sys.argv[1], int(sys.argv[2])
pool = [os.path.join(d, f) for d in ("/usr/bin", "/usr/lib/x86_64-linux-gnu") for f in sorted(os.listdir(d))]
files, total, i = {}, 0, 0
for p in pool:
    if total >= mib << 20 or not os.path.isfile(p) or os.path.islink(p):
        continue
    b = open(p, "rb").read()
    if len(b) < 65536:
        continue
    files[f"usr/bin/kiln-bench-{i}"] = (b, 0o755); total += len(b); i += 1
files["usr/lib/kiln/image.env"] = (b"KILN_IMAGE_ID=sha256:bench\n", 0o644)
man = "# kiln install manifest v1: sha256  mode  path\n" + "".join(
    f"{hashlib.sha256(c).hexdigest()}  {m:04o}  /{p}\n" for p, (c, m) in sorted(files.items()))
files["usr/lib/kiln/install.manifest"] = (man.encode(), 0o644)
with tarfile.open(os.path.join(w, "layer.tar"), "w", format=tarfile.GNU_FORMAT) as t:
    for d in ("usr", "usr/bin", "usr/lib", "usr/lib/kiln"):
        ti = tarfile.TarInfo(d); ti.type = tarfile.DIRTYPE; ti.mode = 0o755; t.addfile(ti)
    for p, (c, m) in sorted(files.items()):
        ti = tarfile.TarInfo(p); ti.size = len(c); ti.mode = m; t.addfile(ti, io.BytesIO(c))
PY
# Framed as kiln frames a rootfs layer: independent zstd frames of 8 MiB of tar each, each
# stating its size (builder/src/bake/rootfs.rs), so kiln image can skip big files' frames.
(cd "$W" && split -b 8M -d -a 4 layer.tar part. && for p in part.*; do zstd -q -3 --rm "$p"; done \
  && cat part.*.zst > layer.tar.zst && rm -f part.*.zst layer.tar)
(cd "$W" && sha256sum layer.tar.zst > SHA256SUMS)
layer_bytes=$(stat -c %s "$W/layer.tar.zst")
echo "base: 2 GiB, $((n >> 20)) MiB of files in its root; layer: $((layer_bytes >> 20)) MiB compressed"

mkdir -p "$W/o"
for case in "qcow2 qcow2 qcow2" "raw raw raw" "qcow2 vmdk vmdk"; do
  set -- $case; in=$1 fmt=$2 drv=$3
  [ "$drv" = vmdk ] && opt=(-o subformat=streamOptimized) || opt=()
  # The same convert of a disk that already holds what kiln's output holds (the base's data
  # and the layer: kiln's own output, in the base's format): the floor for the bytes OUT
  # really carries, beside the issue's floor, which converts the base alone.
  [ -f "$W/node.$in" ] || "$KILN" -q image --base "$W/base.$in" --layer "$W/layer.tar.zst" --out "$W/node.$in" --format "$in" >/dev/null
  hyperfine -N --runs "$RUNS" --export-json "$W/h.json" \
    --prepare "rm -f $W/o/k.$fmt $W/o/q.$fmt $W/o/n.$fmt" \
    "$KILN -q image --base $W/base.$in --layer $W/layer.tar.zst --out $W/o/k.$fmt --format $fmt" \
    "qemu-img convert -f $in -O $drv ${opt[*]} $W/base.$in $W/o/q.$fmt" \
    "qemu-img convert -f $in -O $drv ${opt[*]} $W/node.$in $W/o/n.$fmt"
  record_hyperfine "$W/h.json" "$in-to-$fmt"
  ratio=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"]; print(round(r[0]["median"]/r[1]["median"],3))' "$W/h.json")
  same=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"]; print(round(r[0]["median"]/r[2]["median"],3))' "$W/h.json")
  record "$in-to-$fmt.ratio_kiln_over_qemu_img" "$ratio" x "<= 1.2"
  record "$in-to-$fmt.ratio_kiln_over_convert_of_same_content" "$same" x
  echo "$in -> $fmt: kiln image / qemu-img convert of the base = ${ratio}x, / of a disk with the same content = ${same}x (medians of $RUNS)"
done
rm -f "$W/o/k.qcow2"
kib=$(/usr/bin/time -f %M "$KILN" -q image --base "$W/base.qcow2" --layer "$W/layer.tar.zst" --out "$W/o/k.qcow2" 2>&1 >/dev/null | tail -1)
record "rss.kiln_image_kib" "$kib" KiB "<= 262144"
echo "peak RSS of kiln image: $kib KiB"
