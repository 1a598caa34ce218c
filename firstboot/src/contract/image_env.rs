//! `/usr/lib/kiln/image.env`, facts about the image (`docs/contract.md#imageenv`): its keys,
//! their defaults, and [`ImageEnv`], the typed value firstboot reads it into.

use super::envfile::EnvFile;
use super::node_env::Invalid;
use crate::contract::paths;
use crate::contract::version::KILN_CONTRACT;

/// Content-derived id of the layer.
pub const KILN_IMAGE_ID: &str = "KILN_IMAGE_ID";
/// Name of the image definition.
pub const KILN_IMAGE_NAME: &str = "KILN_IMAGE_NAME";
/// Version of kiln that baked the image.
pub const KILN_VERSION: &str = "KILN_VERSION";
/// `linux` or `windows`.
pub const KILN_OS: &str = "KILN_OS";
/// `amd64` or `arm64`.
pub const KILN_ARCH: &str = "KILN_ARCH";
/// kubelet's version.
pub const KUBERNETES_VERSION: &str = "KUBERNETES_VERSION";
/// containerd's version.
pub const CONTAINERD_VERSION: &str = "CONTAINERD_VERSION";
/// The config version the image's containerd reads (`2` for 1.x, `3` for 2.x); node.toml's
/// `[containerd.config]` must declare the same.
pub const CONTAINERD_CONFIG_VERSION: &str = "CONTAINERD_CONFIG_VERSION";
/// Where the image's kubelet image credential provider binaries are.
pub const CREDENTIAL_PROVIDER_BIN_DIR: &str = "CREDENTIAL_PROVIDER_BIN_DIR";
/// runc's version.
pub const RUNC_VERSION: &str = "RUNC_VERSION";
/// The CNI plugins' version.
pub const CNI_PLUGINS_VERSION: &str = "CNI_PLUGINS_VERSION";
/// crictl's version.
pub const CRICTL_VERSION: &str = "CRICTL_VERSION";
/// The unit firstboot starts.
pub const KUBELET_UNIT: &str = "KUBELET_UNIT";
/// The container runtime's unit, for diagnosis.
pub const CONTAINERD_UNIT: &str = "CONTAINERD_UNIT";
/// The default kubelet config file.
pub const KUBELET_CONFIG: &str = "KUBELET_CONFIG";
/// The CRI socket.
pub const CONTAINER_RUNTIME_ENDPOINT: &str = "CONTAINER_RUNTIME_ENDPOINT";
/// Max pods when the instance type is not in `max-pods.map`.
pub const DEFAULT_MAX_PODS: &str = "DEFAULT_MAX_PODS";
/// The global boot deadline, in seconds.
pub const KILN_DEADLINE: &str = "KILN_DEADLINE";

/// The keys image.env must set, each non-empty.
pub const REQUIRED: [&str; 7] = [
    KILN_CONTRACT,
    KILN_IMAGE_ID,
    KILN_IMAGE_NAME,
    KILN_VERSION,
    KILN_OS,
    KILN_ARCH,
    KUBERNETES_VERSION,
];

/// `KUBELET_UNIT` when unset.
pub const DEFAULT_KUBELET_UNIT: &str = "kubelet.service";
/// `CONTAINERD_UNIT` when unset.
pub const DEFAULT_CONTAINERD_UNIT: &str = "containerd.service";
/// `CONTAINER_RUNTIME_ENDPOINT` when unset (Linux).
pub const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
/// `DEFAULT_MAX_PODS` when unset.
pub const DEFAULT_MAX_PODS_VALUE: u32 = 110;
/// `KILN_DEADLINE` when neither file sets it, in seconds.
pub const DEFAULT_DEADLINE_SECS: u64 = 300;

/// image.env, checked and typed, defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageEnv {
    /// `KILN_IMAGE_ID`.
    pub image_id: String,
    /// `KILN_IMAGE_NAME`.
    pub image_name: String,
    /// `KUBERNETES_VERSION`.
    pub kubernetes_version: String,
    /// `KUBELET_UNIT`.
    pub kubelet_unit: String,
    /// `CONTAINERD_UNIT`.
    pub containerd_unit: String,
    /// `KUBELET_CONFIG` (a node path).
    pub kubelet_config: String,
    /// `CONTAINER_RUNTIME_ENDPOINT`.
    pub runtime_endpoint: String,
    /// `DEFAULT_MAX_PODS`.
    pub default_max_pods: u32,
    /// `KILN_DEADLINE`, when set.
    pub deadline_secs: Option<u64>,
    /// `CONTAINERD_CONFIG_VERSION` (empty when the image predates it).
    pub containerd_config_version: String,
    /// `CREDENTIAL_PROVIDER_BIN_DIR` (a node path).
    pub credential_provider_bin_dir: String,
}

impl ImageEnv {
    /// Types the keys firstboot uses; numbers must be positive integers. The required keys'
    /// presence and `KILN_CONTRACT` are the caller's to check first.
    pub fn from_env(env: &EnvFile) -> Result<ImageEnv, Invalid<'_>> {
        let text = |key: &str, default: &str| env.non_empty(key).unwrap_or(default).to_string();
        let number = |key: &'static str| match env.non_empty(key) {
            None => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .map(Some)
                .ok_or(Invalid {
                    key,
                    expected: "a positive integer",
                    found: v,
                }),
        };
        let deadline_secs = number(KILN_DEADLINE)?;
        let default_max_pods = number(DEFAULT_MAX_PODS)?.map_or(DEFAULT_MAX_PODS_VALUE, |n| {
            n.min(u64::from(u32::MAX)) as u32
        });
        Ok(ImageEnv {
            image_id: text(KILN_IMAGE_ID, ""),
            image_name: text(KILN_IMAGE_NAME, ""),
            kubernetes_version: text(KUBERNETES_VERSION, ""),
            kubelet_unit: text(KUBELET_UNIT, DEFAULT_KUBELET_UNIT),
            containerd_unit: text(CONTAINERD_UNIT, DEFAULT_CONTAINERD_UNIT),
            kubelet_config: text(KUBELET_CONFIG, paths::DEFAULT_KUBELET_CONFIG),
            runtime_endpoint: text(CONTAINER_RUNTIME_ENDPOINT, DEFAULT_RUNTIME_ENDPOINT),
            default_max_pods,
            deadline_secs,
            containerd_config_version: text(CONTAINERD_CONFIG_VERSION, ""),
            credential_provider_bin_dir: text(
                CREDENTIAL_PROVIDER_BIN_DIR,
                paths::DEFAULT_CREDENTIAL_PROVIDER_BIN_DIR,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::envfile::parse;

    #[test]
    fn defaults_fill_what_the_image_leaves_out() {
        let i = ImageEnv::from_env(&parse("KILN_IMAGE_ID=sha256:ab\n").unwrap()).unwrap();
        assert_eq!(i.image_id, "sha256:ab");
        assert_eq!(i.kubelet_unit, DEFAULT_KUBELET_UNIT);
        assert_eq!(i.containerd_unit, DEFAULT_CONTAINERD_UNIT);
        assert_eq!(i.kubelet_config, paths::DEFAULT_KUBELET_CONFIG);
        assert_eq!(i.runtime_endpoint, DEFAULT_RUNTIME_ENDPOINT);
        assert_eq!(i.default_max_pods, DEFAULT_MAX_PODS_VALUE);
        assert_eq!(i.deadline_secs, None);
    }

    #[test]
    fn numbers_must_be_positive() {
        for (text, key) in [
            ("DEFAULT_MAX_PODS=0\n", DEFAULT_MAX_PODS),
            ("KILN_DEADLINE=soon\n", KILN_DEADLINE),
        ] {
            let env = parse(text).unwrap();
            let e = ImageEnv::from_env(&env).unwrap_err();
            assert_eq!((e.key, e.expected), (key, "a positive integer"));
        }
        let i = ImageEnv::from_env(&parse("DEFAULT_MAX_PODS=99999999999\n").unwrap()).unwrap();
        assert_eq!(i.default_max_pods, u32::MAX);
    }
}
