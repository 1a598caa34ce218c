//! Reading an image definition: parsed strictly, then every rule checked, naming the file
//! and the key of whatever is wrong.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::image_def::{DefError, Format, ImageDef, Os, Placement};
use crate::proxy_url;

impl ImageDef {
    /// Reads, parses and validates a definition file.
    pub fn load(path: &Path) -> Result<ImageDef, DefError> {
        let text = std::fs::read_to_string(path).map_err(|source| DefError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut def = ImageDef::parse(&text, path)?;
        def.base_dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Ok(def)
    }

    /// The definition with `kubernetes.version` replaced (`kiln plan`/`bake
    /// --kubernetes-version`), checked as the file's value is; the error names the flag.
    pub fn with_kubernetes_version(mut self, version: &str) -> Result<ImageDef, DefError> {
        if !is_version(version) {
            return Err(DefError::Invalid {
                path: self.path.clone(),
                key: "kubernetes.version (--kubernetes-version)".into(),
                expected: "a version like v1.34.2 (the lock's kubelet version)".into(),
                found: version.into(),
            });
        }
        self.kubernetes.version = version.to_string();
        Ok(self)
    }

    /// Parses and validates definition text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<ImageDef, DefError> {
        let mut def: ImageDef = toml::from_str(text).map_err(|e| DefError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        def.path = path.to_path_buf();
        def.validate()?;
        Ok(def)
    }

    fn invalid(&self, key: &str, expected: &str, found: impl fmt::Display) -> DefError {
        DefError::Invalid {
            path: self.path.clone(),
            key: key.into(),
            expected: expected.into(),
            found: found.to_string(),
        }
    }

    #[allow(
        clippy::too_many_lines,
        reason = "one check per definition key, in the order docs/bake.md's key table lists them, each returning its own error; splitting would scatter that table"
    )]
    fn validate(&self) -> Result<(), DefError> {
        if self.name.is_empty()
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(self.invalid("name", "[a-z0-9-]+", &self.name));
        }
        if self.arch.is_empty() {
            return Err(self.invalid("arch", "at least one of amd64, arm64", "[]"));
        }
        if self.formats.is_empty() {
            return Err(self.invalid("formats", "at least one format", "[]"));
        }
        for f in &self.formats {
            let ok = match self.os {
                Os::Linux => matches!(f, Format::Sysext | Format::Rootfs),
                Os::Windows => matches!(f, Format::Windows),
            };
            if !ok {
                return Err(self.invalid(
                    "formats",
                    &format!("a format for os = {:?}", self.os.to_string()),
                    f,
                ));
            }
        }
        if !is_version(&self.kubernetes.version) {
            return Err(self.invalid(
                "kubernetes.version",
                "a version like v1.34.2 (the lock's kubelet version)",
                &self.kubernetes.version,
            ));
        }
        if self.kubernetes.default_max_pods == 0 {
            return Err(self.invalid("kubernetes.default_max_pods", "a positive integer", 0));
        }
        if self.kubernetes.deadline == 0 {
            return Err(self.invalid("kubernetes.deadline", "a positive number of seconds", 0));
        }
        if !is_token(&self.kubernetes.cluster_domain) {
            return Err(self.invalid(
                "kubernetes.cluster_domain",
                "a DNS domain",
                &self.kubernetes.cluster_domain,
            ));
        }
        if !is_token(&self.containerd.sandbox_image) {
            return Err(self.invalid(
                "containerd.sandbox_image",
                "an image reference without spaces or quotes",
                &self.containerd.sandbox_image,
            ));
        }
        if let Some(p) = &self.containerd.proxy {
            for (k, v) in [
                ("containerd.proxy.http", &p.http),
                ("containerd.proxy.https", &p.https),
                ("containerd.proxy.no_proxy", &p.no_proxy),
            ] {
                if let Some(v) = v {
                    // The proxy goes into containerd.service (0644) in an image many nodes run.
                    if let Some(host) = (k != "containerd.proxy.no_proxy")
                        .then(|| proxy_url::credentials_host(v))
                        .flatten()
                    {
                        let found = format!("a URL with credentials before `@{host}` (not shown)");
                        return Err(self.invalid(k, IMAGE_PROXY, found));
                    }
                    if !is_token(v) {
                        return Err(self.invalid(k, "a value without spaces or quotes", v));
                    }
                }
            }
        }
        let mut hosts = std::collections::BTreeSet::new();
        for (i, r) in self.containerd.registries.iter().enumerate() {
            let key = format!("containerd.registry[{i}]");
            if !is_token(&r.host) || r.host.contains('/') || r.host.starts_with('.') {
                return Err(self.invalid(
                    &format!("{key}.host"),
                    "a registry host[:port]",
                    &r.host,
                ));
            }
            if !hosts.insert(r.host.clone()) {
                return Err(self.invalid(&format!("{key}.host"), "a host listed once", &r.host));
            }
            for u in r.server.iter().chain(r.mirrors.iter()) {
                if !(u.starts_with("https://") || u.starts_with("http://")) || !is_token(u) {
                    return Err(self.invalid(&format!("{key}.mirrors"), "an http(s) URL", u));
                }
            }
        }
        match (&self.sysext, self.formats.contains(&Format::Sysext)) {
            (None, true) => {
                return Err(self.invalid("sysext", "a [sysext] table for format sysext", "none"))
            }
            (Some(s), _) => {
                if s.name.is_empty() || !s.name.bytes().all(is_name_byte) {
                    return Err(self.invalid("sysext.name", "[A-Za-z0-9._-]+", &s.name));
                }
                if !is_token(&s.id) {
                    return Err(self.invalid("sysext.id", "an os-release ID", &s.id));
                }
                if s.id != "_any" && s.sysext_level.is_none() && s.version_id.is_none() {
                    return Err(self.invalid(
                        "sysext.sysext_level",
                        "sysext_level or version_id (systemd requires one unless id = \"_any\")",
                        "neither",
                    ));
                }
                for (k, v) in [
                    ("sysext.sysext_level", &s.sysext_level),
                    ("sysext.version_id", &s.version_id),
                ] {
                    if let Some(v) = v {
                        if !is_token(v) {
                            return Err(self.invalid(k, "a value without spaces", v));
                        }
                    }
                }
                if !(s.update_url.starts_with("https://") || s.update_url.starts_with("http://"))
                    || !is_token(&s.update_url)
                {
                    return Err(self.invalid("sysext.update_url", "an http(s) URL", &s.update_url));
                }
            }
            (None, false) => {}
        }
        if self.os == Os::Windows {
            // Windows has no sysctl.d, modules-load.d or systemd: refuse rather than drop them.
            for (key, set) in [
                ("sysctl", !self.sysctl.is_empty()),
                ("modules", !self.modules.is_empty()),
                ("unit", !self.units.is_empty()),
            ] {
                if set {
                    return Err(self.invalid(key, "nothing for os = \"windows\"", "a value"));
                }
            }
        }
        let mut placed = std::collections::BTreeSet::new();
        for (i, a) in self.artifacts.iter().enumerate() {
            let key = format!("artifact[{i}]");
            if !placed.insert(a.name.clone()) {
                return Err(self.invalid(&format!("{key}.name"), "each artifact once", &a.name));
            }
            let prefix = self.prefix_of(a);
            if !prefix.starts_with('/') || prefix.split('/').any(|c| c == ".." || c == ".") {
                return Err(self.invalid(
                    &format!("{key}.prefix"),
                    "an absolute directory without . or ..",
                    &prefix,
                ));
            }
            if self.formats.contains(&Format::Sysext)
                && !(prefix == "/usr" || prefix.starts_with("/usr/"))
            {
                return Err(self.invalid(
                    &format!("{key}.prefix"),
                    "a directory under /usr (a sysext holds only /usr)",
                    &prefix,
                ));
            }
            for m in &a.only {
                if m.is_empty() || m.starts_with('/') || m.split('/').any(|c| c == "..") {
                    return Err(self.invalid(
                        &format!("{key}.only"),
                        "a relative destination without ..",
                        m,
                    ));
                }
            }
            match (a.optional, a.reason.as_deref().map(str::trim)) {
                (true, None | Some("")) => {
                    return Err(self.invalid(
                        &format!("{key}.reason"),
                        "why the artifact may be left out (optional = true needs a reason)",
                        "nothing",
                    ))
                }
                (false, Some(_)) => {
                    return Err(self.invalid(
                        &format!("{key}.reason"),
                        "a reason only with optional = true",
                        "a reason on a required artifact",
                    ))
                }
                _ => {}
            }
            if a.optional && a.name == "kubelet" {
                return Err(self.invalid(
                    &format!("{key}.optional"),
                    "kubelet required (a node without it is not a node)",
                    "optional = true",
                ));
            }
            if let Some(k) = &a.version_key {
                if !is_env_key(k) {
                    return Err(self.invalid(&format!("{key}.version_key"), "[A-Z][A-Z0-9_]*", k));
                }
            }
        }
        if !self.artifacts.iter().any(|a| a.name == "kubelet") {
            return Err(self.invalid("artifact", "an [[artifact]] named kubelet", "none"));
        }
        for (k, v) in &self.sysctl {
            if k.is_empty()
                || !k
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-/*".contains(&b))
            {
                return Err(self.invalid("sysctl", "a sysctl name", k));
            }
            if v.contains(['\n', '\r']) || v.trim().is_empty() {
                return Err(self.invalid(&format!("sysctl.\"{k}\""), "a one-line value", v));
            }
        }
        for m in &self.modules {
            if m.is_empty()
                || !m
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(self.invalid("modules", "a kernel module name", m));
            }
        }
        for (t, n) in &self.max_pods {
            if !is_token(t) || t.starts_with('#') {
                return Err(self.invalid("max_pods", "an instance type without spaces", t));
            }
            if *n == 0 {
                return Err(self.invalid(&format!("max_pods.\"{t}\""), "a positive integer", n));
            }
        }
        self.sizing
            .validate(self.os == Os::Windows)
            .map_err(|(key, expected, found)| self.invalid(&key, &expected, found))?;
        for (i, u) in self.units.iter().enumerate() {
            let builtin = crate::layer_contract::BUILTIN_UNITS.contains(&u.name.as_str());
            let typed = [
                ".service", ".timer", ".path", ".socket", ".target", ".mount",
            ]
            .iter()
            .any(|s| u.name.ends_with(s));
            if builtin || !typed || !u.name.bytes().all(is_name_byte) {
                return Err(self.invalid(
                    &format!("unit[{i}].name"),
                    "a unit file name not shipped by kiln itself",
                    &u.name,
                ));
            }
        }
        Ok(())
    }

    /// The directory an artifact's files are placed under.
    pub fn prefix_of(&self, a: &Placement) -> String {
        match (&a.prefix, self.os) {
            (Some(p), _) => p.trim_end_matches('/').to_string(),
            (None, Os::Linux) => "/usr".into(),
            (None, Os::Windows) => "/k".into(),
        }
    }

    /// The placement of a lock entry, if this image uses it.
    pub fn placement(&self, name: &str) -> Option<&Placement> {
        self.artifacts.iter().find(|a| a.name == name)
    }
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._-@".contains(&b)
}

/// A non-empty value that means the same thing unquoted in an env file, a unit and TOML.
/// What a proxy in an image definition must be: credentials would be readable by every user
/// of every node the image runs.
const IMAGE_PROXY: &str = "a proxy URL without credentials: they would land in a world-readable \
     unit of the image; use a proxy that authenticates nodes another way, or have the node's \
     provisioner write a 0600 containerd.service.d drop-in";

/// A Kubernetes version as it may appear in the layer's file names: letters, digits and
/// `.+_-`, starting with a letter or digit (`v1.36.4`, `v1.36.4-standin`, `v1.36.4+k3s1`), so
/// no `/`, `..` or leading `-` reaches a path.
fn is_version(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+_-".contains(c))
        && !s.contains("..")
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && !"\"'\\$`".contains(c))
}

/// An env-file key: `[A-Z][A-Z0-9_]*`.
pub fn is_env_key(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_uppercase())
        && b.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
}
