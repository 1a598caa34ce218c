//! `kiln render`: one neutral `node.toml` → the `/etc/kiln/` files of the node contract, in the
//! format of every provisioner (cloud-init, Ignition, Windows user data, a plain file tree),
//! and the way back (`--check`) from any of those formats to the files they would write.

pub mod check;
pub mod cloudinit;
pub mod config;
pub mod containerd_config;
pub mod files;
pub mod ignition;
pub mod input;
pub mod kubeadm;
pub mod kubelet_dropin;
pub mod limits;
pub mod model;
mod names;
pub mod node_files;
pub mod node_toml;
pub mod pki;
pub mod registries;
pub mod sysext;
pub mod windows;

pub use check::{check_payload, contract_problems, Checked};
pub use config::{ConfigError, NodeConfig};
pub use model::{
    gunzip, gzip, write_atomic, NodeFile, Provisioner, RenderError, CONTRACT_FILES, LINUX_DIR,
    MAX_GUNZIPPED, PUBLIC_MODE, SECRET_MODE, WINDOWS_DIR,
};

/// Options that change how user data is encoded, and what Ignition places besides the node
/// files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenderOptions<'a> {
    /// Compress: the whole user data (cloud-init, Windows) or each file (Ignition).
    pub gzip: bool,
    /// The Ignition spec version to write (ignored by the other provisioners).
    pub ignition_spec: ignition::Spec,
    /// A baked Flatcar sysext Ignition places at first boot (Ignition only).
    pub sysext: Option<&'a sysext::Sysext>,
}

/// Renders the node's contract files into one provisioner's user data.
///
/// The same `files` and options always give the same bytes.
pub fn render_payload(
    files: &[NodeFile],
    provisioner: Provisioner,
    options: RenderOptions<'_>,
) -> Result<Vec<u8>, RenderError> {
    let payload = match provisioner {
        Provisioner::CloudInit => cloudinit::render(files),
        Provisioner::Ignition => {
            ignition::render(files, options.gzip, options.ignition_spec, options.sysext)
        }
        Provisioner::Windows if files.iter().any(|f| f.name == "sysctl.conf") => {
            return Err(RenderError::check(
                "node.toml",
                "[sysctl] sets Linux kernel parameters, which a Windows node does not have: leave it out for the windows provisioner",
            ))
        }
        Provisioner::Windows if files.iter().any(|f| f.name == model::CREDENTIAL_PROVIDERS) => {
            return Err(RenderError::check(
                "node.toml",
                "[[kubelet.credential_provider]] names binaries under the image's Linux CREDENTIAL_PROVIDER_BIN_DIR; the Windows layer carries none: leave it out for the windows provisioner",
            ))
        }
        Provisioner::Windows if files.iter().any(|f| f.name == model::CONTAINERD_CONFIG) => {
            return Err(RenderError::check(
                "node.toml",
                "[containerd.config] is merged by a containerd that kiln-firstboot restarts once the file is there, which it does on Linux only (containerd.exe is an automatic service that starts before the user data runs): leave it out for the windows provisioner and set it in the image definition",
            ))
        }
        Provisioner::Windows
            if files.iter().any(|f| {
                f.name == "node.env"
                    && String::from_utf8_lossy(&f.contents)
                        .lines()
                        .any(|l| l.starts_with("SWAP_FILE_SIZE="))
            }) =>
        {
            return Err(RenderError::check(
                "node.toml",
                "swap.file_size makes a Linux swap file: leave it out for the windows provisioner",
            ))
        }
        Provisioner::Windows => windows::render(files),
        Provisioner::Files => return Err(RenderError::NotAPayload),
    };
    // Ignition compresses per file (above); the other two are compressed whole.
    if options.gzip && provisioner != Provisioner::Ignition {
        Ok(gzip(&payload))
    } else {
        Ok(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::model::gunzip_capped;

    const EXAMPLE_CA: &str = include_str!("../../../docs/examples/render/ca.crt");

    fn file(name: &str, mode: u32, contents: &str) -> NodeFile {
        NodeFile {
            name: name.into(),
            mode,
            contents: contents.as_bytes().to_vec(),
        }
    }

    #[test]
    fn gzip_is_deterministic_and_reversible() {
        let a = gzip(b"hello kiln\n");
        assert_eq!(a, gzip(b"hello kiln\n"));
        assert_eq!(gunzip(&a, "x").unwrap(), b"hello kiln\n");
        assert!(gunzip(&a[..a.len() - 4], "x").is_err());
        // A bomb: 4 MiB of zeros compress to a few KiB and are refused past the cap, with
        // the source named; at the cap itself they are accepted.
        let bomb = gzip(&vec![0u8; 4 << 20]);
        let e = gunzip_capped(&bomb, "user-data.gz", 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("user-data.gz") && e.contains("gzip bomb"), "{e}");
        assert_eq!(gunzip_capped(&bomb, "x", 4 << 20).unwrap().len(), 4 << 20);
    }

    #[test]
    fn contract_problems_table() {
        let env = "KILN_CONTRACT=1\nAPI_SERVER=https://a:6443\nCLUSTER_NAME=c\n";
        let ok = vec![
            file("node.env", 0o644, env),
            file("ca.crt", 0o644, EXAMPLE_CA),
            file("bootstrap-token", 0o600, "abcdef.0123456789abcdef\n"),
        ];
        assert!(
            contract_problems(&ok).is_empty(),
            "{:?}",
            contract_problems(&ok)
        );

        // Contents are checked too, and a bad token is described, not shown.
        let mut bad = ok.clone();
        bad[1] = file(
            "ca.crt",
            0o644,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        bad[2] = file("bootstrap-token", 0o600, "Secret.Value\n");
        let p = contract_problems(&bad);
        assert!(
            p.iter()
                .any(|m| m.starts_with("/etc/kiln/ca.crt: a certificate does not parse")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|m| m.contains("found 12 bytes that do not match (not shown)")),
            "{p:?}"
        );
        assert!(!p.iter().any(|m| m.contains("Secret")), "{p:?}");
        let join = file("kubeadm-join.yaml", 0o600, "apiVersion: v1\nkind: Config\n");
        let p = contract_problems(std::slice::from_ref(&join));
        assert!(
            p.iter()
                .any(|m| m.contains("expected kind: JoinConfiguration")),
            "{p:?}"
        );

        let mut world_readable = ok.clone();
        world_readable[2].mode = 0o644;
        let p = contract_problems(&world_readable);
        assert!(
            p[0].contains("mode 0644, the contract requires 0600"),
            "{p:?}"
        );

        let mut two = ok.clone();
        two.push(file("bootstrap-kubeconfig", 0o600, "x"));
        let p = contract_problems(&two);
        assert!(
            p.iter()
                .any(|m| m.contains("found bootstrap-kubeconfig, bootstrap-token")),
            "{p:?}"
        );

        let mut kubeadm = ok.clone();
        kubeadm[0] = file("node.env", 0o644, &format!("{env}JOIN_MODE=kubeadm\n"));
        let p = contract_problems(&kubeadm);
        assert!(
            p[0].contains("needs exactly one of kubeadm-join.yaml"),
            "{p:?}"
        );

        let p = contract_problems(&[file("node.env", 0o644, "KILN_CONTRACT=2\n")]);
        assert!(
            p.iter().any(|m| m.contains("KILN_CONTRACT must be 1")),
            "{p:?}"
        );
        assert!(p.iter().any(|m| m.contains("API_SERVER missing")), "{p:?}");
        assert!(p.iter().any(|m| m.contains("ca.crt: missing")), "{p:?}");
    }

    #[test]
    fn unknown_user_data_is_named() {
        let err = check_payload(b"#!/bin/sh\necho hi\n", "ud.txt").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("ud.txt: unrecognised user data"), "{msg}");
        assert!(msg.contains("\"#!/bin/sh\""), "{msg}");
    }
}
