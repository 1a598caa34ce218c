//! The kiln layer manifest (`<base>.manifest.json`): every path with its hash, mode and
//! origin (artifact + version, or the definition keys it was rendered from), and the diff of
//! two manifests that `kiln diff` and `kiln bake --explain` print.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::bake::error::BakeError;
use crate::bake::layer::{ArtifactRecord, Layer, Node, Origin};

/// Manifest format version.
pub const MANIFEST_VERSION: u32 = 1;

/// One path in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRecord {
    /// Path without a leading `/`.
    pub path: String,
    /// `file`, `dir` or `symlink`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Octal permission bits (files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Size in bytes (files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// sha256 (files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Link target (symlinks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Why it is there.
    pub origin: Origin,
}

/// A layer's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`MANIFEST_VERSION`].
    pub kiln_manifest: u32,
    /// Content-derived image id.
    pub image_id: String,
    /// Image definition name.
    pub name: String,
    /// `linux` or `windows`.
    pub os: String,
    /// `amd64` or `arm64`.
    pub arch: String,
    /// `sysext`, `rootfs` or `windows`.
    pub format: String,
    /// Kubernetes version.
    pub kubernetes_version: String,
    /// kiln version that baked it.
    pub kiln_version: String,
    /// Artifacts it was baked from.
    pub artifacts: Vec<ArtifactRecord>,
    /// Every path, sorted.
    pub files: Vec<FileRecord>,
}

impl Manifest {
    /// The manifest of a layer.
    pub fn of(layer: &Layer) -> Manifest {
        let files = layer
            .entries
            .iter()
            .map(|(path, e)| {
                let mut r = FileRecord {
                    path: path.clone(),
                    kind: String::new(),
                    mode: None,
                    size: None,
                    sha256: None,
                    target: None,
                    origin: e.origin.clone(),
                };
                match &e.node {
                    Node::Dir => r.kind = "dir".into(),
                    Node::File {
                        mode, size, sha256, ..
                    } => {
                        r.kind = "file".into();
                        r.mode = Some(format!("{mode:04o}"));
                        r.size = Some(*size);
                        r.sha256 = Some(sha256.clone());
                    }
                    Node::Symlink(t) => {
                        r.kind = "symlink".into();
                        r.target = Some(t.clone());
                    }
                }
                r
            })
            .collect();
        Manifest {
            kiln_manifest: MANIFEST_VERSION,
            image_id: layer.image_id.clone(),
            name: layer.name.clone(),
            os: layer.os.to_string(),
            arch: layer.arch.to_string(),
            format: layer.format.to_string(),
            kubernetes_version: layer.kubernetes_version.clone(),
            kiln_version: env!("CARGO_PKG_VERSION").into(),
            artifacts: layer.artifacts.clone(),
            files,
        }
    }

    /// Pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// Reads a manifest file.
    pub fn load(path: &Path) -> Result<Manifest, BakeError> {
        let text = std::fs::read_to_string(path).map_err(crate::bake::error::io_err(path))?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| BakeError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not a kiln layer manifest: {e}"),
            ),
        })?;
        if m.kiln_manifest != MANIFEST_VERSION {
            return Err(BakeError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "expected kiln_manifest {MANIFEST_VERSION}, found {}",
                        m.kiln_manifest
                    ),
                ),
            });
        }
        Ok(m)
    }
}

/// How a path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// Only in the new layer.
    Added,
    /// Only in the old layer.
    Removed,
    /// In both, different.
    Changed,
}

/// One changed path and the reasons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// The path, without a leading `/`.
    pub path: String,
    /// Added, removed or changed.
    pub kind: ChangeKind,
    /// Why: artifact versions, definition keys, modes.
    pub why: Vec<String>,
}

fn artifact_map(m: &Manifest) -> BTreeMap<&str, &ArtifactRecord> {
    m.artifacts.iter().map(|a| (a.name.as_str(), a)).collect()
}

fn short(h: &str) -> &str {
    &h[..h.len().min(12)]
}

fn why_artifact(name: &str, old: &Manifest, new: &Manifest) -> Vec<String> {
    let (o, n) = (artifact_map(old), artifact_map(new));
    match (o.get(name), n.get(name)) {
        (Some(a), Some(b)) if a.version != b.version => {
            vec![format!("artifact {name} {} -> {}", a.version, b.version)]
        }
        (Some(a), Some(b)) if a.sha256 != b.sha256 => vec![format!(
            "artifact {name} {}: download changed (sha256 {} -> {})",
            b.version,
            short(&a.sha256),
            short(&b.sha256)
        )],
        (None, Some(b)) => vec![format!("artifact {name} {} added", b.version)],
        (Some(a), None) => vec![format!("artifact {name} {} removed", a.version)],
        _ => Vec::new(),
    }
}

fn why_config(
    old: Option<&BTreeMap<String, String>>,
    new: Option<&BTreeMap<String, String>>,
) -> Vec<String> {
    let empty = BTreeMap::new();
    let (o, n) = (old.unwrap_or(&empty), new.unwrap_or(&empty));
    let keys: BTreeSet<&String> = o.keys().chain(n.keys()).collect();
    keys.into_iter()
        .filter(|k| o.get(*k) != n.get(*k))
        .map(|k| {
            let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "(unset)".into());
            format!("{k}: {} -> {}", show(o.get(k)), show(n.get(k)))
        })
        .collect()
}

/// The differences between two layers, with reasons, sorted by path.
pub fn diff(old: &Manifest, new: &Manifest) -> Vec<Change> {
    let o: BTreeMap<&str, &FileRecord> = old.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let n: BTreeMap<&str, &FileRecord> = new.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let paths: BTreeSet<&str> = o.keys().chain(n.keys()).copied().collect();
    let mut out = Vec::new();
    for p in paths {
        let (a, b) = (o.get(p), n.get(p));
        let (kind, rec) = match (a, b) {
            (None, Some(b)) => (ChangeKind::Added, *b),
            (Some(a), None) => (ChangeKind::Removed, *a),
            (Some(a), Some(b))
                if a.kind == b.kind
                    && a.mode == b.mode
                    && a.sha256 == b.sha256
                    && a.target == b.target =>
            {
                continue
            }
            (Some(_), Some(b)) => (ChangeKind::Changed, *b),
            (None, None) => continue,
        };
        if rec.kind == "dir" && kind != ChangeKind::Changed {
            // Directories come and go with their files; the files explain them.
            continue;
        }
        let mut why = Vec::new();
        match (a.map(|r| &r.origin), b.map(|r| &r.origin)) {
            (_, Some(Origin::Artifact { name, .. }))
            | (Some(Origin::Artifact { name, .. }), None) => {
                why.extend(why_artifact(name, old, new));
                if let Some(Origin::Artifact { name: was, .. }) = a.map(|r| &r.origin) {
                    if b.is_some()
                        && !matches!(b.map(|r| &r.origin), Some(Origin::Artifact { name: n, .. }) if n == was)
                    {
                        why.push(format!("now from another artifact (was {was})"));
                    }
                }
            }
            (x, y) => {
                let cfg = |o: Option<&Origin>| match o {
                    Some(Origin::Config(k)) => Some(k.clone()),
                    _ => None,
                };
                let (cx, cy) = (cfg(x), cfg(y));
                if cx.is_some() || cy.is_some() {
                    why.extend(why_config(cx.as_ref(), cy.as_ref()));
                }
                if let (
                    Some(Origin::Image { digest: d0, .. }),
                    Some(Origin::Image { name, digest }),
                ) = (x, y)
                {
                    if d0 != digest {
                        why.push(format!("image {name} {d0} -> {digest}"));
                    }
                }
                if matches!(y.or(x), Some(Origin::Kiln(w)) if w.starts_with("image facts")) {
                    if old.image_id != new.image_id {
                        why.push(format!("image id {} -> {}", old.image_id, new.image_id));
                    }
                    for a in &new.artifacts {
                        why.extend(why_artifact(&a.name, old, new));
                    }
                    for a in &old.artifacts {
                        if !new.artifacts.iter().any(|b| b.name == a.name) {
                            why.extend(why_artifact(&a.name, old, new));
                        }
                    }
                }
            }
        }
        if let (Some(a), Some(b)) = (a, b) {
            if a.mode != b.mode {
                why.push(format!(
                    "mode {} -> {}",
                    a.mode.as_deref().unwrap_or("-"),
                    b.mode.as_deref().unwrap_or("-")
                ));
            }
            if a.target != b.target {
                why.push(format!(
                    "link target {} -> {}",
                    a.target.as_deref().unwrap_or("-"),
                    b.target.as_deref().unwrap_or("-")
                ));
            }
        }
        if why.is_empty() {
            why.push(if old.kiln_version != new.kiln_version {
                format!(
                    "kiln {} -> {} renders it differently",
                    old.kiln_version, new.kiln_version
                )
            } else {
                match kind {
                    ChangeKind::Added => "new in this layer".into(),
                    ChangeKind::Removed => "no longer in this layer".into(),
                    ChangeKind::Changed => "content changed".into(),
                }
            });
        }
        out.push(Change {
            path: p.to_string(),
            kind,
            why,
        });
    }
    out
}

/// Human text for a diff: one line per path, reasons after a colon.
pub fn render_diff(old: &Manifest, new: &Manifest, changes: &[Change]) -> String {
    let mut s = format!(
        "{} {} -> {} ({} {}/{}): {} change(s)\n",
        new.name,
        old.image_id,
        new.image_id,
        new.format,
        new.os,
        new.arch,
        changes.len()
    );
    for c in changes {
        let k = match c.kind {
            ChangeKind::Added => "added  ",
            ChangeKind::Removed => "removed",
            ChangeKind::Changed => "changed",
        };
        s.push_str(&format!("{k} /{}: {}\n", c.path, c.why.join("; ")));
    }
    s
}
