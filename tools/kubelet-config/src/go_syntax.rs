//! The Go and apimachinery syntax kubelet's credential provider config is read with, beside
//! [`crate::units`]' durations: the URL parse of a `matchImages` pattern (`net/url`), a
//! duration as Go prints one, and `IsQualifiedName` (apimachinery validation).

/// apimachinery's `IsQualifiedName`: `[prefix/]name`, the prefix a DNS subdomain.
pub fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && l.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    name_ok && prefix_ok
}

/// A negative duration as Go prints one (`-1m0s`), enough for the message.
pub fn format_duration(nanos: i128) -> String {
    let secs = nanos.unsigned_abs() / 1_000_000_000;
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let sign = if nanos < 0 { "-" } else { "" };
    if h > 0 {
        format!("{sign}{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{sign}{m}m{s}s")
    } else {
        format!("{sign}{s}s")
    }
}

/// `credentialprovider.ParseSchemelessURL`: `url.Parse("https://" + s)`; the errors Go's
/// parser gives for what a match pattern could hold.
pub fn schemeless_url(s: &str) -> Result<(), String> {
    let full = format!("https://{s}");
    let err = |why: String| Err(format!("parse {full:?}: {why}"));
    if s.chars().any(|c| c.is_ascii_control()) {
        return err("net/url: invalid control character in URL".into());
    }
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).unwrap_or("");
            if hex.len() != 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                let shown: String = s[i..].chars().take(3).collect();
                return err(format!("invalid URL escape {shown:?}"));
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    let authority = s.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.starts_with('[') {
        let Some(end) = host.find(']') else {
            return err("missing ']' in host".into());
        };
        let after = &host[end + 1..];
        let port_ok = after.is_empty()
            || (after.starts_with(':') && after[1..].bytes().all(|b| b.is_ascii_digit()));
        if !port_ok {
            return err(format!("invalid port {after:?} after host"));
        }
    } else if let Some((_, port)) = host.rsplit_once(':') {
        if !port.bytes().all(|b| b.is_ascii_digit()) {
            return err(format!("invalid port \":{port}\" after host"));
        }
    }
    // net/url's `unescape(host, encodeHost)`: an ASCII byte that `shouldEscape` in a host is
    // refused (letters, digits, `-_.~`, `!$&'()*+,;=:[]<>"` and escapes pass; `*` is what a
    // matchImages glob uses).
    if let Some(c) = host.bytes().find(|b| {
        b.is_ascii() && !b.is_ascii_alphanumeric() && !b"-_.~!$&'()*+,;=:[]<>\"%".contains(b)
    }) {
        return err(format!(
            "invalid character {:?} in host name",
            char::from(c).to_string()
        ));
    }
    Ok(())
}
