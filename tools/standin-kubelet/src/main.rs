//! A stand-in for kubelet in kiln's tests (upstream kubelet cannot be downloaded here).
//! It parses its command line and `--config` as strictly as kubelet 1.36 (flags.rs,
//! config/), records how it was started, checks what kubelet checks first, serves
//! `/healthz`, follows kubelet's kubeconfig rules (bootstrap.rs), and then completes a
//! pretend TLS bootstrap or fails with real kubelet wording. See README.md.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

mod bootstrap;
mod config;
mod flags;
mod healthz;
mod klog;
mod podcheck;

use bootstrap::Client;
use klog::{command_failed, klog, quote};

/// The behaviours the stand-in can act out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Success,
    X509,
    Unauthorized,
    Dns,
    Refused,
    Timeout,
    Swap,
    Cgroup,
    DiskFull,
    Exit,
    /// The bootstrap succeeds; the API server refuses the Node (an admission policy).
    RegisterForbidden,
}

impl Mode {
    fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "success" => Mode::Success,
            "x509" => Mode::X509,
            "unauthorized" => Mode::Unauthorized,
            "dns" => Mode::Dns,
            "refused" => Mode::Refused,
            "timeout" => Mode::Timeout,
            "swap" => Mode::Swap,
            "cgroup" => Mode::Cgroup,
            "disk-full" => Mode::DiskFull,
            "exit" => Mode::Exit,
            "register-forbidden" => Mode::RegisterForbidden,
            _ => return None,
        })
    }
}

/// Reads `KEY=VALUE` lines; quotes around a value are dropped.
fn read_env_file(path: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Ok(text) = std::fs::read_to_string(path) {
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some((k, v)) = line.split_once('=') {
                out.insert(k.to_string(), v.trim_matches('"').to_string());
            }
        }
    }
    out
}

/// `https://host:port/...` → (`host`, `host:port`).
fn host_and_authority(server: &str) -> (String, String) {
    let rest = server.split_once("://").map_or(server, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = match authority.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    };
    let authority = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:443")
    };
    (host.to_string(), authority)
}

/// Writes `data` to `path` through a temp file and rename, so readers never see half a file.
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn record(root_dir: &Path, args: &[String], warnings: &[String]) -> std::io::Result<()> {
    let dir = root_dir.join("standin");
    // pflag's deprecation warnings, one per line (none: an empty file), for the tests to read.
    let mut w = String::new();
    for line in warnings {
        w.push_str(line);
        w.push('\n');
    }
    write_atomic(&dir.join("flag-warnings"), w.as_bytes())?;
    let mut a = String::new();
    for arg in args {
        a.push_str(arg);
        a.push('\n');
    }
    write_atomic(&dir.join("args"), a.as_bytes())?;
    let mut e = String::new();
    let vars: BTreeMap<String, String> = std::env::vars().collect();
    for (k, v) in vars {
        e.push_str(&format!("{k}={v}\n"));
    }
    write_atomic(&dir.join("env"), e.as_bytes())
}

/// Waits for the CRI socket to accept a connection, as kubelet's runtime check does.
fn check_runtime(endpoint: &str, wait: Duration) -> Result<(), String> {
    let Some(path) = endpoint.strip_prefix("unix://") else {
        return Err(format!(
            "unsupported container runtime endpoint {endpoint:?}"
        ));
    };
    let until = Instant::now() + wait;
    loop {
        #[cfg(unix)]
        let res = std::os::unix::net::UnixStream::connect(path).map(drop);
        #[cfg(not(unix))]
        let res: std::io::Result<()> = Err(std::io::Error::other("unix sockets unsupported"));
        match res {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= until => {
                let what = if e.kind() == std::io::ErrorKind::NotFound {
                    "no such file or directory".to_string()
                } else {
                    e.to_string()
                };
                return Err(format!(
                    "failed to run Kubelet: validate service connection: validate CRI v1 runtime API for endpoint \"{endpoint}\": rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial unix {path}: connect: {what}\""
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn env_ms(vars: &BTreeMap<String, String>, key: &str, default: u64) -> Duration {
    let ms = std::env::var(key)
        .ok()
        .or_else(|| vars.get(key).cloned())
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Duration::from_millis(ms)
}

/// The `--version` text (`pkg/version/verflag`).
const VERSION: &str = "Kubernetes v0.0.0-kiln-standin";

#[allow(
    clippy::too_many_lines,
    reason = "the stand-in kubelet's start-up in kubelet's own order (flags, config, certificates, serve); each phase cites the kubelet source it follows"
)]
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // NewKubeletCommand: parse with pflag; any error ends the command.
    let flags = match flags::parse(&args) {
        Ok(f) => f,
        Err(e) => return command_failed(&e),
    };
    if flags.flag_true("help") {
        println!("The kubelet is the primary \"node agent\" that runs on each node.\n(kiln's stand-in: see tools/standin-kubelet/README.md)\n\nUsage:\n  kubelet [flags]");
        return ExitCode::SUCCESS;
    }
    if flags.is_set("version") {
        println!("{VERSION}");
        return ExitCode::SUCCESS;
    }
    for w in &flags.warnings {
        let _ = writeln!(std::io::stderr(), "{w}");
    }
    let root_dir = PathBuf::from(flags.get("root-dir").unwrap_or("/var/lib/kubelet"));
    if let Err(e) = record(&root_dir, &args, &flags.warnings) {
        return command_failed(&format!(
            "failed to run Kubelet: mkdir {}: {e}",
            root_dir.display()
        ));
    }
    let conf_path = std::env::var("STANDIN_KUBELET_CONFIG")
        .unwrap_or_else(|_| "/etc/kubernetes/standin-kubelet.env".into());
    let conf = read_env_file(Path::new(&conf_path));
    let mode_name = conf.get("STANDIN_MODE").map_or("success", String::as_str);
    let Some(mode) = Mode::parse(mode_name) else {
        return command_failed(&format!(
            "stand-in kubelet: unknown STANDIN_MODE {mode_name:?} in {conf_path}"
        ));
    };

    // --config: strict, then lenient with a warning; a wrong type is fatal
    // (tools/kubelet-config). Then --config-dir's drop-ins merge over it (dropin.rs).
    let loaded = match flags.get("config").filter(|p| !p.is_empty()) {
        Some(path) => match config::load(path) {
            Ok(loaded) => {
                if let Some(strict) = &loaded.lenient {
                    klog(
                        'I',
                        "codec.go:82",
                        &format!(
                            "\"Using lenient decoding as strict decoding failed\" err=\"{}\"",
                            quote(&strict.replace('\n', "\\n"))
                        ),
                    );
                }
                Some(loaded)
            }
            Err(e) => return command_failed(&e),
        },
        None => None,
    };
    let (mut kc, effective) = match flags.get("config-dir").filter(|d| !d.is_empty()) {
        None => match loaded {
            Some(l) => (l.config, l.tree),
            None => (
                config::KubeletConfiguration::default(),
                serde_json::json!({}),
            ),
        },
        Some(dir) => {
            let base = config::dropin::base(loaded.map(|l| l.tree));
            let merged =
                config::dropin::merge_dir(base, Path::new(dir)).and_then(|(merged, _files)| {
                    config::dropin::unmarshal(merged.clone()).map(|kc| (kc, merged))
                });
            match merged {
                Ok(m) => m,
                Err(e) => return command_failed(&format!("failed to merge kubelet configs: {e}")),
            }
        }
    };
    // What the stand-in runs with, for tests to read: the file and drop-ins merged.
    let _ = write_atomic(
        &root_dir.join("standin").join("config.json"),
        format!("{effective}\n").as_bytes(),
    );
    // The file's and the drop-ins' gates are set while their defaults are applied
    // (`SetDefaults_KubeletConfiguration`, pkg/kubelet/apis/config/v1beta1/defaults.go), which
    // panics on an error: a real v1.36 kubelet exits 2 with Go's panic text (checked by hand).
    let gates = kc.feature_gates.clone().unwrap_or_default();
    if let Err(e) = config::feature_gates::set_from_map(&gates) {
        eprintln!(
            "panic: failed to merge global and in-flight KubeletConfiguration while setting defaults, error: {e}\n\ngoroutine 1 [running]:"
        );
        return ExitCode::from(2);
    }
    // Flags win over the file; then the command line's gates go through SetFromMap
    // (server.go), whose error is the run's; then ValidateKubeletConfiguration.
    config::apply_flags(&mut kc, &flags);
    let gates = kc.feature_gates.clone().unwrap_or_default();
    match config::feature_gates::set_from_map(&gates) {
        Ok(warnings) => {
            for w in warnings {
                klog('I', "feature_gate.go:476", &w);
            }
        }
        Err(e) => {
            return command_failed(&format!(
                "failed to set feature gates from initial flags-based config: {e}"
            ))
        }
    }
    let errs = config::validate::validate(&kc);
    if !errs.is_empty() {
        return command_failed(&format!(
            "failed to validate kubelet configuration, error: {}, path: &{{{}}}",
            config::validate::aggregate(&errs),
            flags.get("config").unwrap_or("")
        ));
    }
    klog(
        'I',
        "server.go:530",
        "\"Kubelet version\" kubeletVersion=\"v0.0.0-kiln-standin\"",
    );
    if let Err(e) = config::validate::run_checks(&kc) {
        return command_failed(&format!("failed to run Kubelet: {e}"));
    }
    let endpoint = kc
        .container_runtime_endpoint
        .clone()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "unix:///run/containerd/containerd.sock".into());
    if let Err(e) = check_runtime(&endpoint, env_ms(&conf, "STANDIN_RUNTIME_WAIT_MS", 10_000)) {
        return command_failed(&e);
    }
    // The runtime manager registers the image credential providers once either flag is set,
    // and exits 1 on any error (tools/kubelet-config/src/credential_provider.rs).
    let cp_config = flags.get("image-credential-provider-config").unwrap_or("");
    let cp_bin_dir = flags.get("image-credential-provider-bin-dir").unwrap_or("");
    if !cp_config.is_empty() || !cp_bin_dir.is_empty() {
        // KubeletServiceAccountTokenForCredentialProviders: beta, on by default since v1.34.
        let gate = kc
            .feature_gates
            .as_ref()
            .and_then(|g| {
                g.get("KubeletServiceAccountTokenForCredentialProviders")
                    .copied()
            })
            .unwrap_or(true);
        match config::credential_provider::register(cp_config, cp_bin_dir, gate) {
            Ok(names) => {
                let _ = write_atomic(
                    &root_dir.join("standin").join("credential-providers"),
                    format!("{}\n", names.join(" ")).as_bytes(),
                );
            }
            Err(e) => {
                klog(
                    'E',
                    "kuberuntime_manager.go:315",
                    &format!(
                        "\"Failed to register CRI auth plugins\" err=\"{}\"",
                        quote(&e)
                    ),
                );
                return ExitCode::from(1);
            }
        }
    }
    let client = match bootstrap::decide(flags.get("kubeconfig"), flags.get("bootstrap-kubeconfig"))
    {
        Ok(c) => c,
        Err(e) => return command_failed(&format!("failed to run Kubelet: {e}")),
    };
    // A failure kubelet retries is logged by a running kubelet (below); the rest end it.
    let retried = retried_failure(mode, &client);
    if retried.is_none() {
        if let Some(e) = mode_failure(mode, &client, &flags) {
            return command_failed(&e);
        }
    }

    let bind = kc
        .healthz_bind_address
        .clone()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| "127.0.0.1".into());
    let port = kc.healthz_port.unwrap_or(10248);
    if port != 0 {
        let listener = match TcpListener::bind((bind.as_str(), port as u16)) {
            Ok(l) => l,
            Err(e) => {
                return command_failed(&format!(
                    "failed to run Kubelet: listen tcp {bind}:{port}: bind: {e}"
                ))
            }
        };
        std::thread::spawn(move || healthz::serve_healthz(listener));
        klog(
            'I',
            "server.go:180",
            &format!("\"Starting to listen\" address=\"{bind}\" port={port}"),
        );
    }
    if let Some(err) = retried {
        retry_bootstrap(&err);
    }
    let cluster = match client {
        Client::Standalone => {
            // Standalone: no API client, never registers, never writes a client certificate.
            klog('I', "server.go:703", "\"Standalone mode, no API client\"");
            park();
        }
        Client::Existing { server } => {
            klog(
                'I',
                "bootstrap.go:101",
                "\"Current kubeconfig file contents are still valid, no bootstrap necessary\"",
            );
            bootstrap::Cluster {
                server,
                ..Default::default()
            }
        }
        Client::Bootstrap(cluster) => cluster,
    };

    std::thread::sleep(env_ms(&conf, "STANDIN_JOIN_DELAY_MS", 500));
    // The boot tests' real pod (podcheck.rs): joined only once it ran.
    if let Some(check) = conf.get("STANDIN_POD_CHECK") {
        let driver = kc
            .cgroup_driver
            .clone()
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| "cgroupfs".into());
        klog(
            'I',
            "podcheck.go:1",
            &format!("\"Running the boot test's pod\" check={check:?} cgroupDriver={driver:?}"),
        );
        if let Err(e) = podcheck::run(&podcheck::command_line(check, &endpoint, &driver)) {
            return command_failed(&format!("failed to run Kubelet: stand-in pod check: {e}"));
        }
    }
    // The certificate the cluster's CSR signer issued: the boot tests place one signed by the
    // node config's CA (qemu-tests/src/scenario.rs, signed_client), so the node holds a real
    // certificate and key as kubelet would. Without it, a PEM-framed placeholder (whose
    // payload is only the base64 of "kiln stand-in kubelet: not a real certificate").
    let signed = conf
        .get("STANDIN_SIGNED_CLIENT")
        .map_or("/etc/kubernetes/standin-signed-client.pem", String::as_str);
    let pem = std::fs::read_to_string(signed).unwrap_or_else(|_| {
        format!(
            "# kiln stand-in kubelet: not a real certificate; written to act out a completed TLS bootstrap against {}\n\
             -----BEGIN CERTIFICATE-----\na2lsbiBzdGFuZC1pbiBrdWJlbGV0OiBub3QgYSByZWFsIGNlcnRpZmljYXRl\n-----END CERTIFICATE-----\n",
            cluster.server
        )
    });
    let cert_dir = PathBuf::from(flags.get("cert-dir").unwrap_or("/var/lib/kubelet/pki"));
    let kubeconfig = PathBuf::from(flags.get("kubeconfig").unwrap_or_default());
    if let Err(e) = bootstrap::write_client(&cert_dir, &kubeconfig, &cluster, &pem) {
        return command_failed(&format!(
            "failed to run Kubelet: write {}: {e}",
            cert_dir.display()
        ));
    }
    klog(
        'I',
        "certificate_manager.go:356",
        "\"kubernetes.io/kube-apiserver-client-kubelet: Certificate rotation is enabled\"",
    );
    register(&node_name(&flags), mode == Mode::RegisterForbidden)
}

/// The name kubelet registers: `--hostname-override`, else the host name, lower-cased
/// (`pkg/util/node` `GetHostname`).
fn node_name(flags: &flags::Parsed) -> String {
    flags
        .get("hostname-override")
        .map(str::to_string)
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .unwrap_or_else(|| "localhost".into())
        .trim()
        .to_lowercase()
}

/// kubelet's Node registration, `registerWithAPIServer` and `tryRegisterWithAPIServer` in
/// kubernetes `pkg/kubelet/kubelet_node_status.go`: "Attempting to register node", then
/// "Successfully registered node" once the create succeeds; a refused create is logged as
/// "Unable to register node with API server" with the API server's error and retried with a
/// backoff from 100 ms doubling to 7 s, forever, while kubelet keeps running.
fn register(node: &str, forbidden: bool) -> ! {
    let mut step = Duration::from_millis(100);
    loop {
        std::thread::sleep(step);
        step = (step * 2).min(Duration::from_secs(7));
        klog(
            'I',
            "kubelet_node_status.go:75",
            &format!("\"Attempting to register node\" node=\"{node}\""),
        );
        if !forbidden {
            klog(
                'I',
                "kubelet_node_status.go:78",
                &format!("\"Successfully registered node\" node=\"{node}\""),
            );
            park();
        }
        // The API server's words for a ValidatingAdmissionPolicy that denies the create
        // (apiserver `validatingadmissionpolicy` dispatcher), inside `nodes "x" is forbidden:`.
        let err = format!("nodes \"{node}\" is forbidden: ValidatingAdmissionPolicy 'kiln-standin-deny-nodes' with binding 'kiln-standin-deny-nodes' denied request: failed expression: false");
        klog(
            'E',
            "kubelet_node_status.go:108",
            &format!(
                "\"Unable to register node with API server\" err=\"{}\" node=\"{node}\"",
                quote(&err)
            ),
        );
    }
}

/// The bootstrap CSR error a running kubelet retries, for the API-server modes with an API
/// client. kubelet does not exit on it: with client rotation on ("Client rotation is on, will
/// bootstrap in background", `cmd/kubelet/app/server.go` `buildKubeletClientConfig`) the
/// request is client-go's certificate manager's (`k8s.io/client-go/util/certificate/
/// certificate_manager.go`, `rotateCerts`), which logs the failure and tries again.
fn retried_failure(mode: Mode, client: &Client) -> Option<String> {
    match client {
        Client::Bootstrap(c) => csr_failure(mode, &c.server),
        _ => None,
    }
}

/// The words of the CSR request's failure in the API-server modes (`x509` … `timeout`),
/// against `server`.
fn csr_failure(mode: Mode, server: &str) -> Option<String> {
    let (host, authority) = host_and_authority(server);
    let csr = format!(
        "cannot create certificate signing request: Post \"{server}/apis/certificates.k8s.io/v1/certificatesigningrequests\""
    );
    Some(match mode {
        Mode::X509 => format!(
            "{csr}: tls: failed to verify certificate: x509: certificate signed by unknown authority"
        ),
        Mode::Unauthorized => "cannot create certificate signing request: Unauthorized".into(),
        Mode::Dns => format!("{csr}: dial tcp: lookup {host} on 127.0.0.53:53: no such host"),
        Mode::Refused => format!("{csr}: dial tcp {authority}: connect: connection refused"),
        Mode::Timeout => format!("{csr}: dial tcp {authority}: i/o timeout"),
        _ => return None,
    })
}

/// The certificate manager's retries, as kubelet 1.28–1.36 logs them (a captured line: `E0911
/// 10:57:09.514471 9919 certificate_manager.go:562] kubernetes.io/kube-apiserver-client-kubelet:
/// Failed while requesting a signed certificate from the control plane: cannot create
/// certificate signing request: …`), with its exponential backoff from 2 s doubling (capped
/// at 32 s here). `/healthz` keeps answering ok all along, as kubelet's does.
fn retry_bootstrap(err: &str) -> ! {
    klog(
        'I',
        "server.go:895",
        "\"Client rotation is on, will bootstrap in background\"",
    );
    let mut step = Duration::from_secs(2);
    loop {
        klog(
            'E',
            "certificate_manager.go:562",
            &format!("kubernetes.io/kube-apiserver-client-kubelet: Failed while requesting a signed certificate from the control plane: {err}"),
        );
        std::thread::sleep(step);
        step = (step * 2).min(Duration::from_secs(32));
    }
}

fn park() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The failure `STANDIN_MODE` acts out, if any. The API-server failures need an API client:
/// a standalone kubelet never makes the request that would fail.
fn mode_failure(mode: Mode, client: &Client, flags: &flags::Parsed) -> Option<String> {
    let server = match client {
        Client::Bootstrap(c) => c.server.as_str(),
        Client::Existing { server } => server.as_str(),
        Client::Standalone => "",
    };
    let api = !matches!(client, Client::Standalone);
    if let Some(e) = csr_failure(mode, server).filter(|_| api) {
        return Some(format!("failed to run Kubelet: {e}"));
    }
    Some(match mode {
        Mode::DiskFull if api => format!(
            "failed to run Kubelet: write {}/kubelet-client.key.tmp: no space left on device",
            flags.get("cert-dir").unwrap_or("/var/lib/kubelet/pki")
        ),
        Mode::Swap => "failed to run Kubelet: running with swap on is not supported, please disable swap! or set --fail-swap-on flag to false. /proc/swaps contained: [Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority /swapfile                               file\t\t1048572\t\t0\t\t-2]".into(),
        Mode::Cgroup => "failed to run Kubelet: misconfiguration: kubelet cgroup driver: \"systemd\" is different from docker cgroup driver: \"cgroupfs\"".into(),
        Mode::Exit => "failed to run Kubelet: stand-in asked to exit".into(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authority_defaults_port() {
        assert_eq!(
            host_and_authority("https://api.example:6443"),
            ("api.example".into(), "api.example:6443".into())
        );
        assert_eq!(
            host_and_authority("https://api.example/x"),
            ("api.example".into(), "api.example:443".into())
        );
    }
}
