//! The CA bundle's certificates: PEM blocks to DER, and the SHA-256 of each certificate's
//! SubjectPublicKeyInfo, the pin kubeadm discovery checks (`caCertHashes`).

use base64::Engine as _;
use sha2::{Digest, Sha256};

/// Extracts the DER bytes of every `CERTIFICATE` block of a PEM bundle.
pub fn pem_certificates(pem: &str) -> Result<Vec<Vec<u8>>, String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(start) = rest.find(BEGIN) {
        let body = &rest[start + BEGIN.len()..];
        let end = body
            .find(END)
            .ok_or_else(|| format!("certificate {} has no {END} line", out.len() + 1))?;
        let b64: String = body[..end].chars().filter(|c| !c.is_whitespace()).collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("certificate {} is not valid base64: {e}", out.len() + 1))?;
        out.push(der);
        rest = &body[end + END.len()..];
    }
    if out.is_empty() {
        return Err(format!("no {BEGIN} block"));
    }
    Ok(out)
}

/// One DER element: its tag and the byte ranges of the whole element and of its content.
struct Tlv {
    tag: u8,
    whole: std::ops::Range<usize>,
    content: std::ops::Range<usize>,
}

fn tlv(der: &[u8], at: usize) -> Result<Tlv, String> {
    let short = || format!("truncated DER at byte {at}");
    let tag = *der.get(at).ok_or_else(short)?;
    let first = *der.get(at + 1).ok_or_else(short)?;
    let (len, header) = if first < 0x80 {
        (first as usize, 2)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 {
            return Err(format!(
                "unsupported DER length form 0x{first:02x} at byte {at}"
            ));
        }
        let bytes = der.get(at + 2..at + 2 + n).ok_or_else(short)?;
        (
            bytes.iter().fold(0usize, |acc, b| acc << 8 | *b as usize),
            2 + n,
        )
    };
    let start = at + header;
    let end = start
        .checked_add(len)
        .filter(|e| *e <= der.len())
        .ok_or_else(short)?;
    Ok(Tlv {
        tag,
        whole: at..end,
        content: start..end,
    })
}

/// `sha256:<hex>` of a certificate's SubjectPublicKeyInfo, the pin kubeadm's
/// `caCertHashes` / `--discovery-token-ca-cert-hash` expects (RFC 7469 style).
pub fn spki_sha256(cert_der: &[u8]) -> Result<String, String> {
    const SEQUENCE: u8 = 0x30;
    let cert = tlv(cert_der, 0)?;
    if cert.tag != SEQUENCE {
        return Err("not a DER certificate (no outer SEQUENCE)".into());
    }
    let tbs = tlv(cert_der, cert.content.start)?;
    if tbs.tag != SEQUENCE {
        return Err("not a DER certificate (no tbsCertificate SEQUENCE)".into());
    }
    // tbsCertificate: [0] version (optional), serial, signature, issuer, validity, subject, SPKI.
    let mut at = tbs.content.start;
    let mut field = tlv(cert_der, at)?;
    if field.tag == 0xa0 {
        at = field.whole.end;
        field = tlv(cert_der, at)?;
    }
    for _ in 0..5 {
        at = field.whole.end;
        field = tlv(cert_der, at)?;
    }
    if field.tag != SEQUENCE || field.whole.end > tbs.content.end {
        return Err("no SubjectPublicKeyInfo where X.509 puts it".into());
    }
    Ok(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(&cert_der[field.whole]))
    ))
}
