#!/usr/bin/env bash
# kiln render (issue #7): user-data size per provisioner, plain and gzip, against EC2's
# 16384-byte limit, side by side with the usual hand-written baseline (a bash script that
# writes the same /etc/kiln/ files with here-docs and chmod) built in the same run; and the
# render time per provisioner with hyperfine.
#
#   bench/render.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
root=$PWD
kiln=${KILN_BIN:-$root/target/release/kiln}
[ -x "$kiln" ] || cargo build -q --release -p kiln
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench-render.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Two nodes: the docs example (token) and a heavier one using every section of node.toml (a
# 3-certificate CA bundle, a kubelet drop-in from a file and an inline table, sysctls, a
# proxy, swap, a trust bundle, two registries), to see what grows.
cp docs/examples/render/node.toml docs/examples/render/ca.crt "$work/"
mkdir -p "$work/heavy"
for i in 1 2 3; do
  openssl req -x509 -nodes -days 2 -subj "/CN=ca-$i" -newkey rsa:2048 \
    -keyout /dev/null -out "$work/heavy/ca-$i.crt" 2>/dev/null
done
cat "$work"/heavy/ca-*.crt > "$work/heavy/ca.crt"
{
  echo "apiVersion: kubelet.config.k8s.io/v1beta1"
  echo "kind: KubeletConfiguration"
  echo "cgroupDriver: systemd"
  for i in $(seq 1 60); do echo "# tuning note $i: evictionHard and friends would go here"; done
} > "$work/heavy/kubelet.yaml"
cat > "$work/heavy/node.toml" <<'TOML'
api_server = "https://api.prod-eu1.example.internal:6443"
cluster_name = "prod-eu1"
[ca]
file = "ca.crt"
[bootstrap]
token = "07401b.f395accd246ae52d"
[node]
labels = { "node.kubernetes.io/role" = "worker", tier = "web", zone-class = "fast" }
taints = [{ key = "dedicated", value = "web", effect = "NoSchedule" }]
[kubelet]
extra_args = ["--v=2", "--image-gc-high-threshold=80"]
config_file = "kubelet.yaml"
[kubelet.config]
imageGCHighThresholdPercent = 90
imageGCLowThresholdPercent = 70
serializeImagePulls = false
maxParallelImagePulls = 4
containerLogMaxSize = "50Mi"
featureGates = { ImageMaximumGCAge = true }
[[kubelet.credential_provider]]
name = "ecr-credential-provider"
match_images = ["*.dkr.ecr.*.amazonaws.com", "*.dkr.ecr.*.amazonaws.com.cn"]
default_cache_duration = "12h"
[[kubelet.credential_provider]]
name = "auth-provider-gcp"
match_images = ["gcr.io", "*.gcr.io", "*.pkg.dev", "container.cloud.google.com"]
default_cache_duration = "1m"
args = ["get-credentials", "--v=3"]
[proxy]
https = "http://proxy.internal:3128"
no_proxy = ["10.0.0.0/8", ".svc", ".cluster.local", ".example.internal", "169.254.169.254"]
[sysctl]
"fs.inotify.max_user_instances" = 8192
"fs.inotify.max_user_watches" = 524288
"kernel.pid_max" = 4194304
"net.core.somaxconn" = 32768
"net.ipv4.neigh.default.gc_thresh1" = 4096
"net.ipv4.neigh.default.gc_thresh2" = 8192
"net.ipv4.neigh.default.gc_thresh3" = 16384
"net.ipv4.tcp_rmem" = "4096 87380 16777216"
"net.ipv4.tcp_wmem" = "4096 65536 16777216"
"vm.max_map_count" = 262144
[swap]
file_size = "4Gi"
[trust]
file = "ca-2.crt"
[[containerd.registry]]
host = "docker.io"
mirrors = ["https://mirror-a.example.internal", "https://mirror-b.example.internal:5000"]
ca = { file = "ca-1.crt" }
[[containerd.registry]]
host = "registry.example.internal:5000"
mirrors = [{ url = "http://cache.example.internal:5000/proxy", capabilities = ["pull"] }]
[containerd.config]
version = 3
[containerd.config.plugins.'io.containerd.cri.v1.images']
max_concurrent_downloads = 5
[containerd.config.plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gvisor]
runtime_type = 'io.containerd.runsc.v1'
TOML

# The baseline: what people write by hand, from the same files kiln writes.
bash_baseline() { # tree_dir -> script on stdout
  local tree=$1
  echo '#!/bin/bash'
  echo 'set -euo pipefail'
  echo 'mkdir -p /etc/kiln'
  find "$tree/etc/kiln" -type f | sort | while read -r f; do
    n=${f#"$tree"/etc/kiln/}
    mode=$(stat -c %a "$f")
    case "$n" in */*) echo "mkdir -p /etc/kiln/$(dirname "$n")" ;; esac
    echo "cat > /etc/kiln/$n <<'KILN_EOF'"
    cat "$f"
    echo "KILN_EOF"
    echo "chmod $mode /etc/kiln/$n"
  done
}

size() { stat -c %s "$1"; }
gz() { gzip -9n -c "$1" | wc -c; }
pct() { echo $(( $1 * 100 / 16384 ))%; }

printf '%-8s %-12s %8s %8s %8s %9s\n' node format bytes "gzip" "EC2 %" "vs bash"
for node in example heavy; do
  dir=$work; [ "$node" = heavy ] && dir=$work/heavy
  "$kiln" -q render -p files "$dir/node.toml" -o "$dir/tree"
  bash_baseline "$dir/tree" > "$dir/baseline.sh"
  b=$(size "$dir/baseline.sh")
  printf '%-8s %-12s %8d %8d %8s %9s\n' "$node" "bash+heredoc" "$b" "$(gz "$dir/baseline.sh")" "$(pct "$b")" "1.00x"
  record "$node.bash-heredoc.bytes" "$b" bytes
  record "$node.bash-heredoc.gzip_bytes" "$(gz "$dir/baseline.sh")" bytes
  # The heavy node sets [sysctl], which the windows provisioner refuses (Linux only).
  provisioners="cloud-init ignition windows"
  [ "$node" = heavy ] && provisioners="cloud-init ignition"
  for p in $provisioners; do
    "$kiln" -q render -p "$p" "$dir/node.toml" -o "$dir/$p"
    "$kiln" -q render -p "$p" --gzip "$dir/node.toml" -o "$dir/$p.gz"
    s=$(size "$dir/$p")
    # kiln's own --gzip (whole payload, or per file for Ignition) in the gzip column.
    printf '%-8s %-12s %8d %8d %8s %9s\n' "$node" "$p" "$s" "$(size "$dir/$p.gz")" "$(pct "$s")" \
      "$(python3 -c "print(f'{$s/$b:.2f}x')")"
    record "$node.$p.bytes" "$s" bytes "<= 16384"
    record "$node.$p.gzip_bytes" "$(size "$dir/$p.gz")" bytes "<= 16384"
  done
done

echo
echo "render time (hyperfine, example node, ${RUNS:-50} runs):"
hyperfine -N --warmup 5 --runs "${RUNS:-50}" --style basic --export-json "$work/h.json" \
  -n "render cloud-init (-o, fsync)" "$kiln -q render -p cloud-init $work/node.toml -o $work/ud" \
  -n "render ignition (-o, fsync)" "$kiln -q render -p ignition $work/node.toml -o $work/ign" \
  -n "render --check" "$kiln -q render --check $work/ud" \
  -n "render cloud-init, heavy node (every section)" \
  "$kiln -q render -p cloud-init $work/heavy/node.toml -o $work/heavy/ud" >"$work/h.txt" 2>&1 ||
  { cat "$work/h.txt" >&2; exit 1; }
grep -E 'Time|Benchmark' "$work/h.txt"
# 0: render cloud-init, 1: render ignition, 2: render --check, 3: the heavy node (issue 37's
# budget: a node.toml using every section renders in 20 ms or less)
record_hyperfine "$work/h.json" time
heavy_ms=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["results"][3]["median"] * 1000, 2))' "$work/h.json")
record "heavy.cloud-init.render_median_ms" "$heavy_ms" ms "<= 20"
