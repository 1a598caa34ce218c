//! Hostile upstream archives and wrong binaries never reach a layer: `..`, absolute paths,
//! links out of the archive, device nodes and FIFOs are refused (the whole archive), a
//! wanted member that is a link or missing is refused, and the inspection gate refuses a
//! binary for another architecture or one that is no executable at all.

use crate::bake_support;

use std::io::Write;
use std::path::Path;

use bake_support::*;
use kiln::bake::{self, ArchiveKind, ArtifactInput, BakeRequest, InputKind, MemberMap};
use kiln::image_def::{Arch, Format, ImageDef};

// Versions here are test data for a self-contained definition, not the shipped pins.
const DEF: &str = r#"
name = "t"
os = "linux"
arch = ["amd64", "arm64"]
formats = ["rootfs"]
[kubernetes]
version = "v1.30.0-test"
[[artifact]]
name = "kubelet"
[[artifact]]
name = "containerd"
"#;

/// A tar.gz with one raw entry (name/type/link written straight into the header, since the
/// tar crate's setters refuse hostile names) plus a proper `bin/containerd`.
fn hostile_tgz(path: &Path, name: &str, kind: tar::EntryType, link: Option<&str>) {
    let mut b = tar::Builder::new(Vec::new());
    let elf = tiny_elf(X86_64, "containerd");
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o755);
    h.set_size(elf.len() as u64);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, "bin/containerd", &elf[..]).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    let body: &[u8] = if kind == tar::EntryType::Regular {
        b"evil\n"
    } else {
        b""
    };
    h.set_size(body.len() as u64);
    h.set_entry_type(kind);
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(l) = link {
        h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
    }
    h.set_cksum();
    b.append(&h, body).unwrap();
    let tarbytes = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(path).unwrap(),
        flate2::Compression::fast(),
    );
    gz.write_all(&tarbytes).unwrap();
    gz.finish().unwrap();
}

fn try_bake(
    dir: &Path,
    arch: Arch,
    kubelet: &[u8],
    containerd: &Path,
    members: &[(&str, &str)],
    kind: InputKind,
) -> Result<(), String> {
    let fb_machine = if arch == Arch::Arm64 { AARCH64 } else { X86_64 };
    try_bake_with_firstboot(dir, arch, fb_machine, kubelet, containerd, members, kind)
}

/// [`try_bake`] with a kiln-firstboot built for `fb_machine`.
fn try_bake_with_firstboot(
    dir: &Path,
    arch: Arch,
    fb_machine: u16,
    kubelet: &[u8],
    containerd: &Path,
    members: &[(&str, &str)],
    kind: InputKind,
) -> Result<(), String> {
    let kubelet_path = dir.join("kubelet-blob");
    std::fs::write(&kubelet_path, kubelet).unwrap();
    let kubelet_sha = sha256_file(&kubelet_path);
    let inputs = inputs(
        (kubelet_path, kubelet_sha),
        (containerd, sha256_file(containerd)),
        members,
        kind,
    );
    run_bake(dir, arch, fb_machine, &inputs, None)
}

/// kubelet (a binary) and containerd (`kind`, with `members`), each as (blob, the lock's
/// sha256).
fn inputs(
    kubelet: (std::path::PathBuf, String),
    containerd: (&Path, String),
    members: &[(&str, &str)],
    kind: InputKind,
) -> Vec<ArtifactInput> {
    vec![
        ArtifactInput {
            name: "kubelet".into(),
            version: "v1.30.0-test".into(),
            url: "https://example.invalid/kubelet".into(),
            sha256: kubelet.1,
            kind: InputKind::Binary,
            blob: kubelet.0,
            members: vec![MemberMap {
                from: "kubelet".into(),
                to: "bin/kubelet".into(),
            }],
        },
        ArtifactInput {
            name: "containerd".into(),
            version: "2.0.0-test".into(),
            url: "https://example.invalid/containerd.tar.gz".into(),
            sha256: containerd.1,
            kind,
            blob: containerd.0.to_path_buf(),
            members: members
                .iter()
                .map(|(f, t)| MemberMap {
                    from: f.to_string(),
                    to: t.to_string(),
                })
                .collect(),
        },
    ]
}

/// Bakes DEF's rootfs for `arch` from `inputs` into `dir/out` (fresh `dir/work`, a
/// kiln-firstboot built for `fb_machine`, the bake cache `cache`).
fn run_bake(
    dir: &Path,
    arch: Arch,
    fb_machine: u16,
    inputs: &[ArtifactInput],
    cache: Option<&Path>,
) -> Result<(), String> {
    let def = ImageDef::parse(DEF, Path::new("t.toml")).unwrap();
    let _ = std::fs::remove_dir_all(dir.join("work"));
    let fb = dir.join("fb");
    std::fs::write(&fb, tiny_elf(fb_machine, "fb")).unwrap();
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let gate = bake::inspect_gate(def.os, arch);
    let req = BakeRequest {
        def: &def,
        arch,
        format: Format::Rootfs,
        artifacts: inputs,
        images: &[],
        firstboot: &fb,
        epoch: 0,
        work: &work,
        gate: &gate,
        cache,
    };
    let out = dir.join("out");
    bake::bake(&req, &out, &Default::default())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn hostile_tar_entries_refuse_the_archive() {
    use tar::EntryType as E;
    let cases: &[(&str, E, Option<&str>, &str)] = &[
        (
            "../../etc/cron.d/evil",
            E::Regular,
            None,
            "path contains `..`",
        ),
        ("/etc/cron.d/evil", E::Regular, None, "absolute path"),
        (
            "bin/escape",
            E::Symlink,
            Some("../../../etc"),
            "link points outside the archive",
        ),
        (
            "bin/abs",
            E::Symlink,
            Some("/etc/shadow"),
            "link points outside the archive",
        ),
        (
            "bin/hard",
            E::Link,
            Some("../../etc/shadow"),
            "link points outside the archive",
        ),
        ("dev/sda", E::Block, None, "device node or FIFO"),
        ("dev/null", E::Char, None, "device node or FIFO"),
        ("bin/pipe", E::Fifo, None, "device node or FIFO"),
    ];
    for (name, kind, link, why) in cases {
        let d = tempfile::tempdir().unwrap();
        let tgz = d.path().join("containerd.tar.gz");
        hostile_tgz(&tgz, name, *kind, *link);
        let err = try_bake(
            d.path(),
            Arch::Amd64,
            &tiny_elf(X86_64, "kubelet"),
            &tgz,
            &[("bin/containerd", "bin/containerd")],
            InputKind::Archive(ArchiveKind::TarGz),
        )
        .unwrap_err();
        assert!(
            err.contains("refusing hostile archive entry") && err.contains(why),
            "{name}: {err}"
        );
        assert!(
            err.contains("containerd.tar.gz"),
            "names the archive: {err}"
        );
        assert!(
            !d.path()
                .join("out")
                .join("t-v1.30.0-test-amd64.tar.zst")
                .exists(),
            "{name}: output written"
        );
        assert!(!d.path().join("etc").exists());
    }
}

#[test]
fn a_locked_archive_that_is_truncated_or_corrupt_stops_the_bake_naming_it() {
    // The lock pins these very bytes (a mirror that stored a cut download and locked it): the
    // digest check passes, and the gzip layer must still refuse them, never a short member.
    let d = tempfile::tempdir().unwrap();
    let good = std::fs::read(containerd_tgz(d.path(), X86_64, "containerd")).unwrap();
    let tgz = d.path().join("containerd.tar.gz");
    let kubelet = tiny_elf(X86_64, "kubelet");
    let mut bad_crc = good.clone();
    let at = good.len() - 8;
    bad_crc[at] ^= 1;
    for (bytes, why) in [
        (good[..good.len() / 2].to_vec(), "truncated"),
        (good[..good.len() - 4].to_vec(), "truncated"),
        (bad_crc, "corrupt gzip data"),
    ] {
        std::fs::write(&tgz, &bytes).unwrap();
        let err = try_bake(
            d.path(),
            Arch::Amd64,
            &kubelet,
            &tgz,
            &[("bin/containerd", "bin/containerd")],
            InputKind::Archive(ArchiveKind::TarGz),
        )
        .unwrap_err();
        assert!(
            err.contains(&tgz.display().to_string()) && err.contains(why),
            "{} bytes: {err}",
            bytes.len()
        );
        assert!(!d.path().join("out/t-v1.30.0-test-amd64.tar.zst").exists());
    }
}

#[test]
fn wanted_members_must_be_regular_files_that_exist() {
    let d = tempfile::tempdir().unwrap();
    let tgz = d.path().join("containerd.tar.gz");
    hostile_tgz(&tgz, "bin/ctr", tar::EntryType::Symlink, Some("containerd"));
    let kubelet = tiny_elf(X86_64, "kubelet");
    let kind = InputKind::Archive(ArchiveKind::TarGz);
    let err = try_bake(
        d.path(),
        Arch::Amd64,
        &kubelet,
        &tgz,
        &[("bin/ctr", "bin/ctr")],
        kind,
    )
    .unwrap_err();
    assert!(
        err.contains("member \"bin/ctr\": expected a regular file, found a link"),
        "{err}"
    );
    let err = try_bake(
        d.path(),
        Arch::Amd64,
        &kubelet,
        &tgz,
        &[("bin/nope", "bin/nope")],
        kind,
    )
    .unwrap_err();
    assert!(
        err.contains("member \"bin/nope\": expected a member of the archive, found no such entry"),
        "{err}"
    );
    // The inner symlink alone is harmless when not wanted.
    try_bake(
        d.path(),
        Arch::Amd64,
        &kubelet,
        &tgz,
        &[("bin/containerd", "bin/containerd")],
        kind,
    )
    .unwrap();
}

#[test]
fn hostile_zip_entries_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let zpath = d.path().join("containerd.zip");
    let mut z = zip::ZipWriter::new(std::fs::File::create(&zpath).unwrap());
    let opts = zip::write::SimpleFileOptions::default();
    z.start_file("bin/containerd", opts).unwrap();
    z.write_all(&tiny_elf(X86_64, "containerd")).unwrap();
    z.start_file("../../evil", opts).unwrap();
    z.write_all(b"evil").unwrap();
    z.finish().unwrap();
    let err = try_bake(
        d.path(),
        Arch::Amd64,
        &tiny_elf(X86_64, "kubelet"),
        &zpath,
        &[("bin/containerd", "bin/containerd")],
        InputKind::Archive(ArchiveKind::Zip),
    )
    .unwrap_err();
    assert!(
        err.contains("refusing hostile archive entry \"../../evil\""),
        "{err}"
    );
}

#[test]
fn an_amd64_firstboot_in_an_arm64_bake_is_named_with_both_architectures() {
    let d = tempfile::tempdir().unwrap();
    let tgz = containerd_tgz(d.path(), AARCH64, "containerd");
    let err = try_bake_with_firstboot(
        d.path(),
        Arch::Arm64,
        X86_64,
        &tiny_elf(AARCH64, "kubelet"),
        &tgz,
        &[("bin/containerd", "bin/containerd")],
        InputKind::Archive(ArchiveKind::TarGz),
    )
    .unwrap_err();
    // The binary, what it is, what the definition and --arch want; no lock entry is blamed.
    assert!(
        err.contains("inspection refused kiln-firstboot for image ")
            && err.contains("--arch arm64")
            && err.contains("expected a linux/arm64 binary, found linux/amd64"),
        "{err}"
    );
    assert!(!err.contains("lock entry"), "{err}");
}

#[test]
fn the_gate_refuses_wrong_arch_and_non_executables() {
    let d = tempfile::tempdir().unwrap();
    let tgz = d.path().join("containerd.tar.gz");
    hostile_tgz(&tgz, "bin/ok", tar::EntryType::Directory, None);
    let kind = InputKind::Archive(ArchiveKind::TarGz);
    let m = &[("bin/containerd", "bin/containerd")];
    // The containerd member is x86-64: an arm64 bake must refuse it (kubelet is arm64).
    let err = try_bake(
        d.path(),
        Arch::Arm64,
        &tiny_elf(AARCH64, "kubelet"),
        &tgz,
        m,
        kind,
    )
    .unwrap_err();
    assert!(
        err.contains("inspection refused containerd 2.0.0-test member bin/containerd")
            && err.contains("expected a linux/arm64 binary, found linux/amd64"),
        "{err}"
    );
    // A shell script posing as kubelet.
    let err = try_bake(
        d.path(),
        Arch::Amd64,
        b"#!/bin/sh\necho kubelet\n",
        &tgz,
        m,
        kind,
    )
    .unwrap_err();
    assert!(
        err.contains("inspection refused kubelet v1.30.0-test member kubelet")
            && err.contains("expected an ELF or PE executable"),
        "{err}"
    );
    // A Windows PE in a Linux layer.
    let pe = kiln::supply::inspect::minimal_pe(goblin::pe::header::COFF_MACHINE_X86_64, 3);
    let err = try_bake(d.path(), Arch::Amd64, &pe, &tgz, m, kind).unwrap_err();
    assert!(err.contains("found windows/amd64"), "{err}");
    // And the honest case passes.
    try_bake(
        d.path(),
        Arch::Amd64,
        &tiny_elf(X86_64, "kubelet"),
        &tgz,
        m,
        kind,
    )
    .unwrap();
}

#[test]
fn a_blob_that_does_not_match_the_lock_is_caught_before_anything_is_written() {
    let d = tempfile::tempdir().unwrap();
    let tgz = d.path().join("containerd.tar.gz");
    hostile_tgz(&tgz, "bin/ok", tar::EntryType::Directory, None);
    let blob = d.path().join("kubelet-blob");
    std::fs::write(&blob, tiny_elf(X86_64, "kubelet")).unwrap();
    // What the lock promised; the blob on disk holds other bytes.
    let inputs = containerd_and_kubelet((blob, "0".repeat(64)), (&tgz, sha256_file(&tgz)));
    let err = run_bake(d.path(), Arch::Amd64, X86_64, &inputs, None).unwrap_err();
    assert!(
        err.contains("kubelet v1.30.0-test") && err.contains("expected sha256 0000"),
        "{err}"
    );
    assert!(
        !d.path().join("out/t-v1.30.0-test-amd64.tar.zst").exists(),
        "an image was written from an unverified blob"
    );
}

#[test]
fn an_archive_that_does_not_match_the_lock_is_refused_before_it_is_unpacked() {
    // A store blob replaced by another, valid and harmless archive: without the check it
    // would be baked (and cached under the lock's digest) as if it were the locked one.
    let d = tempfile::tempdir().unwrap();
    let tgz = containerd_tgz(d.path(), X86_64, "other");
    let blob = d.path().join("kubelet-blob");
    std::fs::write(&blob, tiny_elf(X86_64, "kubelet")).unwrap();
    let locked = "2".repeat(64);
    let kubelet_sha = sha256_file(&blob);
    let inputs = containerd_and_kubelet((blob, kubelet_sha), (&tgz, locked.clone()));
    let cache = d.path().join("cache");
    let err = run_bake(d.path(), Arch::Amd64, X86_64, &inputs, Some(&cache)).unwrap_err();
    let found = sha256_file(&tgz);
    assert!(
        err.contains("containerd 2.0.0-test")
            && err.contains(&tgz.display().to_string())
            && err.contains(&format!("expected sha256 {locked} (the lock's)"))
            && err.contains(&format!("found sha256 {found}"))
            && err.contains("the store is corrupt"),
        "{err}"
    );
    assert!(
        !d.path().join("out/t-v1.30.0-test-amd64.tar.zst").exists(),
        "an image was written from an unverified archive"
    );
    // Nothing was extracted into the cache under the lock's digest.
    let members: Vec<_> = walkdir(&cache)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("members-"))
        .collect();
    assert!(
        members.is_empty(),
        "cache entries from an unverified archive: {members:?}"
    );
}

#[test]
fn a_blob_that_changed_after_a_cached_bake_is_still_checked_against_the_lock() {
    // The bake cache remembers a binary's SHA1 under the lock's sha256; a later bake that
    // found that entry used the store blob unchecked, so a blob corrupted (or replaced) since
    // the first bake went into the layer under the lock's digest.
    let d = tempfile::tempdir().unwrap();
    let tgz = containerd_tgz(d.path(), X86_64, "ok");
    let blob = d.path().join("kubelet-blob");
    let good = tiny_elf(X86_64, "kubelet");
    std::fs::write(&blob, &good).unwrap();
    let locked = sha256_file(&blob);
    let inputs = containerd_and_kubelet((blob.clone(), locked.clone()), (&tgz, sha256_file(&tgz)));
    let cache = d.path().join("cache");
    run_bake(d.path(), Arch::Amd64, X86_64, &inputs, Some(&cache)).unwrap();
    let image = d.path().join("out/t-v1.30.0-test-amd64.tar.zst");
    let first = std::fs::read(&image).unwrap();
    // Same length, other bytes: still an amd64 ELF the gate accepts.
    let bad = tiny_elf(X86_64, "kubelEt");
    assert_eq!(bad.len(), good.len());
    std::fs::write(&blob, &bad).unwrap();
    let found = sha256_file(&blob);
    let err = run_bake(d.path(), Arch::Amd64, X86_64, &inputs, Some(&cache)).unwrap_err();
    assert!(
        err.contains("kubelet v1.30.0-test")
            && err.contains(&format!("expected sha256 {locked} (the lock's)"))
            && err.contains(&format!("found sha256 {found}")),
        "{err}"
    );
    // The image of the first bake is left as it was.
    assert_eq!(std::fs::read(&image).unwrap(), first);
}

/// [`inputs`] of kubelet and a containerd `.tar.gz` holding `bin/containerd`, each as (blob,
/// the lock's sha256).
fn containerd_and_kubelet(
    kubelet: (std::path::PathBuf, String),
    containerd: (&Path, String),
) -> Vec<ArtifactInput> {
    inputs(
        kubelet,
        containerd,
        &[("bin/containerd", "bin/containerd")],
        InputKind::Archive(ArchiveKind::TarGz),
    )
}

/// `dir/containerd.tar.gz` holding one `bin/containerd` built for `machine`.
fn containerd_tgz(dir: &Path, machine: u16, tag: &str) -> std::path::PathBuf {
    let tgz = dir.join("containerd.tar.gz");
    std::fs::write(&tgz, tar_gz(&[("bin/containerd", tiny_elf(machine, tag))])).unwrap();
    tgz
}

/// Every path below `dir` (none when it does not exist).
fn walkdir(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walkdir(&p));
        }
        out.push(p);
    }
    out
}

/// Issue 34 re-attack: a store blob renamed over its name between the digest check and the
/// extraction (a shared store, a concurrent fetch) must not change what is extracted: bake
/// checks and extracts through one descriptor. Here the swap happens with the file open.
#[test]
fn an_archive_renamed_over_after_its_check_is_not_what_is_extracted() {
    let d = tempfile::tempdir().unwrap();
    let tgz = |body: &[u8]| {
        let mut t = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o755);
        t.append_data(&mut h, "bin/containerd", body).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&t.into_inner().unwrap()).unwrap();
        gz.finish().unwrap()
    };
    let blob = d.path().join("blob");
    std::fs::write(&blob, tgz(b"checked")).unwrap();
    let file = std::fs::File::open(&blob).unwrap();
    let swapped = d.path().join("swapped");
    std::fs::write(&swapped, tgz(b"swapped in")).unwrap();
    std::fs::rename(&swapped, &blob).unwrap();
    let out = d.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let got = bake::extract::extract_members_from(
        &file,
        &blob,
        ArchiveKind::TarGz,
        &["bin/containerd".to_string()],
        &out,
        false,
        &kiln::archive_rules::Policy::upstream(),
    )
    .unwrap();
    let member = &got["bin/containerd"];
    assert_eq!(std::fs::read(&member.path).unwrap(), b"checked");
}
