//! The binary gate: what a file is (ELF or PE, machine, static or dynamic, interpreter, needed
//! libraries, PE subsystem), and a check that refuses a binary whose OS or architecture does
//! not match the lock entry it came from.

use std::fmt;
use std::path::{Path, PathBuf};

use goblin::Object;
use serde::Serialize;

use crate::exit::ExitClass;
use crate::supply::lock::{Arch, Os};

/// Why a file could not be inspected or failed the gate.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Neither ELF nor PE.
    #[error("{what}: expected an ELF or PE executable, found {found}")]
    NotExecutable {
        /// The file or archive member.
        what: String,
        /// What goblin saw instead.
        found: String,
    },
    /// The OS or architecture is not the one wanted (by the lock entry, the image definition
    /// and `--arch`, or `kiln inspect --os/--arch`).
    #[error("{what}: expected a {expected_os}/{expected_arch} binary, found {found} ({detail}), so it is not used")]
    Mismatch {
        /// The file or archive member.
        what: String,
        /// The OS wanted.
        expected_os: Os,
        /// The architecture wanted.
        expected_arch: Arch,
        /// What the file is, as `os/arch`.
        found: String,
        /// Format and machine in words.
        detail: String,
    },
}

impl InspectError {
    /// A file the gate refuses exits 3; one that cannot be read is a failure.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            InspectError::Mismatch { .. } | InspectError::NotExecutable { .. } => ExitClass::Verify,
            InspectError::Read { .. } => ExitClass::Failure,
        }
    }
}

/// Executable container format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BinaryFormat {
    /// ELF (Linux).
    Elf,
    /// PE/COFF (Windows).
    Pe,
}

/// How an ELF binary is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Linkage {
    /// No interpreter and no needed libraries.
    Static,
    /// Needs the dynamic loader.
    Dynamic,
}

/// What a binary is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BinaryInfo {
    /// ELF or PE.
    pub format: BinaryFormat,
    /// The OS the format implies (ELF → linux, PE → windows).
    pub os: Os,
    /// The architecture, when it is one kiln knows.
    pub arch: Option<Arch>,
    /// The machine as named by the format (e.g. `x86-64`, `aarch64`, `i386`).
    pub machine: String,
    /// 64-bit.
    pub is_64: bool,
    /// Static or dynamic (PE: dynamic when it imports any DLL).
    pub linkage: Linkage,
    /// The ELF program interpreter, if any.
    pub interpreter: Option<String>,
    /// Needed shared libraries (ELF `DT_NEEDED`) or imported DLLs (PE).
    pub needed: Vec<String>,
    /// PE subsystem (`console`, `gui`, `native`, `efi-application`, …).
    pub subsystem: Option<String>,
    /// A shared library rather than an executable (ELF without an entry point or PE DLL).
    pub is_library: bool,
}

impl BinaryInfo {
    /// `os/arch`, with the raw machine name when the architecture is unknown to kiln.
    pub fn platform(&self) -> String {
        match self.arch {
            Some(a) => format!("{}/{}", self.os, a),
            None => format!("{}/{}", self.os, self.machine),
        }
    }

    /// Checks OS and architecture against a lock entry's; `what` names the file in errors.
    pub fn check(&self, what: &str, os: Os, arch: Arch) -> Result<(), InspectError> {
        if self.os == os && self.arch == Some(arch) {
            return Ok(());
        }
        Err(InspectError::Mismatch {
            what: what.to_string(),
            expected_os: os,
            expected_arch: arch,
            found: self.platform(),
            detail: format!("{} {}", self.format_name(), self.machine),
        })
    }

    fn format_name(&self) -> &'static str {
        match (self.format, self.is_64) {
            (BinaryFormat::Elf, true) => "ELF 64-bit",
            (BinaryFormat::Elf, false) => "ELF 32-bit",
            (BinaryFormat::Pe, true) => "PE32+",
            (BinaryFormat::Pe, false) => "PE32",
        }
    }
}

impl fmt::Display for BinaryInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} ({})",
            self.format_name(),
            self.machine,
            self.platform()
        )?;
        match self.format {
            BinaryFormat::Elf => {
                write!(
                    f,
                    ", {}",
                    match self.linkage {
                        Linkage::Static => "static",
                        Linkage::Dynamic => "dynamic",
                    }
                )?;
                if let Some(i) = &self.interpreter {
                    write!(f, ", interpreter {i}")?;
                }
            }
            BinaryFormat::Pe => {
                if let Some(s) = &self.subsystem {
                    write!(f, ", subsystem {s}")?;
                }
            }
        }
        if !self.needed.is_empty() {
            write!(f, ", needs {}", self.needed.join(" "))?;
        }
        if self.is_library {
            write!(f, ", library")?;
        }
        Ok(())
    }
}

/// Inspects the bytes of a binary; `what` names it in errors.
pub fn inspect_bytes(bytes: &[u8], what: &str) -> Result<BinaryInfo, InspectError> {
    let not_exec = |found: String| InspectError::NotExecutable {
        what: what.to_string(),
        found,
    };
    match Object::parse(bytes) {
        Ok(Object::Elf(elf)) => {
            use goblin::elf::header::{EM_386, EM_AARCH64, EM_ARM, EM_X86_64};
            let m = elf.header.e_machine;
            let arch = match m {
                EM_X86_64 => Some(Arch::Amd64),
                EM_AARCH64 => Some(Arch::Arm64),
                _ => None,
            };
            let machine = match m {
                EM_X86_64 => "x86-64".to_string(),
                EM_AARCH64 => "aarch64".to_string(),
                EM_386 => "i386".to_string(),
                EM_ARM => "arm".to_string(),
                other => goblin::elf::header::machine_to_str(other).to_lowercase(),
            };
            let interpreter = elf.interpreter.map(str::to_string);
            let needed: Vec<String> = elf.libraries.iter().map(|s| s.to_string()).collect();
            let linkage = if interpreter.is_none() && needed.is_empty() {
                Linkage::Static
            } else {
                Linkage::Dynamic
            };
            Ok(BinaryInfo {
                format: BinaryFormat::Elf,
                os: Os::Linux,
                arch,
                machine,
                is_64: elf.is_64,
                linkage,
                interpreter,
                needed,
                subsystem: None,
                is_library: elf.header.e_type == goblin::elf::header::ET_DYN
                    && elf.interpreter.is_none()
                    && elf.header.e_entry == 0,
            })
        }
        Ok(Object::PE(pe)) => {
            use goblin::pe::header::{COFF_MACHINE_ARM64, COFF_MACHINE_X86, COFF_MACHINE_X86_64};
            let m = pe.header.coff_header.machine;
            let (arch, machine) = match m {
                COFF_MACHINE_X86_64 => (Some(Arch::Amd64), "x86-64".to_string()),
                COFF_MACHINE_ARM64 => (Some(Arch::Arm64), "aarch64".to_string()),
                COFF_MACHINE_X86 => (None, "i386".to_string()),
                other => (None, format!("machine 0x{other:04x}")),
            };
            let subsystem = pe
                .header
                .optional_header
                .map(|o| subsystem_name(o.windows_fields.subsystem));
            let needed: Vec<String> = pe.libraries.iter().map(|s| s.to_string()).collect();
            Ok(BinaryInfo {
                format: BinaryFormat::Pe,
                os: Os::Windows,
                arch,
                machine,
                is_64: pe.is_64,
                linkage: if needed.is_empty() {
                    Linkage::Static
                } else {
                    Linkage::Dynamic
                },
                interpreter: None,
                needed,
                subsystem,
                is_library: pe.is_lib,
            })
        }
        Ok(Object::Mach(_)) => Err(not_exec("a Mach-O (macOS) binary".into())),
        Ok(Object::Archive(_)) => Err(not_exec("a static library archive".into())),
        Ok(_) => Err(not_exec(describe_unknown(bytes, "unknown object format"))),
        Err(e) => Err(not_exec(describe_unknown(bytes, &e.to_string()))),
    }
}

fn describe_unknown(bytes: &[u8], err: &str) -> String {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        "gzip data".into()
    } else if bytes.starts_with(b"PK\x03\x04") {
        "a zip archive".into()
    } else if bytes.starts_with(b"#!") {
        "a script".into()
    } else if bytes.is_empty() {
        "an empty file".into()
    } else {
        format!("unrecognised data ({err})")
    }
}

fn subsystem_name(s: u16) -> String {
    use goblin::pe::subsystem::*;
    match s {
        IMAGE_SUBSYSTEM_NATIVE => "native".into(),
        IMAGE_SUBSYSTEM_WINDOWS_GUI => "gui".into(),
        IMAGE_SUBSYSTEM_WINDOWS_CUI => "console".into(),
        IMAGE_SUBSYSTEM_EFI_APPLICATION => "efi-application".into(),
        other => format!("subsystem {other}"),
    }
}

/// Reads and inspects a file.
pub fn inspect_file(path: &Path) -> Result<BinaryInfo, InspectError> {
    let bytes = std::fs::read(path).map_err(|source| InspectError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    inspect_bytes(&bytes, &path.display().to_string())
}

/// The gate bake calls for every executable it takes from an artifact: it must be an
/// executable for exactly the lock entry's OS and architecture.
pub fn check_bytes(
    bytes: &[u8],
    what: &str,
    os: Os,
    arch: Arch,
) -> Result<BinaryInfo, InspectError> {
    let info = inspect_bytes(bytes, what)?;
    info.check(what, os, arch)?;
    Ok(info)
}

/// Test and fixture support: a minimal but well-formed PE32+ image for `machine` with the given
/// subsystem and no imports (what a static Windows console program's headers look like).
pub fn minimal_pe(machine: u16, subsystem: u16) -> Vec<u8> {
    let mut b = vec![0u8; 0x400];
    b[0..2].copy_from_slice(b"MZ");
    let pe_off = 0x80u32;
    b[0x3c..0x40].copy_from_slice(&pe_off.to_le_bytes());
    let p = pe_off as usize;
    b[p..p + 4].copy_from_slice(b"PE\0\0");
    let coff = p + 4;
    b[coff..coff + 2].copy_from_slice(&machine.to_le_bytes());
    b[coff + 2..coff + 4].copy_from_slice(&0u16.to_le_bytes()); // sections
    b[coff + 16..coff + 18].copy_from_slice(&240u16.to_le_bytes()); // optional header size
    b[coff + 18..coff + 20].copy_from_slice(&0x0022u16.to_le_bytes()); // executable, large address aware
    let opt = coff + 20;
    b[opt..opt + 2].copy_from_slice(&0x20bu16.to_le_bytes()); // PE32+
    b[opt + 24..opt + 32].copy_from_slice(&0x1_4000_0000u64.to_le_bytes()); // image base
    b[opt + 32..opt + 36].copy_from_slice(&0x1000u32.to_le_bytes()); // section alignment
    b[opt + 36..opt + 40].copy_from_slice(&0x200u32.to_le_bytes()); // file alignment
    b[opt + 40..opt + 42].copy_from_slice(&6u16.to_le_bytes()); // OS version
    b[opt + 48..opt + 50].copy_from_slice(&6u16.to_le_bytes()); // subsystem version
    b[opt + 56..opt + 60].copy_from_slice(&0x1000u32.to_le_bytes()); // size of image
    b[opt + 60..opt + 64].copy_from_slice(&0x400u32.to_le_bytes()); // size of headers
    b[opt + 68..opt + 70].copy_from_slice(&subsystem.to_le_bytes());
    b[opt + 108..opt + 112].copy_from_slice(&16u32.to_le_bytes()); // data directories
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_pe_is_a_windows_console_binary() {
        let pe = minimal_pe(goblin::pe::header::COFF_MACHINE_X86_64, 3);
        let info = inspect_bytes(&pe, "t.exe").unwrap();
        assert_eq!(info.format, BinaryFormat::Pe);
        assert_eq!(info.os, Os::Windows);
        assert_eq!(info.arch, Some(Arch::Amd64));
        assert_eq!(info.subsystem.as_deref(), Some("console"));
        info.check("t.exe", Os::Windows, Arch::Amd64).unwrap();
        let err = info
            .check("t.exe", Os::Linux, Arch::Amd64)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("expected a linux/amd64 binary, found windows/amd64"),
            "{err}"
        );
        let arm =
            inspect_bytes(&minimal_pe(goblin::pe::header::COFF_MACHINE_ARM64, 2), "a").unwrap();
        assert_eq!(arm.arch, Some(Arch::Arm64));
        assert_eq!(arm.subsystem.as_deref(), Some("gui"));
    }

    #[test]
    fn this_test_binary_is_a_linux_elf() {
        let me = std::env::current_exe().unwrap();
        let info = inspect_file(&me).unwrap();
        assert_eq!(info.format, BinaryFormat::Elf);
        assert_eq!(info.os, Os::Linux);
        assert_eq!(info.linkage, Linkage::Dynamic);
        assert!(info.interpreter.is_some());
        assert!(
            info.needed.iter().any(|l| l.starts_with("libc.so")),
            "{info}"
        );
    }

    #[test]
    fn non_binaries_are_named() {
        for (bytes, want) in [
            (&b"#!/bin/sh\necho hi\n"[..], "a script"),
            (&[0x1f, 0x8b, 8, 0][..], "gzip data"),
            (&b""[..], "an empty file"),
        ] {
            let err = inspect_bytes(bytes, "f").unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }
}
