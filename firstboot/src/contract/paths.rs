//! Every file and directory the contract names, as node paths (absolute, Linux spelling), and
//! where each lives on Windows (`docs/contract.md#windows-paths`). A program that runs under
//! a `--root` prefix joins these with [`relative`]; nothing else spells them.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

// `/usr/lib/kiln/` and friends: baked into the image by `kiln bake` / `kiln install`.

/// The directory of the image's contract files.
pub const IMAGE_DIR: &str = "/usr/lib/kiln";
/// Facts about the image (env file, `image_env` keys).
pub const IMAGE_ENV: &str = "/usr/lib/kiln/image.env";
/// `instance-type pods` lines.
pub const MAX_PODS_MAP: &str = "/usr/lib/kiln/max-pods.map";
/// The AWS instance networking table (`type enis ipv4_per_eni hypervisor` lines).
pub const AWS_ENI_TABLE: &str = "/usr/lib/kiln/aws-eni.tsv";
/// The default kubelet config file.
pub const DEFAULT_KUBELET_CONFIG: &str = "/usr/lib/kiln/kubelet-config.yaml";
/// What `kiln install` wrote (rootfs layers).
pub const INSTALL_MANIFEST: &str = "/usr/lib/kiln/install.manifest";
/// containerd's config file (the unit passes `--config`).
pub const CONTAINERD_CONFIG: &str = "/usr/lib/kiln/containerd/config.toml";
/// containerd's registry host directories (`certs.d/<registry>/hosts.toml`).
pub const CONTAINERD_CERTS_D: &str = "/usr/lib/kiln/containerd/certs.d";
/// This program.
pub const FIRSTBOOT_BIN: &str = "/usr/bin/kiln-firstboot";
/// The node's binaries.
pub const BIN_DIR: &str = "/usr/bin";
/// CNI plugins (containerd's `bin_dir`).
pub const CNI_BIN_DIR: &str = "/usr/libexec/cni";
/// Sysctls from the image definition.
pub const SYSCTL_CONF: &str = "/usr/lib/sysctl.d/90-kiln.conf";
/// Kernel modules from the image definition.
pub const MODULES_LOAD_CONF: &str = "/usr/lib/modules-load.d/kiln.conf";
/// Where the image's systemd units live.
pub const SYSTEMD_UNIT_DIR: &str = "/usr/lib/systemd/system";
/// The unit that imports a layer's baked images into containerd; only layers with baked
/// images have it (builder `bake/units.rs`).
pub const IMAGES_UNIT: &str = "kiln-images.service";

// `/etc/kiln/`: placed by the provisioner (`kiln render`).

/// The directory the provisioner fills.
pub const NODE_DIR: &str = "/etc/kiln";
/// The node's settings (env file, `node_env` keys).
pub const NODE_ENV: &str = "/etc/kiln/node.env";
/// The cluster CA.
pub const CA_CRT: &str = "/etc/kiln/ca.crt";
/// kubelet's TLS-bootstrap kubeconfig, one of the three credentials.
pub const BOOTSTRAP_KUBECONFIG: &str = "/etc/kiln/bootstrap-kubeconfig";
/// A bootstrap token, one of the three credentials.
pub const BOOTSTRAP_TOKEN: &str = "/etc/kiln/bootstrap-token";
/// kubeadm's `JoinConfiguration`, the credential of `JOIN_MODE=kubeadm`.
pub const KUBEADM_JOIN: &str = "/etc/kiln/kubeadm-join.yaml";
/// A kubelet config that replaces the baked default.
pub const KUBELET_CONFIG_OVERRIDE: &str = "/etc/kiln/kubelet-config.yaml";
/// Kernel parameters kiln-firstboot writes to `/proc/sys` before kubelet starts.
pub const NODE_SYSCTL: &str = "/etc/kiln/sysctl.conf";
/// A KubeletConfiguration drop-in kubelet merges over its config (`kiln render`'s
/// `[kubelet.config]` and `kubelet.config_file`).
pub const KUBELET_DROPIN: &str = "/etc/kiln/kubelet-dropin.conf";
/// kubelet's image credential provider config (node.toml's `[[kubelet.credential_provider]]`,
/// a `CredentialProviderConfig` in JSON): with it, kiln-firstboot passes kubelet
/// `--image-credential-provider-config` and `--image-credential-provider-bin-dir`.
pub const CREDENTIAL_PROVIDERS: &str = "/etc/kiln/credential-providers.json";
/// Where the image carries credential provider binaries (image.env
/// `CREDENTIAL_PROVIDER_BIN_DIR` unset).
pub const DEFAULT_CREDENTIAL_PROVIDER_BIN_DIR: &str = "/usr/libexec/kiln/credential-providers";
/// The directory the image's containerd config imports (`imports = ['…/conf.d/*.toml']`).
pub const CONTAINERD_CONF_D: &str = "/etc/kiln/containerd/conf.d";
/// node.toml's `[containerd.config]`, in [`CONTAINERD_CONF_D`]: containerd merges it over
/// the image's config when it starts (docs/contract.md, "containerd configuration").
pub const NODE_CONTAINERD_CONFIG: &str = "/etc/kiln/containerd/conf.d/provisioned.toml";

// `/run/kiln/`: written by kiln-firstboot at every boot.

/// The directory firstboot writes.
pub const RUN_DIR: &str = "/run/kiln";
/// kubelet's environment (env file, `kubelet_env` keys).
pub const KUBELET_ENV: &str = "/run/kiln/kubelet.env";
/// containerd's proxy environment (`EnvironmentFile=-` of containerd.service).
pub const CONTAINERD_ENV: &str = "/run/kiln/containerd.env";
/// kubelet's `--config-dir`: the node's drop-ins, written at every run.
pub const KUBELET_CONFIG_DIR: &str = "/run/kiln/kubelet.conf.d";
/// The per-node KubeletConfiguration firstboot decides (kubelet mode).
pub const KUBELET_NODE_DROPIN: &str = "/run/kiln/kubelet.conf.d/10-kiln-node.conf";
/// A copy of [`KUBELET_DROPIN`], applied after the node's own.
pub const KUBELET_PROVISIONED_DROPIN: &str = "/run/kiln/kubelet.conf.d/50-kiln-provisioned.conf";
/// The kubeconfig firstboot writes around a bootstrap token.
pub const RUN_BOOTSTRAP_KUBECONFIG: &str = "/run/kiln/bootstrap-kubeconfig";
/// Progress and outcome (`docs/contract.md#status-json`).
pub const STATUS_JSON: &str = "/run/kiln/status.json";
/// On failure: reason code, message and hint, one per line.
pub const FAILURE: &str = "/run/kiln/failure";
/// Everything `kubeadm join` printed (stderr, then stdout), redacted, mode 0600: status.json's
/// message keeps only its error lines.
pub const KUBEADM_JOIN_LOG: &str = "/run/kiln/kubeadm-join.log";

// Cluster API's files.

/// Cluster API's success sentinel, written once the node joined.
pub const CAPI_SUCCESS: &str = "/run/cluster-api/bootstrap-success.complete";
/// The failure file beside Cluster API's sentinel (Cluster API #6476).
pub const CAPI_FAILURE: &str = "/run/cluster-api/bootstrap-failure.reason";

// kubelet's and kubeadm's own files that the contract relies on.

/// The kubeconfig kubelet writes after its TLS bootstrap (`--kubeconfig`).
pub const KUBELET_KUBECONFIG: &str = "/var/lib/kubelet/kubeconfig";
/// Where kubelet keeps its client certificate once the bootstrap completed.
pub const KUBELET_PKI_DIR: &str = "/var/lib/kubelet/pki";
/// Present once `kubeadm join` has run: a later boot must not join again. In kubeadm mode
/// kubelet's `--kubeconfig`, as in kubeadm's systemd drop-in (10-kubeadm.conf).
pub const KUBEADM_KUBELET_CONF: &str = "/etc/kubernetes/kubelet.conf";
/// The bootstrap kubeconfig `kubeadm join` writes: kubelet's `--bootstrap-kubeconfig` in
/// kubeadm mode (kubeadm's drop-in).
pub const KUBEADM_BOOTSTRAP_KUBECONFIG: &str = "/etc/kubernetes/bootstrap-kubelet.conf";
/// The KubeletConfiguration `kubeadm join` writes: kubelet's `--config` in kubeadm mode.
pub const KUBEADM_KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";
/// The directory kiln's JoinConfiguration names as `patches.directory`.
pub const KUBEADM_PATCHES_DIR: &str = "/run/kiln/kubeadm-patches";
/// kiln-firstboot's KubeletConfiguration patch for `kubeadm join` (kubeadm's
/// `target[suffix][+patchtype].extension` naming: target `kubeletconfiguration`, strategic).
pub const KUBEADM_KUBELET_PATCH: &str =
    "/run/kiln/kubeadm-patches/kubeletconfiguration+strategic.json";

/// The contract's Linux directories and their Windows places, relative to the system drive
/// (`docs/contract.md#windows-paths`). Longest prefix first.
pub const WINDOWS_PLACES: [(&str, &str); 5] = [
    ("usr/lib/kiln/", "k/kiln/"),
    ("usr/bin/", "k/"),
    ("etc/kiln/", "ProgramData/kiln/"),
    ("run/kiln/", "ProgramData/kiln/run/"),
    ("run/cluster-api/", "run/cluster-api/"),
];

/// The Windows place of a contract path such as `/etc/kiln/node.env`, relative to the
/// system drive: `ProgramData/kiln/node.env`. Paths outside the map keep their shape
/// (`/var/lib/kubelet/pki` is kubelet's default `C:\var\lib\kubelet\pki` on Windows too).
pub fn windows_place(path: &str) -> String {
    let rel = path.trim_start_matches('/');
    for (linux, windows) in WINDOWS_PLACES {
        if let Some(rest) = rel.strip_prefix(linux) {
            return format!("{windows}{rest}");
        }
        if rel == linux.trim_end_matches('/') {
            return windows.trim_end_matches('/').to_string();
        }
    }
    rel.to_string()
}

/// A contract path relative to the root of the node this program runs on: the Linux path
/// without its leading `/`, or its Windows place when built for Windows.
pub fn relative(path: &str) -> Cow<'_, str> {
    if cfg!(windows) {
        Cow::Owned(windows_place(path))
    } else {
        Cow::Borrowed(path.trim_start_matches('/'))
    }
}

/// `path` (a node path such as `/etc/kiln/node.env`) under `root`, the `--root` prefix:
/// [`relative`] joined to it. For the few paths outside the contract (DMI, fw_cfg, the KVP
/// pool); the contract's own files are [`NodePaths`] fields.
pub fn under(root: &Path, path: &str) -> PathBuf {
    root.join(&*relative(path))
}

/// The contract's files on one node, resolved once under the `--root` prefix (and to their
/// Windows places on Windows), so no caller joins a root and a path again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePaths {
    /// The `--root` prefix itself.
    pub root: PathBuf,
    /// [`IMAGE_ENV`].
    pub image_env: PathBuf,
    /// [`MAX_PODS_MAP`].
    pub max_pods_map: PathBuf,
    /// [`AWS_ENI_TABLE`].
    pub aws_eni_table: PathBuf,
    /// [`NODE_ENV`].
    pub node_env: PathBuf,
    /// [`CA_CRT`].
    pub ca_crt: PathBuf,
    /// [`BOOTSTRAP_KUBECONFIG`].
    pub bootstrap_kubeconfig: PathBuf,
    /// [`BOOTSTRAP_TOKEN`].
    pub bootstrap_token: PathBuf,
    /// [`KUBEADM_JOIN`].
    pub kubeadm_join: PathBuf,
    /// [`KUBELET_CONFIG_OVERRIDE`].
    pub kubelet_config_override: PathBuf,
    /// [`NODE_SYSCTL`].
    pub node_sysctl: PathBuf,
    /// [`KUBELET_DROPIN`].
    pub kubelet_dropin: PathBuf,
    /// [`NODE_CONTAINERD_CONFIG`].
    pub containerd_config: PathBuf,
    /// [`CREDENTIAL_PROVIDERS`].
    pub credential_providers: PathBuf,
    /// [`KUBELET_NODE_DROPIN`].
    pub kubelet_node_dropin: PathBuf,
    /// [`KUBELET_PROVISIONED_DROPIN`].
    pub kubelet_provisioned_dropin: PathBuf,
    /// [`KUBELET_ENV`].
    pub kubelet_env: PathBuf,
    /// [`CONTAINERD_ENV`].
    pub containerd_env: PathBuf,
    /// [`RUN_BOOTSTRAP_KUBECONFIG`].
    pub run_bootstrap_kubeconfig: PathBuf,
    /// [`STATUS_JSON`].
    pub status_json: PathBuf,
    /// [`FAILURE`].
    pub failure: PathBuf,
    /// [`CAPI_SUCCESS`].
    pub capi_success: PathBuf,
    /// [`CAPI_FAILURE`].
    pub capi_failure: PathBuf,
    /// [`KUBELET_PKI_DIR`].
    pub kubelet_pki_dir: PathBuf,
    /// [`KUBEADM_KUBELET_CONF`].
    pub kubeadm_kubelet_conf: PathBuf,
    /// [`KUBEADM_KUBELET_PATCH`].
    pub kubeadm_kubelet_patch: PathBuf,
    /// [`KUBEADM_JOIN_LOG`].
    pub kubeadm_join_log: PathBuf,
}

impl NodePaths {
    /// Every contract file under `root`.
    pub fn under(root: &Path) -> NodePaths {
        let at = |p: &str| under(root, p);
        NodePaths {
            root: root.to_path_buf(),
            image_env: at(IMAGE_ENV),
            max_pods_map: at(MAX_PODS_MAP),
            aws_eni_table: at(AWS_ENI_TABLE),
            node_env: at(NODE_ENV),
            ca_crt: at(CA_CRT),
            bootstrap_kubeconfig: at(BOOTSTRAP_KUBECONFIG),
            bootstrap_token: at(BOOTSTRAP_TOKEN),
            kubeadm_join: at(KUBEADM_JOIN),
            kubelet_config_override: at(KUBELET_CONFIG_OVERRIDE),
            node_sysctl: at(NODE_SYSCTL),
            kubelet_dropin: at(KUBELET_DROPIN),
            containerd_config: at(NODE_CONTAINERD_CONFIG),
            credential_providers: at(CREDENTIAL_PROVIDERS),
            kubelet_node_dropin: at(KUBELET_NODE_DROPIN),
            kubelet_provisioned_dropin: at(KUBELET_PROVISIONED_DROPIN),
            kubelet_env: at(KUBELET_ENV),
            containerd_env: at(CONTAINERD_ENV),
            run_bootstrap_kubeconfig: at(RUN_BOOTSTRAP_KUBECONFIG),
            status_json: at(STATUS_JSON),
            failure: at(FAILURE),
            capi_success: at(CAPI_SUCCESS),
            capi_failure: at(CAPI_FAILURE),
            kubelet_pki_dir: at(KUBELET_PKI_DIR),
            kubeadm_kubelet_conf: at(KUBEADM_KUBELET_CONF),
            kubeadm_kubelet_patch: at(KUBEADM_KUBELET_PATCH),
            kubeadm_join_log: at(KUBEADM_JOIN_LOG),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_paths_map_to_the_windows_layout() {
        let table = [
            ("/etc/kiln/node.env", "ProgramData/kiln/node.env"),
            ("etc/kiln/ca.crt", "ProgramData/kiln/ca.crt"),
            ("/usr/lib/kiln/image.env", "k/kiln/image.env"),
            ("/usr/bin/kubelet", "k/kubelet"),
            ("/run/kiln/status.json", "ProgramData/kiln/run/status.json"),
            ("run/kiln", "ProgramData/kiln/run"),
            (
                "/run/cluster-api/bootstrap-success.complete",
                "run/cluster-api/bootstrap-success.complete",
            ),
            ("/var/lib/kubelet/pki", "var/lib/kubelet/pki"),
            // A prefix match is on whole directories only.
            ("/etc/kilnx/a", "etc/kilnx/a"),
        ];
        for (linux, windows) in table {
            assert_eq!(windows_place(linux), windows, "{linux}");
        }
    }

    #[test]
    fn every_node_path_is_absolute_and_under_a_contract_directory() {
        let all = [
            IMAGE_ENV,
            MAX_PODS_MAP,
            AWS_ENI_TABLE,
            DEFAULT_KUBELET_CONFIG,
            INSTALL_MANIFEST,
            CONTAINERD_CONFIG,
            CONTAINERD_CERTS_D,
            NODE_ENV,
            CA_CRT,
            BOOTSTRAP_KUBECONFIG,
            BOOTSTRAP_TOKEN,
            KUBEADM_JOIN,
            KUBELET_CONFIG_OVERRIDE,
            KUBELET_DROPIN,
            NODE_SYSCTL,
            KUBELET_CONFIG_DIR,
            KUBELET_NODE_DROPIN,
            KUBELET_PROVISIONED_DROPIN,
            KUBELET_ENV,
            RUN_BOOTSTRAP_KUBECONFIG,
            STATUS_JSON,
            FAILURE,
            KUBEADM_JOIN_LOG,
        ];
        for p in all {
            assert!(
                [IMAGE_DIR, NODE_DIR, RUN_DIR]
                    .iter()
                    .any(|d| p.strip_prefix(d).is_some_and(|r| r.starts_with('/'))),
                "{p}"
            );
        }
        for p in [CAPI_SUCCESS, CAPI_FAILURE, FIRSTBOOT_BIN, KUBELET_PKI_DIR] {
            assert!(p.starts_with('/'), "{p}");
        }
    }

    #[test]
    fn relative_drops_the_leading_slash_on_linux() {
        if !cfg!(windows) {
            assert_eq!(relative(STATUS_JSON), "run/kiln/status.json");
        }
    }

    #[test]
    fn node_paths_are_the_contract_paths_under_the_root() {
        let p = NodePaths::under(Path::new("/tmp/r"));
        assert_eq!(p.root, Path::new("/tmp/r"));
        if !cfg!(windows) {
            assert_eq!(p.node_env, Path::new("/tmp/r/etc/kiln/node.env"));
            assert_eq!(p.status_json, Path::new("/tmp/r/run/kiln/status.json"));
            assert_eq!(
                p.capi_success,
                Path::new("/tmp/r/run/cluster-api/bootstrap-success.complete")
            );
            assert_eq!(p.kubelet_pki_dir, Path::new("/tmp/r/var/lib/kubelet/pki"));
        }
        assert_eq!(p.kubeadm_join, under(Path::new("/tmp/r"), KUBEADM_JOIN));
    }
}
