#!/usr/bin/env bash
# `make bench`: runs every benchmark script in bench/ side by side with its baseline.
# Each area is one script, bench/<area>.sh, that prints its own table and records every
# figure it measures (bench/lib.sh's `record`) as one JSON line. A run of all areas writes
# them to target/bench/results.jsonl (replaced only when every area passed); the numbers in
# docs/benchmarks.md each name the metric they come from.
#
#   bench/run.sh            all areas        -> target/bench/results.jsonl
#   bench/run.sh firstboot  one area (or several) -> target/bench/partial.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
areas=("$@")
if [ ${#areas[@]} -eq 0 ]; then
  for f in bench/*.sh; do
    name=$(basename "$f" .sh)
    case "$name" in run | lib) ;; *) areas+=("$name") ;; esac
  done
  final=target/bench/results.jsonl
else
  final=target/bench/partial.jsonl
fi
mkdir -p target/bench
tmp=$final.tmp.$$
# A failed run keeps what it measured, apart, for a look: target/bench/failed.jsonl.
trap '[ ! -f "$tmp" ] || mv "$tmp" target/bench/failed.jsonl' EXIT
python3 - "$tmp" <<'PY'
import json, os, platform, subprocess, sys, time
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
run = {"run": {"rev": rev, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "cpus": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
       "load": " ".join(open("/proc/loadavg").read().split()[:3])}}
open(sys.argv[1], "w").write(json.dumps(run) + "\n")
PY
export KILN_BENCH_RESULTS=$PWD/$tmp KILN_BENCH_APPEND=1
for a in "${areas[@]}"; do
  echo "=== bench: $a ==="
  bash "bench/$a.sh"
done
mv "$tmp" "$final"
echo "bench: $(($(wc -l <"$final") - 1)) figures in $final"
