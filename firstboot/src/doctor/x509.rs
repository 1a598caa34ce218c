//! Just enough X.509 for `doctor`: PEM and base64, a DER walker, and the fields a join
//! depends on (subject and issuer names, validity, subject alternative names, key
//! identifiers). Signatures are not verified here: kubelet verifies them; doctor tells a
//! certificate that cannot work (wrong names, dates, issuer) from one that may.
//!
//! Layout from RFC 5280 §4.1 (Certificate, TBSCertificate, Validity, Extensions) and
//! §4.2.1.1/.2/.6 (authority and subject key identifiers, subject alternative name).

use std::net::IpAddr;

/// The fields of one certificate doctor reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cert {
    /// The subject's common name, when it has one.
    pub subject_cn: String,
    /// The DER of the subject Name, for issuer matching.
    pub subject: Vec<u8>,
    /// The DER of the issuer Name.
    pub issuer: Vec<u8>,
    /// notBefore, seconds since the Unix epoch.
    pub not_before: i64,
    /// notAfter, seconds since the Unix epoch.
    pub not_after: i64,
    /// dNSName entries of the subject alternative name.
    pub dns_names: Vec<String>,
    /// iPAddress entries of the subject alternative name.
    pub ips: Vec<IpAddr>,
    /// The subject key identifier extension.
    pub subject_key_id: Option<Vec<u8>>,
    /// The key identifier of the authority key identifier extension.
    pub authority_key_id: Option<Vec<u8>>,
}

impl Cert {
    /// Whether `host` (a DNS name or an IP literal, without brackets) is one of this
    /// certificate's names, with RFC 6125 §6.4.3's single left-most `*` label.
    pub fn names_host(&self, host: &str) -> bool {
        if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
            return self.ips.contains(&ip);
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.dns_names.iter().any(|n| {
            let n = n.trim_end_matches('.').to_ascii_lowercase();
            match n.strip_prefix("*.") {
                Some(rest) => host
                    .split_once('.')
                    .is_some_and(|(first, tail)| !first.is_empty() && tail == rest),
                None => n == host,
            }
        })
    }

    /// Whether `issuer` could have signed this certificate: its subject is this one's issuer
    /// and, where both carry key identifiers, they agree.
    pub fn issued_by(&self, issuer: &Cert) -> bool {
        if self.issuer != issuer.subject {
            return false;
        }
        match (&self.authority_key_id, &issuer.subject_key_id) {
            (Some(a), Some(s)) => a == s,
            _ => true,
        }
    }

    /// The names for a message: the SANs, or the common name.
    pub fn names(&self) -> String {
        let mut v: Vec<String> = self.dns_names.clone();
        v.extend(self.ips.iter().map(|ip| ip.to_string()));
        if v.is_empty() {
            format!("CN={}", self.subject_cn)
        } else {
            v.join(", ")
        }
    }
}

/// Decodes standard base64 (RFC 4648 §4), ignoring ASCII whitespace.
pub fn base64(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits, mut pad) = (0u32, 0u32, 0usize);
    for c in text.bytes().filter(|c| !c.is_ascii_whitespace()) {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => {
                pad += 1;
                continue;
            }
            _ => return Err(format!("not base64: byte {c:#04x}")),
        };
        if pad > 0 {
            return Err("base64 data after '='".into());
        }
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if pad > 2 || bits >= 6 {
        return Err("truncated base64".into());
    }
    Ok(out)
}

/// Every `CERTIFICATE` block of a PEM text, decoded and parsed, in order.
pub fn pem_certs(text: &str) -> Result<Vec<Cert>, String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let body = &rest[start + BEGIN.len()..];
        let end = body
            .find(END)
            .ok_or_else(|| format!("certificate {} has no END line", out.len() + 1))?;
        let der =
            base64(&body[..end]).map_err(|e| format!("certificate {}: {e}", out.len() + 1))?;
        out.push(parse(&der).map_err(|e| format!("certificate {}: {e}", out.len() + 1))?);
        rest = &body[end + END.len()..];
    }
    if out.is_empty() {
        return Err("no PEM CERTIFICATE block".into());
    }
    Ok(out)
}

/// One DER element: its tag, its content, and what follows it.
fn element(data: &[u8]) -> Result<(u8, &[u8], &[u8]), String> {
    let (&tag, rest) = data.split_first().ok_or("truncated DER: no tag")?;
    if tag & 0x1f == 0x1f {
        return Err(format!("unsupported multi-byte DER tag {tag:#04x}"));
    }
    let (&first, rest) = rest.split_first().ok_or("truncated DER: no length")?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(format!("bad DER length form {first:#04x}"));
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, b| (a << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(format!(
            "truncated DER: element of {len} bytes, {} left",
            rest.len()
        ));
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

/// The element with `tag`, or an error naming what was expected.
fn expect<'a>(data: &'a [u8], tag: u8, what: &str) -> Result<(&'a [u8], &'a [u8]), String> {
    let (t, body, rest) = element(data)?;
    if t != tag {
        return Err(format!(
            "expected {what} (tag {tag:#04x}), found tag {t:#04x}"
        ));
    }
    Ok((body, rest))
}

/// The whole DER encoding (tag, length and content) of the first element of `data`.
fn whole(data: &[u8]) -> Result<&[u8], String> {
    let (_, _, rest) = element(data)?;
    Ok(&data[..data.len() - rest.len()])
}

const SEQUENCE: u8 = 0x30;
const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_SKI: &[u8] = &[0x55, 0x1d, 0x0e];
const OID_SAN: &[u8] = &[0x55, 0x1d, 0x11];
const OID_AKI: &[u8] = &[0x55, 0x1d, 0x23];

/// Parses one DER certificate.
pub fn parse(der: &[u8]) -> Result<Cert, String> {
    let (cert, _) = expect(der, SEQUENCE, "Certificate SEQUENCE")?;
    let (tbs, _) = expect(cert, SEQUENCE, "TBSCertificate SEQUENCE")?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = element(rest)?.2; // [0] version
    }
    rest = expect(rest, 0x02, "serialNumber INTEGER")?.1;
    rest = expect(rest, SEQUENCE, "signature AlgorithmIdentifier")?.1;
    let issuer = whole(rest)?.to_vec();
    rest = expect(rest, SEQUENCE, "issuer Name")?.1;
    let (validity, after) = expect(rest, SEQUENCE, "Validity")?;
    let (not_before, v) = time(validity)?;
    let (not_after, _) = time(v)?;
    rest = after;
    let subject = whole(rest)?.to_vec();
    let (subject_body, after) = expect(rest, SEQUENCE, "subject Name")?;
    rest = expect(after, SEQUENCE, "subjectPublicKeyInfo")?.1;
    let mut cert = Cert {
        subject_cn: common_name(subject_body)?,
        subject,
        issuer,
        not_before,
        not_after,
        dns_names: Vec::new(),
        ips: Vec::new(),
        subject_key_id: None,
        authority_key_id: None,
    };
    while !rest.is_empty() {
        let (tag, body, next) = element(rest)?;
        if tag == 0xa3 {
            extensions(body, &mut cert)?;
        }
        rest = next;
    }
    Ok(cert)
}

/// The first CN attribute of a Name's RDNSequence.
fn common_name(mut name: &[u8]) -> Result<String, String> {
    while !name.is_empty() {
        let (set, next) = expect(name, 0x31, "RelativeDistinguishedName SET")?;
        let mut atvs = set;
        while !atvs.is_empty() {
            let (atv, more) = expect(atvs, SEQUENCE, "AttributeTypeAndValue")?;
            let (oid, value) = expect(atv, 0x06, "attribute OID")?;
            if oid == OID_CN {
                let (_, text, _) = element(value)?;
                return Ok(String::from_utf8_lossy(text).into_owned());
            }
            atvs = more;
        }
        name = next;
    }
    Ok(String::new())
}

fn extensions(body: &[u8], cert: &mut Cert) -> Result<(), String> {
    let (mut exts, _) = expect(body, SEQUENCE, "Extensions SEQUENCE")?;
    while !exts.is_empty() {
        let (ext, next) = expect(exts, SEQUENCE, "Extension")?;
        let (oid, mut rest) = expect(ext, 0x06, "extnID OID")?;
        if rest.first() == Some(&0x01) {
            rest = element(rest)?.2; // critical BOOLEAN
        }
        let (value, _) = expect(rest, 0x04, "extnValue OCTET STRING")?;
        match oid {
            OID_SAN => {
                let (mut names, _) = expect(value, SEQUENCE, "GeneralNames")?;
                while !names.is_empty() {
                    let (tag, v, more) = element(names)?;
                    match tag {
                        0x82 => cert.dns_names.push(String::from_utf8_lossy(v).into_owned()),
                        0x87 => match v.len() {
                            4 => cert
                                .ips
                                .push(IpAddr::from(<[u8; 4]>::try_from(v).unwrap_or_default())),
                            16 => cert
                                .ips
                                .push(IpAddr::from(<[u8; 16]>::try_from(v).unwrap_or_default())),
                            n => return Err(format!("iPAddress of {n} bytes")),
                        },
                        _ => {}
                    }
                    names = more;
                }
            }
            OID_SKI => cert.subject_key_id = Some(expect(value, 0x04, "keyIdentifier")?.0.to_vec()),
            OID_AKI => {
                let (aki, _) = expect(value, SEQUENCE, "AuthorityKeyIdentifier")?;
                if let Ok((0x80, id, _)) = element(aki) {
                    cert.authority_key_id = Some(id.to_vec());
                }
            }
            _ => {}
        }
        exts = next;
    }
    Ok(())
}

/// A UTCTime or GeneralizedTime (RFC 5280 §4.1.2.5: always `Z`, seconds present).
fn time(data: &[u8]) -> Result<(i64, &[u8]), String> {
    let (tag, body, rest) = element(data)?;
    let text = std::str::from_utf8(body).map_err(|_| "time is not ASCII".to_string())?;
    let (year, tail) = match tag {
        0x17 if text.len() == 13 => {
            let yy: i64 = digits(&text[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        0x18 if text.len() == 15 => (digits(&text[..4])?, &text[4..]),
        _ => return Err(format!("unsupported time {text:?} (tag {tag:#04x})")),
    };
    if !tail.ends_with('Z') {
        return Err(format!("time {text:?} is not UTC"));
    }
    let f = |i: usize| digits(&tail[i..i + 2]);
    let secs = epoch_seconds(year, f(0)?, f(2)?, f(4)?, f(6)?, f(8)?)
        .ok_or_else(|| format!("time {text:?} is out of range"))?;
    Ok((secs, rest))
}

fn digits(s: &str) -> Result<i64, String> {
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not a number"));
    }
    s.parse().map_err(|_| format!("{s:?} is not a number"))
}

/// Seconds since 1970-01-01T00:00:00Z of a proleptic Gregorian UTC time; `None` for a field
/// out of range.
pub fn epoch_seconds(y: i64, mo: i64, d: i64, h: i64, mi: i64, s: i64) -> Option<i64> {
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm), shifted so March is month 0.
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + s)
}

/// `YYYY-MM-DD HH:MM:SSZ` of epoch seconds, for messages.
pub fn format_time(t: i64) -> String {
    let (y, m, d, h, mi, s) = crate::clock::civil(t);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{mi:02}:{s:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_the_rfc_4648_vectors() {
        for (enc, dec) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9v\nYmFy", "foobar"),
        ] {
            assert_eq!(base64(enc).unwrap(), dec.as_bytes(), "{enc}");
        }
        assert!(base64("Zm9v!").is_err());
        assert!(base64("Zg==Zg").is_err());
        assert!(base64("Z").is_err());
    }

    #[test]
    fn epoch_conversion_both_ways() {
        assert_eq!(epoch_seconds(1970, 1, 1, 0, 0, 0), Some(0));
        assert_eq!(epoch_seconds(2000, 3, 1, 0, 0, 0), Some(951_868_800));
        assert_eq!(epoch_seconds(2026, 11, 24, 21, 0, 0), Some(1_795_554_000));
        assert_eq!(format_time(1_795_554_000), "2026-11-24 21:00:00Z");
        assert_eq!(format_time(951_782_400), "2000-02-29 00:00:00Z");
        assert_eq!(epoch_seconds(2026, 13, 1, 0, 0, 0), None);
    }

    #[test]
    fn der_lengths_that_overrun_are_refused() {
        assert!(element(&[0x30, 0x05, 0x01]).is_err());
        assert!(element(&[0x30, 0x85, 0, 0, 0, 0, 1]).is_err());
        assert!(element(&[0x30]).is_err());
        assert!(parse(&[0x30, 0x03, 0x30, 0x01, 0x02]).is_err());
        assert!(pem_certs("nothing here").is_err());
    }

    #[test]
    fn host_matching_follows_rfc_6125() {
        let c = Cert {
            subject_cn: "x".into(),
            subject: vec![],
            issuer: vec![],
            not_before: 0,
            not_after: 0,
            dns_names: vec!["api.example.com".into(), "*.k8s.example.com".into()],
            ips: vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
            subject_key_id: None,
            authority_key_id: None,
        };
        assert!(c.names_host("API.example.com"));
        assert!(c.names_host("a.k8s.example.com"));
        assert!(!c.names_host("a.b.k8s.example.com"));
        assert!(!c.names_host("k8s.example.com"));
        assert!(c.names_host("10.0.0.1"));
        assert!(c.names_host("[fd00::1]"));
        assert!(!c.names_host("10.0.0.2"));
    }
}
