#!/usr/bin/env bash
# What sizing (issue 24) adds to a kiln-firstboot run (budget: <= 1 ms):
#   1. in-process: reading /sys/devices/system/cpu/online, /proc/meminfo and the 34 KiB AWS
#      table, the lookup of the table's last type (the longest scan) and the EKS formula,
#      timed alone (firstboot/examples/sizing_cost.rs);
#   2. the whole static binary, `run --no-start --provider qemu` (no network), with sizing
#      (MAX_PODS_MODE=aws-vpc-cni, RESERVATION=eks, the table) and without (neither key), side
#      by side with hyperfine on the same tmpfs root.
#
#   bench/sizing.sh            RUNS=500 bench/sizing.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
runs=${RUNS:-300}
bin=target/firstboot/kiln-firstboot
scripts/build-firstboot.sh "$bin" >&2
# The example in the firstboot profile (opt-level "z"), the code as the binary runs it.
cargo build -q --profile firstboot -p kiln-firstboot --example sizing_cost

work=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
trap 'rm -rf "$work"' EXIT
last=$(grep -v '^#' images/data/aws-eni.tsv | tail -1 | cut -f1)

node() { # node ROOT IMAGE_ENV_EXTRA
  local r=$1
  mkdir -p "$r/usr/lib/kiln" "$r/etc/kiln" "$r/sys/class/dmi/id" "$r/proc" \
    "$r/sys/devices/system/cpu" "$r/sys/firmware/qemu_fw_cfg/by_name/opt/kiln"
  printf 'KILN_CONTRACT=1\nKILN_IMAGE_ID=sha256:3f0c1b2a3f0c1b2a3f0c1b2a3f0c1b2a\nKILN_IMAGE_NAME=ubuntu\nKILN_VERSION=0.1.0\nKILN_OS=linux\nKILN_ARCH=amd64\nKUBERNETES_VERSION=v1.36.1\n%s' "$2" > "$r/usr/lib/kiln/image.env"
  printf 'KILN_CONTRACT=1\nAPI_SERVER=https://127.0.0.1:6443\nCLUSTER_NAME=bench\n' > "$r/etc/kiln/node.env"
  printf -- '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n' > "$r/etc/kiln/ca.crt"
  printf 'abcdef.0123456789abcdef\n' > "$r/etc/kiln/bootstrap-token"; chmod 600 "$r/etc/kiln/bootstrap-token"
  echo QEMU > "$r/sys/class/dmi/id/sys_vendor"
  for kv in instance-id=kiln-bench-0 local-ipv4=10.0.2.15 "instance-type=$last"; do
    mkdir -p "$r/sys/firmware/qemu_fw_cfg/by_name/opt/kiln/${kv%%=*}"
    echo "${kv#*=}" > "$r/sys/firmware/qemu_fw_cfg/by_name/opt/kiln/${kv%%=*}/raw"
  done
  cp images/data/aws-eni.tsv "$r/usr/lib/kiln/aws-eni.tsv"
  cp /sys/devices/system/cpu/online "$r/sys/devices/system/cpu/online"
  cp /proc/meminfo "$r/proc/meminfo"
}
node "$work/sized" $'MAX_PODS_MODE=aws-vpc-cni\nRESERVATION=eks\n'
node "$work/plain" ''

target/firstboot/examples/sizing_cost "$work/sized" "$last" 10000
run() { echo "$bin run --root $work/$1 --provider qemu --no-start --console $work/$1/console"; }
hyperfine -N --warmup 20 --runs "$runs" --export-json "$work/h.json" -n sizing "$(run sized)" -n no-sizing "$(run plain)"
python3 - "$work/h.json" "$work/rec.tsv" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
rec = open(sys.argv[2], "w")
for name, x in zip(["sizing", "no_sizing"], r):
    print("%s: median %.3f ms, min %.3f ms, user %.3f ms" % (x["command"], x["median"] * 1e3, x["min"] * 1e3, x["user"] * 1e3))
    rec.write(f"run.{name}.median_ms\t{x['median'] * 1e3:.4f}\tms\t\n")
d = (r[0]["median"] - r[1]["median"]) * 1e3
print("median difference: %.3f ms" % d)
rec.write(f"run.median_difference_ms\t{d:.4f}\tms\t<= 1\n")
PY
record_tsv "$work/rec.tsv"
grep -h '^MAX_PODS=\|^KUBE_RESERVED=' "$work/sized/run/kiln/kubelet.env"
