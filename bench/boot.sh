#!/usr/bin/env bash
# Boot times under QEMU (TCG on these machines), side by side in one run:
#   baseline   the Debian base alone: systemd up, networkd lease, one metadata fetch
#   scenarios  each kiln boot scenario: boot-to-kubelet-started on the node's clock (when
#              kubelet's process started, as systemd recorded it), and kiln-firstboot's own
#              share (its config+metadata+write+start-kubelet phases)
# Prints a table and the ratio of each scenario's kubelet start to the baseline's marker,
# then ROUNDS (default 3) rounds of the baseline and ubuntu-aws alone, whose median ratio is
# the budget's figure: one pair of TCG boots varies by a fifth from run to run.
# Guests get KILN_QEMU_CPUS vCPUs (default 2, a node's smallest size) and boot one at a time
# (nextest runs --no-capture tests one by one), so each has the host's two cores.
# Not a test: nothing here asserts a time. docs/benchmarks.md records the results.
set -euo pipefail
export KILN_QEMU_CPUS=${KILN_QEMU_CPUS:-2}
ROUNDS=${ROUNDS:-3}
cd "$(dirname "$0")/.."
. bench/lib.sh
make --no-print-directory deps-qemu firstboot >/dev/null
cargo build --locked -q -p kiln -p cri-smoke   # the scenarios put cri-smoke in every guest
fixture=target/fixture-mirror
qemu-tests/assets/fixture.sh "$fixture"
assets=$(qemu-tests/assets/assets.sh all)
set -a; eval "$assets"; set +a
export KILN_FIXTURE_MIRROR=$PWD/$fixture
out=$(mktemp)
trap 'rm -f "$out"' EXIT
set +e
# Not the arm64 scenario: it is emulated on this x86-64 host, so its boot is not comparable
# with the amd64 base's marker (docs/boot-tests.md, "arm64", has its times).
cargo nextest run --locked -p kiln-qemu-tests --no-capture --no-fail-fast \
  --test it -E 'not test(ubuntu_aws_arm64) & not test(/^harness::/)' >"$out" 2>&1
rc=$?
set -e
grep -E '^(KILN-BOOT-BENCH|        (PASS|FAIL))' "$out" || true
echo
awk '
  /^KILN-BOOT-BENCH/ {
    delete f; for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    if (f["scenario"] == "base-systemd") { base = f["marker_ms"]; next }
    n++; sc[n] = f["scenario"]; res[n] = f["result"]; ks[n] = f["kubelet_started_ms"]; fb[n] = f["firstboot_own_ms"]
  }
  END {
    printf "%-16s %-8s %22s %18s %10s %16s\n", "boot", "result", "kubelet started (ms)", "firstboot own ms", "fb share", "vs base marker"
    printf "%-16s %-8s %22s %18s %10s %16s\n", "base-systemd", "-", (base == "" ? "?" : base " (marker)"), "-", "-", "1.00x"
    for (i = 1; i <= n; i++) {
      share = (ks[i] > 0) ? sprintf("%.1f%%", 100 * fb[i] / ks[i]) : "-"
      ratio = (base > 0 && ks[i] > 0) ? sprintf("%.2fx", ks[i] / base) : "-"
      printf "%-16s %-8s %22s %18s %10s %16s\n", sc[i], res[i], ks[i], fb[i], share, ratio
    }
  }' "$out"
# The same figures as records: base.marker_ms, <scenario>.kubelet_started_ms,
# <scenario>.firstboot_own_ms and <scenario>.ratio_vs_base (issue 15's budget: <= 1.15).
awk '
  /^KILN-BOOT-BENCH/ {
    delete f; for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    if (f["scenario"] == "base-systemd") { base = f["marker_ms"]; printf "base.marker_ms\t%s\tms\t\n", base; next }
    n++; sc[n] = f["scenario"]; ks[n] = f["kubelet_started_ms"]; fb[n] = f["firstboot_own_ms"]
  }
  END {
    for (i = 1; i <= n; i++) {
      # A failure scenario may never start kubelet: its field is "-", and nothing is recorded.
      if (ks[i] ~ /^[0-9]+$/) printf "%s.kubelet_started_ms\t%s\tms\t\n", sc[i], ks[i]
      if (fb[i] ~ /^[0-9]+$/) printf "%s.firstboot_own_ms\t%s\tms\t\n", sc[i], fb[i]
      if (base > 0 && ks[i] ~ /^[0-9]+$/ && ks[i] > 0) printf "%s.ratio_vs_base\t%.4f\tx\t<= 1.15\n", sc[i], ks[i] / base
    }
  }' "$out" >"$out.tsv"
record_tsv "$out.tsv"
rm -f "$out.tsv"
# A boot that failed has no time worth comparing: the benchmark fails with it.
failed() {
  echo "bench/boot.sh: a boot failed (cargo nextest exited $1); its output:" >&2
  grep -E '^        FAIL|panicked' "$2" >&2 || tail -50 "$2" >&2
  exit 1
}
[ "$rc" -eq 0 ] || failed "$rc" "$out"
# The budget's pair again, ROUNDS times in all (the full run above is round 1).
pair_ratio() {
  awk '/^KILN-BOOT-BENCH/ {
      delete f; for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      if (f["scenario"] == "base-systemd") base = f["marker_ms"]
      if (f["scenario"] == "ubuntu-aws") ks = f["kubelet_started_ms"]
    }
    END { if (base > 0 && ks ~ /^[0-9]+$/) printf "%s %s %.4f\n", base, ks, ks / base }' "$1"
}
ratios=$(pair_ratio "$out")
for _ in $(seq 2 "$ROUNDS"); do
  set +e
  cargo nextest run --locked -p kiln-qemu-tests --no-capture --no-fail-fast \
    --test it -E 'test(=scenarios::ubuntu_aws) | test(base_boots)' >"$out" 2>&1
  rc=$?
  set -e
  [ "$rc" -eq 0 ] || failed "$rc" "$out"
  ratios+=$'\n'$(pair_ratio "$out")
done
echo
echo "base-systemd vs ubuntu-aws, $ROUNDS rounds (marker ms, kubelet started ms, ratio):"
echo "$ratios"
echo "$ratios" | sort -k3 -n | awk -v n="$ROUNDS" '
  NF == 3 { r[++k] = $3 }
  END {
    if (k != n) { print "bench/boot.sh: " k " of " n " rounds gave a ratio" > "/dev/stderr"; exit 1 }
    printf "ubuntu-aws.ratio_vs_base_median\t%.4f\tx\t<= 1.15\n", r[int((k + 1) / 2)]
  }' >"$out.tsv"
cat "$out.tsv"
record_tsv "$out.tsv"
rm -f "$out.tsv"
