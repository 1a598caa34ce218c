//! minisign signatures for the lock: verify against a trusted key (the embedded release key by
//! default) and sign with a secret key (for lock authors).
//!
//! Verification uses `minisign-verify`; signing uses the `minisign` crate. Only prehashed
//! (`ED`) signatures are accepted, as produced by current minisign.

use std::path::{Path, PathBuf};

use base64::Engine as _;

use crate::exit::ExitClass;

/// The public key kiln trusts by default: the kiln release key (`builder/keys/kiln-release.pub`).
/// Its secret half never enters the repository; see `docs/lock-format.md`.
pub const DEFAULT_PUBLIC_KEY: &str = include_str!("../../keys/kiln-release.pub");

/// Why a signature could not be made or checked.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// No `.minisig` next to the signed file and unsigned input was not allowed.
    #[error("{file} is not signed: {sig} does not exist (sign it with `kiln lock sign`, or pass --allow-unsigned to accept an unsigned lock)")]
    Missing {
        /// The signed file.
        file: PathBuf,
        /// The signature file that was looked for.
        sig: PathBuf,
    },
    /// A file could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The public key text is not a minisign public key.
    #[error("trusted key {origin} is not a minisign public key: {reason}")]
    BadPublicKey {
        /// Where the key came from.
        origin: String,
        /// What is wrong.
        reason: String,
    },
    /// The signature file is not a minisign signature.
    #[error("signature {sig} is not a minisign signature: {reason}")]
    BadSignature {
        /// The signature file.
        sig: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The signature was made by a different key.
    #[error("signature {sig} was made by key {found}, but the trusted key is {expected} (pass --trusted-key with the signer's public key if you trust it{})", .nearby.as_ref().map(|p| format!("; key {found} is in {}", p.display())).unwrap_or_default())]
    WrongKey {
        /// The signature file.
        sig: PathBuf,
        /// The trusted key id.
        expected: String,
        /// The signing key id.
        found: String,
        /// A public key file with the signer's id near the signed file (its directory, or
        /// `keys/` there or one level up: where the fixture mirror keeps its key), named so
        /// the reader can decide to trust it; never trusted by kiln itself.
        nearby: Option<PathBuf>,
    },
    /// The bytes do not match the signature: the file or the signature was changed.
    #[error("{file} does not match its signature {sig} from key {key}: the file or its signature has been altered")]
    Invalid {
        /// The signed file.
        file: PathBuf,
        /// The signature file.
        sig: PathBuf,
        /// The key id.
        key: String,
    },
    /// The secret key could not be used.
    #[error("secret key {path}: {reason}")]
    SecretKey {
        /// The key file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

impl SignError {
    /// Every signature failure, even an unreadable file, refuses the input: exit 3.
    pub fn exit_class(&self) -> ExitClass {
        ExitClass::Verify
    }
}

/// A public key kiln trusts, with its key id for messages.
#[derive(Clone)]
pub struct TrustedKey {
    key: minisign_verify::PublicKey,
    id: String,
    origin: String,
}

impl std::fmt::Debug for TrustedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustedKey")
            .field("id", &self.id)
            .field("origin", &self.origin)
            .finish()
    }
}

impl TrustedKey {
    /// Parses a minisign public key: the two-line `.pub` file or the bare base64 line.
    /// `origin` names where it came from in messages.
    pub fn parse(text: &str, origin: &str) -> Result<TrustedKey, SignError> {
        let b64 = text
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty() && !l.starts_with("untrusted comment:"))
            .unwrap_or("");
        let bad = |reason: String| SignError::BadPublicKey {
            origin: origin.to_string(),
            reason,
        };
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| bad(format!("base64: {e}")))?;
        if raw.len() != 42 || &raw[..2] != b"Ed" {
            return Err(bad(format!(
                "expected 42 bytes starting with \"Ed\", found {} bytes",
                raw.len()
            )));
        }
        let key = minisign_verify::PublicKey::from_base64(b64).map_err(|e| bad(e.to_string()))?;
        Ok(TrustedKey {
            key,
            id: key_id_hex(&raw[2..10]),
            origin: origin.to_string(),
        })
    }

    /// The embedded kiln release key.
    pub fn release() -> TrustedKey {
        // The embedded key is checked by a unit test; a broken one is a build defect.
        TrustedKey::parse(DEFAULT_PUBLIC_KEY, "embedded kiln release key")
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Reads a public key file.
    pub fn from_file(path: &Path) -> Result<TrustedKey, SignError> {
        let text = crate::bounded_read::read_text(path, crate::bounded_read::MAX_KEY).map_err(
            |source| SignError::Io {
                action: "reading trusted key",
                path: path.to_path_buf(),
                source,
            },
        )?;
        TrustedKey::parse(&text, &path.display().to_string())
    }

    /// The key id as minisign prints it (16 uppercase hex digits).
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// minisign prints key ids as the little-endian u64 in uppercase hex.
/// A minisign public key file (`*.pub`) whose key id is `id`, in `file`'s directory, its
/// `keys/`, or `../keys/`; only small regular files are read.
fn public_key_near(file: &Path, id: &str) -> Option<PathBuf> {
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let up = match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => p.join("keys"),
        None => dir.join("../keys"),
    };
    let places = [dir.to_path_buf(), dir.join("keys"), up];
    places.iter().find_map(|d| {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(d)
            .ok()?
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "pub"))
            .collect();
        entries.sort();
        entries.into_iter().find(|p| {
            std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file() && m.len() <= 4096)
                && std::fs::read_to_string(p)
                    .ok()
                    .and_then(|t| TrustedKey::parse(&t, "").ok())
                    .is_some_and(|k| k.id == id)
        })
    })
}

fn key_id_hex(bytes: &[u8]) -> String {
    bytes.iter().rev().map(|b| format!("{b:02X}")).collect()
}

/// The path of the detached signature for a file: `<path>.minisig`.
pub fn signature_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".minisig");
    PathBuf::from(s)
}

/// What a lock must satisfy to be used.
#[derive(Debug, Clone)]
pub enum Trust {
    /// A valid signature by this key is required.
    Key(TrustedKey),
    /// A signature is checked if present (against the key), but its absence is accepted.
    /// A present but bad signature is still refused.
    AllowUnsigned(TrustedKey),
}

impl Trust {
    /// Require the embedded release key.
    pub fn release() -> Trust {
        Trust::Key(TrustedKey::release())
    }
}

/// The outcome of a successful check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// Signed by the trusted key.
    Signed {
        /// The key id.
        key_id: String,
        /// The signature's trusted comment.
        trusted_comment: String,
    },
    /// No signature, accepted because unsigned input was allowed.
    Unsigned,
}

/// Checks `bytes` (the content of `file`) against `<file>.minisig` under `trust`.
pub fn verify_file_bytes(file: &Path, bytes: &[u8], trust: &Trust) -> Result<Verified, SignError> {
    verify_file_bytes_as(file, file, bytes, trust)
}

/// [`verify_file_bytes`] for a file staged from elsewhere: read from `file` and
/// `<file>.minisig`, named `shown` and `<shown>.minisig` in errors (a lock pulled from a
/// registry is named by its `oci://` reference, not by a temp file deleted by then).
pub fn verify_file_bytes_as(
    file: &Path,
    shown: &Path,
    bytes: &[u8],
    trust: &Trust,
) -> Result<Verified, SignError> {
    let read_from = signature_path(file);
    let sig_path = signature_path(shown);
    let key = match trust {
        Trust::Key(k) | Trust::AllowUnsigned(k) => k,
    };
    let sig_text = match crate::bounded_read::read_text(&read_from, crate::bounded_read::MAX_KEY) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return match trust {
                Trust::AllowUnsigned(_) => Ok(Verified::Unsigned),
                Trust::Key(_) => Err(SignError::Missing {
                    file: shown.to_path_buf(),
                    sig: sig_path,
                }),
            }
        }
        Err(source) => {
            return Err(SignError::Io {
                action: "reading signature",
                path: sig_path,
                source,
            })
        }
    };
    verify(shown, bytes, &sig_path, &sig_text, key)
}

/// Checks `bytes` against the signature text `sig_text` with `key`; paths are for messages.
pub fn verify(
    file: &Path,
    bytes: &[u8],
    sig_path: &Path,
    sig_text: &str,
    key: &TrustedKey,
) -> Result<Verified, SignError> {
    let bad = |reason: String| SignError::BadSignature {
        sig: sig_path.to_path_buf(),
        reason,
    };
    let sig = minisign_verify::Signature::decode(sig_text).map_err(|e| bad(e.to_string()))?;
    let signer = signature_key_id(sig_text).ok_or_else(|| bad("no signature line".into()))?;
    if signer != key.id {
        return Err(SignError::WrongKey {
            sig: sig_path.to_path_buf(),
            expected: key.id.clone(),
            nearby: public_key_near(file, &signer),
            found: signer,
        });
    }
    match key.key.verify(bytes, &sig, false) {
        Ok(()) => Ok(Verified::Signed {
            key_id: key.id.clone(),
            trusted_comment: sig.trusted_comment().to_string(),
        }),
        Err(minisign_verify::Error::UnexpectedAlgorithm) => Err(bad(
            "legacy (non-prehashed) signature; re-sign with current minisign or `kiln lock sign`"
                .into(),
        )),
        Err(_) => Err(SignError::Invalid {
            file: file.to_path_buf(),
            sig: sig_path.to_path_buf(),
            key: key.id.clone(),
        }),
    }
}

/// The key id of a signature's second line, if it decodes.
fn signature_key_id(sig_text: &str) -> Option<String> {
    let line = sig_text.lines().nth(1)?.trim();
    let raw = base64::engine::general_purpose::STANDARD
        .decode(line)
        .ok()?;
    (raw.len() == 74).then(|| key_id_hex(&raw[2..10]))
}

/// Signs `bytes` with the minisign secret key at `secret_key` (unencrypted, or encrypted with
/// `password`) and returns the signature file's text. `trusted_comment` is covered by the
/// signature.
pub fn sign(
    bytes: &[u8],
    secret_key: &Path,
    password: Option<String>,
    trusted_comment: &str,
) -> Result<String, SignError> {
    let text = crate::bounded_read::read_text(secret_key, crate::bounded_read::MAX_KEY).map_err(
        |source| SignError::Io {
            action: "reading secret key",
            path: secret_key.to_path_buf(),
            source,
        },
    )?;
    let skerr = |reason: String| SignError::SecretKey {
        path: secret_key.to_path_buf(),
        reason,
    };
    let raw = text
        .lines()
        .nth(1)
        .and_then(|l| {
            base64::engine::general_purpose::STANDARD
                .decode(l.trim())
                .ok()
        })
        .ok_or_else(|| skerr("not a minisign secret key (no base64 key line)".into()))?;
    let sk = if raw.len() >= 4 && raw[2..4] == [0, 0] && password.is_none() {
        // `minisign -G -W` keys carry no KDF and an all-zero checksum, which the minisign
        // crate's box loader rejects; the raw key bytes are usable as they are.
        minisign::SecretKey::from_bytes(&raw).map_err(|e| skerr(e.to_string()))?
    } else {
        // An empty password means an unencrypted key; never prompt on a terminal.
        minisign::SecretKeyBox::from_string(&text)
            .and_then(|b| b.into_secret_key(Some(password.unwrap_or_default())))
            .map_err(|e| skerr(e.to_string()))?
    };
    let pk = minisign::PublicKey::from_secret_key(&sk).ok();
    let sig = minisign::sign(
        pk.as_ref(),
        &sk,
        std::io::Cursor::new(bytes),
        Some(trusted_comment),
        Some("signature from kiln lock sign"),
    )
    .map_err(|e| skerr(e.to_string()))?;
    Ok(sig.into_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_release_key_parses() {
        let k = TrustedKey::release();
        assert_eq!(k.id().len(), 16);
        assert!(DEFAULT_PUBLIC_KEY.contains(k.id()), "{}", k.id());
    }

    #[test]
    fn garbage_keys_are_refused() {
        for text in ["", "not base64!", "untrusted comment: x\nRWQ="] {
            let err = TrustedKey::parse(text, "t").unwrap_err().to_string();
            assert!(err.contains("trusted key t"), "{err}");
        }
    }
}
