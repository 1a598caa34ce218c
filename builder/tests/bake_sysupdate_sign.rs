//! `kiln bake --sign-key` signs a sysext's `SHA256SUMS` into `SHA256SUMS.gpg` with gpg and
//! writes `Verify=true` in the sysupdate transfer file. Checked with a throwaway gpg home and
//! key made here, and verified the way systemd-sysupdate does it (systemd-pull's
//! `verify_gpg`: a fresh gpg home, `--no-default-keyring --trust-model=always`, the public
//! keyring `/etc/systemd/import-pubring.gpg` — here a file in the temp dir — and the checksum
//! file on stdin).

use crate::bake_support;

use std::path::{Path, PathBuf};
use std::process::Output;

use bake_support::gpg::{verify_like_systemd, GpgHome};
use bake_support::*;

fn bake_sysext(fx: &Fixture, out: &Path, extra: &[&str]) -> Output {
    bake_cli(
        fx,
        &repo().join("images/flatcar.toml"),
        "sysext",
        "amd64",
        out,
        extra,
    )
}

#[test]
fn signed_sums_verify_like_systemd_and_unsigned_says_so() {
    let gpg = GpgHome::generate();
    let fx = fixture(Bins::Tiny);
    let out = fx.dir.path().join("out");
    let home = gpg.path().to_string_lossy().into_owned();

    let r = bake_sysext(
        &fx,
        &out,
        &["--sign-key", &gpg.fingerprint, "--gpg-homedir", &home],
    );
    ok(&r, "kiln bake --sign-key");
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(stdout.contains("SHA256SUMS.gpg"), "{stdout}");
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(!stderr.contains("warning"), "{stderr}");
    let conf = std::fs::read_to_string(out.join("kubernetes.conf")).unwrap();
    assert!(conf.contains("\nVerify=true\n"), "{conf}");

    let keyring = fx.dir.path().join("import-pubring.gpg");
    gpg.export_keyring(&keyring);
    let sums = out.join("SHA256SUMS");
    let sig = out.join("SHA256SUMS.gpg");
    let v = verify_like_systemd(&keyring, &sig, &sums);
    ok(&v, "gpg --verify SHA256SUMS.gpg (systemd-pull's way)");
    assert!(
        String::from_utf8_lossy(&v.stderr).contains("Good signature"),
        "{}",
        String::from_utf8_lossy(&v.stderr)
    );

    // A changed SHA256SUMS no longer verifies.
    let tampered = fx.dir.path().join("SHA256SUMS.tampered");
    let mut text = std::fs::read_to_string(&sums).unwrap();
    text.replace_range(0..1, if text.starts_with('0') { "1" } else { "0" });
    std::fs::write(&tampered, text).unwrap();
    let bad = verify_like_systemd(&keyring, &sig, &tampered);
    assert!(!bad.status.success(), "a tampered SHA256SUMS verified");

    // Another key's keyring does not verify it either.
    let other = GpgHome::generate();
    let other_ring = fx.dir.path().join("other-pubring.gpg");
    other.export_keyring(&other_ring);
    let wrong = verify_like_systemd(&other_ring, &sig, &sums);
    assert!(!wrong.status.success(), "verified with the wrong key");

    // Re-baked unsigned into the same directory: Verify=false, a warning, and the old
    // signature (which no longer matches SHA256SUMS) is gone.
    let r = bake_sysext(&fx, &out, &[]);
    ok(&r, "kiln bake unsigned");
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(
        stderr.contains("warning: SHA256SUMS is not signed"),
        "{stderr}"
    );
    let conf = std::fs::read_to_string(out.join("kubernetes.conf")).unwrap();
    assert!(conf.contains("\nVerify=false\n"), "{conf}");
    assert!(!sig.exists(), "a stale SHA256SUMS.gpg was left behind");
}

#[test]
fn an_unknown_signing_key_stops_the_bake_before_anything_is_written() {
    let gpg = GpgHome::generate();
    let fx = fixture(Bins::Tiny);
    let out = fx.dir.path().join("out");
    let home = gpg.path().to_string_lossy().into_owned();
    let r = bake_sysext(
        &fx,
        &out,
        &[
            "--sign-key",
            "nobody@example.invalid",
            "--gpg-homedir",
            &home,
        ],
    );
    assert!(!r.status.success());
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(
        stderr.contains("nobody@example.invalid") && stderr.contains(&home),
        "{stderr}"
    );
    let written: Vec<PathBuf> = std::fs::read_dir(&out)
        .map(|d| {
            d.map(|e| e.unwrap().path())
                .filter(|p| {
                    !p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with(".kiln-")
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(written.is_empty(), "written despite the error: {written:?}");
}

/// Only a sysext publishes SHA256SUMS: signing settings in the environment (set for sysext
/// bakes) neither fail nor change a rootfs bake.
#[test]
fn signing_settings_in_the_environment_leave_other_formats_alone() {
    let fx = fixture(Bins::Tiny);
    let out = fx.dir.path().join("out");
    let r = kiln()
        .arg("bake")
        .arg(repo().join("images/ubuntu.toml"))
        .args(["--format", "rootfs", "--arch", "amd64", "--out"])
        .arg(&out)
        .arg("--lock")
        .arg(&fx.lock)
        .arg("--allow-unsigned")
        .arg("--store")
        .arg(&fx.store)
        .arg("--firstboot")
        .arg(&fx.firstboot)
        .arg("--no-cache")
        .env("KILN_SIGN_KEY", "nobody@example.invalid")
        .env("KILN_GPG_HOMEDIR", fx.dir.path().join("no-such-gpg-home"))
        .env("SOURCE_DATE_EPOCH", "1704067200")
        .output()
        .unwrap();
    ok(&r, "kiln bake rootfs with KILN_SIGN_KEY set");
    assert!(!out.join("SHA256SUMS.gpg").exists());
}
