//! `kiln bake`: turns verified artifacts and an image definition into the exact bytes that go
//! onto a node. [`Layer::assemble`] builds an in-memory layer (paths, modes, hashes, and
//! where each file came from); one writer per format turns it into a sysext image, a rootfs
//! overlay `.tar.zst` or a Windows `.zip`, each with an SPDX SBOM and a kiln manifest.

pub mod assemble;
pub mod chunk_cache;
pub mod compare;
pub mod containerd;
pub mod ddi;
pub mod error;
pub mod extract;
pub mod gpg;
pub mod images;
pub mod layer;
pub mod manifest;
pub mod options;
pub mod os_files;
pub mod precompress;
pub mod prepare;
pub mod progress;
pub mod provenance;
pub mod render;
pub mod rootfs;
pub mod sbom;
pub mod squashfs;
pub mod sums;
pub mod sysext;
pub mod target;
pub mod units;
pub mod windows;

use crate::image_def::{Arch, Format, ImageDef, Os};
use crate::supply::inspect::InspectError;
use std::path::{Path, PathBuf};

pub(crate) use error::io_err;
pub use error::BakeError;
pub use layer::{write_atomic, write_atomic_with};
pub use layer::{
    ArtifactInput, ArtifactRecord, BakeRequest, Data, Entry, Gate, ImageRecord, InputKind, Layer,
    MemberMap, Node, Origin, DEFAULT_EPOCH, INSTALL_MANIFEST,
};
pub use options::WriteOptions;

pub use extract::ArchiveKind;

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

/// The writer of a format.
pub fn target_of(format: Format) -> &'static dyn target::Target {
    match format {
        Format::Sysext => &sysext::Sysext,
        Format::Rootfs => &rootfs::Rootfs,
        Format::Windows => &windows::Windows,
    }
}

/// Bakes one layer into `out_dir`: the format's main output, `<base>.spdx.json`, and
/// `<base>.manifest.json`, plus `SHA256SUMS` for sysext and rootfs (and the sysupdate
/// transfer file for sysext). Reports nothing; [`bake_with`] reports its phases.
pub fn bake(
    req: &BakeRequest<'_>,
    out_dir: &Path,
    opts: &WriteOptions,
) -> Result<BakeOutput, BakeError> {
    bake_with(req, out_dir, opts, &progress::Silent)
}

/// [`bake`], reporting its [phases](progress::Phase) to `progress` as they start, advance
/// and finish. The bytes written do not depend on the reporter.
pub fn bake_with(
    req: &BakeRequest<'_>,
    out_dir: &Path,
    opts: &WriteOptions,
    progress: &dyn progress::Reporter,
) -> Result<BakeOutput, BakeError> {
    std::fs::create_dir_all(out_dir).map_err(io_err(out_dir))?;
    // Big files are compressed while others are still extracted (precompress.rs): into the
    // bake cache, or without one into a scratch chunk cache in the work directory.
    let scratch = req.work.join("chunks");
    let chunk_root = req.cache.unwrap_or(&scratch);
    let chunks = match req.cache {
        Some(c) => chunk_cache::ChunkCache::new(c),
        None => chunk_cache::ChunkCache::scratch(&scratch),
    };
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n as usize,
    };
    let target = target_of(req.format);
    let (layer, compress) = precompress::alongside(target, req.def, &chunks, threads, |ready| {
        let layer = Layer::assemble_ready(req, progress, ready)?;
        // The compress phase starts before the wait for the pieces still being compressed
        // ahead of the write (most of a sysext's compression), so their time is reported as
        // compressing.
        let total = progress::file_bytes(&layer);
        Ok::<_, BakeError>((
            layer,
            progress::Tracker::start(progress, progress::Phase::Compress, total),
        ))
    })?;
    let base = layer.base_name();
    let mut files = Vec::new();
    // The SBOM is rendered beside the format writer.
    let (main, sbom) = std::thread::scope(|s| {
        let sbom = s.spawn(|| sbom::spdx_json(&layer));
        let cx = target::TargetContext {
            def: req.def,
            out_dir,
            work: req.work,
            cache: Some(chunk_root),
            scratch_cache: req.cache.is_none(),
            opts,
            progress,
            compress: &compress,
        };
        let main = target_of(req.format).write(&layer, &cx);
        (main, sbom.join().expect("sbom thread panicked"))
    });
    let main = main?;
    // The SBOM could not be rendered: take back the image just written, so no image is
    // published without its SBOM.
    let sbom = match sbom {
        Ok(s) => s,
        Err(e) => {
            for f in &main {
                let _ = std::fs::remove_file(f);
            }
            return Err(e);
        }
    };
    files.extend(main);
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

pub use crate::layer_contract::epoch_from_env;

/// The lock entries a definition places, for one arch, with their blobs from `store`.
/// A missing entry or a blob absent from the store is an error naming it.
pub fn inputs_from_lock(
    lock: &crate::supply::lock::Lock,
    store: &crate::supply::store::Store,
    def: &ImageDef,
    arch: Arch,
) -> Result<Vec<ArtifactInput>, BakeError> {
    check_skew(lock, def, arch)?;
    let mut out = Vec::new();
    for p in &def.artifacts {
        if p.optional && lock.find(&p.name, def.os, arch).is_none() {
            continue;
        }
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

/// The version-skew rule ([`crate::supply::skew`]) for what `def` places from `lock` on
/// `arch`: `Err` when the lock's containerd cannot serve its kubelet, `Ok(Some)` for a
/// pairing kubelet's next minor will refuse. A definition that does not place both has
/// nothing to check.
pub fn check_skew(
    lock: &crate::supply::lock::Lock,
    def: &ImageDef,
    arch: Arch,
) -> Result<Option<crate::supply::skew::SkewWarning>, BakeError> {
    let places = |n: &str| def.artifacts.iter().any(|p| p.name == n);
    if !(places("kubelet") && places("containerd")) {
        return Ok(None);
    }
    crate::supply::skew::check(lock, def.os, arch).map_err(|source| BakeError::Skew {
        image: def.name.clone(),
        source,
    })
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
    use crate::bake::layer::{civil, valid_rel};

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
