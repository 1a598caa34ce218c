//! Proxy URLs in node.toml and image definitions: no credentials. A proxy URL goes into
//! node.env, kubelet.env and containerd.env, all world-readable (0644), so a password in it
//! would be readable by every user of the node; kiln refuses it and never repeats what was
//! before the `@`. A leaf: `render` (node.toml) and `image_def` (`[containerd.proxy]`) both
//! use it, and neither imports the other for it.

/// What a proxy URL must be, and how to pass credentials instead.
pub const NO_CREDENTIALS: &str = "a proxy URL without credentials: node.env, kubelet.env and \
     containerd.env are world-readable (0644), so kiln does not put a proxy password in them. \
     Use a proxy that authenticates nodes another way (source address, mTLS), or have the \
     provisioner write the credentials to a 0600 systemd drop-in (e.g. \
     /etc/systemd/system/containerd.service.d/10-proxy.conf with Environment=HTTPS_PROXY=…)";

/// What follows `http://` or `https://`.
pub fn scheme_rest(url: &str) -> Option<&str> {
    url.strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
}

/// The host part after the credentials (`h:3128` for `http://u:pw@h:3128/`), when the URL's
/// authority carries credentials; at most 100 characters of it.
pub fn credentials_host(url: &str) -> Option<String> {
    let rest = scheme_rest(url).unwrap_or(url);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let (_, host) = authority.rsplit_once('@')?;
    Some(host.chars().take(100).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_found_in_the_authority_only() {
        for (url, host) in [
            ("http://u:pw@h:3128", Some("h:3128")),
            ("https://u@h", Some("h")),
            ("http://u:p@ss@h/", Some("h")),
            ("u:pw@h:3128", Some("h:3128")),
            ("http://h:3128/a@b", None),
            ("http://h:3128", None),
        ] {
            assert_eq!(credentials_host(url).as_deref(), host, "{url}");
        }
    }
}
