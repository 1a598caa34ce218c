//! Renders `/run/kiln/kubelet.env` (keys in the contract's order, same inputs → same bytes)
//! and the bootstrap kubeconfig built from a bootstrap token.

use crate::config::{Config, Credential};
use crate::contract::envfile::{write_line, write_quoted_line};
use crate::contract::kubelet_env as key;
use crate::contract::{paths, JoinMode, Provider, VERSION_TEXT};
use crate::sizing::Sizing;

/// What the node is, after overrides: the values `kubelet.env` is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The metadata source that answered.
    pub provider: Provider,
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
    match (cfg.node.join_mode, &cfg.credential) {
        (JoinMode::Kubeadm, _) | (_, Credential::KubeadmJoin) => None,
        (_, Credential::Token(_)) => Some(paths::RUN_BOOTSTRAP_KUBECONFIG),
        (_, Credential::Kubeconfig) => Some(paths::BOOTSTRAP_KUBECONFIG),
    }
}

/// The complete kubelet command line, operator's extra args last so they win.
pub fn kubelet_args(cfg: &Config, node: &Node, sizing: &Sizing) -> String {
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
    flag("kubeconfig", paths::KUBELET_KUBECONFIG);
    if let Some(p) = bootstrap_kubeconfig_path(cfg) {
        flag("bootstrap-kubeconfig", p);
    }
    flag("container-runtime-endpoint", &cfg.image.runtime_endpoint);
    flag("hostname-override", &node.node_name);
    flag("node-ip", &node.node_ip);
    if !node.provider_id.is_empty() {
        flag("provider-id", &node.provider_id);
    }
    flag("max-pods", &sizing.max_pods.value.to_string());
    for (name, _, value) in reservations(sizing) {
        flag(name, &value);
    }
    let n = &cfg.node;
    if !n.node_labels.is_empty() {
        flag("node-labels", &n.node_labels);
    }
    if !n.node_taints.is_empty() {
        flag("register-with-taints", &n.node_taints);
    }
    if !n.cluster_dns.is_empty() {
        flag("cluster-dns", &n.cluster_dns);
    }
    let extra = n.kubelet_extra_args.trim();
    if !extra.is_empty() {
        a.push(' ');
        a.push_str(extra);
    }
    a
}

/// The reservations that are set, as `(flag, kubelet.env key, value)`, in the contract's order.
fn reservations(sizing: &Sizing) -> impl Iterator<Item = (&'static str, &'static str, String)> {
    let r = &sizing.reserved;
    [
        ("kube-reserved", key::KUBE_RESERVED, r.kube.render('=')),
        (
            "system-reserved",
            key::SYSTEM_RESERVED,
            r.system.render('='),
        ),
        ("eviction-hard", key::EVICTION_HARD, r.eviction.render('<')),
    ]
    .into_iter()
    .filter(|(_, _, v)| !v.is_empty())
}

/// The text of `kubelet.env`.
pub fn render(cfg: &Config, node: &Node, sizing: &Sizing) -> String {
    let mut out = String::with_capacity(1024);
    let o = &mut out;
    write_line(o, key::KILN_CONTRACT, VERSION_TEXT);
    write_line(o, key::PROVIDER, node.provider.name());
    write_line(o, key::NODE_NAME, &node.node_name);
    write_line(o, key::NODE_IP, &node.node_ip);
    write_line(o, key::INSTANCE_ID, &node.instance_id);
    write_line(o, key::INSTANCE_TYPE, &node.instance_type);
    write_line(o, key::ZONE, &node.zone);
    write_line(o, key::REGION, &node.region);
    write_line(o, key::PROVIDER_ID, &node.provider_id);
    write_line(o, key::MAX_PODS, &sizing.max_pods.value.to_string());
    for (_, k, value) in reservations(sizing) {
        // Quoted: `<` in an eviction threshold is a redirection to a shell.
        write_quoted_line(o, k, &value);
    }
    write_line(o, key::NODE_LABELS, &cfg.node.node_labels);
    write_line(o, key::NODE_TAINTS, &cfg.node.node_taints);
    write_line(o, key::KUBELET_EXTRA_ARGS, &cfg.node.kubelet_extra_args);
    for (k, v) in cfg.node.proxies() {
        write_line(o, k, v);
    }
    // Always quoted, as the contract shows, even when it has no space.
    write_quoted_line(o, key::KUBELET_ARGS, &kubelet_args(cfg, node, sizing));
    out
}

/// `/run/kiln/containerd.env`: node.env's proxy keys for containerd, or `None` when no proxy
/// is set. Go's `net/http` (`httpproxy.FromEnvironment`) reads these upper-case names.
pub fn containerd_env(cfg: &Config) -> Option<String> {
    let mut o = String::new();
    for (k, v) in cfg.node.proxies() {
        write_line(&mut o, k, v);
    }
    (!o.is_empty()).then(|| {
        let mut out = String::with_capacity(o.len() + 64);
        out.push_str(
            "# Written by kiln-firstboot from /etc/kiln/node.env; see docs/contract.md.\n",
        );
        out.push_str(&o);
        out
    })
}

/// A kubeconfig for kubelet's TLS bootstrap around `token`. Paths are node paths.
pub fn bootstrap_kubeconfig(cfg: &Config, token: &str) -> String {
    let cluster = cfg.node.cluster_name.as_str();
    let server = cfg.node.api_server.as_str();
    let mut s = String::with_capacity(512);
    for part in [
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ",
        cluster,
        "\n  cluster:\n    server: ",
        server,
        "\n    certificate-authority: ",
        paths::CA_CRT,
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
