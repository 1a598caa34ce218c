//! Metadata on a volume: an OpenStack config drive (label `config-2`; Nova, Ironic/Metal3,
//! KubeVirt, Nutanix) and a NoCloud seed (label `cidata`; Proxmox, KubeVirt, IBM Cloud VPC,
//! any hypervisor), found by label under `/dev/disk/by-label/`, mounted read-only
//! (`nosuid,nodev,noexec,nosymfollow`) for the read and unmounted after it. Why firstboot
//! mounts it itself rather than through a systemd unit: docs/contract.md, "Metadata volumes".
//!
//! `METADATA_URL` (or `--metadata-url`) may name a directory that holds the volume's files
//! instead (already mounted, or copied). NoCloud also takes cloud-init's `ds=nocloud` from
//! the kernel command line or the DMI serial: `i=` (instance ID) and `h=` (hostname) override
//! `meta-data`, and `s=` names where the seed is (`http://…/` or a directory).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::platforms::{CONFIGDRIVE, NOCLOUD};
use super::table::{From, Table};
use crate::contract::{paths, Provider};
use crate::error::Error;
use crate::fsutil;
use crate::json::Value;
use crate::provider::common::{check_token, Context, Metadata, MetadataSource};
use crate::Reason;

/// Where the volume is mounted while it is read.
pub const MOUNT_POINT: &str = "/run/kiln/seed";
/// The directory of udev's label links.
pub const BY_LABEL: &str = "/dev/disk/by-label";
/// How long a named volume's label link may take to appear (udev's coldplug is long done
/// when firstboot runs after network-online.target; this covers a slow virtual disk).
const LABEL_WAIT: Duration = Duration::from_secs(5);

/// A metadata volume: its documents and the labels it goes by.
#[derive(Debug)]
pub struct Volume {
    pub table: &'static Table,
    pub labels: [&'static str; 2],
}

/// The config drive: cloud-init's `LABEL_TYPES`, afterburn's `config-2`.
pub static CONFIG_DRIVE: Volume = Volume {
    table: &CONFIGDRIVE,
    labels: ["config-2", "CONFIG-2"],
};

/// The NoCloud seed: cloud-init's default `fs_label` in both cases.
pub static NOCLOUD_SEED: Volume = Volume {
    table: &NOCLOUD,
    labels: ["cidata", "CIDATA"],
};

/// The label link of `v` that exists under `root`, if one does; on Windows, the root of the
/// drive with its label (`D:\`).
pub fn find(root: &Path, v: &Volume) -> Option<PathBuf> {
    #[cfg(windows)]
    {
        let _ = root;
        crate::windows::volumes::labelled(&v.labels)
    }
    #[cfg(not(windows))]
    v.labels
        .iter()
        .map(|l| paths::under(root, BY_LABEL).join(l))
        .find(|p| p.exists())
}

/// cloud-init's `ds=nocloud[-net][;k=v…]` from the kernel command line, else from the DMI
/// serial (`-smbios type=1,serial=ds=nocloud;…`); `None` when neither says it. Its values
/// are read with [`ds_arg`].
pub fn nocloud_args(root: &Path) -> Option<String> {
    let read = |p: &str| {
        fsutil::read_capped(&paths::under(root, p), 65536)
            .ok()
            .flatten()
    };
    let cmdline = read("/proc/cmdline").unwrap_or_default();
    let serial = read("/sys/class/dmi/id/product_serial").unwrap_or_default();
    let token = cmdline
        .split_ascii_whitespace()
        .chain(serial.split_ascii_whitespace())
        .find(|t| matches!(t.split(';').next(), Some("ds=nocloud" | "ds=nocloud-net")))?;
    Some(token.to_string())
}

/// The value of `short=` or `long=` in a `ds=nocloud;…` token (cloud-init's `s2l`: `s`
/// seedfrom, `i` instance-id, `h` local-hostname).
pub fn ds_arg<'a>(args: &'a str, short: &str, long: &str) -> Option<&'a str> {
    args.split(';')
        .skip(1)
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == short || *k == long)
        .map(|(_, v)| v)
}

fn unreachable(m: String) -> Error {
    Error::metadata(Reason::MetadataUnreachable, m)
}

impl MetadataSource for Volume {
    fn provider(&self) -> Provider {
        self.table.provider
    }

    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error> {
        let args = match self.table.provider {
            Provider::Nocloud => nocloud_args(cx.root).unwrap_or_default(),
            _ => String::new(),
        };
        let seed = cx.base_url.or(ds_arg(&args, "s", "seedfrom"));
        let (docs, what) = match seed {
            Some(s) if s.starts_with("http://") => {
                let base = if s.ends_with('/') { s.to_string() } else { format!("{s}/") };
                (self.table.load(cx, From::Http(&base))?, base)
            }
            Some(s) if s.starts_with('/') => (self.table.load(cx, From::Dir(Path::new(s)))?, s.to_string()),
            Some(s) => {
                return Err(Error::metadata(
                    Reason::MetadataInvalid,
                    format!("{} seed {s:?}: expected http://…/ or a directory (kiln-firstboot has no TLS client for https://)", self.table.provider),
                ))
            }
            None => self.mounted(cx)?,
        };
        let mut md = self.table.read(cx, &docs, &what)?;
        // The command line beats the seed, as cloud-init merges it over `meta-data`.
        for (short, long, field) in [
            ("i", "instance-id", &mut md.instance_id),
            ("h", "local-hostname", &mut md.hostname),
        ] {
            if let Some(v) = ds_arg(&args, short, long) {
                check_token(v, long, "ds=nocloud")?;
                *field = v.to_ascii_lowercase();
            }
        }
        Ok(md)
    }
}

impl Volume {
    /// Finds the volume by label (waiting a little for its link), mounts it, reads the
    /// documents, and unmounts it whatever the read gave.
    fn mounted(&self, cx: &Context<'_>) -> Result<(Vec<Value>, String), Error> {
        let until = cx.client.deadline().min(Instant::now() + LABEL_WAIT);
        let dev = loop {
            if let Some(d) = find(cx.root, self) {
                break d;
            }
            if Instant::now() >= until {
                return Err(unreachable(format!(
                    "{}: expected a volume labelled {} or {}, found none",
                    paths::under(cx.root, BY_LABEL).display(),
                    self.labels[0],
                    self.labels[1]
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // Windows: the drive is mounted already, as its letter.
        if cfg!(windows) {
            return Ok((
                self.table.load(cx, From::Dir(&dev))?,
                dev.display().to_string(),
            ));
        }
        let at = paths::under(cx.root, MOUNT_POINT);
        mount_ro(&dev, &at).map_err(unreachable)?;
        let docs = self.table.load(cx, From::Dir(&at));
        unmount(&at);
        Ok((docs?, dev.display().to_string()))
    }
}

#[cfg(target_os = "linux")]
mod sys {
    use std::ffi::{c_char, c_int, c_ulong, c_void};
    extern "C" {
        pub fn mount(
            src: *const c_char,
            target: *const c_char,
            fstype: *const c_char,
            flags: c_ulong,
            data: *const c_void,
        ) -> c_int;
        pub fn umount2(target: *const c_char, flags: c_int) -> c_int;
    }
    /// `MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOSYMFOLLOW` (linux/mount.h).
    pub const FLAGS: c_ulong = 1 | 2 | 4 | 8 | 256;
    /// `MNT_DETACH | UMOUNT_NOFOLLOW`: a link planted at the mount point is not followed to
    /// unmount something else.
    pub const DETACH: c_int = 2 | 8;
}

#[cfg(target_os = "linux")]
fn cstr(p: &Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut v = p.as_os_str().as_bytes().to_vec();
    v.push(0);
    v
}

/// Mounts `dev` read-only at `at` (made a fresh 0700 directory), as ISO 9660, else FAT (the
/// two filesystems Nova, cloud-localds and Proxmox write).
#[cfg(target_os = "linux")]
pub fn mount_ro(dev: &Path, at: &Path) -> Result<(), String> {
    unmount(at);
    let parent = at.parent().unwrap_or(Path::new("/"));
    fsutil::real_dir(parent, true).map_err(|e| format!("{}: {e}", parent.display()))?;
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(at)
        .map_err(|e| format!("{}: cannot create: {e}", at.display()))?;
    let (d, t) = (cstr(dev), cstr(at));
    let try_fs = |fs: &[u8]| {
        // SAFETY: NUL-terminated strings that outlive the call; no data argument.
        let rc = unsafe {
            sys::mount(
                d.as_ptr().cast(),
                t.as_ptr().cast(),
                fs.as_ptr().cast(),
                sys::FLAGS,
                std::ptr::null(),
            )
        };
        match rc {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    let iso = match try_fs(b"iso9660\0") {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    let fat = match try_fs(b"vfat\0") {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    let _ = std::fs::remove_dir(at);
    Err(format!(
        "mount {} read-only at {}: iso9660: {iso}; vfat: {fat}",
        dev.display(),
        at.display()
    ))
}

#[cfg(not(target_os = "linux"))]
pub fn mount_ro(dev: &Path, _at: &Path) -> Result<(), String> {
    Err(format!(
        "{}: mounting a metadata volume is Linux only; give its directory in METADATA_URL",
        dev.display()
    ))
}

/// Detaches a mount at `at`, if any, and removes the directory.
pub fn unmount(at: &Path) {
    #[cfg(target_os = "linux")]
    {
        let t = cstr(at);
        // SAFETY: a NUL-terminated string that outlives the call.
        unsafe { sys::umount2(t.as_ptr().cast(), sys::DETACH) };
    }
    let _ = std::fs::remove_dir(at);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args_of(cmdline: &str, serial: &str) -> Option<String> {
        let dir = std::env::temp_dir().join(format!("kiln-nocloud-args-{}", fsutil::random_u64()));
        std::fs::create_dir_all(dir.join("proc")).unwrap();
        std::fs::create_dir_all(dir.join("sys/class/dmi/id")).unwrap();
        std::fs::write(dir.join("proc/cmdline"), cmdline).unwrap();
        std::fs::write(dir.join("sys/class/dmi/id/product_serial"), serial).unwrap();
        let got = nocloud_args(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        got
    }

    #[test]
    fn cloud_inits_command_line_forms() {
        let a = args_of(
            "ro quiet ds=nocloud;s=http://127.0.0.1:8000/;i=iid;h=host console=ttyS0\n",
            "",
        )
        .unwrap();
        assert_eq!(ds_arg(&a, "s", "seedfrom"), Some("http://127.0.0.1:8000/"));
        assert_eq!(ds_arg(&a, "i", "instance-id"), Some("iid"));
        assert_eq!(ds_arg(&a, "h", "local-hostname"), Some("host"));
        let a = args_of("ds=nocloud-net;seedfrom=http://h/\n", "").unwrap();
        assert_eq!(ds_arg(&a, "s", "seedfrom"), Some("http://h/"));
        assert_eq!(ds_arg(&a, "i", "instance-id"), None);
        assert_eq!(args_of("ds=nocloud\n", "").as_deref(), Some("ds=nocloud"));
        // The DMI serial, as QEMU's -smbios type=1,serial=… sets it.
        let a = args_of("ro\n", "ds=nocloud;i=from-serial").unwrap();
        assert_eq!(ds_arg(&a, "i", "instance-id"), Some("from-serial"));
        assert_eq!(args_of("ro ds=nocloudy\n", ""), None);
        assert_eq!(args_of("ro\n", ""), None);
    }

    /// udev's label links are Linux's (and a Windows file system would match either case).
    #[cfg(unix)]
    #[test]
    fn labels_are_found_in_either_case() {
        let dir = std::env::temp_dir().join(format!("kiln-labels-{}", fsutil::random_u64()));
        let by = dir.join("dev/disk/by-label");
        std::fs::create_dir_all(&by).unwrap();
        assert_eq!(find(&dir, &NOCLOUD_SEED), None);
        std::fs::write(by.join("CIDATA"), "").unwrap();
        assert_eq!(find(&dir, &NOCLOUD_SEED), Some(by.join("CIDATA")));
        assert_eq!(find(&dir, &CONFIG_DRIVE), None);
        std::fs::write(by.join("config-2"), "").unwrap();
        assert_eq!(find(&dir, &CONFIG_DRIVE), Some(by.join("config-2")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
