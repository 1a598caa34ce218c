//! Renders `/run/kiln/kubelet.env` (keys in the contract's order, same inputs → same bytes)
//! and the bootstrap kubeconfig built from a bootstrap token.

use crate::config::{self, Config, Credential, JoinMode};
use crate::envfile::write_line;

/// What the node is, after overrides: the values `kubelet.env` is made of.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    pub provider: String,
    pub node_name: String,
    pub node_ip: String,
    pub instance_id: String,
    pub instance_type: String,
    pub zone: String,
    pub region: String,
    pub provider_id: String,
}

/// Node path of the bootstrap kubeconfig kubelet gets, or `None` in kubeadm mode.
pub fn bootstrap_kubeconfig_path(cfg: &Config) -> Option<&'static str> {
    match (&cfg.join_mode, &cfg.credential) {
        (JoinMode::Kubeadm, _) | (_, Credential::KubeadmJoin) => None,
        (_, Credential::Token(_)) => Some(config::RUN_BOOTSTRAP_KUBECONFIG),
        (_, Credential::Kubeconfig) => Some(config::BOOTSTRAP_KUBECONFIG),
    }
}

/// The complete kubelet command line, operator's extra args last so they win.
pub fn kubelet_args(cfg: &Config, node: &Node, max_pods: u32) -> String {
    let mut a = String::with_capacity(512);
    let mut flag = |name: &str, value: &str| {
        if !a.is_empty() {
            a.push(' ');
        }
        a.push_str("--");
        a.push_str(name);
        a.push('=');
        a.push_str(value);
    };
    flag("config", &cfg.kubelet_config);
    flag("kubeconfig", "/var/lib/kubelet/kubeconfig");
    if let Some(p) = bootstrap_kubeconfig_path(cfg) {
        flag("bootstrap-kubeconfig", p);
    }
    flag("container-runtime-endpoint", &cfg.runtime_endpoint);
    flag("hostname-override", &node.node_name);
    flag("node-ip", &node.node_ip);
    if !node.provider_id.is_empty() {
        flag("provider-id", &node.provider_id);
    }
    flag("max-pods", &max_pods.to_string());
    let labels = cfg.node_value("NODE_LABELS");
    if !labels.is_empty() {
        flag("node-labels", labels);
    }
    let taints = cfg.node_value("NODE_TAINTS");
    if !taints.is_empty() {
        flag("register-with-taints", taints);
    }
    let dns = cfg.node_value("CLUSTER_DNS");
    if !dns.is_empty() {
        flag("cluster-dns", dns);
    }
    let extra = cfg.node_value("KUBELET_EXTRA_ARGS").trim();
    if !extra.is_empty() {
        a.push(' ');
        a.push_str(extra);
    }
    a
}

/// The text of `kubelet.env`.
pub fn render(cfg: &Config, node: &Node) -> String {
    let max_pods = cfg.max_pods(&node.instance_type);
    let mut out = String::with_capacity(1024);
    let mut put = |k: &str, v: &str| write_line(&mut out, k, v);
    put("KILN_CONTRACT", config::CONTRACT);
    put("PROVIDER", &node.provider);
    put("NODE_NAME", &node.node_name);
    put("NODE_IP", &node.node_ip);
    put("INSTANCE_ID", &node.instance_id);
    put("INSTANCE_TYPE", &node.instance_type);
    put("ZONE", &node.zone);
    put("REGION", &node.region);
    put("PROVIDER_ID", &node.provider_id);
    put("MAX_PODS", &max_pods.to_string());
    put("NODE_LABELS", cfg.node_value("NODE_LABELS"));
    put("NODE_TAINTS", cfg.node_value("NODE_TAINTS"));
    put("KUBELET_EXTRA_ARGS", cfg.node_value("KUBELET_EXTRA_ARGS"));
    for k in ["HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"] {
        if let Some(v) = cfg.node.non_empty(k) {
            put(k, v);
        }
    }
    // Always quoted, as the contract shows, even when it has no space.
    out.push_str("KUBELET_ARGS=\"");
    for c in kubelet_args(cfg, node, max_pods).chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '$' => out.push_str("\\$"),
            '`' => out.push_str("\\`"),
            c => out.push(c),
        }
    }
    out.push_str("\"\n");
    out
}

/// A kubeconfig for kubelet's TLS bootstrap around `token`. Paths are node paths.
pub fn bootstrap_kubeconfig(cfg: &Config, token: &str) -> String {
    let cluster = cfg.node_value("CLUSTER_NAME");
    let server = cfg.node_value("API_SERVER");
    let mut s = String::with_capacity(512);
    for part in [
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ",
        cluster,
        "\n  cluster:\n    server: ",
        server,
        "\n    certificate-authority: ",
        config::CA_CRT,
        "\ncontexts:\n- name: kubelet-bootstrap@",
        cluster,
        "\n  context:\n    cluster: ",
        cluster,
        "\n    user: kubelet-bootstrap\ncurrent-context: kubelet-bootstrap@",
        cluster,
        "\nusers:\n- name: kubelet-bootstrap\n  user:\n    token: ",
        token,
        "\n",
    ] {
        s.push_str(part);
    }
    s
}
