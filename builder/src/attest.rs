//! Signatures that tools outside kiln verify (issue 39): an ECDSA P-256 key pair in PEM
//! (PKCS#8 private key, SPKI public key: what `cosign … --key FILE` and openssl read), a
//! signature of a file as `cosign verify-blob --key` checks it (base64 of the DER signature
//! over the file's SHA-256), and DSSE envelopes of in-toto statements as `cosign
//! verify-blob-attestation --key` checks them.
//!
//! The private key is a file kiln reads (0600, a regular file, not a symlink); a KMS or an
//! HSM would replace [`AttestKey`] behind the same two methods, [`AttestKey::sign_file`] and
//! [`AttestKey::dsse`] (docs/bake.md, "Provenance").

use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use p256::ecdsa::signature::hazmat::PrehashSigner as _;
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::signature::Verifier as _;
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{
    DecodePrivateKey as _, DecodePublicKey as _, EncodePrivateKey as _, EncodePublicKey as _,
    LineEnding,
};
use sha2::Digest as _;

/// The payload type of an in-toto statement in a DSSE envelope.
pub const IN_TOTO: &str = "application/vnd.in-toto+json";

/// The most a key file may hold: a PEM key is a few hundred bytes.
const MAX_KEY: u64 = 16 * 1024;

/// Why a key could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    /// The key file is not one kiln uses.
    #[error("signing key {path}: {why}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// What is wrong, and what to do.
        why: String,
    },
    /// Reading or writing a file failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What kiln was doing.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// A private key kiln signs with.
pub struct AttestKey {
    key: SigningKey,
}

impl std::fmt::Debug for AttestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AttestKey({})", self.id())
    }
}

/// Makes a key pair: `PREFIX.key` (PKCS#8 PEM, 0600) and `PREFIX.pub` (SPKI PEM, 0644), never
/// over existing files. Returns the two paths and the key id.
pub fn generate(prefix: &Path) -> Result<(PathBuf, PathBuf, String), AttestError> {
    let with = |ext: &str| {
        let mut p = prefix.as_os_str().to_owned();
        p.push(ext);
        PathBuf::from(p)
    };
    let (private, public) = (with(".key"), with(".pub"));
    for p in [&private, &public] {
        if std::fs::symlink_metadata(p).is_ok() {
            return Err(AttestError::Key {
                path: p.clone(),
                why: "exists already; kiln key generate replaces no key (move it away, or name another prefix)".into(),
            });
        }
    }
    let key = AttestKey {
        key: SigningKey::random(&mut rand_core::OsRng),
    };
    let pem = key
        .key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| AttestError::Key {
            path: private.clone(),
            why: format!("encoding: {e}"),
        })?;
    let write = |path: &Path, bytes: &[u8], mode: u32| {
        crate::atomic_file::write(path, ".kiln-key-", bytes, mode).map_err(|e| AttestError::Io {
            action: "writing",
            path: e.path,
            source: e.source,
        })
    };
    write(&private, pem.as_bytes(), 0o600)?;
    write(&public, key.public_pem().as_bytes(), 0o644)?;
    Ok((private, public, key.id()))
}

impl AttestKey {
    /// Reads a private key: PKCS#8 (`PRIVATE KEY`, as `kiln key generate` and `openssl
    /// genpkey` write) or SEC1 (`EC PRIVATE KEY`, as `openssl ecparam -genkey` writes), P-256,
    /// unencrypted, in a regular file readable by its owner only.
    pub fn load(path: &Path) -> Result<AttestKey, AttestError> {
        let bad = |why: String| AttestError::Key {
            path: path.to_path_buf(),
            why,
        };
        let meta = std::fs::symlink_metadata(path).map_err(|source| AttestError::Io {
            action: "reading",
            path: path.to_path_buf(),
            source,
        })?;
        if !meta.file_type().is_file() {
            return Err(bad(
                "expected a regular file (not a symlink, FIFO or device)".into(),
            ));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(bad(format!(
                "mode {:04o} lets others read it; expected 0600 (chmod 600 {})",
                meta.mode() & 0o7777,
                path.display()
            )));
        }
        if meta.len() > MAX_KEY {
            return Err(bad(format!(
                "{} bytes; a PEM key is under {MAX_KEY}",
                meta.len()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|source| AttestError::Io {
            action: "reading",
            path: path.to_path_buf(),
            source,
        })?;
        let key = if text.contains("-----BEGIN PRIVATE KEY-----") {
            SigningKey::from_pkcs8_pem(&text).map_err(|e| {
                bad(format!(
                    "not a P-256 PKCS#8 key ({e}); kiln signs with ECDSA P-256"
                ))
            })?
        } else if text.contains("-----BEGIN EC PRIVATE KEY-----") {
            let sk = p256::SecretKey::from_sec1_pem(&text)
                .map_err(|e| bad(format!("not a P-256 SEC1 key ({e})")))?;
            SigningKey::from(sk)
        } else if text.contains("ENCRYPTED") {
            return Err(bad(
                "an encrypted key; kiln reads unencrypted PEM keys kept 0600 (kiln key generate)"
                    .into(),
            ));
        } else {
            return Err(bad(
                "expected a PEM private key (-----BEGIN PRIVATE KEY----- or EC PRIVATE KEY)".into(),
            ));
        };
        Ok(AttestKey { key })
    }

    /// The public key as SPKI PEM (`PUBLIC KEY`), what verifiers are given.
    pub fn public_pem(&self) -> String {
        self.key
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap_or_default()
    }

    /// A short id: the first 16 hex digits of the SHA-256 of the public key's DER.
    pub fn id(&self) -> String {
        key_id(self.key.verifying_key())
    }

    /// The P-256 key itself (a sysext DDI's dm-verity signature is made with it).
    pub fn signing_key(&self) -> &SigningKey {
        &self.key
    }

    /// The public half, to check what this key signed before publishing it.
    pub fn verify_key(&self) -> VerifyKey {
        VerifyKey {
            key: *self.key.verifying_key(),
            path: PathBuf::from("(the signing key's public half)"),
        }
    }

    /// The signature of `message` as cosign checks a signed payload (a container image
    /// signature's simple-signing document): base64 of the DER ECDSA signature over its
    /// SHA-256.
    pub fn sign_bytes(&self, message: &[u8]) -> String {
        let sig: Signature = self.key.sign(message);
        base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes())
    }

    /// The signature of `path` as `cosign verify-blob --key` checks it: base64 of the DER
    /// ECDSA signature over the file's SHA-256, read in pieces (a layer is large).
    pub fn sign_file(&self, path: &Path) -> Result<String, AttestError> {
        let io = |source| AttestError::Io {
            action: "reading",
            path: path.to_path_buf(),
            source,
        };
        let mut f = std::fs::File::open(path).map_err(io)?;
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        self.sign_sha256(&h.finalize())
            .map_err(|why| AttestError::Key {
                path: path.to_path_buf(),
                why,
            })
    }

    /// [`AttestKey::sign_file`] for a file whose SHA-256 (32 bytes) is known already.
    pub fn sign_sha256(&self, digest: &[u8]) -> Result<String, String> {
        let sig: Signature = self
            .key
            .sign_prehash(digest)
            .map_err(|e| format!("signing: {e}"))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes()))
    }

    /// A DSSE envelope (JSON, one line) of `payload` of type `payload_type`: the signature is
    /// over DSSE's pre-authentication encoding ([`pae`]).
    pub fn dsse(&self, payload_type: &str, payload: &[u8]) -> String {
        let sig: Signature = self.key.sign(&pae(payload_type, payload));
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut s = serde_json::json!({
            "payloadType": payload_type,
            "payload": b64.encode(payload),
            "signatures": [{"keyid": "", "sig": b64.encode(sig.to_der().as_bytes())}],
        })
        .to_string();
        s.push('\n');
        s
    }
}

fn key_id(vk: &VerifyingKey) -> String {
    let der = vk
        .to_public_key_der()
        .map(|d| d.as_bytes().to_vec())
        .unwrap_or_default();
    hex::encode(sha2::Sha256::digest(der))[..16].to_string()
}

/// A public key kiln verifies with: SPKI PEM (`PUBLIC KEY`), as `kiln key generate` writes
/// `PREFIX.pub` and cosign writes `cosign.pub`.
pub struct VerifyKey {
    key: VerifyingKey,
    path: PathBuf,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerifyKey({})", self.id())
    }
}

impl VerifyKey {
    /// Reads a public key from a regular file of at most 16 KiB.
    pub fn load(path: &Path) -> Result<VerifyKey, AttestError> {
        let bad = |why: String| AttestError::Key {
            path: path.to_path_buf(),
            why,
        };
        let text = crate::bounded_read::read_text(path, MAX_KEY).map_err(|e| {
            bad(format!(
                "{e} (expected the public key kiln key generate wrote, PREFIX.pub)"
            ))
        })?;
        if text.contains("PRIVATE KEY") {
            return Err(bad(
                "a private key; give the public half (PREFIX.pub), which is all a verifier needs"
                    .into(),
            ));
        }
        let key = VerifyingKey::from_public_key_pem(text.trim()).map_err(|e| {
            bad(format!(
                "not a P-256 public key in PEM (-----BEGIN PUBLIC KEY-----): {e}"
            ))
        })?;
        Ok(VerifyKey {
            key,
            path: path.to_path_buf(),
        })
    }

    /// The key's id, as [`AttestKey::id`].
    pub fn id(&self) -> String {
        key_id(&self.key)
    }

    /// The key file, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn decode(sig_b64: &str) -> Result<Signature, String> {
        let der = base64::engine::general_purpose::STANDARD
            .decode(sig_b64.trim())
            .map_err(|_| "the signature is not base64".to_string())?;
        Signature::from_der(&der).map_err(|_| "the signature is not a DER ECDSA signature".into())
    }

    /// Checks a signature [`AttestKey::sign_sha256`] made over a file whose SHA-256 is
    /// `digest`.
    pub fn verify_sha256(&self, digest: &[u8], sig_b64: &str) -> Result<(), String> {
        use p256::ecdsa::signature::hazmat::PrehashVerifier as _;
        self.key
            .verify_prehash(digest, &Self::decode(sig_b64)?)
            .map_err(|_| format!("the signature is not key {}'s", self.id()))
    }

    /// Checks a signature [`AttestKey::sign_bytes`] made over `message`.
    pub fn verify_bytes(&self, message: &[u8], sig_b64: &str) -> Result<(), String> {
        self.key
            .verify(message, &Self::decode(sig_b64)?)
            .map_err(|_| format!("the signature is not key {}'s", self.id()))
    }

    /// Opens a DSSE envelope: the payload of type `payload_type` when one of its signatures
    /// is this key's.
    pub fn open_dsse(&self, envelope: &[u8], payload_type: &str) -> Result<Vec<u8>, String> {
        let v: serde_json::Value = serde_json::from_slice(envelope)
            .map_err(|e| format!("not a DSSE envelope (JSON: {e})"))?;
        let got = v["payloadType"].as_str().unwrap_or("");
        if got != payload_type {
            return Err(format!("payloadType {got:?}, expected {payload_type:?}"));
        }
        let payload = base64::engine::general_purpose::STANDARD
            .decode(v["payload"].as_str().unwrap_or(""))
            .map_err(|_| "the payload is not base64".to_string())?;
        let sigs = v["signatures"].as_array().cloned().unwrap_or_default();
        let pae = pae(payload_type, &payload);
        if sigs.iter().any(|s| {
            self.verify_bytes(&pae, s["sig"].as_str().unwrap_or(""))
                .is_ok()
        }) {
            Ok(payload)
        } else {
            Err(format!(
                "none of its {} signature(s) is key {}'s",
                sigs.len(),
                self.id()
            ))
        }
    }
}

/// DSSE's pre-authentication encoding: `DSSEv1 <len(type)> <type> <len(body)> <body>`
/// (<https://github.com/secure-systems-lab/dsse/blob/master/protocol.md>).
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_dsse_v1() {
        assert_eq!(pae("a/b", b"hi"), b"DSSEv1 3 a/b 2 hi".to_vec());
    }

    #[test]
    fn a_generated_key_signs_what_its_public_half_verifies_and_is_refused_when_readable() {
        let d = tempfile::tempdir().unwrap();
        let prefix = d.path().join("k");
        let (private, public, id) = generate(&prefix).unwrap();
        assert_eq!(std::fs::metadata(&private).unwrap().mode() & 0o777, 0o600);
        assert!(generate(&prefix).is_err(), "no key is replaced");
        let key = AttestKey::load(&private).unwrap();
        assert_eq!(key.id(), id);
        let vk =
            VerifyingKey::from_public_key_pem(&std::fs::read_to_string(&public).unwrap()).unwrap();
        let env: serde_json::Value = serde_json::from_str(&key.dsse(IN_TOTO, b"{}")).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD;
        let sig = b64
            .decode(env["signatures"][0]["sig"].as_str().unwrap())
            .unwrap();
        let sig = Signature::from_der(&sig).unwrap();
        vk.verify(&pae(IN_TOTO, b"{}"), &sig).unwrap();
        assert!(vk.verify(&pae(IN_TOTO, b"{ }"), &sig).is_err());
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = AttestKey::load(&private).unwrap_err().to_string();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
    }
}
