//! The AWS ENI table as a pinned input: baked byte for byte with the sizing keys in image.env,
//! and refused, with nothing written, when its bytes are not the ones the definition pins.

use crate::bake_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use bake_support::*;

fn tarball(out: &Path) -> PathBuf {
    std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".tar.zst"))
        .expect("a rootfs archive")
}

fn member(tarball: &Path, name: &str) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("--zstd")
        .arg("-xOf")
        .arg(tarball)
        .arg(name)
        .output()
        .unwrap();
    ok(&out, &format!("tar -xOf {name}"));
    out.stdout
}

#[test]
fn the_pinned_table_is_baked_with_the_sizing_keys() {
    let fx = fixture(Bins::Tiny);
    let out = fx.dir.path().join("rootfs");
    let image = repo().join("images/ubuntu.toml");
    ok(
        &bake_cli(&fx, &image, "rootfs", "amd64", &out, &[]),
        "bake rootfs",
    );
    let tar = tarball(&out);
    let committed = std::fs::read(repo().join("images/data/aws-eni.tsv")).unwrap();
    assert_eq!(member(&tar, "usr/lib/kiln/aws-eni.tsv"), committed);
    let env = String::from_utf8(member(&tar, "usr/lib/kiln/image.env")).unwrap();
    assert!(
        env.contains("\nMAX_PODS_MODE=aws-vpc-cni\nRESERVATION=eks\n"),
        "{env}"
    );
    // And kiln-firstboot reads what was baked: every row parses.
    let text = String::from_utf8(committed).unwrap();
    assert!(kiln_firstboot::sizing::parse_table(&text).unwrap().len() >= 1384);
}

#[test]
fn a_tampered_table_is_refused() {
    let fx = fixture(Bins::Tiny);
    let defs = fx.dir.path().join("images");
    std::fs::create_dir_all(defs.join("data")).unwrap();
    let image = defs.join("ubuntu.toml");
    std::fs::copy(repo().join("images/ubuntu.toml"), &image).unwrap();
    let table = std::fs::read_to_string(repo().join("images/data/aws-eni.tsv")).unwrap();
    // t3.small with one more ENI: 4 x 3 + 2 = 14 pods instead of AWS's 11.
    let tampered = table.replacen("t3.small\t3\t4\t", "t3.small\t4\t4\t", 1);
    assert_ne!(tampered, table);
    std::fs::write(defs.join("data/aws-eni.tsv"), &tampered).unwrap();
    let pinned = sha256_file(&repo().join("images/data/aws-eni.tsv"));

    let out = fx.dir.path().join("rootfs");
    let o = bake_cli(&fx, &image, "rootfs", "amd64", &out, &[]);
    // Exit 3, as for any pinned input that does not verify.
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("sizing.aws_table")
            && err.contains(&pinned)
            && err.contains(&sha256_file(&defs.join("data/aws-eni.tsv")))
            && err.contains("scripts/aws-eni-table.sh"),
        "{err}"
    );
    let written: Vec<_> = std::fs::read_dir(&out)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    assert!(
        !written
            .iter()
            .any(|p| p.to_string_lossy().ends_with(".tar.zst")),
        "{written:?}"
    );

    // A missing table is refused too.
    std::fs::remove_file(defs.join("data/aws-eni.tsv")).unwrap();
    let o = bake_cli(&fx, &image, "rootfs", "amd64", &out, &[]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("sizing.aws_table") && err.contains("a readable file"),
        "{err}"
    );
}
