//! `kiln bake`: turns verified artifacts and an image definition into the exact bytes that go
//! onto a node. [`Layer::assemble`] builds an in-memory layer (paths, modes, hashes, and
//! where each file came from); one writer per format turns it into a sysext image, a rootfs
//! overlay `.tar.zst` or a Windows `.zip`, each with an SPDX SBOM and a kiln manifest.

pub mod chunk_cache;
pub mod extract;
pub mod gpg;
pub mod manifest;
pub mod prepare;
pub mod render;
pub mod rootfs;
pub mod sbom;
pub mod squashfs;
pub mod sysext;
pub mod units;
pub mod windows;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::atomic_file;
use crate::digest::{self, Sums};
use crate::exit::ExitClass;
use crate::image_def::{Arch, Format, ImageDef, Os};
use crate::supply::inspect::InspectError;
pub use extract::ArchiveKind;

/// Default `SOURCE_DATE_EPOCH` when the environment sets none: 2024-01-01T00:00:00Z.
pub const DEFAULT_EPOCH: u64 = 1_704_067_200;

/// Why a bake failed. Every message names the artifact, file or key involved.
#[derive(Debug, thiserror::Error)]
pub enum BakeError {
    /// The pinned AWS ENI table is missing, is not the one the definition pins, or does not
    /// parse: a pinned input that did not verify.
    #[error("image {image}: sizing.aws_table: {source}")]
    SizingTable {
        /// The image definition's name.
        image: String,
        /// What is wrong with the table.
        #[source]
        source: crate::sizing::TableError,
    },
    /// An I/O error on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The lock has no entry the definition needs.
    #[error("image {image}: artifact {name:?} for {os}/{arch} is not in the lock")]
    MissingArtifact {
        /// Image name.
        image: String,
        /// Lock entry name.
        name: String,
        /// Target OS.
        os: Os,
        /// Target arch.
        arch: Arch,
    },
    /// An artifact contradicts the definition.
    #[error("image {image}: artifact {name:?}: expected {expected}, found {found}")]
    Artifact {
        /// Image name.
        image: String,
        /// Lock entry name.
        name: String,
        /// What the definition needs.
        expected: String,
        /// What the lock or blob holds.
        found: String,
    },
    /// A store blob does not hold the bytes the lock names.
    #[error("artifact {name}: expected {expected}, found {found}")]
    Blob {
        /// The artifact and blob path.
        name: String,
        /// The lock's digest.
        expected: String,
        /// What the blob hashes to.
        found: String,
    },
    /// A binary failed the inspection gate.
    #[error("inspection refused {what} ({path}): {why}")]
    Inspect {
        /// The artifact member or `kiln-firstboot`.
        what: String,
        /// The file inspected.
        path: PathBuf,
        /// The gate's reason.
        why: Box<InspectError>,
    },
    /// Two sources want the same path in the layer.
    #[error("layer path /{path} is wanted by both {first} and {second}")]
    Conflict {
        /// The layer path.
        path: String,
        /// The first claimant.
        first: String,
        /// The second claimant.
        second: String,
    },
    /// The format cannot be baked from this definition.
    #[error("image {image}: format {format} is not one of the definition's formats ({})", allowed.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Format {
        /// Image name.
        image: String,
        /// Requested format.
        format: Format,
        /// Formats the definition lists.
        allowed: Vec<Format>,
    },
    /// An archive was refused or lacked a member.
    #[error(transparent)]
    Extract(#[from] extract::ExtractError),
    /// The squashfs writer refused the tree or failed to write.
    #[error(transparent)]
    Squash(#[from] squashfs::SquashError),
    /// An external tool failed.
    #[error("{tool} failed: {detail}")]
    Tool {
        /// The tool (`mksquashfs`).
        tool: String,
        /// Its exit status and stderr.
        detail: String,
    },
}

impl BakeError {
    /// A binary the gate refuses, a blob that is not what the lock says and a hostile archive
    /// exit 3; the rest is a failure.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            BakeError::Inspect { .. }
            | BakeError::Blob { .. }
            | BakeError::SizingTable { .. }
            | BakeError::Extract(extract::ExtractError::Hostile { .. }) => ExitClass::Verify,
            _ => ExitClass::Failure,
        }
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> BakeError {
    let path = path.to_path_buf();
    move |source| BakeError::Io { path, source }
}

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

fn config_origin(keys: &BTreeMap<String, String>, prefixes: &[&str]) -> Origin {
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

fn describe(o: &Origin) -> String {
    match o {
        Origin::Artifact { name, member } => format!("artifact {name} member {member}"),
        Origin::Config(keys) => format!(
            "config {}",
            keys.keys().cloned().collect::<Vec<_>>().join(",")
        ),
        Origin::Kiln(w) => format!("kiln {w}"),
    }
}

/// Whether a layer path component is acceptable (no `..`, no whitespace or control bytes,
/// which the squashfs pseudo-file syntax and the manifests could not carry).
fn valid_rel(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
        && path.chars().all(|c| !c.is_whitespace() && !c.is_control())
}

impl Layer {
    fn new(req: &BakeRequest<'_>) -> Layer {
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
        }
    }

    fn add(&mut self, path: &str, node: Node, origin: Origin) -> Result<(), BakeError> {
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

    fn add_text(&mut self, path: &str, text: String, origin: Origin) -> Result<(), BakeError> {
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

    /// Builds the layer for one definition, arch and format.
    pub fn assemble(req: &BakeRequest<'_>) -> Result<Layer, BakeError> {
        let def = req.def;
        if !def.formats.contains(&req.format) {
            return Err(BakeError::Format {
                image: def.name.clone(),
                format: req.format,
                allowed: def.formats.clone(),
            });
        }
        let mut layer = Layer::new(req);
        let keys = config_keys(def);
        let mut versions = BTreeMap::new();
        let mut lock_keys = keys.clone();

        // Artifacts, in definition order: checked here, then prepared in parallel (extract,
        // hash, gate), then placed in order.
        let mut planned: Vec<(&ArtifactInput, Vec<&MemberMap>, String)> = Vec::new();
        for p in def.artifacts.iter() {
            let a = req
                .artifacts
                .iter()
                .find(|a| a.name == p.name)
                .ok_or_else(|| BakeError::MissingArtifact {
                    image: def.name.clone(),
                    name: p.name.clone(),
                    os: def.os,
                    arch: req.arch,
                })?;
            if a.name == "kubelet" && a.version != def.kubernetes.version {
                return Err(BakeError::Artifact {
                    image: def.name.clone(),
                    name: a.name.clone(),
                    expected: format!("version {} (kubernetes.version)", def.kubernetes.version),
                    found: format!("version {} in the lock", a.version),
                });
            }
            let members: Vec<&MemberMap> = a
                .members
                .iter()
                .filter(|m| p.only.is_empty() || p.only.iter().any(|o| o == &m.to))
                .collect();
            for o in &p.only {
                if !a.members.iter().any(|m| &m.to == o) {
                    return Err(BakeError::Artifact {
                        image: def.name.clone(),
                        name: a.name.clone(),
                        expected: format!("a member with to = {o:?} (artifact.only)"),
                        found: format!(
                            "members {:?}",
                            a.members.iter().map(|m| &m.to).collect::<Vec<_>>()
                        ),
                    });
                }
            }
            if members.is_empty() {
                return Err(BakeError::Artifact {
                    image: def.name.clone(),
                    name: a.name.clone(),
                    expected: "at least one member".into(),
                    found: "none".into(),
                });
            }
            let prefix = def.prefix_of(p);
            planned.push((a, members, prefix));
            if let Some(k) = p.version_env_key() {
                versions.insert(k, a.version.clone());
            }
            lock_keys.insert(format!("lock.{}.version", a.name), a.version.clone());
            layer.artifacts.push(ArtifactRecord {
                name: a.name.clone(),
                version: a.version.clone(),
                url: a.url.clone(),
                sha256: a.sha256.clone(),
            });
        }

        // The gate reads a whole binary into memory; one at a time keeps peak memory at about
        // the largest binary while extraction and hashing run in parallel.
        let gate_turn = std::sync::Mutex::new(());
        let gate_turn = &gate_turn;
        let prepared: Vec<Result<Vec<prepare::Prepared>, BakeError>> = std::thread::scope(|sc| {
            let handles: Vec<_> = planned
                .iter()
                .enumerate()
                .map(|(ai, (a, members, _))| {
                    sc.spawn(move || {
                        let work = req.work.join(format!("extract-{ai}"));
                        let files = prepare::prepare(a, members, req.cache, &work)?;
                        for f in &files {
                            let label = format!("{} {} member {}", a.name, a.version, f.from);
                            let _turn = gate_turn.lock().unwrap_or_else(|e| e.into_inner());
                            (req.gate)(&f.path, &label).map_err(|why| BakeError::Inspect {
                                what: label.clone(),
                                path: f.path.clone(),
                                why: Box::new(why),
                            })?;
                        }
                        Ok(files)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("artifact preparation panicked"))
                .collect()
        });
        for ((a, _, prefix), files) in planned.iter().zip(prepared) {
            for f in files? {
                layer.add(
                    &format!("{prefix}/{}", f.to),
                    Node::File {
                        data: Data::File(f.path),
                        mode: 0o755,
                        size: f.size,
                        sha256: f.sha256,
                        sha1: f.sha1,
                    },
                    Origin::Artifact {
                        name: a.name.clone(),
                        member: f.from,
                    },
                )?;
            }
        }

        // kiln-firstboot, hashed and gated like any artifact.
        let fb =
            digest::hash_file(req.firstboot, Sums::Sha256AndSha1).map_err(io_err(req.firstboot))?;
        let (fb_size, fb_sha, fb_sha1) = (fb.size, fb.sha256, fb.sha1.unwrap_or_default());
        (req.gate)(req.firstboot, "kiln-firstboot").map_err(|why| BakeError::Inspect {
            // Not a lock entry: the image definition and --arch decide what it must be.
            what: format!("kiln-firstboot for image {} --arch {}", def.name, req.arch),
            path: req.firstboot.to_path_buf(),
            why: Box::new(why),
        })?;
        let (fb_path, kiln_dir) = match def.os {
            Os::Linux => ("usr/bin/kiln-firstboot", "usr/lib/kiln"),
            Os::Windows => ("k/kiln-firstboot.exe", "k/kiln"),
        };
        layer.add(
            fb_path,
            Node::File {
                data: Data::File(req.firstboot.to_path_buf()),
                mode: 0o755,
                size: fb_size,
                sha256: fb_sha.clone(),
                sha1: fb_sha1,
            },
            Origin::Artifact {
                name: "kiln-firstboot".into(),
                member: "kiln-firstboot".into(),
            },
        )?;
        layer.artifacts.push(ArtifactRecord {
            name: "kiln-firstboot".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            url: "NOASSERTION".into(),
            sha256: fb_sha,
        });
        layer.artifacts.sort_by(|a, b| a.name.cmp(&b.name));

        // Rendered files.
        layer.add_text(
            &format!("{kiln_dir}/max-pods.map"),
            render::max_pods_map(def),
            config_origin(&keys, &["max_pods"]),
        )?;
        let table =
            def.sizing
                .load_table(&def.base_dir)
                .map_err(|source| BakeError::SizingTable {
                    image: def.name.clone(),
                    source,
                })?;
        if let Some(table) = table {
            let sha256 = hex::encode(Sha256::digest(&table));
            let sha1 = hex::encode(sha1::Sha1::digest(&table));
            let size = table.len() as u64;
            layer.add(
                &format!("{kiln_dir}/aws-eni.tsv"),
                Node::File {
                    data: Data::Inline(table),
                    mode: 0o644,
                    size,
                    sha256,
                    sha1,
                },
                config_origin(&keys, &["sizing.aws_table", "sizing.aws_table_sha256"]),
            )?;
        }
        layer.add_text(
            &format!("{kiln_dir}/kubelet-config.yaml"),
            render::kubelet_config(def),
            config_origin(
                &keys,
                &["kubernetes.cgroup_driver", "kubernetes.cluster_domain"],
            ),
        )?;
        match def.os {
            Os::Linux => layer.add_linux_files(req, &keys, &lock_keys, &versions)?,
            Os::Windows => layer.add_windows_files(def, &lock_keys)?,
        }

        // The image id covers every entry but the files that carry it.
        layer.image_id = layer.compute_image_id();
        layer.add_text(
            &format!("{kiln_dir}/image.env"),
            render::image_env(def, req.arch, &layer.image_id, &versions),
            Origin::Kiln("image facts: id and versions".into()),
        )?;
        if req.format == Format::Rootfs {
            let m = layer.install_manifest();
            layer.add_text(INSTALL_MANIFEST, m, Origin::Kiln("install manifest".into()))?;
        }
        Ok(layer)
    }

    /// One `certs.d/<host>/hosts.toml` per registry, with its CA files beside it.
    /// `layer_dir` is the layer path of `certs.d`; `node_path` turns a layer path into the
    /// path containerd sees on the node (`/usr/lib/…` or `C:\k\…`).
    fn add_registries(
        &mut self,
        def: &ImageDef,
        keys: &BTreeMap<String, String>,
        layer_dir: &str,
        node_path: impl Fn(&str) -> String,
    ) -> Result<(), BakeError> {
        for (ri, reg) in def.containerd.registries.iter().enumerate() {
            let dir = format!("{layer_dir}/{}", render::certs_dir_name(&reg.host, def.os));
            let mut cas = Vec::new();
            for (ci, ca) in reg.ca.iter().enumerate() {
                let src = def.base_dir.join(ca);
                let pem = std::fs::read(&src).map_err(io_err(&src))?;
                if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                    return Err(BakeError::Artifact {
                        image: def.name.clone(),
                        name: format!("containerd.registry[{ri}].ca[{ci}]"),
                        expected: "a PEM certificate".into(),
                        found: format!("{} without a BEGIN CERTIFICATE line", src.display()),
                    });
                }
                let name = format!("{dir}/ca-{ci}.crt");
                let sha256 = hex::encode(Sha256::digest(&pem));
                let sha1 = hex::encode(sha1::Sha1::digest(&pem));
                let size = pem.len() as u64;
                self.add(
                    &name,
                    Node::File {
                        data: Data::Inline(pem),
                        mode: 0o644,
                        size,
                        sha256,
                        sha1,
                    },
                    config_origin(keys, &["containerd.registry"]),
                )?;
                cas.push(node_path(&name));
            }
            self.add_text(
                &format!("{dir}/hosts.toml"),
                render::hosts_toml(reg, &cas),
                config_origin(keys, &["containerd.registry"]),
            )?;
        }
        Ok(())
    }

    /// containerd's Windows files under `k/containerd` (`C:\k\containerd`): config.toml,
    /// `certs.d`, and the proxy environment kiln-firstboot install gives the service.
    fn add_windows_files(
        &mut self,
        def: &ImageDef,
        lock_keys: &BTreeMap<String, String>,
    ) -> Result<(), BakeError> {
        let containerd_version = lock_keys.get("lock.containerd.version").map(String::as_str);
        self.add_text(
            "k/containerd/config.toml",
            render::containerd_config_windows(def, containerd_version),
            config_origin(
                lock_keys,
                &[
                    "containerd.sandbox_image",
                    "containerd.registry",
                    "lock.containerd.version",
                ],
            ),
        )?;
        self.add_registries(def, lock_keys, "k/containerd/certs.d", |p| {
            format!("C:\\{}", p.replace('/', "\\"))
        })?;
        if let Some(env) = render::containerd_env_windows(def) {
            self.add_text(
                "k/containerd/containerd.env",
                env,
                config_origin(lock_keys, &["containerd.proxy"]),
            )?;
        }
        Ok(())
    }

    fn add_linux_files(
        &mut self,
        req: &BakeRequest<'_>,
        keys: &BTreeMap<String, String>,
        lock_keys: &BTreeMap<String, String>,
        _versions: &BTreeMap<String, String>,
    ) -> Result<(), BakeError> {
        let def = req.def;
        let containerd_version = lock_keys.get("lock.containerd.version").map(String::as_str);
        self.add_text(
            "usr/lib/kiln/containerd/config.toml",
            render::containerd_config(def, containerd_version),
            config_origin(
                lock_keys,
                &[
                    "containerd.sandbox_image",
                    "kubernetes.cgroup_driver",
                    "containerd.registry",
                    "lock.containerd.version",
                ],
            ),
        )?;
        self.add_registries(def, keys, "usr/lib/kiln/containerd/certs.d", |p| {
            format!("/{p}")
        })?;
        if !def.sysctl.is_empty() {
            self.add_text(
                "usr/lib/sysctl.d/90-kiln.conf",
                render::sysctl_conf(def),
                config_origin(keys, &["sysctl"]),
            )?;
        }
        if !def.modules.is_empty() {
            self.add_text(
                "usr/lib/modules-load.d/kiln.conf",
                render::modules_conf(def),
                config_origin(keys, &["modules"]),
            )?;
        }
        let mut proxy = Vec::new();
        if let Some(p) = &def.containerd.proxy {
            for (k, v) in [
                ("HTTP_PROXY", &p.http),
                ("HTTPS_PROXY", &p.https),
                ("NO_PROXY", &p.no_proxy),
            ] {
                if let Some(v) = v {
                    proxy.push((k.to_string(), v.clone()));
                }
            }
        }
        let units_dir = "usr/lib/systemd/system";
        let mut unit_texts: Vec<(String, String, bool, Origin)> = vec![
            (
                "kiln-firstboot.service".into(),
                units::KILN_FIRSTBOOT.into(),
                true,
                Origin::Kiln("unit".into()),
            ),
            (
                "kubelet.service".into(),
                units::KUBELET.into(),
                false,
                Origin::Kiln("unit".into()),
            ),
            (
                "kiln-report.service".into(),
                units::KILN_REPORT.into(),
                false,
                Origin::Kiln("unit".into()),
            ),
            (
                "kiln-report.timer".into(),
                units::KILN_REPORT_TIMER.into(),
                true,
                Origin::Kiln("unit".into()),
            ),
            (
                "containerd.service".into(),
                units::containerd(&proxy),
                true,
                config_origin(keys, &["containerd.proxy"]),
            ),
        ];
        for u in &def.units {
            unit_texts.push((
                u.name.clone(),
                u.content.clone(),
                u.enable,
                config_origin(keys, &["unit"]),
            ));
        }
        for (name, text, enable, origin) in unit_texts {
            if enable {
                for target in units::wanted_by(&text) {
                    // A sysext may only hold /usr, so it carries vendor-style wants links;
                    // a rootfs gets the /etc links `systemctl enable` itself would create.
                    let (link, dest) = match req.format {
                        Format::Sysext => (
                            format!("{units_dir}/{target}.wants/{name}"),
                            format!("../{name}"),
                        ),
                        _ => (
                            format!("etc/systemd/system/{target}.wants/{name}"),
                            format!("/{units_dir}/{name}"),
                        ),
                    };
                    self.add(
                        &link,
                        Node::Symlink(dest),
                        Origin::Kiln("unit enablement".into()),
                    )?;
                }
            }
            self.add_text(&format!("{units_dir}/{name}"), text, origin)?;
        }
        if req.format == Format::Sysext {
            let sx = def.sysext.as_ref().ok_or_else(|| BakeError::Format {
                image: def.name.clone(),
                format: Format::Sysext,
                allowed: def.formats.clone(),
            })?;
            let text = render::extension_release(def, req.arch).unwrap_or_default();
            // systemd matches the release file to the image's name: `<name>` when nodes link
            // it as /etc/extensions/<name>.raw (the sysupdate layout), the versioned file
            // stem when the image is used under its published file name.
            let stem = render::sysext_file_name(def, req.arch)
                .unwrap_or_default()
                .trim_end_matches(".raw")
                .to_string();
            for n in [sx.name.as_str(), stem.as_str()] {
                self.add_text(
                    &format!("usr/lib/extension-release.d/extension-release.{n}"),
                    text.clone(),
                    config_origin(
                        keys,
                        &["sysext.id", "sysext.sysext_level", "sysext.version_id"],
                    ),
                )?;
            }
        }
        Ok(())
    }

    /// `sha256:` + the first 32 hex digits of the sha256 of the layer's listing
    /// (`type mode sha256-or-target path` per entry, sorted), leaving out the files that
    /// carry the id itself.
    fn compute_image_id(&self) -> String {
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
    fn install_manifest(&self) -> String {
        let mut s = String::from("# kiln install manifest v1: sha256  mode  path\n");
        for (path, e) in &self.entries {
            match &e.node {
                Node::File { mode, sha256, .. } => {
                    s.push_str(&format!("{sha256}  {mode:04o}  /{path}\n"))
                }
                Node::Symlink(t) => s.push_str(&format!(
                    "{}  link  /{path}\n",
                    hex::encode(Sha256::digest(t.as_bytes()))
                )),
                Node::Dir => {}
            }
        }
        s
    }

    /// The path of a base output file name: `<name>-<kubernetes version>-<arch>`.
    pub fn base_name(&self) -> String {
        format!("{}-{}-{}", self.name, self.kubernetes_version, self.arch)
    }
}

/// Records `name`'s sha256 in `SHA256SUMS` in `out_dir` (keeping the other images listed
/// there, so several arches, versions or formats can be published side by side), then signs
/// it with gpg or removes a `SHA256SUMS.gpg` that no longer matches. A `SHA256SUMS.minisig`
/// (made by hand with minisign, checked by `kiln install --trusted-key`) no longer matches
/// either and is removed. Returns the sums file and the gpg signature, if made.
pub fn publish_sums(
    out_dir: &Path,
    name: &str,
    sha256: &str,
    sign: Option<&gpg::GpgSigner>,
) -> Result<(PathBuf, Option<PathBuf>), BakeError> {
    let sums = out_dir.join("SHA256SUMS");
    let mut lines: BTreeMap<String, String> = BTreeMap::new();
    if let Ok(old) = std::fs::read_to_string(&sums) {
        for l in old.lines() {
            if let Some((h, f)) = l.split_once("  ") {
                lines.insert(f.to_string(), h.to_string());
            }
        }
    }
    lines.insert(name.to_string(), sha256.to_string());
    let text: String = lines.iter().map(|(f, h)| format!("{h}  {f}\n")).collect();
    write_atomic(&sums, text.as_bytes())?;
    let minisig = out_dir.join("SHA256SUMS.minisig");
    match std::fs::remove_file(&minisig) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(BakeError::Io {
                path: minisig,
                source: e,
            })
        }
        _ => {}
    }
    let sig = gpg::publish_signature(sign, &sums)?;
    Ok((sums, sig))
}

/// Where the install manifest lives in a rootfs layer.
pub const INSTALL_MANIFEST: &str = "usr/lib/kiln/install.manifest";

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

impl From<atomic_file::WriteError> for BakeError {
    fn from(e: atomic_file::WriteError) -> BakeError {
        BakeError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

/// What one bake produced.
#[derive(Debug, Clone)]
pub struct BakeOutput {
    /// The content-derived image id.
    pub image_id: String,
    /// Every file written, main output first.
    pub files: Vec<PathBuf>,
    /// The kiln manifest of the layer (for `--explain`).
    pub manifest: manifest::Manifest,
}

/// Output writer options.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Compression threads (0 = all cores). Never changes the bytes written.
    pub threads: u32,
    /// `mksquashfs` binary, for xz sysext images only (zstd and gzip use kiln's own writer).
    pub mksquashfs: PathBuf,
    /// Sign a sysext's `SHA256SUMS` (`SHA256SUMS.gpg`, transfer file `Verify=true`);
    /// `None` publishes it unsigned (`Verify=false`).
    pub sign: Option<gpg::GpgSigner>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            threads: 0,
            mksquashfs: PathBuf::from("mksquashfs"),
            sign: None,
        }
    }
}

/// Bakes one layer into `out_dir`: the format's main output, `<base>.spdx.json`, and
/// `<base>.manifest.json`, plus `SHA256SUMS` for sysext and rootfs (and the sysupdate
/// transfer file for sysext).
pub fn bake(
    req: &BakeRequest<'_>,
    out_dir: &Path,
    opts: &WriteOptions,
) -> Result<BakeOutput, BakeError> {
    std::fs::create_dir_all(out_dir).map_err(io_err(out_dir))?;
    let layer = Layer::assemble(req)?;
    let base = layer.base_name();
    let mut files = Vec::new();
    // The SBOM reads every file again for SHA1; it runs beside the format writer.
    let (main, sbom) = std::thread::scope(|s| {
        let sbom = s.spawn(|| sbom::spdx_json(&layer));
        let main = match req.format {
            Format::Sysext => sysext::write(&layer, req.def, out_dir, req.work, req.cache, opts),
            Format::Rootfs => {
                let p = out_dir.join(format!("{base}.tar.zst"));
                let cache = req.cache.map(chunk_cache::ChunkCache::new);
                let ro = rootfs::RootfsOptions {
                    threads: opts.threads,
                    cache: cache.as_ref(),
                    framing: rootfs::FRAMING,
                };
                rootfs::write(&layer, &p, &ro).map(|_| vec![p])
            }
            Format::Windows => {
                let p = out_dir.join(format!("{base}.zip"));
                windows::write(&layer, &p).map(|_| vec![p])
            }
        };
        (main, sbom.join().expect("sbom thread panicked"))
    });
    let main = main?;
    // The SBOM pass re-hashes every file; a mismatch means an input changed under the bake,
    // so the image just written is not what the manifest says: take it back.
    let sbom = match sbom {
        Ok(s) => s,
        Err(e) => {
            for f in &main {
                let _ = std::fs::remove_file(f);
            }
            return Err(e);
        }
    };
    // SHA256SUMS beside a rootfs layer is what `kiln install` checks it against; it is
    // written only once the layer is known good.
    let sums = match req.format {
        Format::Rootfs => {
            let sha = digest::hash_file(&main[0], Sums::Sha256)
                .map_err(io_err(&main[0]))?
                .sha256;
            let name = format!("{base}.tar.zst");
            let (sums, sig) = publish_sums(out_dir, &name, &sha, opts.sign.as_ref())?;
            [sums].into_iter().chain(sig).collect()
        }
        _ => Vec::new(),
    };
    files.extend(main);
    files.extend(sums);
    let sbom_path = out_dir.join(format!("{base}.spdx.json"));
    write_atomic(&sbom_path, sbom.as_bytes())?;
    files.push(sbom_path);
    let m = manifest::Manifest::of(&layer);
    let mpath = out_dir.join(format!("{base}.manifest.json"));
    write_atomic(&mpath, m.to_json().as_bytes())?;
    files.push(mpath);
    Ok(BakeOutput {
        image_id: layer.image_id.clone(),
        files,
        manifest: m,
    })
}

/// Reads `SOURCE_DATE_EPOCH` from the environment, else [`DEFAULT_EPOCH`].
pub fn epoch_from_env() -> Result<u64, String> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("SOURCE_DATE_EPOCH: expected whole seconds, found {v:?}")),
        Err(_) => Ok(DEFAULT_EPOCH),
    }
}

/// Days-since-epoch to a civil date (Howard Hinnant's algorithm), for SPDX and zip times.
pub fn civil(epoch: u64) -> (i64, u32, u32, u32, u32, u32) {
    let secs = epoch as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = if m <= 2 { y + 1 } else { y };
    (
        y,
        m,
        d,
        (rem / 3600) as u32,
        ((rem % 3600) / 60) as u32,
        (rem % 60) as u32,
    )
}

/// The lock entries a definition places, for one arch, with their blobs from `store`.
/// A missing entry or a blob absent from the store is an error naming it.
pub fn inputs_from_lock(
    lock: &crate::supply::lock::Lock,
    store: &crate::supply::store::Store,
    def: &ImageDef,
    arch: Arch,
) -> Result<Vec<ArtifactInput>, BakeError> {
    let mut out = Vec::new();
    for p in &def.artifacts {
        let a = lock
            .find(&p.name, def.os, arch)
            .ok_or_else(|| BakeError::MissingArtifact {
                image: def.name.clone(),
                name: p.name.clone(),
                os: def.os,
                arch,
            })?;
        let blob = store.lookup(a).ok_or_else(|| BakeError::Artifact {
            image: def.name.clone(),
            name: a.id(),
            expected: format!(
                "blob {} in the store at {}",
                a.sha256,
                store.root().display()
            ),
            found: "nothing (run `kiln fetch` or `kiln mirror sync` first)".into(),
        })?;
        let kind = match a.format {
            crate::supply::lock::Format::Binary => InputKind::Binary,
            crate::supply::lock::Format::TarGz => InputKind::Archive(ArchiveKind::TarGz),
            crate::supply::lock::Format::Zip => InputKind::Archive(ArchiveKind::Zip),
        };
        out.push(ArtifactInput {
            name: a.name.clone(),
            version: a.version.clone(),
            url: a.url.clone(),
            sha256: a.sha256.clone(),
            kind,
            blob,
            members: a
                .members
                .iter()
                .map(|m| MemberMap {
                    from: m.from.clone(),
                    to: m.to.clone(),
                })
                .collect(),
        });
    }
    Ok(out)
}

/// The supply chain's inspection gate for `os`/`arch`: every baked binary must be an
/// executable for exactly that platform.
pub fn inspect_gate(os: Os, arch: Arch) -> impl Fn(&Path, &str) -> Result<(), InspectError> + Sync {
    move |path: &Path, what: &str| {
        crate::supply::inspect::inspect_file(path).and_then(|info| info.check(what, os, arch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        type Civil = (i64, u32, u32, u32, u32, u32);
        let cases: &[(u64, Civil)] = &[
            (0, (1970, 1, 1, 0, 0, 0)),
            (DEFAULT_EPOCH, (2024, 1, 1, 0, 0, 0)),
            (951_782_400, (2000, 2, 29, 0, 0, 0)),
            (1_700_000_000, (2023, 11, 14, 22, 13, 20)),
        ];
        for (e, want) in cases {
            assert_eq!(civil(*e), *want, "{e}");
        }
    }

    #[test]
    fn layer_paths_are_checked() {
        for (p, ok) in [
            ("usr/bin/x", true),
            ("usr/../x", false),
            ("usr/bin/a b", false),
            ("usr//x", false),
            ("", false),
        ] {
            assert_eq!(valid_rel(p), ok, "{p}");
        }
    }
}
