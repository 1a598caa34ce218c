//! The node's credentials: the bootstrap credential the provisioner placed, the client
//! certificate kubelet got for it and, when the cluster signs it, kubelet's serving certificate. Secret values are never printed: only their shape,
//! dates and names.

use super::model::{Check, Node};
use super::net::{dates, remaining};
use super::x509::{self, format_time};
use crate::contract::{node_env, paths};

/// The certificate in a kubeconfig's `client-certificate-data`, if it has one.
fn kubeconfig_cert(text: &str) -> Option<Result<x509::Cert, String>> {
    let b64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("client-certificate-data:"))?;
    let der_pem = x509::base64(b64.trim().trim_matches(['"', '\'']))
        .map_err(|e| format!("client-certificate-data: {e}"));
    Some(
        der_pem.and_then(|pem| {
            x509::pem_certs(&String::from_utf8_lossy(&pem)).map(|mut v| v.remove(0))
        }),
    )
}

/// The bootstrap credential: a token's expiry lives in the cluster
/// (kube-system/bootstrap-token-ID's `expiration`, kubeadm's default TTL 24 h:
/// cmd/kubeadm/app/constants DefaultTokenDuration), so the node can only tell its shape; a
/// client certificate in the bootstrap kubeconfig has dates the node can read.
pub fn bootstrap_credential(node: &Node) -> Check {
    const NAME: &str = "bootstrap-credential";
    let joined =
        node.at(paths::KUBELET_KUBECONFIG).is_file() || node.paths.kubeadm_kubelet_conf.is_file();
    if let Some(text) = node.read(paths::BOOTSTRAP_KUBECONFIG) {
        return match kubeconfig_cert(&text) {
            Some(Ok(c)) => match dates(&c, node.now) {
                Some(bad) if !joined => Check::fail(
                    NAME,
                    format!(
                        "{}: the client certificate {bad}",
                        paths::BOOTSTRAP_KUBECONFIG
                    ),
                    "render a new bootstrap kubeconfig (kiln render) with a valid credential",
                ),
                Some(bad) => Check::warn(
                    NAME,
                    format!(
                        "{}: the client certificate {bad}; kubelet already has its own credential",
                        paths::BOOTSTRAP_KUBECONFIG
                    ),
                    "remove the expired bootstrap credential from the node config",
                ),
                None => Check::ok(
                    NAME,
                    format!(
                        "{}: client certificate for {} valid until {}",
                        paths::BOOTSTRAP_KUBECONFIG,
                        c.subject_cn,
                        format_time(c.not_after)
                    ),
                ),
            },
            Some(Err(e)) => Check::fail(
                NAME,
                format!("{}: {e}", paths::BOOTSTRAP_KUBECONFIG),
                "render the bootstrap kubeconfig again (kiln render)",
            ),
            None if text.lines().any(|l| l.trim_start().starts_with("token:")) => Check::ok(
                NAME,
                format!(
                    "{}: a token; its expiry is kept by the cluster, not the node",
                    paths::BOOTSTRAP_KUBECONFIG
                ),
            ),
            None => Check::warn(
                NAME,
                format!(
                    "{}: neither a token nor a client certificate",
                    paths::BOOTSTRAP_KUBECONFIG
                ),
                "check the kubeconfig's users: entry",
            ),
        };
    }
    if let Some(t) = node.read(paths::BOOTSTRAP_TOKEN) {
        return if crate::redact::valid_token(t.trim()) {
            Check::ok(NAME, format!("{}: a well-formed token; its expiry is kept by the cluster (kubeadm token list)", paths::BOOTSTRAP_TOKEN))
        } else {
            Check::fail(
                NAME,
                format!(
                    "{}: not a bootstrap token of the form [a-z0-9]{{6}}.[a-z0-9]{{16}}",
                    paths::BOOTSTRAP_TOKEN
                ),
                "create one with kubeadm token create and render the node config again",
            )
        };
    }
    if node.paths.kubeadm_join.is_file() {
        return Check::ok(
            NAME,
            format!(
                "{}: kubeadm join configuration (its token's expiry is kept by the cluster)",
                paths::KUBEADM_JOIN
            ),
        );
    }
    if joined {
        Check::ok(
            NAME,
            "no bootstrap credential left; kubelet has its own kubeconfig",
        )
    } else {
        Check::fail(
            NAME,
            format!("none of {}, {}, {} exists", paths::BOOTSTRAP_KUBECONFIG, paths::BOOTSTRAP_TOKEN, paths::KUBEADM_JOIN),
            "the provisioning payload did not place a credential: check kiln render's output and the user data",
        )
    }
}

/// kubelet's client certificate: valid now, and rotated in time. kubelet's certificate
/// manager rotates at a random point between 70% and 90% of the lifetime
/// (k8s.io/client-go/util/certificate/certificate_manager.go, nextRotationDeadline), so one
/// past 90% means rotation is not happening.
pub fn kubelet_client(node: &Node) -> Check {
    const NAME: &str = "kubelet-client-cert";
    let rel = format!("{}/kubelet-client-current.pem", paths::KUBELET_PKI_DIR);
    let cert = match current_cert(
        node,
        NAME,
        &rel,
        &format!("remove {rel} and restart kubelet to bootstrap again"),
        "fix the clock if it is wrong; otherwise remove the expired certificate and restart kubelet with a valid bootstrap credential",
    ) {
        Ok(Some(c)) => c,
        Ok(None) => {
            return Check::skip(
                NAME,
                format!("{rel} does not exist yet (kubelet has not bootstrapped)"),
            )
        }
        Err(failed) => return failed,
    };
    if let Some(ca) = node
        .read(paths::CA_CRT)
        .and_then(|t| x509::pem_certs(&t).ok())
    {
        if !ca.iter().any(|c| cert.issued_by(c)) {
            return Check::warn(
                NAME,
                format!("{rel}: {} is not issued by a CA in {}", cert.subject_cn, paths::CA_CRT),
                "a cluster with a separate client-signing CA is fine; otherwise this certificate is from another cluster",
            );
        }
    }
    let life = (cert.not_after - cert.not_before).max(1);
    let used = node.now - cert.not_before;
    let left = remaining(&cert, node.now);
    let text = format!(
        "{rel}: {} valid until {} ({} h left)",
        cert.subject_cn,
        format_time(cert.not_after),
        left.as_secs() / 3600
    );
    if used * 10 > life * 9 {
        Check::warn(NAME, text, "rotation is late: check rotateCertificates in the kubelet config and that the cluster approves kubelet CSRs")
    } else {
        Check::ok(NAME, text)
    }
}

/// kubelet's serving certificate when node.env asks the cluster to sign it
/// (`KUBELET_SERVER_TLS_BOOTSTRAP=true`, kubelet's `serverTLSBootstrap`). kubelet then sends a
/// `kubernetes.io/kubelet-serving` CSR and serves nothing on port 10250 until it is approved;
/// its certificate manager keeps the issued pair as `kubelet-server-current.pem`
/// (pkg/kubelet/certificate/kubelet.go, `NewKubeletServerCertificateManager`: a file store
/// named `kubelet-server` in kubelet's certificate directory). Nothing in a plain cluster
/// approves that CSR, so a pending one is the finding.
pub fn kubelet_serving(node: &Node) -> Check {
    const NAME: &str = "kubelet-serving-cert";
    if node.node(node_env::KUBELET_SERVER_TLS_BOOTSTRAP) != Some("true") {
        return Check::skip(NAME, "KUBELET_SERVER_TLS_BOOTSTRAP is not true");
    }
    let client = format!("{}/kubelet-client-current.pem", paths::KUBELET_PKI_DIR);
    if !node.at(&client).exists() {
        return Check::skip(NAME, "kubelet has not joined yet");
    }
    let rel = format!("{}/kubelet-server-current.pem", paths::KUBELET_PKI_DIR);
    let cert = match current_cert(
        node,
        NAME,
        &rel,
        &format!("remove {rel} and restart kubelet"),
        "fix the clock, or approve kubelet-serving CSRs again",
    ) {
        Ok(Some(c)) => c,
        Ok(None) => {
            return Check::warn(
                NAME,
                format!("{rel} does not exist: the kubelet-serving CSR is not approved, so kubectl logs and exec fail"),
                "kubectl certificate approve it, or run an approver",
            )
        }
        Err(failed) => return failed,
    };
    Check::ok(
        NAME,
        format!(
            "{rel}: {} valid until {}",
            cert.subject_cn,
            format_time(cert.not_after)
        ),
    )
}

/// The first certificate of kubelet's PEM file `rel`, within its dates: `Ok(None)` when the
/// file does not exist, and the failed check `name` when it cannot be read or parsed (with
/// `remedy`) or is out of its dates (with `expired`).
fn current_cert(
    node: &Node,
    name: &'static str,
    rel: &str,
    remedy: &str,
    expired: &str,
) -> Result<Option<x509::Cert>, Check> {
    let text = match node.read_checked(rel) {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(None),
        Err(e) => return Err(Check::fail(name, e, remedy)),
    };
    let cert = x509::pem_certs(&text)
        .map(|mut v| v.remove(0))
        .map_err(|e| Check::fail(name, format!("{rel}: {e}"), remedy))?;
    if let Some(bad) = dates(&cert, node.now) {
        return Err(Check::fail(
            name,
            format!("{rel}: {} {bad}", cert.subject_cn),
            expired,
        ));
    }
    Ok(Some(cert))
}
