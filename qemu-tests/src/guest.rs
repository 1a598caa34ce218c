//! Building one test's guest: a private root from a base, units that report on the serial
//! console, the disk image, and where its console log goes.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::{disk, io_err, Result};

/// Where console logs are kept after a test: `$KILN_QEMU_LOGS`, else `target/qemu-logs/`.
pub fn log_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KILN_QEMU_LOGS") {
        return d.into();
    }
    // The test binary lives in target/<profile>/deps/.
    let exe = std::env::current_exe().unwrap_or_default();
    let target = exe
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "target"))
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    target.join("qemu-logs")
}

/// The console log path for a test name, creating its directory.
pub fn log_path(test: &str) -> Result<PathBuf> {
    let dir = log_dir();
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    Ok(dir.join(format!("{test}.log")))
}

/// A guest root being prepared in a temp dir.
#[derive(Debug)]
pub struct Root {
    /// The root directory.
    pub dir: PathBuf,
}

impl Root {
    /// A copy of `base` under `work`, its files hard-linked to the cached base's (see
    /// [`disk::link_tree`]: every change here replaces files, never writes into them).
    pub fn from_base(base: &Path, work: &Path) -> Result<Root> {
        let dir = work.join("root");
        disk::link_tree(base, &dir)?;
        Ok(Root { dir })
    }

    /// Writes a file (parents created) with a mode. An existing file is unlinked first, so
    /// a hard link into the cached base is replaced, never written through.
    pub fn write(&self, rel: &str, content: impl AsRef<[u8]>, mode: u32) -> Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let p = self.dir.join(rel.trim_start_matches('/'));
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(&p)(e)),
            _ => {}
        }
        std::fs::write(&p, content).map_err(io_err(&p))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).map_err(io_err(&p))?;
        Ok(p)
    }

    /// Installs a unit under /etc/systemd/system and enables it for `target` the way
    /// `systemctl enable` would (a symlink in `<target>.wants/`).
    pub fn add_unit(&self, name: &str, text: &str, target: &str) -> Result<()> {
        self.write(&format!("etc/systemd/system/{name}"), text, 0o644)?;
        let wants = self.dir.join(format!("etc/systemd/system/{target}.wants"));
        std::fs::create_dir_all(&wants).map_err(io_err(&wants))?;
        let link = wants.join(name);
        let _ = std::fs::remove_file(&link);
        symlink(format!("/etc/systemd/system/{name}"), &link).map_err(io_err(&link))?;
        Ok(())
    }

    /// Masks a unit (a link to /dev/null in /etc/systemd/system), as `systemctl mask` does.
    pub fn mask(&self, unit: &str) -> Result<()> {
        let link = self.dir.join("etc/systemd/system").join(unit);
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        let _ = std::fs::remove_file(&link);
        symlink("/dev/null", &link).map_err(io_err(&link))
    }

    /// What every kiln scenario's guest is trimmed by (docs/boot-tests.md, "Shared boots and
    /// test settings"), none of it on kiln's path: [`Root::trim_idle`], and the NIC's address
    /// set statically ([`STATIC_NETWORK`], ahead of the base's DHCP file).
    pub fn trim_for_tests(&self) -> Result<()> {
        self.trim_idle()?;
        self.write(
            "etc/systemd/network/40-kiln-test-static.network",
            STATIC_NETWORK,
            0o644,
        )?;
        Ok(())
    }

    /// [`IDLE_UNITS`] masked, [`IDLE_MODULES`] not autoloaded, and virtio_net loaded by
    /// systemd-modules-load before udev starts (not whenever udev's coldplug reaches it).
    /// The harness's own base boot gets this too, so `bench/boot.sh` compares like with like.
    pub fn trim_idle(&self) -> Result<()> {
        for unit in IDLE_UNITS {
            self.mask(unit)?;
        }
        let blacklist: String = IDLE_MODULES
            .iter()
            .map(|m| format!("blacklist {m}\n"))
            .collect();
        self.write("etc/modprobe.d/kiln-test-idle.conf", blacklist, 0o644)?;
        self.write(
            "etc/modules-load.d/kiln-test-nic.conf",
            "virtio_net\n",
            0o644,
        )?;
        Ok(())
    }

    /// Builds the ext4 root disk with `free_mib` spare.
    pub fn into_disk(self, image: &Path, free_mib: u64) -> Result<PathBuf> {
        disk::make_ext4(&self.dir, image, "root", free_mib)?;
        Ok(image.to_path_buf())
    }
}

/// Units of the Debian base that no boot test reads and that cost a one-vCPU TCG guest CPU
/// while it boots (timers of maintenance jobs, a filesystem scrub's reaper, logins). None of
/// them is kiln's or a dependency of kiln's units; [`Root::trim_for_tests`] masks them.
pub const IDLE_UNITS: &[&str] = &[
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "systemd-logind.service",
    "systemd-user-sessions.service",
];

/// Kernel modules udev would load for features of the emulated CPU (KVM, AES-NI, CLMUL)
/// that nothing in a boot test uses.
pub const IDLE_MODULES: &[&str] = &["kvm_amd", "kvm_intel", "aesni_intel", "ghash_clmulni_intel"];

/// The guest's address on QEMU's restricted user network, set statically: the one QEMU's
/// DHCP server hands out first (`dhcpstart`, vm.rs), with its gateway and DNS. A boot test's
/// node reads its IP from metadata; only the harness's own test (`tests/boot.rs`) asserts
/// the DHCP lease, and its base keeps DHCP. No address conflict detection: networkd probes an
/// address in 169.254.0.0/16 for seconds by default (RFC 5227), and QEMU's user network has
/// no other host.
pub const STATIC_NETWORK: &str = "[Match]\nName=en* eth*\n\n\
    [Network]\nLinkLocalAddressing=no\nIPv6AcceptRA=no\nGateway=169.254.169.2\nDNS=169.254.169.3\n\n\
    [Address]\nAddress=169.254.169.15/24\nScope=global\nDuplicateAddressDetection=none\n";

/// A oneshot unit that runs a bash script with its output on the serial console (`ttyS0`),
/// then powers the guest off.
pub fn console_unit(description: &str, after: &str, script: &str) -> String {
    console_unit_on("ttyS0", description, after, script)
}

/// [`console_unit`] on the serial console `tty` (`ttyAMA0` on arm64's virt board).
pub fn console_unit_on(tty: &str, description: &str, after: &str, script: &str) -> String {
    format!(
        "[Unit]\nDescription={description}\nAfter={after}\nWants={after}\n\n\
         [Service]\nType=oneshot\nStandardOutput=tty\nStandardError=tty\nTTYPath=/dev/{tty}\n\
         ExecStart=/bin/bash -c {}\nExecStopPost=/bin/systemctl poweroff --no-block\n",
        systemd_quote(script)
    )
}

/// Quotes a string as one systemd `ExecStart=` word: double quotes, with `\`, `"` escaped,
/// `$` doubled (systemd's own variable syntax) and `%` doubled (specifiers).
pub fn systemd_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '$' => out.push_str("$$"),
            '%' => out.push_str("%%"),
            '\n' => out.push_str("; "),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_keeps_shell_text_intact_for_systemd() {
        assert_eq!(
            systemd_quote(r#"echo "a $B" 100%"#),
            r#""echo \"a $$B\" 100%%""#
        );
        assert_eq!(systemd_quote("a\nb"), "\"a; b\"");
    }

    #[test]
    fn units_are_enabled_with_a_wants_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root {
            dir: tmp.path().to_path_buf(),
        };
        root.add_unit("x.service", "[Unit]\n", "multi-user.target")
            .unwrap();
        let link = tmp
            .path()
            .join("etc/systemd/system/multi-user.target.wants/x.service");
        assert_eq!(
            std::fs::read_link(link).unwrap(),
            Path::new("/etc/systemd/system/x.service")
        );
    }
}
