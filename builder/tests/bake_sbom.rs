//! Every format's SBOM is valid SPDX 2.3 by the reference validator, `pyspdxtools` from the
//! `spdx-tools` PyPI package (`make deps` installs it into /opt/kiln/spdx-tools;
//! `KILN_PYSPDXTOOLS` points elsewhere), and it lists every file the output really holds
//! (read back with unsquashfs, tar and unzip) with that file's sha256, plus the artifact,
//! URL and version each came from.

use crate::bake_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use bake_support::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Every regular file under `root`, relative path → sha256.
fn hash_tree(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            let p = e.path();
            if t.is_dir() {
                walk(root, &p, out);
            } else if t.is_file() {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, sha256_file(&p));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    ok(&out, &format!("{cmd:?}"));
}

/// `main` and `sbom` are file names with `{v}` for the images' Kubernetes version.
struct Case {
    image: &'static str,
    format: &'static str,
    main: &'static str,
    sbom: &'static str,
}

impl Case {
    fn main(&self) -> String {
        self.main.replace("{v}", &kube_version())
    }
    fn sbom(&self) -> String {
        self.sbom.replace("{v}", &kube_version())
    }
}

const CASES: &[Case] = &[
    Case {
        image: "images/flatcar.toml",
        format: "sysext",
        main: "kubernetes-{v}-x86-64.raw",
        sbom: "flatcar-{v}-amd64.spdx.json",
    },
    Case {
        image: "images/ubuntu.toml",
        format: "rootfs",
        main: "ubuntu-{v}-amd64.tar.zst",
        sbom: "ubuntu-{v}-amd64.spdx.json",
    },
    Case {
        image: "images/windows.toml",
        format: "windows",
        main: "windows-{v}-amd64.zip",
        sbom: "windows-{v}-amd64.spdx.json",
    },
];

/// Unpacks a baked output with the real tool into `dest`.
fn unpack(format: &str, main: &Path, dest: &Path) {
    std::fs::create_dir_all(dest).unwrap();
    match format {
        "sysext" => run(Command::new("unsquashfs")
            .arg("-q")
            .arg("-f")
            .arg("-d")
            .arg(dest)
            .arg(main)),
        "rootfs" => run(Command::new("tar")
            .arg("--zstd")
            .arg("-xf")
            .arg(main)
            .arg("-C")
            .arg(dest)),
        "windows" => run(Command::new("unzip")
            .arg("-q")
            .arg("-d")
            .arg(dest)
            .arg(main)),
        other => panic!("unknown format {other}"),
    }
}

fn check_case(fx: &Fixture, c: &Case, validator: Option<&Path>) {
    let out = fx.dir.path().join(format!("out-{}", c.format));
    ok(
        &bake_cli(fx, &repo().join(c.image), c.format, "amd64", &out, &[]),
        &format!("kiln bake {}", c.image),
    );
    let sbom_path = out.join(c.sbom());

    if let Some(v) = validator {
        assert_valid_spdx(v, &sbom_path);
    }

    let doc: Value = serde_json::from_slice(&std::fs::read(&sbom_path).unwrap()).unwrap();
    assert_eq!(doc["spdxVersion"], "SPDX-2.3");

    // Every file the output holds, as the real tool reads it back, is in the SBOM with its
    // sha256, and the SBOM lists nothing else.
    let x = fx.dir.path().join(format!("x-{}", c.format));
    unpack(c.format, &out.join(c.main()), &x);
    let on_disk = hash_tree(&x);
    let mut in_sbom = BTreeMap::new();
    let mut comments = BTreeMap::new();
    for f in doc["files"].as_array().unwrap() {
        let name = f["fileName"].as_str().unwrap().trim_start_matches("./");
        let sha = f["checksums"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["algorithm"] == "SHA256")
            .unwrap()["checksumValue"]
            .as_str()
            .unwrap()
            .to_string();
        in_sbom.insert(name.to_string(), sha);
        comments.insert(
            name.to_string(),
            f["comment"].as_str().unwrap_or("").to_string(),
        );
    }
    assert_eq!(
        in_sbom,
        on_disk,
        "{}: the SBOM's files and sha256 differ from what {} holds",
        c.sbom(),
        c.main()
    );

    // The layer package's verification code, recomputed from the unpacked files' SHA1s.
    let mut sha1s: Vec<String> = on_disk
        .keys()
        .map(|rel| hex::encode(sha1::Sha1::digest(std::fs::read(x.join(rel)).unwrap())))
        .collect();
    sha1s.sort();
    let layer = doc["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["SPDXID"] == "SPDXRef-Layer")
        .unwrap();
    assert_eq!(
        layer["packageVerificationCode"]["packageVerificationCodeValue"],
        hex::encode(sha1::Sha1::digest(sha1s.concat().as_bytes())).as_str()
    );

    // Each artifact package carries the lock's URL, version and sha256; kiln-firstboot is
    // one of them; each file names where it came from.
    let packages = doc["packages"].as_array().unwrap();
    let os = if c.format == "windows" {
        "windows"
    } else {
        "linux"
    };
    let def = std::fs::read_to_string(repo().join(c.image)).unwrap();
    for a in fx.arts.iter().filter(|a| a.os == os && a.arch == "amd64") {
        if !def.contains(&format!("name = \"{}\"", a.name)) {
            continue;
        }
        let p = packages
            .iter()
            .find(|p| p["name"] == a.name.as_str())
            .unwrap_or_else(|| panic!("{}: no package for artifact {}", c.sbom(), a.name));
        assert_eq!(p["versionInfo"], a.version.as_str(), "{}", a.name);
        // A URL the validator would refuse (runc's loopback mirror) is kept in the comment.
        let url = fixture_url(a);
        if url.starts_with("https://example.invalid/") {
            assert_eq!(p["downloadLocation"], url.as_str());
        } else {
            assert_eq!(p["downloadLocation"], "NOASSERTION", "{}", a.name);
            let comment = p["comment"].as_str().unwrap_or("");
            assert!(comment.contains(&url), "{}: {comment}", a.name);
        }
        assert_eq!(
            p["checksums"][0]["checksumValue"],
            hex::encode(Sha256::digest(&a.bytes)).as_str()
        );
    }
    let fb = packages
        .iter()
        .find(|p| p["name"] == "kiln-firstboot")
        .expect("a kiln-firstboot package");
    assert_eq!(fb["versionInfo"], env!("CARGO_PKG_VERSION"));
    let (fb_path, image_env, containerd) = match c.format {
        "windows" => (
            "k/kiln-firstboot.exe",
            "k/kiln/image.env",
            "k/containerd/config.toml",
        ),
        _ => (
            "usr/bin/kiln-firstboot",
            "usr/lib/kiln/image.env",
            "usr/lib/kiln/containerd/config.toml",
        ),
    };
    assert_eq!(
        fb["checksums"][0]["checksumValue"].as_str(),
        in_sbom.get(fb_path).map(String::as_str)
    );
    assert!(comments[fb_path].starts_with("artifact kiln-firstboot"));
    assert!(comments[image_env].starts_with("written by kiln"));
    assert!(
        comments[containerd].contains("containerd.sandbox_image"),
        "{}",
        comments[containerd]
    );
}

#[test]
fn every_format_has_a_valid_spdx_sbom_listing_every_file() {
    let validator = pyspdxtools();
    let fx = fixture(Bins::Real);
    for c in CASES {
        check_case(&fx, c, validator.as_deref());
    }
}

/// The validator is not a rubber stamp: it rejects an SBOM with a broken checksum.
#[test]
fn the_validator_rejects_a_broken_sbom() {
    let Some(v) = pyspdxtools() else { return };
    let fx = fixture(Bins::Tiny);
    let out = fx.dir.path().join("out");
    ok(
        &bake_cli(
            &fx,
            &repo().join("images/windows.toml"),
            "windows",
            "amd64",
            &out,
            &[],
        ),
        "kiln bake windows",
    );
    let p = out.join(format!("windows-{}-amd64.spdx.json", kube_version()));
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    doc["files"][0]["checksums"][1]["checksumValue"] = Value::from("not-a-digest");
    std::fs::write(&p, serde_json::to_vec(&doc).unwrap()).unwrap();
    let r = Command::new(v).arg("-i").arg(&p).output().unwrap();
    assert!(!r.status.success(), "pyspdxtools accepted a broken SBOM");
}
