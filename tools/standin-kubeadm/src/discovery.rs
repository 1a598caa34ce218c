//! Token discovery (`cmd/kubeadm/app/discovery/token/token.go`): kubeadm fetches the
//! `cluster-info` ConfigMap from `apiServerEndpoint` without trusting it, checks its JWS
//! signature with the token's secret, and checks the CA in it against `caCertHashes`
//! (`cmd/kubeadm/app/util/pubkeypin`: SHA-256 of the certificate's SubjectPublicKeyInfo).
//!
//! There is no API server in kiln's tests. The cluster kubeadm would find is a file standing
//! in for it (`STANDIN_KUBEADM_CLUSTER`, default `/etc/kubernetes/standin-cluster.env`):
//! the endpoint it answers on, its CA, its valid bootstrap tokens, its `kubelet-config`
//! ConfigMap and its pause image. A missing file, or another endpoint, is an API server that
//! refuses connections, retried until `timeouts.discovery` as kubeadm does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use sha2::{Digest, Sha256};

/// The cluster the stand-in plays.
#[derive(Debug, Default, Clone)]
pub struct Cluster {
    pub api_server: String,
    pub ca_pem: String,
    pub tokens: Vec<String>,
    pub kubelet_config: String,
    pub pause_image: String,
}

/// Reads `KEY=VALUE` lines.
pub fn env_file(path: &Path) -> Option<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
            .collect(),
    )
}

impl Cluster {
    /// The cluster described by the file at `path`, or why it cannot be reached.
    pub fn read(path: &Path) -> Result<Cluster, String> {
        let env =
            env_file(path).ok_or_else(|| format!("no stand-in cluster at {}", path.display()))?;
        let get = |k: &str| env.get(k).cloned().unwrap_or_default();
        let read = |k: &str| -> Result<String, String> {
            let p = get(k);
            std::fs::read_to_string(&p).map_err(|e| format!("stand-in cluster {k}={p}: {e}"))
        };
        Ok(Cluster {
            api_server: get("API_SERVER"),
            ca_pem: read("CA_FILE")?,
            tokens: get("TOKENS")
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(String::from)
                .collect(),
            kubelet_config: read("KUBELET_CONFIG")?,
            pause_image: env
                .get("PAUSE_IMAGE")
                .cloned()
                .unwrap_or_else(|| "registry.k8s.io/pause:3.10".into()),
        })
    }
}

/// The DER bytes of the first certificate in `pem`.
pub fn pem_der(pem: &str) -> Result<Vec<u8>, String> {
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body.trim())
        .map_err(|e| format!("failed to parse certificate: {e}"))
}

/// One DER element at `at`: (tag, start of contents, end of contents).
fn element(der: &[u8], at: usize) -> Result<(u8, usize, usize), String> {
    let short = || "x509: malformed certificate".to_string();
    let tag = *der.get(at).ok_or_else(short)?;
    let first = *der.get(at + 1).ok_or_else(short)?;
    let (len, start) = if first < 0x80 {
        (first as usize, at + 2)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 {
            return Err(short());
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | *der.get(at + 2 + i).ok_or_else(short)? as usize;
        }
        (len, at + 2 + n)
    };
    let end = start
        .checked_add(len)
        .filter(|e| *e <= der.len())
        .ok_or_else(short)?;
    Ok((tag, start, end))
}

/// `sha256:<hex>` of the certificate's SubjectPublicKeyInfo, as `pubkeypin.Hash`.
pub fn spki_pin(der: &[u8]) -> Result<String, String> {
    let (_, cert, _) = element(der, 0)?;
    let (_, tbs, _) = element(der, cert)?;
    let mut at = tbs;
    // [0] version is optional; then serial, signature, issuer, validity, subject.
    let (tag, _, end) = element(der, at)?;
    if tag == 0xa0 {
        at = end;
    }
    for _ in 0..5 {
        at = element(der, at)?.2;
    }
    let (_, _, end) = element(der, at)?;
    let digest = Sha256::digest(&der[at..end]);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("sha256:{hex}"))
}

/// `constants.DiscoveryRetryInterval`.
const RETRY: Duration = Duration::from_secs(5);

/// Token discovery (`discovery/token/token.go`, `getClusterInfo`: `wait.PollUntilContextTimeout`
/// every [`RETRY`] until `timeouts.discovery`). While the API server cannot be reached, or its
/// cluster-info has no JWS signature for the token's ID yet (the token may still be being
/// created), kubeadm retries, logging only at `--v=1`, and on the timeout fails with the last
/// error. A signature that does not verify and a CA that matches no pin fail at once
/// ([`verify`]).
pub fn discover(bt: &crate::config::BootstrapToken, timeout: Duration) -> Result<Cluster, String> {
    let path = PathBuf::from(
        std::env::var("STANDIN_KUBEADM_CLUSTER")
            .unwrap_or_else(|_| "/etc/kubernetes/standin-cluster.env".into()),
    );
    let until = Instant::now() + timeout;
    let url = format!(
        "https://{}/api/v1/namespaces/kube-public/configmaps/cluster-info?timeout=10s",
        bt.api_server_endpoint
    );
    let id = bt.token.split('.').next().unwrap_or_default();
    loop {
        let reached = Cluster::read(&path)
            .ok()
            .filter(|c| c.api_server == bt.api_server_endpoint);
        let last = match reached {
            Some(cluster) if signed_for(&cluster, id) => {
                verify(
                    &cluster,
                    &bt.token,
                    &bt.ca_cert_hashes,
                    bt.unsafe_skip_ca_verification,
                )?;
                return Ok(cluster);
            }
            Some(_) => format!(
                "could not find a JWS signature in the cluster-info ConfigMap for token ID {id:?}"
            ),
            None => format!(
                "failed to request the cluster-info ConfigMap: Get {url:?}: dial tcp {}: connect: connection refused",
                bt.api_server_endpoint
            ),
        };
        if Instant::now() >= until {
            return Err(format!(
                "couldn't validate the identity of the API Server: {last}"
            ));
        }
        std::thread::sleep(RETRY.min(until.saturating_duration_since(Instant::now())));
    }
}

/// cluster-info carries a `jws-kubeconfig-<id>` signature for one of the cluster's tokens.
fn signed_for(cluster: &Cluster, id: &str) -> bool {
    cluster
        .tokens
        .iter()
        .any(|t| t.split('.').next() == Some(id))
}

/// Discovery against the stand-in cluster: the token must be one the cluster holds (its JWS
/// signature on cluster-info) and the CA must match a pin, with kubeadm's wording.
pub fn verify(
    cluster: &Cluster,
    token: &str,
    pins: &[String],
    skip_ca: bool,
) -> Result<(), String> {
    let id = token.split('.').next().unwrap_or_default();
    if !cluster
        .tokens
        .iter()
        .any(|t| t.split('.').next() == Some(id))
    {
        return Err(format!(
            "couldn't validate the identity of the API Server: could not find a JWS signature in the cluster-info ConfigMap for token ID {id:?}"
        ));
    }
    if !cluster.tokens.iter().any(|t| t == token) {
        return Err("couldn't validate the identity of the API Server: failed to verify JWS signature of received cluster info object, can't trust this API Server".to_string());
    }
    if skip_ca {
        return Ok(());
    }
    let pin = spki_pin(&pem_der(&cluster.ca_pem)?)?;
    let wanted: Vec<String> = pins.iter().map(|p| p.to_ascii_lowercase()).collect();
    if !wanted.contains(&pin) {
        return Err(format!(
            "couldn't validate the identity of the API Server: cluster CA found in cluster-info ConfigMap is invalid: none of the public keys \"{pin}\" are pinned"
        ));
    }
    Ok(())
}
