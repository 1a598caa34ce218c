//! Editing a lock file: its header comments kept, an edited lock validated and written
//! atomically (its stale signature removed), and a lock signed. The commands that edit a lock
//! (`kiln lock add`, `lock update`, `lock sign`) call these; none of them writes the file
//! another way.

use std::io;
use std::path::{Path, PathBuf};

use crate::bounded_read::{read_regular, read_text, MAX_LOCK};
use crate::exit::ExitClass;
use crate::supply::lock::{Lock, LockError};
use crate::supply::sign::{self, SignError};
use crate::supply::store::StoreError;

/// Why a lock could not be edited or signed.
#[derive(Debug, thiserror::Error)]
pub enum LockEditError {
    /// The lock file could not be read.
    #[error("reading lock {path}: {source}")]
    Read {
        /// The lock.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The lock (as read, or as edited) is not a valid lock: kiln never writes or signs one.
    #[error(transparent)]
    Invalid(#[from] LockError),
    /// Signing failed (the secret key, its password).
    #[error(transparent)]
    Sign(#[from] SignError),
    /// The password variable named for the secret key is not set.
    #[error("reading the secret key's password from ${var}: {source}")]
    Password {
        /// The environment variable.
        var: String,
        /// Why.
        source: std::env::VarError,
    },
    /// Writing the lock or its signature failed.
    #[error(transparent)]
    Write(#[from] StoreError),
    /// The stale signature could not be removed.
    #[error("removing {path}: {source}")]
    RemoveSignature {
        /// The signature file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

impl LockEditError {
    /// An invalid lock or a bad key is refused (exit 3); the rest is a failure.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            LockEditError::Invalid(e) => e.exit_class(),
            LockEditError::Sign(e) => e.exit_class(),
            _ => ExitClass::Failure,
        }
    }
}

/// Reads the lock at `path` for editing: the parsed lock and its header comments.
pub fn read_for_edit(path: &Path) -> Result<(Lock, String), LockEditError> {
    let text = read_text(path, MAX_LOCK).map_err(|source| LockEditError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((Lock::parse(&text, path)?, header_of(&text)))
}

/// Validates the lock at `path` and writes `path.minisig` signed with `secret_key` (its
/// password from the environment variable `password_env`, if named); returns the signature
/// path and the number of artifacts.
pub fn sign_lock(
    path: &Path,
    secret_key: &Path,
    password_env: Option<&str>,
) -> Result<(PathBuf, usize), LockEditError> {
    let bytes = read_regular(path, MAX_LOCK).map_err(|source| LockEditError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let text = std::str::from_utf8(&bytes).map_err(|_| LockEditError::Read {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"),
    })?;
    // Never sign something kiln itself would refuse to read.
    let lock = Lock::parse(text, path)?;
    let password = match password_env {
        Some(var) => Some(
            std::env::var(var).map_err(|source| LockEditError::Password {
                var: var.to_string(),
                source,
            })?,
        ),
        None => None,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let comment = format!("timestamp:{now}\tfile:{name}");
    let sig = sign::sign(&bytes, secret_key, password, &comment)?;
    let sig_path = sign::signature_path(path);
    crate::supply::store::write_atomic(&sig_path, sig.as_bytes())?;
    Ok((sig_path, lock.artifacts.len()))
}

/// Comment and blank lines at the top of a lock, kept when kiln rewrites it.
pub fn header_of(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() {
            out.push_str(line);
            out.push('\n');
        } else {
            break;
        }
    }
    out
}

/// Writes an edited lock (validated first) and removes its now-stale signature; returns the
/// signature's path when there was one to remove (the caller tells the user to sign again).
pub fn write_lock(
    path: &Path,
    header: &str,
    lock: &Lock,
) -> Result<Option<PathBuf>, LockEditError> {
    let text = format!("{header}{}", lock.to_toml());
    Lock::parse(&text, path)?;
    crate::supply::store::write_atomic(path, text.as_bytes())?;
    let sig = sign::signature_path(path);
    match std::fs::remove_file(&sig) {
        Ok(()) => Ok(Some(sig)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LockEditError::RemoveSignature { path: sig, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_comments_and_blank_lines_are_kept_up_to_the_first_key() {
        let t = "# a\n\n# b\nversion = 1\n# not header\n";
        assert_eq!(header_of(t), "# a\n\n# b\n");
        assert_eq!(header_of("version = 1\n"), "");
    }
}
