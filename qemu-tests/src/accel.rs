//! Chooses QEMU's accelerator. `/dev/kvm` on these machines can be a software stand-in
//! (`kvm_pvm`) under which unmodified guests crash or stall, and `-accel kvm -accel tcg`
//! does not fall back because KVM opens fine; so KVM is used only when it is really usable.

use std::path::Path;

/// The accelerator a VM runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation (`-accel kvm -cpu host`).
    Kvm,
    /// Software emulation (`-accel tcg -cpu max`).
    Tcg,
}

impl Accel {
    /// QEMU arguments for this accelerator.
    pub fn qemu_args(self) -> &'static [&'static str] {
        match self {
            Accel::Kvm => &["-accel", "kvm", "-cpu", "host"],
            // One translation-block cache size that fits many parallel VMs in memory.
            Accel::Tcg => &["-accel", "tcg,tb-size=64", "-cpu", "max"],
        }
    }

    /// The name used in logs and in `KILN_QEMU_ACCEL`.
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// What the host offers, read from the files that tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// `/dev/kvm` opens read/write.
    pub kvm_rw: bool,
    /// `/proc/cpuinfo` flags include `vmx` or `svm`.
    pub cpu_virt: bool,
    /// The `kvm_pvm` software stand-in is loaded (or `/proc/modules` cannot be read, in
    /// which case it cannot be ruled out).
    pub pvm_or_unknown: bool,
}

impl HostFacts {
    /// Reads the facts of this host.
    pub fn read() -> Self {
        let kvm_rw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let modules = std::fs::read_to_string("/proc/modules").ok();
        HostFacts {
            kvm_rw,
            cpu_virt: cpu_has_virt(&cpuinfo),
            pvm_or_unknown: modules.is_none_or(|m| has_module(&m, "kvm_pvm"))
                || Path::new("/sys/module/kvm_pvm").exists(),
        }
    }

    /// Whether KVM is worth a probe boot.
    pub fn kvm_candidate(&self) -> bool {
        self.kvm_rw && self.cpu_virt && !self.pvm_or_unknown
    }
}

/// True when a `flags` line of `/proc/cpuinfo` names `vmx` or `svm`.
pub fn cpu_has_virt(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

/// True when `/proc/modules` text lists the module.
pub fn has_module(proc_modules: &str, name: &str) -> bool {
    proc_modules
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

/// Parses `KILN_QEMU_ACCEL`: `kvm`, `tcg`, or `auto`/empty for detection.
pub fn parse_override(value: Option<&str>) -> Result<Option<Accel>, String> {
    match value.map(str::trim) {
        None | Some("") | Some("auto") => Ok(None),
        Some("kvm") => Ok(Some(Accel::Kvm)),
        Some("tcg") => Ok(Some(Accel::Tcg)),
        Some(other) => Err(format!(
            "KILN_QEMU_ACCEL={other:?}: expected kvm, tcg or auto"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virt_flags_are_found_only_in_flags_lines() {
        let cases = [
            ("flags\t\t: fpu vme de pse vmx sse", true),
            ("flags\t\t: fpu svm", true),
            ("flags\t\t: fpu vme hypervisor", false),
            ("model name\t: vmx-like cpu\nflags\t\t: fpu", false),
            ("", false),
        ];
        for (text, want) in cases {
            assert_eq!(cpu_has_virt(text), want, "{text:?}");
        }
    }

    #[test]
    fn pvm_module_is_detected() {
        let m = "kvm_pvm 4096 0 - Live 0x0\nkvm 1000 1 kvm_pvm, Live 0x0\n";
        assert!(has_module(m, "kvm_pvm"));
        assert!(!has_module("kvm_intel 1 0 - Live 0x0\n", "kvm_pvm"));
        let facts = HostFacts {
            kvm_rw: true,
            cpu_virt: true,
            pvm_or_unknown: true,
        };
        assert!(!facts.kvm_candidate());
    }

    #[test]
    fn override_values() {
        assert_eq!(parse_override(None), Ok(None));
        assert_eq!(parse_override(Some("auto")), Ok(None));
        assert_eq!(parse_override(Some("tcg")), Ok(Some(Accel::Tcg)));
        assert_eq!(parse_override(Some("kvm")), Ok(Some(Accel::Kvm)));
        assert!(parse_override(Some("hvf")).is_err());
    }
}
