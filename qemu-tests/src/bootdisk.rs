//! A bootable base disk image, standing in for a cloud vendor's image: a GPT disk whose root
//! partition (Ubuntu's and Debian's cloud images: 1, `cloudimg-rootfs`; Flatcar's: 9, `ROOT`)
//! is ext4 holding the kernel, initramfs and GRUB's configuration under `/boot`. Two ways in:
//!
//! - **BIOS** (the Ubuntu layout): the BIOS boot partition (14) holds GRUB's core image, with
//!   GRUB's boot sector in the protective MBR. QEMU's default firmware (SeaBIOS) boots it like
//!   any PC BIOS.
//! - **UEFI only** (the Flatcar layout): an EFI system partition (1, `EFI-SYSTEM`, FAT) holds
//!   GRUB's EFI image at the removable-media path `\EFI\BOOT\BOOTX64.EFI` (UEFI spec 2.10,
//!   section 3.5.1.1), which the firmware (OVMF, Debian's `ovmf`) starts with no boot entry;
//!   there is no BIOS boot partition, so nothing else can boot it.
//!
//! Either way: no `-kernel`, nothing from the host but the disk (and the firmware).
//!
//! Built without root and without loop devices: `sfdisk` writes the table into the file,
//! `mkfs.ext4 -E offset=… -d` the root filesystem into partition 1, Debian's `grub-mkimage`
//! (grub-pc-bin) the core image, and this module does the three patches `grub-bios-setup`
//! would (Debian ships that tool only in grub-pc, whose maintainer scripts would install GRUB
//! on the host's own disk). Offsets are GRUB 2.06's, from `include/grub/i386/pc/boot.h`
//! (`GRUB_BOOT_MACHINE_KERNEL_SECTOR` 0x5c, `GRUB_BOOT_MACHINE_DRIVE_CHECK` 0x66,
//! `GRUB_BOOT_MACHINE_WINDOWS_NT_MAGIC` 0x1b8, `GRUB_BOOT_MACHINE_LIST_SIZE` 12) and
//! `util/setup.c` (the first block list entry sits at the end of core.img's first sector;
//! on a hard disk the drive check's jump is replaced by two NOPs).

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::arch::Arch;
use crate::assets::Assets;
use crate::guest::Root;
use crate::{disk, io_err, run, Error, Result};

const SECTOR: u64 = 512;
/// The boot partition (BIOS boot, or the ESP) starts at sector 2048; the root right after it.
const BIOS_BOOT_START: u64 = 2048;
/// The BIOS boot partition: 4 MiB.
const BIOS_BOOT_SECTORS: u64 = 8192;
/// The EFI system partition: 32 MiB (FAT16).
const ESP_SECTORS: u64 = 65536;
/// GPT type GUIDs: Linux filesystem data, BIOS boot (UEFI spec / util-linux's table),
/// Flatcar's root (`ROOT`, Flatcar's `build_library/disk_layout.json`).
const LINUX_FS: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";
const BIOS_BOOT: &str = "21686148-6449-6E6F-744E-656564454649";
const FLATCAR_ROOT: &str = "3884DD41-8582-4404-B9A8-E9B84F2DF50E";
const ESP: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";

/// How the firmware finds the bootloader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Firmware {
    /// A PC BIOS (SeaBIOS): GRUB's boot sector and core image.
    Bios,
    /// UEFI only (OVMF): GRUB's EFI image on the EFI system partition.
    Uefi,
}

/// The UEFI firmware image QEMU boots with `-bios` (Debian's `ovmf`).
pub const OVMF: &str = "/usr/share/ovmf/OVMF.fd";

/// Where a vendor puts the root and the BIOS boot partition, and how it names the root.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// The root partition's number.
    pub root: u32,
    /// Its GPT name and ext4 label (what `kiln image` finds it by).
    pub label: &'static str,
    /// Its GPT type.
    root_type: &'static str,
    /// The boot partition's number: BIOS boot, or the ESP.
    boot: u32,
    /// How the disk boots.
    pub firmware: Firmware,
}

/// Ubuntu's (and Debian's) cloud images: root 1 `cloudimg-rootfs`, BIOS boot 14.
pub const UBUNTU: Layout = Layout {
    root: 1,
    label: "cloudimg-rootfs",
    root_type: LINUX_FS,
    boot: 14,
    firmware: Firmware::Bios,
};

/// Flatcar's numbering, booted UEFI only: EFI-SYSTEM 1, ROOT 9 with Flatcar's root type.
/// (A real Flatcar disk also has BIOS-BOOT 2, the USR-A/B and OEM partitions and a
/// read-only `/usr`; this stand-in keeps the Debian userland on ROOT, as the other Flatcar
/// scenarios do, and leaves BIOS out so that only UEFI can boot it.)
pub const FLATCAR: Layout = Layout {
    root: 9,
    label: "ROOT",
    root_type: FLATCAR_ROOT,
    boot: 1,
    firmware: Firmware::Uefi,
};

/// The GRUB modules the core image carries: enough to read the GPT and ext4, parse
/// grub.cfg and boot a Linux kernel, so `/boot/grub` needs nothing but grub.cfg.
const GRUB_MODULES: &[&str] = &[
    "biosdisk",
    "part_gpt",
    "ext2",
    "normal",
    "linux",
    "configfile",
    "echo",
];
const GRUB_DIR: &str = "/usr/lib/grub/i386-pc";
/// GRUB's EFI modules (Debian's `grub-efi-amd64-bin`).
const GRUB_EFI_DIR: &str = "/usr/lib/grub/x86_64-efi";

/// The kernel command line the vendor image's grub.cfg boots with (the same the `-kernel`
/// boots get, with the root on the layout's partition).
pub fn kernel_cmdline(arch: Arch, layout: Layout) -> String {
    format!(
        "console={} panic=-1 root=/dev/vda{} rootfstype=ext4",
        arch.console(),
        layout.root
    )
}

/// Turns a prepared guest root into a bootable raw disk at `out` laid out as `layout`: the
/// assets' kernel and initramfs in `/boot`, a grub.cfg, an fstab naming the root by label,
/// `free_mib` to spare.
pub fn vendor_disk(
    root: Root,
    assets: &Assets,
    layout: Layout,
    out: &Path,
    free_mib: u64,
) -> Result<PathBuf> {
    if assets.arch != Arch::Amd64 {
        return Err(Error::Missing {
            what: "a BIOS boot disk for this architecture".into(),
            hint: "the vendor-style disk boots through SeaBIOS, amd64 only".into(),
        });
    }
    let needed = match layout.firmware {
        Firmware::Bios => Path::new(GRUB_DIR).join("boot.img"),
        Firmware::Uefi => Path::new(GRUB_EFI_DIR).join("linux.mod"),
    };
    if !needed.is_file() {
        return Err(Error::Missing {
            what: format!("GRUB's boot files ({})", needed.display()),
            hint: "install grub-pc-bin, grub-efi-amd64-bin and grub2-common with `make deps-qemu` (scripts/deps.sh qemu)"
                .into(),
        });
    }
    let copy = |from: &Path, to: &str| -> Result<()> {
        let bytes = std::fs::read(from).map_err(io_err(from))?;
        root.write(to, bytes, 0o644).map(drop)
    };
    copy(&assets.kernel, "boot/vmlinuz")?;
    copy(&assets.initrd, "boot/initrd.img")?;
    root.write(
        "boot/grub/grub.cfg",
        format!(
            "set timeout=0\nlinux /boot/vmlinuz {}\ninitrd /boot/initrd.img\nboot\n",
            kernel_cmdline(assets.arch, layout)
        ),
        0o644,
    )?;
    root.write(
        "etc/fstab",
        format!("LABEL={} / ext4 rw,relatime 0 1\n", layout.label),
        0o644,
    )?;

    let boot_sectors = match layout.firmware {
        Firmware::Bios => BIOS_BOOT_SECTORS,
        Firmware::Uefi => ESP_SECTORS,
    };
    let root_start = BIOS_BOOT_START + boot_sectors;
    let used = disk::tree_bytes(&root.dir)?;
    let fs_mib = (used + used / 8) / (1 << 20) + free_mib + 16;
    let fs_sectors = fs_mib << 11;
    // The backup GPT takes the last 33 sectors; leave a whole MiB.
    let total = (root_start + fs_sectors + 2048) * SECTOR;
    let f = std::fs::File::create(out).map_err(io_err(out))?;
    f.set_len(total).map_err(io_err(out))?;
    drop(f);
    let (boot_type, boot_name) = match layout.firmware {
        Firmware::Bios => (BIOS_BOOT, "BIOS-BOOT"),
        Firmware::Uefi => (ESP, "EFI-SYSTEM"),
    };
    let table = format!(
        "label: gpt\n\
         part{} : start={root_start}, size={fs_sectors}, type={}, name=\"{}\"\n\
         part{} : start={BIOS_BOOT_START}, size={boot_sectors}, type={boot_type}, name=\"{boot_name}\"\n",
        layout.root, layout.root_type, layout.label, layout.boot
    );
    run_stdin(Command::new("sfdisk").arg("-q").arg(out), &table)?;
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", layout.label, "-E"])
        .arg(format!("root_owner=0:0,offset={}", root_start * SECTOR))
        .arg("-d")
        .arg(&root.dir)
        .arg(out)
        .arg(format!("{fs_mib}M")))?;
    match layout.firmware {
        Firmware::Bios => install_grub(out, layout)?,
        Firmware::Uefi => install_grub_efi(out, layout)?,
    }
    Ok(out.to_path_buf())
}

/// GRUB's EFI image, at the removable-media path of a FAT filesystem made in a file
/// (`mkfs.vfat -C`, then mtools: no mount), copied into the ESP.
fn install_grub_efi(disk: &Path, layout: Layout) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let efi = dir.path().join("BOOTX64.EFI");
    run(Command::new("grub-mkimage")
        .args(["-O", "x86_64-efi", "-d", GRUB_EFI_DIR, "-p"])
        .arg(format!("(hd0,gpt{})/boot/grub", layout.root))
        .arg("-o")
        .arg(&efi)
        .args(GRUB_EFI_MODULES))?;
    let fat = dir.path().join("esp.img");
    run(Command::new("mkfs.vfat")
        .args(["-C", "-n", "EFI-SYSTEM"])
        .arg(&fat)
        .arg((ESP_SECTORS / 2).to_string()))?;
    let img = fat.display().to_string();
    run(Command::new("mmd").args(["-i", &img, "::/EFI", "::/EFI/BOOT"]))?;
    run(Command::new("mcopy")
        .args(["-i", &img])
        .arg(&efi)
        .arg("::/EFI/BOOT/BOOTX64.EFI"))?;
    let bytes = std::fs::read(&fat).map_err(io_err(&fat))?;
    let mut f = OpenOptions::new()
        .write(true)
        .open(disk)
        .map_err(io_err(disk))?;
    f.seek(SeekFrom::Start(BIOS_BOOT_START * SECTOR))
        .and_then(|_| f.write_all(&bytes))
        .and_then(|_| f.sync_all())
        .map_err(io_err(disk))
}

/// The modules GRUB's EFI image carries (the BIOS set, with the EFI disk driver built in).
const GRUB_EFI_MODULES: &[&str] = &["part_gpt", "ext2", "normal", "linux", "configfile", "echo"];

/// GRUB's core image into the BIOS boot partition and its boot sector into the MBR, as
/// `grub-bios-setup` places them.
fn install_grub(disk: &Path, layout: Layout) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let core_path = dir.path().join("core.img");
    run(Command::new("grub-mkimage")
        .args(["-O", "i386-pc", "-d", GRUB_DIR, "-p"])
        .arg(format!("(hd0,gpt{})/boot/grub", layout.root))
        .arg("-o")
        .arg(&core_path)
        .args(GRUB_MODULES))?;
    let mut core = std::fs::read(&core_path).map_err(io_err(&core_path))?;
    let sectors = (core.len() as u64).div_ceil(SECTOR);
    if sectors > BIOS_BOOT_SECTORS {
        return Err(Error::Command {
            command: "grub-mkimage".into(),
            detail: format!(
                "core image is {sectors} sectors, the BIOS boot partition {BIOS_BOOT_SECTORS}"
            ),
        });
    }
    core.resize((sectors * SECTOR) as usize, 0);
    // util/setup.c: the first block list entry is the last 12 bytes of core.img's first
    // sector (diskboot.img): the rest of the core image starts one sector on and is
    // `sectors - 1` long; its load segment (the third field) keeps diskboot.img's default.
    let list = SECTOR as usize - 12;
    core[list..list + 8].copy_from_slice(&(BIOS_BOOT_START + 1).to_le_bytes());
    core[list + 8..list + 10].copy_from_slice(&((sectors - 1) as u16).to_le_bytes());

    let boot_img = Path::new(GRUB_DIR).join("boot.img");
    let mut boot = std::fs::read(&boot_img).map_err(io_err(&boot_img))?;
    if boot.len() != SECTOR as usize {
        return Err(Error::Command {
            command: boot_img.display().to_string(),
            detail: format!(
                "expected a 512-byte boot sector, found {} bytes",
                boot.len()
            ),
        });
    }
    // boot.h: KERNEL_SECTOR (0x5c) is the LBA of core.img's first sector; DRIVE_CHECK (0x66)
    // gets two NOPs on a hard disk. Only the code before WINDOWS_NT_MAGIC (0x1b8) is written,
    // so the protective MBR's partition entry and signature stay as sfdisk wrote them.
    boot[0x5c..0x64].copy_from_slice(&BIOS_BOOT_START.to_le_bytes());
    boot[0x66] = 0x90;
    boot[0x67] = 0x90;

    let mut f = OpenOptions::new()
        .write(true)
        .open(disk)
        .map_err(io_err(disk))?;
    f.seek(SeekFrom::Start(BIOS_BOOT_START * SECTOR))
        .and_then(|_| f.write_all(&core))
        .and_then(|_| f.seek(SeekFrom::Start(0)))
        .and_then(|_| f.write_all(&boot[..0x1b8]))
        .and_then(|_| f.sync_all())
        .map_err(io_err(disk))
}

fn run_stdin(cmd: &mut Command, input: &str) -> Result<()> {
    use std::process::Stdio;
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Command {
            command: shown.clone(),
            detail: format!("could not start: {e}"),
        })?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(input.as_bytes())
        .map_err(|e| Error::Command {
            command: shown.clone(),
            detail: e.to_string(),
        })?;
    let out = child.wait_with_output().map_err(|e| Error::Command {
        command: shown.clone(),
        detail: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(Error::Command {
            command: shown,
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}
