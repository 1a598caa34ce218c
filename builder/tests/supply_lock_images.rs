//! `[[image]]` entries of the lock (issue 16): strict parsing with errors naming the file,
//! the image and the field; the signature covers them like every other byte; and the
//! proposed lock pins the upstream sandbox image with a citation.

use crate::support;

use std::path::Path;

use kiln::supply::lock::{Arch, Lock, Os};
use support::*;

const IMG: &str = r#"
[[image]]
name = "pause"
reference = "registry.k8s.io/pause:3.10.1"
digest = "sha256:278fb9dbcca9518083ad1e11276933a2e96f23de604a3a08cc3c80002767d24c"
verified = "test"
platforms = [
  { os = "linux", arch = "amd64", digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111" },
  { os = "linux", arch = "arm64" },
]
"#;

fn text() -> String {
    format!("version = 1\n{IMG}")
}

#[test]
fn image_entries_parse() {
    let lock = Lock::parse(&text(), Path::new("t.lock")).unwrap();
    assert!(lock.artifacts.is_empty());
    assert_eq!(lock.images.len(), 1);
    let img = &lock.images[0];
    assert_eq!(img.id(), "pause (registry.k8s.io/pause:3.10.1)");
    let r = img.image_ref().unwrap();
    assert_eq!(r.host, "registry.k8s.io");
    assert_eq!(r.repository, "pause");
    assert!(img
        .platform(Os::Linux, Arch::Arm64)
        .unwrap()
        .digest
        .is_none());
    assert!(img.platform(Os::Windows, Arch::Amd64).is_none());
    // Our own serialiser round-trips it.
    let again = Lock::parse(&lock.to_toml(), Path::new("t.lock")).unwrap();
    assert_eq!(again.images, lock.images);
}

#[test]
fn bad_image_entries_name_file_image_and_field() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "digest = \"sha256:278f",
            "digest = \"sha512:278f",
            "field `digest`",
        ),
        (
            "digest = \"sha256:278fb9dbcca9518083ad1e11276933a2e96f23de604a3a08cc3c80002767d24c\"",
            "digest = \"sha256:../../x\"",
            "field `digest`",
        ),
        (
            "reference = \"registry.k8s.io/pause:3.10.1\"",
            "reference = \"pause:3.10.1\"",
            "field `reference`",
        ),
        (
            "reference = \"registry.k8s.io/pause:3.10.1\"",
            "reference = \"registry.k8s.io/pause@sha256:00\"",
            "field `reference`",
        ),
        (
            "verified = \"test\"",
            "verified = \" \"",
            "field `verified`",
        ),
        (
            "digest = \"sha256:1111",
            "digest = \"sha256:../1111",
            "field `platforms.digest`",
        ),
        (
            "{ os = \"linux\", arch = \"arm64\" }",
            "{ os = \"linux\", arch = \"amd64\" }",
            "each os/arch once",
        ),
        (
            "{ os = \"linux\", arch = \"arm64\" }",
            "{ os = \"linux\", arch = \"riscv64\" }",
            "unknown variant `riscv64`",
        ),
        (
            "verified = \"test\"",
            "verified = \"test\"\ntag = \"x\"",
            "unknown field `tag`",
        ),
        ("name = \"pause\"", "name = \"pa use\"", "field `name`"),
    ];
    for (from, to, want) in cases {
        let t = text().replacen(from, to, 1);
        assert_ne!(t, text(), "case {from} did not apply");
        let err = Lock::parse(&t, Path::new("site.lock"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{to}: {err}");
        assert!(err.contains("site.lock"), "{err}");
        if want.starts_with("field") {
            assert!(err.contains("image pa"), "names the image: {err}");
        }
    }
    // No platforms at all.
    let t = text().replace(
        &text()[text().find("platforms = [").unwrap()..],
        "platforms = []\n",
    );
    let err = Lock::parse(&t, Path::new("site.lock"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("field `platforms`"), "{err}");
    // Two images with one name.
    let err = Lock::parse(&format!("{}{IMG}", text()), Path::new("site.lock"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("each image name once"), "{err}");
}

#[test]
fn the_signature_covers_image_entries() {
    let dir = tempfile::tempdir().unwrap();
    let (pk, sk) = test_keypair(dir.path(), "t");
    let lock = write_signed_lock(dir.path(), &text(), &sk);
    let verify = |extra: &[&str]| {
        run(kiln()
            .args(["lock", "verify"])
            .arg(&lock)
            .arg("--trusted-key")
            .arg(&pk)
            .args(extra))
    };
    assert!(verify(&[]).status.success(), "{}", out_text(&verify(&[])));
    // Change one hex digit of the arm64 platform's pin: refused (exit 3).
    let tampered = text().replace(
        "{ os = \"linux\", arch = \"arm64\" }",
        "{ os = \"linux\", arch = \"arm64\", digest = \"sha256:2222222222222222222222222222222222222222222222222222222222222222\" }",
    );
    std::fs::write(&lock, tampered).unwrap();
    let o = verify(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
}

/// The committed lock pins the sandbox image the definitions name, by index digest (and the
/// linux/amd64 manifest), citing records a reader can open, and every definition's
/// `containerd.sandbox_image` is that reference.
#[test]
fn the_real_lock_pins_the_sandbox_image_the_definitions_name() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lock = Lock::load_unverified(&root.join("images/artifacts.lock")).unwrap();
    let pause = lock
        .images
        .iter()
        .find(|i| i.name == "pause")
        .expect("the lock pins the pause image");
    assert_eq!(pause.reference, "registry.k8s.io/pause:3.10.2");
    // The published index digest of registry.k8s.io/pause:3.10.2 and its linux/amd64 manifest.
    assert_eq!(
        pause.digest,
        "sha256:f548e0e8e3dc1896ca956272154dde3314e8cc4fde0a57577ee9fa1c63f5baf4"
    );
    assert_eq!(
        pause
            .platform(Os::Linux, Arch::Amd64)
            .and_then(|p| p.digest.as_deref()),
        Some("sha256:412c4a7219cb8a299a37337f3d87810c5340095322e15594a1637785adad0f17")
    );
    assert!(pause.platform(Os::Linux, Arch::Arm64).is_some());
    assert!(
        pause.verified.contains("at commit") && !pause.verified.contains("find_string"),
        "the citation names repositories and commits: {}",
        pause.verified
    );
    for def in ["flatcar", "ubuntu"] {
        let path = root.join(format!("images/{def}.toml"));
        let d = kiln::image_def::ImageDef::parse(&std::fs::read_to_string(&path).unwrap(), &path)
            .unwrap();
        assert_eq!(d.containerd.sandbox_image, pause.reference, "{def}");
    }
}
