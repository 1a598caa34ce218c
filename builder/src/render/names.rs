//! The Kubernetes name syntaxes node.toml's keys are checked against: DNS labels and
//! subdomains, label values, qualified keys (labels, taints).

pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A label value (also the name part of a key, when non-empty).
pub(crate) fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// `[prefix/]name`, as label keys and taint keys are.
pub(crate) fn is_qualified_key(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    prefix.is_none_or(is_dns_subdomain) && !name.is_empty() && is_label_value(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_firstboot::redact::valid_token;

    #[test]
    fn key_syntax_table() {
        for (key, ok) in [
            ("role", true),
            ("node.kubernetes.io/role", true),
            ("kiln.dev/tier-1", true),
            ("", false),
            ("-role", false),
            ("Role/x", false),
            ("a/b/c", false),
            ("x".repeat(64).as_str(), false),
        ] {
            assert_eq!(is_qualified_key(key), ok, "{key:?}");
        }
        for (token, ok) in [
            ("abcdef.0123456789abcdef", true),
            ("ABCDEF.0123456789abcdef", false),
            ("abcdef0123456789abcdef", false),
            ("abcde.0123456789abcdefg", false),
        ] {
            assert_eq!(valid_token(token), ok, "{token:?}");
        }
    }
}
