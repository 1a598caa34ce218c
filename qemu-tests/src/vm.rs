//! One QEMU guest: the command line (architecture and board, accelerator, kernel, disks,
//! fw_cfg, SMBIOS, the restricted link-local network with its metadata forward), the serial
//! console, deadlines that fail with the console's tail, and a kill when the test drops it.
//!
//! The network is the only safe way to give a guest a metadata server here: user networking
//! with `restrict=on` in 169.254.169.0/24, so the guest can reach nothing but the forward of
//! 169.254.169.254:80 to a relay into a loopback port. The guest never reaches a real
//! metadata service.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::accel::{self, Accel, HostFacts};
use crate::arch::Arch;
use crate::assets::Assets;
use crate::console::{Console, Line};
use crate::{io_err, Error, Result};

/// The QEMU binary for `arch`, overridable with `KILN_QEMU` (amd64) or `KILN_QEMU_AARCH64`.
pub fn qemu_binary(arch: Arch) -> Result<PathBuf> {
    let name =
        std::env::var(arch.qemu_override_var()).unwrap_or_else(|_| arch.qemu_system().into());
    let found = if name.contains('/') {
        Some(PathBuf::from(&name)).filter(|p| p.is_file())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(&name))
                .find(|p| p.is_file())
        })
    };
    found.ok_or_else(|| Error::Missing {
        what: format!("QEMU ({name})"),
        hint: "install it with `make deps-qemu` (scripts/deps.sh qemu); the boot tests never skip"
            .into(),
    })
}

/// What one guest boots with.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// The guest architecture (from the assets): picks the emulator, board and console.
    pub arch: Arch,
    /// Kernel image.
    pub kernel: PathBuf,
    /// Initramfs.
    pub initrd: PathBuf,
    /// Extra kernel arguments after the harness's own.
    pub cmdline: String,
    /// Root disk (ext4), attached first as `/dev/vda` with `snapshot=on`.
    pub root: Option<PathBuf>,
    /// The root disk's format (`raw` unless a test boots a converted image).
    pub root_format: &'static str,
    /// Boot the root disk through its own bootloader (the firmware's, SeaBIOS on amd64):
    /// no `-kernel`, `-initrd` or `-append`.
    pub from_disk: bool,
    /// A firmware image instead of the board's default (`-bios`; OVMF for a UEFI boot).
    pub firmware: Option<PathBuf>,
    /// Further read-only disks (`/dev/vdb`, …).
    pub extra_disks: Vec<PathBuf>,
    /// Guest memory.
    pub memory_mib: u32,
    /// Virtual CPUs: 1, or `KILN_QEMU_CPUS` (the boot benchmark's node size).
    pub cpus: u32,
    /// The loopback port 169.254.169.254:80 is forwarded to.
    pub metadata_port: Option<u16>,
    /// The loopback port [`MIRROR_ADDR`] is forwarded to: an update mirror the guest reaches
    /// (with neither forward the guest has no NIC at all).
    pub mirror_port: Option<u16>,
    /// fw_cfg entries: (name, file), e.g. `opt/kiln/instance-id`.
    pub fw_cfg: Vec<(String, PathBuf)>,
    /// `-smbios` values, e.g. `type=1,manufacturer=Amazon EC2`.
    pub smbios: Vec<String>,
    /// Where the console log is written.
    pub log: PathBuf,
}

/// `KILN_QEMU_CPUS` (a positive number), else 1: `make test` runs two one-CPU guests at a
/// time on its two cores; `bench/boot.sh` sizes guests as nodes are sized.
pub fn guest_cpus() -> u32 {
    std::env::var("KILN_QEMU_CPUS")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1)
}

impl VmConfig {
    /// A guest from the cached assets with no disk, network or extras yet.
    pub fn new(assets: &Assets, log: impl Into<PathBuf>) -> Self {
        VmConfig {
            arch: assets.arch,
            kernel: assets.kernel.clone(),
            initrd: assets.initrd.clone(),
            cmdline: String::new(),
            root: None,
            root_format: "raw",
            from_disk: false,
            firmware: None,
            extra_disks: Vec::new(),
            memory_mib: 1024,
            cpus: guest_cpus(),
            metadata_port: None,
            mirror_port: None,
            fw_cfg: Vec::new(),
            smbios: Vec::new(),
            log: log.into(),
        }
    }

    /// The QEMU arguments (without the binary) for this guest under `accel`.
    pub fn qemu_args(&self, accel: Accel, relay: &Path) -> Vec<String> {
        let mut a: Vec<String> = [
            "-nodefaults",
            "-nographic",
            "-no-reboot",
            "-no-user-config",
            "-monitor",
            "none",
            "-serial",
            "stdio",
            "-machine",
            self.arch.machine(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(self.arch.accel_args(accel).iter().map(|s| s.to_string()));
        a.extend([
            "-m".into(),
            self.memory_mib.to_string(),
            "-smp".into(),
            self.cpus.to_string(),
        ]);
        if let Some(fw) = &self.firmware {
            a.extend(["-bios".into(), path(fw)]);
        }
        if !self.from_disk {
            a.extend([
                "-kernel".into(),
                path(&self.kernel),
                "-initrd".into(),
                path(&self.initrd),
            ]);
            let mut cmdline = format!(
                "console={} panic=-1 root=/dev/vda rootfstype=ext4",
                self.arch.console()
            );
            if !self.cmdline.is_empty() {
                cmdline.push(' ');
                cmdline.push_str(&self.cmdline);
            }
            a.extend(["-append".into(), cmdline]);
        }
        if let Some(root) = &self.root {
            a.extend([
                "-drive".into(),
                format!(
                    "file={},format={},if=virtio,snapshot=on",
                    escape(&path(root)),
                    self.root_format
                ),
            ]);
        }
        for d in &self.extra_disks {
            a.extend([
                "-drive".into(),
                format!("file={},format=raw,if=virtio,readonly=on", escape(&path(d))),
            ]);
        }
        let forwards: Vec<(&str, u16)> = [
            self.metadata_port.map(|p| (METADATA_ADDR, p)),
            self.mirror_port.map(|p| (MIRROR_ADDR, p)),
        ]
        .into_iter()
        .flatten()
        .collect();
        if forwards.is_empty() {
            a.extend(["-nic".into(), "none".into()]);
        } else {
            a.extend([
                "-netdev".into(),
                netdev(&path(relay), &forwards),
                "-device".into(),
                // No option ROM: nothing boots from the network, and SeaBIOS would load and
                // run iPXE's ROM on every boot.
                "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56,romfile=".into(),
            ]);
        }
        for (name, file) in &self.fw_cfg {
            a.extend([
                "-fw_cfg".into(),
                format!("name={name},file={}", escape(&path(file))),
            ]);
        }
        for s in &self.smbios {
            a.extend(["-smbios".into(), s.clone()]);
        }
        a
    }
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// QEMU option values double a comma to mean a literal one.
fn escape(v: &str) -> String {
    v.replace(',', ",,")
}

/// The metadata address the guest reaches through the forward.
pub const METADATA_ADDR: &str = "169.254.169.254:80";
/// The address of the update mirror a guest reaches through a forward (the Flatcar
/// scenario's systemd-sysupdate source); inside the restricted network, never routed.
pub const MIRROR_ADDR: &str = "169.254.169.80:80";

/// The restricted user network in the link-local range: DHCP hands out 169.254.169.15+, the
/// guest's only reachable services are the `forwards` (guest `ip:port` → loopback port, each
/// through the relay).
pub fn netdev(relay: &str, forwards: &[(&str, u16)]) -> String {
    let mut n = "user,id=n0,restrict=on,net=169.254.169.0/24,host=169.254.169.2,dns=169.254.169.3,\
         dhcpstart=169.254.169.15"
        .to_string();
    for (guest, port) in forwards {
        n.push_str(&format!(
            ",guestfwd=tcp:{guest}-cmd:{} 127.0.0.1 {port}",
            escape(relay)
        ));
    }
    n
}

/// The relay binary QEMU runs per guest connection. Tests find it next to themselves
/// (cargo builds the crate's binaries for its integration tests).
pub fn relay_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_QEMU_RELAY") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe().map_err(io_err("/proc/self/exe"))?;
    // target/<profile>/deps/boot-<hash> → target/<profile>/kiln-qemu-relay
    let candidates = exe
        .ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("kiln-qemu-relay"))
        .collect::<Vec<_>>();
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| Error::Missing {
            what: "the kiln-qemu-relay binary".into(),
            hint: format!(
                "build it with `cargo build -p kiln-qemu-tests` (looked in {candidates:?}) or set KILN_QEMU_RELAY"
            ),
        })
}

/// The accelerator for this process: `KILN_QEMU_ACCEL` if set, else KVM only when the host
/// really offers it and a probe boot reaches the initramfs, else TCG. A guest of another
/// architecture than the host's is always TCG.
pub fn accelerator(assets: &Assets) -> Result<Accel> {
    if !assets.arch.is_host() {
        return Ok(Accel::Tcg);
    }
    static CHOSEN: OnceLock<std::result::Result<Accel, String>> = OnceLock::new();
    CHOSEN
        .get_or_init(|| {
            let forced = accel::parse_override(std::env::var("KILN_QEMU_ACCEL").ok().as_deref())?;
            if let Some(a) = forced {
                return Ok(a);
            }
            if !HostFacts::read().kvm_candidate() {
                return Ok(Accel::Tcg);
            }
            Ok(if probe_kvm(assets) {
                Accel::Kvm
            } else {
                Accel::Tcg
            })
        })
        .clone()
        .map_err(|hint| Error::Missing {
            what: "a valid accelerator".into(),
            hint,
        })
}

/// A tiny KVM boot with no disk: the initramfs prints its first line within seconds on
/// working KVM; a stand-in KVM stalls or crashes before that.
fn probe_kvm(assets: &Assets) -> bool {
    let Ok(dir) = tempfile::tempdir() else {
        return false;
    };
    let cfg = VmConfig::new(assets, dir.path().join("probe.log"));
    let Ok(vm) = Vm::start_with(&cfg, Accel::Kvm) else {
        return false;
    };
    vm.wait_for(
        "the KVM probe's initramfs line",
        Duration::from_secs(20),
        |l| l.starts_with("kiln-initramfs:"),
    )
    .is_ok()
}

/// A running guest. Dropping it kills QEMU.
#[derive(Debug)]
pub struct Vm {
    child: Child,
    console: Console,
    accel: Accel,
}

impl Vm {
    /// Starts QEMU for `cfg` with the process's accelerator.
    pub fn start(cfg: &VmConfig, assets: &Assets) -> Result<Vm> {
        Vm::start_with(cfg, accelerator(assets)?)
    }

    /// Starts QEMU for `cfg` with `accel`.
    pub fn start_with(cfg: &VmConfig, accel: Accel) -> Result<Vm> {
        let qemu = qemu_binary(cfg.arch)?;
        let relay = if cfg.metadata_port.is_some() || cfg.mirror_port.is_some() {
            relay_binary()?
        } else {
            PathBuf::new()
        };
        let log = File::create(&cfg.log).map_err(io_err(&cfg.log))?;
        let log_err = log.try_clone().map_err(io_err(&cfg.log))?;
        // setpriv's parent-death signal kills QEMU even when the test process is killed
        // outright and its destructors never run.
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--"])
            .arg(&qemu)
            .args(cfg.qemu_args(accel, &relay))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_err));
        let started = Instant::now();
        let mut child = cmd.spawn().map_err(|e| Error::Command {
            command: format!("setpriv {}", qemu.display()),
            detail: format!("could not start: {e}"),
        })?;
        let console = Console::new(started);
        let stdout = child.stdout.take().ok_or_else(|| Error::Command {
            command: qemu.display().to_string(),
            detail: "no stdout pipe".into(),
        })?;
        console.feed(stdout, Some(log));
        Ok(Vm {
            child,
            console,
            accel,
        })
    }

    /// QEMU's process id (setpriv execs QEMU in place).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The accelerator this guest runs with.
    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// The console so far.
    pub fn console(&self) -> &Console {
        &self.console
    }

    /// Waits for a console line matching `pred`; on timeout kills QEMU and fails with the last
    /// 50 lines; fails the same way when QEMU exits first.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<Line> {
        match self.console.wait_for(pred, Instant::now() + timeout) {
            Ok(line) => Ok(line),
            Err(closed) => {
                let tail = self.console.tail(50);
                if closed {
                    Err(Error::Exited {
                        what: what.into(),
                        status: "console closed".into(),
                        tail,
                    })
                } else {
                    Err(Error::Timeout {
                        what: what.into(),
                        secs: timeout.as_secs(),
                        tail,
                    })
                }
            }
        }
    }

    /// Waits for the guest to power off (QEMU exits); kills it at the deadline.
    pub fn wait_poweroff(&mut self, timeout: Duration) -> Result<()> {
        if self.console.wait_closed(Instant::now() + timeout) {
            let _ = self.child.wait();
            return Ok(());
        }
        self.kill();
        Err(Error::Timeout {
            what: "guest power-off".into(),
            secs: timeout.as_secs(),
            tail: self.console.tail(50),
        })
    }

    /// Kills QEMU now (idempotent).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netdev_is_restricted_and_forwards_only_the_metadata_address() {
        let n = netdev("/t/kiln-qemu-relay", &[(METADATA_ADDR, 4242)]);
        assert!(n.contains("restrict=on"), "{n}");
        assert!(n.contains("net=169.254.169.0/24"), "{n}");
        assert!(
            n.ends_with("guestfwd=tcp:169.254.169.254:80-cmd:/t/kiln-qemu-relay 127.0.0.1 4242"),
            "{n}"
        );
        assert_eq!(
            netdev("/a,b/relay", &[(METADATA_ADDR, 1)])
                .matches("/a,,b/relay")
                .count(),
            1
        );
        let both = netdev("/r", &[(METADATA_ADDR, 1), (MIRROR_ADDR, 2)]);
        assert!(
            both.ends_with(
                "guestfwd=tcp:169.254.169.254:80-cmd:/r 127.0.0.1 1,guestfwd=tcp:169.254.169.80:80-cmd:/r 127.0.0.1 2"
            ),
            "{both}"
        );
    }

    #[test]
    fn no_network_means_no_nic() {
        let assets = Assets {
            arch: Arch::Amd64,
            kernel: "/k".into(),
            initrd: "/i".into(),
            kver: "x".into(),
            base: "/b".into(),
            base_cloudinit: "/bc".into(),
        };
        let cfg = VmConfig::new(&assets, "/tmp/log");
        let args = cfg.qemu_args(Accel::Tcg, Path::new("/r"));
        let nic = args.iter().position(|a| a == "-nic").unwrap();
        assert_eq!(args[nic + 1], "none");
        assert!(!args.iter().any(|a| a.contains("guestfwd")));
        assert!(args
            .windows(2)
            .any(|w| w[0] == "-accel" && w[1].starts_with("tcg")));
        assert!(args.windows(2).any(|w| w == ["-machine", "q35"]));
        let append = args.iter().position(|a| a == "-append").unwrap();
        assert!(args[append + 1].starts_with("console=ttyS0 "), "{args:?}");
    }

    #[test]
    fn arm64_boots_virt_on_its_pl011_with_the_same_restricted_network() {
        let assets = Assets {
            arch: Arch::Arm64,
            kernel: "/k".into(),
            initrd: "/i".into(),
            kver: "6.1.0-56-cloud-arm64".into(),
            base: "/b".into(),
            base_cloudinit: "".into(),
        };
        let mut cfg = VmConfig::new(&assets, "/tmp/log");
        cfg.metadata_port = Some(4242);
        cfg.root = Some("/d/root.ext4".into());
        let args = cfg.qemu_args(Accel::Kvm, Path::new("/r/kiln-qemu-relay"));
        assert!(
            args.windows(2).any(|w| w == ["-machine", "virt"]),
            "{args:?}"
        );
        // Emulated whatever was chosen for amd64 guests.
        assert!(
            args.windows(2).any(|w| w == ["-accel", "tcg,tb-size=64"]),
            "{args:?}"
        );
        assert!(!args.iter().any(|a| a == "kvm"), "{args:?}");
        let append = args.iter().position(|a| a == "-append").unwrap();
        assert!(args[append + 1].starts_with("console=ttyAMA0 "), "{args:?}");
        let netdev = args.iter().position(|a| a == "-netdev").unwrap();
        assert!(args[netdev + 1].contains("restrict=on"), "{args:?}");
        assert!(args[netdev + 1].contains("127.0.0.1 4242"), "{args:?}");
        assert!(
            args.iter()
                .any(|a| a.starts_with("virtio-net-pci,") && a.ends_with(",romfile=")),
            "{args:?}"
        );
    }
}
