//! The guest architectures the boot tests boot: amd64 under `qemu-system-x86_64 -machine
//! q35`, and arm64 under `qemu-system-aarch64 -machine virt` (always software emulation on
//! this x86-64 host), each with its kernel console and the names kiln and QEMU use for it.

use crate::accel::Accel;

/// A guest architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Arch {
    /// x86-64: the host's own architecture; KVM when the host really offers it.
    #[default]
    Amd64,
    /// 64-bit Arm (Graviton, Ampere): emulated by TCG.
    Arm64,
}

impl Arch {
    /// The name kiln's `--arch` and Debian use.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// What `uname -m` prints on such a guest.
    pub fn uname_m(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }

    /// The QEMU system emulator's program name.
    pub fn qemu_system(self) -> &'static str {
        match self {
            Arch::Amd64 => "qemu-system-x86_64",
            Arch::Arm64 => "qemu-system-aarch64",
        }
    }

    /// The variable that overrides [`Arch::qemu_system`].
    pub fn qemu_override_var(self) -> &'static str {
        match self {
            Arch::Amd64 => "KILN_QEMU",
            Arch::Arm64 => "KILN_QEMU_AARCH64",
        }
    }

    /// The board: q35 on amd64; on arm64 `virt`, QEMU's PCIe board made for guests (a PL011
    /// UART, a GIC, fw_cfg and virtio-pci devices, described to the kernel by a device tree).
    pub fn machine(self) -> &'static str {
        match self {
            Arch::Amd64 => "q35",
            Arch::Arm64 => "virt",
        }
    }

    /// The serial console's device name in the guest: `-serial stdio` is the 16550 `ttyS0`
    /// on q35 and the PL011 `ttyAMA0` on virt.
    pub fn console(self) -> &'static str {
        match self {
            Arch::Amd64 => "ttyS0",
            Arch::Arm64 => "ttyAMA0",
        }
    }

    /// Whether this host runs such a guest natively (KVM is only ever tried then).
    pub fn is_host(self) -> bool {
        std::env::consts::ARCH == self.uname_m()
    }

    /// QEMU's accelerator and CPU arguments. A foreign architecture is always TCG, with
    /// `-cpu max` and the implementation-defined pointer-authentication algorithm, which
    /// TCG computes far faster than the architected QARMA5 (the guest cannot tell).
    pub fn accel_args(self, accel: Accel) -> Vec<&'static str> {
        match (self, accel) {
            (Arch::Arm64, _) => vec!["-accel", "tcg,tb-size=64", "-cpu", "max,pauth-impdef=on"],
            (Arch::Amd64, a) => a.qemu_args().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_arch_has_its_board_console_and_emulator() {
        assert_eq!(Arch::Amd64.machine(), "q35");
        assert_eq!(Arch::Arm64.machine(), "virt");
        assert_eq!(Arch::Arm64.console(), "ttyAMA0");
        assert_eq!(Arch::Arm64.qemu_system(), "qemu-system-aarch64");
        assert_eq!(Arch::Arm64.name(), "arm64");
        assert_eq!(Arch::Arm64.uname_m(), "aarch64");
        // arm64 on this host is emulated whatever the accelerator choice for amd64 was.
        let a = Arch::Arm64.accel_args(Accel::Kvm);
        assert_eq!(a[..2], ["-accel", "tcg,tb-size=64"]);
        assert!(a[3].starts_with("max"), "{a:?}");
        assert_eq!(Arch::Amd64.accel_args(Accel::Tcg), Accel::Tcg.qemu_args());
    }
}
