//! The kubelet-start phase's files (kubernetes/kubernetes `cmd/kubeadm/app`):
//!
//! - `phases/kubelet/config.go` `WriteConfigToDisk`: the cluster's `kubelet-config` with the
//!   `kubeletconfiguration` patches of `patches.directory` applied
//!   (`util/patches/patches.go`: files named `target[suffix][+patchtype].extension`, applied
//!   in file-name order; `strategic` is the default type) → `/var/lib/kubelet/config.yaml`;
//! - `phases/kubelet/flags.go` `WriteKubeletDynamicEnvFile`: `KUBELET_KUBEADM_ARGS=%q` with
//!   `--container-runtime-endpoint` (criSocket), `--pod-infra-container-image`,
//!   `--register-with-taints` (a worker's taints), `--hostname-override` (when the node name is
//!   not the hostname), merged with `kubeletExtraArgs` by `ArgumentsToCommand` (an extra arg
//!   replaces the base args of its name; sorted by name) → `/var/lib/kubelet/kubeadm-flags.env`;
//! - the bootstrap kubeconfig (`discovery/token`, `kubeconfig.CreateWithToken`): cluster
//!   `kubernetes`, user `tls-bootstrap-token-user` → `/etc/kubernetes/bootstrap-kubelet.conf`.

use std::path::Path;

use base64::Engine;
use serde_json::Value;

use crate::config::{Arg, JoinConfiguration};

/// JSON merge of `patch` into `target` (RFC 7386; a strategic merge on KubeletConfiguration,
/// which has no list merge keys, merges maps the same way and replaces lists).
pub fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

const TARGETS: [&str; 6] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubeletconfiguration",
    "corednsdeployment",
];

/// The patches to apply, each `(patch type, patch)`, and the file names kubeadm ignored.
type Patches = (Vec<(String, Value)>, Vec<String>);

/// The kubeletconfiguration patch files of `dir` in the order kubeadm applies them, with
/// what it prints; a file kubeadm would refuse is an error.
pub fn patches(dir: &Path) -> Result<Patches, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "could not list patch files for path {:?}: {e}",
            dir.display()
        )
    })?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let (mut out, mut ignored) = (Vec::new(), Vec::new());
    for name in names {
        let (stem, ext) = name.rsplit_once('.').unwrap_or((&name, ""));
        if ext != "json" && ext != "yaml" {
            ignored.push(name.clone());
            continue;
        }
        let (target_suffix, kind) = stem.split_once('+').unwrap_or((stem, "strategic"));
        let Some(target) = TARGETS.iter().find(|t| target_suffix.starts_with(**t)) else {
            ignored.push(name.clone());
            continue;
        };
        if !["strategic", "merge", "json"].contains(&kind) {
            return Err(format!(
                "unknown or missing patch type {kind:?} in file {name:?}"
            ));
        }
        if *target != "kubeletconfiguration" {
            continue;
        }
        if kind == "json" {
            return Err(format!(
                "stand-in kubeadm: JSON patches ({name}) are not modelled"
            ));
        }
        let text = std::fs::read_to_string(dir.join(&name))
            .map_err(|e| format!("could not read patch file {name:?}: {e}"))?;
        let value: Value = serde_yaml_ng::from_str(&text)
            .map_err(|e| format!("could not parse patch file {name:?}: {e}"))?;
        out.push((kind.to_string(), value));
    }
    Ok((out, ignored))
}

/// `/var/lib/kubelet/config.yaml`: the cluster's kubelet-config with the patches applied.
pub fn config_yaml(
    cluster_config: &str,
    patch_dir: Option<&Path>,
) -> Result<(String, Vec<String>), String> {
    let mut value: Value = serde_yaml_ng::from_str(cluster_config)
        .map_err(|e| format!("failed to decode the kubelet-config ConfigMap: {e}"))?;
    let mut lines = Vec::new();
    if let Some(dir) = patch_dir {
        let (ps, ignored) = patches(dir)?;
        if !ignored.is_empty() {
            lines.push(format!(
                "[patches] Ignored patch files {ignored:?} in directory {:?}",
                dir.display()
            ));
        }
        for (kind, p) in ps {
            merge(&mut value, &p);
            let mime = if kind == "merge" {
                "application/merge-patch+json"
            } else {
                "application/strategic-merge-patch+json"
            };
            lines.push(format!(
                "[patches] Applied patch of type {mime:?} to target \"kubeletconfiguration\""
            ));
        }
    }
    let yaml = serde_yaml_ng::to_string(&value).map_err(|e| e.to_string())?;
    Ok((yaml, lines))
}

/// `ArgumentsToCommand(base, overrides)`.
pub fn arguments_to_command(base: &[Arg], overrides: &[Arg]) -> Vec<String> {
    let mut args: Vec<Arg> = overrides.to_vec();
    for a in base {
        if !overrides.iter().any(|o| o.name == a.name) {
            args.push(a.clone());
        }
    }
    args.sort_by(|a, b| a.name.cmp(&b.name));
    args.iter()
        .map(|a| format!("--{}={}", a.name, a.value))
        .collect()
}

/// Go's `%q` of a string.
fn go_quote(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\x{:02x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The node name kubeadm uses: `nodeRegistration.name`, or the hostname; a
/// `hostname-override` extra arg wins (`GetNodeNameAndHostname`).
pub fn node_name(cfg: &JoinConfiguration, hostname: &str) -> String {
    let n = &cfg.node_registration;
    let mut name = if n.name.is_empty() {
        hostname.to_string()
    } else {
        n.name.clone()
    };
    if let Some(a) = n
        .kubelet_extra_args
        .iter()
        .rev()
        .find(|a| a.name == "hostname-override")
    {
        name = a.value.clone();
    }
    name
}

/// `/var/lib/kubelet/kubeadm-flags.env` for a worker.
pub fn flags_env(cfg: &JoinConfiguration, cri_socket: &str, pause: &str, hostname: &str) -> String {
    let n = &cfg.node_registration;
    let mut base = vec![
        Arg {
            name: "container-runtime-endpoint".into(),
            value: cri_socket.into(),
        },
        Arg {
            name: "pod-infra-container-image".into(),
            value: pause.into(),
        },
    ];
    if let Some(t) = n.taints.as_ref().filter(|t| !t.is_empty()) {
        let s: Vec<String> = t
            .iter()
            .map(|t| {
                if t.value.is_empty() {
                    format!("{}:{}", t.key, t.effect)
                } else {
                    format!("{}={}:{}", t.key, t.value, t.effect)
                }
            })
            .collect();
        base.push(Arg {
            name: "register-with-taints".into(),
            value: s.join(","),
        });
    }
    let name = node_name(cfg, hostname);
    if name != hostname {
        base.push(Arg {
            name: "hostname-override".into(),
            value: name,
        });
    }
    let args = arguments_to_command(&base, &n.kubelet_extra_args);
    format!("KUBELET_KUBEADM_ARGS={}\n", go_quote(&args.join(" ")))
}

/// `/etc/kubernetes/bootstrap-kubelet.conf`.
pub fn bootstrap_kubeconfig(server: &str, ca_pem: &str, token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: {server}\n  name: kubernetes\ncontexts:\n- context:\n    cluster: kubernetes\n    user: tls-bootstrap-token-user\n  name: tls-bootstrap-token-user@kubernetes\ncurrent-context: tls-bootstrap-token-user@kubernetes\nkind: Config\npreferences: {{}}\nusers:\n- name: tls-bootstrap-token-user\n  user:\n    token: {token}\n"
    )
}

/// `kubeconfigutil.ClientSetFromFile` succeeds: the file is a kubeconfig whose user's client
/// certificate is there (inline or a file that exists).
pub fn client_config_loads(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let Ok(v) = serde_yaml_ng::from_str::<Value>(&text) else {
        return false;
    };
    let users = v
        .get("users")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    users.iter().any(|u| {
        let user = &u["user"];
        user.get("client-certificate-data").is_some()
            || user
                .get("client-certificate")
                .and_then(Value::as_str)
                .is_some_and(|c| Path::new(c).is_file())
    })
}
