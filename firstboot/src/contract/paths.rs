//! Every file and directory the contract names, as node paths (absolute, Linux spelling), and
//! where each lives on Windows (`docs/contract.md#windows-paths`). A program that runs under
//! a `--root` prefix joins these with [`relative`]; nothing else spells them.

use std::borrow::Cow;

// `/usr/lib/kiln/` and friends: baked into the image by `kiln bake` / `kiln install`.

/// The directory of the image's contract files.
pub const IMAGE_DIR: &str = "/usr/lib/kiln";
/// Facts about the image (env file, `image_env` keys).
pub const IMAGE_ENV: &str = "/usr/lib/kiln/image.env";
/// `instance-type pods` lines.
pub const MAX_PODS_MAP: &str = "/usr/lib/kiln/max-pods.map";
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

// `/run/kiln/`: written by kiln-firstboot at every boot.

/// The directory firstboot writes.
pub const RUN_DIR: &str = "/run/kiln";
/// kubelet's environment (env file, `kubelet_env` keys).
pub const KUBELET_ENV: &str = "/run/kiln/kubelet.env";
/// The kubeconfig firstboot writes around a bootstrap token.
pub const RUN_BOOTSTRAP_KUBECONFIG: &str = "/run/kiln/bootstrap-kubeconfig";
/// Progress and outcome (`docs/contract.md#status-json`).
pub const STATUS_JSON: &str = "/run/kiln/status.json";
/// On failure: reason code, message and hint, one per line.
pub const FAILURE: &str = "/run/kiln/failure";

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
/// Present once `kubeadm join` has run: a later boot must not join again.
pub const KUBEADM_KUBELET_CONF: &str = "/etc/kubernetes/kubelet.conf";

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
            KUBELET_ENV,
            RUN_BOOTSTRAP_KUBECONFIG,
            STATUS_JSON,
            FAILURE,
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
}
