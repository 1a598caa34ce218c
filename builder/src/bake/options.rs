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
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            threads: 0,
            mksquashfs: PathBuf::from("mksquashfs"),
            sign: None,
        }
    }
}
