//! Image definitions (`images/*.toml`): which lock entries go where, and the node settings
//! baked into a layer. Parsed strictly (unknown keys refused), then validated once.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Why an image definition could not be loaded. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum DefError {
    /// The file could not be read.
    #[error("reading image definition {path}: {source}")]
    Read {
        /// The definition file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML did not parse or had unknown/mistyped keys.
    #[error("parsing image definition {path}: {message}")]
    Parse {
        /// The definition file.
        path: PathBuf,
        /// toml's message, which names the key and line.
        message: String,
    },
    /// A value parsed but is not acceptable.
    #[error("image definition {path}: key `{key}`: expected {expected}, found {found:?}")]
    Invalid {
        /// The definition file.
        path: PathBuf,
        /// The dotted key.
        key: String,
        /// What an acceptable value looks like.
        expected: String,
        /// What the file holds.
        found: String,
    },
}

pub use crate::supply::lock::{Arch, Os};

impl Arch {
    /// The name systemd uses in `ARCHITECTURE=` of an extension-release file.
    pub fn systemd_name(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86-64",
            Arch::Arm64 => "arm64",
        }
    }
}

/// An output format of `kiln bake`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// A systemd-sysext squashfs image (Flatcar).
    Sysext,
    /// A rootfs overlay `.tar.zst` (Ubuntu/Debian, custom AMIs, `kiln install`).
    Rootfs,
    /// The `C:\k` layout as a `.zip` (Windows).
    Windows,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Sysext => "sysext",
            Format::Rootfs => "rootfs",
            Format::Windows => "windows",
        })
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sysext" => Ok(Format::Sysext),
            "rootfs" => Ok(Format::Rootfs),
            "windows" => Ok(Format::Windows),
            other => Err(format!(
                "unknown format {other:?} (expected sysext, rootfs or windows)"
            )),
        }
    }
}

/// The cgroup driver, set once for both kubelet and containerd so they cannot disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    /// systemd manages the cgroups (the right choice on every systemd host).
    #[default]
    Systemd,
    /// kubelet and runc write cgroupfs directly.
    Cgroupfs,
}

/// squashfs compression of a sysext image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// zstd (Flatcar's kernel and systemd read it).
    #[default]
    Zstd,
    /// gzip, for old kernels.
    Gzip,
    /// xz: smallest, slowest.
    Xz,
}

impl Compression {
    /// The name `mksquashfs -comp` takes.
    pub fn mksquashfs_name(self) -> &'static str {
        match self {
            Compression::Zstd => "zstd",
            Compression::Gzip => "gzip",
            Compression::Xz => "xz",
        }
    }
}

/// A parsed and validated image definition.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageDef {
    /// Name of the image (`[a-z0-9-]+`); becomes `KILN_IMAGE_NAME` and output file names.
    pub name: String,
    /// Free text for humans.
    #[serde(default)]
    pub description: String,
    /// Target OS.
    pub os: Os,
    /// Architectures this image is baked for.
    pub arch: Vec<Arch>,
    /// Formats this image may be baked as.
    pub formats: Vec<Format>,
    /// Kubernetes and kubelet settings.
    pub kubernetes: Kubernetes,
    /// containerd settings (R14 of the machine bootstrapper proposal).
    #[serde(default)]
    pub containerd: Containerd,
    /// systemd-sysext settings; required when `formats` holds `sysext`.
    #[serde(default)]
    pub sysext: Option<Sysext>,
    /// Which lock entries go where in the layer.
    #[serde(default, rename = "artifact")]
    pub artifacts: Vec<Placement>,
    /// sysctl settings, written to `/usr/lib/sysctl.d/90-kiln.conf`.
    #[serde(default)]
    pub sysctl: BTreeMap<String, String>,
    /// Kernel modules loaded at boot, written to `/usr/lib/modules-load.d/kiln.conf`.
    #[serde(default)]
    pub modules: Vec<String>,
    /// Max pods per instance type, written to `/usr/lib/kiln/max-pods.map`; an entry wins
    /// over `[sizing]`.
    #[serde(default)]
    pub max_pods: BTreeMap<String, u32>,
    /// How nodes decide max pods and kubelet's reservations, and the AWS ENI table.
    #[serde(default)]
    pub sizing: crate::sizing::SizingDef,
    /// Extra systemd units shipped in the layer.
    #[serde(default, rename = "unit")]
    pub units: Vec<ExtraUnit>,
    /// Directory of the definition file; relative paths (CA files) resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
    /// The definition file itself, for messages.
    #[serde(skip)]
    pub path: PathBuf,
}

/// `[kubernetes]`: the kubelet side.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kubernetes {
    /// The Kubernetes version; must equal the version of the `kubelet` lock entry.
    pub version: String,
    /// `DEFAULT_MAX_PODS` for instance types not in the map.
    #[serde(default = "default_max_pods")]
    pub default_max_pods: u32,
    /// `KILN_DEADLINE`: kiln-firstboot's global boot deadline in seconds.
    #[serde(default = "default_deadline")]
    pub deadline: u32,
    /// cgroup driver for kubelet and containerd.
    #[serde(default)]
    pub cgroup_driver: CgroupDriver,
    /// kubelet `clusterDomain`.
    #[serde(default = "default_cluster_domain")]
    pub cluster_domain: String,
}

fn default_max_pods() -> u32 {
    110
}
fn default_deadline() -> u32 {
    300
}
fn default_cluster_domain() -> String {
    "cluster.local".into()
}
fn default_sandbox_image() -> String {
    "registry.k8s.io/pause:3.10".into()
}

/// `[containerd]`: rendered into containerd's own config and `hosts.toml` files.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Containerd {
    /// The pod sandbox ("pause") image.
    #[serde(default = "default_sandbox_image")]
    pub sandbox_image: String,
    /// Proxy for image pulls, set in containerd's unit environment.
    #[serde(default)]
    pub proxy: Option<Proxy>,
    /// Per-registry mirrors and CAs, one `hosts.toml` each.
    #[serde(default, rename = "registry")]
    pub registries: Vec<Registry>,
}

impl Default for Containerd {
    fn default() -> Self {
        Containerd {
            sandbox_image: default_sandbox_image(),
            proxy: None,
            registries: Vec::new(),
        }
    }
}

/// `[containerd.proxy]`.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Proxy {
    /// `HTTP_PROXY`.
    #[serde(default)]
    pub http: Option<String>,
    /// `HTTPS_PROXY`.
    #[serde(default)]
    pub https: Option<String>,
    /// `NO_PROXY`.
    #[serde(default)]
    pub no_proxy: Option<String>,
}

/// `[[containerd.registry]]`: one registry's `hosts.toml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registry {
    /// Registry host as images name it (`docker.io`, `registry.example.com:5000`).
    pub host: String,
    /// Upstream server URL (`server =`); default `https://<host>`.
    #[serde(default)]
    pub server: Option<String>,
    /// Mirror URLs tried in order before the server.
    #[serde(default)]
    pub mirrors: Vec<String>,
    /// PEM CA files (relative to the definition) trusted for this registry and its mirrors.
    #[serde(default)]
    pub ca: Vec<PathBuf>,
}

/// `[sysext]`: the extension-release and sysupdate metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sysext {
    /// Extension name: the image file is `<name>.raw`, the release file
    /// `extension-release.<name>`.
    pub name: String,
    /// `ID=` of the host OS the extension matches (`flatcar`, or `_any`).
    pub id: String,
    /// `SYSEXT_LEVEL=`; one of this or `version_id` is required unless `id = "_any"`.
    #[serde(default)]
    pub sysext_level: Option<String>,
    /// `VERSION_ID=`.
    #[serde(default)]
    pub version_id: Option<String>,
    /// squashfs compression.
    #[serde(default)]
    pub compression: Compression,
    /// Base URL nodes fetch updates from (systemd-sysupdate `Path=` of the url-file source).
    pub update_url: String,
}

/// `[[artifact]]`: one lock entry baked into the layer. The lock says which files the
/// artifact holds and their relative destinations (`bin/kubelet`, `libexec/cni/bridge`);
/// the image decides the prefix and may take a subset.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// Lock entry name (`kubelet`, `containerd`, `cni-plugins`, …).
    pub name: String,
    /// Directory the lock's relative destinations are placed under (default `/usr` on
    /// Linux, `/k` — that is `C:\k` — on Windows).
    #[serde(default)]
    pub prefix: Option<String>,
    /// Only these destinations (the lock members' `to` values); empty takes every member.
    #[serde(default)]
    pub only: Vec<String>,
    /// The `image.env` key that records this artifact's version (default by name:
    /// kubelet → `KUBERNETES_VERSION`, containerd → `CONTAINERD_VERSION`, …).
    #[serde(default)]
    pub version_key: Option<String>,
}

impl Placement {
    /// The `image.env` key carrying this artifact's version, if any.
    pub fn version_env_key(&self) -> Option<String> {
        if let Some(k) = &self.version_key {
            return Some(k.clone());
        }
        let k = match self.name.as_str() {
            "kubelet" => "KUBERNETES_VERSION",
            "containerd" => "CONTAINERD_VERSION",
            "runc" => "RUNC_VERSION",
            "cni-plugins" => "CNI_PLUGINS_VERSION",
            "crictl" => "CRICTL_VERSION",
            _ => return None,
        };
        Some(k.into())
    }
}

/// `[[unit]]`: an extra systemd unit.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraUnit {
    /// Unit file name (`foo.service`, `bar.timer`).
    pub name: String,
    /// The unit text.
    pub content: String,
    /// Create the `WantedBy=` symlinks systemd's `enable` would.
    #[serde(default)]
    pub enable: bool,
}

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
        if !is_token(&self.kubernetes.version) {
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
            let builtin = crate::bake::units::BUILTIN_UNITS.contains(&u.name.as_str());
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

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = r#"
name = "t"
os = "linux"
arch = ["amd64"]
formats = ["rootfs"]
[kubernetes]
version = "v1.34.2"
[[artifact]]
name = "kubelet"
"#;

    fn parse(extra: &str) -> Result<ImageDef, DefError> {
        ImageDef::parse(&format!("{MIN}{extra}"), Path::new("t.toml"))
    }

    #[test]
    fn minimal_definition_gets_defaults() {
        let d = parse("").unwrap();
        assert_eq!(d.kubernetes.default_max_pods, 110);
        assert_eq!(d.kubernetes.deadline, 300);
        assert_eq!(d.kubernetes.cgroup_driver, CgroupDriver::Systemd);
        assert_eq!(d.containerd.sandbox_image, "registry.k8s.io/pause:3.10");
    }

    #[test]
    fn rejects_bad_definitions_naming_the_key() {
        let cases: &[(&str, &str)] = &[
            ("colour = \"red\"\n", "unknown field `colour`"),
            ("[kubernetes.extra]\n", "unknown field `extra`"),
            ("[[artifact]]\nname = \"kubelet\"\n", "artifact[1].name"),
            (
                "[[artifact]]\nname = \"x\"\nprefix = \"usr\"\n",
                "artifact[1].prefix",
            ),
            (
                "[[artifact]]\nname = \"x\"\nprefix = \"/usr/../etc\"\n",
                "artifact[1].prefix",
            ),
            (
                "[[artifact]]\nname = \"x\"\nonly = [\"../x\"]\n",
                "artifact[1].only",
            ),
            ("[max_pods]\n\"m5.large\" = 0\n", "max_pods.\"m5.large\""),
            ("modules = [\"a b\"]\n", "`modules`"),
            ("[sysctl]\n\"a b\" = \"1\"\n", "`sysctl`"),
            (
                "[[unit]]\nname = \"kubelet.service\"\ncontent = \"\"\n",
                "unit[0].name",
            ),
            (
                "[[containerd.registry]]\nhost = \"docker.io\"\nmirrors = [\"ftp://x\"]\n",
                "containerd.registry[0].mirrors",
            ),
            (
                "[containerd]\nsandbox_image = \"a b\"\n",
                "containerd.sandbox_image",
            ),
        ];
        for (extra, want) in cases {
            let err = parse(extra).unwrap_err().to_string();
            assert!(
                err.contains(want),
                "{extra:?}: {err} does not mention {want}"
            );
            assert!(err.contains("t.toml"), "{err} does not name the file");
        }
    }

    #[test]
    fn sysext_format_needs_a_sysext_table_and_usr_paths() {
        let text = MIN.replace("[\"rootfs\"]", "[\"sysext\"]");
        let err = ImageDef::parse(&text, Path::new("f.toml")).unwrap_err();
        assert!(err.to_string().contains("`sysext`"), "{err}");
        let text = format!(
            "{}[sysext]\nname = \"k\"\nid = \"flatcar\"\nupdate_url = \"https://x/\"\n",
            text
        );
        let err = ImageDef::parse(&text, Path::new("f.toml")).unwrap_err();
        assert!(err.to_string().contains("sysext.sysext_level"), "{err}");
        let ok = text.replace("id = \"flatcar\"", "id = \"_any\"");
        ImageDef::parse(&ok, Path::new("f.toml")).unwrap();
        let etc = ok.replace(
            "name = \"kubelet\"",
            "name = \"kubelet\"\nprefix = \"/etc\"",
        );
        let err = ImageDef::parse(&etc, Path::new("f.toml")).unwrap_err();
        assert!(err.to_string().contains("artifact[0].prefix"), "{err}");
    }

    #[test]
    fn windows_only_bakes_windows() {
        let text = MIN.replace("os = \"linux\"", "os = \"windows\"");
        let err = ImageDef::parse(&text, Path::new("w.toml")).unwrap_err();
        assert!(err.to_string().contains("`formats`"), "{err}");
    }
}
