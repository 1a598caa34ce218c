//! A double for `kubeadm join` on a worker, for kiln's tests (upstream kubeadm cannot be
//! downloaded here). It follows kubeadm's sequence, files, timeouts and wording (README.md,
//! each rule with its kubernetes/kubernetes source); the API server is a file (discovery.rs).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

mod config;
mod discovery;
mod kubelet;

use config::{JoinConfiguration, Waits};

/// `kubeadm version -o short`.
const VERSION: &str = "v0.0.0-kiln-standin";

/// The failure text kubeadm prints around a kubelet-start wait that failed
/// (`cmd/kubeadm/app/cmd/phases/join/kubelet.go`, `kubeadmJoinFailMsg`).
const JOIN_FAIL: &str = "
Unfortunately, an error has occurred:
	{}

This error is likely caused by:
	- The kubelet is not running
	- The kubelet is unhealthy due to a misconfiguration of the node in some way (required cgroups disabled)

If you are on a systemd-powered system, you can try to troubleshoot the error with the following commands:
	- 'systemctl status kubelet'
	- 'journalctl -xeu kubelet'
";

/// The success text (`cmd/kubeadm/app/cmd/join.go`, `joinWorkerNodeDoneMsg`).
const JOINED: &str = "
This node has joined the cluster:
* Certificate signing request was sent to apiserver and a response was received.
* The Kubelet was informed of the new secure connection details.

Run 'kubectl get nodes' on the control-plane to see this node join the cluster.
";

/// A klog warning line.
fn warn(msg: &str) {
    eprintln!("W0000 00:00:00.000000       1 standin.go:1] {msg}");
}

/// How `kubeadm` ends with an error (`cmd/kubeadm/app/util/error.go` `CheckErr`): the
/// message, the stack-trace hint, exit status 1.
fn fail(msg: &str) -> ExitCode {
    eprintln!("{msg}\nTo see the stack trace of this error execute with --v=5 or higher");
    ExitCode::from(1)
}

fn phase_fail(phase: &str, msg: &str) -> ExitCode {
    fail(&format!("error execution phase {phase}: {msg}"))
}

/// Where the node's files are: `/`, or `STANDIN_KUBEADM_ROOT` in unit tests.
struct Node {
    root: PathBuf,
    systemctl: String,
}

impl Node {
    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }
}

/// The flags `kubeadm join` accepts beside `--config` (`cmd/kubeadm/app/util/config`,
/// `isAllowedFlag`: the config path, preflight errors, dry run, the node name, the
/// kubeconfig paths, `skip-*`, verbosity).
fn allowed_with_config(name: &str) -> bool {
    [
        "config",
        "ignore-preflight-errors",
        "dry-run",
        "kubeconfig",
        "node-name",
        "kubeconfig-dir",
        "upload-certs",
        "print-join-command",
        "rootfs",
        "v",
        "log-file",
    ]
    .contains(&name)
        || name.starts_with("skip-")
}

/// `kubeadm join`'s own flags (cmd/kubeadm/app/cmd/join.go, options): anything else is
/// cobra's `unknown flag`.
const JOIN_FLAGS: [&str; 17] = [
    "config",
    "ignore-preflight-errors",
    "dry-run",
    "node-name",
    "cri-socket",
    "token",
    "discovery-token",
    "discovery-token-ca-cert-hash",
    "discovery-token-unsafe-skip-ca-verification",
    "discovery-file",
    "tls-bootstrap-token",
    "control-plane",
    "apiserver-advertise-address",
    "apiserver-bind-port",
    "certificate-key",
    "patches",
    "skip-phases",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("version") => {
            println!("{VERSION}");
            ExitCode::SUCCESS
        }
        Some("join") => {
            let node = Node {
                root: PathBuf::from(
                    std::env::var("STANDIN_KUBEADM_ROOT").unwrap_or_else(|_| "/".into()),
                ),
                systemctl: std::env::var("STANDIN_KUBEADM_SYSTEMCTL")
                    .unwrap_or_else(|_| "systemctl".into()),
            };
            join(&node, &args[1..])
        }
        Some(other) => fail(&format!("unknown command {other:?} for \"kubeadm\"")),
        None => fail("stand-in kubeadm: only `join` and `version` are modelled"),
    }
}

/// Parses `join`'s flags into (name, value) pairs.
fn parse_flags(args: &[String]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let Some(flag) = a.strip_prefix("--").or_else(|| a.strip_prefix('-')) else {
            out.push(("api-server-endpoint".into(), a.clone()));
            continue;
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag.to_string(), None),
        };
        if !JOIN_FLAGS.contains(&name.as_str()) && name != "v" {
            return Err(format!("unknown flag: --{name}"));
        }
        let boolean = [
            "dry-run",
            "control-plane",
            "discovery-token-unsafe-skip-ca-verification",
        ]
        .contains(&name.as_str());
        let value = match value {
            Some(v) => v,
            None if boolean => "true".into(),
            None => it
                .next()
                .cloned()
                .ok_or_else(|| format!("flag needs an argument: --{name}"))?,
        };
        out.push((name, value));
    }
    Ok(out)
}

fn join(node: &Node, args: &[String]) -> ExitCode {
    let flags = match parse_flags(args) {
        Ok(f) => f,
        Err(e) => return fail(&e),
    };
    let Some((_, path)) = flags.iter().find(|(n, _)| n == "config") else {
        return fail("stand-in kubeadm: only `kubeadm join --config FILE` is modelled");
    };
    // pflag's `Visit` goes through the set flags in lexical order, once each, and the error
    // prints Go's `%v` of the []string: `[patches token]`.
    let mut mixed: Vec<&str> = flags
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !allowed_with_config(n))
        .collect();
    mixed.sort_unstable();
    mixed.dedup();
    if !mixed.is_empty() {
        return fail(&format!(
            "can not mix '--config' with arguments [{}]",
            mixed.join(" ")
        ));
    }
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            return fail(&format!(
                "unable to read config from {path:?} : open {path}: {e}"
            ))
        }
    };
    let loaded = match config::load(&text) {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    for w in &loaded.warnings {
        warn(w);
    }
    let mut cfg = loaded.config;
    let hostname = hostname(node);
    if cfg.node_registration.name.is_empty() {
        cfg.node_registration.name = hostname.to_ascii_lowercase();
    }
    let errs = config::validate(&cfg);
    match errs.len() {
        0 => {}
        1 => return fail(&errs[0]),
        _ => return fail(&format!("[{}]", errs.join(", "))),
    }
    let waits = match Waits::of(cfg.timeouts.as_ref()) {
        Ok(w) => w,
        Err(e) => return fail(&e),
    };
    if cfg.control_plane.is_some() {
        return fail("stand-in kubeadm: joining a control-plane node is not modelled");
    }
    let cri = match cri_socket(node, &cfg) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let ignored = ignored_checks(&cfg, &flags);
    println!("[preflight] Running pre-flight checks");
    if let Err(e) = preflight(node, &cfg, &cri, &ignored) {
        return phase_fail("preflight", &e);
    }
    let Some(bt) = cfg.discovery.bootstrap_token.as_ref() else {
        return fail("stand-in kubeadm: only token discovery is modelled");
    };
    let cluster = match discovery::discover(bt, waits.discovery) {
        Ok(c) => c,
        Err(e) => return phase_fail("preflight", &e),
    };
    println!("[preflight] Reading configuration from the \"kubeadm-config\" ConfigMap in namespace \"kube-system\"...");
    println!("[preflight] Use 'kubeadm init phase upload-config --config your-config-file' to re-upload it.");
    match kubelet_start(node, &cfg, &cluster, &cri, &hostname, waits) {
        Ok(()) => {
            print!("{JOINED}");
            ExitCode::SUCCESS
        }
        Err(e) => phase_fail("kubelet-start", &e),
    }
}

fn hostname(node: &Node) -> String {
    std::fs::read_to_string(node.path("/proc/sys/kernel/hostname"))
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/hostname"))
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// `criSocket`, or the one known runtime socket found (`DetectCRISocket`).
fn cri_socket(node: &Node, cfg: &JoinConfiguration) -> Result<String, String> {
    let s = &cfg.node_registration.cri_socket;
    if !s.is_empty() {
        return Ok(s.clone());
    }
    let known = [
        "/var/run/containerd/containerd.sock",
        "/var/run/crio/crio.sock",
    ];
    let found: Vec<&&str> = known.iter().filter(|p| node.path(p).exists()).collect();
    match found.as_slice() {
        [one] => Ok(format!("unix://{one}")),
        [] => Err("found no CRI endpoints on the host. Please set the criSocket field in the kubeadm configuration or use the --cri-socket flag".into()),
        _ => Err("found multiple CRI endpoints on the host. Please define which one do you wish to use by setting the 'criSocket' field in the kubeadm configuration file".into()),
    }
}

fn ignored_checks(cfg: &JoinConfiguration, flags: &[(String, String)]) -> Vec<String> {
    let mut v: Vec<String> = cfg
        .node_registration
        .ignore_preflight_errors
        .iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    for (n, val) in flags {
        if n == "ignore-preflight-errors" {
            v.extend(val.split(',').map(|s| s.trim().to_ascii_lowercase()));
        }
    }
    v
}

/// The worker's pre-flight checks kiln's node can fail (`cmd/kubeadm/app/preflight/checks.go`,
/// `RunJoinNodeChecks` and `addCommonChecks`), each with its check name and wording.
fn preflight(
    node: &Node,
    cfg: &JoinConfiguration,
    cri: &str,
    ignored: &[String],
) -> Result<(), String> {
    let mut errors = Vec::new();
    let ca = if cfg.ca_cert_path.is_empty() {
        "/etc/kubernetes/pki/ca.crt"
    } else {
        &cfg.ca_cert_path
    };
    let check_name = |p: &str| p.trim_start_matches('/').replace('/', "-");
    let manifests = node.path("/etc/kubernetes/manifests");
    if std::fs::read_dir(&manifests).is_ok_and(|mut d| d.next().is_some()) {
        errors.push((
            "DirAvailable--etc-kubernetes-manifests".to_string(),
            "/etc/kubernetes/manifests is not empty".to_string(),
        ));
    }
    for f in [
        "/etc/kubernetes/kubelet.conf",
        "/etc/kubernetes/bootstrap-kubelet.conf",
        ca,
    ] {
        if node.path(f).exists() {
            errors.push((
                format!("FileAvailable--{}", check_name(f)),
                format!("{f} already exists"),
            ));
        }
    }
    let forward = "/proc/sys/net/ipv4/ip_forward";
    let content = std::fs::read_to_string(node.path(forward)).unwrap_or_default();
    if content.trim() != "1" {
        errors.push((
            format!("FileContent--{}", check_name(forward)),
            format!("{forward} contents are not set to 1"),
        ));
    }
    let socket = cri.strip_prefix("unix://").unwrap_or(cri);
    if std::os::unix::net::UnixStream::connect(node.path(socket)).is_err() {
        errors.push(("CRI".to_string(), format!("could not connect to the container runtime: validate service connection: validate CRI v1 runtime API for endpoint {cri:?}: rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial unix {socket}: connect: no such file or directory\"")));
    }
    if std::net::TcpListener::bind(("0.0.0.0", 10250)).is_err() && node.root == Path::new("/") {
        errors.push(("Port-10250".to_string(), "Port 10250 is in use".to_string()));
    }
    let fatal: Vec<String> = errors
        .into_iter()
        .filter(|(name, _)| {
            !ignored
                .iter()
                .any(|i| i == "all" || *i == name.to_ascii_lowercase())
        })
        .map(|(name, msg)| format!("\t[ERROR {name}]: {msg}\n"))
        .collect();
    if fatal.is_empty() {
        return Ok(());
    }
    Err(format!(
        "[preflight] Some fatal errors occurred:\n{}[preflight] If you know what you are doing, you can make a check non-fatal with `--ignore-preflight-errors=...`",
        fatal.concat()
    ))
}

fn write(path: &Path, data: &str, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)
            .map_err(|e| format!("failed to create directory {:?}: {e}", d.display()))?;
    }
    std::fs::write(path, data).map_err(|e| format!("failed to write {:?}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| e.to_string())
}

fn systemctl(node: &Node, args: &[&str]) -> Result<(), String> {
    let out = Command::new(&node.systemctl)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The kubelet-start phase and its wait (`runKubeletStartJoinPhase`,
/// `runKubeletWaitBootstrapPhase`).
fn kubelet_start(
    node: &Node,
    cfg: &JoinConfiguration,
    cluster: &discovery::Cluster,
    cri: &str,
    hostname: &str,
    waits: Waits,
) -> Result<(), String> {
    let bt = cfg
        .discovery
        .bootstrap_token
        .as_ref()
        .expect("token discovery");
    let tls_token = if cfg.discovery.tls_bootstrap_token.is_empty() {
        &bt.token
    } else {
        &cfg.discovery.tls_bootstrap_token
    };
    let bootstrap = node.path("/etc/kubernetes/bootstrap-kubelet.conf");
    let server = format!("https://{}", bt.api_server_endpoint);
    write(
        &bootstrap,
        &kubelet::bootstrap_kubeconfig(&server, &cluster.ca_pem, tls_token),
        0o600,
    )
    .map_err(|e| format!("couldn't save bootstrap-kubelet.conf to disk: {e}"))?;
    // Deleted at the end whatever happens, so the token does not stay on disk.
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _remove = Remove(bootstrap);
    let ca = node.path(if cfg.ca_cert_path.is_empty() {
        "/etc/kubernetes/pki/ca.crt"
    } else {
        &cfg.ca_cert_path
    });
    if !ca.exists() {
        write(&ca, &cluster.ca_pem, 0o644)
            .map_err(|e| format!("couldn't save the CA certificate to disk: {e}"))?;
    }
    // TryStopKubelet: a failure is only a warning.
    if let Err(e) = systemctl(node, &["stop", "kubelet"]) {
        warn(&format!(
            "[kubelet-start] WARNING: unable to stop the kubelet service momentarily: [{e}]"
        ));
    }
    let dir = cfg
        .patches
        .as_ref()
        .map(|p| p.directory.as_str())
        .filter(|d| !d.is_empty());
    let patch_dir = dir.map(|d| node.path(d));
    let (config, lines) = kubelet::config_yaml(&cluster.kubelet_config, patch_dir.as_deref())
        .map_err(|e| format!("could not apply patches to the KubeletConfiguration: {e}"))?;
    for l in lines {
        println!("{l}");
    }
    println!(
        "[kubelet-start] Writing kubelet configuration to file \"/var/lib/kubelet/config.yaml\""
    );
    write(&node.path("/var/lib/kubelet/config.yaml"), &config, 0o644)?;
    println!("[kubelet-start] Writing kubelet environment file with flags to file \"/var/lib/kubelet/kubeadm-flags.env\"");
    write(
        &node.path("/var/lib/kubelet/kubeadm-flags.env"),
        &kubelet::flags_env(cfg, cri, &cluster.pause_image, hostname),
        0o644,
    )?;
    println!("[kubelet-start] Starting the kubelet");
    // TryStartKubelet: `systemctl daemon-reload` then `systemctl restart kubelet`
    // (initsystem_unix.go ServiceRestart); a failure is a warning and the wait decides.
    if let Err(e) =
        systemctl(node, &["daemon-reload"]).and_then(|()| systemctl(node, &["restart", "kubelet"]))
    {
        warn(&format!(
            "[kubelet-start] WARNING: unable to start the kubelet service: [{e}]"
        ));
        println!("[kubelet-start] Please ensure kubelet is reloaded and running manually.");
    }
    let _ = std::io::stdout().flush();
    let v: serde_json::Value = serde_yaml_ng::from_str(&config).unwrap_or_default();
    let address = v["healthzBindAddress"]
        .as_str()
        .unwrap_or("127.0.0.1")
        .to_string();
    let port = v["healthzPort"].as_u64().unwrap_or(10248);
    wait_healthy(&address, port, waits.kubelet_health_check)?;
    println!("[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap");
    let _ = std::io::stdout().flush();
    let conf = node.path("/etc/kubernetes/kubelet.conf");
    let until = Instant::now() + waits.tls_bootstrap;
    while !kubelet::client_config_loads(&conf) {
        if Instant::now() >= until {
            print!("{}", JOIN_FAIL.replace("{}", "context deadline exceeded"));
            return Err("context deadline exceeded".into());
        }
        std::thread::sleep(
            Duration::from_secs(1).min(until.saturating_duration_since(Instant::now())),
        );
    }
    Ok(())
}

/// `KubeWaiter.WaitForKubelet` (`util/apiclient/wait.go`): GET /healthz every 500 ms.
fn wait_healthy(address: &str, port: u64, timeout: Duration) -> Result<(), String> {
    let endpoint = format!("http://{address}:{port}/healthz");
    if port == 0 {
        println!("[kubelet-check] Skipping the kubelet health check because the healthz port is set to 0");
        return Ok(());
    }
    println!(
        "[kubelet-check] Waiting for a healthy kubelet at {endpoint}. This can take up to {}",
        go_duration(timeout)
    );
    let _ = std::io::stdout().flush();
    let start = Instant::now();
    let mut last;
    loop {
        last = match healthz(address, port as u16) {
            Ok(200) => {
                println!(
                    "[kubelet-check] The kubelet is healthy after {:?}",
                    start.elapsed()
                );
                return Ok(());
            }
            Ok(code) => format!("status code: {code}"),
            Err(e) => format!("error: Get {endpoint:?}: dial tcp {address}:{port}: {e}"),
        };
        if start.elapsed() >= timeout {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "[kubelet-check] The kubelet is not healthy after {:?}",
        start.elapsed()
    );
    let e = format!("The HTTP call equal to 'curl -sSL {endpoint}' returned {last}\n");
    print!("{}", JOIN_FAIL.replace("{}", &e));
    Err(e)
}

fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec}s"),
        (h, m, sec) => format!("{h}h{m}m{sec}s"),
    }
}

fn healthz(address: &str, port: u16) -> Result<u16, String> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect((address, port)).map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connect: connection refused".to_string(),
        _ => e.to_string(),
    })?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: {address}:{port}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| "malformed HTTP response".to_string())
}
