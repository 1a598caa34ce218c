//! What a baked layer is, as every reader and writer of one agrees on it: the names and codecs
//! `kiln bake` writes and `kiln install`, `kiln image`, the image definition and the node read
//! (docs/contract.md). One definition each, so a writer and its readers cannot drift:
//!
//! - [`sums`]: `SHA256SUMS`, published beside the images (bake writes, install verifies);
//! - [`install_manifest`]: `/usr/lib/kiln/install.manifest`, the files a rootfs layer owns
//!   (bake writes, install and image read);
//! - [`INSTALL_MANIFEST`], [`BUILTIN_UNITS`], and the layer clock ([`epoch_from_env`],
//!   [`civil`]).
//!
//! A leaf: it imports nothing of `bake`, `install` or `image`.

pub mod install_manifest;
pub mod sums;

/// Where the install manifest lives in a rootfs layer.
pub const INSTALL_MANIFEST: &str = "usr/lib/kiln/install.manifest";

/// Units kiln itself ships in every layer (docs/contract.md, "systemd units"); an image
/// definition may not replace them.
pub const BUILTIN_UNITS: &[&str] = &[
    "kiln-firstboot.service",
    "kubelet.service",
    "kiln-report.service",
    "kiln-report.timer",
    "containerd.service",
    "kiln-images.service",
];

/// The time every entry of a layer carries when `SOURCE_DATE_EPOCH` is unset:
/// 2024-01-01T00:00:00Z.
pub const DEFAULT_EPOCH: u64 = 1_704_067_200;

/// Reads `SOURCE_DATE_EPOCH` from the environment, else [`DEFAULT_EPOCH`].
pub fn epoch_from_env() -> Result<u64, String> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("SOURCE_DATE_EPOCH: expected whole seconds, found {v:?}")),
        Err(_) => Ok(DEFAULT_EPOCH),
    }
}

/// Epoch seconds to a civil UTC date, for SPDX and zip times: kiln-firstboot's
/// [`kiln_firstboot::clock::civil`], the one implementation both crates use.
pub fn civil(epoch: u64) -> (i64, u32, u32, u32, u32, u32) {
    kiln_firstboot::clock::civil(epoch as i64)
}
