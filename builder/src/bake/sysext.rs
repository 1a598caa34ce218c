//! The Flatcar output: a systemd-sysext squashfs image holding only `/usr`, its
//! systemd-sysupdate transfer file and a `SHA256SUMS`.
//!
//! zstd and gzip images are written by kiln's own squashfs writer ([`super::squashfs`]),
//! straight from the layer, with compressed blocks kept in the bake cache. xz images are still
//! packed by Debian's `mksquashfs` from a staging tree that holds only kiln's small rendered
//! files: large files are fed in through pseudo-file definitions (`path f mode 0 0 cat SRC`),
//! and every owner, time and mode is pinned on the command line. docs/bake.md explains why.

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::atomic_file::AtomicFile;
use crate::bake::chunk_cache::ChunkCache;
use crate::bake::error::{io_err, BakeError};
use crate::bake::layer::{write_atomic, Data, Layer, Node};
use crate::bake::options::WriteOptions;
use crate::bake::progress::{checksum, file_bytes};
use crate::bake::render;
use crate::bake::squashfs::{self, Codec};
use crate::bake::target::{ReadyFile, Target, TargetContext};
use crate::image_def::{Arch, Compression, ImageDef};

/// Memory cap passed to `mksquashfs -mem`.
pub const MKSQUASHFS_MEM: &str = "192M";

/// Single-quotes `s` for `/bin/sh`.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Stages `layer` under `root` and returns the pseudo-file definitions for the large files.
fn stage(layer: &Layer, root: &Path) -> Result<String, BakeError> {
    if root.exists() {
        std::fs::remove_dir_all(root).map_err(io_err(root))?;
    }
    std::fs::create_dir_all(root).map_err(io_err(root))?;
    let set_mode = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(io_err(p))
    };
    set_mode(root, 0o755)?;
    let mut pseudo = String::new();
    for (path, e) in &layer.entries {
        if !(path == "usr" || path.starts_with("usr/")) {
            return Err(only_usr(path, e));
        }
        let dst = root.join(path);
        match &e.node {
            Node::Dir => {
                std::fs::create_dir(&dst).map_err(io_err(&dst))?;
                set_mode(&dst, 0o755)?;
            }
            Node::File {
                data: Data::Inline(b),
                mode,
                ..
            } => {
                std::fs::write(&dst, b).map_err(io_err(&dst))?;
                set_mode(&dst, *mode)?;
            }
            Node::File {
                data: Data::File(src),
                mode,
                ..
            } => {
                let src = std::path::absolute(src).map_err(io_err(src))?;
                let _ = writeln!(
                    pseudo,
                    "{path} f {mode:o} 0 0 cat {}",
                    sh_quote(&src.to_string_lossy())
                );
            }
            Node::Symlink(t) => {
                std::os::unix::fs::symlink(t, &dst).map_err(io_err(&dst))?;
            }
        }
    }
    Ok(pseudo)
}

/// The codec of kiln's own squashfs writer for `def`; `None` for xz, which `mksquashfs`
/// packs.
fn kiln_codec(def: &ImageDef) -> Option<Codec> {
    match def
        .sysext
        .as_ref()
        .map(|s| s.compression)
        .unwrap_or_default()
    {
        Compression::Zstd => Some(Codec::zstd(squashfs::ZSTD_DEFAULT_LEVEL)),
        Compression::Gzip => Some(Codec::gzip(squashfs::GZIP_DEFAULT_LEVEL)),
        Compression::Xz => None,
    }
}

/// Packs `layer` into a squashfs image at `out`, atomically: kiln's writer for zstd and
/// gzip, `mksquashfs` for xz. `cache` is the bake cache (compressed blocks) and whether it is
/// the bake's scratch one. `on_data` hears bytes of file data as they are packed (from
/// `mksquashfs`, all of them at the end).
pub fn pack(
    layer: &Layer,
    def: &ImageDef,
    out: &Path,
    work: &Path,
    cache: Option<(&Path, bool)>,
    opts: &WriteOptions,
    on_data: &dyn Fn(u64),
) -> Result<(), BakeError> {
    let Some(codec) = kiln_codec(def) else {
        pack_mksquashfs(layer, def, out, work, opts)?;
        on_data(file_bytes(layer));
        return Ok(());
    };
    let mut tmp = AtomicFile::create(out, ".kiln-", ".raw.tmp")?;
    pack_into(layer, out, tmp.file_mut(), codec, cache, opts, on_data)?;
    tmp.commit(crate::bake::layer::OUTPUT_MODE)?;
    Ok(())
}

/// Writes `layer` as a squashfs with kiln's own writer into `file` from its current position
/// (`path` names it in errors): only `/usr`, as a sysext may hold.
fn pack_into(
    layer: &Layer,
    path: &Path,
    file: &mut std::fs::File,
    codec: Codec,
    cache: Option<(&Path, bool)>,
    opts: &WriteOptions,
    on_data: &dyn Fn(u64),
) -> Result<(), BakeError> {
    if let Some((p, e)) = layer
        .entries
        .iter()
        .find(|(p, _)| !(p.as_str() == "usr" || p.starts_with("usr/")))
    {
        return Err(only_usr(p, e));
    }
    let summary = squashfs::write_image(
        layer.entries.iter().map(|(p, e)| (p.as_str(), &e.node)),
        layer.epoch,
        file,
        path,
        &squashfs::Options {
            codec,
            threads: opts.threads as usize,
            cache: cache.map(|(p, _)| p.to_path_buf()),
            scratch_cache: cache.is_some_and(|(_, scratch)| scratch),
        },
        on_data,
    )?;
    tracing::debug!(
        image = %path.display(),
        inodes = summary.inodes,
        bytes = summary.bytes_used,
        cached_files = summary.cache_hits,
        compressed_blocks = summary.compressed_blocks,
        "sysext image written"
    );
    Ok(())
}

fn only_usr(path: &str, e: &crate::bake::layer::Entry) -> BakeError {
    BakeError::Conflict {
        path: path.to_string(),
        first: "the sysext rule (only /usr)".into(),
        second: crate::bake::layer::describe(&e.origin),
    }
}

/// Packs `layer` with `mksquashfs` (xz images), atomically.
fn pack_mksquashfs(
    layer: &Layer,
    def: &ImageDef,
    out: &Path,
    work: &Path,
    opts: &WriteOptions,
) -> Result<(), BakeError> {
    let root = work.join("sysext-root");
    let pseudo = stage(layer, &root)?;
    let pf = work.join("sysext.pseudo");
    std::fs::write(&pf, pseudo).map_err(io_err(&pf))?;
    let comp = def
        .sysext
        .as_ref()
        .map(|s| s.compression)
        .unwrap_or_default();
    let tmp = AtomicFile::create(out, ".kiln-", ".raw.tmp")?;
    let epoch = layer.epoch.to_string();
    let mut cmd = Command::new(&opts.mksquashfs);
    // mksquashfs refuses SOURCE_DATE_EPOCH next to -mkfs-time/-all-time; kiln has already
    // read it into `epoch`.
    cmd.env_remove("SOURCE_DATE_EPOCH")
        .arg(&root)
        .arg(tmp.temp_path())
        .args([
            "-noappend",
            "-quiet",
            "-no-progress",
            "-no-xattrs",
            "-all-root",
        ])
        .args(["-mkfs-time", &epoch, "-all-time", &epoch])
        .args(["-comp", comp.mksquashfs_name(), "-b", "131072"])
        // mksquashfs sizes its caches from the machine's RAM (a quarter of it); a fixed cap
        // keeps a bake's peak memory bounded and does not change the image bytes.
        .args(["-mem", MKSQUASHFS_MEM])
        .arg("-pf")
        .arg(&pf);
    if opts.threads > 0 {
        cmd.args(["-processors", &opts.threads.to_string()]);
    }
    let res = cmd.output().map_err(|e| BakeError::Tool {
        tool: opts.mksquashfs.display().to_string(),
        detail: format!("could not run it: {e} (install squashfs-tools: make deps)"),
    })?;
    if !res.status.success() {
        return Err(BakeError::Tool {
            tool: opts.mksquashfs.display().to_string(),
            detail: format!(
                "{} packing {}: {}",
                res.status,
                out.display(),
                String::from_utf8_lossy(&res.stderr).trim()
            ),
        });
    }
    tmp.commit(crate::bake::layer::OUTPUT_MODE)?;
    std::fs::remove_dir_all(&root).map_err(io_err(&root))?;
    Ok(())
}

/// Writes the image, the transfer file and `SHA256SUMS` into the output directory, ending
/// the `compress` phase and reporting the `checksum` phase.
pub fn write(layer: &Layer, cx: &TargetContext<'_>) -> Result<Vec<PathBuf>, BakeError> {
    let (def, out_dir, opts, compress) = (cx.def, cx.out_dir, cx.opts, cx.compress);
    let cache = cx.cache.map(|p| (p, cx.scratch_cache));
    let sx = def.sysext.as_ref().ok_or_else(|| BakeError::Format {
        image: def.name.clone(),
        format: crate::image_def::Format::Sysext,
        allowed: def.formats.clone(),
    })?;
    let name = render::sysext_file_name(def, layer.arch).unwrap_or_default();
    let raw = out_dir.join(&name);
    let mut outputs = Vec::new();
    match &opts.ddi {
        None => pack(layer, def, &raw, cx.work, cache, opts, &|n| compress.add(n))?,
        Some(d) => {
            // kiln's squashfs is written straight into the disk image, 1 MiB in; an xz image
            // (mksquashfs) is packed apart and copied in.
            let seed = ddi_seed(def, layer.arch);
            let info = match kiln_codec(def) {
                Some(codec) => crate::bake::ddi::write_signed_ddi_with(
                    &raw,
                    layer.arch,
                    seed,
                    &d.key,
                    &d.cert_der,
                    |file| pack_into(layer, &raw, file, codec, cache, opts, &|n| compress.add(n)),
                )?,
                None => {
                    let fs = cx.work.join(format!("{name}.squashfs"));
                    pack(layer, def, &fs, cx.work, cache, opts, &|n| compress.add(n))?;
                    let info = crate::bake::ddi::write_signed_ddi(
                        &fs,
                        &raw,
                        layer.arch,
                        seed,
                        &d.key,
                        &d.cert_der,
                    )?;
                    std::fs::remove_file(&fs).map_err(io_err(&fs))?;
                    info
                }
            };
            let crt = out_dir.join(format!("{}.verity.crt", sx.name));
            write_atomic(&crt, info.certificate_pem.as_bytes())?;
            outputs.push(crt);
        }
    }
    compress.done();
    let sha = checksum(cx.progress, &raw)?;
    let conf = out_dir.join(format!("{}.conf", sx.name));
    write_atomic(
        &conf,
        render::sysupdate_transfer(def, layer.arch, opts.sign.is_some())
            .unwrap_or_default()
            .as_bytes(),
    )?;
    let (sums, sig) = crate::bake::sums::publish_sums(out_dir, &name, &sha, opts.sign.as_ref())?;
    Ok([raw, conf, sums]
        .into_iter()
        .chain(sig)
        .chain(outputs)
        .collect())
}

/// The seed of a signed DDI's disk and partition UUIDs and verity salt (as repart's
/// `--seed`): from the image's name, Kubernetes version and architecture, so a rebuild of the
/// same image gets the same bytes and another image other UUIDs.
fn ddi_seed(def: &ImageDef, arch: Arch) -> [u8; 16] {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(format!(
        "kiln sysext ddi\n{}\n{}\n{arch}",
        def.name, def.kubernetes.version
    ));
    let mut seed = [0u8; 16];
    seed.copy_from_slice(&d[..16]);
    seed
}

/// The sysext format: the `.raw` image, the sysupdate transfer file and `SHA256SUMS`.
#[derive(Debug)]
pub struct Sysext;

impl Target for Sysext {
    fn pieces(&self, def: &ImageDef, size: u64) -> u64 {
        kiln_codec(def).map_or(0, |_| squashfs::pieces(size))
    }

    fn precompress(
        &self,
        def: &ImageDef,
        file: &ReadyFile,
        piece: u64,
        cache: &ChunkCache,
    ) -> Result<(), BakeError> {
        let Some(codec) = kiln_codec(def) else {
            return Ok(());
        };
        squashfs::precompress(&codec, cache, &file.path, file.size, &file.sha256, piece)
            .map_err(io_err(&file.path))
    }

    /// The writer fills cache entries only from a file it hashed whole; entries made ahead of
    /// it keep that rule: the file is hashed again once all its groups are in, and a file
    /// that changed since it was verified gets its entries removed (the write then reads it
    /// and fails, naming it).
    fn precompressed(&self, def: &ImageDef, file: &ReadyFile, cache: &ChunkCache) {
        let Some(codec) = kiln_codec(def) else {
            return;
        };
        let same = crate::digest::hash_file(&file.path, crate::digest::Sums::Sha256)
            .is_ok_and(|d| d.size == file.size && d.sha256 == file.sha256);
        if !same {
            tracing::warn!(file = %file.path.display(), "changed while it was compressed ahead of the write; its cached blocks are removed");
            squashfs::forget(&codec, cache, file.size, &file.sha256);
        }
    }

    fn outputs(&self, def: &ImageDef, arch: Arch) -> Vec<String> {
        let mut out: Vec<String> = render::sysext_file_name(def, arch).into_iter().collect();
        if let Some(sx) = &def.sysext {
            out.push(format!("{}.conf", sx.name));
        }
        out.push("SHA256SUMS".into());
        out
    }

    fn write(&self, layer: &Layer, cx: &TargetContext<'_>) -> Result<Vec<PathBuf>, BakeError> {
        write(layer, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_the_shell() {
        for s in ["/a/b", "/a b/c", "/it's/here", "/$HOME/`x`"] {
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", sh_quote(s)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), s);
        }
    }
}
