//! kubeadm's `JoinConfiguration` (kubeadm.k8s.io/v1beta4) generated from the node config, so
//! users never write kubeadm types; plus the CA public-key pin kubeadm discovery needs.

use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::config::NodeConfig;

/// The kubeadm configuration API version kiln writes (current since Kubernetes 1.31).
pub const API_VERSION: &str = "kubeadm.k8s.io/v1beta4";

/// The CRI socket kiln images run containerd on (`docs/contract.md`, image.env default).
pub const CRI_SOCKET: &str = "unix:///run/containerd/containerd.sock";

/// Extracts the DER bytes of every `CERTIFICATE` block of a PEM bundle.
pub fn pem_certificates(pem: &str) -> Result<Vec<Vec<u8>>, String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(start) = rest.find(BEGIN) {
        let body = &rest[start + BEGIN.len()..];
        let end = body
            .find(END)
            .ok_or_else(|| format!("certificate {} has no {END} line", out.len() + 1))?;
        let b64: String = body[..end].chars().filter(|c| !c.is_whitespace()).collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("certificate {} is not valid base64: {e}", out.len() + 1))?;
        out.push(der);
        rest = &body[end + END.len()..];
    }
    if out.is_empty() {
        return Err(format!("no {BEGIN} block"));
    }
    Ok(out)
}

/// One DER element: its tag and the byte ranges of the whole element and of its content.
struct Tlv {
    tag: u8,
    whole: std::ops::Range<usize>,
    content: std::ops::Range<usize>,
}

fn tlv(der: &[u8], at: usize) -> Result<Tlv, String> {
    let short = || format!("truncated DER at byte {at}");
    let tag = *der.get(at).ok_or_else(short)?;
    let first = *der.get(at + 1).ok_or_else(short)?;
    let (len, header) = if first < 0x80 {
        (first as usize, 2)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 {
            return Err(format!(
                "unsupported DER length form 0x{first:02x} at byte {at}"
            ));
        }
        let bytes = der.get(at + 2..at + 2 + n).ok_or_else(short)?;
        (
            bytes.iter().fold(0usize, |acc, b| acc << 8 | *b as usize),
            2 + n,
        )
    };
    let start = at + header;
    let end = start
        .checked_add(len)
        .filter(|e| *e <= der.len())
        .ok_or_else(short)?;
    Ok(Tlv {
        tag,
        whole: at..end,
        content: start..end,
    })
}

/// `sha256:<hex>` of a certificate's SubjectPublicKeyInfo, the pin kubeadm's
/// `caCertHashes` / `--discovery-token-ca-cert-hash` expects (RFC 7469 style).
pub fn spki_sha256(cert_der: &[u8]) -> Result<String, String> {
    const SEQUENCE: u8 = 0x30;
    let cert = tlv(cert_der, 0)?;
    if cert.tag != SEQUENCE {
        return Err("not a DER certificate (no outer SEQUENCE)".into());
    }
    let tbs = tlv(cert_der, cert.content.start)?;
    if tbs.tag != SEQUENCE {
        return Err("not a DER certificate (no tbsCertificate SEQUENCE)".into());
    }
    // tbsCertificate: [0] version (optional), serial, signature, issuer, validity, subject, SPKI.
    let mut at = tbs.content.start;
    let mut field = tlv(cert_der, at)?;
    if field.tag == 0xa0 {
        at = field.whole.end;
        field = tlv(cert_der, at)?;
    }
    for _ in 0..5 {
        at = field.whole.end;
        field = tlv(cert_der, at)?;
    }
    if field.tag != SEQUENCE || field.whole.end > tbs.content.end {
        return Err("no SubjectPublicKeyInfo where X.509 puts it".into());
    }
    Ok(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(&cert_der[field.whole]))
    ))
}

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
    y
}

/// The kubelet flags kubeadm must pass for the settings node.toml carries.
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
    if let Some(n) = node.max_pods {
        args.push(("max-pods".to_string(), n.to_string()));
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
