//! Shared helpers for the supply-chain integration tests: test keys, a fixture lock, the real
//! `kiln` binary, and a loopback HTTP server with faults on demand (see `server`).
#![allow(dead_code)]

pub mod registry;
pub mod server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

/// The built `kiln` binary, with a clean environment for the variables it reads.
pub fn kiln() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.env_remove("KILN_TRUSTED_KEY")
        .env_remove("KILN_SECRET_KEY");
    c
}

/// Runs a command and returns its output (never panics on a non-zero exit).
pub fn run(c: &mut Command) -> Output {
    c.output().expect("running kiln")
}

/// stdout + stderr as text, for assertions and failure messages.
pub fn out_text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A minisign key pair generated now (unencrypted); returns (public key file, secret key file).
pub fn test_keypair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let kp = minisign::KeyPair::generate_encrypted_keypair(Some(String::new())).unwrap();
    let pk = dir.join(format!("{name}.pub"));
    let sk = dir.join(format!("{name}.key"));
    std::fs::write(&pk, kp.pk.to_box().unwrap().to_string()).unwrap();
    std::fs::write(&sk, kp.sk.to_box(None).unwrap().to_string()).unwrap();
    (pk, sk)
}

/// Lowercase hex sha256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// One artifact for a fixture lock.
#[derive(Debug, Clone)]
pub struct FixtureArtifact {
    pub name: String,
    pub file_name: String,
    pub bytes: Vec<u8>,
}

impl FixtureArtifact {
    pub fn new(name: &str, file_name: &str, bytes: Vec<u8>) -> Self {
        FixtureArtifact {
            name: name.into(),
            file_name: file_name.into(),
            bytes,
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift), so sizes can be large without fixtures.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Lock text for binary artifacts served under `base_url/<file_name>`.
pub fn lock_text(base_url: &str, artifacts: &[FixtureArtifact]) -> String {
    let mut s = String::from("version = 1\n");
    for a in artifacts {
        s.push_str(&format!(
            "\n[[artifact]]\nname = \"{n}\"\nversion = \"1.0.0\"\nos = \"linux\"\narch = \"amd64\"\nformat = \"binary\"\nurl = \"{base_url}/{f}\"\nsize = {size}\nsha256 = \"{sha}\"\nverified = \"test fixture\"\nmembers = [{{ from = \"{f}\", to = \"bin/{n}\" }}]\n",
            n = a.name,
            f = a.file_name,
            size = a.bytes.len(),
            sha = sha256_hex(&a.bytes),
        ));
    }
    s
}

/// Writes `lock_text` to `dir/artifacts.lock` and signs it with `sk` through `kiln lock sign`.
pub fn write_signed_lock(dir: &Path, text: &str, sk: &Path) -> PathBuf {
    let lock = dir.join("artifacts.lock");
    std::fs::write(&lock, text).unwrap();
    let o = run(kiln()
        .arg("lock")
        .arg("sign")
        .arg(&lock)
        .arg("--secret-key")
        .arg(sk));
    assert!(o.status.success(), "{}", text_of(&o));
    lock
}

fn text_of(o: &Output) -> String {
    out_text(o)
}
