//! Shared fixtures for the bake tests: a store and an (unsigned) lock holding linux
//! amd64/arm64 and windows amd64 artifacts in upstream layouts (single binaries, containerd
//! `bin/…` tar.gz, CNI `./plugin` tgz).
//!
//! `Bins::Real` fills them with real executables from this machine (ELF from Debian packages,
//! PE from mingw-w64 when installed); arm64 ELF and, without mingw, PE are minimal but
//! well-formed headers — honest stand-ins, since no such binaries exist here.
//! `Bins::Tiny` uses only the small stand-ins so golden listings do not depend on the
//! machine's package versions.
#![allow(dead_code)]

pub mod fixture_mirror;
pub mod gpg;
#[path = "../../../testkit/optout.rs"]
pub mod optout;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln::supply::store::{Expect, Store};
use sha2::{Digest, Sha256};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Kubernetes version the shipped image definitions pin (`[kubernetes] version` in
/// `images/*.toml`, e.g. `v1.36.1`). Tests that mean "whatever version the images pin" use
/// this rather than a literal, so a version bump edits `images/` and nothing here. Panics
/// when the definitions disagree: the fixture lock holds one kubelet version.
pub fn kube_version() -> String {
    let mut seen: Option<(String, PathBuf)> = None;
    for name in ["flatcar.toml", "ubuntu.toml", "windows.toml"] {
        let path = repo().join("images").join(name);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let def = kiln::image_def::ImageDef::parse(&text, &path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let v = def.kubernetes.version.clone();
        if let Some((first, first_path)) = &seen {
            assert_eq!(
                first,
                &v,
                "{} and {} pin different kubernetes.version",
                first_path.display(),
                path.display()
            );
        } else {
            seen = Some((v, path));
        }
    }
    seen.unwrap().0
}

/// The crictl version of the fixture lock: test data, unrelated to the real lock's crictl.
pub const FIXTURE_CRICTL: &str = "1.34.0";

/// The `kiln` binary under test.
pub fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

/// Which executables the fixture artifacts hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bins {
    /// Real ELF/PE files from this machine where possible.
    Real,
    /// Minimal well-formed headers only (stable bytes for golden files).
    Tiny,
}

/// A minimal static ELF64 executable header for `machine`, with `tag` appended so every
/// stand-in has its own bytes.
pub fn tiny_elf(machine: u16, tag: &str) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[0..4].copy_from_slice(b"\x7fELF");
    b[4] = 2; // 64-bit
    b[5] = 1; // little endian
    b[6] = 1; // version
    b[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    b[18..20].copy_from_slice(&machine.to_le_bytes());
    b[20..24].copy_from_slice(&1u32.to_le_bytes());
    b[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    b[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
    b[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
    b.extend_from_slice(format!("kiln test stand-in: {tag}\n").as_bytes());
    b
}

/// EM_X86_64 and EM_AARCH64.
pub const X86_64: u16 = 62;
/// EM_AARCH64.
pub const AARCH64: u16 = 183;

/// Real x86-64 ELF files that every machine with `make deps` has, by role.
const REAL_ELF: &[&str] = &[
    "/usr/bin/mksquashfs",
    "/usr/bin/unsquashfs",
    "/usr/bin/zstd",
    "/usr/bin/tar",
    "/usr/bin/gzip",
    "/usr/bin/cpio",
    "/usr/bin/file",
    "/usr/bin/xz",
    "/usr/bin/unzip",
    "/usr/bin/git",
    "/usr/bin/curl",
    "/usr/bin/minisign",
    "/usr/bin/hyperfine",
];

fn elf(bins: Bins, machine: u16, i: usize, tag: &str) -> Vec<u8> {
    if bins == Bins::Real && machine == X86_64 {
        let p = REAL_ELF[i % REAL_ELF.len()];
        if let Ok(b) = std::fs::read(p) {
            return b;
        }
    }
    tiny_elf(machine, tag)
}

/// A real PE from mingw-w64 when it is installed (`make deps-windows`), else a stand-in.
fn pe(bins: Bins, work: &Path, tag: &str) -> Vec<u8> {
    if bins == Bins::Real {
        let src = work.join(format!("{tag}.c"));
        let out = work.join(format!("{tag}.exe"));
        std::fs::write(
            &src,
            format!("#include <stdio.h>\nint main(void) {{ puts(\"{tag}\"); return 0; }}\n"),
        )
        .unwrap();
        let ok = Command::new("x86_64-w64-mingw32-gcc")
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return std::fs::read(&out).unwrap();
        }
    }
    let mut b = kiln::supply::inspect::minimal_pe(goblin::pe::header::COFF_MACHINE_X86_64, 3);
    b.extend_from_slice(tag.as_bytes());
    b
}

/// Builds a tar.gz with regular files `(path, bytes)`, deterministically.
pub fn tar_gz(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut t = tar::Builder::new(gz);
    for (p, bytes) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o755);
        h.set_size(bytes.len() as u64);
        h.set_mtime(1_600_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        t.append_data(&mut h, p, &bytes[..]).unwrap();
    }
    t.into_inner().unwrap().finish().unwrap()
}

/// One artifact of the fixture lock.
#[derive(Debug, Clone)]
pub struct Art {
    pub name: String,
    pub version: String,
    pub os: &'static str,
    pub arch: &'static str,
    pub format: &'static str,
    pub file: String,
    pub bytes: Vec<u8>,
    pub members: Vec<(String, String)>,
}

/// A fixture: store + lock + firstboot binaries in a temp dir.
#[derive(Debug)]
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub store: PathBuf,
    pub lock: PathBuf,
    pub firstboot: PathBuf,
    pub firstboot_exe: PathBuf,
    pub firstboot_arm64: PathBuf,
    pub arts: Vec<Art>,
}

/// The artifacts of the fixture lock, for every OS/arch the image definitions use.
pub fn artifacts(bins: Bins, work: &Path, kubelet_version: &str) -> Vec<Art> {
    let mut v = Vec::new();
    let mut i = 0;
    for (arch, machine) in [("amd64", X86_64), ("arm64", AARCH64)] {
        let mut next = |tag: &str| {
            i += 1;
            elf(bins, machine, i, &format!("{tag}-{arch}"))
        };
        for (name, ver) in [
            ("kubelet", kubelet_version),
            ("kubeadm", kubelet_version),
            ("kubectl", kubelet_version),
        ] {
            v.push(Art {
                name: name.into(),
                version: ver.into(),
                os: "linux",
                arch,
                format: "binary",
                file: name.into(),
                bytes: next(name),
                members: vec![(name.into(), format!("bin/{name}"))],
            });
        }
        v.push(Art {
            name: "runc".into(),
            version: "1.1.5".into(),
            os: "linux",
            arch,
            format: "binary",
            file: format!("runc.{arch}"),
            bytes: next("runc"),
            members: vec![(format!("runc.{arch}"), "bin/runc".into())],
        });
        let ctd = ["containerd", "containerd-shim-runc-v2", "ctr"];
        let files: Vec<(String, Vec<u8>)> =
            ctd.iter().map(|b| (format!("bin/{b}"), next(b))).collect();
        let refs: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(p, b)| (p.as_str(), b.clone())).collect();
        v.push(Art {
            name: "containerd".into(),
            version: "1.6.20".into(),
            os: "linux",
            arch,
            format: "tar.gz",
            file: format!("containerd-1.6.20-linux-{arch}.tar.gz"),
            bytes: tar_gz(&refs),
            members: ctd
                .iter()
                .map(|b| (format!("bin/{b}"), format!("bin/{b}")))
                .collect(),
        });
        let cni = ["bridge", "host-local", "loopback", "portmap"];
        let files: Vec<(String, Vec<u8>)> =
            cni.iter().map(|b| (format!("./{b}"), next(b))).collect();
        let refs: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(p, b)| (p.as_str(), b.clone())).collect();
        v.push(Art {
            name: "cni-plugins".into(),
            version: "1.1.1".into(),
            os: "linux",
            arch,
            format: "tar.gz",
            file: format!("cni-plugins-linux-{arch}-v1.1.1.tgz"),
            bytes: tar_gz(&refs),
            members: cni
                .iter()
                .map(|b| (format!("./{b}"), format!("libexec/cni/{b}")))
                .collect(),
        });
        v.push(Art {
            name: "crictl".into(),
            version: FIXTURE_CRICTL.into(),
            os: "linux",
            arch,
            format: "tar.gz",
            file: format!("crictl-v{FIXTURE_CRICTL}-linux-{arch}.tar.gz"),
            bytes: tar_gz(&[("crictl", next("crictl"))]),
            members: vec![("crictl".into(), "bin/crictl".into())],
        });
    }
    for name in ["kubelet", "kubeadm", "kubectl"] {
        v.push(Art {
            name: name.into(),
            version: kubelet_version.into(),
            os: "windows",
            arch: "amd64",
            format: "binary",
            file: format!("{name}.exe"),
            bytes: pe(bins, work, name),
            members: vec![(format!("{name}.exe"), format!("{name}.exe"))],
        });
    }
    v.push(Art {
        name: "containerd".into(),
        version: "1.7.24".into(),
        os: "windows",
        arch: "amd64",
        format: "tar.gz",
        file: "containerd-1.7.24-windows-amd64.tar.gz".into(),
        bytes: tar_gz(&[
            ("bin/containerd.exe", pe(bins, work, "containerd")),
            ("bin/containerd-shim-runhcs-v1.exe", pe(bins, work, "shim")),
        ]),
        members: vec![
            ("bin/containerd.exe".into(), "containerd.exe".into()),
            (
                "bin/containerd-shim-runhcs-v1.exe".into(),
                "containerd-shim-runhcs-v1.exe".into(),
            ),
        ],
    });
    v.push(Art {
        name: "crictl".into(),
        version: FIXTURE_CRICTL.into(),
        os: "windows",
        arch: "amd64",
        format: "tar.gz",
        file: format!("crictl-v{FIXTURE_CRICTL}-windows-amd64.tar.gz"),
        bytes: tar_gz(&[("crictl.exe", pe(bins, work, "crictl"))]),
        members: vec![("crictl.exe".into(), "crictl.exe".into())],
    });
    v
}

/// The lock URL of a fixture artifact: an `example.invalid` name, except runc's, which comes
/// from a mirror on a loopback address (SBOM tools refuse such a `downloadLocation`).
pub fn fixture_url(a: &Art) -> String {
    let host = if a.name == "runc" {
        "http://127.0.0.1:8080"
    } else {
        "https://example.invalid"
    };
    format!("{host}/{}/{}/{}", a.os, a.arch, a.file)
}

/// Renders the lock text for `arts`, in the given order.
pub fn lock_text(arts: &[Art]) -> String {
    let mut s = String::from("version = 1\n");
    for a in arts {
        let sha = hex::encode(Sha256::digest(&a.bytes));
        s.push_str(&format!(
            "\n[[artifact]]\nname = \"{}\"\nversion = \"{}\"\nos = \"{}\"\narch = \"{}\"\nformat = \"{}\"\nurl = \"{}\"\nsize = {}\nsha256 = \"{sha}\"\nverified = \"test fixture\"\n",
            a.name, a.version, a.os, a.arch, a.format, fixture_url(a), a.bytes.len()
        ));
        for (from, to) in &a.members {
            s.push_str(&format!(
                "[[artifact.members]]\nfrom = \"{from}\"\nto = \"{to}\"\n"
            ));
        }
    }
    s
}

/// Writes the store and lock for `arts` into `dir`.
pub fn write_store(dir: &Path, arts: &[Art]) -> (PathBuf, PathBuf) {
    let store_dir = dir.join("store");
    let store = Store::open(&store_dir).unwrap();
    for a in arts {
        let sha = hex::encode(Sha256::digest(&a.bytes));
        store
            .put_reader(
                &a.bytes[..],
                &Expect {
                    sha256: sha,
                    size: a.bytes.len() as u64,
                    exact: true,
                    what: a.name.clone(),
                },
            )
            .unwrap();
    }
    let lock = dir.join("artifacts.lock");
    std::fs::write(&lock, lock_text(arts)).unwrap();
    (store_dir, lock)
}

/// A complete fixture.
pub fn fixture(bins: Bins) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let arts = artifacts(bins, dir.path(), &kube_version());
    let (store, lock) = write_store(dir.path(), &arts);
    let firstboot = dir.path().join("kiln-firstboot");
    let fb = match bins {
        Bins::Real => std::fs::read("/usr/bin/mksquashfs").unwrap(),
        Bins::Tiny => tiny_elf(X86_64, "kiln-firstboot"),
    };
    std::fs::write(&firstboot, fb).unwrap();
    let firstboot_arm64 = dir.path().join("kiln-firstboot-arm64");
    std::fs::write(&firstboot_arm64, tiny_elf(AARCH64, "kiln-firstboot")).unwrap();
    let firstboot_exe = dir.path().join("kiln-firstboot.exe");
    let fb = pe(bins, dir.path(), "kiln-firstboot");
    std::fs::write(&firstboot_exe, fb).unwrap();
    Fixture {
        dir,
        store,
        lock,
        firstboot,
        firstboot_exe,
        firstboot_arm64,
        arts,
    }
}

/// Runs `kiln bake` for a definition; returns the output dir's file list on success.
pub fn bake_cli(
    fx: &Fixture,
    image: &Path,
    format: &str,
    arch: &str,
    out: &Path,
    extra: &[&str],
) -> std::process::Output {
    let fb = match (format, arch) {
        ("windows", _) => &fx.firstboot_exe,
        (_, "arm64") => &fx.firstboot_arm64,
        _ => &fx.firstboot,
    };
    let mut c = kiln();
    c.arg("bake")
        .arg(image)
        .args(["--format", format, "--arch", arch, "--out"])
        .arg(out)
        .arg("--lock")
        .arg(&fx.lock)
        .arg("--allow-unsigned")
        .arg("--store")
        .arg(&fx.store)
        .arg("--firstboot")
        .arg(fb)
        .arg("--cache")
        .arg(fx.dir.path().join("bake-cache"))
        .args(extra)
        .env("SOURCE_DATE_EPOCH", "1704067200");
    c.output().unwrap()
}

/// sha256 of a file.
pub fn sha256_file(p: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(p).unwrap()))
}

/// Asserts a command succeeded, printing its output otherwise.
pub fn ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compares `actual` with the golden file `name`; `KILN_UPDATE_GOLDEN=1` rewrites it.
pub fn golden(name: &str, actual: &str) {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("KILN_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(actual.as_bytes()).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (run `make golden`)", p.display()));
    if want != actual {
        let mut diff = String::new();
        for (i, (a, b)) in want.lines().zip(actual.lines()).enumerate() {
            if a != b {
                diff.push_str(&format!("line {}:\n  golden: {a}\n  actual: {b}\n", i + 1));
            }
        }
        panic!(
            "{} is stale ({} vs {} lines); run `make golden` if the change is intended:\n{diff}",
            p.display(),
            want.lines().count(),
            actual.lines().count()
        );
    }
}

/// The SPDX reference validator (`pyspdxtools` from spdx-tools, installed by `make deps`, or
/// `KILN_PYSPDXTOOLS`); when it is missing, the check is recorded as not run
/// (testkit/optout.rs), which fails `make test` unless opted out by name.
pub fn pyspdxtools() -> Option<PathBuf> {
    let p = std::env::var_os("KILN_PYSPDXTOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/kiln/spdx-tools/bin/pyspdxtools"));
    if p.exists() {
        return Some(p);
    }
    optout::cannot_run(
        "spdx-validator",
        &format!(
            "{} is missing, so SBOMs cannot be validated by the SPDX reference validator; \
             `make deps` (scripts/deps.sh) installs spdx-tools",
            p.display()
        ),
    );
    None
}

/// Asserts `validator` accepts the SPDX document at `sbom`.
pub fn assert_valid_spdx(validator: &Path, sbom: &Path) {
    let r = Command::new(validator)
        .arg("-i")
        .arg(sbom)
        .output()
        .unwrap();
    assert!(
        r.status.success(),
        "pyspdxtools rejected {}:\nstdout:\n{}\nstderr:\n{}",
        sbom.display(),
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
}
