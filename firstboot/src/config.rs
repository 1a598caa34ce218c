//! The contract's input files, read and validated once: `/usr/lib/kiln/image.env`,
//! `max-pods.map`, `/etc/kiln/node.env`, the CA and the one credential. Every error names
//! the file, line or key, what was expected and what was found. Secrets are never echoed.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::envfile::{self, EnvFile};
use crate::error::Error;
use crate::fsutil;
use crate::provider;
use crate::Reason;

pub const IMAGE_ENV: &str = "/usr/lib/kiln/image.env";
pub const MAX_PODS_MAP: &str = "/usr/lib/kiln/max-pods.map";
pub const DEFAULT_KUBELET_CONFIG: &str = "/usr/lib/kiln/kubelet-config.yaml";
pub const NODE_ENV: &str = "/etc/kiln/node.env";
pub const CA_CRT: &str = "/etc/kiln/ca.crt";
pub const BOOTSTRAP_KUBECONFIG: &str = "/etc/kiln/bootstrap-kubeconfig";
pub const BOOTSTRAP_TOKEN: &str = "/etc/kiln/bootstrap-token";
pub const KUBEADM_JOIN: &str = "/etc/kiln/kubeadm-join.yaml";
pub const KUBELET_CONFIG_OVERRIDE: &str = "/etc/kiln/kubelet-config.yaml";
/// The kubeconfig firstboot writes from a bootstrap token.
pub const RUN_BOOTSTRAP_KUBECONFIG: &str = "/run/kiln/bootstrap-kubeconfig";

/// The contract version this build speaks.
pub const CONTRACT: &str = "1";
const DEFAULT_DEADLINE: u64 = 300;
const DEFAULT_MAX_PODS: u32 = 110;
const IMAGE_REQUIRED: [&str; 7] = [
    "KILN_CONTRACT",
    "KILN_IMAGE_ID",
    "KILN_IMAGE_NAME",
    "KILN_VERSION",
    "KILN_OS",
    "KILN_ARCH",
    "KUBERNETES_VERSION",
];
const NODE_REQUIRED: [&str; 3] = ["KILN_CONTRACT", "API_SERVER", "CLUSTER_NAME"];

/// How the node joins the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinMode {
    /// kubelet's own TLS bootstrap with a bootstrap kubeconfig.
    Kubelet,
    /// `kubeadm join --config`.
    Kubeadm,
}

/// The credential the provisioner placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// `/etc/kiln/bootstrap-kubeconfig`, used as it is.
    Kubeconfig,
    /// `/etc/kiln/bootstrap-token`: firstboot writes the kubeconfig around it.
    Token(String),
    /// `/etc/kiln/kubeadm-join.yaml`.
    KubeadmJoin,
}

/// The validated inputs of one run.
#[derive(Debug, Clone)]
pub struct Config {
    pub image: EnvFile,
    pub node: EnvFile,
    pub join_mode: JoinMode,
    pub credential: Credential,
    /// `auto` or a provider name.
    pub provider: String,
    pub deadline_secs: u64,
    /// Node path (not root-prefixed) of the kubelet config kubelet will read.
    pub kubelet_config: String,
    pub kubelet_unit: String,
    pub runtime_endpoint: String,
    max_pods_map: Vec<(String, u32)>,
    default_max_pods: u32,
}

impl Config {
    /// The image id for status reports.
    pub fn image_id(&self) -> &str {
        self.image.get("KILN_IMAGE_ID").unwrap_or("")
    }

    /// `MAX_PODS` from node.env, else the baked map, else the image default.
    pub fn max_pods(&self, instance_type: &str) -> u32 {
        if let Some(n) = self.node.non_empty("MAX_PODS").and_then(|v| v.parse().ok()) {
            return n;
        }
        self.max_pods_map
            .iter()
            .find(|(t, _)| t == instance_type)
            .map(|(_, n)| *n)
            .unwrap_or(self.default_max_pods)
    }

    /// A node.env value, empty when unset.
    pub fn node_value(&self, key: &str) -> &str {
        self.node.get(key).unwrap_or("")
    }
}

fn missing(m: String) -> Error {
    Error::config(Reason::ConfigMissing, m)
}

fn invalid(m: String) -> Error {
    Error::config(Reason::ConfigInvalid, m)
}

/// Reads and parses an env file; `Ok(None)` when it does not exist.
fn read_env(root: &Path, path: &str) -> Result<Option<EnvFile>, Error> {
    let full = fsutil::under(root, path);
    let Some(text) = fsutil::read_capped(&full, envfile::MAX_LEN as u64).map_err(invalid)? else {
        return Ok(None);
    };
    envfile::parse(&text)
        .map(Some)
        .map_err(|e| invalid(format!("{}: {e}", full.display())))
}

fn require_env(root: &Path, path: &str, required: &[&str]) -> Result<EnvFile, Error> {
    let full = fsutil::under(root, path);
    let env = read_env(root, path)?
        .ok_or_else(|| missing(format!("{}: required file not found", full.display())))?;
    match env.get("KILN_CONTRACT") {
        Some(CONTRACT) => {}
        found => {
            return Err(Error::config(
                Reason::ContractVersion,
                format!(
                    "{}: KILN_CONTRACT: expected {CONTRACT}, found {}",
                    full.display(),
                    found.map_or("no such key".to_string(), |v| format!("{v:?}"))
                ),
            ))
        }
    }
    for key in required {
        if env.non_empty(key).is_none() {
            return Err(missing(format!(
                "{}: required key {key} is missing or empty",
                full.display()
            )));
        }
    }
    Ok(env)
}

/// Parses `max-pods.map`: `instance-type pods` lines, `#` comments, first entry wins.
pub fn parse_max_pods(text: &str) -> Result<Vec<(String, u32)>, String> {
    let mut out: Vec<(String, u32)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let mut parts = t.split_whitespace();
        let (Some(ty), Some(n), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "line {}: expected `instance-type pods`, found {t:?}",
                i + 1
            ));
        };
        let n: u32 =
            n.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                format!("line {}: expected a positive pod count, found {n:?}", i + 1)
            })?;
        if !out.iter().any(|(t, _)| t == ty) {
            out.push((ty.to_string(), n));
        }
    }
    Ok(out)
}

/// Checks one node.env value against its expected shape.
fn validate(file: &Path, key: &str, value: &str) -> Result<(), Error> {
    let bad = |expected: &str| {
        invalid(format!(
            "{}: {key}: expected {expected}, found {value:?}",
            file.display()
        ))
    };
    let is_name = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'/'))
    };
    match key {
        "API_SERVER" => {
            let rest = value
                .strip_prefix("https://")
                .ok_or_else(|| bad("https://host[:port]"))?;
            let host = rest.trim_end_matches('/');
            if host.is_empty()
                || host.contains(['/', '?', '#', '@'])
                || !host.bytes().all(|b| b.is_ascii_graphic())
            {
                return Err(bad("https://host[:port]"));
            }
        }
        "CLUSTER_NAME" if !is_name(value) => return Err(bad("a name of [A-Za-z0-9._-]")),
        "JOIN_MODE" if !matches!(value, "" | "kubelet" | "kubeadm") => {
            return Err(bad("kubelet or kubeadm"))
        }
        "PROVIDER" if !value.is_empty() && value != "auto" && !provider::NAMES.contains(&value) => {
            return Err(bad(
                "auto, aws, azure, gcp, openstack, vmware, qemu or none",
            ))
        }
        "NODE_NAME" if !value.is_empty() && !is_name(value) => {
            return Err(bad("a node name of [a-z0-9.-]"))
        }
        "NODE_IP" if !value.is_empty() && value.parse::<IpAddr>().is_err() => {
            return Err(bad("an IP address"))
        }
        "MAX_PODS" if !value.is_empty() && value.parse::<u32>().map_or(true, |n| n == 0) => {
            return Err(bad("a positive integer"))
        }
        "KILN_DEADLINE" if !value.is_empty() && value.parse::<u64>().map_or(true, |n| n == 0) => {
            return Err(bad("a positive number of seconds"))
        }
        "CLUSTER_DNS"
            if !value.is_empty() && value.split(',').any(|ip| ip.parse::<IpAddr>().is_err()) =>
        {
            return Err(bad("comma-separated IP addresses"))
        }
        "NODE_LABELS" if !value.is_empty() => {
            for item in value.split(',') {
                match item.split_once('=') {
                    Some((k, v)) if is_name(k) && (v.is_empty() || is_name(v)) => {}
                    _ => return Err(bad("comma-separated key=value labels")),
                }
            }
        }
        "NODE_TAINTS" if !value.is_empty() => {
            for item in value.split(',') {
                let ok = item.rsplit_once(':').is_some_and(|(kv, effect)| {
                    matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
                        && kv.split('=').next().is_some_and(is_name)
                        && kv
                            .split('=')
                            .nth(1)
                            .is_none_or(|v| v.is_empty() || is_name(v))
                        && kv.split('=').count() <= 2
                });
                if !ok {
                    return Err(bad("comma-separated key[=value]:Effect taints"));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Reads, checks and combines every input file under `root`.
/// `deadline_flag` (`--deadline`) beats node.env, which beats image.env.
pub fn load(root: &Path, deadline_flag: Option<u64>) -> Result<Config, Error> {
    let image = require_env(root, IMAGE_ENV, &IMAGE_REQUIRED)?;
    let node = require_env(root, NODE_ENV, &NODE_REQUIRED)?;
    let node_path = fsutil::under(root, NODE_ENV);
    for (k, v) in node.entries() {
        validate(&node_path, k, v)?;
    }
    let image_path = fsutil::under(root, IMAGE_ENV);
    let number = |file: &Path, env: &EnvFile, key: &str| -> Result<Option<u64>, Error> {
        match env.non_empty(key) {
            None => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .map(Some)
                .ok_or_else(|| {
                    invalid(format!(
                        "{}: {key}: expected a positive integer, found {v:?}",
                        file.display()
                    ))
                }),
        }
    };
    let deadline_secs = match deadline_flag {
        Some(d) => d,
        None => match number(&node_path, &node, "KILN_DEADLINE")? {
            Some(d) => d,
            None => number(&image_path, &image, "KILN_DEADLINE")?.unwrap_or(DEFAULT_DEADLINE),
        },
    };
    let default_max_pods = number(&image_path, &image, "DEFAULT_MAX_PODS")?
        .map_or(DEFAULT_MAX_PODS, |n| n.min(u64::from(u32::MAX)) as u32);

    let map_path = fsutil::under(root, MAX_PODS_MAP);
    let max_pods_map = match fsutil::read_capped(&map_path, 4 * 1024 * 1024).map_err(invalid)? {
        Some(text) => {
            parse_max_pods(&text).map_err(|m| invalid(format!("{}: {m}", map_path.display())))?
        }
        None => Vec::new(),
    };

    let ca = fsutil::under(root, CA_CRT);
    match fsutil::read_capped(&ca, 1024 * 1024).map_err(invalid)? {
        None => {
            return Err(missing(format!(
                "{}: required file not found (the cluster CA)",
                ca.display()
            )))
        }
        Some(t) if !t.contains("-----BEGIN CERTIFICATE-----") => {
            return Err(invalid(format!(
                "{}: expected a PEM certificate (-----BEGIN CERTIFICATE-----), found none",
                ca.display()
            )))
        }
        Some(_) => {}
    }

    let join_mode = match node.get("JOIN_MODE") {
        Some("kubeadm") => JoinMode::Kubeadm,
        _ => JoinMode::Kubelet,
    };
    let credential = credential(root, join_mode)?;

    let override_cfg = fsutil::under(root, KUBELET_CONFIG_OVERRIDE);
    let kubelet_config = if override_cfg.is_file() {
        KUBELET_CONFIG_OVERRIDE.to_string()
    } else {
        image
            .non_empty("KUBELET_CONFIG")
            .unwrap_or(DEFAULT_KUBELET_CONFIG)
            .to_string()
    };
    Ok(Config {
        provider: node.non_empty("PROVIDER").unwrap_or("auto").to_string(),
        kubelet_unit: image
            .non_empty("KUBELET_UNIT")
            .unwrap_or("kubelet.service")
            .to_string(),
        runtime_endpoint: image
            .non_empty("CONTAINER_RUNTIME_ENDPOINT")
            .unwrap_or("unix:///run/containerd/containerd.sock")
            .to_string(),
        kubelet_config,
        image,
        node,
        join_mode,
        credential,
        deadline_secs,
        max_pods_map,
        default_max_pods,
    })
}

/// Finds the one credential the join mode needs, and checks it is not readable by others.
fn credential(root: &Path, mode: JoinMode) -> Result<Credential, Error> {
    let kubeconfig = fsutil::under(root, BOOTSTRAP_KUBECONFIG);
    let token = fsutil::under(root, BOOTSTRAP_TOKEN);
    let join = fsutil::under(root, KUBEADM_JOIN);
    let present: Vec<&PathBuf> = match mode {
        JoinMode::Kubelet => [&kubeconfig, &token]
            .into_iter()
            .filter(|p| p.is_file())
            .collect(),
        JoinMode::Kubeadm => [&join].into_iter().filter(|p| p.is_file()).collect(),
    };
    let looked = match mode {
        JoinMode::Kubelet => format!("{} or {}", kubeconfig.display(), token.display()),
        JoinMode::Kubeadm => join.display().to_string(),
    };
    let path = match present.as_slice() {
        [] => {
            return Err(missing(format!(
                "no credential for JOIN_MODE={}: expected {looked}, found neither",
                if mode == JoinMode::Kubeadm {
                    "kubeadm"
                } else {
                    "kubelet"
                }
            )))
        }
        [one] => *one,
        _ => {
            return Err(invalid(format!(
                "expected exactly one credential, found both {} and {}",
                kubeconfig.display(),
                token.display()
            )))
        }
    };
    match fsutil::too_open(path) {
        Ok(None) => {}
        Ok(Some(m)) => {
            return Err(Error::config(
                Reason::SecretMode,
                format!("{}: expected mode 0600, found 0{m:o}", path.display()),
            ))
        }
        Err(e) => return Err(invalid(format!("{}: cannot stat: {e}", path.display()))),
    }
    if let Ok(Some(uid)) = fsutil::foreign_owner(path) {
        return Err(Error::config(
            Reason::SecretMode,
            format!(
                "{}: expected to be owned by root, found owner uid {uid}",
                path.display()
            ),
        ));
    }
    if path == &join {
        return Ok(Credential::KubeadmJoin);
    }
    if path == &kubeconfig {
        return Ok(Credential::Kubeconfig);
    }
    let text = fsutil::read_capped(path, 4096)
        .map_err(invalid)?
        .unwrap_or_default();
    let t = text.trim();
    if !valid_token(t) {
        return Err(invalid(format!(
            "{}: expected one line [a-z0-9]{{6}}.[a-z0-9]{{16}}, found {} bytes that do not match (the value is not printed)",
            path.display(),
            t.len()
        )));
    }
    Ok(Credential::Token(t.to_string()))
}

/// True for a kubeadm bootstrap token, `[a-z0-9]{6}.[a-z0-9]{16}`.
pub fn valid_token(t: &str) -> bool {
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    t.split_once('.')
        .is_some_and(|(id, secret)| ok(id, 6) && ok(secret, 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_pods_map() {
        let m =
            parse_max_pods("# instance-type pods\nm5.large 29\n\nm5.xlarge   58\nm5.large 99\n")
                .unwrap();
        assert_eq!(
            m,
            [("m5.large".to_string(), 29), ("m5.xlarge".to_string(), 58)]
        );
        for (bad, needle) in [
            ("m5.large\n", "line 1: expected `instance-type pods`"),
            ("a 1\nm5.large x\n", "line 2: expected a positive"),
            ("m5.large 0\n", "positive"),
            ("m5.large 1 2\n", "expected `instance-type pods`"),
        ] {
            assert!(parse_max_pods(bad).unwrap_err().contains(needle), "{bad}");
        }
    }

    #[test]
    fn tokens() {
        assert!(valid_token("abcdef.0123456789abcdef"));
        for bad in [
            "",
            "abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcde!",
        ] {
            assert!(!valid_token(bad), "{bad}");
        }
    }

    #[test]
    fn node_values() {
        let f = Path::new("/etc/kiln/node.env");
        let good: &[(&str, &str)] = &[
            ("API_SERVER", "https://10.0.0.10:6443"),
            ("API_SERVER", "https://api.example.com"),
            ("NODE_LABELS", "role=worker,node.kubernetes.io/pool=a"),
            ("NODE_TAINTS", "gpu=true:NoSchedule,dedicated:NoExecute"),
            ("CLUSTER_DNS", "10.96.0.10,fd00::a"),
            ("MAX_PODS", "58"),
            ("PROVIDER", "auto"),
            ("UNKNOWN_FUTURE_KEY", "anything goes"),
        ];
        for (k, v) in good {
            assert!(validate(f, k, v).is_ok(), "{k}={v}");
        }
        let bad: &[(&str, &str)] = &[
            ("API_SERVER", "http://10.0.0.10:6443"),
            ("API_SERVER", "https://"),
            ("API_SERVER", "https://h/path"),
            ("NODE_LABELS", "role"),
            ("NODE_LABELS", "a=b c"),
            ("NODE_TAINTS", "gpu=true:Sometimes"),
            ("NODE_TAINTS", "gpu=true"),
            ("NODE_IP", "10.0.0"),
            ("MAX_PODS", "0"),
            ("JOIN_MODE", "ssh"),
            ("PROVIDER", "digitalocean"),
            ("CLUSTER_NAME", "a b"),
        ];
        for (k, v) in bad {
            let e = validate(f, k, v).expect_err(&format!("{k}={v}"));
            assert!(e.to_string().contains(k), "{e}");
            assert_eq!(e.reason(), Reason::ConfigInvalid);
        }
    }
}
