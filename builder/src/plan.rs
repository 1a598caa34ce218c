//! `kiln plan`: what a bake of an image definition needs and would write, for each format and
//! architecture, before any blob is read: every artifact the definition places, whether the
//! lock pins it for that OS and architecture, whether the store holds its bytes, the
//! kiln-firstboot binary, and the output files.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::bake::target::all_outputs;
use crate::bake::target_of;
use crate::image_def::{Arch, Format, ImageDef};
use crate::supply::lock::Lock;
use crate::supply::store::Store;

/// One artifact a bake needs.
#[derive(Debug, Clone, Serialize)]
pub struct Need {
    /// The artifact's name (`kubelet`, `crictl`, …).
    pub name: String,
    /// The lock's pin for this OS and architecture, if it has one.
    pub pin: Option<Pin>,
    /// Whether the store holds the pinned bytes (`false` without a pin or a store).
    pub in_store: bool,
    /// Why the definition lets the bake leave it out when the lock does not pin it
    /// (`optional = true`); `None` for a required artifact.
    pub optional: Option<String>,
}

impl Need {
    /// Whether the bake would leave this artifact out: optional and not pinned.
    pub fn left_out(&self) -> bool {
        self.pin.is_none() && self.optional.is_some()
    }
}

/// A lock entry, as much of it as a plan shows.
#[derive(Debug, Clone, Serialize)]
pub struct Pin {
    /// Pinned version.
    pub version: String,
    /// Pinned sha256.
    pub sha256: String,
    /// Size in bytes: the lock's recorded size, else the stored blob's, else `None`.
    pub bytes: Option<u64>,
}

/// One format and architecture of the definition.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// `sysext`, `rootfs` or `windows`.
    pub format: String,
    /// `amd64` or `arm64`.
    pub arch: String,
    /// What the definition places, in its order.
    pub artifacts: Vec<Need>,
    /// The kiln-firstboot binary the bake would ship, and whether it exists.
    pub firstboot: PathBuf,
    /// Whether `firstboot` is a file.
    pub firstboot_exists: bool,
    /// The files the bake writes into its output directory.
    pub outputs: Vec<String>,
    /// The bytes of the inputs the bake reads (compressed upstream archives and binaries),
    /// where the lock or the store knows them; the layer is of the same order.
    pub input_bytes: u64,
    /// Why the bake would refuse the lock's versions here (`supply::skew`), if it would.
    pub refused: Option<String>,
    /// A version pairing that bakes today and that kubelet's next minor refuses.
    pub warning: Option<String>,
}

impl Target {
    /// Whether the lock pins every artifact this target needs (an optional one it does
    /// not pin is left out, not needed) in versions that can run together.
    pub fn covered(&self) -> bool {
        self.refused.is_none()
            && self
                .artifacts
                .iter()
                .all(|n| n.pin.is_some() || n.left_out())
    }

    /// Whether a bake could run now: covered, every pinned blob stored, kiln-firstboot there.
    pub fn ready(&self) -> bool {
        self.covered()
            && self.artifacts.iter().all(|n| n.in_store || n.left_out())
            && self.firstboot_exists
    }
}

/// The files a bake of `def` as `format` for `arch` writes (each target's own names).
pub fn output_names(def: &ImageDef, format: Format, arch: Arch) -> Vec<String> {
    all_outputs(target_of(format), def, arch)
}

/// Plans every (format, arch) pair asked for: `formats`/`arches` empty means all of the
/// definition's. `firstboot` gives the binary for a target (the bake's default or the
/// user's).
pub fn plan(
    def: &ImageDef,
    lock: &Lock,
    store: Option<&Store>,
    formats: &[Format],
    arches: &[Arch],
    firstboot: &dyn Fn(Arch) -> PathBuf,
) -> Vec<Target> {
    let formats = if formats.is_empty() {
        &def.formats[..]
    } else {
        formats
    };
    let arches = if arches.is_empty() {
        &def.arch[..]
    } else {
        arches
    };
    let mut out = Vec::new();
    for &format in formats {
        for &arch in arches {
            let artifacts: Vec<Need> = def
                .artifacts
                .iter()
                .map(|p| {
                    let art = lock.find(&p.name, def.os, arch);
                    let blob = art.and_then(|a| store.and_then(|s| s.lookup(a)));
                    Need {
                        name: p.name.clone(),
                        pin: art.map(|a| Pin {
                            version: a.version.clone(),
                            sha256: a.sha256.clone(),
                            bytes: (a.size > 0)
                                .then_some(a.size)
                                .or_else(|| blob_size(blob.as_deref())),
                        }),
                        in_store: blob.is_some(),
                        optional: p.optional.then(|| p.reason.clone().unwrap_or_default()),
                    }
                })
                .collect();
            let (refused, warning) = match crate::bake::check_skew(lock, def, arch) {
                Ok(w) => (None, w.map(|w| w.to_string())),
                Err(e) => (Some(e.to_string()), None),
            };
            let fb = firstboot(arch);
            let input_bytes = artifacts
                .iter()
                .filter_map(|n| n.pin.as_ref().and_then(|p| p.bytes))
                .sum::<u64>()
                + blob_size(Some(&fb)).unwrap_or(0);
            out.push(Target {
                format: format.to_string(),
                arch: arch.to_string(),
                artifacts,
                firstboot_exists: fb.is_file(),
                firstboot: fb,
                outputs: output_names(def, format, arch),
                input_bytes,
                refused,
                warning,
            });
        }
    }
    out
}

fn blob_size(p: Option<&Path>) -> Option<u64> {
    p.and_then(|p| std::fs::metadata(p).ok()).map(|m| m.len())
}
