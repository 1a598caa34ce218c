//! The signed sysext (`kiln bake --sysext-ddi`, issue 39) under the node's own systemd: the
//! Flatcar scenario boots with the signed disk image merged by `systemd-sysext` under the
//! signed-only image policy `kiln render --sysext` installs, and after the join the guest
//! merges each of the copies made here in a private mount namespace (the node's own `/usr`
//! stays as it is), which systemd must refuse, and the good image, which it must merge:
//!
//! - `sig-flipped`: one character of the ECDSA signature changed (still base64);
//! - `other-key`: the root hash validly signed by a key whose certificate the node lacks
//!   (openssl's PKCS#7, as `systemd-repart` with another key would make it);
//! - `hash-flipped`: one byte of the top dm-verity hash block changed;
//! - `unsigned`: the bare squashfs of the data partition (no verity, no signature).

use std::path::Path;
use std::process::Command;

use crate::guest::Root;
use crate::{io_err, run, Error, Result};

/// Where the copies go in the guest (test equipment, not part of the image).
pub const GUEST_DIR: &str = "/opt/kiln-test/ddi";

/// The copies, in the order the script merges them; `good` must merge, the rest not.
pub const CASES: &[&str] = &[
    "good",
    "sig-flipped",
    "other-key",
    "hash-flipped",
    "unsigned",
];

/// `(start, size)` in bytes of partition `n` (0-based) of the GPT image `raw`, per sfdisk.
fn partition(raw: &Path, n: usize) -> Result<(usize, usize)> {
    let o = run(Command::new("sfdisk").arg("--json").arg(raw))?;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| Error::Command {
        command: "sfdisk --json".into(),
        detail: e.to_string(),
    })?;
    let p = &v["partitiontable"]["partitions"][n];
    match (p["start"].as_u64(), p["size"].as_u64()) {
        (Some(s), Some(z)) => Ok((s as usize * 512, z as usize * 512)),
        _ => Err(Error::Missing {
            what: format!("partition {} of {}", n + 1, raw.display()),
            hint: format!("sfdisk --json said {v}"),
        }),
    }
}

/// The signature partition's JSON (NUL-padded in its partition).
fn signature(bytes: &[u8], (start, size): (usize, usize)) -> Result<serde_json::Value> {
    let part = &bytes[start..start + size];
    let end = part.iter().position(|b| *b == 0).unwrap_or(part.len());
    serde_json::from_slice(&part[..end]).map_err(|e| Error::Command {
        command: "reading the verity signature partition".into(),
        detail: e.to_string(),
    })
}

fn put_signature(bytes: &mut [u8], (start, size): (usize, usize), v: &serde_json::Value) {
    let text = v.to_string();
    let part = &mut bytes[start..start + size];
    part.fill(0);
    part[..text.len()].copy_from_slice(text.as_bytes());
}

/// The root hash signed by a fresh key (openssl: a P-256 key, a self-signed certificate,
/// detached PKCS#7 without signed attributes), base64.
fn signed_by_other_key(root_hash: &str, work: &Path) -> Result<String> {
    let (key, crt, msg, p7) = (
        work.join("other.key"),
        work.join("other.crt"),
        work.join("roothash"),
        work.join("other.p7s"),
    );
    std::fs::write(&msg, root_hash).map_err(io_err(&msg))?;
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args([
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=not the node's key",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&crt))?;
    run(Command::new("openssl")
        .args([
            "smime", "-sign", "-binary", "-noattr", "-outform", "DER", "-md", "sha256",
        ])
        .arg("-in")
        .arg(&msg)
        .arg("-signer")
        .arg(&crt)
        .arg("-inkey")
        .arg(&key)
        .arg("-out")
        .arg(&p7))?;
    let o = run(Command::new("base64").args(["-w", "0"]).arg(&p7))?;
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// Writes the copies of the signed image `raw` into `GUEST_DIR` of `root`.
pub fn place_copies(raw: &Path, root: &Root, work: &Path) -> Result<()> {
    std::fs::create_dir_all(work).map_err(io_err(work))?;
    let good = std::fs::read(raw).map_err(io_err(raw))?;
    let (data, verity, sig) = (partition(raw, 0)?, partition(raw, 1)?, partition(raw, 2)?);
    let json = signature(&good, sig)?;
    let root_hash = json["rootHash"].as_str().unwrap_or_default().to_string();
    let b64 = json["signature"].as_str().unwrap_or_default().to_string();

    let mut flipped = good.clone();
    let mut j = json.clone();
    // A character near the end: the DER ends with the ECDSA signature's `s` (the middle of it
    // is the embedded certificate, which systemd ignores: it trusts /etc/verity.d only).
    let at = b64.trim_end_matches('=').len() - 6;
    let c = if &b64[at..=at] == "A" { "B" } else { "A" };
    j["signature"] = format!("{}{c}{}", &b64[..at], &b64[at + 1..]).into();
    put_signature(&mut flipped, sig, &j);

    let mut other = good.clone();
    let mut j = json.clone();
    j["signature"] = signed_by_other_key(&root_hash, work)?.into();
    put_signature(&mut other, sig, &j);

    let mut hash = good.clone();
    hash[verity.0 + 4096 + 64] ^= 0xff;

    let unsigned = good[data.0..data.0 + data.1].to_vec();
    let copies: [(&str, &[u8]); 5] = [
        ("good", &good),
        ("sig-flipped", &flipped),
        ("other-key", &other),
        ("hash-flipped", &hash),
        ("unsigned", &unsigned),
    ];
    for (name, bytes) in copies {
        root.write(&format!("{GUEST_DIR}/{name}.raw"), bytes, 0o644)?;
    }
    Ok(())
}

/// The after-join lines: each copy merged by `systemd-sysext refresh` under the signed-only
/// policy in a private mount namespace where it is the only extension; one step per copy
/// (`merged` or `refused`, with its log when refused), and the policy the boot merged with.
pub fn script() -> String {
    let mut s = String::from(
        r#"step ddi-policy exec=$(systemctl show -p ExecStart --value systemd-sysext.service | grep -o 'image-policy=[^ ;]*' | head -n 1)
P=--image-policy=root=signed+absent:usr=signed+absent
"#,
    );
    // The good copy at debug level: the log says which check accepted it (the kernel's, or,
    // as on a kernel without ECDSA in its keyring code, the userspace PKCS#7 check against
    // /etc/verity.d).
    s.push_str("export SYSTEMD_LOG_LEVEL=debug\n");
    for c in CASES {
        s.push_str(&format!(
            "if timeout 180 unshare --mount --propagation private sh -c 'mkdir -p /run/extensions && mount -t tmpfs none /etc/extensions && mount -t tmpfs none /run/extensions && cp {GUEST_DIR}/{c}.raw /run/extensions/kubernetes.raw && systemd-sysext refresh --no-reload '\"$P\"' && test -x /usr/bin/kubelet' >/run/kiln-test-ddi-{c}.log 2>&1; then\n  step ddi-{c} result=merged\nelse\n  step ddi-{c} result=refused\n  grep -v '^  ' /run/kiln-test-ddi-{c}.log | tail -n 12 >/run/kiln-test-ddi-{c}.tail\n  show ddi-{c}-log /run/kiln-test-ddi-{c}.tail\nfi\ngrep -i 'pkcs#7\\|signature' /run/kiln-test-ddi-{c}.log >/run/kiln-test-ddi-{c}.sig 2>&1\nshow ddi-{c}-sig /run/kiln-test-ddi-{c}.sig\n"
        ));
    }
    s.push_str("unset SYSTEMD_LOG_LEVEL\n");
    s
}
