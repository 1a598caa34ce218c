//! `node.toml`, the neutral node config: parsed strictly (unknown keys refused) and validated
//! once into [`NodeConfig`], which turns into the contract's `/etc/kiln/` files.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kiln_firstboot::contract::envfile::EnvFile;
use kiln_firstboot::contract::{self, node_env, sizing};

/// Errors of reading and validating `node.toml`; each names the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file (or a file it points to) could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Not valid TOML, an unknown key, or a value of the wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with the line and the key.
        message: String,
    },
    /// A key has a value the contract cannot carry.
    #[error("{path}: key `{key}`: expected {expected}, found {found}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Dotted key, e.g. `bootstrap.token`.
        key: String,
        /// What a valid value looks like.
        expected: String,
        /// What was there.
        found: String,
    },
}

pub use kiln_firstboot::contract::node_env::{JoinMode, Provider};
use kiln_firstboot::contract::node_env::{JOIN_MODES, PROVIDER_CHOICES};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

/// `provider = "…"`: the contract's names (`auto` is `None`), refused as serde refuses an
/// unknown enum variant, so the message lists the choices.
pub(crate) fn provider_choice<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<Provider>>, D::Error> {
    let s = String::deserialize(d)?;
    match Provider::parse_choice(&s) {
        Ok(p) if !s.is_empty() => Ok(Some(p)),
        _ => Err(D::Error::unknown_variant(&s, &PROVIDER_CHOICES)),
    }
}

/// `join_mode = "…"`: the contract's names.
pub(crate) fn join_mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<JoinMode>, D::Error> {
    let s = String::deserialize(d)?;
    match JoinMode::parse(&s) {
        Some(m) if !s.is_empty() => Ok(Some(m)),
        _ => Err(D::Error::unknown_variant(&s, &JOIN_MODES)),
    }
}

/// The API server URL split into what the different files need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServer {
    /// As written, without a trailing `/`: `https://host[:port]`.
    pub url: String,
    /// `host:port` (port 443 when the URL has none), as kubeadm's `apiServerEndpoint` wants it.
    pub endpoint: String,
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    /// Taint key.
    pub key: String,
    /// Taint value (may be empty).
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

impl Taint {
    /// `key=value:Effect` (or `key:Effect`), the kubelet flag form.
    pub fn flag_form(&self) -> String {
        if self.value.is_empty() {
            format!("{}:{}", self.key, self.effect)
        } else {
            format!("{}={}:{}", self.key, self.value, self.effect)
        }
    }
}

/// How the node authenticates to the API server for its first certificate.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// A bootstrap token `[a-z0-9]{6}.[a-z0-9]{16}`.
    Token(String),
    /// A complete bootstrap kubeconfig, kept byte for byte.
    Kubeconfig(Vec<u8>),
}

impl std::fmt::Debug for Credential {
    // Never print a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Token(_) => f.write_str("Token(<redacted>)"),
            Credential::Kubeconfig(k) => write!(f, "Kubeconfig(<{} bytes>)", k.len()),
        }
    }
}

/// A validated node config: everything needed to write `/etc/kiln/`.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The API server.
    pub api_server: ApiServer,
    /// Cluster name.
    pub cluster_name: String,
    /// Join mode.
    pub join_mode: JoinMode,
    /// Metadata source; `None` is `auto` (firstboot detects it).
    pub provider: Option<Provider>,
    /// Global boot deadline override, seconds.
    pub deadline: Option<u64>,
    /// The cluster CA bundle (PEM), as given.
    pub ca_pem: Vec<u8>,
    /// SHA-256 of each CA certificate's SubjectPublicKeyInfo (kubeadm's `caCertHashes`).
    pub ca_spki_sha256: Vec<String>,
    /// The bootstrap credential.
    pub credential: Credential,
    /// Node name override.
    pub node_name: Option<String>,
    /// Node IP override.
    pub node_ip: Option<String>,
    /// Node labels, sorted by key.
    pub labels: BTreeMap<String, String>,
    /// Node taints, in the order given.
    pub taints: Vec<Taint>,
    /// Max pods override.
    pub max_pods: Option<u32>,
    /// `node.kube_reserved`, `node.system_reserved`, `node.eviction_hard` as node.env writes
    /// them (`cpu=100m,memory=1Gi`, `memory.available<500Mi`), each `None` when not given.
    pub reserved: [Option<String>; 3],
    /// Extra kubelet flags (`--name[=value]`).
    pub kubelet_extra_args: Vec<String>,
    /// The node's KubeletConfiguration drop-in (`kubelet.config_file` and `[kubelet.config]`
    /// merged and checked), merged by kubelet over the image's config.
    pub kubelet_dropin: Option<Vec<u8>>,
    /// `[sysctl]`: kernel parameters, checked, sorted by name.
    pub sysctl: Vec<(String, String)>,
    /// `[[containerd.registry]]`: containerd host directories, in node.toml's order.
    pub registries: Vec<crate::render::registries::Registry>,
    /// `[containerd.config]` or `containerd.config_file`, as written for the node (version
    /// line first).
    pub containerd_config: Option<String>,
    /// `[[kubelet.credential_provider]]` as kubelet's `CredentialProviderConfig` (JSON).
    pub credential_providers: Option<Vec<u8>>,
    /// `[trust]`: CA certificates containerd and kubelet trust beside the system's (PEM).
    pub trust_pem: Option<Vec<u8>>,
    /// `swap.file_size` in bytes: node.env's `SWAP_FILE_SIZE`.
    pub swap_file_size: Option<u64>,
    /// Cluster DNS addresses.
    pub cluster_dns: Vec<String>,
    /// `[kubelet] server_tls_bootstrap`: kubelet asks the cluster for its serving certificate
    /// (a `kubernetes.io/kubelet-serving` CSR) instead of signing its own, in either join mode.
    pub server_tls_bootstrap: bool,
    /// `HTTP_PROXY`.
    pub http_proxy: Option<String>,
    /// `HTTPS_PROXY`.
    pub https_proxy: Option<String>,
    /// `NO_PROXY` entries.
    pub no_proxy: Vec<String>,
}

impl NodeConfig {
    /// `node.env`, keys in the contract's table order.
    pub fn node_env(&self) -> String {
        let join = |v: &[String], sep: &str| (!v.is_empty()).then(|| v.join(sep));
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let taints: Vec<String> = self.taints.iter().map(Taint::flag_form).collect();
        let mut env = EnvFile::default();
        env.comment("kiln node contract v1: written by `kiln render` from node.toml.")
            .set(contract::KILN_CONTRACT, contract::VERSION_TEXT)
            .set(node_env::API_SERVER, self.api_server.url.clone())
            .set(node_env::CLUSTER_NAME, self.cluster_name.clone())
            .set(node_env::JOIN_MODE, self.join_mode.as_str())
            .set(
                node_env::PROVIDER,
                self.provider.map_or("auto", Provider::name),
            )
            .set_opt(node_env::NODE_NAME, self.node_name.clone())
            .set_opt(node_env::NODE_IP, self.node_ip.clone())
            .set_opt(node_env::NODE_LABELS, join(&labels, ","))
            .set_opt(node_env::NODE_TAINTS, join(&taints, ","))
            .set_opt(node_env::MAX_PODS, self.max_pods.map(|n| n.to_string()))
            .set_opt(sizing::KUBE_RESERVED, self.reserved[0].clone())
            .set_opt(sizing::SYSTEM_RESERVED, self.reserved[1].clone())
            .set_opt(sizing::EVICTION_HARD, self.reserved[2].clone())
            .set_opt(node_env::CLUSTER_DNS, join(&self.cluster_dns, ","))
            .set_opt(
                node_env::KUBELET_EXTRA_ARGS,
                join(&self.kubelet_extra_args, " "),
            )
            .set_opt(
                node_env::KUBELET_SERVER_TLS_BOOTSTRAP,
                self.server_tls_bootstrap.then(|| "true".to_string()),
            )
            .set_opt(
                node_env::KILN_DEADLINE,
                self.deadline.map(|n| n.to_string()),
            )
            .set_opt(
                node_env::SWAP_FILE_SIZE,
                self.swap_file_size.map(|n| n.to_string()),
            )
            .set_opt(node_env::HTTP_PROXY, self.http_proxy.clone())
            .set_opt(node_env::HTTPS_PROXY, self.https_proxy.clone())
            .set_opt(node_env::NO_PROXY, join(&self.no_proxy, ","));
        env.to_string()
    }
}
