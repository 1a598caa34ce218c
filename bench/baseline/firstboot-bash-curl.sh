#!/usr/bin/env bash
# The baseline kiln-firstboot is measured against: what a careful bash+curl node bootstrap
# does for the same job on AWS. It reads the same contract files, fetches the same IMDSv2
# token and the same leaves, looks up max pods, writes the same two files atomically and
# calls the same service manager. It validates less than kiln-firstboot (no env-file
# grammar, no JSON, no per-field checks), so the comparison flatters the baseline.
#
#   bench/baseline/firstboot-bash-curl.sh ROOT METADATA_URL SYSTEMCTL
set -euo pipefail
root=$1 base=$2 systemctl=$3

# shellcheck disable=SC1091
. "$root/usr/lib/kiln/image.env"
# shellcheck disable=SC1091
. "$root/etc/kiln/node.env"
[ "${KILN_CONTRACT:-}" = 1 ] || { echo "KILN_CONTRACT: expected 1" >&2; exit 3; }
tokfile=$root/etc/kiln/bootstrap-token
[ "$(stat -c %a "$tokfile")" = 600 ] || { echo "$tokfile: expected mode 0600" >&2; exit 3; }
read -r bootstrap_token < "$tokfile"

curl_opts=(-fsS --connect-timeout 2 --max-time 5 --retry 5 --retry-connrefused --noproxy '*')
token=$(curl "${curl_opts[@]}" -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "$base/latest/api/token")
md() { curl "${curl_opts[@]}" -H "X-aws-ec2-metadata-token: $token" "$base/latest/meta-data/$1"; }
instance_id=$(md instance-id)
instance_type=$(md instance-type)
zone=$(md placement/availability-zone)
region=$(md placement/region)
node_ip=$(md local-ipv4)
hostname=$(md local-hostname)

max_pods=${MAX_PODS:-$(awk -v t="$instance_type" '$1 == t { print $2; exit }' "$root/usr/lib/kiln/max-pods.map")}
max_pods=${max_pods:-${DEFAULT_MAX_PODS:-110}}
node_name=${NODE_NAME:-$hostname}
provider_id="aws:///$zone/$instance_id"

mkdir -p "$root/run/kiln"
kc=$root/run/kiln/bootstrap-kubeconfig
(umask 077; cat > "$kc.tmp" <<KC
apiVersion: v1
kind: Config
clusters:
- name: $CLUSTER_NAME
  cluster:
    server: $API_SERVER
    certificate-authority: /etc/kiln/ca.crt
contexts:
- name: kubelet-bootstrap@$CLUSTER_NAME
  context:
    cluster: $CLUSTER_NAME
    user: kubelet-bootstrap
current-context: kubelet-bootstrap@$CLUSTER_NAME
users:
- name: kubelet-bootstrap
  user:
    token: $bootstrap_token
KC
)
sync "$kc.tmp"
mv "$kc.tmp" "$kc"

# The node's KubeletConfiguration drop-in, as kiln-firstboot writes it for kubelet's
# --config-dir (the fields kubelet no longer wants as flags).
dropin=$root/run/kiln/kubelet.conf.d/10-kiln-node.conf
mkdir -p "${dropin%/*}"
printf '{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","containerRuntimeEndpoint":"unix:///run/containerd/containerd.sock","providerID":"%s","maxPods":%s}\n' \
  "$provider_id" "$max_pods" > "$dropin.tmp"
sync "$dropin.tmp"
mv "$dropin.tmp" "$dropin"

env=$root/run/kiln/kubelet.env
cat > "$env.tmp" <<ENV
KILN_CONTRACT=1
PROVIDER=aws
NODE_NAME=$node_name
NODE_IP=$node_ip
INSTANCE_ID=$instance_id
INSTANCE_TYPE=$instance_type
ZONE=$zone
REGION=$region
PROVIDER_ID=$provider_id
MAX_PODS=$max_pods
NODE_LABELS=${NODE_LABELS:-}
NODE_TAINTS=${NODE_TAINTS:-}
KUBELET_EXTRA_ARGS=${KUBELET_EXTRA_ARGS:-}
KUBELET_ARGS="--config=/usr/lib/kiln/kubelet-config.yaml --config-dir=/run/kiln/kubelet.conf.d --kubeconfig=/var/lib/kubelet/kubeconfig --bootstrap-kubeconfig=/run/kiln/bootstrap-kubeconfig --hostname-override=$node_name --node-ip=$node_ip"
ENV
sync "$env.tmp"
mv "$env.tmp" "$env"

"$systemctl" start --no-block "${KUBELET_UNIT:-kubelet.service}"
