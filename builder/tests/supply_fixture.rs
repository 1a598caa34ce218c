//! The shared fixture mirror (`scripts/fixture-mirror.sh`): real Debian containerd, runc and
//! CNI binaries (amd64 and arm64) repacked in upstream layouts, stand-ins built from the
//! workspace where Debian has nothing (kubelet/kubeadm/kubectl and crictl for linux amd64 and
//! arm64, every Windows executable as a real PE), a signed fixture lock covering the real
//! lock's matrix, and a mirror filled by `kiln mirror sync`. Then the binary gate on every
//! member of every entry, including cross-architecture refusals.

use crate::bake_support::fixture_mirror::build_fixture;
use crate::support;

use std::path::Path;
use std::process::Command;

use support::*;

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario from its setup to its last assertion, each step depending on the one before; its helpers are in support/"
)]
fn fixture_mirror_holds_real_binaries_that_pass_the_gate() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("fx");
    build_fixture(&out);
    let pk = out.join("keys/fixture.pub");
    let lock_path = out.join("artifacts.lock");
    let o = run(kiln()
        .args(["lock", "verify"])
        .arg(&lock_path)
        .arg("--trusted-key")
        .arg(&pk));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let lock = kiln::supply::lock::Lock::load_unverified(&lock_path).unwrap();
    let store = kiln::supply::store::Store::open(out.join("mirror")).unwrap();
    use kiln::supply::lock::{Arch, Os};

    // runc is a single binary: the blob itself is the executable.
    for arch in [Arch::Amd64, Arch::Arm64] {
        let runc = lock.find("runc", Os::Linux, arch).expect("runc entry");
        let blob = store.lookup(runc).expect("runc blob in the mirror");
        let info = kiln::supply::inspect::inspect_file(&blob).unwrap();
        assert_eq!(info.arch, Some(arch), "{info}");
        assert_eq!(
            info.linkage,
            kiln::supply::inspect::Linkage::Dynamic,
            "Debian's runc links libseccomp: {info}"
        );
        assert!(
            info.needed.iter().any(|l| l.starts_with("libseccomp")),
            "{info}"
        );
        let other = if arch == Arch::Amd64 {
            "arm64"
        } else {
            "amd64"
        };
        let o = run(kiln()
            .args(["inspect", "--os", "linux", "--arch", other])
            .arg(&blob));
        assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
        assert!(
            out_text(&o).contains(&format!("found linux/{arch}")),
            "{}",
            out_text(&o)
        );
    }

    // containerd and the CNI plugins come in upstream's tar.gz layouts.
    for (name, member) in [
        ("containerd", "bin/containerd"),
        ("cni-plugins", "./bridge"),
    ] {
        for arch in [Arch::Amd64, Arch::Arm64] {
            let a = lock.find(name, Os::Linux, arch).expect("entry");
            let blob = store.lookup(a).unwrap();
            let x = d.path().join(format!("x-{name}-{arch}"));
            std::fs::create_dir_all(&x).unwrap();
            let ok = Command::new("tar")
                .arg("-xzf")
                .arg(&blob)
                .arg("-C")
                .arg(&x)
                .status()
                .unwrap();
            assert!(ok.success());
            let bin = x.join(member.trim_start_matches("./"));
            let info = kiln::supply::inspect::check_bytes(
                &std::fs::read(&bin).unwrap(),
                member,
                Os::Linux,
                arch,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(info.format, kiln::supply::inspect::BinaryFormat::Elf);
            // Every declared member exists in the archive.
            for m in &a.members {
                assert!(
                    x.join(m.from.trim_start_matches("./")).is_file(),
                    "{} lacks {}",
                    a.id(),
                    m.from
                );
            }
        }
    }

    // The fixture covers every name/os/arch the real lock pins.
    let real = kiln::supply::lock::Lock::load_unverified(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/artifacts.lock"),
    )
    .unwrap();
    for r in &real.artifacts {
        assert!(
            lock.find(&r.name, r.os, r.arch).is_some(),
            "the fixture lock has no {} for {}/{} (the real lock has {})",
            r.name,
            r.os,
            r.arch,
            r.id()
        );
    }

    // Every member of every entry is a binary for the entry's OS and architecture.
    for a in &lock.artifacts {
        let blob = store.lookup(a).expect("blob in the mirror");
        let x = d.path().join(format!("m-{}-{}-{}", a.name, a.os, a.arch));
        std::fs::create_dir_all(&x).unwrap();
        let files: Vec<(String, std::path::PathBuf)> = match a.format {
            kiln::supply::lock::Format::Binary => vec![(a.members[0].from.clone(), blob.clone())],
            _ => {
                let ok = Command::new("tar")
                    .arg("-xzf")
                    .arg(&blob)
                    .arg("-C")
                    .arg(&x)
                    .status()
                    .unwrap();
                assert!(ok.success(), "{}", a.id());
                a.members
                    .iter()
                    .map(|m| (m.from.clone(), x.join(m.from.trim_start_matches("./"))))
                    .collect()
            }
        };
        assert!(!files.is_empty(), "{} has no members", a.id());
        for (member, path) in files {
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{} {member}: {e}", a.id()));
            let info = kiln::supply::inspect::check_bytes(&bytes, &member, a.os, a.arch)
                .unwrap_or_else(|e| panic!("{}: {e}", a.id()));
            let want = if a.os == Os::Windows {
                kiln::supply::inspect::BinaryFormat::Pe
            } else {
                kiln::supply::inspect::BinaryFormat::Elf
            };
            assert_eq!(info.format, want, "{} {member}: {info}", a.id());
        }
    }

    // The crictl stand-in for this machine runs and says what it is.
    let crictl = lock.find("crictl", Os::Linux, Arch::Amd64).unwrap();
    let x = d.path().join("m-crictl-linux-amd64/crictl");
    let o = run(Command::new(&x).arg("--version"));
    assert!(o.status.success(), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("standin"),
        "{}: {}",
        crictl.id(),
        out_text(&o)
    );
    let o = run(Command::new(&x)
        .args(["--runtime-endpoint"])
        .arg(format!("unix://{}", d.path().join("no.sock").display()))
        .arg("ps"));
    assert_eq!(o.status.code(), Some(1), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("connect: no such file or directory"),
        "{}",
        out_text(&o)
    );

    // Consumers fetch from the mirror directory without any network.
    let cache = d.path().join("cache");
    let o = run(kiln()
        .arg("fetch")
        .arg(&lock_path)
        .arg("--trusted-key")
        .arg(&pk)
        .arg("--mirror")
        .arg(out.join("mirror"))
        .arg("--cache")
        .arg(&cache));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
}

/// `make test` builds the fixture mirror once and names it in `KILN_FIXTURE_MIRROR`; each test
/// then works on its own copy: the same bytes and modes, a change to the copy leaves the
/// shared mirror alone, and a directory that is not a fixture mirror is refused, naming the
/// variable and the part it lacks.
#[test]
fn a_shared_fixture_mirror_is_copied_and_an_incomplete_one_refused() {
    use crate::bake_support::fixture_mirror::copy_fixture;
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let shared = d.path().join("shared");
    let files = [
        ("artifacts.lock", "version = 1\n"),
        ("artifacts.lock.minisig", "sig\n"),
        ("keys/fixture.pub", "pub\n"),
        ("keys/fixture.key", "key\n"),
        ("mirror/artifacts.lock", "version = 1\n"),
        ("mirror/blobs/sha256/ab", "blob\n"),
    ];
    for (p, text) in files {
        let p = shared.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
    }
    std::fs::set_permissions(
        shared.join("keys/fixture.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::write(shared.join("unrelated"), "not copied").unwrap();
    let copy = d.path().join("copy");
    copy_fixture(&shared, &copy);
    for (p, text) in files {
        assert_eq!(std::fs::read_to_string(copy.join(p)).unwrap(), text, "{p}");
    }
    let mode = std::fs::metadata(copy.join("keys/fixture.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(!copy.join("unrelated").exists());
    std::fs::write(copy.join("mirror/blobs/sha256/ab"), "changed").unwrap();
    assert_eq!(
        std::fs::read_to_string(shared.join("mirror/blobs/sha256/ab")).unwrap(),
        "blob\n"
    );

    std::fs::remove_dir_all(shared.join("mirror")).unwrap();
    let err = std::panic::catch_unwind(|| copy_fixture(&shared, &d.path().join("copy2")))
        .expect_err("a fixture mirror without mirror/ was copied");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        msg.contains("KILN_FIXTURE_MIRROR=") && msg.contains("no mirror there"),
        "{msg}"
    );
}
