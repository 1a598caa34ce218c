//! The shared fixture mirror (`scripts/fixture-mirror.sh`): real Debian containerd, runc and
//! CNI binaries (amd64 and arm64) repacked in upstream layouts, a signed fixture lock, and a
//! mirror filled by `kiln mirror sync`. Then the binary gate on those real binaries, including
//! cross-architecture refusals.

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

fn build_fixture(out: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // Any real ELF stands in for kubelet here; the script builds the real stand-in by default.
    let kubelet = root.join("target/release/kubelet");
    let kubelet = if kubelet.is_file() {
        kubelet
    } else {
        "/bin/true".into()
    };
    let o = Command::new(root.join("scripts/fixture-mirror.sh"))
        .arg(out)
        .env("KILN_BIN", env!("CARGO_BIN_EXE_kiln"))
        .env("KUBELET_BIN", kubelet)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "fixture-mirror.sh failed: {}",
        out_text(&o)
    );
}

#[test]
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
    let lock = kiln::lock::Lock::load_unverified(&lock_path).unwrap();
    let store = kiln::store::Store::open(out.join("mirror")).unwrap();
    use kiln::lock::{Arch, Os};

    // runc is a single binary: the blob itself is the executable.
    for arch in [Arch::Amd64, Arch::Arm64] {
        let runc = lock.find("runc", Os::Linux, arch).expect("runc entry");
        let blob = store.lookup(runc).expect("runc blob in the mirror");
        let info = kiln::inspect::inspect_file(&blob).unwrap();
        assert_eq!(info.arch, Some(arch), "{info}");
        assert_eq!(
            info.linkage,
            kiln::inspect::Linkage::Dynamic,
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
            let info =
                kiln::inspect::check_bytes(&std::fs::read(&bin).unwrap(), member, Os::Linux, arch)
                    .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(info.format, kiln::inspect::BinaryFormat::Elf);
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
