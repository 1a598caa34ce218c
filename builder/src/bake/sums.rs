//! `SHA256SUMS` beside the published images, and its detached signature.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::bake::error::BakeError;
use crate::bake::gpg;
use crate::bake::layer::write_atomic;

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
