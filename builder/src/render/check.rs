//! `kiln render --check`: user data read back into the contract files it would write, and
//! those files checked against node contract v1.

use kiln_firstboot::contract::{self, envfile, node_env};

use crate::render::cloudinit;
use crate::render::ignition;
use crate::render::model::gunzip;
use crate::render::model::{
    contract_mode, NodeFile, Provisioner, RenderError, CONTRACT_FILES, LINUX_DIR,
};
use crate::render::pki;
use crate::render::registries;
use crate::render::windows;

/// What `--check` found in a piece of user data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The format the user data was recognised as.
    pub provisioner: Provisioner,
    /// Whether the user data was gzip-compressed as a whole.
    pub gzipped: bool,
    /// The contract files it would write, in the order it writes them.
    pub files: Vec<NodeFile>,
    /// Things it would do besides writing contract files (other paths, other modules).
    pub notes: Vec<String>,
}

/// Reads user data back: recognises the format, decodes it, and returns the `/etc/kiln/`
/// files it would write. `source_name` is used in error messages.
pub fn check_payload(data: &[u8], source_name: &str) -> Result<Checked, RenderError> {
    let (data, gzipped) = if data.starts_with(&[0x1f, 0x8b]) {
        (gunzip(data, source_name)?, true)
    } else {
        (data.to_vec(), false)
    };
    let text = std::str::from_utf8(&data).map_err(|e| {
        RenderError::check(source_name, format!("user data is not UTF-8 text: {e}"))
    })?;
    let trimmed = text.trim_start();
    let (provisioner, files, notes) = if text.starts_with("#cloud-config") {
        let (files, notes) = cloudinit::parse(text, source_name)?;
        (Provisioner::CloudInit, files, notes)
    } else if trimmed.starts_with('{') {
        let (files, notes) = ignition::parse(text, source_name)?;
        (Provisioner::Ignition, files, notes)
    } else if is_mime(text) {
        let (files, notes) = cloudinit::parse_multipart(text, source_name)?;
        (Provisioner::CloudInit, files, notes)
    } else if trimmed.starts_with("<powershell>") || trimmed.starts_with("#ps1") {
        let (files, notes) = windows::parse(text, source_name)?;
        (Provisioner::Windows, files, notes)
    } else {
        let first = text.lines().next().unwrap_or("");
        return Err(RenderError::check(
            source_name,
            format!(
                "unrecognised user data: expected `#cloud-config`, an Ignition JSON object or \
                 `<powershell>` on the first line, or MIME multipart headers, found {first:?}"
            ),
        ));
    };
    Ok(Checked {
        provisioner,
        gzipped,
        files,
        notes,
    })
}

/// MIME multipart user data starts with its headers (cloud-init's own test, roughly).
fn is_mime(text: &str) -> bool {
    let first = text.lines().next().unwrap_or("").to_ascii_lowercase();
    (first.starts_with("content-type:") || first.starts_with("mime-version:"))
        && text.to_ascii_lowercase().contains("multipart/")
}

/// Checks that a set of files is a valid `/etc/kiln/` for contract v1: known names with the
/// required modes, `node.env` with `KILN_CONTRACT=1`, a CA, and exactly the one credential
/// the join mode needs. Returns every problem found (empty when valid).
pub fn contract_problems(files: &[NodeFile]) -> Vec<String> {
    let mut problems = Vec::new();
    for file in files {
        match contract_mode(&file.name) {
            None => problems.push(format!(
                "{}: not a file of node contract v1 (known: {}, {}/<registry>/{})",
                file.linux_path(),
                CONTRACT_FILES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
                registries::CERTS_D,
                registries::HOST_FILES.join(" or "),
            )),
            Some(mode) if mode != file.mode => problems.push(format!(
                "{}: mode {:04o}, the contract requires {:04o}",
                file.linux_path(),
                file.mode,
                mode
            )),
            Some(_) => {}
        }
    }
    let has = |name: &str| files.iter().any(|f| f.name == name);
    let mut join_mode = "kubelet".to_string();
    match files.iter().find(|f| f.name == "node.env") {
        None => problems.push(format!("{LINUX_DIR}/node.env: missing (required)")),
        Some(file) => match envfile::parse(&String::from_utf8_lossy(&file.contents)) {
            Err(e) => problems.push(format!("{}: {e}", file.linux_path())),
            Ok(env) => {
                match env.get(contract::KILN_CONTRACT) {
                    Some(contract::VERSION_TEXT) => {}
                    other => problems.push(format!(
                        "{}: {} must be {}, found {other:?}",
                        file.linux_path(),
                        contract::KILN_CONTRACT,
                        contract::VERSION_TEXT,
                    )),
                }
                for key in [node_env::API_SERVER, node_env::CLUSTER_NAME] {
                    if env.get(key).is_none() {
                        problems.push(format!("{}: required key {key} missing", file.linux_path()));
                    }
                }
                if let Some(mode) = env.get(node_env::JOIN_MODE) {
                    join_mode = mode.to_string();
                }
            }
        },
    }
    if !has("ca.crt") {
        problems.push(format!("{LINUX_DIR}/ca.crt: missing (required)"));
    }
    for file in files {
        if let Err(e) = content_problem(file, files) {
            problems.push(format!("{}: {e}", file.linux_path()));
        }
    }
    let credentials: Vec<&str> = [
        "bootstrap-kubeconfig",
        "bootstrap-token",
        "kubeadm-join.yaml",
    ]
    .into_iter()
    .filter(|n| has(n))
    .collect();
    let wanted: &[&str] = if join_mode == "kubeadm" {
        &["kubeadm-join.yaml"]
    } else {
        &["bootstrap-kubeconfig", "bootstrap-token"]
    };
    if credentials.len() != 1 || !wanted.contains(&credentials[0]) {
        problems.push(format!(
            "JOIN_MODE={join_mode} needs exactly one of {}, found {}",
            wanted.join(" or "),
            if credentials.is_empty() {
                "none".to_string()
            } else {
                credentials.join(", ")
            }
        ));
    }
    problems
}

/// Checks one contract file's contents against its format; secrets are described, not shown.
fn content_problem(file: &NodeFile, all: &[NodeFile]) -> Result<(), String> {
    let text = || std::str::from_utf8(&file.contents).map_err(|_| "not UTF-8 text".to_string());
    let yaml_kind = |kind: &str, api: &str| -> Result<(), String> {
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&file.contents)
            .map_err(|e| format!("expected YAML with kind: {kind}, found invalid YAML ({e})"))?;
        let found = doc.get("kind").and_then(|v| v.as_str()).unwrap_or("");
        let found_api = doc.get("apiVersion").and_then(|v| v.as_str()).unwrap_or("");
        if found != kind || !found_api.starts_with(api) {
            return Err(format!(
                "expected kind: {kind} (apiVersion {api}…), found kind {found:?}, apiVersion {found_api:?}"
            ));
        }
        Ok(())
    };
    if registries::is_host_file(&file.name) {
        let (dir, base) = file.name.rsplit_once('/').unwrap_or(("", &file.name));
        return if base == "hosts.toml" {
            let siblings: Vec<&str> = all
                .iter()
                .filter_map(|f| f.name.strip_prefix(dir)?.strip_prefix('/'))
                .collect();
            registries::check_hosts_toml(text()?, &siblings)
        } else {
            certificates(text()?)
        };
    }
    match file.name.as_str() {
        "ca.crt" | crate::render::model::TRUST_BUNDLE => certificates(text()?),
        "bootstrap-token" => {
            let t = text()?.trim();
            if kiln_firstboot::redact::valid_token(t) {
                Ok(())
            } else {
                Err(format!(
                    "expected one line [a-z0-9]{{6}}.[a-z0-9]{{16}}, found {} bytes that do not match (not shown)",
                    t.len()
                ))
            }
        }
        "bootstrap-kubeconfig" => yaml_kind("Config", "v1"),
        "kubeadm-join.yaml" => yaml_kind("JoinConfiguration", "kubeadm.k8s.io/"),
        "kubelet-config.yaml" => yaml_kind("KubeletConfiguration", "kubelet.config.k8s.io/"),
        // The contract's rules, as kiln-firstboot applies them.
        "sysctl.conf" => contract::sysctl::parse(text()?).and_then(|entries| {
            entries
                .iter()
                .try_for_each(|(k, v)| contract::sysctl::check(k, v))
        }),
        // The same checks `kiln render` makes of node.toml's kubelet keys.
        // The same checks `kiln render` makes of `[containerd.config]`, and the version line
        // kiln-firstboot reads.
        crate::render::model::CONTAINERD_CONFIG => {
            let text = text()?;
            let table: toml::Table = text
                .parse()
                .map_err(|e| format!("expected a containerd config fragment (TOML), found: {e}"))?;
            let (version, _) = crate::render::containerd_config::render(file.name.as_str(), &table)
                .map_err(|r| format!("{}: expected {}, found {}", r.key, r.expected, r.found))?;
            let first = text
                .lines()
                .map(str::trim)
                .find(|l| l.starts_with("version") || l.starts_with('['));
            let wanted = version.to_string();
            if !first.is_some_and(|l| l.split('=').map(str::trim).eq(["version", wanted.as_str()]))
            {
                return Err(format!(
                    "expected a line `version = {version}` before any table (the line kiln-firstboot checks against the image), found {first:?}"
                ));
            }
            Ok(())
        }
        // kubelet's own decoding and rules (kiln-kubelet-config), as `kiln render` applies them.
        crate::render::model::CREDENTIAL_PROVIDERS => {
            use kiln_kubelet_config::credential_provider::{
                decode, error_without_document, validate,
            };
            let providers = decode(text()?).map_err(|e| error_without_document(&e))?;
            let errs = validate(&providers, true);
            if errs.is_empty() {
                Ok(())
            } else {
                Err(kiln_kubelet_config::validate::aggregate(&errs))
            }
        }
        "kubelet-dropin.conf" => {
            let name = "kubelet-dropin.conf";
            let part = crate::render::kubelet_dropin::file_part(name, text()?);
            part.and_then(|p| crate::render::kubelet_dropin::render(vec![p]))
                .map(drop)
                .map_err(|r| format!("{}: expected {}, found {}", r.key, r.expected, r.found))
        }
        _ => Ok(()),
    }
}

/// A PEM bundle whose every certificate parses far enough to find its public key.
fn certificates(text: &str) -> Result<(), String> {
    let ders = pki::pem_certificates(text)
        .map_err(|e| format!("expected a PEM certificate bundle: {e}"))?;
    for der in ders {
        pki::spki_sha256(&der).map_err(|e| format!("a certificate does not parse: {e}"))?;
    }
    Ok(())
}
