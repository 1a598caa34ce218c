//! Image definitions (`images/*.toml`): which lock entries go where, and the node settings
//! baked into a layer. Parsed strictly (unknown keys refused), then validated once.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

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
    /// Baked when the lock pins it for the target's OS and architecture, left out (with a
    /// warning, and the reason in `kiln plan`) when it does not. Needs `reason`. A pinned
    /// artifact whose bytes are missing from the store is still an error.
    #[serde(default)]
    pub optional: bool,
    /// Why an optional artifact may be left out (required with `optional = true`).
    #[serde(default)]
    pub reason: Option<String>,
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

mod load;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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
            (
                "[[artifact]]\nname = \"x\"\noptional = true\n",
                "`artifact[1].reason`: expected why the artifact may be left out",
            ),
            (
                "[[artifact]]\nname = \"x\"\noptional = true\nreason = \"  \"\n",
                "artifact[1].reason",
            ),
            (
                "[[artifact]]\nname = \"x\"\nreason = \"r\"\n",
                "`artifact[1].reason`: expected a reason only with optional = true",
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
            // Issue 34: a proxy password would be baked into a 0644 unit; never echoed.
            (
                "[containerd.proxy]\nhttps = \"http://u:Hush99@p:3128\"\n",
                "`containerd.proxy.https`: expected a proxy URL without credentials",
            ),
        ];
        for (extra, want) in cases {
            let err = parse(extra).unwrap_err().to_string();
            assert!(
                err.contains(want),
                "{extra:?}: {err} does not mention {want}"
            );
            assert!(err.contains("t.toml"), "{err} does not name the file");
            assert!(!err.contains("Hush99"), "{err} echoes a password");
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
