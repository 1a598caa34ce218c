//! A throwaway gpg home with a passphrase-less signing key made at test time, and the
//! signature check systemd-pull runs (for the sysupdate tests).

use std::path::Path;
use std::process::{Command, Output, Stdio};

use super::ok;

/// A gpg home with one passphrase-less signing key; its agent is stopped on drop.
pub struct GpgHome {
    dir: tempfile::TempDir,
    /// The key's fingerprint.
    pub fingerprint: String,
}

impl GpgHome {
    /// Makes the home and the key.
    pub fn generate() -> GpgHome {
        // gpg-agent's socket path must stay short: a temp dir under /tmp, not the fixture's.
        let dir = tempfile::Builder::new()
            .prefix("kiln-gpg-")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let gen = Command::new("gpg")
            .arg("--homedir")
            .arg(dir.path())
            .args([
                "--batch",
                "--no-tty",
                "--passphrase",
                "",
                "--quick-gen-key",
                "kiln test signer <kiln-test@example.invalid>",
                "ed25519",
                "sign",
                "never",
            ])
            .output()
            .unwrap();
        ok(&gen, "gpg --quick-gen-key");
        let list = Command::new("gpg")
            .arg("--homedir")
            .arg(dir.path())
            .args(["--batch", "--with-colons", "--list-secret-keys"])
            .output()
            .unwrap();
        ok(&list, "gpg --list-secret-keys");
        let fingerprint = String::from_utf8(list.stdout)
            .unwrap()
            .lines()
            .find(|l| l.starts_with("fpr:"))
            .and_then(|l| l.split(':').nth(9))
            .unwrap()
            .to_string();
        GpgHome { dir, fingerprint }
    }

    /// The gpg home directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Exports the public key as a binary keyring, like `/etc/systemd/import-pubring.gpg`.
    pub fn export_keyring(&self, to: &Path) {
        let out = Command::new("gpg")
            .arg("--homedir")
            .arg(self.path())
            .args(["--batch", "--export", &self.fingerprint])
            .output()
            .unwrap();
        ok(&out, "gpg --export");
        assert!(!out.stdout.is_empty());
        std::fs::write(to, out.stdout).unwrap();
    }
}

impl Drop for GpgHome {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .arg("--homedir")
            .arg(self.dir.path())
            .args(["--kill", "gpg-agent"])
            .output();
    }
}

/// systemd-pull's signature check: fresh home, only the given keyring, data on stdin.
pub fn verify_like_systemd(keyring: &Path, sig: &Path, data: &Path) -> Output {
    let home = tempfile::Builder::new()
        .prefix("kiln-gpgv-")
        .tempdir_in("/tmp")
        .unwrap();
    let out = Command::new("gpg")
        .args([
            "--no-options",
            "--no-default-keyring",
            "--no-auto-key-locate",
            "--no-auto-check-trustdb",
            "--batch",
            "--trust-model=always",
        ])
        .arg(format!("--homedir={}", home.path().display()))
        .arg(format!("--keyring={}", keyring.display()))
        .arg("--verify")
        .arg(sig)
        .arg("-")
        .stdin(Stdio::from(std::fs::File::open(data).unwrap()))
        .output()
        .unwrap();
    let _ = Command::new("gpgconf")
        .arg("--homedir")
        .arg(home.path())
        .args(["--kill", "all"])
        .output();
    out
}
