//! `KubeletConfiguration` v1beta1, field for field as
//! `staging/src/k8s.io/kubelet/config/v1beta1/types.go` (kubernetes/kubernetes at
//! 001332b0) declares it, with its JSON names. Every field is optional: Go leaves a
//! missing or `null` field at its zero value, and defaulting (validate.rs) fills it.
//! Types matter: a string where Go has an int32 is a decode error, as in kubelet.

// Most fields are only decoded (their type checked, their name known), never read.
#![allow(dead_code)]

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

use crate::units::parse_duration;

/// `metav1.Duration`: a JSON string Go's `time.ParseDuration` accepts; nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Duration(pub i128);

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s)
            .map(Duration)
            .map_err(serde::de::Error::custom)
    }
}

type Map = BTreeMap<String, String>;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub enable_server: Option<bool>,
    pub static_pod_path: Option<String>,
    pub pod_logs_dir: Option<String>,
    pub sync_frequency: Option<Duration>,
    pub file_check_frequency: Option<Duration>,
    pub http_check_frequency: Option<Duration>,
    #[serde(rename = "staticPodURL")]
    pub static_pod_url: Option<String>,
    #[serde(rename = "staticPodURLHeader")]
    pub static_pod_url_header: Option<BTreeMap<String, Vec<String>>>,
    pub address: Option<String>,
    pub port: Option<i32>,
    pub read_only_port: Option<i32>,
    pub tls_cert_file: Option<String>,
    pub tls_private_key_file: Option<String>,
    pub tls_cipher_suites: Option<Vec<String>>,
    pub tls_curve_preferences: Option<Vec<i32>>,
    pub tls_min_version: Option<String>,
    pub rotate_certificates: Option<bool>,
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: Option<bool>,
    pub authentication: Option<Authentication>,
    pub authorization: Option<Authorization>,
    #[serde(rename = "registryPullQPS")]
    pub registry_pull_qps: Option<i32>,
    pub registry_burst: Option<i32>,
    pub image_pull_credentials_verification_policy: Option<String>,
    pub preloaded_images_verification_allowlist: Option<Vec<String>>,
    #[serde(rename = "eventRecordQPS")]
    pub event_record_qps: Option<i32>,
    pub event_burst: Option<i32>,
    pub enable_debugging_handlers: Option<bool>,
    pub enable_contention_profiling: Option<bool>,
    pub healthz_port: Option<i32>,
    pub healthz_bind_address: Option<String>,
    pub oom_score_adj: Option<i32>,
    pub cluster_domain: Option<String>,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    pub streaming_connection_idle_timeout: Option<Duration>,
    pub node_status_update_frequency: Option<Duration>,
    pub node_status_report_frequency: Option<Duration>,
    pub node_lease_duration_seconds: Option<i32>,
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: Option<Duration>,
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: Option<Duration>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: Option<i32>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: Option<i32>,
    pub volume_stats_agg_period: Option<Duration>,
    pub kubelet_cgroups: Option<String>,
    pub system_cgroups: Option<String>,
    pub cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: Option<bool>,
    pub cgroup_driver: Option<String>,
    #[serde(rename = "cpuManagerPolicy")]
    pub cpu_manager_policy: Option<String>,
    #[serde(rename = "singleProcessOOMKill")]
    pub single_process_oom_kill: Option<bool>,
    #[serde(rename = "cpuManagerPolicyOptions")]
    pub cpu_manager_policy_options: Option<Map>,
    #[serde(rename = "cpuManagerReconcilePeriod")]
    pub cpu_manager_reconcile_period: Option<Duration>,
    #[serde(rename = "draManagerReconcilePeriod")]
    pub dra_manager_reconcile_period: Option<Duration>,
    pub memory_manager_policy: Option<String>,
    pub topology_manager_policy: Option<String>,
    pub topology_manager_scope: Option<String>,
    pub topology_manager_policy_options: Option<Map>,
    #[serde(rename = "qosReserved")]
    pub qos_reserved: Option<Map>,
    pub runtime_request_timeout: Option<Duration>,
    pub hairpin_mode: Option<String>,
    pub max_pods: Option<i32>,
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    pub pod_pids_limit: Option<i64>,
    pub resolv_conf: Option<String>,
    pub run_once: Option<bool>,
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: Option<bool>,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: Option<Duration>,
    pub node_status_max_images: Option<i32>,
    pub max_open_files: Option<i64>,
    pub content_type: Option<String>,
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: Option<i32>,
    #[serde(rename = "kubeAPIBurst")]
    pub kube_api_burst: Option<i32>,
    pub serialize_image_pulls: Option<bool>,
    pub max_parallel_image_pulls: Option<i32>,
    pub eviction_hard: Option<Map>,
    pub eviction_soft: Option<Map>,
    pub eviction_soft_grace_period: Option<Map>,
    pub eviction_pressure_transition_period: Option<Duration>,
    pub eviction_max_pod_grace_period: Option<i32>,
    pub eviction_minimum_reclaim: Option<Map>,
    pub merge_default_eviction_settings: Option<bool>,
    pub pods_per_core: Option<i32>,
    pub enable_controller_attach_detach: Option<bool>,
    pub protect_kernel_defaults: Option<bool>,
    #[serde(rename = "makeIPTablesUtilChains")]
    pub make_iptables_util_chains: Option<bool>,
    pub iptables_masquerade_bit: Option<i32>,
    pub iptables_drop_bit: Option<i32>,
    pub feature_gates: Option<BTreeMap<String, bool>>,
    pub fail_swap_on: Option<bool>,
    pub memory_swap: Option<MemorySwap>,
    pub container_log_max_size: Option<String>,
    pub container_log_max_files: Option<i32>,
    pub container_log_max_workers: Option<i32>,
    pub container_log_monitor_interval: Option<Duration>,
    pub config_map_and_secret_change_detection_strategy: Option<String>,
    pub system_reserved: Option<Map>,
    pub kube_reserved: Option<Map>,
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: Option<String>,
    pub show_hidden_metrics_for_version: Option<String>,
    pub system_reserved_cgroup: Option<String>,
    pub kube_reserved_cgroup: Option<String>,
    pub enforce_node_allocatable: Option<Vec<String>>,
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    pub volume_plugin_dir: Option<String>,
    #[serde(rename = "providerID")]
    pub provider_id: Option<String>,
    pub kernel_memcg_notification: Option<bool>,
    pub logging: Option<Logging>,
    pub enable_system_log_handler: Option<bool>,
    pub enable_system_log_query: Option<bool>,
    pub shutdown_grace_period: Option<Duration>,
    pub shutdown_grace_period_critical_pods: Option<Duration>,
    pub shutdown_grace_period_by_pod_priority: Option<Vec<ShutdownByPriority>>,
    pub crash_loop_back_off: Option<CrashLoopBackOff>,
    pub reserved_memory: Option<Vec<MemoryReservation>>,
    pub enable_profiling_handler: Option<bool>,
    pub enable_debug_flags_handler: Option<bool>,
    pub seccomp_default: Option<bool>,
    pub memory_throttling_factor: Option<f64>,
    pub memory_reservation_policy: Option<String>,
    pub register_with_taints: Option<Vec<Taint>>,
    pub register_node: Option<bool>,
    pub tracing: Option<Tracing>,
    pub local_storage_capacity_isolation: Option<bool>,
    pub container_runtime_endpoint: Option<String>,
    pub image_service_endpoint: Option<String>,
    #[serde(rename = "failCgroupV1")]
    pub fail_cgroup_v1: Option<bool>,
    pub user_namespaces: Option<UserNamespaces>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Authentication {
    pub x509: Option<X509>,
    pub webhook: Option<AuthnWebhook>,
    pub anonymous: Option<Anonymous>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct X509 {
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthnWebhook {
    pub enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Anonymous {
    pub enabled: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Authorization {
    pub mode: Option<String>,
    pub webhook: Option<AuthzWebhook>,
}

#[derive(Debug, Default, Deserialize)]
pub struct AuthzWebhook {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: Option<Duration>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemorySwap {
    pub swap_behavior: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrashLoopBackOff {
    pub max_container_restart_period: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownByPriority {
    pub priority: Option<i32>,
    pub shutdown_grace_period_seconds: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryReservation {
    pub numa_node: Option<i32>,
    pub limits: Option<Map>,
}

/// `v1.Taint` (`k8s.io/api/core/v1`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    pub key: Option<String>,
    pub value: Option<String>,
    pub effect: Option<String>,
    pub time_added: Option<String>,
}

/// `tracingapi.TracingConfiguration` (`k8s.io/component-base/tracing/api/v1`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tracing {
    pub endpoint: Option<String>,
    pub sampling_rate_per_million: Option<i32>,
}

#[derive(Debug, Default, Deserialize)]
pub struct UserNamespaces {
    #[serde(rename = "idsPerPod")]
    pub ids_per_pod: Option<i64>,
}

/// `logsapi.LoggingConfiguration` (`k8s.io/component-base/logs/api/v1/types.go`).
/// `flushFrequency` is a `TimeOrMetaDuration` (nanoseconds or a duration string) and
/// `options` holds format-specific settings; both are taken as any JSON here.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Logging {
    pub format: Option<String>,
    pub flush_frequency: Option<serde_json::Value>,
    pub verbosity: Option<u32>,
    pub vmodule: Option<Vec<VModule>>,
    pub options: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VModule {
    pub file_pattern: Option<String>,
    pub verbosity: Option<u32>,
}
