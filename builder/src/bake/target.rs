//! One output format of a bake: the [`Target`] trait, implemented once per format in its own
//! file (`sysext.rs`, `rootfs.rs`, `windows.rs`). A target knows the files it writes (so
//! `kiln plan` names them without baking) and writes them from an assembled layer.

use std::path::{Path, PathBuf};

use crate::bake::error::BakeError;
use crate::bake::layer::Layer;
use crate::bake::options::WriteOptions;
use crate::bake::progress::Reporter;
use crate::image_def::{Arch, ImageDef};

/// What a target's writer may use besides the layer.
pub struct TargetContext<'a> {
    /// The image definition.
    pub def: &'a ImageDef,
    /// The output directory.
    pub out_dir: &'a Path,
    /// A scratch directory inside it.
    pub work: &'a Path,
    /// The bake cache, if any.
    pub cache: Option<&'a Path>,
    /// How to write (threads, signer, mksquashfs).
    pub opts: &'a WriteOptions,
    /// Where the `compress` and `checksum` phases are reported.
    pub progress: &'a dyn Reporter,
}

impl std::fmt::Debug for TargetContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetContext")
            .field("def", &self.def.name)
            .field("out_dir", &self.out_dir)
            .field("work", &self.work)
            .field("cache", &self.cache)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// One output format of a bake.
pub trait Target: Sync {
    /// The files this format writes into the output directory for `def` and `arch`, besides
    /// the SBOM and the manifest every bake writes.
    fn outputs(&self, def: &ImageDef, arch: Arch) -> Vec<String>;

    /// Writes the format's files for `layer`; returns their paths, the main image first.
    fn write(&self, layer: &Layer, cx: &TargetContext<'_>) -> Result<Vec<PathBuf>, BakeError>;
}

/// `<name>-<kubernetes version>-<arch>`: the stem of the files every bake writes.
pub fn base_name(def: &ImageDef, arch: Arch) -> String {
    format!("{}-{}-{}", def.name, def.kubernetes.version, arch)
}

/// Every file a bake of `def` as `target` for `arch` writes: the target's own, then the SBOM
/// and the manifest.
pub fn all_outputs(target: &dyn Target, def: &ImageDef, arch: Arch) -> Vec<String> {
    let base = base_name(def, arch);
    let mut out = target.outputs(def, arch);
    out.push(format!("{base}.spdx.json"));
    out.push(format!("{base}.manifest.json"));
    out
}
