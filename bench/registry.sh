#!/usr/bin/env bash
# A registry as the mirror (issue 16), side by side with skopeo in this one run, against
# Debian's docker-registry on 127.0.0.1 with TLS from a throwaway test CA and htpasswd auth,
# as in builder/tests/support/registry.rs. The data is a signed kiln mirror of file
# artifacts and OCI images (REG_FILES x REG_FILE_MIB MiB of random files, REG_IMAGES images
# of REG_IMAGE_LAYERS tar layers x REG_LAYER_MIB MiB; 1 GiB by default), and for skopeo an
# OCI layout holding the same blobs: one image whose layers are the files, and the same
# image indexes. Each round, on a fresh registry:
#
#  1. `kiln mirror push` into an empty repository vs skopeo copying every image of the
#     layout into another (`--all --preserve-digests`, the copies run concurrently);
#  2. the same push again with nothing new (budget: < 1 s), 5 times;
#  3. `kiln mirror sync --from oci://` into an empty directory vs `skopeo copy --all
#     docker://… dir:` of each image (concurrently) (budget >= 1.0x skopeo), and kiln's
#     peak RSS during it (budget <= 64 MiB);
#  4. the same sync again with nothing new, 3 times;
#  5. both syncs again from a second, plain-HTTP, anonymous registry serving the same
#     storage (a label-only figure: what TLS and auth cost).
#
# Once, after the rounds: a sync through a loopback proxy that counts the bytes the
# registry sends, SIGKILLed once REG_KILL_PCT % of the content has landed, then run again to
# the end; the bytes served across both runs / the content's bytes (budget <= 1.05).
#
#   bench/registry.sh   (REG_FILES=4 REG_FILE_MIB=128 REG_IMAGES=2 REG_IMAGE_LAYERS=4
#                        REG_LAYER_MIB=64 REG_ROUNDS=3 REG_KILL_PCT=50 to tune)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
root=$PWD
kiln=${KILN_BIN:-$root/target/release/kiln}
[ -x "$kiln" ] || cargo build -q --release -p kiln
files=${REG_FILES:-4}
file_mib=${REG_FILE_MIB:-128}
images=${REG_IMAGES:-2}
layers=${REG_IMAGE_LAYERS:-4}
layer_mib=${REG_LAYER_MIB:-64}
rounds=${REG_ROUNDS:-3}
kill_pct=${REG_KILL_PCT:-50}

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench-registry.XXXXXX")
pids=() # what the bench started and still runs: registries, the proxy, the sync it kills
stop_all() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop_all; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

# The mirror (blobs + signed lock + index.json) and an OCI layout holding the same blobs
# (hard links: one copy on disk) as the images skopeo copies: "files", "img0", "img1"…
m=$work/mirror
lay=$work/layout
mkdir -p "$m/blobs/sha256" "$lay/blobs/sha256" "$work/keys"
minisign -G -W -p "$work/keys/b.pub" -s "$work/keys/b.key" >/dev/null
python3 - "$m" "$lay" "$files" "$file_mib" "$images" "$layers" "$layer_mib" >"$work/tags" <<'PY'
import hashlib, io, json, os, sys, tarfile
m, lay = sys.argv[1:3]
files, file_mib, images, layers, layer_mib = map(int, sys.argv[3:8])
MAN = "application/vnd.oci.image.manifest.v1+json"
IDX = "application/vnd.oci.image.index.v1+json"
CFG = "application/vnd.oci.image.config.v1+json"
TAR = "application/vnd.oci.image.layer.v1.tar"

def put(b, mirror=True):
    h = hashlib.sha256(b).hexdigest()
    p = os.path.join(m if mirror else lay, "blobs/sha256", h)
    open(p, "wb").write(b)
    if mirror:
        os.link(p, os.path.join(lay, "blobs/sha256", h))
    return {"digest": "sha256:" + h, "size": len(b)}

def tar_layer(i, j):
    data = os.urandom(layer_mib << 20)
    ti = tarfile.TarInfo(f"img{i}/layer{j}.bin")
    ti.size, ti.mode = len(data), 0o644
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as t:
        t.addfile(ti, io.BytesIO(data))
    return out.getvalue()

def image(blobs, mirror):
    """config + manifest over `blobs` (uncompressed tar layers: diff_id = digest)."""
    cfg = put(json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {
        "type": "layers", "diff_ids": [b["digest"] for b in blobs]}}).encode(), mirror)
    return put(json.dumps({"schemaVersion": 2, "mediaType": MAN, "config": dict(cfg, mediaType=CFG),
                           "layers": [dict(b, mediaType=TAR) for b in blobs]}).encode(), mirror)

lock, file_blobs, mirror_index, layout_index = ["version = 1"], [], [], []
for i in range(files):
    b = put(os.urandom(file_mib << 20))
    file_blobs.append(b)
    lock.append(f'''
[[artifact]]
name = "f{i:02d}"
version = "1"
os = "linux"
arch = "amd64"
format = "binary"
url = "https://example.invalid/f{i:02d}.bin"
size = {b["size"]}
sha256 = "{b["digest"][7:]}"
verified = "bench data"
members = [{{ from = "f{i:02d}.bin", to = "bin/f{i:02d}" }}]''')
# skopeo's stand-in for the file artifacts: one image whose layers are the same blobs.
layout_index.append(dict(image(file_blobs, False), mediaType=MAN,
                         annotations={"org.opencontainers.image.ref.name": "files"}))
for i in range(images):
    man = image([put(tar_layer(i, j)) for j in range(layers)], True)
    idx = put(json.dumps({"schemaVersion": 2, "mediaType": IDX, "manifests": [dict(
        man, mediaType=MAN, platform={"architecture": "amd64", "os": "linux"})]}).encode())
    ref = f"bench.invalid/img{i}:1"
    lock.append(f'''
[[image]]
name = "img{i}"
reference = "{ref}"
digest = "{idx["digest"]}"
verified = "bench data"
platforms = [{{ os = "linux", arch = "amd64", digest = "{man["digest"]}" }}]''')
    mirror_index.append(dict(idx, mediaType=IDX, annotations={"org.opencontainers.image.ref.name": ref}))
    layout_index.append(dict(idx, mediaType=IDX, annotations={"org.opencontainers.image.ref.name": f"img{i}"}))
open(os.path.join(m, "artifacts.lock"), "w").write("\n".join(lock) + "\n")
for d, index in ((m, mirror_index), (lay, layout_index)):
    open(os.path.join(d, "oci-layout"), "w").write('{"imageLayoutVersion":"1.0.0"}')
    open(os.path.join(d, "index.json"), "w").write(json.dumps({"schemaVersion": 2, "manifests": index}))
print(" ".join(e["annotations"]["org.opencontainers.image.ref.name"] for e in layout_index))
PY
quiet_key() { grep -v 'trusting minisign key' >&2 || true; }
"$kiln" --quiet lock sign "$m/artifacts.lock" --secret-key "$work/keys/b.key" 2> >(quiet_key)
read -r -a tags <"$work/tags"
# every blob a sync fetches (the lock and its signature aside)
total=$(find "$m/blobs/sha256" -type f -printf '%s\n' | awk '{s += $1} END {print s}')

# The test CA, the registry's certificate for 127.0.0.1, an htpasswd user, skopeo's cert dir.
t=$work/tls
mkdir -p "$t/certs.d"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=kiln bench CA" \
  -keyout "$t/ca.key" -out "$t/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout "$t/server.key" -out "$t/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$t/san.ext"
openssl x509 -req -days 2 -CAcreateserial -in "$t/server.csr" -CA "$t/ca.pem" -CAkey "$t/ca.key" \
  -extfile "$t/san.ext" -out "$t/server.pem" 2>/dev/null
cp "$t/ca.pem" "$t/certs.d/ca.crt"
user=bench
pass=$(openssl rand -hex 12)
htpasswd -Bbn "$user" "$pass" >"$t/htpasswd"
export DOCKER_CONFIG=$work/docker # kiln reads $DOCKER_CONFIG/config.json: ours only
mkdir -p "$DOCKER_CONFIG"
auth_for() { # HOST... -> $DOCKER_CONFIG/config.json with the bench user for each
  python3 - "$DOCKER_CONFIG/config.json" "$user:$pass" "$@" <<'PY'
import base64, json, sys
path, cred, hosts = sys.argv[1], base64.b64encode(sys.argv[2].encode()).decode(), sys.argv[3:]
json.dump({"auths": {h: {"auth": cred} for h in hosts}}, open(path, "w"))
PY
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
serve() { # NAME DATA ADDR [TLS+AUTH YAML]: starts a docker-registry, waits for it to listen
  printf 'version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n%s' \
    "$2" "$3" "${4:-}" >"$work/$1.yml"
  docker-registry serve "$work/$1.yml" >"$work/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do
    if python3 -c 'import socket,sys; socket.create_connection(sys.argv[1].split(":"), 1)' "$3" 2>/dev/null; then return; fi
    sleep 0.05
  done
  echo "bench: docker-registry $1 did not listen on $3: $(cat "$work/$1.log")" >&2
  return 1
}
# A fresh registry for each round: skopeo remembers where it pushed a blob (its blob-info
# cache) and mounts it from there instead of uploading, which kiln does not do; an empty
# registry makes both upload every byte. A second one, plain HTTP and anonymous, serves the
# same storage for the plain-HTTP sync figure.
start_regs() { # ROUND
  stop_all
  rm -rf "$work/regdata"
  host=127.0.0.1:$(free_port)
  phost=127.0.0.1:$(free_port)
  serve tls "$work/regdata" "$host" "$(printf '  tls:\n    certificate: %s\n    key: %s\nauth:\n  htpasswd:\n    realm: kiln-bench\n    path: %s\n' \
    "$t/server.pem" "$t/server.key" "$t/htpasswd")"
  serve plain "$work/regdata" "$phost"
  auth_for "$host"
}

now() { date +%s.%N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
since() { echo "$(now) - $1" | bc -l; }
k() { "$kiln" --quiet "$@" --trusted-key "$work/keys/b.pub" 2> >(quiet_key); }
tls=(--registry-ca "$t/ca.pem") # kiln trusts the test CA; credentials: $DOCKER_CONFIG
skopeo_all() { # SRC-FLAGS-AND-PREFIX DST-PREFIX: copies every tag, concurrently; fails if one does
  local src=$1 dst=$2 tag ps=() p rc=0
  for tag in "${tags[@]}"; do
    # shellcheck disable=SC2086 # $src holds flags and the source prefix
    skopeo copy --quiet --all $src"$tag" "$dst$tag" &
    ps+=($!)
  done
  for p in "${ps[@]}"; do wait "$p" || rc=$?; done
  return "$rc"
}

echo "data: $files files x $file_mib MiB + $images images x $layers layers x $layer_mib MiB = $((total >> 20)) MiB of blobs;" \
  "registry: docker-registry $(docker-registry --version | awk '{print $3}') on 127.0.0.1, TLS (test CA) + htpasswd, a fresh one per round"
push_k=() push_s=() repush=() sync_k=() sync_s=() resync=() rss=() psync_k=() psync_s=()
for r in $(seq "$rounds"); do
  start_regs "$r"
  sync
  t0=$(now); k mirror push "$m" --to "oci://$host/bench/kiln" "${tls[@]}"; push_k+=("$(since "$t0")")
  sync
  t0=$(now)
  skopeo_all "--preserve-digests --dest-cert-dir $t/certs.d --dest-creds $user:$pass oci:$lay:" "docker://$host/bench/skopeo:"
  push_s+=("$(since "$t0")")
  for _ in 1 2 3 4 5; do
    t0=$(now); k mirror push "$m" --to "oci://$host/bench/kiln" "${tls[@]}"; repush+=("$(since "$t0")")
  done

  rm -rf "$work/back" "$work/sk"
  mkdir -p "$work/sk"
  sync
  t0=$(now)
  /usr/bin/time -f '%M' -o "$work/rss" "$kiln" --quiet mirror sync --from "oci://$host/bench/kiln" --to "$work/back" \
    "${tls[@]}" --trusted-key "$work/keys/b.pub" 2> >(quiet_key)
  sync_k+=("$(since "$t0")")
  rss+=("$(tail -1 "$work/rss")")
  sync
  t0=$(now)
  skopeo_all "--src-cert-dir $t/certs.d --src-creds $user:$pass docker://$host/bench/skopeo:" "dir:$work/sk/"
  sync_s+=("$(since "$t0")")
  for _ in 1 2 3; do
    t0=$(now); k mirror sync --from "oci://$host/bench/kiln" --to "$work/back" "${tls[@]}"; resync+=("$(since "$t0")")
  done
  k mirror verify "$work/back"

  rm -rf "$work/back" "$work/sk"
  mkdir -p "$work/sk"
  sync
  t0=$(now); k mirror sync --from "oci://$phost/bench/kiln" --to "$work/back" --registry-plain-http "$phost"
  psync_k+=("$(since "$t0")")
  sync
  t0=$(now); skopeo_all "--src-tls-verify=false docker://$phost/bench/skopeo:" "dir:$work/sk/"
  psync_s+=("$(since "$t0")")
  rm -rf "$work/back" "$work/sk"
done

# The interrupted sync, through a proxy that counts the bytes the TLS registry sends (TLS
# records and HTTP heads included) and writes "<bytes> <open connections>" to a file.
cat >"$work/count.py" <<'PY'
import os, socket, sys, threading
upstream, out = int(sys.argv[1]), sys.argv[2]
mu = threading.Lock()
served = active = 0
def report():
    open(out + ".tmp", "w").write(f"{served} {active}\n")
    os.replace(out + ".tmp", out)
def pump(src, dst, count):
    global served
    try:
        while b := src.recv(1 << 16):
            if count:
                with mu:
                    served += len(b)
            dst.sendall(b)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
def conn(c):
    global active
    try:
        u = socket.create_connection(("127.0.0.1", upstream))
        down = threading.Thread(target=pump, args=(u, c, True))
        down.start()
        pump(c, u, False)
        down.join()
        u.close()
    finally:
        c.close()
        with mu:
            active -= 1
            report()
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(64)
report()
open(out + ".port", "w").write(str(s.getsockname()[1]))
while True:
    c, _ = s.accept()
    with mu:
        active += 1
    threading.Thread(target=conn, args=(c,), daemon=True).start()
PY
python3 "$work/count.py" "${host##*:}" "$work/served" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/served.port" ] && break; sleep 0.05; done
chost=127.0.0.1:$(cat "$work/served.port")
auth_for "$host" "$chost"
settled() { # waits for the proxy to have no connection open, prints bytes served so far
  local b a
  for _ in $(seq 200); do
    read -r b a <"$work/served"
    if [ "$a" = 0 ]; then echo "$b"; return; fi
    sleep 0.05
  done
  echo "bench: the counting proxy still has connections open" >&2
  return 1
}
rm -rf "$work/back"
kill_at=$((total * kill_pct / 100))
# started as itself (not in a function or subshell) so that $! is kiln and the SIGKILL hits it
"$kiln" --quiet mirror sync --from "oci://$chost/bench/kiln" --to "$work/back" "${tls[@]}" \
  --trusted-key "$work/keys/b.pub" 2>"$work/victim.err" &
victim=$!
pids+=("$victim")
landed=0
while kill -0 "$victim" 2>/dev/null; do
  landed=$(du -sb --apparent-size "$work/back" 2>/dev/null | cut -f1 || echo 0)
  if [ "${landed:-0}" -ge "$kill_at" ]; then kill -KILL "$victim"; break; fi
  sleep 0.02
done
rc=0
wait "$victim" 2>/dev/null || rc=$? # (no "Killed" job notice)
if [ "$rc" -ne 137 ]; then
  echo "bench: the sync to interrupt ended by itself (exit $rc) before $kill_at bytes had landed: $(cat "$work/victim.err")" >&2
  exit 1
fi
first=$(settled)
k mirror sync --from "oci://$chost/bench/kiln" --to "$work/back" "${tls[@]}"
served=$(settled)
k mirror verify "$work/back"

echo "   push (s): kiln ${push_k[*]} | skopeo ${push_s[*]}; re-push (s): ${repush[*]}"
echo "   sync TLS (s): kiln ${sync_k[*]} | skopeo ${sync_s[*]}; re-sync (s): ${resync[*]}; kiln RSS (KiB): ${rss[*]}"
echo "   sync plain HTTP (s): kiln ${psync_k[*]} | skopeo ${psync_s[*]}"
echo "   interrupted sync: killed with $landed bytes on disk, $first served by then; $served served in all"
pk=$(printf '%s\n' "${push_k[@]}" | median)
ps=$(printf '%s\n' "${push_s[@]}" | median)
rp=$(printf '%s\n' "${repush[@]}" | median)
sk=$(printf '%s\n' "${sync_k[@]}" | median)
ss=$(printf '%s\n' "${sync_s[@]}" | median)
rs=$(printf '%s\n' "${resync[@]}" | median)
psk=$(printf '%s\n' "${psync_k[@]}" | median)
pss=$(printf '%s\n' "${psync_s[@]}" | median)
peak=$(printf '%s\n' "${rss[@]}" | sort -n | tail -1)
ratio() { printf %.3f "$(echo "$1 / $2" | bc -l)"; }
mib=$((total >> 20))
printf 'push %d MiB (TLS): kiln %.2fs | skopeo %.2fs | ratio %sx; re-push %.3fs (budget < 1)\n' \
  "$mib" "$pk" "$ps" "$(ratio "$ps" "$pk")" "$rp"
printf 'sync %d MiB (TLS): kiln %.2fs | skopeo %.2fs | ratio %sx (budget >= 1.0); re-sync %.3fs; peak RSS %d KiB (budget <= 65536)\n' \
  "$mib" "$sk" "$ss" "$(ratio "$ss" "$sk")" "$rs" "$peak"
printf 'sync %d MiB (plain HTTP): kiln %.2fs | skopeo %.2fs | ratio %sx\n' "$mib" "$psk" "$pss" "$(ratio "$pss" "$psk")"
printf 'interrupted sync: %d bytes served for %d bytes of content: %sx (budget <= 1.05)\n' \
  "$served" "$total" "$(ratio "$served" "$total")"
record data.blob_bytes "$total" B
record push.kiln_s "$(printf %.3f "$pk")" s
record push.skopeo_s "$(printf %.3f "$ps")" s
record push.ratio_vs_skopeo "$(ratio "$ps" "$pk")" x
record repush.kiln_s "$(printf %.4f "$rp")" s "<= 1"
record sync.kiln_s "$(printf %.3f "$sk")" s
record sync.skopeo_s "$(printf %.3f "$ss")" s
record sync.ratio_vs_skopeo "$(ratio "$ss" "$sk")" x ">= 1.0"
record resync.kiln_s "$(printf %.4f "$rs")" s "<= 1"
record sync_rss.kiln_kib "$peak" KiB "<= 65536"
record sync_plain_http.kiln_s "$(printf %.3f "$psk")" s
record sync_plain_http.skopeo_s "$(printf %.3f "$pss")" s
record sync_plain_http.ratio_vs_skopeo "$(ratio "$pss" "$psk")" x
record resume.landed_at_kill_bytes "$landed" B
record resume.served_bytes "$served" B
record resume.bytes_ratio "$(ratio "$served" "$total")" x "<= 1.05"
