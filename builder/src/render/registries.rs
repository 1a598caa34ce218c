//! node.toml's `[[containerd.registry]]`: containerd's per-registry host directories
//! (`hosts.toml` and the registry's CA), placed by the provisioner under
//! `/etc/kiln/containerd/certs.d/`, which the image's containerd config lists before the
//! image's own `certs.d` (docs/contract.md, "Registries").
//!
//! containerd's rules, from `core/remotes/docker/config/hosts.go` and
//! `internal/cri/server/images/image_pull.go` (containerd 1.5 to 2.1): `config_path` is a
//! list (`filepath.SplitList`: `:` on Linux, `;` on Windows) and the *first* root holding a
//! directory for the host wins, whole; in a root, `host_port_` is tried before `host:port`,
//! then `_default`; hosts.toml is read at every pull (no restart); a relative `ca` is
//! resolved against the host directory; `[host."URL"]` tables are tried in file order, the
//! top-level `server` last; a URL path is a prefix before `/v2`.

use std::fmt::Write as _;

/// The host directories' place under the contract directory (`/etc/kiln/`).
pub const CERTS_D: &str = "containerd/certs.d";
/// The files a host directory may hold.
pub const HOST_FILES: [&str; 2] = ["hosts.toml", "ca.crt"];
/// The most registries one node.toml may configure.
pub const MAX_REGISTRIES: usize = 64;
/// The most mirrors one registry may list.
pub const MAX_MIRRORS: usize = 16;
/// The capabilities containerd knows for a host (`HostCapabilities`).
pub const CAPABILITIES: [&str; 3] = ["pull", "resolve", "push"];

/// One registry's configuration, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    /// The registry as image references name it (`docker.io`, `registry.example.com:5000`).
    pub host: String,
    /// The upstream server URL (`server =`), tried after the mirrors.
    pub server: String,
    /// Mirrors in the order containerd tries them, each with its capabilities.
    pub mirrors: Vec<(String, Vec<String>)>,
    /// The CA bundle (PEM) trusted for this registry's https endpoints, if any.
    pub ca_pem: Option<Vec<u8>>,
}

impl Registry {
    /// The host directory's name: `host_port_` for a host with a port (the spelling
    /// containerd tries first on every OS, and the only one a Windows file name can hold).
    pub fn dir_name(&self) -> String {
        match self.host.rsplit_once(':') {
            Some((h, port)) => format!("{h}_{port}_"),
            None => self.host.clone(),
        }
    }

    /// The default server of a registry: `https://<host>`, Docker Hub's API host for
    /// `docker.io` (its image references and its API use different names).
    pub fn default_server(host: &str) -> String {
        match host {
            "docker.io" => "https://registry-1.docker.io".into(),
            h => format!("https://{h}"),
        }
    }

    /// `hosts.toml`. The CA is named relative to the host directory, so the same file works
    /// on Linux and Windows; containerd never gets `skip_verify`.
    pub fn hosts_toml(&self) -> String {
        let ca = self.ca_pem.is_some();
        let mut s = format!(
            "# Written by kiln render from node.toml's [[containerd.registry]] host = \"{}\".\n\
             server = \"{}\"\n",
            self.host, self.server
        );
        if ca && self.server.starts_with("https://") {
            s.push_str("ca = \"ca.crt\"\n");
        }
        for (url, caps) in &self.mirrors {
            let caps: Vec<String> = caps.iter().map(|c| format!("\"{c}\"")).collect();
            let _ = write!(
                s,
                "\n[host.\"{url}\"]\n  capabilities = [{}]\n",
                caps.join(", ")
            );
            if ca && url.starts_with("https://") {
                s.push_str("  ca = \"ca.crt\"\n");
            }
        }
        s
    }
}

/// Whether `name` (relative to `/etc/kiln/`) is a file of a registry host directory:
/// `containerd/certs.d/<dir>/hosts.toml` or `…/ca.crt`, `<dir>` a host in directory form.
pub fn is_host_file(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(CERTS_D).and_then(|r| r.strip_prefix('/')) else {
        return false;
    };
    let Some((dir, file)) = rest.split_once('/') else {
        return false;
    };
    let host = match dir.strip_suffix('_').and_then(|d| d.rsplit_once('_')) {
        Some((h, port)) if port.parse::<u16>().is_ok_and(|p| p > 0) => h,
        _ => dir,
    };
    is_host_name(host) && HOST_FILES.contains(&file)
}

/// A registry's name as a reference's domain holds it and a file name can: DNS labels of
/// `[A-Za-z0-9-]` (not starting or ending with `-`) joined by `.`, or an IPv4 address; at
/// most 253 characters. IPv6 literals are left out (`[::1]` cannot be a Windows file name).
pub fn is_host_name(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Checks a `hosts.toml` read back from user data (`kiln render --check`): TOML, a
/// `server` URL, `[host."URL"]` tables of known capabilities, no `skip_verify`, and every
/// relative `ca` a file the same payload writes (`siblings`: the other files of its host
/// directory).
pub fn check_hosts_toml(text: &str, siblings: &[&str]) -> Result<(), String> {
    let doc: toml::Table =
        toml::from_str(text).map_err(|e| format!("expected TOML, found {}", first_line(&e)))?;
    let mut tables: Vec<(String, &toml::Table)> = vec![("the top level".into(), &doc)];
    match doc.get("host") {
        None => {}
        Some(toml::Value::Table(hosts)) => {
            for (url, t) in hosts {
                let t = t
                    .as_table()
                    .ok_or_else(|| format!("expected [host.{url:?}] to be a table"))?;
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(format!("expected [host.\"http(s)://…\"], found {url:?}"));
                }
                tables.push((format!("[host.{url:?}]"), t));
            }
        }
        Some(other) => {
            return Err(format!(
                "expected `host` tables, found {}",
                other.type_str()
            ))
        }
    }
    for (at, t) in &tables {
        if t.contains_key("skip_verify") {
            return Err(format!(
                "{at}: expected no skip_verify (kiln never turns TLS verification off), found skip_verify"
            ));
        }
        if let Some(caps) = t.get("capabilities") {
            let ok = caps.as_array().is_some_and(|a| {
                !a.is_empty()
                    && a.iter()
                        .all(|c| c.as_str().is_some_and(|c| CAPABILITIES.contains(&c)))
            });
            if !ok {
                return Err(format!(
                    "{at}: expected capabilities from {CAPABILITIES:?}, found {caps}"
                ));
            }
        }
        let cas: Vec<&toml::Value> = match t.get("ca") {
            None => Vec::new(),
            Some(toml::Value::Array(a)) => a.iter().collect(),
            Some(v) => vec![v],
        };
        for ca in cas {
            let ca = ca
                .as_str()
                .ok_or_else(|| format!("{at}: expected `ca` to be a path, found {ca}"))?;
            let relative = !ca.starts_with('/') && !ca.contains(['\\', ':']);
            if relative && !siblings.contains(&ca) {
                return Err(format!(
                    "{at}: `ca = {ca:?}` names a file this user data does not write beside hosts.toml"
                ));
            }
        }
    }
    match doc.get("server").map(|s| s.as_str()) {
        None => Ok(()),
        Some(Some(s)) if s.starts_with("https://") || s.starts_with("http://") => Ok(()),
        Some(other) => Err(format!(
            "expected `server` to be an http(s) URL, found {other:?}"
        )),
    }
}

fn first_line(e: &toml::de::Error) -> String {
    e.message().lines().next().unwrap_or("").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(host: &str, ca: bool) -> Registry {
        Registry {
            host: host.into(),
            server: Registry::default_server(host),
            mirrors: vec![
                (
                    "https://m1.example".into(),
                    vec!["pull".into(), "resolve".into()],
                ),
                ("http://m2.example:5000/cache".into(), vec!["pull".into()]),
            ],
            ca_pem: ca.then(|| b"PEM".to_vec()),
        }
    }

    #[test]
    fn hosts_toml_lists_mirrors_in_order_and_ca_for_https_only() {
        let r = reg("registry.example.com:5000", true);
        assert_eq!(r.dir_name(), "registry.example.com_5000_");
        let t = r.hosts_toml();
        let v: toml::Table = toml::from_str(&t).unwrap();
        assert_eq!(
            v["server"].as_str(),
            Some("https://registry.example.com:5000")
        );
        assert_eq!(v["ca"].as_str(), Some("ca.crt"));
        let hosts = v["host"].as_table().unwrap();
        assert_eq!(hosts["https://m1.example"]["ca"].as_str(), Some("ca.crt"));
        assert!(hosts["http://m2.example:5000/cache"].get("ca").is_none());
        assert_eq!(
            hosts["http://m2.example:5000/cache"]["capabilities"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert!(t.find("m1.example").unwrap() < t.find("m2.example").unwrap());
        assert_eq!(check_hosts_toml(&t, &["ca.crt"]), Ok(()));
        assert!(check_hosts_toml(&t, &[])
            .unwrap_err()
            .contains("does not write"));
        let no_ca = reg("docker.io", false).hosts_toml();
        assert!(!no_ca.contains("ca ="), "{no_ca}");
        assert!(no_ca.contains("server = \"https://registry-1.docker.io\""));
    }

    #[test]
    fn host_file_names() {
        for ok in [
            "containerd/certs.d/docker.io/hosts.toml",
            "containerd/certs.d/registry.example.com_5000_/ca.crt",
            "containerd/certs.d/10.0.2.100_5000_/hosts.toml",
        ] {
            assert!(is_host_file(ok), "{ok}");
        }
        for bad in [
            "containerd/certs.d/docker.io/other.crt",
            "containerd/certs.d/../hosts.toml",
            "containerd/certs.d/a/b/hosts.toml",
            "containerd/certs.d/_default/hosts.toml",
            "containerd/certs.d/x_0_/hosts.toml",
            "containerd/certs.d/-x/hosts.toml",
            "containerd/hosts.toml",
        ] {
            assert!(!is_host_file(bad), "{bad}");
        }
    }

    #[test]
    fn check_refuses_what_kiln_never_writes() {
        let cases = [
            (
                "server = \"https://r\"\nskip_verify = true\n",
                "skip_verify",
            ),
            ("[host.\"https://m\"]\nskip_verify = true\n", "skip_verify"),
            (
                "[host.\"https://m\"]\ncapabilities = [\"fly\"]\n",
                "capabilities",
            ),
            ("[host.\"ftp://m\"]\n", "http(s)"),
            ("server = 3\n", "server"),
            ("server = \n", "expected TOML"),
            ("ca = \"other.crt\"\n", "does not write"),
        ];
        for (text, want) in cases {
            let e = check_hosts_toml(text, &["ca.crt"]).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        assert_eq!(check_hosts_toml("ca = \"/etc/ssl/x.pem\"\n", &[]), Ok(()));
    }
}
