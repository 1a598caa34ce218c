//! The values every renderer shares: the contract directory and modes, [`NodeFile`], the
//! [`Provisioner`] names, [`RenderError`], deterministic gzip and the capped gunzip, and the
//! atomic writer. A leaf of `render/`: the renderers import it, it imports none of them.

use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::render::config::ConfigError;

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
    ("kubelet-dropin.conf", PUBLIC_MODE),
    ("sysctl.conf", PUBLIC_MODE),
    (TRUST_BUNDLE, PUBLIC_MODE),
    (CONTAINERD_CONFIG, PUBLIC_MODE),
    // 0600: a provider's `env` may hold what only kubelet (root) should read.
    (CREDENTIAL_PROVIDERS, SECRET_MODE),
];

/// node.toml's `[[kubelet.credential_provider]]` (kiln-firstboot's
/// `paths::CREDENTIAL_PROVIDERS`).
pub const CREDENTIAL_PROVIDERS: &str = "credential-providers.json";

/// node.toml's `[containerd.config]`, in the directory the image's containerd config imports
/// (docs/contract.md, "containerd configuration"; kiln-firstboot's
/// `paths::NODE_CONTAINERD_CONFIG`).
pub const CONTAINERD_CONFIG: &str = "containerd/conf.d/provisioned.toml";

/// node.toml's `[trust]`, in the directory the image's containerd and kubelet units add to
/// Go's `SSL_CERT_DIR` (docs/contract.md, "Trust bundle").
pub const TRUST_BUNDLE: &str = "trust.d/bundle.crt";
/// That directory on the node.
pub const TRUST_DIR: &str = "/etc/kiln/trust.d";

/// The mode node contract v1 requires of the file `name` (relative to `/etc/kiln/`): one
/// of [`CONTRACT_FILES`] or a registry host directory's file
/// (`containerd/certs.d/<host>/hosts.toml`, `…/ca.crt`); `None` for any other name.
pub fn contract_mode(name: &str) -> Option<u32> {
    CONTRACT_FILES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, m)| *m)
        .or_else(|| crate::render::registries::is_host_file(name).then_some(PUBLIC_MODE))
}

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
        format!(r"{WINDOWS_DIR}\{}", self.name.replace('/', "\\"))
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

/// The directories kiln owns on a node: user data may write the contract files into
/// `/etc/kiln/`, nothing may link in place of or into any of them.
pub const KILN_DIRS: &[&str] = &["/etc/kiln", "/usr/lib/kiln", "/usr/share/kiln", "/run/kiln"];

/// An absolute path as Go's `filepath.Clean` (and the kernel, for `//` and `.`) makes it: no
/// empty, `.` or `..` components (`..` at the root stays at the root).
pub fn clean_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

/// The kiln directory a cleaned `path` is, lies in, or leads to (`/etc` leads to `/etc/kiln`;
/// `/` is left out: a link there is no user data's to make anyway).
pub fn kiln_dir_touched(path: &str) -> Option<&'static str> {
    KILN_DIRS.iter().copied().find(|d| {
        path == *d
            || path.starts_with(&format!("{d}/"))
            || (path != "/" && d.starts_with(&format!("{path}/")))
    })
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
    /// User data handed to `--check` would break the contract around its files: the
    /// directory's mode or owner, a link in place of or into kiln's paths, a secret's owner.
    #[error("{source_name}: {message}")]
    Breaks {
        /// The file (or `-`) being checked.
        source_name: String,
        /// The path, what the contract expects and what was found.
        message: String,
    },
    /// A baked sysext handed to `--sysext` is not what `kiln bake --format sysext` writes.
    #[error("{path}: {message}")]
    Sysext {
        /// The `.raw` (or its transfer file).
        path: PathBuf,
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

    /// A contract break found by `--check` (exit 3, like the other failed verifications).
    pub(crate) fn breaks(source_name: &str, message: impl Into<String>) -> RenderError {
        RenderError::Breaks {
            source_name: source_name.to_string(),
            message: message.into(),
        }
    }

    /// A contract break fails the check (exit 3); anything else is a failure to run it.
    pub fn exit_class(&self) -> crate::exit::ExitClass {
        match self {
            RenderError::Breaks { .. } => crate::exit::ExitClass::Verify,
            _ => crate::exit::ExitClass::Failure,
        }
    }

    pub(crate) fn check(source_name: &str, message: impl Into<String>) -> RenderError {
        RenderError::Check {
            source_name: source_name.to_string(),
            message: message.into(),
        }
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

pub(crate) fn gunzip_capped(
    data: &[u8],
    source_name: &str,
    cap: u64,
) -> Result<Vec<u8>, RenderError> {
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

/// A URL as messages show it: without `user:password@` and without the query, where
/// presigned URLs carry their signature; at most 120 characters.
pub(crate) fn url_for_message(url: &str) -> String {
    let mut u = url.split(['?', '#']).next().unwrap_or("").to_string();
    if let Some(scheme_end) = u.find("://") {
        let rest = &u[scheme_end + 3..];
        let host_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..host_end].rfind('@') {
            u = format!("{}***@{}", &u[..scheme_end + 3], &rest[at + 1..]);
        }
    }
    u.chars().take(120).collect()
}

/// `bytes` as an RFC 2397 `data:` URL, base64-encoded.
pub(crate) fn data_url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    format!(
        "data:;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}
