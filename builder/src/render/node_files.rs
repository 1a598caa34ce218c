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
        files
    }
}
