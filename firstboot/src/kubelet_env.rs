//! Renders `/run/kiln/kubelet.env` (keys in the contract's order, same inputs → same bytes)
//! and the bootstrap kubeconfig built from a bootstrap token.

use crate::config::{Config, Credential};
use crate::contract::envfile::{write_line, write_quoted_line};
use crate::contract::kubelet_env as key;
use crate::contract::paths::{self, NodePaths};
use crate::contract::{JoinMode, Provider, VERSION_TEXT};
use crate::json;
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

/// A warning when kubeadm mode's JoinConfiguration does not name kiln's patch directory
/// (`kubeadm join` refuses `--patches` beside `--config`, so the file must): kubelet would then
/// run without the provider ID, max pods and reservations. `kiln render` always names it.
pub fn kubeadm_patch_unused(paths: &NodePaths, cfg: &Config) -> Option<String> {
    if cfg.node.join_mode != JoinMode::Kubeadm {
        return None;
    }
    let text = std::fs::read_to_string(&paths.kubeadm_join).unwrap_or_default();
    let named = text.lines().any(|l| {
        let l = l.trim();
        l.strip_prefix("directory:").is_some_and(|v| {
            v.trim().trim_matches(|c| c == '"' || c == '\'') == paths::KUBEADM_PATCHES_DIR
        })
    });
    (!named).then(|| {
        format!(
            "{} names no patches.directory {}: kubeadm will not apply kiln's kubelet settings (provider ID, max pods, reservations) from {}",
            paths::KUBEADM_JOIN,
            paths::KUBEADM_PATCHES_DIR,
            paths::KUBEADM_KUBELET_PATCH
        )
    })
}

/// The longest node name the API server accepts (a DNS-1123 subdomain).
const MAX_NODE_NAME: usize = 253;

/// The node name from what a metadata source returned: its hostname, else its instance id,
/// checked by [`node_name`]; the error says which was used and why it cannot be.
pub fn metadata_node_name(hostname: &str, instance_id: &str) -> Result<String, String> {
    let (what, raw) = match (hostname.is_empty(), instance_id.is_empty()) {
        (false, _) => ("hostname", hostname),
        (true, false) => ("instance id", instance_id),
        (true, true) => {
            return Err(
                "expected a hostname or instance id for the node name, found neither".into(),
            )
        }
    };
    node_name(raw).map_err(|why| format!("{what} as the node name: {why}"))
}

/// The node name kubelet registers for a name the metadata source gave (its hostname, else
/// its instance id), or why there is none. kubelet lowercases its hostname
/// (k8s.io/component-helpers `node/util.GetHostname`), and the API server accepts a Node
/// only under a DNS-1123 subdomain name (`pkg/apis/core/validation`: `ValidateNodeName` is
/// `NameIsDNSSubdomain`): labels of `[a-z0-9-]` that start and end with a letter or digit,
/// joined by dots, 253 characters at most. A name outside that would make kubelet fail
/// to register long after this run said the node was written, so it is refused here, with
/// where it went wrong but none of its bytes.
pub fn node_name(raw: &str) -> Result<String, String> {
    let name = raw.trim().to_ascii_lowercase();
    let expected = "expected a DNS-1123 name (labels of a-z, 0-9 and '-' that start and end with a letter or digit, joined by '.', at most 253 characters)";
    if name.is_empty() {
        return Err(format!("{expected}, found an empty name"));
    }
    if name.chars().count() > MAX_NODE_NAME {
        return Err(format!(
            "{expected}, found {} characters",
            name.chars().count()
        ));
    }
    let mut at = 0;
    for label in name.split('.') {
        let bytes = label.as_bytes();
        if let Some(i) = label
            .char_indices()
            .find(|&(_, c)| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            .map(|(i, _)| i)
        {
            return Err(format!(
                "{expected}, found another character at offset {}",
                at + i
            ));
        }
        match (bytes.first(), bytes.last()) {
            (None, _) => return Err(format!("{expected}, found an empty label at offset {at}")),
            (Some(b'-'), _) | (_, Some(b'-')) => {
                return Err(format!(
                    "{expected}, found a label that starts or ends with '-' at offset {at}"
                ))
            }
            _ => {}
        }
        at += label.len() + 1;
    }
    Ok(name)
}

/// Node path of the bootstrap kubeconfig kubelet gets, or `None` in kubeadm mode.
pub fn bootstrap_kubeconfig_path(cfg: &Config) -> Option<&'static str> {
    match (cfg.node.join_mode, &cfg.credential) {
        (JoinMode::Kubeadm, _) | (_, Credential::KubeadmJoin) => None,
        (_, Credential::Token(_)) => Some(paths::RUN_BOOTSTRAP_KUBECONFIG),
        (_, Credential::Kubeconfig) => Some(paths::BOOTSTRAP_KUBECONFIG),
    }
}

/// The complete kubelet command line, operator's extra args last so they win. Only what has
/// no KubeletConfiguration field is a flag; the rest is in the node's drop-in
/// ([`node_dropin`]) in the directory `--config-dir` names. In kubeadm mode, the part of
/// the command line kiln owns beside kubeadm's `$KUBELET_KUBEADM_ARGS`
/// ([`kubeadm_kubelet_args`]).
pub fn kubelet_args(cfg: &Config, node: &Node) -> String {
    if cfg.node.join_mode == JoinMode::Kubeadm {
        return kubeadm_kubelet_args(cfg, node);
    }
    let mut a = String::with_capacity(384);
    let mut flag = |name: &str, value: &str| push_flag(&mut a, name, value);
    flag("config", &cfg.kubelet_config);
    flag("config-dir", &config_dir());
    flag("kubeconfig", paths::KUBELET_KUBECONFIG);
    if let Some(p) = bootstrap_kubeconfig_path(cfg) {
        flag("bootstrap-kubeconfig", p);
    }
    flag("hostname-override", &node.node_name);
    flag("node-ip", &node.node_ip);
    if !cfg.node.node_labels.is_empty() {
        flag("node-labels", &cfg.node.node_labels);
    }
    push_credential_providers(&mut a, cfg);
    push_extra(&mut a, &cfg.node.kubelet_extra_args);
    a
}

/// kubelet's two credential provider flags, only with `/etc/kiln/credential-providers.json`:
/// either alone makes kubelet register plugins (and fail), neither has a config field.
fn push_credential_providers(a: &mut String, cfg: &Config) {
    if cfg.credential_providers {
        push_flag(
            a,
            "image-credential-provider-config",
            paths::CREDENTIAL_PROVIDERS,
        );
        push_flag(
            a,
            "image-credential-provider-bin-dir",
            &cfg.image.credential_provider_bin_dir,
        );
    }
}

/// kubelet's `--config-dir` as the node spells it (Windows: under the system drive, as the
/// image's `KUBELET_CONFIG` is).
pub fn config_dir() -> String {
    if cfg!(windows) {
        format!("C:/{}", paths::windows_place(paths::KUBELET_CONFIG_DIR))
    } else {
        paths::KUBELET_CONFIG_DIR.to_string()
    }
}

fn push_flag(a: &mut String, name: &str, value: &str) {
    if !a.is_empty() {
        a.push(' ');
    }
    a.push_str("--");
    a.push_str(name);
    a.push('=');
    a.push_str(value);
}

fn push_extra(a: &mut String, extra: &str) {
    let extra = extra.trim();
    if !extra.is_empty() {
        if !a.is_empty() {
            a.push(' ');
        }
        a.push_str(extra);
    }
}

/// kubelet's flags in kubeadm mode. kubelet.service runs
/// `kubelet $KUBELET_KUBEADM_ARGS $KUBELET_ARGS`, which is kubeadm's systemd drop-in
/// (10-kubeadm.conf) with kiln's flags in the place of its `$KUBELET_EXTRA_ARGS`: the
/// drop-in's kubeconfig, bootstrap kubeconfig and config file, then the node facts that only
/// a flag can carry and that kiln learns at boot (kubeadm's `kubeletExtraArgs` were rendered
/// before the node existed), then node.env's extra args. The facts kubelet takes from its
/// config file go through kubeadm's patch ([`kubeadm_kubelet_patch`]) instead.
pub fn kubeadm_kubelet_args(cfg: &Config, node: &Node) -> String {
    let mut a = String::with_capacity(256);
    push_flag(
        &mut a,
        "bootstrap-kubeconfig",
        paths::KUBEADM_BOOTSTRAP_KUBECONFIG,
    );
    push_flag(&mut a, "kubeconfig", paths::KUBEADM_KUBELET_CONF);
    push_flag(&mut a, "config", paths::KUBEADM_KUBELET_CONFIG);
    push_flag(&mut a, "config-dir", &config_dir());
    push_flag(&mut a, "hostname-override", &node.node_name);
    push_flag(&mut a, "node-ip", &node.node_ip);
    if !cfg.node.node_labels.is_empty() {
        push_flag(&mut a, "node-labels", &cfg.node.node_labels);
    }
    push_credential_providers(&mut a, cfg);
    push_extra(&mut a, &cfg.node.kubelet_extra_args);
    a
}

/// The KubeletConfiguration patch `kubeadm join` applies to the cluster's kubelet-config
/// before writing `/var/lib/kubelet/config.yaml` (`patches.directory` of kiln's
/// JoinConfiguration; kubeadm's `kubeletconfiguration+strategic` target). Holds the node facts
/// that are KubeletConfiguration fields: the image's runtime endpoint, provider ID, max pods,
/// reservations, eviction thresholds and cluster DNS, and `serverTLSBootstrap: true` when
/// node.env asks for it (unset, the cluster's kubelet-config decides, as in kubelet mode the
/// config file does).
pub fn kubeadm_kubelet_patch(cfg: &Config, node: &Node, sizing: &Sizing) -> String {
    node_config(cfg, node, sizing, false)
}

/// kubelet mode's per-node drop-in (`/run/kiln/kubelet.conf.d/10-kiln-node.conf`): the same
/// fields as kubeadm's patch, and the taints (kubeadm registers those itself, from its
/// JoinConfiguration). kubelet merges it over `--config`; the provisioned drop-in
/// (`50-kiln-provisioned.conf`) and the command line come after it.
pub fn node_dropin(cfg: &Config, node: &Node, sizing: &Sizing) -> String {
    node_config(cfg, node, sizing, true)
}

fn node_config(cfg: &Config, node: &Node, sizing: &Sizing, taints: bool) -> String {
    let mut o = String::with_capacity(512);
    o.push_str(
        "{\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"kind\":\"KubeletConfiguration\"",
    );
    let field = |o: &mut String, name: &str| {
        o.push_str(",\"");
        o.push_str(name);
        o.push_str("\":");
    };
    field(&mut o, "containerRuntimeEndpoint");
    json::write_str(&mut o, &cfg.image.runtime_endpoint);
    if !node.provider_id.is_empty() {
        field(&mut o, "providerID");
        json::write_str(&mut o, &node.provider_id);
    }
    field(&mut o, "maxPods");
    o.push_str(&sizing.max_pods.value.to_string());
    let r = &sizing.reserved;
    for (name, pairs) in [
        ("kubeReserved", &r.kube),
        ("systemReserved", &r.system),
        ("evictionHard", &r.eviction),
    ] {
        if pairs.0.is_empty() {
            continue;
        }
        field(&mut o, name);
        o.push('{');
        for (i, (k, v)) in pairs.0.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            json::write_str(&mut o, k);
            o.push(':');
            json::write_str(&mut o, v);
        }
        o.push('}');
    }
    let dns: Vec<&str> = cfg
        .node
        .cluster_dns
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if !dns.is_empty() {
        field(&mut o, "clusterDNS");
        o.push('[');
        for (i, d) in dns.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            json::write_str(&mut o, d);
        }
        o.push(']');
    }
    if cfg.node.server_tls_bootstrap {
        field(&mut o, "serverTLSBootstrap");
        o.push_str("true");
    }
    if taints && !cfg.node.node_taints.is_empty() {
        field(&mut o, "registerWithTaints");
        o.push('[');
        for (i, t) in cfg.node.node_taints.split(',').enumerate() {
            // node.env's shape was checked: `key[=value]:Effect`.
            let (kv, effect) = t.rsplit_once(':').unwrap_or((t, ""));
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            o.push_str(if i > 0 { ",{\"key\":" } else { "{\"key\":" });
            json::write_str(&mut o, k);
            if !v.is_empty() {
                o.push_str(",\"value\":");
                json::write_str(&mut o, v);
            }
            o.push_str(",\"effect\":");
            json::write_str(&mut o, effect);
            o.push('}');
        }
        o.push(']');
    }
    o.push_str("}\n");
    o
}

/// The reservations that are set, as `(kubelet.env key, value)`, in the contract's order.
fn reservations(sizing: &Sizing) -> impl Iterator<Item = (&'static str, String)> {
    let r = &sizing.reserved;
    [
        (key::KUBE_RESERVED, r.kube.render('=')),
        (key::SYSTEM_RESERVED, r.system.render('=')),
        (key::EVICTION_HARD, r.eviction.render('<')),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
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
    for (k, value) in reservations(sizing) {
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
    write_quoted_line(o, key::KUBELET_ARGS, &kubelet_args(cfg, node));
    out
}

/// `/run/kiln/containerd.env`: node.env's proxy keys for containerd, and a fingerprint of the
/// node's containerd configuration (`KILN_CONTAINERD_CONFIG`, FNV-1a of its bytes, which
/// containerd ignores), or `None` when neither is set. Go's `net/http`
/// (`httpproxy.FromEnvironment`) reads the upper-case proxy names. A different file means
/// containerd restarts, so it reads the node's proxy and configuration before kubelet starts.
pub fn containerd_env(cfg: &Config) -> Option<String> {
    let mut o = String::new();
    for (k, v) in cfg.node.proxies() {
        write_line(&mut o, k, v);
    }
    if let Some(text) = &cfg.containerd_config {
        let h = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        write_line(&mut o, "KILN_CONTAINERD_CONFIG", &format!("{h:016x}"));
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

#[cfg(test)]
mod tests {
    use super::node_name;

    #[test]
    fn node_names_are_what_the_api_server_accepts() {
        let ok = [
            (
                "ip-10-0-3-7.eu-west-1.compute.internal",
                "ip-10-0-3-7.eu-west-1.compute.internal",
            ),
            ("Kiln-Worker-0", "kiln-worker-0"),
            (" worker-1\n", "worker-1"),
            ("i-0abc123", "i-0abc123"),
            ("0", "0"),
        ];
        for (raw, want) in ok {
            assert_eq!(node_name(raw).as_deref(), Ok(want), "{raw:?}");
        }
        let long = "a".repeat(254);
        let bad = [
            ("", "an empty name"),
            ("worker 1", "another character at offset 6"),
            ("worker_1", "another character at offset 6"),
            ("evil\";rm", "another character at offset 4"),
            ("w\u{e9}", "another character at offset 1"),
            ("a..b", "an empty label at offset 2"),
            ("host.example.com.", "an empty label at offset 17"),
            (".a", "an empty label at offset 0"),
            ("-a", "starts or ends with '-' at offset 0"),
            ("a.b-", "starts or ends with '-' at offset 2"),
            (long.as_str(), "found 254 characters"),
        ];
        for (raw, want) in bad {
            let e = node_name(raw).unwrap_err();
            assert!(e.starts_with("expected a DNS-1123 name"), "{raw:?}: {e}");
            assert!(e.ends_with(want), "{raw:?}: {e}");
            if raw.len() > 3 {
                assert!(!e.contains(raw.trim()), "{raw:?} echoed: {e}");
            }
        }
        assert_eq!(node_name(&"a".repeat(253)).map(|n| n.len()), Ok(253));
    }
}
