//! The contract's input files, read and validated once: `/usr/lib/kiln/image.env`,
//! `max-pods.map`, `/etc/kiln/node.env`, the CA and the one credential. Every error names
//! the file, line or key, what was expected and what was found. Secrets are never echoed.
//! The keys, their shapes and the codec are the contract's ([`crate::contract`]); this
//! module reads the files and turns what is wrong into a reason.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::contract::envfile::{self, EnvFile};
use crate::contract::image_env::{self, ImageEnv};
use crate::contract::node_env::{self, Invalid, NodeEnv};
use crate::contract::paths::{self, NodePaths};
use crate::contract::{JoinMode, Provider, KILN_CONTRACT, VERSION_TEXT};
use crate::error::Error;
use crate::fsutil::{self, SecretError};
pub use crate::redact::valid_token;
use crate::redact::{self, Secrets};
use crate::sizing::{Inputs, Machine, Settings};
use crate::Reason;

/// The credential the provisioner placed.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// `/etc/kiln/bootstrap-kubeconfig`, used as it is.
    Kubeconfig,
    /// `/etc/kiln/bootstrap-token`: firstboot writes the kubeconfig around it.
    Token(String),
    /// `/etc/kiln/kubeadm-join.yaml`.
    KubeadmJoin,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token itself.
        f.write_str(match self {
            Credential::Kubeconfig => "Kubeconfig",
            Credential::Token(_) => "Token(..)",
            Credential::KubeadmJoin => "KubeadmJoin",
        })
    }
}

/// The validated inputs of one run.
#[derive(Debug, Clone)]
pub struct Config {
    /// image.env.
    pub image: ImageEnv,
    /// node.env.
    pub node: NodeEnv,
    pub credential: Credential,
    pub deadline_secs: u64,
    /// Node path (not root-prefixed) of the kubelet config kubelet will read.
    pub kubelet_config: String,
    /// The provisioned KubeletConfiguration drop-in (`/etc/kiln/kubelet-dropin.conf`),
    /// copied into kubelet's `--config-dir` after the node's own.
    pub kubelet_dropin: Option<String>,
    /// The node's containerd configuration (`/etc/kiln/containerd/conf.d/provisioned.toml`),
    /// its config version checked against the image's.
    pub containerd_config: Option<String>,
    /// `/etc/kiln/credential-providers.json` is there, and each provider it names has its
    /// binary in the image: kubelet gets the two credential provider flags.
    pub credential_providers: bool,
    /// `/etc/kiln/sysctl.conf`'s settings, checked, in the file's order.
    pub sysctl: Vec<(String, String)>,
    /// The sizing settings of image.env and node.env.
    pub sizing: Settings,
    max_pods_map: Vec<(String, u32)>,
}

impl Config {
    /// The image id for status reports.
    pub fn image_id(&self) -> &str {
        &self.image.image_id
    }

    /// What [`crate::sizing::decide`] needs from this config for a node of `instance_type`,
    /// with the machine (or why it could not be read) and the AWS table's text.
    pub fn sizing_inputs<'a>(
        &'a self,
        instance_type: &'a str,
        machine: Result<Machine, &'a str>,
        table: Option<&'a str>,
    ) -> Inputs<'a> {
        Inputs {
            max_pods_override: self.node.max_pods,
            map_entry: self.map_entry(instance_type),
            default_max_pods: self.image.default_max_pods,
            instance_type,
            machine,
            table,
        }
    }

    /// The baked `max-pods.map` entry for `instance_type`.
    pub fn map_entry(&self, instance_type: &str) -> Option<u32> {
        self.max_pods_map
            .iter()
            .find(|(t, _)| t == instance_type)
            .map(|(_, n)| *n)
    }

    /// How the node joins the cluster.
    pub fn join_mode(&self) -> JoinMode {
        self.node.join_mode
    }

    /// node.env's provider: `None` for `auto`.
    pub fn provider(&self) -> Option<Provider> {
        self.node.provider
    }
}

fn missing(m: String) -> Error {
    Error::config(Reason::ConfigMissing, m)
}

fn invalid(m: String) -> Error {
    Error::config(Reason::ConfigInvalid, m)
}

/// What is wrong with one file, as `file: what` (a value the contract rejects reads
/// `file: KEY: expected …, found …`).
fn at(reason: Reason, file: &Path, what: &dyn fmt::Display) -> Error {
    Error::config(reason, format!("{}: {what}", file.display()))
}

fn invalid_at(file: &Path, what: &dyn fmt::Display) -> Error {
    at(Reason::ConfigInvalid, file, what)
}

/// A secret file that could not be read the safe way: too open, foreign or a symlink is
/// its own reason.
fn secret_error(file: &Path, e: SecretError) -> Error {
    let reason = match e {
        SecretError::TooOpen(_) | SecretError::ForeignOwner(_) | SecretError::Symlink => {
            Reason::SecretMode
        }
        SecretError::Missing => Reason::ConfigMissing,
        _ => Reason::ConfigInvalid,
    };
    at(reason, file, &e)
}

/// Reads and parses an env file; `Ok(None)` when it does not exist.
fn read_env(full: &Path) -> Result<Option<EnvFile>, Error> {
    let Some(text) = fsutil::read_capped(full, envfile::MAX_LEN as u64).map_err(invalid)? else {
        return Ok(None);
    };
    envfile::parse(&text)
        .map(Some)
        .map_err(|e| invalid_at(full, &e))
}

/// Reads an env file that must exist, speak this contract version and set `required`.
fn require_env(full: &Path, required: &[&str]) -> Result<EnvFile, Error> {
    let env = read_env(full)?
        .ok_or_else(|| missing(format!("{}: required file not found", full.display())))?;
    match env.get(KILN_CONTRACT) {
        Some(VERSION_TEXT) => {}
        found => {
            return Err(Error::config(
                Reason::ContractVersion,
                format!(
                    "{}: {KILN_CONTRACT}: expected {VERSION_TEXT}, found {}",
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

/// Reads, checks and combines every input file under `root`.
/// `deadline_flag` (`--deadline`) beats node.env, which beats image.env.
pub fn load(paths: &NodePaths, deadline_flag: Option<u64>) -> Result<Config, Error> {
    load_with_secrets(paths, deadline_flag, &mut Secrets::default())
}

/// [`load`], adding the secret values read on the way (credentials, a private key pasted
/// into the CA file) to `secrets` as they are found, so they reach the run's redactor even
/// when a later check fails.
pub fn load_with_secrets(
    paths: &NodePaths,
    deadline_flag: Option<u64>,
    secrets: &mut Secrets,
) -> Result<Config, Error> {
    let image_path = &paths.image_env;
    let node_path = &paths.node_env;
    let image_raw = require_env(image_path, &image_env::REQUIRED)?;
    let node_raw = require_env(node_path, &node_env::REQUIRED)?;
    let node = NodeEnv::from_env(&node_raw).map_err(|e| invalid_at(node_path, &e))?;
    let image = ImageEnv::from_env(&image_raw).map_err(|e| invalid_at(image_path, &e))?;
    let sizing =
        Settings::from_env(&image_raw, &node_raw).map_err(|(in_image, (key, expected))| {
            let (file, env) = if in_image {
                (image_path, &image_raw)
            } else {
                (node_path, &node_raw)
            };
            let found = env.get(key).unwrap_or("");
            invalid_at(
                file,
                &Invalid {
                    key,
                    expected,
                    found,
                },
            )
        })?;
    let deadline_secs = deadline_flag
        .or(node.deadline_secs)
        .or(image.deadline_secs)
        .unwrap_or(image_env::DEFAULT_DEADLINE_SECS);

    let map_path = &paths.max_pods_map;
    let max_pods_map = match fsutil::read_capped(map_path, 4 * 1024 * 1024).map_err(invalid)? {
        Some(text) => parse_max_pods(&text).map_err(|m| invalid_at(map_path, &m))?,
        None => Vec::new(),
    };

    let ca = &paths.ca_crt;
    match fsutil::read_capped(ca, 1024 * 1024).map_err(invalid)? {
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
        // A CA private key has no business here; if one was pasted in, it is a secret.
        Some(t) => secrets.extend(redact::secrets_in(&t)),
    }

    let credential = credential(paths, node.join_mode, secrets)?;

    let kubelet_config = if paths.kubelet_config_override.is_file() {
        paths::KUBELET_CONFIG_OVERRIDE.to_string()
    } else {
        image.kubelet_config.clone()
    };
    // The same cap as `kiln render`'s for the files it reads; kubelet parses the contents.
    let kubelet_dropin =
        fsutil::read_regular(&paths.kubelet_dropin, 1024 * 1024).map_err(invalid)?;
    let containerd_config =
        fsutil::read_regular(&paths.containerd_config, 64 * 1024).map_err(invalid)?;
    if let Some(text) = &containerd_config {
        containerd_config_version(text, &image.containerd_config_version).map_err(|found| {
            invalid(format!(
                "{}: expected `version = {}` (the config version of the image's containerd, \
                 image.env CONTAINERD_CONFIG_VERSION), found {found}",
                paths.containerd_config.display(),
                image.containerd_config_version
            ))
        })?;
    }
    // A secret file (0600, the contract says): a provider's `env` may hold credentials, and
    // its values join the redactor, since kubelet's own errors can echo the whole file.
    let cp = &paths.credential_providers;
    let credential_providers = match fsutil::read_secret(cp, 256 * 1024) {
        Err(SecretError::Missing) => false,
        Err(e) => return Err(secret_error(cp, e)),
        Ok(text) => {
            let values = credential_provider_binaries(
                &paths.root,
                &image.credential_provider_bin_dir,
                &text,
            )
            .map_err(|e| invalid_at(cp, &e))?;
            secrets.extend(values);
            true
        }
    };
    let sysctl = match fsutil::read_regular(&paths.node_sysctl, 256 * 1024).map_err(invalid)? {
        None => Vec::new(),
        Some(text) => {
            crate::contract::sysctl::parse(&text).map_err(|e| invalid_at(&paths.node_sysctl, &e))?
        }
    };
    Ok(Config {
        kubelet_config,
        kubelet_dropin,
        containerd_config,
        credential_providers,
        sysctl,
        sizing,
        image,
        node,
        credential,
        deadline_secs,
        max_pods_map,
    })
}

/// Checks that a containerd config fragment declares the config version the image's
/// containerd reads: containerd 1.x ignores a version-3 fragment's CRI settings without a
/// word (measured with Debian's 1.6.20), so the mismatch is caught here. `kiln render` writes `version = N` as
/// the first setting; the first `version` line counts. An image that does not record its
/// version (`wanted` empty) is not checked. `Err` is what was found.
fn containerd_config_version(text: &str, wanted: &str) -> Result<(), String> {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("version") || l.starts_with('['));
    match line {
        _ if wanted.is_empty() => Ok(()),
        Some(l) if l.split('=').map(str::trim).eq(["version", wanted]) => Ok(()),
        Some(l) if !l.starts_with('[') => Err(format!("`{l}`")),
        _ => Err("no version".into()),
    }
}

/// Checks that every provider the credential provider config names has its binary in the
/// image: kubelet looks each up at start and, missing, exits 1 with a message that names no
/// path (`plugin binary executable  did not exist`: `exec.LookPath` returns "" on failure).
/// The rest of the file is kubelet's to check, as `kiln render` did. Returns the providers'
/// `env` values, for the redactor.
fn credential_provider_binaries(
    root: &Path,
    bin_dir: &str,
    text: &str,
) -> Result<Vec<String>, String> {
    let doc = crate::json::parse(text).map_err(|e| format!("expected JSON: {e}"))?;
    let providers = doc
        .get("providers")
        .and_then(|p| p.as_array())
        .filter(|p| !p.is_empty())
        .ok_or("expected a CredentialProviderConfig with `providers`, found none")?;
    let mut values = Vec::new();
    for p in providers {
        for e in p.get("env").and_then(|e| e.as_array()).unwrap_or_default() {
            if let Some(v) = e
                .get("value")
                .and_then(|v| v.as_text())
                .filter(|v| !v.is_empty())
            {
                values.push(v.to_string());
            }
        }
        let name = p.get("name").and_then(|n| n.as_text()).unwrap_or("");
        let bin = format!("{bin_dir}/{name}");
        let ok = !name.is_empty()
            && !name.contains('/')
            && std::fs::metadata(paths::under(root, &bin)).is_ok_and(|m| {
                #[cfg(unix)]
                let exec = std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0;
                #[cfg(not(unix))]
                let exec = true;
                m.is_file() && exec
            });
        if !ok {
            return Err(format!(
                "provider {name:?}: expected its executable {bin} in this image (image.env \
                 CREDENTIAL_PROVIDER_BIN_DIR), found none"
            ));
        }
    }
    Ok(values)
}

/// The most a credential file may hold.
const CREDENTIAL_CAP: u64 = 1024 * 1024;

/// Finds the one credential the join mode needs, reads it through [`fsutil::read_secret`]
/// (never through a symlink; mode and owner checked on the open file) and collects the
/// secret values in it for the run's redactor.
fn credential(
    paths: &NodePaths,
    mode: JoinMode,
    secrets: &mut Secrets,
) -> Result<Credential, Error> {
    let (kubeconfig, token, join) = (
        &paths.bootstrap_kubeconfig,
        &paths.bootstrap_token,
        &paths.kubeadm_join,
    );
    let wanted: &[&PathBuf] = match mode {
        JoinMode::Kubelet => &[kubeconfig, token],
        JoinMode::Kubeadm => &[join],
    };
    // Present as anything, a symlink included: a symlink is refused below, not skipped.
    let present: Vec<&PathBuf> = wanted
        .iter()
        .copied()
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect();
    let looked = match mode {
        JoinMode::Kubelet => format!("{} or {}", kubeconfig.display(), token.display()),
        JoinMode::Kubeadm => join.display().to_string(),
    };
    let path = match present.as_slice() {
        [] => {
            return Err(missing(format!(
                "no credential for JOIN_MODE={}: expected {looked}, found neither",
                mode.as_str()
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
    let text = fsutil::read_secret(path, CREDENTIAL_CAP).map_err(|e| secret_error(path, e))?;
    if path == join {
        secrets.extend(redact::secrets_in(&text));
        return Ok(Credential::KubeadmJoin);
    }
    if path == kubeconfig {
        secrets.extend(redact::secrets_in(&text));
        return Ok(Credential::Kubeconfig);
    }
    let t = text.trim();
    if !valid_token(t) {
        // Whatever it holds is meant to be secret: keep it out of every output all the same.
        secrets.push(t);
        return Err(invalid(format!(
            "{}: expected one line [a-z0-9]{{6}}.[a-z0-9]{{16}}, found {} bytes that do not match (the value is not printed)",
            path.display(),
            t.len()
        )));
    }
    secrets.push(t);
    Ok(Credential::Token(t.to_string()))
}

/// The secret values of every credential file on the node, read the safe way and without
/// judging them: for the commands that run after a boot (`report`, `status`) and so never
/// validated the configuration. Files that are absent, refused or unreadable add nothing.
pub fn node_secrets(paths: &NodePaths) -> Secrets {
    let mut s = Secrets::default();
    for p in [&paths.bootstrap_kubeconfig, &paths.kubeadm_join] {
        if let Ok(text) = fsutil::read_secret(p, CREDENTIAL_CAP) {
            s.extend(redact::secrets_in(&text));
        }
    }
    if let Ok(text) = fsutil::read_secret(&paths.bootstrap_token, CREDENTIAL_CAP) {
        s.push(text.trim());
    }
    // The CA file is public (0644), but a private key pasted into it is not.
    if let Ok(Some(text)) = fsutil::read_capped(&paths.ca_crt, 1024 * 1024) {
        s.extend(redact::secrets_in(&text));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks one node.env value against its expected shape ([`node_env::check`]).
    fn validate(file: &Path, key: &str, value: &str) -> Result<(), Error> {
        node_env::check(key, value).map_err(|expected| {
            invalid_at(
                file,
                &Invalid {
                    key,
                    expected,
                    found: value,
                },
            )
        })
    }

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
            ("PROVIDER", "do"),
            ("CLUSTER_NAME", "a b"),
        ];
        for (k, v) in bad {
            let e = validate(f, k, v).expect_err(&format!("{k}={v}"));
            assert!(e.to_string().contains(k), "{e}");
            assert_eq!(e.reason(), Reason::ConfigInvalid);
        }
    }
}
