//! `kubeadm join` (the double) end to end against a node in a temporary directory
//! (`STANDIN_KUBEADM_ROOT`), a recording `systemctl` (`STANDIN_KUBEADM_SYSTEMCTL`), the
//! stand-in cluster file (`STANDIN_KUBEADM_CLUSTER`) with a CA openssl made, and a kubelet
//! `/healthz` on a loopback port. Each rule of README.md's table that is not a config-decoding
//! rule (those are in src/config/tests.rs) is refused here once, with kubeadm's wording.

#![cfg(unix)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const TOKEN: &str = "07401b.f395accd246ae52d";
const PATCH: &str = "{\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"kind\":\"KubeletConfiguration\",\"maxPods\":29,\"providerID\":\"aws:///eu-west-1a/i-0abc\"}\n";

/// A node under a temporary root, and the cluster the double discovers.
struct Node {
    root: PathBuf,
    /// The CRI socket: listening, as containerd's would be.
    cri: Option<UnixListener>,
    /// openssl's pin of the cluster CA.
    pin: String,
    /// The kubelet's healthz port (answered by [`Node::serve_healthz`]).
    healthz_port: u16,
}

static N: AtomicUsize = AtomicUsize::new(0);

fn sh(script: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(script).output().unwrap();
    assert!(out.status.success(), "{script}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `sha256:<hex>` of the certificate's SubjectPublicKeyInfo, computed by openssl.
fn openssl_pin(cert: &Path) -> String {
    let hex = sh(&format!(
        "openssl x509 -pubkey -noout -in '{}' | openssl pkey -pubin -outform der | sha256sum",
        cert.display()
    ));
    format!("sha256:{}", &hex[..64])
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Node {
    /// A node ready to join: empty manifests, no kubelet files, ip_forward on, containerd's
    /// socket listening; a cluster at 10.0.0.10:6443 with an RSA (`key = "rsa:2048"`) or EC CA.
    fn new(key: &str) -> Node {
        let root = std::env::temp_dir().join(format!(
            "standin-kubeadm-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&root);
        for d in [
            "etc/kubernetes/manifests",
            "proc/sys/kernel",
            "proc/sys/net/ipv4",
            "run/containerd",
            "cluster",
            "patches",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("proc/sys/kernel/hostname"), "w1\n").unwrap();
        std::fs::write(root.join("proc/sys/net/ipv4/ip_forward"), "1\n").unwrap();
        let cri = UnixListener::bind(root.join("run/containerd/containerd.sock")).unwrap();
        let ca = root.join("cluster/ca.crt");
        let newkey = if key == "ec" {
            "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1".to_string()
        } else {
            format!("-newkey {key}")
        };
        sh(&format!(
            "openssl req -x509 {newkey} -nodes -days 2 -subj /CN=kubernetes -keyout '{}' -out '{}' 2>/dev/null",
            root.join("cluster/ca.key").display(),
            ca.display()
        ));
        let pin = openssl_pin(&ca);
        let healthz_port = free_port();
        let node = Node {
            root,
            cri: Some(cri),
            pin,
            healthz_port,
        };
        node.cluster("10.0.0.10:6443", TOKEN);
        node.write(
            "cluster/kubelet-config.yaml",
            &format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\nmaxPods: 110\nhealthzBindAddress: 127.0.0.1\nhealthzPort: {healthz_port}\n"
            ),
        );
        node.write("patches/kubeletconfiguration+strategic.json", PATCH);
        // Records every call; `restart kubelet` plays a kubelet that TLS-bootstraps when
        // `kubelet-bootstraps` exists: it reads the bootstrap kubeconfig and writes
        // kubelet.conf, as kubelet's bootstrap.go does.
        let r = node.root.display().to_string();
        node.write(
            "systemctl",
            &format!(
                "#!/bin/sh\necho \"$*\" >> '{r}/systemctl.calls'\n\
                 if [ \"$*\" = 'restart kubelet' ] && [ -e '{r}/kubelet-bootstraps' ]; then\n\
                 cp '{r}/etc/kubernetes/bootstrap-kubelet.conf' '{r}/bootstrap-seen' || exit 1\n\
                 printf 'apiVersion: v1\\nkind: Config\\nusers:\\n- name: default-auth\\n  user:\\n    client-certificate-data: AA==\\n' > '{r}/etc/kubernetes/kubelet.conf'\n\
                 fi\n"
            ),
        );
        sh(&format!("chmod 755 '{r}/systemctl'"));
        node
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn write(&self, rel: &str, text: &str) {
        std::fs::write(self.path(rel), text).unwrap();
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_default()
    }

    /// The stand-in cluster file: where the API server answers and its valid tokens.
    fn cluster(&self, api_server: &str, tokens: &str) {
        self.write(
            "cluster.env",
            &format!(
                "API_SERVER={api_server}\nCA_FILE={}\nTOKENS={tokens}\nKUBELET_CONFIG={}\nPAUSE_IMAGE=registry.k8s.io/pause:3.10\n",
                self.path("cluster/ca.crt").display(),
                self.path("cluster/kubelet-config.yaml").display()
            ),
        );
    }

    /// kiln's JoinConfiguration (builder/src/render/kubeadm.rs) with short v1beta4 timeouts.
    fn join_config(&self, pin: &str, extra: &str) {
        self.write(
            "kubeadm-join.yaml",
            &format!(
                "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n    apiServerEndpoint: \"10.0.0.10:6443\"\n    token: \"{TOKEN}\"\n    caCertHashes:\n      - \"{pin}\"\n  tlsBootstrapToken: \"{TOKEN}\"\nnodeRegistration:\n  name: \"w1\"\n  criSocket: \"unix:///run/containerd/containerd.sock\"\n  taints: []\n  kubeletExtraArgs:\n    - name: \"node-labels\"\n      value: \"tier=web\"\npatches:\n  directory: \"/patches\"\ntimeouts:\n  kubeletHealthCheck: 3s\n  tlsBootstrap: 3s\n  discovery: 7s\n{extra}"
            ),
        );
    }

    /// Answers `GET /healthz` with 200 on the kubelet's healthz port, as kubelet does, for as
    /// long as the test runs (each test is its own process under nextest).
    fn serve_healthz(&self) {
        let l = TcpListener::bind(("127.0.0.1", self.healthz_port)).unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                // Read the whole request first: closing on unread bytes would reset the
                // connection before the client reads the answer.
                let mut req = Vec::new();
                let mut buf = [0u8; 512];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                );
            }
        });
    }

    fn kubeadm(&self, args: &[&str]) -> (Output, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_kubeadm"))
            .args(args)
            .env("STANDIN_KUBEADM_ROOT", &self.root)
            .env("STANDIN_KUBEADM_SYSTEMCTL", self.path("systemctl"))
            .env("STANDIN_KUBEADM_CLUSTER", self.path("cluster.env"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out, stdout, stderr)
    }

    fn join(&self, extra: &[&str]) -> (Output, String, String) {
        let config = self.path("kubeadm-join.yaml").display().to_string();
        let mut args = vec!["join", "--config", &config];
        args.extend_from_slice(extra);
        self.kubeadm(&args)
    }

    fn calls(&self) -> Vec<String> {
        self.read("systemctl.calls")
            .lines()
            .map(String::from)
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[test]
fn a_worker_joins_in_kubeadms_order_and_with_its_files() {
    let node = Node::new("rsa:2048");
    node.join_config(&node.pin, "");
    node.write("kubelet-bootstraps", "");
    node.serve_healthz();
    let (out, stdout, stderr) = node.join(&[]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // TryStopKubelet, then daemon-reload and restart once the files are written.
    assert_eq!(
        node.calls(),
        ["stop kubelet", "daemon-reload", "restart kubelet"]
    );
    // The bootstrap kubeconfig was there for kubelet, with the token; deleted afterwards.
    let seen = node.read("bootstrap-seen");
    assert!(
        seen.contains("server: https://10.0.0.10:6443")
            && seen.contains("name: tls-bootstrap-token-user")
            && seen.contains(&format!("token: {TOKEN}")),
        "{seen}"
    );
    assert!(!node.path("etc/kubernetes/bootstrap-kubelet.conf").exists());
    assert_eq!(
        node.read("etc/kubernetes/pki/ca.crt"),
        node.read("cluster/ca.crt")
    );
    // The cluster's kubelet-config with kiln's patch over it.
    let config = node.read("var/lib/kubelet/config.yaml");
    for want in [
        "cgroupDriver: systemd",
        "maxPods: 29",
        "providerID: aws:///eu-west-1a/i-0abc",
    ] {
        assert!(config.contains(want), "{want} not in\n{config}");
    }
    // Sorted by name; the node name is the hostname, so no --hostname-override.
    assert_eq!(
        node.read("var/lib/kubelet/kubeadm-flags.env"),
        "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock \
--node-labels=tier=web --pod-infra-container-image=registry.k8s.io/pause:3.10\"\n"
    );
    let mut at = 0;
    for line in [
        "[preflight] Running pre-flight checks",
        "[patches] Applied patch of type \"application/strategic-merge-patch+json\" to target \"kubeletconfiguration\"",
        "[kubelet-start] Writing kubelet configuration to file \"/var/lib/kubelet/config.yaml\"",
        "[kubelet-start] Starting the kubelet",
        &format!(
            "[kubelet-check] Waiting for a healthy kubelet at http://127.0.0.1:{}/healthz. This can take up to 3s",
            node.healthz_port
        ),
        "[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap",
        "This node has joined the cluster:",
    ] {
        let found = stdout[at..]
            .find(line)
            .unwrap_or_else(|| panic!("{line:?} missing or out of order in\n{stdout}"));
        at += found + line.len();
    }
}

#[test]
fn preflight_refuses_each_unready_node_and_ignores_what_it_is_told_to() {
    type Setup = fn(&mut Node);
    let cases: [(Setup, &str); 6] = [
        (
            |n| n.write("etc/kubernetes/manifests/etcd.yaml", ""),
            "[ERROR DirAvailable--etc-kubernetes-manifests]: /etc/kubernetes/manifests is not empty",
        ),
        (
            |n| n.write("etc/kubernetes/kubelet.conf", ""),
            "[ERROR FileAvailable--etc-kubernetes-kubelet.conf]: /etc/kubernetes/kubelet.conf already exists",
        ),
        (
            |n| n.write("etc/kubernetes/bootstrap-kubelet.conf", ""),
            "[ERROR FileAvailable--etc-kubernetes-bootstrap-kubelet.conf]: /etc/kubernetes/bootstrap-kubelet.conf already exists",
        ),
        (
            |n| {
                std::fs::create_dir_all(n.path("etc/kubernetes/pki")).unwrap();
                n.write("etc/kubernetes/pki/ca.crt", "");
            },
            "[ERROR FileAvailable--etc-kubernetes-pki-ca.crt]: /etc/kubernetes/pki/ca.crt already exists",
        ),
        (
            |n| n.write("proc/sys/net/ipv4/ip_forward", "0\n"),
            "[ERROR FileContent--proc-sys-net-ipv4-ip_forward]: /proc/sys/net/ipv4/ip_forward contents are not set to 1",
        ),
        (
            |n| {
                n.cri = None;
                std::fs::remove_file(n.path("run/containerd/containerd.sock")).unwrap();
            },
            "[ERROR CRI]: could not connect to the container runtime",
        ),
    ];
    for (setup, want) in cases {
        let mut node = Node::new("ec");
        node.join_config(&node.pin, "");
        setup(&mut node);
        let (out, stdout, stderr) = node.join(&[]);
        assert_eq!(out.status.code(), Some(1), "{want}\n{stdout}\n{stderr}");
        assert!(
            stderr.starts_with(
                "error execution phase preflight: [preflight] Some fatal errors occurred:\n"
            ) && stderr.contains(&format!("\t{want}"))
                && stderr.contains(
                    "you can make a check non-fatal with `--ignore-preflight-errors=...`"
                )
                && stderr.ends_with(
                    "To see the stack trace of this error execute with --v=5 or higher\n"
                ),
            "{want}\n{stderr}"
        );
        assert!(node.calls().is_empty(), "{:?}", node.calls());
        assert!(!node.path("var/lib/kubelet/config.yaml").exists());
    }
    // Named on the command line (case-insensitive) or in nodeRegistration: a warning no more.
    for (flag, yaml) in [
        (
            "--ignore-preflight-errors=filecontent--proc-sys-net-ipv4-ip_forward",
            "",
        ),
        ("", "  ignorePreflightErrors:\n    - all\n"),
    ] {
        let node = Node::new("ec");
        node.join_config(&node.pin, "");
        // ignorePreflightErrors belongs to nodeRegistration.
        let text = node
            .read("kubeadm-join.yaml")
            .replace("  taints: []\n", &format!("  taints: []\n{yaml}"));
        node.write("kubeadm-join.yaml", &text);
        node.write("proc/sys/net/ipv4/ip_forward", "0\n");
        node.write("kubelet-bootstraps", "");
        node.serve_healthz();
        let args: Vec<&str> = [flag].into_iter().filter(|f| !f.is_empty()).collect();
        let (out, stdout, stderr) = node.join(&args);
        assert!(out.status.success(), "{flag}{yaml}\n{stdout}\n{stderr}");
    }
}

#[test]
fn discovery_checks_the_tokens_signature_and_openssls_ca_pin() {
    // The pin kubeadm computes is openssl's SPKI SHA-256, for RSA and EC keys alike: with
    // it discovery passes; with another, kubeadm names the CA's pin it found.
    for key in ["rsa:2048", "ec"] {
        let node = Node::new(key);
        node.join_config(
            "sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "",
        );
        let (out, _, stderr) = node.join(&[]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            stderr.starts_with(&format!(
                "error execution phase preflight: couldn't validate the identity of the API Server: cluster CA found in cluster-info ConfigMap is invalid: none of the public keys \"{}\" are pinned\n",
                node.pin
            )),
            "{key}: {stderr}"
        );
        // Upper-case hex is the same pin.
        node.join_config(&node.pin.to_uppercase().replace("SHA256", "sha256"), "");
        node.write("kubelet-bootstraps", "");
        node.serve_healthz();
        let (out, stdout, stderr) = node.join(&[]);
        assert!(out.status.success(), "{key}: {stdout}\n{stderr}");
    }
    // The token's ID is the cluster's but its secret is not: the JWS signature does not verify.
    let node = Node::new("ec");
    node.join_config(&node.pin, "");
    node.cluster("10.0.0.10:6443", "07401b.0000000000000000");
    let (out, _, stderr) = node.join(&[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.starts_with("error execution phase preflight: couldn't validate the identity of the API Server: failed to verify JWS signature of received cluster info object, can't trust this API Server\n"),
        "{stderr}"
    );
    assert!(node.calls().is_empty());
}

#[test]
fn discovery_retries_until_its_timeout_then_fails_with_the_last_error() {
    // No signature for the token's ID (kubeadm waits for one to appear), and an API server
    // that refuses connections: both retried every 5 s until timeouts.discovery (7s here).
    for (api, tokens, want) in [
        (
            "10.0.0.10:6443",
            "abcdef.0123456789abcdef",
            "couldn't validate the identity of the API Server: could not find a JWS signature in the cluster-info ConfigMap for token ID \"07401b\"",
        ),
        (
            "10.0.0.11:6443",
            TOKEN,
            "couldn't validate the identity of the API Server: failed to request the cluster-info ConfigMap: Get \"https://10.0.0.10:6443/api/v1/namespaces/kube-public/configmaps/cluster-info?timeout=10s\": dial tcp 10.0.0.10:6443: connect: connection refused",
        ),
    ] {
        let node = Node::new("ec");
        node.join_config(&node.pin, "");
        node.cluster(api, tokens);
        let t0 = Instant::now();
        let (out, _, stderr) = node.join(&[]);
        let took = t0.elapsed();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.starts_with(&format!("error execution phase preflight: {want}\n")),
            "{stderr}"
        );
        assert!(
            took >= Duration::from_secs(7) && took < Duration::from_secs(12),
            "{took:?}"
        );
        assert!(node.calls().is_empty());
    }
}

#[test]
fn an_unhealthy_kubelet_and_a_kubelet_that_never_bootstraps_time_out_as_kubeadm_does() {
    // Nothing answers on the healthz port: kubeletHealthCheck (3s) runs out.
    let node = Node::new("ec");
    node.join_config(&node.pin, "");
    let t0 = Instant::now();
    let (out, stdout, stderr) = node.join(&[]);
    let took = t0.elapsed();
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let curl = format!(
        "The HTTP call equal to 'curl -sSL http://127.0.0.1:{0}/healthz' returned error: Get \"http://127.0.0.1:{0}/healthz\": dial tcp 127.0.0.1:{0}: connect: connection refused",
        node.healthz_port
    );
    assert!(
        stdout.contains("[kubelet-check] The kubelet is not healthy after")
            && stdout.contains(&format!("Unfortunately, an error has occurred:\n\t{curl}"))
            && stdout.contains("\t- 'journalctl -xeu kubelet'"),
        "{stdout}"
    );
    assert!(
        stderr.starts_with(&format!("error execution phase kubelet-start: {curl}")),
        "{stderr}"
    );
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(8),
        "{took:?}"
    );
    // kubelet was restarted with the files, and the token did not stay on disk.
    assert_eq!(
        node.calls(),
        ["stop kubelet", "daemon-reload", "restart kubelet"]
    );
    assert!(!node.path("etc/kubernetes/bootstrap-kubelet.conf").exists());

    // Healthy, but kubelet.conf never appears: tlsBootstrap (3s) runs out.
    let node = Node::new("ec");
    node.join_config(&node.pin, "");
    node.serve_healthz();
    let t0 = Instant::now();
    let (out, stdout, stderr) = node.join(&[]);
    let took = t0.elapsed();
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap")
            && stdout
                .contains("Unfortunately, an error has occurred:\n\tcontext deadline exceeded"),
        "{stdout}"
    );
    assert_eq!(
        stderr,
        "error execution phase kubelet-start: context deadline exceeded\nTo see the stack trace of this error execute with --v=5 or higher\n"
    );
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(8),
        "{took:?}"
    );
    assert!(!node.path("etc/kubernetes/bootstrap-kubelet.conf").exists());
}

#[test]
fn flags_are_checked_as_cobra_and_kubeadm_check_them() {
    let node = Node::new("ec");
    node.join_config(&node.pin, "");
    let config = node.path("kubeadm-join.yaml").display().to_string();
    for (args, want) in [
        (
            vec!["join", "--config", &config, "--kubeconfig-path=x"],
            "unknown flag: --kubeconfig-path",
        ),
        (
            vec![
                "join",
                "--config",
                &config,
                "--token",
                "a",
                "--patches",
                "/p",
            ],
            "can not mix '--config' with arguments [patches token]",
        ),
        (vec!["join", "--config"], "flag needs an argument: --config"),
    ] {
        let (out, _, stderr) = node.kubeadm(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(stderr.starts_with(want), "{args:?}: {stderr}");
    }
    assert!(node.calls().is_empty());
}
