//! A validated node config as the contract's `/etc/kiln/` files.

use crate::render::config::{Credential, JoinMode, NodeConfig};
use crate::render::kubeadm;
use crate::render::model::{NodeFile, PUBLIC_MODE, SECRET_MODE};

impl NodeConfig {
    /// The contract files for this node, in the contract's order.
    pub fn files(&self) -> Vec<NodeFile> {
        let mut files = vec![
            NodeFile {
                name: "node.env".into(),
                mode: PUBLIC_MODE,
                contents: self.node_env().into_bytes(),
            },
            NodeFile {
                name: "ca.crt".into(),
                mode: PUBLIC_MODE,
                contents: self.ca_pem.clone(),
            },
        ];
        match (self.join_mode, &self.credential) {
            (JoinMode::Kubeadm, Credential::Token(token)) => files.push(NodeFile {
                name: "kubeadm-join.yaml".into(),
                mode: SECRET_MODE,
                contents: kubeadm::join_configuration(self, token).into_bytes(),
            }),
            (_, Credential::Kubeconfig(k)) => files.push(NodeFile {
                name: "bootstrap-kubeconfig".into(),
                mode: SECRET_MODE,
                contents: k.clone(),
            }),
            (JoinMode::Kubelet, Credential::Token(token)) => files.push(NodeFile {
                name: "bootstrap-token".into(),
                mode: SECRET_MODE,
                contents: format!("{token}\n").into_bytes(),
            }),
        }
        if let Some(config) = &self.kubelet_dropin {
            files.push(NodeFile {
                name: "kubelet-dropin.conf".into(),
                mode: PUBLIC_MODE,
                contents: config.clone(),
            });
        }
        if !self.sysctl.is_empty() {
            files.push(NodeFile {
                name: "sysctl.conf".into(),
                mode: PUBLIC_MODE,
                contents: kiln_firstboot::contract::sysctl::render(&self.sysctl).into_bytes(),
            });
        }
        if let Some(json) = &self.credential_providers {
            files.push(NodeFile {
                name: crate::render::model::CREDENTIAL_PROVIDERS.into(),
                mode: SECRET_MODE,
                contents: json.clone(),
            });
        }
        if let Some(text) = &self.containerd_config {
            files.push(NodeFile {
                name: crate::render::model::CONTAINERD_CONFIG.into(),
                mode: PUBLIC_MODE,
                contents: text.clone().into_bytes(),
            });
        }
        if let Some(pem) = &self.trust_pem {
            files.push(NodeFile {
                name: crate::render::model::TRUST_BUNDLE.into(),
                mode: PUBLIC_MODE,
                contents: pem.clone(),
            });
        }
        // Sorted by name (a host directory's CA before its hosts.toml), the order a file
        // tree reads back in.
        let mut registries: Vec<NodeFile> = Vec::new();
        for r in &self.registries {
            let dir = format!("{}/{}", crate::render::registries::CERTS_D, r.dir_name());
            registries.push(NodeFile {
                name: format!("{dir}/hosts.toml"),
                mode: PUBLIC_MODE,
                contents: r.hosts_toml().into_bytes(),
            });
            if let Some(ca) = &r.ca_pem {
                registries.push(NodeFile {
                    name: format!("{dir}/ca.crt"),
                    mode: PUBLIC_MODE,
                    contents: ca.clone(),
                });
            }
        }
        registries.sort_by(|a, b| a.name.cmp(&b.name));
        files.extend(registries);
        files
    }
}
