//! The Go and apimachinery syntax kubelet's credential provider config is read with: Go
//! durations (`time.ParseDuration`, as `metav1.Duration` unmarshals), the URL parse of a
//! `matchImages` pattern (`net/url`), and `IsQualifiedName` (apimachinery validation).

/// Go's `time.ParseDuration`, in nanoseconds (what `metav1.Duration` unmarshals with).
pub fn go_duration(s: &str) -> Result<i128, String> {
    let bad = || format!("time: invalid duration \"{s}\"");
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num = &rest[..num_end];
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(bad());
        }
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(format!("time: missing unit in duration \"{s}\"")),
            u => return Err(format!("time: unknown unit \"{u}\" in duration \"{s}\"")),
        };
        rest = &rest[unit_end..];
        total += num.parse::<f64>().map_err(|_| bad())? * scale;
    }
    if total > i64::MAX as f64 {
        return Err(bad());
    }
    let n = total as i128;
    Ok(if neg { -n } else { n })
}

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
    Ok(())
}
