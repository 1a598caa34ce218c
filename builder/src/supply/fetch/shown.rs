//! How kiln prints what a fetch touched, so nothing secret leaves in a message, an event or a
//! log: a URL with its credentials and query values masked ([`shown`]), and an error with its
//! causes ([`causes`]).

use std::fmt::Write as _;

/// `url` fit for a message: the user information (`user:password@`, or a bare token before
/// `@`) becomes `***@`, every query value becomes `***` (pre-signed URLs carry their signature
/// there) and a fragment is dropped. Everything else is printed as given, so the text still
/// says which host and path failed. Text that is not a URL is returned unchanged.
pub fn shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
    let auth_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(auth_end);
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    out.push_str("://");
    match authority.rsplit_once('@') {
        Some((_, host)) => {
            out.push_str("***@");
            out.push_str(host);
        }
        None => out.push_str(authority),
    }
    match tail.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((k, v)) if !v.is_empty() => {
                        let _ = write!(out, "{k}=***");
                    }
                    _ => out.push_str(pair),
                }
            }
        }
        None => out.push_str(tail),
    }
    out
}

/// `e` and every cause under it, `: `-separated. reqwest's own text stops at "error sending
/// request"; what failed (refused, DNS, TLS) is in the chain. Call it on an error whose URL
/// was dropped (`reqwest::Error::without_url`): the message names the [`shown`] URL itself.
pub fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let _ = write!(text, ": {c}");
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_query_values_are_masked() {
        for (url, want) in [
            (
                "http://u:s3cret@mirror.example/kiln/",
                "http://***@mirror.example/kiln/",
            ),
            ("https://ghp_token@host", "https://***@host"),
            (
                "https://b.s3.amazonaws.com/x?X-Amz-Signature=abc&X-Amz-Expires=60&flag",
                "https://b.s3.amazonaws.com/x?X-Amz-Signature=***&X-Amz-Expires=***&flag",
            ),
            ("http://h/p?=v&k=", "http://h/p?=***&k="),
            ("http://a@b@host:8080/p", "http://***@host:8080/p"),
            ("http://host/p@q#frag", "http://host/p@q"),
            ("http://[::1]:80/blobs", "http://[::1]:80/blobs"),
            ("/srv/mirror", "/srv/mirror"),
        ] {
            assert_eq!(shown(url), want, "{url}");
        }
    }

    #[test]
    fn causes_are_chained() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let outer = std::io::Error::other(Wrapped(inner));
        assert_eq!(causes(&outer), "connecting: refused");
    }

    #[derive(Debug)]
    struct Wrapped(std::io::Error);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("connecting")
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
}
