#!/usr/bin/env bash
# Supply-chain budgets (issue #5), each side by side with its baseline in this one run:
#
#  1. sync of >= 1 GiB in >= 20 files from a loopback server: kiln (hashing included) vs
#     `curl --parallel` fetching the same files from the same server (budget >= 0.9x);
#  2. peak RSS of kiln fetching one 1 GiB artifact (budget <= 64 MiB);
#  3. kill -9 at half way, restart: total bytes the server sent / artifact size (<= 1.05x);
#  4. `kiln mirror verify` (all cores, SHA-NI through the sha2 crate) vs `openssl dgst
#     -sha256` run in parallel on all cores (the fastest standard tool here, SHA-NI too) over
#     the same mirror (>= 0.9x); single-threaded coreutils `sha256sum` is printed beside it
#     for orientation only.
#
#   bench/supply.sh            (SUPPLY_FILES=24 SUPPLY_FILE_MIB=45 SUPPLY_ROUNDS=3 to tune)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
root=$PWD
kiln=${KILN_BIN:-$root/target/release/kiln}
[ -x "$kiln" ] || cargo build -q --release -p kiln
files=${SUPPLY_FILES:-24}
mib=${SUPPLY_FILE_MIB:-45}
rounds=${SUPPLY_ROUNDS:-3}
big_mib=${SUPPLY_BIG_MIB:-1024}

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench-supply.XXXXXX")
server=
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

up=$work/up
mkdir -p "$up" "$work/keys"
python3 - "$up" "$files" "$mib" "$big_mib" <<'PY'
import os, sys
d, n, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    with open(os.path.join(d, f"f{i:02d}.bin"), "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
with open(os.path.join(d, "big.bin"), "wb") as f:
    for _ in range(int(sys.argv[4])):
        f.write(os.urandom(1 << 20))
PY

python3 bench/supply_server.py "$up" "$work/port" &
server=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.05; done
base="http://127.0.0.1:$(cat "$work/port")"

minisign -G -W -p "$work/keys/b.pub" -s "$work/keys/b.key" >/dev/null
mklock() { # LOCKFILE FILES...
  local lock=$1
  shift
  echo "version = 1" >"$lock"
  local f
  for f in "$@"; do
    cat >>"$lock" <<EOF

[[artifact]]
name = "${f%.bin}"
version = "1"
os = "linux"
arch = "amd64"
format = "binary"
url = "$base/$f"
size = $(stat -c %s "$up/$f")
sha256 = "$(sha256sum "$up/$f" | cut -d' ' -f1)"
verified = "bench data"
members = [{ from = "$f", to = "bin/${f%.bin}" }]
EOF
  done
  "$kiln" --quiet lock sign "$lock" --secret-key "$work/keys/b.key"
}
(cd "$up" && mklock "$work/many.lock" f*.bin)
mklock "$work/big.lock" big.bin
total=$((files * mib * 1024 * 1024))

now() { date +%s.%N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "data: $files files x $mib MiB = $((total >> 20)) MiB, plus one $big_mib MiB file; server: $base (sendfile)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# 1. throughput
urls=()
for i in $(seq 0 $((files - 1))); do urls+=("$base/$(printf 'f%02d.bin' "$i")"); done
kt=()
ct=()
cst=()
for r in $(seq "$rounds"); do
  rm -rf "$work/m" "$work/c"
  mkdir -p "$work/c"
  sync
  t0=$(now)
  "$kiln" --quiet mirror sync --to "$work/m" --lock "$work/many.lock" --trusted-key "$work/keys/b.pub" --concurrency 8
  t1=$(now)
  kt+=("$(echo "$t1 - $t0" | bc -l)")
  sync
  t0=$(now)
  (cd "$work/c" && curl -sS --no-progress-meter --parallel --parallel-max 8 --remote-name-all "${urls[@]}")
  t1=$(now)
  ct+=("$(echo "$t1 - $t0" | bc -l)")
  # kiln fsyncs every blob before it is visible; the fair durable baseline syncs too.
  rm -rf "$work/c"
  mkdir -p "$work/c"
  sync
  t0=$(now)
  (cd "$work/c" && curl -sS --no-progress-meter --parallel --parallel-max 8 --remote-name-all "${urls[@]}" && sync -f .)
  t1=$(now)
  cst+=("$(echo "$t1 - $t0" | bc -l)")
done
k=$(printf '%s\n' "${kt[@]}" | median)
c=$(printf '%s\n' "${ct[@]}" | median)
cs=$(printf '%s\n' "${cst[@]}" | median)
kmbs=$(echo "$total / $k / 1048576" | bc -l)
cmbs=$(echo "$total / $c / 1048576" | bc -l)
echo "   rounds (s): kiln ${kt[*]} | curl ${ct[*]} | curl+sync ${cst[*]} | load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '1. sync %d MiB in %d files: kiln %.2fs (%.0f MiB/s, sha256 verified) | curl --parallel %.2fs (%.0f MiB/s) | ratio kiln/curl throughput %.2fx (budget >= 0.90)\n' \
  $((total >> 20)) "$files" "$k" "$kmbs" "$c" "$cmbs" "$(echo "$c / $k" | bc -l)"
printf '   durable baseline (curl --parallel then sync, as kiln fsyncs each blob): %.2fs | ratio kiln/(curl+sync) %.2fx\n' \
  "$cs" "$(echo "$cs / $k" | bc -l)"
record sync.kiln_s "$k" s
record sync.curl_s "$c" s
record sync.curl_sync_s "$cs" s
record sync.kiln_mib_s "$kmbs" MiB/s
record sync.ratio_vs_curl "$(echo "$c / $k" | bc -l)" x ">= 0.9"
record sync.ratio_vs_curl_sync "$(echo "$cs / $k" | bc -l)" x

# 2. peak RSS with a 1 GiB artifact
rm -rf "$work/cache"
/usr/bin/time -f '%M' -o "$work/rss" "$kiln" --quiet fetch "$work/big.lock" --cache "$work/cache" --trusted-key "$work/keys/b.pub"
rss=$(cat "$work/rss")
record fetch_rss.kiln_kib "$rss" KiB "<= 65536"
/usr/bin/time -f '%M' -o "$work/crss" curl -sS -o "$work/big.curl" "$base/big.bin"
printf '2. peak RSS fetching one %d MiB artifact: kiln %.1f MiB (budget <= 64) | curl %.1f MiB\n' \
  "$big_mib" "$(echo "$rss / 1024" | bc -l)" "$(echo "$(cat "$work/crss") / 1024" | bc -l)"

# 3. kill at half, resume
rm -rf "$work/cache"
big=$(stat -c %s "$up/big.bin")
sha=$(sha256sum "$up/big.bin" | cut -d' ' -f1)
before=$(curl -s "$base/__stats")
"$kiln" --quiet fetch "$work/big.lock" --cache "$work/cache" --trusted-key "$work/keys/b.pub" --concurrency 1 &
pid=$!
partial=$work/cache/blobs/sha256/.partial-$sha
while kill -0 "$pid" 2>/dev/null; do
  s=$(stat -c %s "$partial" 2>/dev/null || echo 0)
  [ "$s" -ge $((big / 2)) ] && break
  sleep 0.005
done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
at=$(stat -c %s "$partial" 2>/dev/null || echo 0)
"$kiln" --quiet fetch "$work/big.lock" --cache "$work/cache" --trusted-key "$work/keys/b.pub"
after=$(curl -s "$base/__stats")
sent=$((after - before))
printf '3. killed at %d MiB of %d MiB, restarted: server sent %d bytes for %d = %.4fx (budget <= 1.05)\n' \
  $((at >> 20)) $((big >> 20)) "$sent" "$big" "$(echo "$sent / $big" | bc -l)"
record resume.bytes_ratio "$(echo "$sent / $big" | bc -l)" x "<= 1.05"

# 4. mirror verify vs openssl on all cores (warm page cache for all; mirror from step 1)
cores=$(nproc)
vt=()
ot=()
st=()
for r in $(seq "$rounds"); do
  t0=$(now)
  "$kiln" --quiet mirror verify "$work/m" --trusted-key "$work/keys/b.pub"
  t1=$(now)
  vt+=("$(echo "$t1 - $t0" | bc -l)")
  t0=$(now)
  printf '%s\0' "$work/m"/blobs/sha256/[0-9a-f]* | xargs -0 -P "$cores" -n 1 openssl dgst -sha256 >/dev/null
  t1=$(now)
  ot+=("$(echo "$t1 - $t0" | bc -l)")
  t0=$(now)
  sha256sum "$work/m"/blobs/sha256/[0-9a-f]* >/dev/null
  t1=$(now)
  st+=("$(echo "$t1 - $t0" | bc -l)")
done
v=$(printf '%s\n' "${vt[@]}" | median)
o=$(printf '%s\n' "${ot[@]}" | median)
s=$(printf '%s\n' "${st[@]}" | median)
printf '4. re-verify %d MiB mirror: kiln mirror verify %.2fs (%.0f MiB/s) | openssl dgst -sha256 x%d in parallel %.2fs (%.0f MiB/s) | ratio %.2fx (budget >= 0.90)\n' \
  $((total >> 20)) "$v" "$(echo "$total / $v / 1048576" | bc -l)" "$cores" "$o" "$(echo "$total / $o / 1048576" | bc -l)" "$(echo "$o / $v" | bc -l)"
printf '   for orientation: sha256sum (one core, coreutils) %.2fs (%.0f MiB/s)\n' "$s" "$(echo "$total / $s / 1048576" | bc -l)"
record verify.kiln_s "$v" s
record verify.openssl_parallel_s "$o" s
record verify.sha256sum_s "$s" s
record verify.ratio_vs_openssl_parallel "$(echo "$o / $v" | bc -l)" x ">= 0.9"
