//! kubeadm's `JoinConfiguration` (kubeadm.k8s.io/v1beta4) generated from the node config, so
//! users never write kubeadm types; plus the CA public-key pin kubeadm discovery needs.

use crate::render::config::NodeConfig;
pub use crate::render::pki::{pem_certificates, spki_sha256};

/// The kubeadm configuration API version kiln writes (current since Kubernetes 1.31).
pub const API_VERSION: &str = "kubeadm.k8s.io/v1beta4";

/// The directory kiln-firstboot writes its KubeletConfiguration patch into
/// (`docs/contract.md`, kubeadm mode): the JoinConfiguration's `patches.directory`.
pub const PATCHES_DIR: &str = kiln_firstboot::contract::paths::KUBEADM_PATCHES_DIR;

/// The CRI socket kiln images run containerd on (`docs/contract.md`, image.env default).
pub const CRI_SOCKET: &str = "unix:///run/containerd/containerd.sock";

/// A YAML double-quoted scalar (JSON string syntax is valid YAML).
fn q(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serialises")
}

/// Renders the JoinConfiguration for `kubeadm join --config /etc/kiln/kubeadm-join.yaml`.
pub fn join_configuration(node: &NodeConfig, token: &str) -> String {
    let mut y = String::new();
    y.push_str("# kiln node contract v1: written by `kiln render` from node.toml.\n");
    y.push_str(
        "# kiln-firstboot runs `kubeadm join --config` with this file (JOIN_MODE=kubeadm).\n",
    );
    y.push_str(&format!(
        "apiVersion: {API_VERSION}\nkind: JoinConfiguration\n"
    ));
    y.push_str("discovery:\n  bootstrapToken:\n");
    y.push_str(&format!(
        "    apiServerEndpoint: {}\n",
        q(&node.api_server.endpoint)
    ));
    y.push_str(&format!("    token: {}\n", q(token)));
    y.push_str("    caCertHashes:\n");
    for h in &node.ca_spki_sha256 {
        y.push_str(&format!("      - {}\n", q(h)));
    }
    y.push_str(&format!("  tlsBootstrapToken: {}\n", q(token)));
    y.push_str("nodeRegistration:\n");
    if let Some(name) = &node.node_name {
        y.push_str(&format!("  name: {}\n", q(name)));
    }
    y.push_str(&format!("  criSocket: {}\n", q(CRI_SOCKET)));
    if node.taints.is_empty() {
        // An explicit empty list: no taints (kubeadm's defaulting never adds any on join, but
        // say so rather than rely on it).
        y.push_str("  taints: []\n");
    } else {
        y.push_str("  taints:\n");
        for t in &node.taints {
            y.push_str(&format!("    - key: {}\n", q(&t.key)));
            if !t.value.is_empty() {
                y.push_str(&format!("      value: {}\n", q(&t.value)));
            }
            y.push_str(&format!("      effect: {}\n", q(&t.effect)));
        }
    }
    let args = kubelet_args(node);
    if !args.is_empty() {
        // v1beta4 made kubeletExtraArgs a list of name/value pairs (it was a map in v1beta3).
        y.push_str("  kubeletExtraArgs:\n");
        for (name, value) in args {
            y.push_str(&format!(
                "    - name: {}\n      value: {}\n",
                q(&name),
                q(&value)
            ));
        }
    }
    // kiln-firstboot writes the node's KubeletConfiguration facts (provider ID, max pods,
    // reservations, cluster DNS, the image's runtime endpoint) there at boot; kubeadm applies
    // them to the cluster's kubelet-config when it writes /var/lib/kubelet/config.yaml.
    // `kubeadm join` refuses `--patches` beside `--config`, so the file names the directory.
    y.push_str(&format!("patches:\n  directory: {}\n", q(PATCHES_DIR)));
    y
}

/// The kubelet flags kubeadm must pass for the settings node.toml carries that only a flag can
/// carry (`--node-labels`, `--node-ip`) and the operator's extra args. Max pods is a
/// KubeletConfiguration field: it reaches kubelet through kiln-firstboot's patch
/// ([`PATCHES_DIR`]), from node.env's `MAX_PODS`, like the sizing kiln decides at boot.
fn kubelet_args(node: &NodeConfig) -> Vec<(String, String)> {
    let mut args = Vec::new();
    if !node.labels.is_empty() {
        let labels: Vec<String> = node
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        args.push(("node-labels".to_string(), labels.join(",")));
    }
    if let Some(ip) = &node.node_ip {
        args.push(("node-ip".to_string(), ip.clone()));
    }
    for arg in &node.kubelet_extra_args {
        let flag = arg.trim_start_matches('-');
        let (name, value) = flag.split_once('=').unwrap_or((flag, "true"));
        args.push((name.to_string(), value.to_string()));
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_errors_are_specific() {
        assert!(pem_certificates("hello")
            .unwrap_err()
            .contains("no -----BEGIN"));
        let open = "-----BEGIN CERTIFICATE-----\nAAAA\n";
        assert!(pem_certificates(open)
            .unwrap_err()
            .contains("has no -----END"));
        let bad = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        assert!(pem_certificates(bad)
            .unwrap_err()
            .contains("not valid base64"));
    }

    #[test]
    fn der_errors_are_specific() {
        assert!(spki_sha256(&[0x02, 0x01, 0x00])
            .unwrap_err()
            .contains("outer SEQUENCE"));
        assert!(spki_sha256(&[0x30, 0x05, 0x30])
            .unwrap_err()
            .contains("truncated"));
        // A SEQUENCE holding a SEQUENCE of too few fields.
        let thin = [0x30, 0x05, 0x30, 0x03, 0x02, 0x01, 0x01];
        assert!(spki_sha256(&thin).is_err());
    }
}
