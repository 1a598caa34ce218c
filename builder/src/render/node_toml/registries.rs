//! `[[containerd.registry]]` as written, checked into [`Registry`] values
//! (`crate::render::registries` renders them; docs/render.md, "Registries").

use super::{RawCa, RawContainerd, Validator};
use crate::proxy_url;
use crate::render::config::ConfigError;
use crate::render::pki;
use crate::render::registries::{self, Registry, CAPABILITIES, MAX_MIRRORS, MAX_REGISTRIES};

impl Validator<'_> {
    /// Every registry: its host as image references name it, its URLs, its capabilities and
    /// its CA, each refusal naming the key (`containerd.registry[1].mirrors[0]`).
    pub(super) fn registries(&self, raw: RawContainerd) -> Result<Vec<Registry>, ConfigError> {
        if raw.registries.len() > MAX_REGISTRIES {
            let max = format!("at most {MAX_REGISTRIES} registries");
            return Err(self.invalid("containerd.registry", &max, raw.registries.len()));
        }
        let mut out: Vec<Registry> = Vec::new();
        for (i, r) in raw.registries.into_iter().enumerate() {
            let key = format!("containerd.registry[{i}]");
            let host = r.host;
            if !is_registry_host(&host) {
                return Err(self.invalid(
                    &format!("{key}.host"),
                    "a registry as image references name it: a DNS name or IPv4 address, \
                     optionally `:port` (`docker.io`, `registry.example.com:5000`), no scheme or path",
                    format!("{host:?}"),
                ));
            }
            if out.iter().any(|o| o.host.eq_ignore_ascii_case(&host)) {
                return Err(self.invalid(
                    &format!("{key}.host"),
                    "each registry listed once",
                    format!("{host:?} a second time"),
                ));
            }
            if r.skip_verify.is_some() {
                return Err(self.invalid(
                    &format!("{key}.skip_verify"),
                    "no skip_verify: kiln never turns containerd's TLS verification off; give the \
                     registry's CA in `ca.file` or `ca.pem`",
                    "skip_verify set",
                ));
            }
            let server = match r.server {
                Some(s) => {
                    self.registry_url(&format!("{key}.server"), &s)?;
                    s
                }
                None => Registry::default_server(&host),
            };
            if r.mirrors.len() > MAX_MIRRORS {
                let max = format!("at most {MAX_MIRRORS} mirrors");
                return Err(self.invalid(&format!("{key}.mirrors"), &max, r.mirrors.len()));
            }
            let mut mirrors = Vec::new();
            for (j, m) in r.mirrors.iter().enumerate() {
                mirrors.push(self.mirror(&format!("{key}.mirrors[{j}]"), m)?);
            }
            let ca_pem = match r.ca {
                None => None,
                Some(ca) => {
                    let https = std::iter::once(&server)
                        .chain(mirrors.iter().map(|(u, _)| u))
                        .any(|u| u.starts_with("https://"));
                    if !https {
                        return Err(self.invalid(
                            &format!("{key}.ca"),
                            "a CA only for a registry with an https:// endpoint",
                            "only http:// endpoints",
                        ));
                    }
                    Some(self.pem_bundle(&format!("{key}.ca"), ca)?)
                }
            };
            if mirrors.is_empty() && ca_pem.is_none() && server == Registry::default_server(&host) {
                return Err(self.invalid(
                    &key,
                    "a mirror, a CA or another server (a registry entry that changes nothing is \
                     likely a mistake)",
                    format!("only host = {host:?}"),
                ));
            }
            out.push(Registry {
                host,
                server,
                mirrors,
                ca_pem,
            });
        }
        Ok(out)
    }

    /// A mirror: a URL string (capabilities `pull` and `resolve`), or a table
    /// `{ url = "…", capabilities = [...] }`.
    fn mirror(&self, key: &str, m: &toml::Value) -> Result<(String, Vec<String>), ConfigError> {
        let default_caps = || vec!["pull".to_string(), "resolve".to_string()];
        let (url, caps) = match m {
            toml::Value::String(u) => (u.clone(), default_caps()),
            toml::Value::Table(t) => {
                if let Some(k) = t
                    .keys()
                    .find(|k| !matches!(k.as_str(), "url" | "capabilities"))
                {
                    return Err(self.invalid(
                        key,
                        "a mirror table with `url` and optional `capabilities`",
                        format!("key {k:?}"),
                    ));
                }
                let url = t
                    .get("url")
                    .and_then(toml::Value::as_str)
                    .ok_or_else(|| self.invalid(&format!("{key}.url"), "a URL string", "none"))?;
                let caps = match t.get("capabilities") {
                    None => default_caps(),
                    Some(c) => self.capabilities(&format!("{key}.capabilities"), c)?,
                };
                (url.to_string(), caps)
            }
            other => {
                return Err(self.invalid(
                    key,
                    "a URL string or a `{ url, capabilities }` table",
                    other.type_str(),
                ))
            }
        };
        self.registry_url(key, &url)?;
        Ok((url, caps))
    }

    fn capabilities(&self, key: &str, v: &toml::Value) -> Result<Vec<String>, ConfigError> {
        let expected = "a non-empty list of `pull`, `resolve`, `push`, each once";
        let list = v
            .as_array()
            .ok_or_else(|| self.invalid(key, expected, v.type_str()))?;
        let mut caps: Vec<String> = Vec::new();
        for c in list {
            match c.as_str() {
                Some(s) if CAPABILITIES.contains(&s) && !caps.iter().any(|x| x == s) => {
                    caps.push(s.to_string())
                }
                _ => return Err(self.invalid(key, expected, c)),
            }
        }
        if caps.is_empty() {
            return Err(self.invalid(key, expected, "[]"));
        }
        Ok(caps)
    }

    /// `http(s)://host[:port][/path]`: no credentials (hosts.toml is 0644 on every node), no
    /// query or fragment, nothing TOML or a shell would read differently.
    fn registry_url(&self, key: &str, url: &str) -> Result<(), ConfigError> {
        if let Some(host) = proxy_url::credentials_host(url) {
            let found = format!("a URL with credentials before `@{host}` (not shown)");
            return Err(self.invalid(
                key,
                "a URL without credentials (hosts.toml is world-readable; kubelet's image \
                 credential providers or pull secrets carry registry credentials)",
                found,
            ));
        }
        let bad = || {
            self.invalid(
                key,
                "an http:// or https:// URL, host[:port] and an optional path (a prefix before \
                 /v2), without query, fragment, whitespace or quotes",
                format!("{url:?}"),
            )
        };
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"))
            .ok_or_else(bad)?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let path_ok = path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/'));
        let authority_ok = if let Some(v6) = authority.strip_prefix('[') {
            v6.split_once(']').is_some_and(|(a, port)| {
                a.parse::<std::net::Ipv6Addr>().is_ok() && (port.is_empty() || valid_port(port))
            })
        } else {
            is_registry_host(authority)
        };
        if authority_ok && path_ok {
            Ok(())
        } else {
            Err(bad())
        }
    }

    /// A PEM bundle given as `pem` or `file` under `key` (a registry's `ca`, `[trust]`),
    /// every certificate parsed far enough to find its key.
    pub(super) fn pem_bundle(&self, key: &str, ca: RawCa) -> Result<Vec<u8>, ConfigError> {
        let mut pem = match (ca.pem, ca.file) {
            (Some(pem), None) => pem.into_bytes(),
            (None, Some(file)) => self.read(&format!("{key}.file"), &file)?,
            (a, _) => {
                return Err(self.invalid(
                    key,
                    "exactly one of `pem` (inline PEM) or `file` (a path)",
                    if a.is_some() { "both" } else { "neither" },
                ))
            }
        };
        let text = std::str::from_utf8(&pem).map_err(|_| {
            self.invalid(key, "a PEM certificate bundle", "bytes that are not UTF-8")
        })?;
        let ders = pki::pem_certificates(text)
            .map_err(|e| self.invalid(key, "a PEM bundle of one or more X.509 certificates", e))?;
        for (i, der) in ders.iter().enumerate() {
            pki::spki_sha256(der).map_err(|e| {
                self.invalid(
                    key,
                    "DER X.509 certificates",
                    format!("certificate {}: {e}", i + 1),
                )
            })?;
        }
        if !pem.ends_with(b"\n") {
            pem.push(b'\n');
        }
        Ok(pem)
    }
}

/// `name[:port]`, the name as [`registries::is_host_name`] allows.
fn is_registry_host(host: &str) -> bool {
    match host.rsplit_once(':') {
        Some((name, port)) => registries::is_host_name(name) && valid_port(port),
        None => registries::is_host_name(host),
    }
}

fn valid_port(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 5
        && p.bytes().all(|b| b.is_ascii_digit())
        && p.parse::<u16>().is_ok_and(|n| n > 0)
}
