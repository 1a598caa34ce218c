//! kubelet's API client rules and its TLS bootstrap's files (kubernetes/kubernetes):
//!
//! - `cmd/kubelet/app/server.go` (`run`): no `--kubeconfig` means standalone mode
//!   (`"Standalone mode, no API client"`): kubelet never registers;
//! - `pkg/kubelet/certificate/bootstrap/bootstrap.go` (`LoadClientConfig`): without
//!   `--bootstrap-kubeconfig` the `--kubeconfig` file must load (`unable to load kubeconfig`);
//!   with it, a `--kubeconfig` whose client certificate is still there is used as is
//!   (`Current kubeconfig file contents are still valid, no bootstrap necessary`), otherwise
//!   kubelet bootstraps from the bootstrap kubeconfig and then writes `--kubeconfig`
//!   pointing at `<cert-dir>/kubelet-client-current.pem` (`writeKubeconfigFromBootstrapping`:
//!   cluster `default-cluster`, user `default-auth`, context `default-context`);
//! - `k8s.io/client-go/util/certificate/certificate_store.go`: the key pair lands in
//!   `kubelet-client-<2006-01-02-15-04-05>.pem` and `kubelet-client-current.pem` is a symlink
//!   to it. `--cert-dir` defaults to `/var/lib/kubelet/pki` (options.go `NewKubeletFlags`).

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// How kubelet reaches the API server.
#[derive(Debug, PartialEq, Eq)]
pub enum Client {
    /// No `--kubeconfig`: no API client, no registration.
    Standalone,
    /// `--kubeconfig` is usable as it is.
    Existing { server: String },
    /// TLS bootstrap from the bootstrap kubeconfig.
    Bootstrap(Cluster),
}

/// The cluster of a kubeconfig: where and how to reach the API server.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
pub struct Cluster {
    #[serde(default)]
    pub server: String,
    #[serde(rename = "certificate-authority")]
    pub certificate_authority: Option<String>,
    #[serde(rename = "certificate-authority-data")]
    pub certificate_authority_data: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Kubeconfig {
    #[serde(default)]
    clusters: Vec<NamedCluster>,
    #[serde(default)]
    users: Vec<NamedUser>,
}

#[derive(Debug, Deserialize)]
struct NamedCluster {
    cluster: Cluster,
}

#[derive(Debug, Deserialize)]
struct NamedUser {
    #[serde(default)]
    user: User,
}

#[derive(Debug, Default, Deserialize)]
struct User {
    #[serde(rename = "client-certificate")]
    client_certificate: Option<String>,
    #[serde(rename = "client-certificate-data")]
    client_certificate_data: Option<String>,
}

fn stat_error(path: &str) -> String {
    format!("stat {path}: no such file or directory")
}

fn read_kubeconfig(path: &str) -> Result<Kubeconfig, String> {
    let text = std::fs::read_to_string(path).map_err(|_| stat_error(path))?;
    serde_yaml_ng::from_str(&text).map_err(|e| format!("error loading config file {path:?}: {e}"))
}

/// `isClientConfigStillValid`: the file loads and its client certificate is there.
fn still_valid(path: &str) -> bool {
    read_kubeconfig(path).is_ok_and(|k| {
        k.users.iter().any(|u| {
            u.user.client_certificate_data.is_some()
                || u.user
                    .client_certificate
                    .as_deref()
                    .is_some_and(|c| Path::new(c).is_file())
        })
    })
}

/// Decides the client from `--kubeconfig` and `--bootstrap-kubeconfig`.
pub fn decide(kubeconfig: Option<&str>, bootstrap: Option<&str>) -> Result<Client, String> {
    let Some(kubeconfig) = kubeconfig.filter(|k| !k.is_empty()) else {
        return Ok(Client::Standalone);
    };
    let server_of = |k: Kubeconfig| {
        k.clusters
            .into_iter()
            .next()
            .map(|c| c.cluster)
            .unwrap_or_default()
    };
    match bootstrap.filter(|b| !b.is_empty()) {
        None => {
            let k = read_kubeconfig(kubeconfig)
                .map_err(|e| format!("unable to load kubeconfig: {e}"))?;
            Ok(Client::Existing {
                server: server_of(k).server,
            })
        }
        Some(_) if still_valid(kubeconfig) => {
            let k = read_kubeconfig(kubeconfig)
                .map_err(|e| format!("unable to load kubeconfig: {e}"))?;
            Ok(Client::Existing {
                server: server_of(k).server,
            })
        }
        Some(b) => {
            let k = read_kubeconfig(b)
                .map_err(|e| format!("unable to load bootstrap kubeconfig: {e}"))?;
            Ok(Client::Bootstrap(server_of(k)))
        }
    }
}

/// `2006-01-02-15-04-05` for now (UTC), the certificate store's file stamp.
fn stamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    let (y, m, d) = crate::klog::civil(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}-{:02}-{:02}-{:02}",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    )
}

/// Writes the client "certificate" (PEM-framed, saying it is not real) as the certificate
/// store does, then `--kubeconfig` pointing at it. Returns the current-pem path.
pub fn write_client(
    cert_dir: &Path,
    kubeconfig: &Path,
    cluster: &Cluster,
    pem: &str,
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(cert_dir)?;
    let dated = cert_dir.join(format!("kubelet-client-{}.pem", stamp()));
    crate::write_atomic(&dated, pem.as_bytes())?;
    let current = cert_dir.join("kubelet-client-current.pem");
    let updated = cert_dir.join("kubelet-client-current.pem.updated");
    let _ = std::fs::remove_file(&updated);
    let target = std::path::absolute(&dated)?;
    #[cfg(unix)]
    std::os::unix::fs::symlink(&target, &updated)?;
    #[cfg(not(unix))]
    std::fs::copy(&target, &updated).map(drop)?;
    std::fs::rename(&updated, &current)?;
    let current_abs = std::path::absolute(&current)?;
    let cp = current_abs.display();
    let mut ca = String::new();
    if let Some(f) = &cluster.certificate_authority {
        ca.push_str(&format!("    certificate-authority: {f}\n"));
    }
    if let Some(d) = &cluster.certificate_authority_data {
        ca.push_str(&format!("    certificate-authority-data: {d}\n"));
    }
    let text = format!(
        "apiVersion: v1\nclusters:\n- cluster:\n{ca}    server: {}\n  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n    namespace: default\n    user: default-auth\n  name: default-context\ncurrent-context: default-context\nkind: Config\npreferences: {{}}\nusers:\n- name: default-auth\n  user:\n    client-certificate: {cp}\n    client-key: {cp}\n",
        cluster.server
    );
    crate::write_atomic(kubeconfig, text.as_bytes())?;
    Ok(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("standin-boot-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn no_kubeconfig_is_standalone() {
        assert_eq!(decide(None, Some("/x")), Ok(Client::Standalone));
        assert_eq!(decide(Some(""), None), Ok(Client::Standalone));
    }

    #[test]
    fn a_missing_kubeconfig_without_bootstrap_is_fatal() {
        assert_eq!(
            decide(Some("/nonexistent/kubeconfig"), None),
            Err("unable to load kubeconfig: stat /nonexistent/kubeconfig: no such file or directory".into())
        );
        assert!(decide(Some("/nonexistent/k"), Some("/nonexistent/b"))
            .unwrap_err()
            .starts_with("unable to load bootstrap kubeconfig: stat /nonexistent/b"));
    }

    #[test]
    fn bootstrap_writes_the_dated_pem_the_symlink_and_the_kubeconfig() {
        let d = tmp("write");
        let boot = d.join("bootstrap.conf");
        std::fs::write(&boot, "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://api:6443\n    certificate-authority: /etc/kiln/ca.crt\nusers:\n- name: b\n  user:\n    token: abc.def\n").unwrap();
        let kc = d.join("kubeconfig");
        let (kcs, bs) = (kc.to_str().unwrap(), boot.to_str().unwrap());
        let Client::Bootstrap(cluster) = decide(Some(kcs), Some(bs)).unwrap() else {
            panic!("expected a bootstrap");
        };
        assert_eq!(cluster.server, "https://api:6443");
        let current = write_client(&d.join("pki"), &kc, &cluster, "PEM\n").unwrap();
        let link = std::fs::read_link(&current).unwrap();
        let name = link.file_name().unwrap().to_str().unwrap().to_string();
        assert!(
            name.starts_with("kubelet-client-2") && name.ends_with(".pem"),
            "{name}"
        );
        assert_eq!(name.len(), "kubelet-client-2006-01-02-15-04-05.pem".len());
        assert_eq!(std::fs::read_to_string(&current).unwrap(), "PEM\n");
        let text = std::fs::read_to_string(&kc).unwrap();
        assert!(text.contains("client-certificate: /"), "{text}");
        assert!(
            text.contains("certificate-authority: /etc/kiln/ca.crt"),
            "{text}"
        );
        // The next start finds the kubeconfig still valid: no second bootstrap.
        assert_eq!(
            decide(Some(kcs), Some(bs)),
            Ok(Client::Existing {
                server: "https://api:6443".into()
            })
        );
    }
}
