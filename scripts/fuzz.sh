#!/usr/bin/env bash
# `make fuzz`: runs each cargo-fuzz target of kiln-firstboot's parsers for a short while on
# the nightly toolchain (libFuzzer needs it). Installs cargo-fuzz from crates.io if missing.
#
#   scripts/fuzz.sh                    every target, FUZZ_SECS (default 30) each
#   FUZZ_SECS=300 scripts/fuzz.sh json one target, longer
set -euo pipefail
cd "$(dirname "$0")/../firstboot/fuzz"
secs=${FUZZ_SECS:-30}
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz: installing the nightly toolchain" >&2
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz" >&2
  cargo install --locked cargo-fuzz
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
for t in "${targets[@]}"; do
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
  esac
  cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -max_len=65536
done
