//! How a baked layer is written: compression threads, the mksquashfs binary, the signer.

use std::path::PathBuf;

use crate::bake::gpg;

/// Output writer options.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Compression threads (0 = all cores). Never changes the bytes written.
    pub threads: u32,
    /// `mksquashfs` binary, for xz sysext images only (zstd and gzip use kiln's own writer).
    pub mksquashfs: PathBuf,
    /// Sign a sysext's `SHA256SUMS` (`SHA256SUMS.gpg`, transfer file `Verify=true`);
    /// `None` publishes it unsigned (`Verify=false`).
    pub sign: Option<gpg::GpgSigner>,
    /// Write a sysext as a signed Discoverable Disk Image (`--sysext-ddi`) with this key and
    /// certificate; `None` writes the bare squashfs.
    pub ddi: Option<DdiSigning>,
}

/// What signs a sysext DDI's dm-verity root hash.
#[derive(Clone)]
pub struct DdiSigning {
    /// The P-256 key (the bake's `--attest-key`).
    pub key: p256::ecdsa::SigningKey,
    /// Its self-signed certificate (DER), which nodes trust in `/etc/verity.d/`.
    pub cert_der: Vec<u8>,
}

impl std::fmt::Debug for DdiSigning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DdiSigning(..)")
    }
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            threads: 0,
            mksquashfs: PathBuf::from("mksquashfs"),
            sign: None,
            ddi: None,
        }
    }
}
