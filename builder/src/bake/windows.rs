//! The Windows layer: the `C:\k` layout as a `.zip` (`k\kubelet.exe`, `k\kiln\image.env`, …).
//! Entries sorted, one timestamp (zip's DOS time, so at least 1980), deflate level 6.

use std::path::{Path, PathBuf};

use zip::write::SimpleFileOptions;

use crate::bake::error::BakeError;
use crate::bake::layer::{civil, Layer, Node};
use crate::bake::target::{base_name, Target, TargetContext};
use crate::image_def::{Arch, ImageDef};

/// Writes `layer` as a zip at `out`, atomically.
pub fn write(layer: &Layer, out: &Path) -> Result<(), BakeError> {
    write_with(layer, out, &|_| {})
}

/// [`write()`], calling `on_data` with each file's size once it is in the zip.
pub fn write_with(layer: &Layer, out: &Path, on_data: &dyn Fn(u64)) -> Result<(), BakeError> {
    // DOS time cannot express dates before 1980.
    let (y, mo, d, h, mi, s) = civil(layer.epoch.max(315_532_800));
    let time =
        zip::DateTime::from_date_and_time(y as u16, mo as u8, d as u8, h as u8, mi as u8, s as u8)
            .map_err(|e| BakeError::Tool {
                tool: "zip".into(),
                detail: format!("SOURCE_DATE_EPOCH {} is not a zip time: {e}", layer.epoch),
            })?;
    let base = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .compression_level(Some(6))
        .last_modified_time(time);
    let mut inner: Option<BakeError> = None;
    crate::bake::layer::write_atomic_with(out, |f| {
        let zerr = |e: zip::result::ZipError| std::io::Error::other(e.to_string());
        let mut z = zip::ZipWriter::new(f);
        for (path, e) in &layer.entries {
            match &e.node {
                Node::Dir => z
                    .add_directory(format!("{path}/"), base.unix_permissions(0o755))
                    .map_err(zerr)?,
                Node::File {
                    data, mode, size, ..
                } => {
                    let opts = base
                        .unix_permissions(*mode)
                        .large_file(*size >= u32::MAX as u64);
                    z.start_file(path.as_str(), opts).map_err(zerr)?;
                    let mut r = match data.open() {
                        Ok(r) => r,
                        Err(e) => {
                            let msg = e.to_string();
                            inner = Some(e);
                            return Err(std::io::Error::other(msg));
                        }
                    };
                    std::io::copy(&mut r, &mut z)?;
                    on_data(*size);
                }
                Node::Symlink(t) => z
                    .add_symlink(path.as_str(), t.as_str(), base)
                    .map_err(zerr)?,
            }
        }
        z.finish().map_err(zerr)?;
        Ok(())
    })
    .map_err(|e| inner.take().unwrap_or(e))
}

/// The Windows format: the `C:\\k` layout as a `.zip`.
#[derive(Debug)]
pub struct Windows;

impl Target for Windows {
    fn outputs(&self, def: &ImageDef, arch: Arch) -> Vec<String> {
        vec![format!("{}.zip", base_name(def, arch))]
    }

    fn write(&self, layer: &Layer, cx: &TargetContext<'_>) -> Result<Vec<PathBuf>, BakeError> {
        let p = cx.out_dir.join(format!("{}.zip", layer.base_name()));
        write_with(layer, &p, &|n| cx.compress.add(n))?;
        cx.compress.done();
        Ok(vec![p])
    }
}
