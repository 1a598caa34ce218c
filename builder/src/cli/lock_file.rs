//! Editing the lock file itself: its header comments kept, an edited lock validated and
//! written atomically (its stale signature removed), and a lock signed.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::supply::lock::Lock;
use crate::supply::sign;

/// Validates the lock at `path` and writes `path.minisig` signed with `secret_key`; returns
/// the signature path and the number of artifacts.
pub(crate) fn sign_lock(
    path: &Path,
    secret_key: &Path,
    password_env: Option<&str>,
) -> anyhow::Result<(PathBuf, usize)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading lock {}", path.display()))?;
    let text = std::str::from_utf8(&bytes)
        .with_context(|| format!("lock {} is not UTF-8", path.display()))?;
    // Never sign something kiln itself would refuse to read.
    let lock = Lock::parse(text, path)?;
    let password = match password_env {
        Some(var) => {
            Some(std::env::var(var).with_context(|| format!("reading password from ${var}"))?)
        }
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
pub(crate) fn header_of(text: &str) -> String {
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

/// Writes an edited lock (validated first) and removes its now-stale signature.
pub(crate) fn write_lock(path: &Path, header: &str, lock: &Lock) -> anyhow::Result<()> {
    let text = format!("{header}{}", lock.to_toml());
    Lock::parse(&text, path)?;
    crate::supply::store::write_atomic(path, text.as_bytes())?;
    let sig = sign::signature_path(path);
    match std::fs::remove_file(&sig) {
        Ok(()) => eprintln!(
            "kiln: {} changed; its old signature {} was removed: sign it again with `kiln lock sign`",
            path.display(),
            sig.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", sig.display())),
    }
    Ok(())
}
