//! `SHA256SUMS` beside the published images, and its detached signature.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::bake::error::BakeError;
use crate::bake::gpg;
use crate::bake::layer::write_atomic;
use crate::layer_contract::sums::{self, MAX_SUMS_BYTES, SUMS_NAME};

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
    let sums = out_dir.join(SUMS_NAME);
    // The other images already listed stay listed; a file that is not a SHA256SUMS is
    // refused rather than silently rewritten without the lines kiln could not read.
    let mut lines: BTreeMap<String, String> =
        match crate::bounded_read::read_text(&sums, MAX_SUMS_BYTES) {
            Ok(old) => sums::parse(&old).map_err(|bad| BakeError::Io {
                path: sums.clone(),
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "line {}: expected `sha256  name`, found {:?}; move the file away to start a new one",
                        bad.line, bad.found
                    ),
                ),
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => {
                return Err(BakeError::Io {
                    path: sums,
                    source,
                })
            }
        };
    lines.insert(name.to_string(), sha256.to_string());
    write_atomic(&sums, sums::render(&lines).as_bytes())?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_images_stay_listed_and_a_file_that_is_no_sums_is_refused_not_rewritten() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        publish_sums(d.path(), "one.raw", &a, None).unwrap();
        publish_sums(d.path(), "two.raw", &b, None).unwrap();
        let text = std::fs::read_to_string(d.path().join("SHA256SUMS")).unwrap();
        assert_eq!(text, format!("{a}  one.raw\n{b}  two.raw\n"));
        // A line kiln cannot read: refused, naming the file and the line; the file is kept.
        let odd = format!("{a}  one.raw\nsomething else\n");
        std::fs::write(d.path().join("SHA256SUMS"), &odd).unwrap();
        let e = publish_sums(d.path(), "three.raw", &b, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("SHA256SUMS") && e.contains("line 2"), "{e}");
        let kept = std::fs::read_to_string(d.path().join("SHA256SUMS")).unwrap();
        assert_eq!(kept, odd);
    }
}
