//! Renders the small text files of a layer from an image definition: `image.env`,
//! `max-pods.map`, the kubelet config, sysctl.d, modules-load.d, containerd's config and
//! `hosts.toml` files, the sysext release file and the sysupdate transfer file.
//! Pure functions: same definition, same bytes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kiln_firstboot::contract::{self, image_env, paths, EnvFile};

use crate::image_def::{Arch, CgroupDriver, ImageDef, Os};

use crate::bake::containerd::containerd_major;
pub use crate::bake::containerd::{
    certs_dir_name, containerd_config, containerd_config_windows, containerd_env_windows,
    hosts_toml, CERTS_DIR, NODE_CONF_D, PROVISIONED_CERTS_DIR, WINDOWS_CNI_BIN_DIR,
    WINDOWS_CNI_CONF_DIR, WINDOWS_CONTAINERD_DIR, WINDOWS_PROVISIONED_CERTS_DIR,
};

/// `image.env` (contract: `/usr/lib/kiln/image.env`), written through the contract's env-file
/// codec so every value is quoted as the contract says. `versions` maps env keys such as
/// `CONTAINERD_VERSION` to artifact versions.
pub fn image_env(
    def: &ImageDef,
    arch: Arch,
    image_id: &str,
    versions: &BTreeMap<String, String>,
) -> String {
    let (kubelet_config, endpoint) = match def.os {
        Os::Linux => (
            paths::DEFAULT_KUBELET_CONFIG.to_string(),
            image_env::DEFAULT_RUNTIME_ENDPOINT,
        ),
        Os::Windows => (
            format!("C:/{}", paths::windows_place(paths::DEFAULT_KUBELET_CONFIG)),
            WINDOWS_RUNTIME_ENDPOINT,
        ),
    };
    let mut env = EnvFile::default();
    env.comment("Written by kiln bake; see docs/contract.md. Do not edit.")
        .set(contract::KILN_CONTRACT, contract::VERSION_TEXT)
        .set(image_env::KILN_IMAGE_ID, image_id)
        .set(image_env::KILN_IMAGE_NAME, def.name.as_str())
        .set(image_env::KILN_VERSION, env!("CARGO_PKG_VERSION"))
        .set(image_env::KILN_OS, def.os.as_str())
        .set(image_env::KILN_ARCH, arch.as_str())
        .set(
            image_env::KUBERNETES_VERSION,
            def.kubernetes.version.as_str(),
        );
    for (k, v) in versions {
        if k != image_env::KUBERNETES_VERSION {
            env.set(k, v.as_str());
        }
    }
    // The config version node.toml's [containerd.config] must declare (checked on the node).
    if def.os == Os::Linux {
        let containerd = versions
            .get(image_env::CONTAINERD_VERSION)
            .map(String::as_str);
        let version = if containerd_major(containerd) >= 2 {
            "3"
        } else {
            "2"
        };
        env.set(image_env::CONTAINERD_CONFIG_VERSION, version);
        // Where lock entries for credential providers place their binaries
        // (`libexec/kiln/credential-providers/<name>` under /usr).
        env.set(
            image_env::CREDENTIAL_PROVIDER_BIN_DIR,
            paths::DEFAULT_CREDENTIAL_PROVIDER_BIN_DIR,
        );
    }
    env.set(image_env::KUBELET_UNIT, image_env::DEFAULT_KUBELET_UNIT)
        .set(
            image_env::CONTAINERD_UNIT,
            image_env::DEFAULT_CONTAINERD_UNIT,
        )
        .set(image_env::KUBELET_CONFIG, kubelet_config)
        .set(image_env::CONTAINER_RUNTIME_ENDPOINT, endpoint)
        .set(
            image_env::DEFAULT_MAX_PODS,
            def.kubernetes.default_max_pods.to_string(),
        );
    for (k, v) in def.sizing.image_env_entries(def.os == Os::Windows) {
        env.set(k, v);
    }
    env.set(
        image_env::KILN_DEADLINE,
        def.kubernetes.deadline.to_string(),
    );
    env.to_string()
}

/// containerd's named pipe on Windows, the CRI endpoint kubelet there talks to.
pub const WINDOWS_RUNTIME_ENDPOINT: &str = "npipe:////./pipe/containerd-containerd";

/// `max-pods.map`: `instance-type pods`, sorted by instance type.
pub fn max_pods_map(def: &ImageDef) -> String {
    let mut s = String::from("# instance-type pods\n");
    for (t, n) in &def.max_pods {
        let _ = writeln!(s, "{t} {n}");
    }
    s
}

/// The default `KubeletConfiguration`. Node-specific values (cluster DNS, node IP, max pods)
/// are flags that kiln-firstboot adds; this file holds what is decided at build time.
///
/// `serverTLSBootstrap` is left to kubelet's default (false: kubelet signs its own serving
/// certificate), as kubeadm's cluster configuration leaves it: nothing in a plain cluster
/// approves `kubernetes.io/kubelet-serving` CSRs, so with it on, port 10250 would serve no
/// certificate until someone did. node.toml's `[kubelet] server_tls_bootstrap = true` turns it
/// on at provisioning time, in either join mode (docs/contract.md, "Serving certificate").
pub fn kubelet_config(def: &ImageDef) -> String {
    // Windows has no cgroups: kubelet there takes no cgroup driver.
    let driver = match (def.os, def.kubernetes.cgroup_driver) {
        (Os::Windows, _) => "",
        (_, CgroupDriver::Systemd) => "cgroupDriver: systemd\n",
        (_, CgroupDriver::Cgroupfs) => "cgroupDriver: cgroupfs\n",
    };
    let (ca, endpoint) = match def.os {
        Os::Linux => ("/etc/kiln/ca.crt", "unix:///run/containerd/containerd.sock"),
        Os::Windows => ("C:/ProgramData/kiln/ca.crt", WINDOWS_RUNTIME_ENDPOINT),
    };
    format!(
        "\
# Written by kiln bake; /etc/kiln/kubelet-config.yaml replaces it, the drop-ins of
# /run/kiln/kubelet.conf.d merge over it (docs/contract.md).
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
{driver}clusterDomain: {domain}
containerRuntimeEndpoint: {endpoint}
rotateCertificates: true
readOnlyPort: 0
",
        domain = def.kubernetes.cluster_domain,
    )
}

/// `/usr/lib/sysctl.d/90-kiln.conf`, sorted by key.
pub fn sysctl_conf(def: &ImageDef) -> String {
    let mut s = String::from("# Written by kiln bake from the image definition's [sysctl].\n");
    for (k, v) in &def.sysctl {
        let _ = writeln!(s, "{k} = {v}");
    }
    s
}

/// `/usr/lib/modules-load.d/kiln.conf`, in definition order.
pub fn modules_conf(def: &ImageDef) -> String {
    let mut s = String::from("# Written by kiln bake from the image definition's modules.\n");
    for m in &def.modules {
        let _ = writeln!(s, "{m}");
    }
    s
}

/// `extension-release.<name>` for a sysext.
pub fn extension_release(def: &ImageDef, arch: Arch) -> Option<String> {
    let sx = def.sysext.as_ref()?;
    let mut s = format!("ID={}\n", sx.id);
    if let Some(l) = &sx.sysext_level {
        let _ = writeln!(s, "SYSEXT_LEVEL={l}");
    }
    if let Some(v) = &sx.version_id {
        let _ = writeln!(s, "VERSION_ID={v}");
    }
    let _ = writeln!(s, "ARCHITECTURE={}", arch.systemd_name());
    let _ = writeln!(s, "EXTENSION_RELOAD_MANAGER=1");
    Some(s)
}

/// The file name of a sysext image: `<name>-<kubernetes version>-<systemd arch>.raw`, the
/// pattern the sysupdate transfer file matches with `@v`.
pub fn sysext_file_name(def: &ImageDef, arch: Arch) -> Option<String> {
    let sx = def.sysext.as_ref()?;
    Some(format!(
        "{}-{}-{}.raw",
        sx.name,
        def.kubernetes.version,
        arch.systemd_name()
    ))
}

/// The systemd-sysupdate transfer file (`/etc/sysupdate.<name>.d/<name>.conf` on the node).
/// `verify`: `SHA256SUMS.gpg` is published beside `SHA256SUMS`, so nodes check it.
pub fn sysupdate_transfer(def: &ImageDef, arch: Arch, verify: bool) -> Option<String> {
    let sx = def.sysext.as_ref()?;
    let minor: String = {
        let v = def.kubernetes.version.as_str();
        let parts: Vec<&str> = v.split('.').collect();
        if parts.len() >= 2 {
            format!("{}.{}.", parts[0], parts[1])
        } else {
            String::new()
        }
    };
    Some(format!(
        "\
# Written by kiln bake. Updates {name} within Kubernetes {minor}x from {url}
# (SHA256SUMS there lists the images; see docs/bake.md).
{why}
[Transfer]
Verify={verify}

[Source]
Type=url-file
Path={url}
MatchPattern={name}-{minor}@v-{arch}.raw

[Target]
InstancesMax=3
Type=regular-file
Path=/opt/extensions/{name}
CurrentSymlink=/etc/extensions/{name}.raw
",
        name = sx.name,
        url = sx.update_url,
        arch = arch.systemd_name(),
        verify = verify,
        why = if verify {
            "# SHA256SUMS.gpg signs SHA256SUMS: nodes need the signer's public key in\n\
             # /etc/systemd/import-pubring.gpg."
        } else {
            "# Verify=false: SHA256SUMS is not signed (kiln bake --sign-key signs it); nodes\n\
             # trust whatever the update URL serves."
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn def(extra: &str) -> ImageDef {
        let text = format!(
            "name = \"t\"\nos = \"linux\"\narch = [\"amd64\"]\nformats = [\"sysext\"]\n\
             [kubernetes]\nversion = \"v1.34.2\"\n[[artifact]]\nname = \"kubelet\"\n\
             [sysext]\nname = \"kubernetes\"\nid = \"flatcar\"\nsysext_level = \"1.0\"\n\
             update_url = \"https://example.com/ext/\"\n{extra}"
        );
        ImageDef::parse(&text, Path::new("t.toml")).unwrap()
    }

    #[test]
    fn containerd_config_follows_the_containerd_major_version() {
        let d = def("");
        let cases: &[(Option<&str>, &str, &str)] = &[
            (
                Some("1.6.20"),
                "version = 2",
                "sandbox_image = 'registry.k8s.io/pause:3.10'",
            ),
            (Some("v1.7.24"), "version = 2", "SystemdCgroup = true"),
            (
                Some("2.1.5"),
                "version = 3",
                "sandbox = 'registry.k8s.io/pause:3.10'",
            ),
            (None, "version = 3", "bin_dirs = ['/usr/libexec/cni']"),
            (Some("2.0.7"), "version = 3", "bin_dir = '/usr/libexec/cni'"),
            (
                Some("2.1.4"),
                "version = 3",
                "bin_dirs = ['/usr/libexec/cni']",
            ),
        ];
        for (ver, a, b) in cases {
            let c = containerd_config(&d, *ver, &d.containerd.sandbox_image);
            assert!(c.contains(a) && c.contains(b), "{ver:?}:\n{c}");
            let v = toml::from_str::<toml::Value>(&c).unwrap();
            // The node's registries first, then the image's; on 2.x the pull that reads both.
            let (images, local) = if a.ends_with('3') {
                (&v["plugins"]["io.containerd.cri.v1.images"], Some(true))
            } else {
                (&v["plugins"]["io.containerd.grpc.v1.cri"], None)
            };
            assert_eq!(
                images["registry"]["config_path"].as_str(),
                Some("/etc/kiln/containerd/certs.d:/usr/lib/kiln/containerd/certs.d")
            );
            assert_eq!(
                images
                    .get("use_local_image_pull")
                    .and_then(toml::Value::as_bool),
                local
            );
        }
    }

    #[test]
    fn hosts_toml_lists_mirrors_then_server_with_cas() {
        let d = def(
            "[[containerd.registry]]\nhost = \"docker.io\"\nmirrors = [\"https://m1.example\", \"http://m2.example:5000\"]\n",
        );
        let r = &d.containerd.registries[0];
        let t = hosts_toml(
            r,
            &["/usr/lib/kiln/containerd/certs.d/docker.io/ca-0.crt".into()],
        );
        let v: toml::Value = toml::from_str(&t).unwrap();
        assert_eq!(v["server"].as_str(), Some("https://registry-1.docker.io"));
        let hosts = v["host"].as_table().unwrap();
        assert!(hosts.contains_key("https://m1.example"));
        assert!(hosts.contains_key("http://m2.example:5000"));
        assert_eq!(
            hosts["https://m1.example"]["ca"][0].as_str(),
            Some("/usr/lib/kiln/containerd/certs.d/docker.io/ca-0.crt")
        );
        assert!(t.find("m1.example").unwrap() < t.find("m2.example").unwrap());
    }

    #[test]
    fn sysext_release_and_transfer() {
        let d = def("");
        let r = extension_release(&d, Arch::Arm64).unwrap();
        assert_eq!(
            r,
            "ID=flatcar\nSYSEXT_LEVEL=1.0\nARCHITECTURE=arm64\nEXTENSION_RELOAD_MANAGER=1\n"
        );
        assert_eq!(
            sysext_file_name(&d, Arch::Amd64).unwrap(),
            "kubernetes-v1.34.2-x86-64.raw"
        );
        let t = sysupdate_transfer(&d, Arch::Amd64, false).unwrap();
        assert!(t.contains("\nVerify=false\n"), "{t}");
        let signed = sysupdate_transfer(&d, Arch::Amd64, true).unwrap();
        assert!(signed.contains("\nVerify=true\n"), "{signed}");
        assert!(
            signed.contains("/etc/systemd/import-pubring.gpg"),
            "{signed}"
        );
        assert!(
            t.contains("MatchPattern=kubernetes-v1.34.@v-x86-64.raw"),
            "{t}"
        );
        assert!(t.contains("Path=https://example.com/ext/"), "{t}");
    }
}
