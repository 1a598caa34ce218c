//! One output format of a bake: the [`Target`] trait, implemented once per format in its own
//! file (`sysext.rs`, `rootfs.rs`, `windows.rs`). A target knows the files it writes (so
//! `kiln plan` names them without baking) and writes them from an assembled layer. A target
//! that compresses big files in independent pieces can also compress those pieces while the
//! layer is still being assembled ([`crate::bake::precompress`]).

use std::path::{Path, PathBuf};

use crate::bake::chunk_cache::ChunkCache;
use crate::bake::error::BakeError;
use crate::bake::layer::Layer;
use crate::bake::options::WriteOptions;
use crate::bake::progress::{Reporter, Tracker};
use crate::image_def::{Arch, ImageDef};

/// What a target's writer may use besides the layer.
pub struct TargetContext<'a> {
    /// The image definition.
    pub def: &'a ImageDef,
    /// The output directory.
    pub out_dir: &'a Path,
    /// A scratch directory inside it.
    pub work: &'a Path,
    /// Where the chunk cache lives: the bake cache, or with `--no-cache` a scratch one in
    /// `work`. `None` compresses everything.
    pub cache: Option<&'a Path>,
    /// `cache` is the bake's scratch chunk cache (`ChunkCache::scratch`).
    pub scratch_cache: bool,
    /// How to write (threads, signer, mksquashfs).
    pub opts: &'a WriteOptions,
    /// Where the `checksum` phase is reported.
    pub progress: &'a dyn Reporter,
    /// The `compress` phase, started by the bake before it waits for the pieces compressed
    /// ahead of the write, so that their time counts as compressing: the writer adds the
    /// file bytes it writes and ends it ([`Tracker::done`]).
    pub compress: &'a Tracker<'a>,
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

    /// How many pieces of a layer file of `size` bytes [`write`](Self::write) compresses on
    /// their own and looks up in the chunk cache: the work [`precompress`](Self::precompress)
    /// can do before the layer is complete. 0 (the default) for a format that has none.
    fn pieces(&self, _def: &ImageDef, _size: u64) -> u64 {
        0
    }

    /// Compresses piece `piece` of `file` into `cache` exactly as `write` would (the same key,
    /// the same bytes), unless the cache holds it already.
    fn precompress(
        &self,
        _def: &ImageDef,
        _file: &ReadyFile,
        _piece: u64,
        _cache: &ChunkCache,
    ) -> Result<(), BakeError> {
        Ok(())
    }

    /// Called once every piece of `file` went through `precompress`: a format whose writer
    /// checks a file's content before it keeps its pieces (sysext) checks it here, and takes
    /// the pieces back out of `cache` when the file no longer matches its sha256.
    fn precompressed(&self, _def: &ImageDef, _file: &ReadyFile, _cache: &ChunkCache) {}
}

/// A layer file whose content is final: extracted or verified, hashed and gated.
#[derive(Debug, Clone)]
pub struct ReadyFile {
    /// Where its bytes are.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex sha256 (the chunk cache's key for its pieces).
    pub sha256: String,
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
    // Written by `kiln bake` beside the layer (bake::provenance), every bake.
    out.push(format!("{base}.provenance.json"));
    out
}
