//! `kiln bake --sysext-ddi` (issue 39): the Flatcar sysext as a signed Discoverable Disk
//! Image, end to end through kiln's commands. `bake::ddi`'s own tests check the layout
//! against systemd-repart 257, veritysetup, sgdisk and openssl; these check what a user gets:
//! the certificate kiln writes beside the image is the one whose key signed the image's root
//! hash (openssl, as systemd's userspace check calls it), `kiln render --sysext` hands it to
//! the node with the signed-only policy, the image is reproducible and `kiln verify
//! --rebuild` needs the key, and the flag is refused where it cannot apply. The boot scenario
//! `flatcar_sysext` has systemd 257 merge it and refuse tampered copies.

use crate::bake_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::out_text as text;
use bake_support::fixture_mirror::{bake_from_fixture, fixture_flags, read_only_fixture, standin};
use bake_support::{kiln, repo};

fn bake(fx: &Path, out: &Path, key: Option<&Path>, extra: &[&str]) -> std::process::Output {
    let mut flags: Vec<&dyn AsRef<std::ffi::OsStr>> = Vec::new();
    for e in extra {
        flags.push(e);
    }
    let k;
    if let Some(key) = key {
        k = key.to_path_buf();
        flags.push(&"--attest-key");
        flags.push(&k);
    }
    bake_from_fixture(fx, "flatcar", "amd64", out, &flags)
}

fn raw_of(out: &Path) -> PathBuf {
    out.join(format!("kubernetes-{}-x86-64.raw", standin()))
}

/// The signature partition's JSON (the third GPT entry), read through sfdisk.
fn signature_json(raw: &Path) -> serde_json::Value {
    let o = Command::new("sfdisk")
        .arg("--json")
        .arg(raw)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let t: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let p = &t["partitiontable"]["partitions"][2];
    let (start, size) = (
        p["start"].as_u64().unwrap() * 512,
        p["size"].as_u64().unwrap() * 512,
    );
    let bytes = std::fs::read(raw).unwrap();
    let part = &bytes[start as usize..(start + size) as usize];
    let end = part.iter().position(|b| *b == 0).unwrap_or(part.len());
    serde_json::from_slice(&part[..end]).unwrap()
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one bake, then each thing a user does with it, in order"
)]
fn a_signed_sysext_ships_the_certificate_that_verifies_it() {
    let d = tempfile::tempdir().unwrap();
    let fx = read_only_fixture(d.path());
    let o = kiln()
        .args(["key", "generate"])
        .arg(d.path().join("k"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let key = d.path().join("k.key");
    let out = d.path().join("out");
    let o = bake(&fx, &out, Some(&key), &["--sysext-ddi"]);
    assert!(o.status.success(), "{}", text(&o));
    let raw = raw_of(&out);
    let crt = out.join("kubernetes.verity.crt");

    // A GPT with the three partitions systemd-sysext looks for.
    let o = Command::new("sgdisk").arg("-v").arg(&raw).output().unwrap();
    assert!(text(&o).contains("No problems found"), "{}", text(&o));
    let o = Command::new("sfdisk")
        .arg("--json")
        .arg(&raw)
        .output()
        .unwrap();
    let names: Vec<String> = serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
        ["partitiontable"]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "root-x86-64",
            "root-x86-64-verity",
            "root-x86-64-verity-sig"
        ]
    );

    // The data partition is the squashfs a plain bake writes, byte for byte (kiln writes it
    // straight into the image, 1 MiB in).
    let plain = d.path().join("plain");
    let o = bake(&fx, &plain, None, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let squashfs = std::fs::read(raw_of(&plain)).unwrap();
    let image = std::fs::read(&raw).unwrap();
    assert_eq!(
        &image[1 << 20..(1 << 20) + squashfs.len()],
        &squashfs[..],
        "the data partition"
    );

    // The certificate beside the image verifies its root hash's signature, as systemd's
    // userspace check does (PKCS7_verify with the trusted certificates, no chain).
    let sig = signature_json(&raw);
    let root_hash = sig["rootHash"].as_str().unwrap();
    assert_eq!(root_hash.len(), 64);
    let p7 = d.path().join("sig.p7");
    use base64::Engine as _;
    std::fs::write(
        &p7,
        base64::engine::general_purpose::STANDARD
            .decode(sig["signature"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let content = d.path().join("roothash");
    std::fs::write(&content, root_hash).unwrap();
    let smime = |cert: &Path, content: &Path| {
        Command::new("openssl")
            .args([
                "smime",
                "-verify",
                "-binary",
                "-inform",
                "DER",
                "-nointern",
                "-noverify",
            ])
            .arg("-in")
            .arg(&p7)
            .arg("-content")
            .arg(content)
            .arg("-certfile")
            .arg(cert)
            .output()
            .unwrap()
    };
    let o = smime(&crt, &content);
    assert!(o.status.success(), "{}", text(&o));
    let other = d.path().join("other");
    std::fs::write(
        &other,
        root_hash.replacen('0', "1", 1).replacen('a', "b", 1),
    )
    .unwrap();
    assert!(
        !smime(&crt, &other).status.success(),
        "another root hash verified"
    );

    // render --sysext: the node gets the certificate and the signed-only policy.
    let o = kiln()
        .args(["render", "-p", "ignition"])
        .arg(repo().join("docs/examples/render/node.toml"))
        .arg("--sysext")
        .arg(&raw)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let ign = String::from_utf8_lossy(&o.stdout);
    assert!(ign.contains("/etc/verity.d/kiln-kubernetes.crt"), "{ign}");
    assert!(
        ign.contains("root=signed+absent:usr=signed+absent"),
        "{ign}"
    );

    // The same bake again: the same image. verify --rebuild needs the key, and with it says
    // identical.
    let again = d.path().join("again");
    let o = bake(&fx, &again, Some(&key), &["--sysext-ddi"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read(raw_of(&again)).unwrap(),
        std::fs::read(&raw).unwrap()
    );
    let verify = |with_key: bool| {
        let mut c = kiln();
        c.args(["verify", "--rebuild"])
            .arg(&raw)
            .arg("--lock")
            .arg(fx.join("artifacts.lock"));
        if with_key {
            c.arg("--attest-key").arg(&key);
        }
        fixture_flags(&mut c, &fx)
            .current_dir(repo())
            .output()
            .unwrap()
    };
    let o = verify(false);
    assert!(
        !o.status.success() && text(&o).contains("--attest-key"),
        "{}",
        text(&o)
    );
    let o = verify(true);
    assert!(
        o.status.success() && text(&o).contains("identical"),
        "{}",
        text(&o)
    );

    // Refused where it cannot apply: no key, or a format that is not a sysext.
    let o = bake(&fx, &d.path().join("nokey"), None, &["--sysext-ddi"]);
    assert!(
        !o.status.success() && text(&o).contains("--attest-key"),
        "{}",
        text(&o)
    );
    let mut c = kiln();
    c.arg("bake")
        .arg(repo().join("images/ubuntu.toml"))
        .args([
            "--arch",
            "amd64",
            "--kubernetes-version",
            &standin(),
            "--sysext-ddi",
            "--lock",
        ])
        .arg(fx.join("artifacts.lock"))
        .arg("--out")
        .arg(d.path().join("rootfs"))
        .arg("--attest-key")
        .arg(&key);
    let o = fixture_flags(&mut c, &fx).output().unwrap();
    assert!(
        !o.status.success() && text(&o).contains("format is rootfs"),
        "{}",
        text(&o)
    );
}
