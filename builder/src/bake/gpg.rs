//! Detached OpenPGP signatures of a sysext's `SHA256SUMS` (`SHA256SUMS.gpg`), made by `gpg`,
//! so nodes' systemd-sysupdate can run with `Verify=true` (it checks the signature with
//! `gpg --verify` against `/etc/systemd/import-pubring.gpg`).
//!
//! gpg and not a Rust OpenPGP crate: the signing key lives where operators keep it (a gpg
//! home, an agent, a smartcard), and the verifier on the node is gpg too.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::atomic_file::AtomicFile;
use crate::bake::error::{io_err, BakeError};

/// The detached signature's name next to `SHA256SUMS`, as systemd-sysupdate looks for it.
pub const SIGNATURE_NAME: &str = "SHA256SUMS.gpg";

/// How to sign: which key, which gpg, which gpg home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpgSigner {
    /// The `gpg` binary.
    pub gpg: PathBuf,
    /// The signing key: a fingerprint, key id or user id gpg's `--local-user` accepts.
    pub key: String,
    /// gpg's home directory; `None` leaves it to gpg (`$GNUPGHOME`, `~/.gnupg`).
    pub homedir: Option<PathBuf>,
}

impl GpgSigner {
    fn command(&self) -> Command {
        let mut c = Command::new(&self.gpg);
        c.args(["--batch", "--no-tty"]);
        if let Some(h) = &self.homedir {
            c.arg("--homedir").arg(h);
        }
        c
    }

    fn tool_err(&self, detail: String) -> BakeError {
        BakeError::Tool {
            tool: self.gpg.display().to_string(),
            detail,
        }
    }

    fn home_text(&self) -> String {
        match &self.homedir {
            Some(h) => format!("gpg home {}", h.display()),
            None => "gpg's default home ($GNUPGHOME or ~/.gnupg)".into(),
        }
    }

    /// Checks that gpg runs and holds a secret key for [`GpgSigner::key`], so a bake does not
    /// fail only after the image is written.
    pub fn check(&self) -> Result<(), BakeError> {
        let out = self
            .command()
            .args(["--list-secret-keys", "--with-colons", "--"])
            .arg(&self.key)
            .output()
            .map_err(|e| {
                self.tool_err(format!("could not run it: {e} (install gnupg: make deps)"))
            })?;
        if !out.status.success() {
            return Err(self.tool_err(format!(
                "no secret key {:?} in {}: expected one to sign SHA256SUMS with, found none ({})",
                self.key,
                self.home_text(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Signs `file` into `out` (binary detached signature), atomically: gpg writes a temp
    /// file in the same directory, which is fsynced and renamed.
    pub fn sign_detached(&self, file: &Path, out: &Path) -> Result<(), BakeError> {
        let tmp = AtomicFile::create(out, ".kiln-", ".gpg.tmp")?;
        let res = self
            .command()
            .args(["--yes", "--local-user"])
            .arg(&self.key)
            .arg("--output")
            .arg(tmp.temp_path())
            .arg("--detach-sign")
            .arg("--")
            .arg(file)
            .output()
            .map_err(|e| {
                self.tool_err(format!("could not run it: {e} (install gnupg: make deps)"))
            })?;
        if !res.status.success() {
            return Err(self.tool_err(format!(
                "{} signing {} with key {:?} from {}: {}",
                res.status,
                file.display(),
                self.key,
                self.home_text(),
                String::from_utf8_lossy(&res.stderr).trim()
            )));
        }
        let len = std::fs::metadata(tmp.temp_path())
            .map_err(io_err(tmp.temp_path()))?
            .len();
        if len == 0 {
            return Err(self.tool_err(format!(
                "signing {}: expected a signature, found an empty file",
                file.display()
            )));
        }
        Ok(tmp.commit(crate::bake::layer::OUTPUT_MODE)?)
    }
}

/// Signs `sums` into `SHA256SUMS.gpg` beside it with `signer`, or, unsigned, removes a
/// signature left by an earlier bake (it would no longer match the rewritten `SHA256SUMS`).
/// Returns the signature's path when one was written.
pub fn publish_signature(
    signer: Option<&GpgSigner>,
    sums: &Path,
) -> Result<Option<PathBuf>, BakeError> {
    let sig = sums.with_file_name(SIGNATURE_NAME);
    match signer {
        Some(s) => {
            if let Err(e) = s.sign_detached(sums, &sig) {
                // A stale signature must not stay next to the SHA256SUMS just rewritten.
                let _ = std::fs::remove_file(&sig);
                return Err(e);
            }
            Ok(Some(sig))
        }
        None => match std::fs::remove_file(&sig) {
            Ok(()) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(BakeError::Io {
                path: sig,
                source: e,
            }),
        },
    }
}
