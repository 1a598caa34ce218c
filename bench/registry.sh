#!/usr/bin/env bash
# A registry as the mirror (issue 16), side by side with skopeo in this one run, against
# Debian's docker-registry on 127.0.0.1 (plain HTTP, no auth: the registry's own cost, not
# TLS's, is what both clients share):
#
#  1. `kiln mirror push` of a mirror of REG_FILES files x REG_FILE_MIB MiB (random bytes) into
#     an empty repository, vs `skopeo copy` of one OCI image whose layers are the same files
#     (same bytes, same number of blobs) into another empty repository (`--preserve-digests`:
#     skopeo would otherwise gzip uncompressed layers on their way to a registry);
#  2. the same push again with nothing new (budget: < 1 s), median of 5;
#  3. `kiln mirror sync --from oci://` into an empty directory (every blob hashed, fsynced,
#     the lock verified) vs `skopeo copy docker://… dir:` of the image (budget >= 1.0x
#     skopeo's throughput), and kiln's peak RSS during it (budget <= 64 MiB);
#  4. the same sync again with nothing new.
#
#   bench/registry.sh            (REG_FILES=8 REG_FILE_MIB=32 REG_ROUNDS=3 to tune)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
root=$PWD
kiln=${KILN_BIN:-$root/target/release/kiln}
[ -x "$kiln" ] || cargo build -q --release -p kiln
files=${REG_FILES:-8}
mib=${REG_FILE_MIB:-32}
rounds=${REG_ROUNDS:-3}

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench-registry.XXXXXX")
reg=
cleanup() {
  if [ -n "$reg" ]; then kill "$reg" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# The mirror (blobs + signed lock) and an OCI layout holding the same files as one image.
m=$work/mirror
lay=$work/layout
mkdir -p "$m/blobs/sha256" "$lay/blobs/sha256" "$work/keys"
minisign -G -W -p "$work/keys/b.pub" -s "$work/keys/b.key" >/dev/null
python3 - "$m" "$lay" "$files" "$mib" <<'PY'
import hashlib, json, os, sys
m, lay, n, mib = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
lock = ["version = 1"]
layers = []
for i in range(n):
    data = os.urandom(mib << 20)
    h = hashlib.sha256(data).hexdigest()
    for d in (m, lay):
        open(os.path.join(d, "blobs/sha256", h), "wb").write(data)
    lock.append(f'''
[[artifact]]
name = "f{i:02d}"
version = "1"
os = "linux"
arch = "amd64"
format = "binary"
url = "https://example.invalid/f{i:02d}.bin"
size = {len(data)}
sha256 = "{h}"
verified = "bench data"
members = [{{ from = "f{i:02d}.bin", to = "bin/f{i:02d}" }}]''')
    layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": "sha256:" + h, "size": len(data)})
open(os.path.join(m, "artifacts.lock"), "w").write("\n".join(lock) + "\n")
def put(b):
    h = hashlib.sha256(b).hexdigest()
    open(os.path.join(lay, "blobs/sha256", h), "wb").write(b)
    return {"digest": "sha256:" + h, "size": len(b)}
cfg = put(json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [l["digest"] for l in layers]}}).encode())
man = put(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                      "config": dict(cfg, mediaType="application/vnd.oci.image.config.v1+json"), "layers": layers}).encode())
open(os.path.join(lay, "oci-layout"), "w").write('{"imageLayoutVersion":"1.0.0"}')
open(os.path.join(lay, "index.json"), "w").write(json.dumps({"schemaVersion": 2, "manifests": [
    dict(man, mediaType="application/vnd.oci.image.manifest.v1+json", annotations={"org.opencontainers.image.ref.name": "bench"})]}))
PY
quiet_key() { grep -v 'trusting minisign key' >&2 || true; }
"$kiln" --quiet lock sign "$m/artifacts.lock" --secret-key "$work/keys/b.key" 2> >(quiet_key)
total=$((files * mib * 1024 * 1024))

# A fresh registry for each round: skopeo remembers where it pushed a blob (its blob-info
# cache) and mounts it from there instead of uploading, which kiln does not do; an empty
# registry makes both upload every byte.
start_reg() { # ROUND
  if [ -n "$reg" ]; then kill "$reg" 2>/dev/null || true; wait "$reg" 2>/dev/null || true; fi
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  host=127.0.0.1:$port
  printf 'version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n' \
    "$work/regdata$1" "$host" >"$work/reg.yml"
  docker-registry serve "$work/reg.yml" >"$work/reg.log" 2>&1 &
  reg=$!
  for _ in $(seq 200); do curl -fsS "http://$host/v2/" >/dev/null 2>&1 && break; sleep 0.05; done
}

now() { date +%s.%N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
k() { "$kiln" --quiet "$@" --registry-plain-http "$host" --trusted-key "$work/keys/b.pub" 2> >(quiet_key); }

echo "data: $files files x $mib MiB = $((total >> 20)) MiB; registry: docker-registry $(docker-registry --version | awk '{print $3}') on 127.0.0.1, a fresh one per round"
kp=() sp=() rp=() ks=() ss=() rs=() rss=()
for r in $(seq "$rounds"); do
  start_reg "$r"
  rm -rf "$work/regdata$((r - 1))"
  sync
  t0=$(now); k mirror push "$m" --to "oci://$host/bench/kiln$r"; t1=$(now)
  kp+=("$(echo "$t1 - $t0" | bc -l)")
  sync
  t0=$(now); skopeo copy --quiet --preserve-digests --dest-tls-verify=false "oci:$lay:bench" "docker://$host/bench/skopeo$r:bench"; t1=$(now)
  sp+=("$(echo "$t1 - $t0" | bc -l)")
  for _ in 1 2 3 4 5; do
    t0=$(now); k mirror push "$m" --to "oci://$host/bench/kiln$r"; t1=$(now)
    rp+=("$(echo "$t1 - $t0" | bc -l)")
  done
  rm -rf "$work/back" "$work/sk"
  sync
  t0=$(now)
  /usr/bin/time -f '%M' -o "$work/rss" "$kiln" --quiet mirror sync --from "oci://$host/bench/kiln$r" --to "$work/back" \
    --registry-plain-http "$host" --trusted-key "$work/keys/b.pub" 2> >(quiet_key)
  t1=$(now)
  ks+=("$(echo "$t1 - $t0" | bc -l)")
  rss+=("$(tail -1 "$work/rss")")
  sync
  t0=$(now); skopeo copy --quiet --src-tls-verify=false "docker://$host/bench/skopeo$r:bench" "dir:$work/sk"; t1=$(now)
  ss+=("$(echo "$t1 - $t0" | bc -l)")
  for _ in 1 2 3; do
    t0=$(now); k mirror sync --from "oci://$host/bench/kiln$r" --to "$work/back"; t1=$(now)
    rs+=("$(echo "$t1 - $t0" | bc -l)")
  done
done
"$kiln" --quiet mirror verify "$work/back" --trusted-key "$work/keys/b.pub" 2> >(quiet_key)
echo "   push (s): kiln ${kp[*]} | skopeo ${sp[*]}; re-push (s): ${rp[*]}"
echo "   sync (s): kiln ${ks[*]} | skopeo ${ss[*]}; re-sync (s): ${rs[*]}; kiln RSS (KiB): ${rss[*]}"
kpm=$(printf '%s\n' "${kp[@]}" | median)
spm=$(printf '%s\n' "${sp[@]}" | median)
rpm=$(printf '%s\n' "${rp[@]}" | median)
ksm=$(printf '%s\n' "${ks[@]}" | median)
ssm=$(printf '%s\n' "${ss[@]}" | median)
rsm=$(printf '%s\n' "${rs[@]}" | median)
rssm=$(printf '%s\n' "${rss[@]}" | sort -n | tail -1)
printf 'push %d MiB: kiln %.2fs | skopeo %.2fs | ratio %.2fx; re-push %.3fs (budget < 1)\n' \
  $((total >> 20)) "$kpm" "$spm" "$(echo "$spm / $kpm" | bc -l)" "$rpm"
printf 'sync %d MiB: kiln %.2fs | skopeo %.2fs | ratio %.2fx (budget >= 1.0); re-sync %.3fs; peak RSS %d KiB\n' \
  $((total >> 20)) "$ksm" "$ssm" "$(echo "$ssm / $ksm" | bc -l)" "$rsm" "$rssm"
record push.kiln_s "$(printf %.3f "$kpm")" s
record push.skopeo_s "$(printf %.3f "$spm")" s
record push.ratio_vs_skopeo "$(printf %.3f "$(echo "$spm / $kpm" | bc -l)")" x
record repush.kiln_s "$(printf %.4f "$rpm")" s "<= 1"
record sync.kiln_s "$(printf %.3f "$ksm")" s
record sync.skopeo_s "$(printf %.3f "$ssm")" s
record sync.ratio_vs_skopeo "$(printf %.3f "$(echo "$ssm / $ksm" | bc -l)")" x ">= 1.0"
record resync.kiln_s "$(printf %.4f "$rsm")" s "<= 1"
record sync_rss.kiln_kib "$rssm" KiB "<= 65536"
