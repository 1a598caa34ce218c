//! The configuration kubelet runs with: the rules live in `kiln-kubelet-config`
//! (`tools/kubelet-config`, shared with `kiln render`); here is what only the stand-in
//! needs, the command line's values over the loaded configuration.

pub use kiln_kubelet_config::*;

use std::collections::BTreeMap;

use kiln_kubelet_config::types::Taint;

use crate::flags::{parse_bool, parse_int, split_map, Parsed};

/// Sets the fields the command line gives, as kubelet's re-parse of its flags over the
/// loaded file does. Values were checked by the flag parser.
pub fn apply_flags(kc: &mut KubeletConfiguration, f: &Parsed) {
    let int = |n: &str| {
        f.get(n)
            .and_then(|v| parse_int(v, 32).ok())
            .map(|v| v as i32)
    };
    let string = |n: &str| f.get(n).map(str::to_string);
    let map = |n: &str, sep: char| {
        f.get(n)
            .and_then(|v| split_map(v, sep).ok())
            .map(|pairs| pairs.into_iter().collect::<BTreeMap<_, _>>())
    };
    let set_i = |slot: &mut Option<i32>, n: &str| {
        if let Some(v) = int(n) {
            *slot = Some(v);
        }
    };
    set_i(&mut kc.max_pods, "max-pods");
    set_i(&mut kc.healthz_port, "healthz-port");
    set_i(&mut kc.port, "port");
    set_i(&mut kc.read_only_port, "read-only-port");
    set_i(&mut kc.oom_score_adj, "oom-score-adj");
    set_i(
        &mut kc.image_gc_high_threshold_percent,
        "image-gc-high-threshold",
    );
    set_i(
        &mut kc.image_gc_low_threshold_percent,
        "image-gc-low-threshold",
    );
    set_i(&mut kc.pods_per_core, "pods-per-core");
    set_i(&mut kc.kube_api_qps, "kube-api-qps");
    set_i(&mut kc.kube_api_burst, "kube-api-burst");
    set_i(&mut kc.event_record_qps, "event-qps");
    set_i(&mut kc.event_burst, "event-burst");
    set_i(&mut kc.registry_pull_qps, "registry-qps");
    set_i(&mut kc.registry_burst, "registry-burst");
    set_i(&mut kc.container_log_max_files, "container-log-max-files");
    for (slot, n) in [
        (&mut kc.cgroup_driver, "cgroup-driver"),
        (
            &mut kc.container_runtime_endpoint,
            "container-runtime-endpoint",
        ),
        (&mut kc.healthz_bind_address, "healthz-bind-address"),
        (&mut kc.hairpin_mode, "hairpin-mode"),
        (&mut kc.topology_manager_policy, "topology-manager-policy"),
        (&mut kc.topology_manager_scope, "topology-manager-scope"),
        (&mut kc.provider_id, "provider-id"),
        (&mut kc.system_cgroups, "system-cgroups"),
        (&mut kc.cgroup_root, "cgroup-root"),
    ] {
        if let Some(v) = string(n) {
            *slot = Some(v);
        }
    }
    if let Some(m) = map("eviction-hard", '<') {
        kc.eviction_hard = Some(m);
    }
    if let Some(m) = map("kube-reserved", '=') {
        kc.kube_reserved = Some(m);
    }
    if let Some(m) = map("system-reserved", '=') {
        kc.system_reserved = Some(m);
    }
    if let Some(v) = f.get("enforce-node-allocatable") {
        kc.enforce_node_allocatable = Some(
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        );
    }
    if let Some(v) = f.get("cgroups-per-qos").and_then(parse_bool) {
        kc.cgroups_per_qos = Some(v);
    }
    if let Some(v) = f.get("rotate-certificates").and_then(parse_bool) {
        kc.rotate_certificates = Some(v);
    }
    if let Some(v) = f.get("register-with-taints") {
        kc.register_with_taints = Some(parse_taints(v));
    }
    // `--feature-gates=K=V,…` over the file's map, key by key, the flag winning
    // (`kubeletConfigFlagPrecedence`, cmd/kubelet/app/server.go).
    if let Some(pairs) = map("feature-gates", '=') {
        let gates = kc.feature_gates.get_or_insert_with(BTreeMap::new);
        for (k, v) in pairs {
            if let Some(b) = parse_bool(&v) {
                gates.insert(k, b);
            }
        }
    }
}

/// `--register-with-taints`: `key=value:Effect` or `key:Effect`, comma-separated.
fn parse_taints(v: &str) -> Vec<Taint> {
    v.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|spec| {
            let (kv, effect) = spec.rsplit_once(':').unwrap_or((spec, ""));
            let (k, val) = kv.split_once('=').unwrap_or((kv, ""));
            Taint {
                key: Some(k.to_string()),
                value: Some(val.to_string()),
                effect: Some(effect.to_string()),
                time_added: None,
            }
        })
        .collect()
}
