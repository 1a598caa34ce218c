//! What a bake is made of: its inputs ([`ArtifactInput`]), the request ([`BakeRequest`]), the
//! layer being built ([`Layer`]: every path with its [`Node`] and [`Origin`]), the options
//! of writing it, and the atomic writer of its outputs. The leaf the format writers import.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::atomic_file;
use crate::bake::error::{io_err, BakeError};
use crate::bake::extract::ArchiveKind;
use crate::image_def::{Arch, Format, ImageDef, Os};
use crate::supply::inspect::InspectError;

pub use crate::layer_contract::DEFAULT_EPOCH;

/// How an artifact's download is packaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// The download is the binary itself.
    Binary,
    /// An archive; members are taken out of it.
    Archive(ArchiveKind),
}

/// One file an artifact provides, from the lock: where it is in the download and where it
/// goes (relative to the image's prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberMap {
    /// Path inside the archive (or the download's file name for a binary).
    pub from: String,
    /// Relative destination, e.g. `bin/kubelet`.
    pub to: String,
}

/// A verified artifact ready to bake: a lock entry plus the path of its blob in the store.
#[derive(Debug, Clone)]
pub struct ArtifactInput {
    /// Lock entry name.
    pub name: String,
    /// Upstream version.
    pub version: String,
    /// Upstream URL.
    pub url: String,
    /// sha256 of the download (already verified by the store).
    pub sha256: String,
    /// Packaging.
    pub kind: InputKind,
    /// The blob on disk.
    pub blob: PathBuf,
    /// The files it provides.
    pub members: Vec<MemberMap>,
}

/// Where a file's bytes are.
#[derive(Debug, Clone)]
pub enum Data {
    /// Rendered by kiln.
    Inline(Vec<u8>),
    /// A file on disk (a store blob or an extracted member).
    File(PathBuf),
}

impl Data {
    /// Opens the bytes for reading.
    pub fn open(&self) -> Result<Box<dyn Read + Send + '_>, BakeError> {
        Ok(match self {
            Data::Inline(b) => Box::new(&b[..]),
            Data::File(p) => Box::new(File::open(p).map_err(io_err(p))?),
        })
    }
}

/// Why a file is in the layer; what `kiln diff` explains changes with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// A member of a lock artifact.
    Artifact {
        /// Lock entry name.
        name: String,
        /// Member path inside the download.
        member: String,
    },
    /// Rendered from these definition keys (dotted) and their values.
    Config(BTreeMap<String, String>),
    /// Written by kiln itself (units, directories, image facts).
    Kiln(String),
    /// The OCI archive of a lock image (`[[image]]`).
    Image {
        /// Lock image name.
        name: String,
        /// Its pinned digest.
        digest: String,
    },
}

/// A node in the layer tree.
#[derive(Debug, Clone)]
pub enum Node {
    /// A directory (mode 0755).
    Dir,
    /// A regular file.
    File {
        /// Its bytes.
        data: Data,
        /// Permission bits.
        mode: u32,
        /// Size in bytes.
        size: u64,
        /// Lowercase hex sha256.
        sha256: String,
        /// Lowercase hex SHA1 (for the SBOM).
        sha1: String,
    },
    /// A symbolic link.
    Symlink(String),
}

/// One path of the layer.
#[derive(Debug, Clone)]
pub struct Entry {
    /// What it is.
    pub node: Node,
    /// Why it is there.
    pub origin: Origin,
}

/// An artifact as recorded in the SBOM and manifest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArtifactRecord {
    /// Lock entry name.
    pub name: String,
    /// Upstream version.
    pub version: String,
    /// Upstream URL (`NOASSERTION` for kiln-firstboot, built by this workspace).
    pub url: String,
    /// sha256 of the download.
    pub sha256: String,
}

/// A container image baked into the layer, as recorded in the SBOM.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageRecord {
    /// Lock image name.
    pub name: String,
    /// The lock's reference, `HOST/REPO[:TAG]`.
    pub reference: String,
    /// The pinned digest (index, or manifest of a single-platform image).
    pub digest: String,
    /// The layer platform's manifest digest.
    pub platform_digest: String,
    /// The archive's path in the layer.
    pub path: String,
}

/// A layer: every path with its bytes and provenance, sorted.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Image definition name.
    pub name: String,
    /// Target OS.
    pub os: Os,
    /// Target arch.
    pub arch: Arch,
    /// Output format the layer is shaped for.
    pub format: Format,
    /// Kubernetes version.
    pub kubernetes_version: String,
    /// Timestamp of every entry (SOURCE_DATE_EPOCH).
    pub epoch: u64,
    /// `sha256:` + 32 hex of the manifest of every other file (see docs/contract.md).
    pub image_id: String,
    /// Paths relative to the root, without a leading `/`; parents always present.
    pub entries: BTreeMap<String, Entry>,
    /// The artifacts it was baked from, by name.
    pub artifacts: Vec<ArtifactRecord>,
    /// The container images it carries, in lock order.
    pub images: Vec<ImageRecord>,
}

/// Checks one binary before it is baked: `(file, label)` → `Err(why)` to refuse.
pub type Gate<'a> = dyn Fn(&Path, &str) -> Result<(), InspectError> + Sync + 'a;

/// Everything a bake needs.
pub struct BakeRequest<'a> {
    /// The image definition.
    pub def: &'a ImageDef,
    /// Target architecture.
    pub arch: Arch,
    /// Output format.
    pub format: Format,
    /// The lock's artifacts for this OS/arch, with their blobs.
    pub artifacts: &'a [ArtifactInput],
    /// The lock's images pinned for this OS/arch, resolved from the store
    /// ([`crate::bake::images::images_from_lock`]); empty for none.
    pub images: &'a [crate::bake::images::ImageInput],
    /// The kiln-firstboot binary to ship.
    pub firstboot: &'a Path,
    /// Timestamp for every entry.
    pub epoch: u64,
    /// Scratch directory for extracted members (removed by the caller).
    pub work: &'a Path,
    /// The inspection gate every binary passes.
    pub gate: &'a Gate<'a>,
    /// The bake cache (extracted members, hashes); `None` extracts into `work` every time.
    pub cache: Option<&'a Path>,
}

impl std::fmt::Debug for BakeRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BakeRequest")
            .field("image", &self.def.name)
            .field("arch", &self.arch)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

/// Flattens the definition into dotted keys with compact JSON values: the vocabulary
/// `kiln diff` explains config changes in.
pub fn config_keys(def: &ImageDef) -> BTreeMap<String, String> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            serde_json::Value::Null => {}
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(v) = serde_json::to_value(def) {
        walk("", &v, &mut out);
    }
    out.remove("description");
    out
}

pub(crate) fn config_origin(keys: &BTreeMap<String, String>, prefixes: &[&str]) -> Origin {
    Origin::Config(
        keys.iter()
            .filter(|(k, _)| {
                prefixes
                    .iter()
                    .any(|p| k.as_str() == *p || k.starts_with(&format!("{p}.")))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    )
}

pub(crate) fn describe(o: &Origin) -> String {
    match o {
        Origin::Artifact { name, member } => format!("artifact {name} member {member}"),
        Origin::Config(keys) => format!(
            "config {}",
            keys.keys().cloned().collect::<Vec<_>>().join(",")
        ),
        Origin::Kiln(w) => format!("kiln {w}"),
        Origin::Image { name, digest } => format!("image {name} {digest}"),
    }
}

/// Whether a layer path component is acceptable (no `..`, no whitespace or control bytes,
/// which the squashfs pseudo-file syntax and the manifests could not carry).
pub(crate) fn valid_rel(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
        && path.chars().all(|c| !c.is_whitespace() && !c.is_control())
}

pub use crate::layer_contract::{civil, INSTALL_MANIFEST};

/// The mode of every published output: read-only-ish data, fixed so it is umask-independent.
pub(crate) const OUTPUT_MODE: u32 = 0o644;

/// Writes `bytes` to `path` atomically with the layer output mode, 0644 (see
/// [`crate::atomic_file`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), BakeError> {
    Ok(atomic_file::write(path, ".kiln-", bytes, OUTPUT_MODE)?)
}

/// Like [`write_atomic`], with a writer callback for streamed outputs.
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), BakeError> {
    Ok(atomic_file::write_with(path, ".kiln-", OUTPUT_MODE, fill)?)
}

impl Layer {
    pub(crate) fn new(req: &BakeRequest<'_>) -> Layer {
        Layer {
            name: req.def.name.clone(),
            os: req.def.os,
            arch: req.arch,
            format: req.format,
            kubernetes_version: req.def.kubernetes.version.clone(),
            epoch: req.epoch,
            image_id: String::new(),
            entries: BTreeMap::new(),
            artifacts: Vec::new(),
            images: Vec::new(),
        }
    }

    pub(crate) fn add(&mut self, path: &str, node: Node, origin: Origin) -> Result<(), BakeError> {
        let path = path.trim_start_matches('/').to_string();
        if !valid_rel(&path) {
            return Err(BakeError::Conflict {
                path,
                first: "kiln's path rules (no .., no spaces)".into(),
                second: describe(&origin),
            });
        }
        let mut parent = String::new();
        let comps: Vec<&str> = path.split('/').collect();
        for c in &comps[..comps.len() - 1] {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(c);
            match self.entries.get(&parent) {
                Some(Entry {
                    node: Node::Dir, ..
                }) => {}
                Some(e) => {
                    return Err(BakeError::Conflict {
                        path: parent.clone(),
                        first: describe(&e.origin),
                        second: format!("a directory for {}", describe(&origin)),
                    })
                }
                None => {
                    self.entries.insert(
                        parent.clone(),
                        Entry {
                            node: Node::Dir,
                            origin: Origin::Kiln("directory".into()),
                        },
                    );
                }
            }
        }
        if let Some(e) = self.entries.get(&path) {
            if matches!((&e.node, &node), (Node::Dir, Node::Dir)) {
                return Ok(());
            }
            return Err(BakeError::Conflict {
                path,
                first: describe(&e.origin),
                second: describe(&origin),
            });
        }
        self.entries.insert(path, Entry { node, origin });
        Ok(())
    }

    pub(crate) fn add_text(
        &mut self,
        path: &str,
        text: String,
        origin: Origin,
    ) -> Result<(), BakeError> {
        let bytes = text.into_bytes();
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let sha1 = hex::encode(sha1::Sha1::digest(&bytes));
        let size = bytes.len() as u64;
        self.add(
            path,
            Node::File {
                data: Data::Inline(bytes),
                mode: 0o644,
                size,
                sha256,
                sha1,
            },
            origin,
        )
    }

    /// `sha256:` + the first 32 hex digits of the sha256 of the layer's listing
    /// (`type mode sha256-or-target path` per entry, sorted), leaving out the files that
    /// carry the id itself.
    pub(crate) fn compute_image_id(&self) -> String {
        let mut h = Sha256::new();
        for (path, e) in &self.entries {
            let line = match &e.node {
                Node::Dir => format!("dir 0755 - {path}\n"),
                Node::File { mode, sha256, .. } => format!("file {mode:04o} {sha256} {path}\n"),
                Node::Symlink(t) => format!("link 0777 {t} {path}\n"),
            };
            h.update(line.as_bytes());
        }
        h.update(format!("format {}\n", self.format).as_bytes());
        format!("sha256:{}", &hex::encode(h.finalize())[..32])
    }

    /// The `install.manifest` text: `sha256  mode  /path` for every file and symlink kiln
    /// owns (symlinks: sha256 of the target, mode `link`).
    pub(crate) fn install_manifest(&self) -> String {
        use crate::layer_contract::install_manifest::{render_manifest, Owned};
        let owned = self
            .entries
            .iter()
            .filter_map(|(path, e)| {
                let o = match &e.node {
                    Node::File { mode, sha256, .. } => Owned {
                        sha256: sha256.clone(),
                        mode: format!("{mode:04o}"),
                    },
                    Node::Symlink(t) => Owned {
                        sha256: hex::encode(Sha256::digest(t.as_bytes())),
                        mode: "link".into(),
                    },
                    Node::Dir => return None,
                };
                Some((path.clone(), o))
            })
            .collect();
        render_manifest(&owned)
    }

    /// The path of a base output file name: `<name>-<kubernetes version>-<arch>`.
    pub fn base_name(&self) -> String {
        format!("{}-{}-{}", self.name, self.kubernetes_version, self.arch)
    }
}
