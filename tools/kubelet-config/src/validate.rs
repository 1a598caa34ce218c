//! The configuration kubelet runs with: the file's values, then the command line's (flags
//! win over `--config`, `cmd/kubelet/app/server.go`), then v1beta1 defaulting
//! (`pkg/kubelet/apis/config/v1beta1/defaults.go`), then checks. Each check names its
//! source in kubernetes/kubernetes and keeps kubelet's wording:
//!
//! - `validate`: `pkg/kubelet/apis/config/validation/validation.go`
//!   (`ValidateKubeletConfiguration`, read at 001332b0), the gate-independent rules and
//!   those whose gate is on by default in 1.36 (GracefulNodeShutdown, NodeSwap);
//! - `run_checks`: what `run()` in `cmd/kubelet/app/server.go` parses before it starts:
//!   `parseResourceList` for kubeReserved/systemReserved and the eviction thresholds
//!   (`pkg/kubelet/eviction/helpers.go`, `ParseThresholdConfig`).

use crate::types::{Duration, KubeletConfiguration, Taint};
use crate::units::parse_quantity;

const SECOND: i128 = 1_000_000_000;

/// A non-pointer int32 with `omitempty`: 0 (or absent) takes the default.
fn or_zero_default(v: Option<i32>, d: i32) -> i32 {
    v.filter(|&v| v != 0).unwrap_or(d)
}

fn dur(v: Option<Duration>) -> i128 {
    v.map_or(0, |d| d.0)
}

fn go_dur(ns: i128) -> String {
    if ns == 0 {
        return "0s".into();
    }
    let (sign, mut n) = if ns < 0 { ("-", -ns) } else { ("", ns) };
    if n < SECOND {
        return format!("{sign}{}ms", n as f64 / 1e6);
    }
    let h = n / (3600 * SECOND);
    n -= h * 3600 * SECOND;
    let m = n / (60 * SECOND);
    n -= m * 60 * SECOND;
    let s = n as f64 / 1e9;
    match (h, m) {
        (0, 0) => format!("{sign}{s}s"),
        (0, _) => format!("{sign}{m}m{s}s"),
        _ => format!("{sign}{h}h{m}m{s}s"),
    }
}

/// `ValidateKubeletConfiguration` on the defaulted configuration: every error, in
/// kubelet's order and words.
#[allow(
    clippy::too_many_lines,
    reason = "kubelet's ValidateKubeletConfiguration is one flat list of field checks; kept in its order, one check per field, so it can be compared with the upstream function line by line"
)]
pub fn validate(kc: &KubeletConfiguration) -> Vec<String> {
    let mut e = Vec::new();
    let inv = "invalid configuration:";
    let lease = or_zero_default(kc.node_lease_duration_seconds, 40);
    if lease <= 0 {
        e.push(format!(
            "{inv} nodeLeaseDurationSeconds must be greater than 0"
        ));
    }
    if kc.system_cgroups.as_deref().is_some_and(|s| !s.is_empty())
        && kc.cgroup_root.as_deref().unwrap_or("").is_empty()
    {
        e.push(format!("{inv} systemCgroups (--system-cgroups) was specified and cgroupRoot (--cgroup-root) was not specified"));
    }
    let event_burst = or_zero_default(kc.event_burst, 100);
    if event_burst < 0 {
        e.push(format!(
            "{inv} eventBurst (--event-burst) {event_burst} must not be a negative number"
        ));
    }
    let event_qps = kc.event_record_qps.unwrap_or(50);
    if event_qps < 0 {
        e.push(format!(
            "{inv} eventRecordQPS (--event-qps) {event_qps} must not be a negative number"
        ));
    }
    let healthz = kc.healthz_port.unwrap_or(10248);
    if healthz != 0 && !(1..=65535).contains(&healthz) {
        e.push(format!(
            "{inv} healthzPort (--healthz-port) {healthz} must be between 1 and 65535, inclusive"
        ));
    }
    let high = kc.image_gc_high_threshold_percent.unwrap_or(85);
    let low = kc.image_gc_low_threshold_percent.unwrap_or(80);
    if !(0..=100).contains(&high) {
        e.push(format!("{inv} imageGCHighThresholdPercent (--image-gc-high-threshold) {high} must be between 0 and 100, inclusive"));
    }
    if !(0..=100).contains(&low) {
        e.push(format!("{inv} imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be between 0 and 100, inclusive"));
    }
    if low >= high {
        e.push(format!("{inv} imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {high}"));
    }
    let min_age = dur(kc.image_minimum_gc_age);
    let max_age = dur(kc.image_maximum_gc_age);
    if min_age < 0 {
        e.push(format!(
            "{inv} imageMinimumGCAge {} must not be negative",
            go_dur(min_age)
        ));
    }
    if max_age < 0 {
        e.push(format!(
            "{inv} imageMaximumGCAge {} must not be negative",
            go_dur(max_age)
        ));
    }
    let api_burst = or_zero_default(kc.kube_api_burst, 100);
    if api_burst < 0 {
        e.push(format!(
            "{inv} kubeAPIBurst (--kube-api-burst) {api_burst} must not be a negative number"
        ));
    }
    let api_qps = kc.kube_api_qps.unwrap_or(50);
    if api_qps < 0 {
        e.push(format!(
            "{inv} kubeAPIQPS (--kube-api-qps) {api_qps} must not be a negative number"
        ));
    }
    let max_images = kc.node_status_max_images.unwrap_or(50);
    if max_images < -1 {
        e.push(format!("{inv} nodeStatusMaxImages (--node-status-max-images) {max_images} must be -1 or greater"));
    }
    let max_files = kc.max_open_files.filter(|&v| v != 0).unwrap_or(1_000_000);
    if max_files < 0 {
        e.push(format!(
            "{inv} maxOpenFiles (--max-open-files) {max_files} must not be a negative number"
        ));
    }
    let max_pods = or_zero_default(kc.max_pods, 110);
    if max_pods < 0 {
        e.push(format!(
            "{inv} maxPods (--max-pods) {max_pods} must not be a negative number"
        ));
    }
    let oom = kc.oom_score_adj.unwrap_or(-999);
    if !(-1000..=1000).contains(&oom) {
        e.push(format!(
            "{inv} oomScoreAdj (--oom-score-adj) {oom} must be between -1000 and 1000, inclusive"
        ));
    }
    let per_core = kc.pods_per_core.unwrap_or(0);
    if per_core < 0 {
        e.push(format!(
            "{inv} podsPerCore (--pods-per-core) {per_core} must not be a negative number"
        ));
    }
    let port = or_zero_default(kc.port, 10250);
    if !(1..=65535).contains(&port) {
        e.push(format!(
            "{inv} port (--port) {port} must be between 1 and 65535, inclusive"
        ));
    }
    let ro = kc.read_only_port.unwrap_or(0);
    if ro != 0 && !(1..=65535).contains(&ro) {
        e.push(format!(
            "{inv} readOnlyPort (--read-only-port) {ro} must be between 0 and 65535, inclusive"
        ));
    }
    let reg_burst = or_zero_default(kc.registry_burst, 10);
    if reg_burst < 0 {
        e.push(format!(
            "{inv} registryBurst (--registry-burst) {reg_burst} must not be a negative number"
        ));
    }
    let reg_qps = kc.registry_pull_qps.unwrap_or(5);
    if reg_qps < 0 {
        e.push(format!(
            "{inv} registryPullQPS (--registry-qps) {reg_qps} must not be a negative number"
        ));
    }
    if let Some(n) = kc.max_parallel_image_pulls {
        if n < 1 {
            e.push(format!(
                "{inv} maxParallelImagePulls {n} must be a positive number"
            ));
        }
        if kc.serialize_image_pulls.unwrap_or(true) && n > 1 {
            e.push(format!("{inv} maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls (--serialize-image-pulls) is set to false"));
        }
    }
    if kc.run_once == Some(true) {
        e.push(format!("{inv} runOnce (--runOnce) true, Runonce mode has been deprecated and should not be set"));
    }
    for t in kc.register_with_taints.iter().flatten() {
        let effect = t.effect.as_deref().unwrap_or("");
        if t.key.as_deref().unwrap_or("").is_empty()
            || !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
        {
            e.push(format!("invalid taint: {}", show_taint(t)));
        }
        if t.time_added.is_some() {
            e.push(format!("{inv} taint.TimeAdded is not nil"));
        }
    }
    one_of(
        &mut e,
        "topologyManagerPolicy (--topology-manager-policy)",
        kc.topology_manager_policy.as_deref().unwrap_or("none"),
        &["none", "best-effort", "restricted", "single-numa-node"],
    );
    let scope = kc.topology_manager_scope.as_deref().unwrap_or("container");
    if !matches!(scope, "container" | "pod") {
        e.push(format!("{inv} topologyManagerScope (--topology-manager-scope) {scope:?} must be one of: \"container\", or \"pod\""));
    }
    // GracefulNodeShutdown is GA: the gate is always on.
    let (sgp, sgpc) = (
        dur(kc.shutdown_grace_period),
        dur(kc.shutdown_grace_period_critical_pods),
    );
    if sgpc > sgp {
        e.push(format!(
            "{inv} shutdownGracePeriodCriticalPods {{{}}} must be <= shutdownGracePeriod {{{}}}",
            go_dur(sgpc),
            go_dur(sgp)
        ));
    }
    if sgp < 0 || (sgp > 0 && sgp < SECOND) {
        e.push(format!(
            "{inv} shutdownGracePeriod {{{}}} must be either zero or otherwise >= 1 sec",
            go_dur(sgp)
        ));
    }
    if sgpc < 0 || (sgpc > 0 && sgpc < SECOND) {
        e.push(format!("{inv} shutdownGracePeriodCriticalPods {{{}}} must be either zero or otherwise >= 1 sec", go_dur(sgpc)));
    }
    // NodeSwap is GA in 1.34: the swap behaviour must be one kubelet knows.
    let swap = kc
        .memory_swap
        .as_ref()
        .and_then(|m| m.swap_behavior.as_deref())
        .unwrap_or("");
    if !matches!(swap, "" | "NoSwap" | "LimitedSwap") {
        e.push(format!("{inv} memorySwap.swapBehavior {swap:?} must be one of: \"\", \"LimitedSwap\" or \"NoSwap\""));
    }
    enforce_node_allocatable(&mut e, kc);
    let hairpin = kc.hairpin_mode.as_deref().unwrap_or("promiscuous-bridge");
    if !matches!(hairpin, "none" | "hairpin-veth" | "promiscuous-bridge") {
        e.push(format!("{inv} option {hairpin:?} specified for hairpinMode (--hairpin-mode). Valid options are \"none\", \"hairpin-veth\" or \"promiscuous-bridge\""));
    }
    if let Some(f) = kc.memory_throttling_factor {
        if f <= 0.0 || f > 1.0 {
            e.push(format!("{inv} memoryThrottlingFactor {f} must be greater than 0 and less than or equal to 1.0"));
        }
    }
    let mrp = kc.memory_reservation_policy.as_deref().unwrap_or("None");
    if !matches!(mrp, "None" | "TieredReservation") {
        e.push(format!("{inv} option {mrp:?} specified for memoryReservationPolicy. Valid options are \"None\" or \"TieredReservation\""));
    }
    // defaults.go sets an empty endpoint to containerd's socket before this check runs.
    let endpoint = kc
        .container_runtime_endpoint
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or("unix:///run/containerd/containerd.sock");
    if endpoint.is_empty() {
        e.push(format!(
            "{inv} the containerRuntimeEndpoint was not specified or empty"
        ));
    }
    if kc.container_log_max_workers.unwrap_or(1) < 1 {
        e.push(format!(
            "{inv} containerLogMaxWorkers must be greater than or equal to 1"
        ));
    }
    if kc
        .container_log_monitor_interval
        .map_or(10 * SECOND, |d| d.0)
        < 3 * SECOND
    {
        e.push(format!("{inv} containerLogMonitorInterval must be a positive time duration greater than or equal to 3s"));
    }
    if kc.container_log_max_files.unwrap_or(5) <= 1 {
        e.push(format!("{inv} containerLogMaxFiles must be greater than 1"));
    }
    let logs = kc
        .pod_logs_dir
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or("/var/log/pods");
    if !logs.starts_with('/') {
        e.push(format!(
            "{inv} pod logs path {logs:?} must be absolute path"
        ));
    }
    e
}

fn one_of(e: &mut Vec<String>, what: &str, v: &str, allowed: &[&str]) {
    if !allowed.contains(&v) {
        let list: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
        e.push(format!(
            "invalid configuration: {what} {v:?} must be one of: [{}]",
            list.join(" ")
        ));
    }
}

fn show_taint(t: &Taint) -> String {
    let (k, v, eff) = (
        t.key.as_deref().unwrap_or(""),
        t.value.as_deref().unwrap_or(""),
        t.effect.as_deref().unwrap_or(""),
    );
    if v.is_empty() {
        format!("{k}:{eff}")
    } else {
        format!("{k}={v}:{eff}")
    }
}

fn enforce_node_allocatable(e: &mut Vec<String>, kc: &KubeletConfiguration) {
    let inv = "invalid configuration:";
    let default = vec!["pods".to_string()];
    let list = kc.enforce_node_allocatable.as_ref().unwrap_or(&default);
    let mut seen: Vec<&str> = Vec::new();
    for v in list {
        if seen.contains(&v.as_str()) {
            e.push(format!("{inv} duplicated enforcements {v:?} in enforceNodeAllocatable (--enforce-node-allocatable)"));
            continue;
        }
        seen.push(v);
        match v.as_str() {
            "pods" => {}
            "system-reserved" | "system-reserved-compressible" => {
                if kc
                    .system_reserved_cgroup
                    .as_deref()
                    .unwrap_or("")
                    .is_empty()
                {
                    e.push(format!("{inv} systemReservedCgroup (--system-reserved-cgroup) must be specified when \"system-reserved\" or \"system-reserved-compressible\" included in enforceNodeAllocatable (--enforce-node-allocatable)"));
                }
            }
            "kube-reserved" | "kube-reserved-compressible" => {
                if kc.kube_reserved_cgroup.as_deref().unwrap_or("").is_empty() {
                    e.push(format!("{inv} kubeReservedCgroup (--kube-reserved-cgroup) must be specified when \"kube-reserved\" or \"kube-reserved-compressible\" included in enforceNodeAllocatable (--enforce-node-allocatable)"));
                }
            }
            "none" => {
                if list.len() > 1 {
                    e.push(format!("{inv} enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional enforcements when \"none\" is specified"));
                }
                continue;
            }
            other => {
                e.push(format!("{inv} option {other:?} specified for enforceNodeAllocatable (--enforce-node-allocatable). Valid options are \"pods\", \"system-reserved\", \"system-reserved-compressible\", \"kube-reserved\", \"kube-reserved-compressible\" or \"none\""));
                continue;
            }
        }
        if !kc.cgroups_per_qos.unwrap_or(true) {
            e.push(format!("{inv} cgroupsPerQOS (--cgroups-per-qos) must be set to true when {v:?} contained in enforceNodeAllocatable (--enforce-node-allocatable)"));
        }
    }
}

/// `utilerrors.NewAggregate(errs).Error()`: one message alone, several in brackets.
pub fn aggregate(errs: &[String]) -> String {
    match errs {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// The eviction signals kubelet knows (`pkg/kubelet/eviction/api/types.go`).
const SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

/// What `run()` parses before starting: `Err` is the text after `failed to run Kubelet: `.
pub fn run_checks(kc: &KubeletConfiguration) -> Result<(), String> {
    for reserved in [&kc.kube_reserved, &kc.system_reserved]
        .into_iter()
        .flatten()
    {
        for (k, v) in reserved {
            // server.go parseResourceList: cpu, memory, ephemeral-storage and pid only.
            if !matches!(k.as_str(), "cpu" | "memory" | "ephemeral-storage" | "pid") {
                return Err(format!("cannot reserve {k:?} resource"));
            }
            let q = parse_quantity(v)
                .map_err(|e| format!("failed to parse quantity {v:?} for {k:?} resource: {e}"))?;
            if q < 0.0 {
                return Err(format!(
                    "resource quantity for {k:?} cannot be negative: {v}"
                ));
            }
        }
    }
    for (signal, v) in kc.eviction_hard.iter().flatten() {
        if !SIGNALS.contains(&signal.as_str()) {
            return Err(format!("unsupported eviction signal {signal}"));
        }
        if let Some(pct) = v.strip_suffix('%') {
            if v == "0%" || v == "100%" {
                continue;
            }
            let p: f64 = pct.parse().map_err(|_| format!("invalid percentage {v}"))?;
            if p < 0.0 {
                return Err(format!(
                    "eviction percentage threshold {signal} must be >= 0%: {v}"
                ));
            }
            if p > 100.0 {
                return Err(format!(
                    "eviction percentage threshold {signal} must be <= 100%: {v}"
                ));
            }
            continue;
        }
        let q = parse_quantity(v)?;
        if q <= 0.0 {
            return Err(format!("eviction threshold {signal} must be positive: {v}"));
        }
    }
    Ok(())
}
