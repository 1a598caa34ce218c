//! Finds the cached guest assets (kernel, initramfs, Debian bases), building them first
//! through `assets/assets.sh` when the cache is cold. The script takes a lock, so parallel
//! tests build each asset once. The arm64 guest's assets are separate ([`ensure_arm64`]):
//! only a test that boots arm64 builds them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::arch::Arch;
use crate::{Error, Result};

/// Paths of the assets for the current kernel and recipe versions.
#[derive(Debug, Clone)]
pub struct Assets {
    /// The guest architecture these assets boot.
    pub arch: Arch,
    /// The kernel image (bzImage; on arm64 an uncompressed `Image`).
    pub kernel: PathBuf,
    /// The module-loading busybox initramfs.
    pub initrd: PathBuf,
    /// The kernel release, e.g. `6.1.0-56-cloud-amd64`.
    pub kver: String,
    /// The debootstrapped trixie root (systemd, udev, dbus, the kernel's modules).
    pub base: PathBuf,
    /// The same plus cloud-init; built only when asked for (amd64 only: empty on arm64).
    pub base_cloudinit: PathBuf,
}

/// The asset script in this crate.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/assets.sh")
}

/// Parses the `KEY=value` lines `assets.sh env` prints.
pub fn parse_env(text: &str) -> Result<Assets> {
    let get = |key: &str| -> Result<String> {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
            .ok_or_else(|| Error::Missing {
                what: format!("{key} in the output of assets.sh"),
                hint: format!("the script printed:\n{text}"),
            })
    };
    Ok(Assets {
        arch: Arch::Amd64,
        kernel: get("KILN_QEMU_KERNEL")?.into(),
        initrd: get("KILN_QEMU_INITRD")?.into(),
        kver: get("KILN_QEMU_KVER")?,
        base: get("KILN_QEMU_BASE")?.into(),
        base_cloudinit: get("KILN_QEMU_BASE_CLOUDINIT")?.into(),
    })
}

/// Parses the `KILN_QEMU_ARM64_*` lines `assets.sh arm64` (or `env-arm64`) prints.
pub fn parse_env_arm64(text: &str) -> Result<Assets> {
    let renamed: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("KILN_QEMU_ARM64_"))
        .map(|l| format!("KILN_QEMU_{l}\n"))
        .collect();
    let a = parse_env(&format!("{renamed}KILN_QEMU_BASE_CLOUDINIT=\n")).map_err(|e| match e {
        Error::Missing { what, hint } => Error::Missing {
            what: what.replace("KILN_QEMU_", "KILN_QEMU_ARM64_"),
            hint,
        },
        e => e,
    })?;
    Ok(Assets {
        arch: Arch::Arm64,
        ..a
    })
}

fn build(what: &str) -> Result<Assets> {
    let out = crate::run(Command::new(script()).arg(what))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if what == "arm64" {
        parse_env_arm64(&text)
    } else {
        parse_env(&text)
    }
}

/// The assets named by `KILN_QEMU_*` variables (what `make qemu-test` exports after
/// building them once), when every one is set and exists.
fn from_env() -> Option<Assets> {
    let keys = [
        "KILN_QEMU_KERNEL",
        "KILN_QEMU_KVER",
        "KILN_QEMU_INITRD",
        "KILN_QEMU_BASE",
        "KILN_QEMU_BASE_CLOUDINIT",
    ];
    let text: String = keys
        .iter()
        .map(|k| std::env::var(k).ok().map(|v| format!("{k}={v}\n")))
        .collect::<Option<String>>()?;
    let a = parse_env(&text).ok()?;
    (a.kernel.is_file() && a.initrd.is_file() && a.base.join("etc/os-release").exists())
        .then_some(a)
}

/// The kernel, initramfs and base: from `KILN_QEMU_*` when set, else built (or found in
/// the cache) by the asset script on first use in this process.
pub fn ensure() -> Result<&'static Assets> {
    static ASSETS: OnceLock<std::result::Result<Assets, String>> = OnceLock::new();
    ASSETS
        .get_or_init(|| match from_env() {
            Some(a) => Ok(a),
            None => build("all").map_err(|e| e.to_string()),
        })
        .as_ref()
        .map_err(|e| Error::Missing {
            what: "QEMU guest assets".into(),
            hint: format!("`make qemu-assets` failed: {e}"),
        })
}

/// The arm64 guest's kernel, initramfs and base: from `KILN_QEMU_ARM64_*` when set (what
/// `make qemu-test` exports), else built or found by `assets.sh arm64` on first use.
pub fn ensure_arm64() -> Result<&'static Assets> {
    static ASSETS: OnceLock<std::result::Result<Assets, String>> = OnceLock::new();
    ASSETS
        .get_or_init(|| {
            let keys = [
                "KILN_QEMU_ARM64_KERNEL",
                "KILN_QEMU_ARM64_KVER",
                "KILN_QEMU_ARM64_INITRD",
                "KILN_QEMU_ARM64_BASE",
            ];
            let text: Option<String> = keys
                .iter()
                .map(|k| std::env::var(k).ok().map(|v| format!("{k}={v}\n")))
                .collect();
            let found = text.and_then(|t| parse_env_arm64(&t).ok()).filter(|a| {
                a.kernel.is_file() && a.initrd.is_file() && a.base.join("etc/os-release").exists()
            });
            match found {
                Some(a) => Ok(a),
                None => build("arm64").map_err(|e| e.to_string()),
            }
        })
        .as_ref()
        .map_err(|e| Error::Missing {
            what: "the arm64 QEMU guest assets".into(),
            hint: format!("`qemu-tests/assets/assets.sh arm64` failed: {e}"),
        })
}

/// Like [`ensure`], and also the cloud-init base.
pub fn ensure_cloudinit() -> Result<&'static Assets> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let assets = ensure()?;
    DONE.get_or_init(|| {
        if assets.base_cloudinit.join("etc/os-release").exists() {
            return Ok(());
        }
        build("base-cloudinit")
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(|e| Error::Missing {
        what: "the cloud-init base".into(),
        hint: format!("`qemu-tests/assets/assets.sh base-cloudinit` failed: {e}"),
    })?;
    Ok(assets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_output_is_parsed_and_gaps_are_named() {
        let text = "KILN_QEMU_KERNEL=/c/k/vmlinuz\nKILN_QEMU_KVER=6.1.0-56-cloud-amd64\n\
                    KILN_QEMU_INITRD=/c/i/initrd.img\nKILN_QEMU_BASE=/c/b/root\n\
                    KILN_QEMU_BASE_CLOUDINIT=/c/bc/root\n";
        let a = parse_env(text).unwrap();
        assert_eq!(a.kernel, Path::new("/c/k/vmlinuz"));
        assert_eq!(a.kver, "6.1.0-56-cloud-amd64");
        assert_eq!(a.base_cloudinit, Path::new("/c/bc/root"));
        let err = parse_env("KILN_QEMU_KERNEL=/k\n").unwrap_err().to_string();
        assert!(err.contains("KILN_QEMU_INITRD"), "{err}");
        assert_eq!(a.arch, Arch::Amd64);
    }

    #[test]
    fn arm64_env_output_is_parsed_apart_from_amd64s() {
        let text = "KILN_QEMU_KERNEL=/c/k/vmlinuz\nKILN_QEMU_ARM64_KERNEL=/c/ka/vmlinuz\n\
                    KILN_QEMU_ARM64_KVER=6.1.0-56-cloud-arm64\nKILN_QEMU_ARM64_INITRD=/c/ia/initrd.img\n\
                    KILN_QEMU_ARM64_BASE=/c/ba/root\n";
        let a = parse_env_arm64(text).unwrap();
        assert_eq!(a.arch, Arch::Arm64);
        assert_eq!(a.kernel, Path::new("/c/ka/vmlinuz"));
        assert_eq!(a.kver, "6.1.0-56-cloud-arm64");
        assert_eq!(a.base, Path::new("/c/ba/root"));
        let err = parse_env_arm64("KILN_QEMU_ARM64_KERNEL=/k\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("KILN_QEMU_ARM64_INITRD"), "{err}");
    }
}
