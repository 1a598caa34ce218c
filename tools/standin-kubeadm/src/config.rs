//! `kubeadm join --config`: the JoinConfiguration as kubeadm 1.31+ loads it
//! (kubernetes/kubernetes `cmd/kubeadm/app/util/config/joinconfiguration.go`,
//! `LoadJoinConfigurationFromFile` → `documentMapToJoinConfiguration`):
//!
//! - `SplitYAMLDocuments` (`cmd/kubeadm/app/util/marshal.go`): every document needs
//!   `apiVersion` and `kind`; a kind given twice is an error;
//! - `validateSupportedVersion` (`util/config/common.go`): v1beta2 and older are refused,
//!   v1beta3 is deprecated (a warning);
//! - `strict.VerifyUnmarshalStrict`: an unknown field is a strict error, which `kubeadm join`
//!   only logs as a warning (`strictErrors` is false on that path; `kubeadm config validate`
//!   makes it fatal); a wrong type is fatal (the UniversalDecoder);
//! - the v1beta4 types (`cmd/kubeadm/app/apis/kubeadm/v1beta4/types.go`). Every field is
//!   declared so the strict pass knows it; the join flow reads a few.
#![allow(dead_code)]

use std::collections::BTreeMap;

use serde::Deserialize;

/// kubeadm's `Arg` (v1beta4: `kubeletExtraArgs` is a list of name/value pairs).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Arg {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    pub key: String,
    #[serde(default)]
    pub value: String,
    pub effect: String,
    #[serde(default)]
    pub time_added: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRegistration {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub cri_socket: String,
    pub taints: Option<Vec<Taint>>,
    #[serde(default)]
    pub kubelet_extra_args: Vec<Arg>,
    #[serde(default)]
    pub ignore_preflight_errors: Vec<String>,
    #[serde(default)]
    pub image_pull_policy: String,
    pub image_pull_serial: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapToken {
    #[serde(default)]
    pub token: String,
    #[serde(default)]
    pub api_server_endpoint: String,
    #[serde(default)]
    pub ca_cert_hashes: Vec<String>,
    #[serde(default)]
    pub unsafe_skip_ca_verification: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileDiscovery {
    pub kube_config_path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Discovery {
    pub bootstrap_token: Option<BootstrapToken>,
    pub file: Option<FileDiscovery>,
    #[serde(default)]
    pub tls_bootstrap_token: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiEndpoint {
    #[serde(default)]
    pub advertise_address: String,
    #[serde(default)]
    pub bind_port: i32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinControlPlane {
    #[serde(default)]
    pub local_api_endpoint: ApiEndpoint,
    #[serde(default)]
    pub certificate_key: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct Patches {
    #[serde(default)]
    pub directory: String,
}

/// v1beta4 `Timeouts`, durations as Go writes them (`4m0s`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    pub control_plane_component_health_check: Option<String>,
    pub kubelet_health_check: Option<String>,
    #[serde(rename = "kubernetesAPICall")]
    pub kubernetes_api_call: Option<String>,
    #[serde(rename = "etcdAPICall")]
    pub etcd_api_call: Option<String>,
    pub tls_bootstrap: Option<String>,
    pub discovery: Option<String>,
    pub upgrade_manifests: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinConfiguration {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    pub node_registration: NodeRegistration,
    #[serde(default)]
    pub ca_cert_path: String,
    #[serde(default)]
    pub discovery: Discovery,
    pub control_plane: Option<JoinControlPlane>,
    #[serde(default)]
    pub skip_phases: Vec<String>,
    pub patches: Option<Patches>,
    pub timeouts: Option<Timeouts>,
}

/// What loading printed as warnings, and the configuration.
#[derive(Debug)]
pub struct Loaded {
    pub config: JoinConfiguration,
    pub warnings: Vec<String>,
}

const OLD: [(&str, &str); 5] = [
    ("kubeadm.k8s.io/v1alpha1", "v1.11"),
    ("kubeadm.k8s.io/v1alpha2", "v1.12"),
    ("kubeadm.k8s.io/v1alpha3", "v1.14"),
    ("kubeadm.k8s.io/v1beta1", "v1.15"),
    ("kubeadm.k8s.io/v1beta2", "v1.22"),
];

/// Go's `%#v` of a GroupVersionKind, as kubeadm's strict errors print it.
fn gvk(api_version: &str, kind: &str) -> String {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    format!("schema.GroupVersionKind{{Group:\"{group}\", Version:\"{version}\", Kind:\"{kind}\"}}")
}

/// Splits a multi-document YAML text on `---` lines.
fn documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else if let Some(d) = docs.last_mut() {
            d.push_str(line);
            d.push('\n');
        }
    }
    docs.into_iter()
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .collect()
}

/// Loads the JoinConfiguration from `text` as `kubeadm join --config` does.
pub fn load(text: &str) -> Result<Loaded, String> {
    let mut warnings = Vec::new();
    let mut kinds: BTreeMap<String, String> = BTreeMap::new();
    let mut join: Option<(String, String)> = None;
    for doc in documents(text) {
        let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(&doc)
            .map_err(|e| format!("error converting YAML to JSON: {e}"))?;
        let field = |k: &str| {
            value
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let (api_version, kind) = (field("apiVersion"), field("kind"));
        let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
        if group.is_empty() || version.is_empty() || kind.is_empty() {
            return Err(format!(
                "invalid configuration for GroupVersionKind /{}, Kind={kind}: kind and apiVersion is mandatory information that must be specified",
                api_version
            ));
        }
        if kinds.insert(kind.clone(), api_version.clone()).is_some() {
            return Err(format!(
                "invalid configuration: kind {kind:?} is specified twice in YAML file"
            ));
        }
        if kind == "JoinConfiguration" {
            join = Some((api_version, doc));
        }
    }
    let Some((api_version, doc)) = join else {
        return Err("no JoinConfiguration found in the supplied config".into());
    };
    if let Some((_, v)) = OLD.iter().find(|(a, _)| *a == api_version) {
        return Err(format!(
            "your configuration file uses an old API spec: {api_version:?} (kind: \"JoinConfiguration\"). Please use kubeadm {v} instead and run 'kubeadm config migrate --old-config old.yaml --new-config new.yaml', which will write the new, similar spec using a newer API version."
        ));
    }
    if api_version == "kubeadm.k8s.io/v1beta3" {
        warnings.push(format!("your configuration file uses a deprecated API spec: {api_version:?} (kind: \"JoinConfiguration\"). Please use 'kubeadm config migrate --old-config old.yaml --new-config new.yaml', which will write the new, similar spec using a newer API version."));
        return Err(
            "stand-in kubeadm: only kubeadm.k8s.io/v1beta4 is modelled (v1beta3's kubeletExtraArgs is a map)".into(),
        );
    }
    if api_version != "kubeadm.k8s.io/v1beta4" {
        return Err(format!(
            "no kind \"JoinConfiguration\" is registered for version {api_version:?} in scheme \"k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/scheme/scheme.go:31\""
        ));
    }
    // Strict first (unknown and duplicate fields), only logged; then the real decode.
    let mut unknown = Vec::new();
    let de = serde_yaml_ng::Deserializer::from_str(&doc);
    let strict: Result<JoinConfiguration, _> =
        serde_ignored::deserialize(de, |path| unknown.push(path.to_string()));
    let config = strict.map_err(|e| format!("json: {e}"))?;
    if !unknown.is_empty() {
        let fields: Vec<String> = unknown
            .iter()
            .map(|u| format!("unknown field {u:?}"))
            .collect();
        warnings.push(format!(
            "error unmarshaling configuration {}: strict decoding error: {}",
            gvk(&api_version, "JoinConfiguration"),
            fields.join(", ")
        ));
    }
    Ok(Loaded { config, warnings })
}

/// `bootstraputil.IsValidBootstrapToken`: `[a-z0-9]{6}.[a-z0-9]{16}`.
pub fn valid_token(t: &str) -> bool {
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    matches!(t.split_once('.'), Some((id, secret)) if ok(id, 6) && ok(secret, 16))
}

/// Go's `net.SplitHostPort` errors, for `apiServerEndpoint`.
fn split_host_port(s: &str) -> Result<(), String> {
    let missing = format!("address {s}: missing port in address");
    if let Some(rest) = s.strip_prefix('[') {
        let Some((_, port)) = rest.split_once("]:") else {
            return Err(missing);
        };
        return if port.contains(':') {
            Err(format!("address {s}: too many colons in address"))
        } else {
            Ok(())
        };
    }
    match s.matches(':').count() {
        0 => Err(missing),
        1 => Ok(()),
        _ => Err(format!("address {s}: too many colons in address")),
    }
}

/// `validation.ValidateJoinConfiguration` (`cmd/kubeadm/app/apis/kubeadm/validation/validation.go`)
/// for a worker with token discovery, after `SetJoinDynamicDefaults` filled the name and the
/// defaults filled `caCertPath`. Field paths and wording are kubeadm's `field.Error`s.
pub fn validate(c: &JoinConfiguration) -> Vec<String> {
    let mut errs = Vec::new();
    let d = &c.discovery;
    match (&d.bootstrap_token, &d.file) {
        (None, None) => errs
            .push("discovery: Invalid value: \"\": bootstrapToken or file must be set".to_string()),
        (Some(_), Some(_)) => errs.push(
            "discovery: Invalid value: \"\": bootstrapToken and file cannot both be set"
                .to_string(),
        ),
        _ => {}
    }
    if let Some(b) = &d.bootstrap_token {
        if b.api_server_endpoint.is_empty() {
            errs.push(
                "discovery.bootstrapToken: Required value: APIServerEndpoint is not set".into(),
            );
        }
        if b.ca_cert_hashes.is_empty() && !b.unsafe_skip_ca_verification {
            errs.push("discovery.bootstrapToken: Invalid value: \"\": using token-based discovery without caCertHashes can be unsafe. Set unsafeSkipCAVerification as true in your kubeadm config file or pass --discovery-token-unsafe-skip-ca-verification flag to continue".into());
        }
        if !valid_token(&b.token) {
            errs.push(format!(
                "discovery.bootstrapToken.token: Invalid value: {:?}: the bootstrap token is invalid",
                b.token
            ));
        }
        if let Err(e) = split_host_port(&b.api_server_endpoint) {
            errs.push(format!(
                "discovery.bootstrapToken.apiServerEndpoints: Invalid value: {:?}: {e}",
                b.api_server_endpoint
            ));
        }
        let tls = if d.tls_bootstrap_token.is_empty() {
            &b.token
        } else {
            &d.tls_bootstrap_token
        };
        if !valid_token(tls) {
            errs.push(format!(
                "discovery.tlsBootstrapToken: Invalid value: {tls:?}: the bootstrap token is invalid"
            ));
        }
    }
    let n = &c.node_registration;
    if !n.name.is_empty() && !dns1123_subdomain(&n.name) {
        errs.push(format!("nodeRegistration.name: Invalid value: {:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character", n.name));
    }
    if let Some(rest) = n.cri_socket.split_once("://").map(|(s, _)| s) {
        if rest != "unix" {
            errs.push(format!(
                "nodeRegistration.criSocket: Invalid value: {:?}: URL scheme {rest} is not supported",
                n.cri_socket
            ));
        }
    } else if !n.cri_socket.is_empty() && !n.cri_socket.starts_with('/') {
        errs.push(format!(
            "nodeRegistration.criSocket: Invalid value: {:?}: path is not absolute",
            n.cri_socket
        ));
    }
    for a in &n.kubelet_extra_args {
        if a.name.is_empty() {
            errs.push(
                "nodeRegistration.kubeletExtraArgs: Invalid value: \"\": argument has no name"
                    .into(),
            );
        }
    }
    if !["", "Always", "IfNotPresent", "Never"].contains(&n.image_pull_policy.as_str()) {
        errs.push(format!("nodeRegistration.imagePullPolicy: Invalid value: {:?}: invalid pull policy. Valid values are: [\"Always\" \"IfNotPresent\" \"Never\"]", n.image_pull_policy));
    }
    let ca = if c.ca_cert_path.is_empty() {
        "/etc/kubernetes/pki/ca.crt"
    } else {
        &c.ca_cert_path
    };
    if !ca.starts_with('/') || !ca.ends_with(".crt") {
        errs.push(format!(
            "caCertPath: Invalid value: {ca:?}: the ca certificate path must be an absolute path"
        ));
    }
    errs
}

fn dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Go's `time.ParseDuration` for the forms kubeadm configs use (`4m0s`, `5m`, `30s`, `1h`,
/// `500ms`).
pub fn duration(s: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("time: invalid duration {s:?}");
    if s == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..n].parse().map_err(|_| bad())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * scale;
        rest = &rest[u..];
    }
    Ok(std::time::Duration::from_secs_f64(total))
}

/// The v1beta4 defaults (`SetDefaults_Timeouts`): kubelet health check 4m, TLS bootstrap 5m,
/// discovery 5m.
#[derive(Debug, Clone, Copy)]
pub struct Waits {
    pub kubelet_health_check: std::time::Duration,
    pub tls_bootstrap: std::time::Duration,
    pub discovery: std::time::Duration,
}

impl Waits {
    pub fn of(t: Option<&Timeouts>) -> Result<Waits, String> {
        let get = |v: Option<&String>, default: u64| -> Result<std::time::Duration, String> {
            match v {
                Some(s) => duration(s).map_err(|e| format!("json: {e}")),
                None => Ok(std::time::Duration::from_secs(default)),
            }
        };
        Ok(Waits {
            kubelet_health_check: get(t.and_then(|t| t.kubelet_health_check.as_ref()), 240)?,
            tls_bootstrap: get(t.and_then(|t| t.tls_bootstrap.as_ref()), 300)?,
            discovery: get(t.and_then(|t| t.discovery.as_ref()), 300)?,
        })
    }
}

#[cfg(test)]
mod tests;
