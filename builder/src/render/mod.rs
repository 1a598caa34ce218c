//! `kiln render`: one neutral `node.toml` → the `/etc/kiln/` files of the node contract, in the
//! format of every provisioner (cloud-init, Ignition, Windows user data, a plain file tree),
//! and the way back (`--check`) from any of those formats to the files they would write.

pub mod cloudinit;
pub mod config;
pub mod files;
pub mod ignition;
pub mod kubeadm;
pub mod limits;
pub mod windows;

use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use kiln_firstboot::contract::{self, envfile, node_env};
use sha2::{Digest, Sha256};

pub use config::{ConfigError, NodeConfig};

/// The directory of the contract files on Linux nodes.
pub const LINUX_DIR: &str = "/etc/kiln";
/// The same directory on Windows nodes (`docs/contract.md`, "Windows paths").
pub const WINDOWS_DIR: &str = r"C:\ProgramData\kiln";

/// Mode of a file that holds a secret (token, kubeconfig, kubeadm join configuration).
pub const SECRET_MODE: u32 = 0o600;
/// Mode of every other contract file.
pub const PUBLIC_MODE: u32 = 0o644;

/// The names a provisioner may place under `/etc/kiln/`, in the contract's order, with the mode
/// the contract requires for each.
pub const CONTRACT_FILES: &[(&str, u32)] = &[
    ("node.env", PUBLIC_MODE),
    ("ca.crt", PUBLIC_MODE),
    ("bootstrap-kubeconfig", SECRET_MODE),
    ("bootstrap-token", SECRET_MODE),
    ("kubeadm-join.yaml", SECRET_MODE),
    ("kubelet-config.yaml", PUBLIC_MODE),
];

/// One file of the node contract: its name inside `/etc/kiln/`, its mode and its bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeFile {
    /// File name inside the contract directory, e.g. `node.env`.
    pub name: String,
    /// Unix permission bits (`0o600` for secrets, `0o644` otherwise).
    pub mode: u32,
    /// Exact contents.
    pub contents: Vec<u8>,
}

impl NodeFile {
    /// The file's absolute path on a Linux node.
    pub fn linux_path(&self) -> String {
        format!("{LINUX_DIR}/{}", self.name)
    }

    /// The file's absolute path on a Windows node.
    pub fn windows_path(&self) -> String {
        format!(r"{WINDOWS_DIR}\{}", self.name)
    }

    /// Lower-case hex SHA-256 of the contents.
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(&self.contents))
    }

    /// Whether the contract treats this file as a secret.
    pub fn is_secret(&self) -> bool {
        self.mode == SECRET_MODE
    }
}

impl fmt::Debug for NodeFile {
    // Contents hold secrets: never print them, only their size and hash.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeFile")
            .field("name", &self.name)
            .field("mode", &format_args!("{:04o}", self.mode))
            .field("size", &self.contents.len())
            .field("sha256", &self.sha256())
            .finish()
    }
}

/// The provisioner formats `kiln render` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provisioner {
    /// `#cloud-config` user data with `write_files` only.
    CloudInit,
    /// An Ignition spec 3.4.0 (or 3.3.0) config with `storage.files` as data URLs.
    Ignition,
    /// PowerShell user data (cloudbase-init, EC2Launch) writing under `C:\ProgramData\kiln\`.
    Windows,
    /// The plain file tree (`etc/kiln/…`) under a directory.
    Files,
}

impl Provisioner {
    /// Every provisioner, in the order the docs list them.
    pub const ALL: [Provisioner; 4] = [
        Provisioner::CloudInit,
        Provisioner::Ignition,
        Provisioner::Windows,
        Provisioner::Files,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Provisioner::CloudInit => "cloud-init",
            Provisioner::Ignition => "ignition",
            Provisioner::Windows => "windows",
            Provisioner::Files => "files",
        }
    }

    /// Parses a command-line name.
    pub fn from_name(name: &str) -> Option<Provisioner> {
        Provisioner::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether the node-side tool accepts gzip-compressed user data as a whole.
    pub fn accepts_gzip(self) -> bool {
        // cloud-init and cloudbase-init both sniff the gzip magic; Ignition compresses each
        // file instead (`contents.compression`), the file tree has no envelope at all.
        matches!(
            self,
            Provisioner::CloudInit | Provisioner::Ignition | Provisioner::Windows
        )
    }
}

impl fmt::Display for Provisioner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Options that change how user data is encoded, never what files it writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenderOptions {
    /// Compress: the whole user data (cloud-init, Windows) or each file (Ignition).
    pub gzip: bool,
    /// The Ignition spec version to write (ignored by the other provisioners).
    pub ignition_spec: ignition::Spec,
}

/// Errors of rendering and of reading user data back.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// `node.toml` is missing, malformed or invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The `files` provisioner writes a directory tree, not a single payload.
    #[error("the files provisioner writes a directory: use files::write_tree (`kiln render --provisioner files --output DIR`)")]
    NotAPayload,
    /// User data handed to `--check` could not be read back.
    #[error("{source_name}: {message}")]
    Check {
        /// The file (or `-`) being checked.
        source_name: String,
        /// What was expected and what was found.
        message: String,
    },
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl RenderError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> RenderError {
        RenderError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn check(source_name: &str, message: impl Into<String>) -> RenderError {
        RenderError::Check {
            source_name: source_name.to_string(),
            message: message.into(),
        }
    }
}

/// Renders the node's contract files into one provisioner's user data.
///
/// The same `files` and options always give the same bytes.
pub fn render_payload(
    files: &[NodeFile],
    provisioner: Provisioner,
    options: RenderOptions,
) -> Result<Vec<u8>, RenderError> {
    let payload = match provisioner {
        Provisioner::CloudInit => cloudinit::render(files),
        Provisioner::Ignition => ignition::render(files, options.gzip, options.ignition_spec),
        Provisioner::Windows => windows::render(files),
        Provisioner::Files => return Err(RenderError::NotAPayload),
    };
    // Ignition compresses per file (above); the other two are compressed whole.
    if options.gzip && provisioner != Provisioner::Ignition {
        Ok(gzip(&payload))
    } else {
        Ok(payload)
    }
}

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
        match CONTRACT_FILES.iter().find(|(name, _)| *name == file.name) {
            None => problems.push(format!(
                "{}: not a file of node contract v1 (known: {})",
                file.linux_path(),
                CONTRACT_FILES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Some((_, mode)) if *mode != file.mode => problems.push(format!(
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
        if let Err(e) = content_problem(file) {
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
fn content_problem(file: &NodeFile) -> Result<(), String> {
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
    match file.name.as_str() {
        "ca.crt" => {
            let ders = kubeadm::pem_certificates(text()?)
                .map_err(|e| format!("expected a PEM certificate bundle: {e}"))?;
            for der in ders {
                kubeadm::spki_sha256(&der)
                    .map_err(|e| format!("a certificate does not parse: {e}"))?;
            }
            Ok(())
        }
        "bootstrap-token" => {
            let t = text()?.trim();
            let ok = t.len() == 23
                && t.split_once('.').is_some_and(|(a, b)| {
                    a.len() == 6
                        && b.len() == 16
                        && (a.bytes().chain(b.bytes()))
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                });
            if ok {
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
        _ => Ok(()),
    }
}

/// Compresses deterministically: no file name, no timestamp, fixed level.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::best());
    // Writing into a Vec cannot fail.
    encoder.write_all(data).expect("gzip into memory");
    encoder.finish().expect("gzip into memory")
}

/// The most bytes gzipped user data may inflate to. Every cloud caps user data far lower
/// (EC2 16 KiB, Azure custom data 64 KiB, before compression), so a larger result is a
/// gzip bomb, not a node config; the cap keeps `render --check` from exhausting memory.
pub const MAX_GUNZIPPED: u64 = 64 << 20;

/// Decompresses gzip data, naming `source_name` on failure; refuses more than
/// [`MAX_GUNZIPPED`] bytes of output.
pub fn gunzip(data: &[u8], source_name: &str) -> Result<Vec<u8>, RenderError> {
    gunzip_capped(data, source_name, MAX_GUNZIPPED)
}

fn gunzip_capped(data: &[u8], source_name: &str, cap: u64) -> Result<Vec<u8>, RenderError> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .take(cap + 1)
        .read_to_end(&mut out)
        .map_err(|e| RenderError::check(source_name, format!("gzip data is corrupt: {e}")))?;
    if out.len() as u64 > cap {
        return Err(RenderError::check(
            source_name,
            format!(
                "gzip data inflates to more than {cap} bytes ({} compressed): refusing it as a \
                 gzip bomb; no cloud accepts user data of that size",
                data.len()
            ),
        ));
    }
    Ok(out)
}

/// Writes `data` to `path` atomically with `mode` (see [`crate::atomic_file`]).
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), RenderError> {
    crate::atomic_file::write(path, ".kiln-render-", data, mode)
        .map_err(|e| RenderError::io(e.path, e.source))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE_CA: &str = include_str!("../../../docs/examples/render/ca.crt");

    fn file(name: &str, mode: u32, contents: &str) -> NodeFile {
        NodeFile {
            name: name.into(),
            mode,
            contents: contents.as_bytes().to_vec(),
        }
    }

    #[test]
    fn gzip_is_deterministic_and_reversible() {
        let a = gzip(b"hello kiln\n");
        assert_eq!(a, gzip(b"hello kiln\n"));
        assert_eq!(gunzip(&a, "x").unwrap(), b"hello kiln\n");
        assert!(gunzip(&a[..a.len() - 4], "x").is_err());
        // A bomb: 4 MiB of zeros compress to a few KiB and are refused past the cap, with
        // the source named; at the cap itself they are accepted.
        let bomb = gzip(&vec![0u8; 4 << 20]);
        let e = gunzip_capped(&bomb, "user-data.gz", 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("user-data.gz") && e.contains("gzip bomb"), "{e}");
        assert_eq!(gunzip_capped(&bomb, "x", 4 << 20).unwrap().len(), 4 << 20);
    }

    #[test]
    fn contract_problems_table() {
        let env = "KILN_CONTRACT=1\nAPI_SERVER=https://a:6443\nCLUSTER_NAME=c\n";
        let ok = vec![
            file("node.env", 0o644, env),
            file("ca.crt", 0o644, EXAMPLE_CA),
            file("bootstrap-token", 0o600, "abcdef.0123456789abcdef\n"),
        ];
        assert!(
            contract_problems(&ok).is_empty(),
            "{:?}",
            contract_problems(&ok)
        );

        // Contents are checked too, and a bad token is described, not shown.
        let mut bad = ok.clone();
        bad[1] = file(
            "ca.crt",
            0o644,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        bad[2] = file("bootstrap-token", 0o600, "Secret.Value\n");
        let p = contract_problems(&bad);
        assert!(
            p.iter()
                .any(|m| m.starts_with("/etc/kiln/ca.crt: a certificate does not parse")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|m| m.contains("found 12 bytes that do not match (not shown)")),
            "{p:?}"
        );
        assert!(!p.iter().any(|m| m.contains("Secret")), "{p:?}");
        let join = file("kubeadm-join.yaml", 0o600, "apiVersion: v1\nkind: Config\n");
        let p = contract_problems(std::slice::from_ref(&join));
        assert!(
            p.iter()
                .any(|m| m.contains("expected kind: JoinConfiguration")),
            "{p:?}"
        );

        let mut world_readable = ok.clone();
        world_readable[2].mode = 0o644;
        let p = contract_problems(&world_readable);
        assert!(
            p[0].contains("mode 0644, the contract requires 0600"),
            "{p:?}"
        );

        let mut two = ok.clone();
        two.push(file("bootstrap-kubeconfig", 0o600, "x"));
        let p = contract_problems(&two);
        assert!(
            p.iter()
                .any(|m| m.contains("found bootstrap-kubeconfig, bootstrap-token")),
            "{p:?}"
        );

        let mut kubeadm = ok.clone();
        kubeadm[0] = file("node.env", 0o644, &format!("{env}JOIN_MODE=kubeadm\n"));
        let p = contract_problems(&kubeadm);
        assert!(
            p[0].contains("needs exactly one of kubeadm-join.yaml"),
            "{p:?}"
        );

        let p = contract_problems(&[file("node.env", 0o644, "KILN_CONTRACT=2\n")]);
        assert!(
            p.iter().any(|m| m.contains("KILN_CONTRACT must be 1")),
            "{p:?}"
        );
        assert!(p.iter().any(|m| m.contains("API_SERVER missing")), "{p:?}");
        assert!(p.iter().any(|m| m.contains("ca.crt: missing")), "{p:?}");
    }

    #[test]
    fn unknown_user_data_is_named() {
        let err = check_payload(b"#!/bin/sh\necho hi\n", "ud.txt").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("ud.txt: unrecognised user data"), "{msg}");
        assert!(msg.contains("\"#!/bin/sh\""), "{msg}");
    }
}
