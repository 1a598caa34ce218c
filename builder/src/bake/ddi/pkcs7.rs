//! The signing half of a signed DDI: a deterministic self-signed X.509 certificate for a
//! P-256 key, and the detached PKCS#7 SignedData over the root hash that systemd checks
//! against the certificates in `/etc/verity.d` (OpenSSL's `PKCS7_verify`) and the kernel
//! against its keyrings. Hand-encoded DER: the shape must match `PKCS7_sign` with
//! `PKCS7_DETACHED|PKCS7_NOATTR` (no signed attributes, IssuerAndSerialNumber), which
//! the RustCrypto `cms` builder cannot produce.

use p256::ecdsa::signature::Signer;
use p256::ecdsa::{DerSignature, SigningKey};
use p256::pkcs8::{EncodePublicKey, ObjectIdentifier};
use sha2::{Digest, Sha256};

const ID_SIGNED_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.2");
const ID_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.1");
const ID_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
const ID_ECDSA_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2");
const ID_COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
const ID_SUBJECT_KEY_ID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.14");
const ID_AUTHORITY_KEY_ID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.35");
const ID_BASIC_CONSTRAINTS: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.19");

/// RFC 5280's "no well-defined expiration date".
const NOT_AFTER_NEVER: &str = "99991231235959Z";

/// Why a certificate cannot sign.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    /// The DER does not have the shape of an X.509 certificate.
    #[error("not an X.509 certificate in DER: expected {expected}, found {found}")]
    Malformed {
        /// What the parser looked for.
        expected: &'static str,
        /// What it found instead.
        found: String,
    },
    /// The certificate names another public key than the signing key's.
    #[error("the certificate's public key is not the signing key's (subjectPublicKeyInfo SHA-256 {cert} vs {key})")]
    KeyMismatch {
        /// SHA-256 of the certificate's subjectPublicKeyInfo, hex.
        cert: String,
        /// SHA-256 of the signing key's, hex.
        key: String,
    },
}

/// A self-signed X.509 v3 certificate (DER) for `key`, the same bytes for the same inputs:
/// subject and issuer `CN=common_name`, serial from the key, valid from `not_before` (Unix
/// seconds, e.g. the bake's epoch) with no expiry; basic constraints CA, subject and
/// authority key identifiers (what `openssl req -x509` writes). systemd checks no dates.
pub fn self_signed_certificate(key: &SigningKey, common_name: &str, not_before: u64) -> Vec<u8> {
    let spki = spki_der(key);
    let point = key.verifying_key().to_encoded_point(false);
    let key_id = sha1::Sha1::digest(point.as_bytes());
    let mut serial: [u8; 16] = Sha256::digest(&spki)[..16].try_into().expect("16 bytes");
    serial[0] = (serial[0] & 0x7f) | 0x40; // positive and without a leading zero byte
    let name = seq(&[&set(&[&seq(&[
        &oid(ID_COMMON_NAME),
        &tlv(0x0c, common_name.as_bytes()),
    ])])]);
    let extensions = seq(&[
        &seq(&[&oid(ID_SUBJECT_KEY_ID), &tlv(0x04, &tlv(0x04, &key_id))]),
        &seq(&[
            &oid(ID_AUTHORITY_KEY_ID),
            &tlv(0x04, &seq(&[&tlv(0x80, &key_id)])),
        ]),
        &seq(&[
            &oid(ID_BASIC_CONSTRAINTS),
            &TRUE,
            &tlv(0x04, &seq(&[&TRUE])),
        ]),
    ]);
    let tbs = seq(&[
        &tlv(0xa0, &integer(&[2])),
        &integer(&serial),
        &ecdsa_sha256(),
        &name,
        &seq(&[&time(not_before), &tlv(0x18, NOT_AFTER_NEVER.as_bytes())]),
        &name,
        &spki,
        &tlv(0xa3, &extensions),
    ]);
    let signature: DerSignature = key.sign(&tbs);
    seq(&[&tbs, &ecdsa_sha256(), &bit_string(signature.as_bytes())])
}

/// The certificate as PEM, for `/etc/verity.d/*.crt`.
pub fn certificate_pem(der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// A detached PKCS#7 SignedData (DER) over `message`: ECDSA with SHA-256, the signer named
/// by the certificate's issuer and serial, the certificate included, no signed attributes.
/// RFC 6979 nonces make it the same bytes for the same inputs.
pub fn sign_detached(
    message: &[u8],
    key: &SigningKey,
    cert_der: &[u8],
) -> Result<Vec<u8>, CertError> {
    let cert = certificate_for(cert_der, key)?;
    let signature: DerSignature = key.sign(message);
    let sha256 = seq(&[&oid(ID_SHA256), &NULL]);
    let signer_info = seq(&[
        &integer(&[1]),
        &seq(&[cert.issuer, cert.serial]),
        &sha256,
        &ecdsa_sha256(),
        &tlv(0x04, signature.as_bytes()),
    ]);
    let signed_data = seq(&[
        &integer(&[1]),
        &set(&[&sha256]),
        &seq(&[&oid(ID_DATA)]),
        &tlv(0xa0, cert_der),
        &set(&[&signer_info]),
    ]);
    Ok(seq(&[&oid(ID_SIGNED_DATA), &tlv(0xa0, &signed_data)]))
}

/// Checks that `cert_der` is a certificate of `key`'s public key, before anything is signed.
pub fn check_certificate(cert_der: &[u8], key: &SigningKey) -> Result<(), CertError> {
    certificate_for(cert_der, key).map(|_| ())
}

fn certificate_for<'a>(cert_der: &'a [u8], key: &SigningKey) -> Result<CertParts<'a>, CertError> {
    let cert = parse_certificate(cert_der)?;
    let ours = spki_der(key);
    if cert.spki != ours.as_slice() {
        return Err(CertError::KeyMismatch {
            cert: hex::encode(Sha256::digest(cert.spki)),
            key: hex::encode(Sha256::digest(&ours)),
        });
    }
    Ok(cert)
}

fn spki_der(key: &SigningKey) -> Vec<u8> {
    key.verifying_key()
        .to_public_key_der()
        .expect("a P-256 public key encodes")
        .into_vec()
}

// ---- DER writing -------------------------------------------------------------------------

const NULL: [u8; 2] = [0x05, 0x00];
const TRUE: [u8; 3] = [0x01, 0x01, 0xff];

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

fn seq(parts: &[&[u8]]) -> Vec<u8> {
    tlv(0x30, &parts.concat())
}

/// A SET OF with its elements in DER order (sorted by encoding).
fn set(parts: &[&[u8]]) -> Vec<u8> {
    let mut sorted = parts.to_vec();
    sorted.sort();
    tlv(0x31, &sorted.concat())
}

fn oid(id: ObjectIdentifier) -> Vec<u8> {
    tlv(0x06, id.as_bytes())
}

/// A non-negative INTEGER from big-endian magnitude bytes.
fn integer(magnitude: &[u8]) -> Vec<u8> {
    let trimmed = match magnitude.iter().position(|&b| b != 0) {
        Some(i) => &magnitude[i..],
        None => &[0u8][..],
    };
    if trimmed[0] & 0x80 != 0 {
        tlv(0x02, &[&[0u8][..], trimmed].concat())
    } else {
        tlv(0x02, trimmed)
    }
}

fn bit_string(bytes: &[u8]) -> Vec<u8> {
    tlv(0x03, &[&[0u8][..], bytes].concat())
}

fn ecdsa_sha256() -> Vec<u8> {
    seq(&[&oid(ID_ECDSA_SHA256)])
}

/// UTCTime through 2049, GeneralizedTime from 2050 (RFC 5280 4.1.2.5).
fn time(unix: u64) -> Vec<u8> {
    let (y, mo, d, h, mi, s) = crate::layer_contract::civil(unix);
    if (1950..2050).contains(&y) {
        let text = format!("{:02}{mo:02}{d:02}{h:02}{mi:02}{s:02}Z", y % 100);
        tlv(0x17, text.as_bytes())
    } else {
        tlv(
            0x18,
            format!("{y:04}{mo:02}{d:02}{h:02}{mi:02}{s:02}Z").as_bytes(),
        )
    }
}

// ---- DER reading -------------------------------------------------------------------------

/// One element: its tag, its whole encoding and its contents.
struct Element<'a> {
    tag: u8,
    whole: &'a [u8],
    content: &'a [u8],
}

fn malformed(expected: &'static str, found: impl Into<String>) -> CertError {
    CertError::Malformed {
        expected,
        found: found.into(),
    }
}

/// Splits the first element off `input`; `what` names it in errors.
fn element<'a>(input: &'a [u8], what: &'static str) -> Result<(Element<'a>, &'a [u8]), CertError> {
    let short = || malformed(what, format!("{} bytes", input.len()));
    let (&tag, rest) = input.split_first().ok_or_else(short)?;
    let (&first, rest) = rest.split_first().ok_or_else(short)?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(malformed(what, format!("length byte {first:#04x}")));
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, &b| a << 8 | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(short());
    }
    let header = input.len() - rest.len();
    let el = Element {
        tag,
        whole: &input[..header + len],
        content: &rest[..len],
    };
    Ok((el, &rest[len..]))
}

/// Like [`element`], and the tag must be `tag`.
fn expect<'a>(
    input: &'a [u8],
    tag: u8,
    what: &'static str,
) -> Result<(Element<'a>, &'a [u8]), CertError> {
    let (el, rest) = element(input, what)?;
    if el.tag != tag {
        return Err(malformed(what, format!("tag {:#04x}", el.tag)));
    }
    Ok((el, rest))
}

/// The parts of a certificate a signer needs, as their DER encodings.
struct CertParts<'a> {
    serial: &'a [u8],
    issuer: &'a [u8],
    spki: &'a [u8],
}

fn parse_certificate(der: &[u8]) -> Result<CertParts<'_>, CertError> {
    let (cert, rest) = expect(der, 0x30, "a Certificate SEQUENCE")?;
    if !rest.is_empty() {
        return Err(malformed(
            "nothing after the certificate",
            format!("{} bytes", rest.len()),
        ));
    }
    let (tbs, _) = expect(cert.content, 0x30, "a tbsCertificate SEQUENCE")?;
    let mut fields = tbs.content;
    if fields.first() == Some(&0xa0) {
        fields = element(fields, "a version")?.1;
    }
    let (serial, fields) = expect(fields, 0x02, "a serialNumber INTEGER")?;
    let (_, fields) = expect(fields, 0x30, "a signature AlgorithmIdentifier")?;
    let (issuer, fields) = expect(fields, 0x30, "an issuer Name")?;
    let (_, fields) = expect(fields, 0x30, "a Validity")?;
    let (_, fields) = expect(fields, 0x30, "a subject Name")?;
    let (spki, _) = expect(fields, 0x30, "a subjectPublicKeyInfo")?;
    Ok(CertParts {
        serial: serial.whole,
        issuer: issuer.whole,
        spki: spki.whole,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bake::ddi::test_tools::{run, tool};
    use p256::pkcs8::DecodePrivateKey;
    use std::path::Path;

    const EPOCH: u64 = 1_700_000_000; // 2023-11-14T22:13:20Z

    fn key(n: u8) -> SigningKey {
        SigningKey::from_slice(&Sha256::digest([n])).unwrap()
    }

    fn put(dir: &Path, name: &str, bytes: &[u8]) -> String {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    }

    #[test]
    fn der_lengths_and_integers() {
        assert_eq!(tlv(0x04, &[7; 3]), [4, 3, 7, 7, 7]);
        assert_eq!(&tlv(0x04, &[0; 200])[..3], [4, 0x81, 200]);
        assert_eq!(&tlv(0x04, &[0; 300])[..4], [4, 0x82, 1, 44]);
        assert_eq!(integer(&[0, 0, 5]), [2, 1, 5]);
        assert_eq!(integer(&[0x80]), [2, 2, 0, 0x80]);
        assert_eq!(integer(&[0]), [2, 1, 0]);
        assert_eq!(time(EPOCH), tlv(0x17, b"231114221320Z"));
        assert_eq!(time(2_524_608_000), tlv(0x18, b"20500101000000Z"));
    }

    #[test]
    fn deterministic_and_bound_to_the_key() {
        let cert = self_signed_certificate(&key(1), "kiln test", EPOCH);
        assert_eq!(cert, self_signed_certificate(&key(1), "kiln test", EPOCH));
        let sig = sign_detached(b"abc", &key(1), &cert).unwrap();
        assert_eq!(sig, sign_detached(b"abc", &key(1), &cert).unwrap());
        let err = sign_detached(b"abc", &key(2), &cert).unwrap_err();
        assert!(matches!(err, CertError::KeyMismatch { .. }), "{err}");
        let err = sign_detached(b"abc", &key(1), &cert[..cert.len() - 1]).unwrap_err();
        assert!(matches!(err, CertError::Malformed { .. }), "{err}");
    }

    /// OpenSSL parses the certificate, checks its self-signature, and accepts the detached
    /// signature both as `openssl cms -verify` does (chain to the CA file) and as systemd's
    /// `PKCS7_verify(NOINTERN|NOVERIFY)` does (signer must be a given certificate); it refuses
    /// another message and another key's certificate, and reports no signed attributes.
    #[test]
    fn openssl_verifies() {
        let openssl = tool("openssl", "openssl");
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let cert = self_signed_certificate(&key(1), "kiln test", EPOCH);
        let other = self_signed_certificate(&key(2), "kiln test", EPOCH);
        let msg = hex::encode(Sha256::digest(b"root"));
        let cert_pem = put(d, "cert.pem", certificate_pem(&cert).as_bytes());
        let other_pem = put(d, "other.pem", certificate_pem(&other).as_bytes());
        let text = run(&openssl, &["x509", "-in", &cert_pem, "-noout", "-text"]).unwrap();
        for want in [
            "CN = kiln test",
            "ecdsa-with-SHA256",
            "CA:TRUE",
            "NIST CURVE: P-256",
        ] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
        let verify = ["verify", "-check_ss_sig", "-CAfile", &cert_pem, &cert_pem];
        run(&openssl, &verify).expect("self-signature");

        let sig = put(
            d,
            "sig.der",
            &sign_detached(msg.as_bytes(), &key(1), &cert).unwrap(),
        );
        let good = put(d, "good", msg.as_bytes());
        let bad = put(d, "bad", &msg.as_bytes()[1..]);
        let cms = |content: &str, ca: &str| {
            run(
                &openssl,
                &[
                    "cms",
                    "-verify",
                    "-inform",
                    "DER",
                    "-in",
                    &sig,
                    "-binary",
                    "-content",
                    content,
                    "-CAfile",
                    ca,
                    "-purpose",
                    "any",
                    "-out",
                    "/dev/null",
                ],
            )
        };
        let systemd = |content: &str, trusted: &str| {
            run(
                &openssl,
                &[
                    "smime",
                    "-verify",
                    "-inform",
                    "DER",
                    "-in",
                    &sig,
                    "-binary",
                    "-content",
                    content,
                    "-nointern",
                    "-noverify",
                    "-certfile",
                    trusted,
                    "-out",
                    "/dev/null",
                ],
            )
        };
        cms(&good, &cert_pem).expect("cms accepts");
        systemd(&good, &cert_pem).expect("PKCS7_verify accepts");
        assert!(
            cms(&bad, &cert_pem).is_err(),
            "cms accepted another message"
        );
        assert!(
            systemd(&bad, &cert_pem).is_err(),
            "PKCS7_verify accepted another message"
        );
        assert!(
            cms(&good, &other_pem).is_err(),
            "cms accepted an untrusted signer"
        );
        assert!(
            systemd(&good, &other_pem).is_err(),
            "PKCS7_verify took another cert"
        );

        let print = run(
            &openssl,
            &[
                "cms", "-cmsout", "-print", "-inform", "DER", "-in", &sig, "-noout",
            ],
        )
        .unwrap();
        let mut lines = print.lines().map(str::trim);
        let attrs = lines
            .find(|l| *l == "signedAttrs:")
            .and_then(|_| lines.next());
        assert_eq!(attrs, Some("<ABSENT>"), "{print}");
        assert!(print.contains("d.issuerAndSerialNumber"), "{print}");
    }

    /// A certificate and key made by `openssl req -x509` sign as well as kiln's own.
    #[test]
    fn signs_with_an_openssl_certificate() {
        let openssl = tool("openssl", "openssl");
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (key_pem, cert_pem) = (put(d, "k.pem", b""), put(d, "c.pem", b""));
        run(
            &openssl,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                "/CN=elsewhere/O=x",
                "-days",
                "30",
                "-keyout",
                &key_pem,
                "-out",
                &cert_pem,
            ],
        )
        .unwrap();
        let cert_der = put(d, "c.der", b"");
        run(
            &openssl,
            &[
                "x509", "-in", &cert_pem, "-outform", "DER", "-out", &cert_der,
            ],
        )
        .unwrap();
        let key = SigningKey::from_pkcs8_pem(&std::fs::read_to_string(&key_pem).unwrap()).unwrap();
        let sig = sign_detached(b"hello", &key, &std::fs::read(&cert_der).unwrap()).unwrap();
        let (sig, msg) = (put(d, "s.der", &sig), put(d, "m", b"hello"));
        run(
            &openssl,
            &[
                "smime",
                "-verify",
                "-inform",
                "DER",
                "-in",
                &sig,
                "-binary",
                "-content",
                &msg,
                "-nointern",
                "-noverify",
                "-certfile",
                &cert_pem,
                "-out",
                "/dev/null",
            ],
        )
        .expect("PKCS7_verify accepts");
    }
}
