#!/usr/bin/env bash
# `make fuzz`: runs each cargo-fuzz target for a short while on the nightly toolchain
# (libFuzzer needs it): kiln-firstboot's parsers (firstboot/fuzz) and the builder's parsers
# and squashfs writer (builder/fuzz). Installs cargo-fuzz from crates.io if missing.
#
#   scripts/fuzz.sh                    every target, FUZZ_SECS (default 30) each
#   FUZZ_SECS=300 scripts/fuzz.sh json one target, longer
set -euo pipefail
top="$(cd "$(dirname "$0")/.." && pwd)"
secs=${FUZZ_SECS:-30}
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz: installing the nightly toolchain" >&2
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz" >&2
  cargo install --locked cargo-fuzz
fi
# Which fuzz crate holds a target.
crate_of() {
  local d
  for d in firstboot/fuzz builder/fuzz; do
    if [ -f "$top/$d/fuzz_targets/$1.rs" ]; then echo "$d"; return; fi
  done
  echo "fuzz: no target named $1" >&2
  exit 2
}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for d in firstboot/fuzz builder/fuzz; do
    mapfile -t -O "${#targets[@]}" targets < <(cd "$top/$d" && cargo +nightly fuzz list)
  done
fi
ex="$top/docs/examples/render"
for t in "${targets[@]}"; do
  d=$(crate_of "$t") || exit 2
  cd "$top/$d"
  echo "=== fuzz: $t for ${secs}s ==="
  # Seed each run with the test fixtures, so the fuzzer starts from real answers.
  mkdir -p "corpus/$t"
  case "$t" in
    json) find ../tests/fixtures -name '*.json' -o -path '*azure*' -type f | xargs -r cp -t "corpus/$t" 2>/dev/null || true ;;
    envfile) printf 'KILN_CONTRACT=1\nAPI_SERVER=https://10.0.0.10:6443\nKUBELET_EXTRA_ARGS="--v=2 \\"x\\""\nK='"'"'lit'"'"'\n# c\n' > "corpus/$t/seed" ;;
    http_response) printf 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n' > "corpus/$t/seed" ;;
    cli) printf 'run\0--root\0/tmp/r\0--provider=aws\0--metadata-url\0http://127.0.0.1:1/\0--deadline=5' > "corpus/$t/seed" ;;
    url) printf 'http://[fd00::a]:8080/latest/meta-data?x=1' > "corpus/$t/seed" ;;
    max_pods) printf '# instance-type pods\nm5.large 29\nm5.xlarge\t58\n' > "corpus/$t/seed" ;;
    redact) printf 'users:\n- user:\n    token: "s3cr3t-bearer"\n    client-key-data: a2V5a2V5\n\0err="Unauthorized" bearer s3cr3t-bearer abcdef.0123456789abcdef' > "corpus/$t/seed" ;;
    lock) cp ../../images/artifacts.lock "corpus/$t/" ;;
    image_def) cp ../../images/*.toml "corpus/$t/" ;;
    node_toml) cp "$ex"/node*.toml "corpus/$t/" ;;
    user_data) cp "$ex"/user-data* "$ex"/config.ign "corpus/$t/" ;;
    multipart) printf 'Content-Type: multipart/mixed; Boundary="b"\nMIME-Version: 1.0\n\n--b\nContent-Type: text/cloud-config\n\n#cloud-config\nwrite_files:\n- path: /etc/kiln/ca.crt\n  content: x\n\n--b--\n' > "corpus/$t/seed" ;;
    powershell) cp "$ex"/user-data.windows.ps1 "corpus/$t/" ;;
    content_range) printf 'bytes 100-199/200' > "corpus/$t/seed" ;;
    squashfs) printf '\000\003usr\000\002\007usr/bin\003\001\010usr/link\000' > "corpus/$t/seed" ;;
  esac
  cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -max_len=65536
done
