# Sourced by every bench/<area>.sh. `record METRIC VALUE UNIT [BUDGET]` appends one JSON line
# to the results file, so every figure docs/benchmarks.md quotes has a line to trace it to:
#
#   {"area":"supply","metric":"mirror_verify.ratio_vs_openssl","value":1.08,"unit":"x",
#    "budget":">= 0.9","rev":"1a2b3c4","load":"1.52 1.31 0.98"}
#
# bench/run.sh points KILN_BENCH_RESULTS at the run's file (target/bench/results.jsonl once
# every area passed); a script run alone writes target/bench/<area>.jsonl.
bench_area=$(basename "$0" .sh)
KILN_BENCH_RESULTS=${KILN_BENCH_RESULTS:-target/bench/$bench_area.jsonl}
mkdir -p "$(dirname "$KILN_BENCH_RESULTS")"
if [ -z "${KILN_BENCH_APPEND:-}" ]; then : >"$KILN_BENCH_RESULTS"; fi
bench_rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD 2>/dev/null; then bench_rev="$bench_rev+dirty"; fi

record() { # METRIC VALUE UNIT [BUDGET]
  python3 - "$KILN_BENCH_RESULTS" "$bench_area" "$bench_rev" "$@" <<'PY'
import json, sys
path, area, rev, metric, value, unit = sys.argv[1:7]
budget = sys.argv[7] if len(sys.argv) > 7 else None
try:
    v = float(value)
    v = int(v) if v.is_integer() and "." not in value else round(v, 6)
except ValueError:
    sys.exit(f"bench: {area}/{metric}: value {value!r} is not a number")
load = open("/proc/loadavg").read().split()[:3]
line = {"area": area, "metric": metric, "value": v, "unit": unit, "rev": rev, "load": " ".join(load)}
if budget:
    line["budget"] = budget
with open(path, "a") as f:
    f.write(json.dumps(line) + "\n")
PY
}

# hyperfine's JSON export -> records: `record_hyperfine FILE PREFIX` writes
# PREFIX.<n>.{mean,median,stddev}_s for each command, n being its position (0-based).
record_hyperfine() {
  local file=$1 prefix=$2 i=0 line
  while IFS=$'\t' read -r mean median sd; do
    record "$prefix.$i.mean_s" "$mean" s
    record "$prefix.$i.median_s" "$median" s
    record "$prefix.$i.stddev_s" "$sd" s
    i=$((i + 1))
  done < <(python3 -c 'import json,sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(r["mean"], r["median"], r["stddev"] or 0, sep="\t")' "$file")
}

# hyperfine's JSON export -> CPU records: `record_hyperfine_cpu FILE PREFIX` writes
# PREFIX.<n>_s, the mean user + system CPU time of command n (all its processes).
record_hyperfine_cpu() {
  local file=$1 prefix=$2 i=0 cpu
  while read -r cpu; do
    record "$prefix.${i}_s" "$cpu" s
    i=$((i + 1))
  done < <(python3 -c 'import json,sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(r["user"] + r["system"])' "$file")
}

# Lines of `METRIC<TAB>VALUE<TAB>UNIT[<TAB>BUDGET]` (what a script's python prints) -> records.
record_tsv() {
  local metric value unit budget
  while IFS=$'\t' read -r metric value unit budget; do
    [ -n "$metric" ] || continue
    record "$metric" "$value" "$unit" ${budget:+"$budget"}
  done <"$1"
}
