#!/usr/bin/env bash
# Reporting cost per boot phase: kiln-firstboot's Reporter (status.json rewritten atomically
# at the start and end of each phase, one console line per phase) against the same job done
# the way bash bootstrap scripts do it (printf a console line, write the JSON to a temp file
# with a here-doc, sync, mv). Both write to tmpfs (/dev/shm), as /run is on a node.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-300}
cargo build -q --release -p kiln-firstboot --example report_cost
work=$(mktemp -d /dev/shm/kiln-bench-report.XXXXXX)
trap 'rm -rf "$work"' EXIT

kiln_out=$(target/release/examples/report_cost "$work/kiln" "$work/kiln-console" "$runs")
echo "$kiln_out"
kiln_us=$(sed -E 's/.*mean ([0-9.]+) median.*/\1/' <<<"$kiln_out")

# Baseline: one phase = console line + status.json written atomically twice (begin, end).
mkdir -p "$work/sh/run/kiln"
phase() {
  local f="$work/sh/run/kiln/status.json"
  for state in running success; do
    cat > "$f.tmp" <<JSON
{"kiln_contract":1,"provider":"aws","result":"running","phases":[{"name":"$1","start_ms":1,"result":"$state"}]}
JSON
    sync "$f.tmp"
    mv "$f.tmp" "$f"
  done
  printf 'kiln-firstboot: phase=%s result=success ms=0 provider=aws\n' "$1" >> "$work/sh-console"
}
n=$(( runs * 6 ))
start=$(date +%s%N)
for ((i = 0; i < runs; i++)); do
  for p in config metadata write start-kubelet wait-healthy wait-joined; do phase "$p"; done
done
end=$(date +%s%N)
sh_us=$(awk -v a="$start" -v b="$end" -v n="$n" 'BEGIN { printf "%.1f", (b - a) / n / 1000 }')
echo "bash per-phase us: mean $sh_us ($n phases)"
awk -v k="$kiln_us" -v s="$sh_us" 'BEGIN { printf "ratio of means bash/kiln: %.1fx (budget: kiln mean <= 1000 us per phase: %s)\n", s / k, (k <= 1000 ? "ok" : "OVER") }'
