//! kiln's DDI against the real thing: Debian trixie's `systemd-repart` 257 (unpacked by
//! `scripts/repart-257.sh` into `target/repart-257`, or `KILN_REPART_DIR`), run on the same
//! squashfs with the same seed, key and certificate, writes the same bytes everywhere but in
//! the PKCS#7 signature (OpenSSL's ECDSA nonces are random, kiln's follow RFC 6979).

use super::*;
use p256::pkcs8::{EncodePrivateKey, LineEnding};
use std::process::Command;

fn repart() -> PathBuf {
    let dir = match std::env::var_os("KILN_REPART_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/repart-257"),
    };
    let bin = dir.join("systemd-repart");
    assert!(
        bin.is_file(),
        "no systemd-repart 257 at {}: run `scripts/repart-257.sh target/repart-257` \
         (make unit does), or point KILN_REPART_DIR at its output",
        bin.display()
    );
    bin
}

/// Pseudo-random bytes (xorshift), quick to make in a debug build.
fn squashfs(path: &Path, len: usize) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ len as u64;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    bytes.truncate(len);
    std::fs::write(path, bytes).unwrap();
}

/// The JSON text of a signature partition, without its NUL padding.
fn sig_json(img: &[u8], e: Extent) -> &str {
    let part = &img[e.offset as usize..(e.offset + e.size) as usize];
    let end = part.iter().position(|&b| b == 0).unwrap_or(part.len());
    std::str::from_utf8(&part[..end]).unwrap()
}

#[test]
fn matches_systemd_repart_257() {
    let repart = repart();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = SigningKey::from_slice(&Sha256::digest(b"kiln repart cross-check")).unwrap();
    let cert = pkcs7::self_signed_certificate(&key, "kiln repart cross-check", 1_700_000_000);
    let key_pem = d.join("key.pem");
    std::fs::write(
        &key_pem,
        key.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes(),
    )
    .unwrap();
    let cert_pem = d.join("cert.pem");
    std::fs::write(&cert_pem, pkcs7::certificate_pem(&cert)).unwrap();
    let seed_text = "0f0e0d0c-0b0a-0908-0706-050403020100";
    let seed = gpt::uuid_bytes(seed_text);

    // Sizes past the 3 MiB below which repart's libfdisk aligns a tiny disk differently, in
    // whole 4 KiB blocks as kiln's squashfs is (repart leaves a partial last block out of
    // the tree; kiln pads and hashes it).
    for (arch, len) in [
        (Arch::Amd64, 10 << 20),
        (Arch::Arm64, (37 << 20) + 3 * 4096),
    ] {
        let src = d.join("ext.squashfs");
        squashfs(&src, len);
        let defs = d.join("defs");
        std::fs::create_dir_all(&defs).unwrap();
        let part = |kind: &str, extra: &str| {
            format!("[Partition]\nType={kind}\nVerity={extra}\nVerityMatchKey=root\n")
        };
        let root = part("root", "data") + &format!("CopyBlocks={}\n", src.display());
        std::fs::write(defs.join("10-root.conf"), root).unwrap();
        let hash = part("root-verity", "hash") + "Minimize=best\n";
        std::fs::write(defs.join("20-root-verity.conf"), hash).unwrap();
        let sig = part("root-verity-sig", "signature");
        std::fs::write(defs.join("30-root-verity-sig.conf"), sig).unwrap();

        let theirs = d.join("repart.raw");
        let _ = std::fs::remove_file(&theirs);
        let out = Command::new(&repart)
            .arg(format!("--definitions={}", defs.display()))
            .args([
                "--empty=create",
                "--size=auto",
                "--dry-run=no",
                "--offline=yes",
            ])
            .arg(format!("--seed={seed_text}"))
            .arg(format!("--architecture={}", gpt::root_types(arch).arch))
            .arg(format!("--private-key={}", key_pem.display()))
            .arg(format!("--certificate={}", cert_pem.display()))
            .arg(&theirs)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "systemd-repart: {}",
            String::from_utf8_lossy(&out.stderr)
        );

        let ours = d.join("kiln.raw");
        let info = write_signed_ddi(&src, &ours, arch, seed, &key, &cert).unwrap();
        let (a, b) = (
            std::fs::read(&ours).unwrap(),
            std::fs::read(&theirs).unwrap(),
        );
        assert_eq!(a.len(), b.len(), "{arch}: image size");
        let s = info.signature;
        let (start, end) = (s.offset as usize, (s.offset + s.size) as usize);
        let first = (0..a.len()).find(|&i| (i < start || i >= end) && a[i] != b[i]);
        assert_eq!(
            first, None,
            "{arch}: first differing byte outside the signature"
        );

        let (ja, jb) = (sig_json(&a, s), sig_json(&b, s));
        let cut = |j: &str| j[..j.find(r#""signature":""#).unwrap()].to_string();
        assert_eq!(
            cut(ja),
            cut(jb),
            "{arch}: rootHash and certificateFingerprint"
        );
        assert!(jb.contains(&info.root_hash), "{jb}");
    }
}
