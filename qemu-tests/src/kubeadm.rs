//! The kubeadm side of the `kubeadm_join` scenario: the file that plays the cluster the
//! kubeadm double discovers. The double itself (`tools/standin-kubeadm`) is the image's
//! `/usr/bin/kubeadm`: the fixture mirror ships it as kubeadm, and kiln bakes it like every
//! pinned binary. The cluster files are test equipment, placed the way the cluster would
//! exist; none of them is part of kiln's layer.

use crate::guest::Root;
use crate::{io_err, Result};

/// The cluster's `kubelet-config` ConfigMap: kubeadm's defaults for a cluster (systemd cgroup
/// driver, webhook auth, the cluster CA as client CA, cluster DNS), as `kubeadm init` uploads
/// them.
pub const CLUSTER_KUBELET_CONFIG: &str = "\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
healthzBindAddress: 127.0.0.1
healthzPort: 10248
rotateCertificates: true
staticPodPath: /etc/kubernetes/manifests
";

/// The files kubeadm mode adds to the report unit's list ([`crate::scenario::REPORTED_FILES`]):
/// what `kubeadm join` wrote, kubelet's TLS bootstrap result and kiln-firstboot's patch.
pub const REPORTED_FILES: &[&str] = &[
    "/var/lib/kubelet/kubeadm-flags.env",
    "/var/lib/kubelet/config.yaml",
    "/etc/kubernetes/kubelet.conf",
    "/run/kiln/kubeadm-patches/kubeletconfiguration+strategic.json",
];

/// Places the stand-in cluster the baked kubeadm double discovers: the API server
/// [`crate::scenario::API_SERVER`] of the scenarios' node.toml, its CA (the one `kiln render` pinned), the
/// node.toml's bootstrap token, the kubelet-config above.
pub fn install(root: &Root) -> Result<()> {
    let ca = root.dir.join("etc/kiln/ca.crt");
    let ca_pem = std::fs::read(&ca).map_err(io_err(&ca))?;
    root.write("etc/kubernetes/standin-cluster/ca.crt", ca_pem, 0o644)?;
    root.write(
        "etc/kubernetes/standin-cluster/kubelet-config.yaml",
        CLUSTER_KUBELET_CONFIG,
        0o644,
    )?;
    root.write(
        "etc/kubernetes/standin-cluster.env",
        format!(
            "API_SERVER={}\n\
             CA_FILE=/etc/kubernetes/standin-cluster/ca.crt\n\
             TOKENS=07401b.f395accd246ae52d\n\
             KUBELET_CONFIG=/etc/kubernetes/standin-cluster/kubelet-config.yaml\n\
             PAUSE_IMAGE=registry.k8s.io/pause:3.10.2\n",
            crate::scenario::API_SERVER
        ),
        0o644,
    )?;
    Ok(())
}
