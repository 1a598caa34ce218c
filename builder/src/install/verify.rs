//! What `kiln install` knows about the layer before it touches the root: its sha256 against
//! the `SHA256SUMS` that `kiln bake` writes beside it, and that file's minisign signature
//! (`SHA256SUMS.minisig`) when a trusted key is given.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::supply::sign::{self, Trust, TrustedKey};

pub use crate::layer_contract::sums::SUMS_NAME;
use crate::layer_contract::sums::{self as sums_codec, MAX_SUMS_BYTES};

/// How much a layer must prove before it is installed.
#[derive(Debug, Clone)]
pub enum LayerTrust {
    /// The layer's sha256 must be listed in `sums` (default: `SHA256SUMS` beside the layer).
    Sums {
        /// The checksum file, if not the one beside the layer.
        sums: Option<PathBuf>,
    },
    /// As `Sums`, and `SHA256SUMS.minisig` must be a valid signature by `key`.
    Signed {
        /// The checksum file, if not the one beside the layer.
        sums: Option<PathBuf>,
        /// The key the signature must verify with.
        key: TrustedKey,
    },
    /// No checksum file needed; one that exists is still checked.
    AllowUnverified {
        /// The checksum file, if not the one beside the layer.
        sums: Option<PathBuf>,
    },
}

/// What was proven about a layer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Verification {
    /// The layer's sha256 (always computed: the install passes compare against it).
    pub sha256: String,
    /// The checksum file that lists it, if one was used.
    pub sums: Option<PathBuf>,
    /// The name it is listed under there.
    pub listed_as: Option<String>,
    /// The key id of a verified signature over the checksum file.
    pub signed_by: Option<String>,
}

impl Verification {
    /// One line for people: what was checked.
    pub fn describe(&self, layer: &Path) -> String {
        match (&self.sums, &self.listed_as, &self.signed_by) {
            (Some(s), Some(n), Some(k)) => format!(
                "verified {}: sha256 {} is listed as {n} in {}, whose signature {}.minisig verifies with trusted key {k}",
                layer.display(),
                self.sha256,
                s.display(),
                s.display()
            ),
            (Some(s), Some(n), None) => format!(
                "verified {}: sha256 {} is listed as {n} in {} (unsigned: pass --trusted-key to check SHA256SUMS.minisig)",
                layer.display(),
                self.sha256,
                s.display()
            ),
            _ => format!(
                "UNVERIFIED {}: sha256 {}, no {SUMS_NAME} checked (--allow-unverified)",
                layer.display(),
                self.sha256
            ),
        }
    }
}

/// Why a layer could not be verified.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Reading the layer or the checksum file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// No checksum file, and unverified layers were not allowed.
    #[error("{layer} is unverified: {sums} does not exist (keep the SHA256SUMS kiln bake wrote beside the layer, name it with --sums, or pass --allow-unverified)")]
    NoSums {
        /// The layer.
        layer: PathBuf,
        /// Where the checksum file was looked for.
        sums: PathBuf,
    },
    /// The checksum file is malformed.
    #[error("{sums}: line {line}: expected `<64 hex digits>  <file name>`, found {found:?}")]
    BadSums {
        /// The checksum file.
        sums: PathBuf,
        /// The 1-based line.
        line: usize,
        /// The line.
        found: String,
    },
    /// The checksum file names the layer with another hash.
    #[error("{layer}: sha256 {found}, but {sums} lists {name} with sha256 {expected}: the layer is not the one kiln bake wrote (corrupt or altered)")]
    Mismatch {
        /// The layer.
        layer: PathBuf,
        /// The checksum file.
        sums: PathBuf,
        /// The name it is listed under.
        name: String,
        /// The listed hash.
        expected: String,
        /// The layer's hash.
        found: String,
    },
    /// The checksum file does not list the layer at all.
    #[error("{layer}: sha256 {found} is not listed in {sums} (it lists {listed}): not a layer this SHA256SUMS vouches for")]
    NotListed {
        /// The layer.
        layer: PathBuf,
        /// The checksum file.
        sums: PathBuf,
        /// The layer's hash.
        found: String,
        /// The names listed.
        listed: String,
    },
    /// `--trusted-key` asked for a signature over the checksum file and there is none.
    #[error("{sums} is not signed: {sig} does not exist (sign it with `minisign -Sm {sums}` and the key whose public half you pass, or install without --trusted-key to check {sums} alone)")]
    SumsUnsigned {
        /// The checksum file.
        sums: PathBuf,
        /// The signature file looked for.
        sig: PathBuf,
    },
    /// The signature over the checksum file is bad.
    #[error(transparent)]
    Signature(#[from] sign::SignError),
}

/// Parses `SHA256SUMS` text with the layer contract's codec
/// ([`crate::layer_contract::sums::parse`]); `path` names the file in errors.
pub fn parse_sums(text: &str, path: &Path) -> Result<BTreeMap<String, String>, VerifyError> {
    sums_codec::parse(text).map_err(|b| VerifyError::BadSums {
        sums: path.to_path_buf(),
        line: b.line,
        found: b.found,
    })
}

/// Hashes the layer and checks it under `trust`. Reads `layer` once from `file`.
pub fn verify_layer(
    file: &mut impl Read,
    layer: &Path,
    trust: &LayerTrust,
) -> Result<Verification, VerifyError> {
    let mut h = Sha256::new();
    io::copy(file, &mut h).map_err(|source| VerifyError::Io {
        path: layer.to_path_buf(),
        source,
    })?;
    let sha256 = hex::encode(h.finalize());
    let named = match trust {
        LayerTrust::Sums { sums }
        | LayerTrust::Signed { sums, .. }
        | LayerTrust::AllowUnverified { sums } => sums.clone(),
    };
    let sums_path =
        named.unwrap_or_else(|| layer.parent().unwrap_or(Path::new(".")).join(SUMS_NAME));
    let io_err = |source| VerifyError::Io {
        path: sums_path.clone(),
        source,
    };
    let bytes = match std::fs::File::open(&sums_path) {
        Ok(f) => {
            let mut b = Vec::new();
            f.take(MAX_SUMS_BYTES + 1)
                .read_to_end(&mut b)
                .map_err(io_err)?;
            if b.len() as u64 > MAX_SUMS_BYTES {
                return Err(io_err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "larger than 1 MiB, not a SHA256SUMS",
                )));
            }
            b
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return match trust {
                LayerTrust::AllowUnverified { .. } => Ok(Verification {
                    sha256,
                    sums: None,
                    listed_as: None,
                    signed_by: None,
                }),
                _ => Err(VerifyError::NoSums {
                    layer: layer.to_path_buf(),
                    sums: sums_path,
                }),
            };
        }
        Err(e) => return Err(io_err(e)),
    };
    // The signature covers exactly the bytes parsed below.
    let signed_by = match trust {
        LayerTrust::Signed { key, .. } => {
            // The lock's hint (`kiln lock sign`, --allow-unsigned) does not apply to a
            // checksum file: say what does.
            let checked = sign::verify_file_bytes(&sums_path, &bytes, &Trust::Key(key.clone()))
                .map_err(|e| match e {
                    sign::SignError::Missing { sig, .. } => VerifyError::SumsUnsigned {
                        sums: sums_path.clone(),
                        sig,
                    },
                    e => VerifyError::Signature(e),
                })?;
            match checked {
                sign::Verified::Signed { key_id, .. } => Some(key_id),
                sign::Verified::Unsigned => None,
            }
        }
        _ => None,
    };
    let text = String::from_utf8_lossy(&bytes);
    let sums = parse_sums(&text, &sums_path)?;
    let own = layer
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let listed_as = match sums.get(&own) {
        Some(want) if *want == sha256 => own,
        Some(want) => {
            return Err(VerifyError::Mismatch {
                layer: layer.to_path_buf(),
                sums: sums_path,
                name: own,
                expected: want.clone(),
                found: sha256,
            })
        }
        // A layer uploaded under another name (Packer's `/tmp/kiln-layer.tar.zst`) is found
        // by its hash.
        None => match sums.iter().find(|(_, h)| **h == sha256) {
            Some((name, _)) => name.clone(),
            None => {
                return Err(VerifyError::NotListed {
                    layer: layer.to_path_buf(),
                    sums: sums_path,
                    found: sha256,
                    listed: sums.keys().cloned().collect::<Vec<_>>().join(", "),
                })
            }
        },
    };
    Ok(Verification {
        sha256,
        sums: Some(sums_path),
        listed_as: Some(listed_as),
        signed_by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_lines_parse_or_name_the_line() {
        let a = "a".repeat(64);
        let t = format!("{a}  x.tar.zst\n\n{} *y.raw\n", "B".repeat(64));
        let m = parse_sums(&t, Path::new("S")).unwrap();
        assert_eq!(m["x.tar.zst"], a);
        assert_eq!(m["y.raw"], "b".repeat(64));
        for bad in ["zz  x", &format!("{a} x"), &format!("{a}  "), "é"] {
            let e = parse_sums(bad, Path::new("S")).unwrap_err().to_string();
            assert!(e.contains("S: line 1"), "{bad:?}: {e}");
        }
    }
}
