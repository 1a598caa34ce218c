//! Registry credentials: the docker-style credentials file (`auths.<host>.auth`, base64
//! `user:password`), the `WWW-Authenticate` challenge, and the bearer-token exchange.
//!
//! No credential, token or `Authorization` value ever appears in an error, a log line or a
//! `Debug` output: [`Credentials`] redacts itself and messages name only hosts and files.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;

/// A user name and password for one registry host.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub user: String,
    /// The password or token.
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

impl Credentials {
    /// The `Authorization: Basic …` value.
    pub fn basic(&self) -> String {
        let raw = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// Credentials by registry host (`host` or `host:port`).
#[derive(Debug, Clone, Default)]
pub struct CredentialStore {
    by_host: BTreeMap<String, Credentials>,
    /// Where they were read from, for messages.
    pub source: Option<PathBuf>,
}

/// Reduces a docker config key (`https://host/v1/`, `host`, `http://host:5000`) to `host[:port]`.
fn host_key(k: &str) -> String {
    let k = k
        .strip_prefix("https://")
        .or_else(|| k.strip_prefix("http://"))
        .unwrap_or(k);
    k.split('/').next().unwrap_or(k).to_ascii_lowercase()
}

impl CredentialStore {
    /// Parses a docker `config.json`. Only `auths.<host>.auth` (base64 `user:password`) and
    /// `auths.<host>.username`/`password` are read; credential helpers are not run. Errors
    /// name the file and the host, never the value.
    pub fn parse(text: &str, path: &Path) -> Result<CredentialStore, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
        let mut by_host = BTreeMap::new();
        if let Some(auths) = v.get("auths").and_then(|a| a.as_object()) {
            for (k, entry) in auths {
                let creds = if let Some(a) = entry.get("auth").and_then(|a| a.as_str()) {
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(a.trim())
                        .map_err(|_| {
                            format!(
                                "{}: auths.{k:?}.auth: expected base64 of user:password, found something else",
                                path.display()
                            )
                        })?;
                    let raw = String::from_utf8(raw)
                        .map_err(|_| format!("{}: auths.{k:?}.auth: not UTF-8", path.display()))?;
                    let (user, password) = raw.split_once(':').ok_or_else(|| {
                        format!(
                            "{}: auths.{k:?}.auth: expected base64 of user:password (no ':' inside)",
                            path.display()
                        )
                    })?;
                    Credentials {
                        user: user.to_string(),
                        password: password.to_string(),
                    }
                } else {
                    match (
                        entry.get("username").and_then(|u| u.as_str()),
                        entry.get("password").and_then(|p| p.as_str()),
                    ) {
                        (Some(u), Some(p)) => Credentials {
                            user: u.to_string(),
                            password: p.to_string(),
                        },
                        _ => continue,
                    }
                };
                by_host.insert(host_key(k), creds);
            }
        }
        Ok(CredentialStore {
            by_host,
            source: Some(path.to_path_buf()),
        })
    }

    /// Reads `explicit` if given (it must exist), else `$DOCKER_CONFIG/config.json`, else
    /// `~/.docker/config.json`; no file is no credentials.
    pub fn load(explicit: Option<&Path>) -> Result<CredentialStore, String> {
        let path = match explicit {
            Some(p) => p.to_path_buf(),
            None => {
                let p = match std::env::var_os("DOCKER_CONFIG") {
                    Some(d) => PathBuf::from(d).join("config.json"),
                    None => match std::env::var_os("HOME") {
                        Some(h) => PathBuf::from(h).join(".docker").join("config.json"),
                        None => return Ok(CredentialStore::default()),
                    },
                };
                if !p.exists() {
                    return Ok(CredentialStore::default());
                }
                p
            }
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading registry credentials {}: {e}", path.display()))?;
        CredentialStore::parse(&text, &path)
    }

    /// The credentials for `host` (`host[:port]`), if any.
    pub fn get(&self, host: &str) -> Option<&Credentials> {
        self.by_host.get(&host.to_ascii_lowercase())
    }
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    /// `Basic realm=…`.
    Basic,
    /// `Bearer realm=…,service=…,scope=…`.
    Bearer {
        /// The token endpoint.
        realm: String,
        /// The `service` parameter, if given.
        service: Option<String>,
        /// The `scope` parameter, if given.
        scope: Option<String>,
    },
}

/// Parses one `WWW-Authenticate` value (RFC 9110 auth-params; quoted strings may hold commas).
pub fn parse_challenge(v: &str) -> Option<Challenge> {
    let v = v.trim();
    let (scheme, rest) = v.split_once(' ').unwrap_or((v, ""));
    let mut params = BTreeMap::new();
    let mut s = rest.trim();
    while !s.is_empty() {
        let (key, after) = s.split_once('=')?;
        let key = key.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = if let Some(q) = after.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = q.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            out.push(n);
                        }
                    }
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => out.push(c),
                }
            }
            (out, &q[end? + 1..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        params.insert(key, value);
        s = next.trim_start().trim_start_matches(',').trim_start();
    }
    if scheme.eq_ignore_ascii_case("basic") {
        Some(Challenge::Basic)
    } else if scheme.eq_ignore_ascii_case("bearer") {
        Some(Challenge::Bearer {
            realm: params.remove("realm")?,
            service: params.remove("service"),
            scope: params.remove("scope"),
        })
    } else {
        None
    }
}

/// The token from a token endpoint's JSON answer (`token` or `access_token`).
pub fn token_from_json(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get("token")
        .or_else(|| v.get("access_token"))
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="basic-realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(
            parse_challenge("bearer realm=http://h/t"),
            Some(Challenge::Bearer {
                realm: "http://h/t".into(),
                service: None,
                scope: None
            })
        );
        assert_eq!(parse_challenge("Bearer service=x"), None);
        assert_eq!(parse_challenge("Negotiate abc"), None);
        assert_eq!(parse_challenge(r#"Bearer realm="unterminated"#), None);
    }

    #[test]
    fn credentials_file() {
        let p = Path::new("/x/config.json");
        let text = r#"{"auths":{"https://127.0.0.1:5000/v1/":{"auth":"a2lsbjpzM2NyM3Q="},"reg.example":{"username":"u","password":"p"},"helper.example":{}},"credsStore":"desktop"}"#;
        let c = CredentialStore::parse(text, p).unwrap();
        let k = c.get("127.0.0.1:5000").unwrap();
        assert_eq!((k.user.as_str(), k.password.as_str()), ("kiln", "s3cr3t"));
        assert_eq!(k.basic(), "Basic a2lsbjpzM2NyM3Q=");
        assert_eq!(c.get("REG.example").unwrap().user, "u");
        assert!(c.get("helper.example").is_none());
        assert!(!format!("{k:?}").contains("s3cr3t"));
        // Bad base64 names the file and the host, never the value.
        let err =
            CredentialStore::parse(r#"{"auths":{"h.io":{"auth":"!!s3cr3t!!"}}}"#, p).unwrap_err();
        assert!(
            err.contains("/x/config.json") && err.contains("h.io"),
            "{err}"
        );
        assert!(!err.contains("s3cr3t"), "{err}");
        let err =
            CredentialStore::parse(r#"{"auths":{"h.io":{"auth":"czNjcjN0"}}}"#, p).unwrap_err();
        assert!(!err.contains("s3cr3t") && err.contains("no ':'"), "{err}");
    }

    #[test]
    fn tokens() {
        assert_eq!(
            token_from_json(br#"{"token":"abc"}"#).as_deref(),
            Some("abc")
        );
        assert_eq!(
            token_from_json(br#"{"access_token":"xyz","expires_in":300}"#).as_deref(),
            Some("xyz")
        );
        assert_eq!(token_from_json(br#"{"token":"a\nb"}"#), None);
        assert_eq!(token_from_json(b"nope"), None);
    }
}
