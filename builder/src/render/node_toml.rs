//! Reading `node.toml`: the file as written (strict serde types, unknown keys refused), then
//! validated once, key by key, into a [`NodeConfig`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use kiln_firstboot::contract::{self, envfile};
use kiln_firstboot::redact::valid_token;
use serde::Deserialize;

use crate::render::config::{ConfigError, Credential, JoinMode, NodeConfig};
use crate::render::names::{is_dns_subdomain, is_label_value, is_qualified_key};
use crate::render::{config::Provider, config::Taint, input, pki};

mod registries;
mod sections;

// ---- the file as written by the user ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    kiln_contract: Option<u32>,
    api_server: String,
    cluster_name: String,
    #[serde(default, deserialize_with = "crate::render::config::join_mode")]
    join_mode: Option<JoinMode>,
    #[serde(default, deserialize_with = "crate::render::config::provider_choice")]
    provider: Option<Option<Provider>>,
    deadline: Option<u64>,
    ca: RawCa,
    bootstrap: RawBootstrap,
    #[serde(default)]
    node: RawNodeSection,
    #[serde(default)]
    kubelet: RawKubelet,
    #[serde(default)]
    proxy: RawProxy,
    #[serde(default)]
    sysctl: BTreeMap<String, toml::Value>,
    #[serde(default)]
    containerd: RawContainerd,
    trust: Option<RawCa>,
    swap: Option<RawSwap>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSwap {
    behavior: Option<String>,
    file_size: Option<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCa {
    pem: Option<String>,
    file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBootstrap {
    token: Option<String>,
    token_file: Option<PathBuf>,
    kubeconfig_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNodeSection {
    name: Option<String>,
    ip: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    taints: Vec<RawTaint>,
    max_pods: Option<u32>,
    #[serde(default)]
    kube_reserved: BTreeMap<String, String>,
    #[serde(default)]
    system_reserved: BTreeMap<String, String>,
    #[serde(default)]
    eviction_hard: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTaint {
    key: String,
    value: Option<String>,
    effect: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKubelet {
    #[serde(default)]
    extra_args: Vec<String>,
    config_file: Option<PathBuf>,
    config: Option<toml::Table>,
    #[serde(default)]
    cluster_dns: Vec<String>,
    #[serde(default)]
    server_tls_bootstrap: bool,
    #[serde(default)]
    credential_provider: Vec<RawCredentialProvider>,
}

/// `[[kubelet.credential_provider]]`: one of kubelet's image credential provider plugins.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCredentialProvider {
    name: String,
    match_images: Vec<String>,
    default_cache_duration: String,
    api_version: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProxy {
    http: Option<String>,
    https: Option<String>,
    #[serde(default)]
    no_proxy: Vec<String>,
}

/// `[containerd]` of node.toml.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawContainerd {
    #[serde(default, rename = "registry")]
    registries: Vec<RawRegistry>,
    config: Option<toml::Table>,
    config_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegistry {
    host: String,
    server: Option<String>,
    #[serde(default)]
    mirrors: Vec<toml::Value>,
    ca: Option<RawCa>,
    // Named so that it gets its own refusal rather than serde's "unknown field".
    skip_verify: Option<toml::Value>,
}

// ---- the validated, runtime form ----

impl NodeConfig {
    /// Reads and validates `path`; files it points to are relative to its directory.
    pub fn load(path: &Path) -> Result<NodeConfig, ConfigError> {
        let text =
            input::read_text(path, input::MAX_OTHER).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        let base = path.parent().unwrap_or(Path::new("."));
        NodeConfig::parse(&text, path, base)
    }

    /// Validates `text` (the contents of `path`); relative file keys resolve against `base`.
    pub fn parse(text: &str, path: &Path, base: &Path) -> Result<NodeConfig, ConfigError> {
        let raw: RawNode = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: capped_lines(e.to_string().trim_end(), 200),
        })?;
        Validator { path, base }.validate(raw)
    }
}

struct Validator<'a> {
    path: &'a Path,
    base: &'a Path,
}

impl Validator<'_> {
    fn invalid(&self, key: &str, expected: &str, found: impl std::fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            expected: expected.to_string(),
            found: found.to_string(),
        }
    }

    fn read(&self, key: &str, file: &Path) -> Result<Vec<u8>, ConfigError> {
        let full = self.base.join(file);
        let cap = match key {
            "ca.file" => input::MAX_CA,
            "bootstrap.token_file" => input::MAX_TOKEN,
            _ => input::MAX_OTHER,
        };
        input::read_regular(&full, cap).map_err(|source| ConfigError::Read {
            path: full.clone(),
            source: std::io::Error::new(
                source.kind(),
                format!("{source} (named by key `{key}` in {})", self.path.display()),
            ),
        })
    }

    #[allow(
        clippy::too_many_lines,
        reason = "one check per node.toml key, in the order docs/render.md's key table lists them, each naming its key in its error"
    )]
    fn validate(&self, raw: RawNode) -> Result<NodeConfig, ConfigError> {
        if let Some(v) = raw.kiln_contract {
            if v != contract::VERSION {
                return Err(self.invalid("kiln_contract", "1 (the contract this kiln renders)", v));
            }
        }
        let api_server = self.api_server(&raw.api_server)?;
        let cluster_name = raw.cluster_name;
        let name_ok = !cluster_name.is_empty()
            && cluster_name.len() <= 100
            && cluster_name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && cluster_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !name_ok {
            return Err(self.invalid(
                "cluster_name",
                "1-100 characters of [A-Za-z0-9._-], starting with a letter or digit",
                format!("{cluster_name:?}"),
            ));
        }
        let join_mode = raw.join_mode.unwrap_or_default();
        if let Some(d) = raw.deadline {
            if !(1..=86_400).contains(&d) {
                return Err(self.invalid("deadline", "whole seconds from 1 to 86400", d));
            }
        }

        let (ca_pem, ca_spki_sha256) = self.ca(raw.ca)?;
        let credential = self.credential(raw.bootstrap, join_mode)?;

        let node = raw.node;
        let reserved = self.reserved(&node)?;
        if let Some(name) = &node.name {
            if !is_dns_subdomain(name) {
                return Err(self.invalid(
                    "node.name",
                    "a DNS subdomain: lower-case letters, digits, `-` and `.`, at most 253",
                    format!("{name:?}"),
                ));
            }
        }
        if let Some(ip) = &node.ip {
            if ip.parse::<IpAddr>().is_err() {
                return Err(self.invalid("node.ip", "an IPv4 or IPv6 address", format!("{ip:?}")));
            }
        }
        for (k, v) in &node.labels {
            if !is_qualified_key(k) {
                return Err(self.invalid(
                    &format!("node.labels.{k:?}"),
                    "a label key: [prefix/]name, name at most 63 of [A-Za-z0-9._-]",
                    format!("{k:?}"),
                ));
            }
            if !is_label_value(v) {
                return Err(self.invalid(
                    &format!("node.labels.{k:?}"),
                    "a label value: empty or at most 63 of [A-Za-z0-9._-], alphanumeric at both ends",
                    format!("{v:?}"),
                ));
            }
        }
        let mut taints = Vec::new();
        for (i, t) in node.taints.into_iter().enumerate() {
            let key = format!("node.taints[{i}]");
            if !is_qualified_key(&t.key) {
                return Err(self.invalid(
                    &format!("{key}.key"),
                    "a taint key",
                    format!("{:?}", t.key),
                ));
            }
            let value = t.value.unwrap_or_default();
            if !is_label_value(&value) {
                return Err(self.invalid(
                    &format!("{key}.value"),
                    "a taint value: empty or at most 63 of [A-Za-z0-9._-]",
                    format!("{value:?}"),
                ));
            }
            if !matches!(
                t.effect.as_str(),
                "NoSchedule" | "PreferNoSchedule" | "NoExecute"
            ) {
                return Err(self.invalid(
                    &format!("{key}.effect"),
                    "NoSchedule, PreferNoSchedule or NoExecute",
                    format!("{:?}", t.effect),
                ));
            }
            taints.push(Taint {
                key: t.key,
                value,
                effect: t.effect,
            });
        }
        if node.max_pods == Some(0) {
            return Err(self.invalid("node.max_pods", "a positive number", 0));
        }

        let kubelet = raw.kubelet;
        for (i, arg) in kubelet.extra_args.iter().enumerate() {
            let ok = arg.len() > 2
                && arg.starts_with("--")
                && arg[2..].starts_with(|c: char| c.is_ascii_alphanumeric())
                && !arg.chars().any(|c| {
                    c.is_whitespace()
                        || c.is_control()
                        || matches!(c, '"' | '\'' | '\\' | '$' | '`')
                });
            if !ok {
                return Err(self.invalid(
                    &format!("kubelet.extra_args[{i}]"),
                    "one flag `--name` or `--name=value`, without whitespace, quotes, `\\`, `$` or a backtick",
                    format!("{arg:?}"),
                ));
            }
        }
        for (i, ip) in kubelet.cluster_dns.iter().enumerate() {
            if ip.parse::<IpAddr>().is_err() {
                return Err(self.invalid(
                    &format!("kubelet.cluster_dns[{i}]"),
                    "an IPv4 or IPv6 address",
                    format!("{ip:?}"),
                ));
            }
        }
        let swap_file_size = self.swap_file_size(raw.swap.as_ref())?;
        let kubelet_dropin = self.kubelet_dropin(&kubelet, raw.swap.as_ref())?;
        let credential_providers = self.credential_providers(&kubelet)?;
        let sysctl = self.sysctl(&raw.sysctl)?;
        let containerd_config = self.containerd_config(&raw.containerd)?;
        let registries = self.registries(raw.containerd)?;
        let trust_pem = raw.trust.map(|t| self.pem_bundle("trust", t)).transpose()?;

        let proxy = raw.proxy;
        for (key, url) in [("proxy.http", &proxy.http), ("proxy.https", &proxy.https)] {
            if let Some(url) = url {
                self.proxy_url(key, url)?;
            }
        }
        for (i, entry) in proxy.no_proxy.iter().enumerate() {
            if entry.is_empty() || entry.contains(',') || !plain_token(entry) {
                return Err(self.invalid(
                    &format!("proxy.no_proxy[{i}]"),
                    "a host, domain or CIDR without commas, whitespace or quotes",
                    format!("{entry:?}"),
                ));
            }
        }
        if proxy.http.is_some() || proxy.https.is_some() {
            self.no_proxy_covers(&proxy.no_proxy, &api_server)?;
        }

        Ok(NodeConfig {
            api_server,
            cluster_name,
            join_mode,
            provider: raw.provider.flatten(),
            deadline: raw.deadline,
            ca_pem,
            ca_spki_sha256,
            credential,
            node_name: node.name,
            node_ip: node.ip,
            labels: node.labels,
            taints,
            max_pods: node.max_pods,
            reserved,
            kubelet_extra_args: kubelet.extra_args,
            kubelet_dropin,
            sysctl,
            registries,
            containerd_config,
            credential_providers,
            trust_pem,
            swap_file_size,
            cluster_dns: kubelet.cluster_dns,
            server_tls_bootstrap: kubelet.server_tls_bootstrap,
            http_proxy: proxy.http,
            https_proxy: proxy.https,
            no_proxy: proxy.no_proxy,
        })
    }

    fn ca(&self, ca: RawCa) -> Result<(Vec<u8>, Vec<String>), ConfigError> {
        let pem = match (ca.pem, ca.file) {
            (Some(pem), None) => pem.into_bytes(),
            (None, Some(file)) => self.read("ca.file", &file)?,
            (a, b) => {
                return Err(self.invalid(
                    "ca",
                    "exactly one of `ca.pem` (inline PEM) or `ca.file` (a path)",
                    if a.is_some() && b.is_some() {
                        "both"
                    } else {
                        "neither"
                    },
                ))
            }
        };
        let key = "ca";
        let text = std::str::from_utf8(&pem).map_err(|_| {
            self.invalid(key, "a PEM certificate bundle", "bytes that are not UTF-8")
        })?;
        let ders = pki::pem_certificates(text)
            .map_err(|e| self.invalid(key, "a PEM bundle of one or more X.509 certificates", e))?;
        let mut hashes = Vec::new();
        for (i, der) in ders.iter().enumerate() {
            let h = pki::spki_sha256(der).map_err(|e| {
                self.invalid(
                    key,
                    "DER X.509 certificates",
                    format!("certificate {}: {e}", i + 1),
                )
            })?;
            hashes.push(h);
        }
        let mut pem = pem;
        if !pem.ends_with(b"\n") {
            pem.push(b'\n');
        }
        Ok((pem, hashes))
    }

    fn credential(&self, b: RawBootstrap, mode: JoinMode) -> Result<Credential, ConfigError> {
        let given = [
            b.token.is_some(),
            b.token_file.is_some(),
            b.kubeconfig_file.is_some(),
        ]
        .iter()
        .filter(|x| **x)
        .count();
        if given != 1 {
            return Err(self.invalid(
                "bootstrap",
                "exactly one of `bootstrap.token`, `bootstrap.token_file` or `bootstrap.kubeconfig_file`",
                format!("{given} of them"),
            ));
        }
        if let Some(file) = b.kubeconfig_file {
            if mode == JoinMode::Kubeadm {
                return Err(self.invalid(
                    "bootstrap.kubeconfig_file",
                    "`bootstrap.token` or `bootstrap.token_file` with join_mode = \"kubeadm\" \
                     (kubeadm discovers the cluster with a token and the CA hash)",
                    "a kubeconfig",
                ));
            }
            let bytes = self.read("bootstrap.kubeconfig_file", &file)?;
            self.yaml_kind("bootstrap.kubeconfig_file", &bytes, "Config", Some("v1"))?;
            return Ok(Credential::Kubeconfig(bytes));
        }
        let (key, token) = match (b.token, b.token_file) {
            (Some(t), _) => ("bootstrap.token", t),
            (None, Some(file)) => {
                let bytes = self.read("bootstrap.token_file", &file)?;
                // The file may be any file (a wrong path, /etc/shadow): say it is no token,
                // and its length when that short, never its shape or contents.
                let token = String::from_utf8(bytes)
                    .ok()
                    .map(|t| t.trim().to_string())
                    .filter(|t| valid_token(t));
                return match token {
                    Some(t) => Ok(Credential::Token(t)),
                    None => Err(self.invalid(
                        "bootstrap.token_file",
                        "one bootstrap token [a-z0-9]{6}.[a-z0-9]{16} (the file's contents are not shown)",
                        "a file that is not a bootstrap token",
                    )),
                };
            }
            (None, None) => unreachable!("counted above"),
        };
        if !valid_token(&token) {
            // The token is a secret: show its shape, not its value.
            let shape: String = token
                .chars()
                .map(|c| match c {
                    'a'..='z' | '0'..='9' => 'x',
                    '.' => '.',
                    _ => '?',
                })
                .collect();
            return Err(self.invalid(
                key,
                "a bootstrap token [a-z0-9]{6}.[a-z0-9]{16}",
                format!(
                    "a value shaped {shape:?} ({} characters)",
                    token.chars().count()
                ),
            ));
        }
        Ok(Credential::Token(token))
    }

    fn yaml_kind(
        &self,
        key: &str,
        bytes: &[u8],
        kind: &str,
        api_prefix: Option<&str>,
    ) -> Result<(), ConfigError> {
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_slice(bytes).map_err(|e| {
            self.invalid(key, &format!("a YAML {kind}"), format!("invalid YAML: {e}"))
        })?;
        let found_kind = doc.get("kind").and_then(|v| v.as_str()).unwrap_or("");
        let found_api = doc.get("apiVersion").and_then(|v| v.as_str()).unwrap_or("");
        let api_ok = api_prefix.is_none_or(|p| found_api.starts_with(p));
        if found_kind != kind || !api_ok {
            return Err(self.invalid(
                key,
                &format!(
                    "a YAML document with kind: {kind}{}",
                    api_prefix
                        .map(|p| format!(" and apiVersion: {p}…"))
                        .unwrap_or_default()
                ),
                format!("kind: {found_kind:?}, apiVersion: {found_api:?}"),
            ));
        }
        Ok(())
    }
}

/// `msg` with each line cut at `max` characters (`…` marks a cut): the TOML parser quotes
/// the offending line, and a line of node.toml can be megabytes long.
fn capped_lines(msg: &str, max: usize) -> String {
    msg.lines()
        .map(|l| match l.char_indices().nth(max) {
            Some((at, _)) => format!("{}…", &l[..at]),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// No whitespace, quotes, `\`, `$`, backtick or control characters: safe bare in an env file.
fn plain_token(s: &str) -> bool {
    envfile::is_writable(s)
        && !s.chars().any(|c| {
            c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '\\' | '$' | '`')
        })
}
