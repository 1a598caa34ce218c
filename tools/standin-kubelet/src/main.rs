//! A stand-in for kubelet in kiln's tests (upstream kubelet cannot be downloaded here).
//! It records how it was started, checks what kubelet checks first, serves `/healthz`, and
//! then completes a pretend TLS bootstrap or fails with real kubelet wording. See README.md.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod podcheck;

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
            _ => return None,
        })
    }
}

/// The kubelet flags the stand-in acts on; every flag is recorded regardless.
#[derive(Debug, Default)]
struct Flags {
    config: Option<String>,
    root_dir: String,
    runtime_endpoint: Option<String>,
    bootstrap_kubeconfig: Option<String>,
    healthz_bind: String,
    healthz_port: u16,
}

fn parse_flags(args: &[String]) -> Result<Flags, String> {
    let mut f = Flags {
        root_dir: "/var/lib/kubelet".into(),
        healthz_bind: "127.0.0.1".into(),
        healthz_port: 10248,
        ..Flags::default()
    };
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let Some(flag) = arg.strip_prefix("--") else {
            continue;
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n, v.to_string()),
            None => {
                // `--flag value`, unless the next word is another flag (a boolean flag).
                match args.get(i) {
                    Some(next) if !next.starts_with("--") => {
                        i += 1;
                        (flag, next.clone())
                    }
                    _ => (flag, String::from("true")),
                }
            }
        };
        match name {
            "config" => f.config = Some(value),
            "root-dir" => f.root_dir = value,
            "container-runtime-endpoint" => f.runtime_endpoint = Some(value),
            "bootstrap-kubeconfig" => f.bootstrap_kubeconfig = Some(value),
            "healthz-bind-address" => f.healthz_bind = value,
            "healthz-port" => {
                f.healthz_port = value
                    .parse()
                    .map_err(|_| format!("invalid value {value:?} for flag --healthz-port"))?
            }
            _ => {}
        }
    }
    Ok(f)
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

/// The `server:` of a kubeconfig, found without a YAML parser.
fn kubeconfig_server(path: Option<&str>) -> String {
    path.and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|text| {
            text.lines().find_map(|l| {
                l.trim()
                    .strip_prefix("server:")
                    .map(|s| s.trim().to_string())
            })
        })
        .unwrap_or_else(|| "https://kubernetes.default.svc:443".into())
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

/// Days since 1970-01-01 → (month, day), the civil calendar (Howard Hinnant's algorithm).
fn month_day(days: i64) -> (u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (m, d)
}

/// Prints one line in klog's header format, as kubelet does on stderr.
fn klog(severity: char, file_line: &str, msg: &str) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (mon, day) = month_day(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let line = format!(
        "{severity}{mon:02}{day:02} {:02}:{:02}:{:02}.{:06} {:>7} {file_line}] {msg}\n",
        sod / 3600,
        sod / 60 % 60,
        sod % 60,
        now.subsec_micros(),
        std::process::id(),
    );
    let _ = std::io::stderr().write_all(line.as_bytes());
}

fn command_failed(err: &str) -> ExitCode {
    let escaped = err.replace('\\', "\\\\").replace('"', "\\\"");
    klog(
        'E',
        "run.go:72",
        &format!("\"command failed\" err=\"{escaped}\""),
    );
    ExitCode::from(1)
}

/// Writes `data` to `path` through a temp file and rename, so readers never see half a file.
fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn record(root_dir: &Path, args: &[String]) -> std::io::Result<()> {
    let dir = root_dir.join("standin");
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

fn serve_healthz(listener: TcpListener) {
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || answer(stream));
    }
}

fn answer(mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 2048];
    let mut used = 0;
    while used < buf.len() {
        match stream.read(&mut buf[used..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => used += n,
        }
        if buf[..used].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..used]);
    let path = head.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = if path == "/healthz" || path.starts_with("/healthz?") {
        ("200 OK", "ok")
    } else {
        ("404 Not Found", "404 page not found\n")
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(resp.as_bytes());
}

fn env_ms(vars: &BTreeMap<String, String>, key: &str, default: u64) -> Duration {
    let ms = std::env::var(key)
        .ok()
        .or_else(|| vars.get(key).cloned())
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    Duration::from_millis(ms)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--version") {
        println!("Kubernetes v0.0.0-kiln-standin");
        return ExitCode::SUCCESS;
    }
    let flags = match parse_flags(&args) {
        Ok(f) => f,
        Err(e) => return command_failed(&e),
    };
    let root_dir = PathBuf::from(&flags.root_dir);
    if let Err(e) = record(&root_dir, &args) {
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
    klog(
        'I',
        "server.go:530",
        "\"Kubelet version\" kubeletVersion=\"v0.0.0-kiln-standin\"",
    );

    match &flags.config {
        Some(path) if !Path::new(path).is_file() => {
            return command_failed(&format!(
                "failed to load kubelet config file, path: {path}, error: failed to load Kubelet config file {path}, error failed to read kubelet config file \"{path}\", error: open {path}: no such file or directory"
            ));
        }
        _ => {}
    }
    if let Some(endpoint) = &flags.runtime_endpoint {
        if let Err(e) = check_runtime(endpoint, env_ms(&conf, "STANDIN_RUNTIME_WAIT_MS", 10_000)) {
            return command_failed(&e);
        }
    }

    let server = kubeconfig_server(flags.bootstrap_kubeconfig.as_deref());
    let (host, authority) = host_and_authority(&server);
    let csr = format!(
        "failed to run Kubelet: cannot create certificate signing request: Post \"{server}/apis/certificates.k8s.io/v1/certificatesigningrequests\""
    );
    match mode {
        Mode::Success => {}
        Mode::X509 => {
            return command_failed(&format!(
                "{csr}: tls: failed to verify certificate: x509: certificate signed by unknown authority"
            ))
        }
        Mode::Unauthorized => {
            return command_failed(
                "failed to run Kubelet: cannot create certificate signing request: Unauthorized",
            )
        }
        Mode::Dns => {
            return command_failed(&format!(
                "{csr}: dial tcp: lookup {host} on 127.0.0.53:53: no such host"
            ))
        }
        Mode::Refused => {
            return command_failed(&format!(
                "{csr}: dial tcp {authority}: connect: connection refused"
            ))
        }
        Mode::Timeout => {
            return command_failed(&format!("{csr}: dial tcp {authority}: i/o timeout"))
        }
        Mode::Swap => {
            return command_failed(
                "failed to run Kubelet: running with swap on is not supported, please disable swap! or set --fail-swap-on flag to false. /proc/swaps contained: [Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority /swapfile                               file\t\t1048572\t\t0\t\t-2]",
            )
        }
        Mode::Cgroup => {
            return command_failed(
                "failed to run Kubelet: misconfiguration: kubelet cgroup driver: \"systemd\" is different from docker cgroup driver: \"cgroupfs\"",
            )
        }
        Mode::DiskFull => {
            return command_failed(&format!(
                "failed to run Kubelet: write {}/pki/kubelet-client.key.tmp: no space left on device",
                flags.root_dir
            ))
        }
        Mode::Exit => return command_failed("failed to run Kubelet: stand-in asked to exit"),
    }

    let listener = match TcpListener::bind((flags.healthz_bind.as_str(), flags.healthz_port)) {
        Ok(l) => l,
        Err(e) => {
            return command_failed(&format!(
                "failed to run Kubelet: listen tcp {}:{}: bind: {e}",
                flags.healthz_bind, flags.healthz_port
            ))
        }
    };
    std::thread::spawn(move || serve_healthz(listener));
    klog(
        'I',
        "server.go:180",
        &format!(
            "\"Starting to listen\" address=\"{}\" port={}",
            flags.healthz_bind, flags.healthz_port
        ),
    );

    std::thread::sleep(env_ms(&conf, "STANDIN_JOIN_DELAY_MS", 500));
    // The boot tests' real pod (podcheck.rs): joined only once it ran.
    if let Some(check) = conf.get("STANDIN_POD_CHECK") {
        let driver = flags
            .config
            .as_deref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|t| podcheck::cgroup_driver(&t))
            .unwrap_or_else(|| "cgroupfs".into());
        let endpoint = flags
            .runtime_endpoint
            .as_deref()
            .unwrap_or("unix:///run/containerd/containerd.sock");
        klog(
            'I',
            "podcheck.go:1",
            &format!("\"Running the boot test's pod\" check={check:?} cgroupDriver={driver:?}"),
        );
        if let Err(e) = podcheck::run(&podcheck::command_line(check, endpoint, &driver)) {
            return command_failed(&format!("failed to run Kubelet: stand-in pod check: {e}"));
        }
    }
    let cert = root_dir.join("pki").join("kubelet-client-current.pem");
    // PEM-framed like the real file, because kiln-firstboot checks for a certificate block;
    // the block's payload is only the base64 of "kiln stand-in kubelet: not a real certificate".
    let pem = format!(
        "# kiln stand-in kubelet: not a real certificate; written to act out a completed TLS bootstrap against {server}\n\
         -----BEGIN CERTIFICATE-----\na2lsbiBzdGFuZC1pbiBrdWJlbGV0OiBub3QgYSByZWFsIGNlcnRpZmljYXRl\n-----END CERTIFICATE-----\n"
    );
    if let Err(e) = write_atomic(&cert, pem.as_bytes()) {
        return command_failed(&format!(
            "failed to run Kubelet: write {}: {e}",
            cert.display()
        ));
    }
    klog(
        'I',
        "certificate_manager.go:356",
        "\"kubernetes.io/kube-apiserver-client-kubelet: Certificate rotation is enabled\"",
    );
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_both_forms() {
        let args: Vec<String> = [
            "--config=/c.yaml",
            "--root-dir",
            "/r",
            "--healthz-port=0",
            "--v=2",
            "--container-runtime-endpoint",
            "unix:///s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let f = parse_flags(&args).unwrap();
        assert_eq!(f.config.as_deref(), Some("/c.yaml"));
        assert_eq!(f.root_dir, "/r");
        assert_eq!(f.healthz_port, 0);
        assert_eq!(f.runtime_endpoint.as_deref(), Some("unix:///s"));
    }

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

    #[test]
    fn civil_dates() {
        assert_eq!(month_day(0), (1, 1));
        assert_eq!(month_day(19_723), (1, 1)); // 2024-01-01
        assert_eq!(month_day(19_782), (2, 29)); // 2024-02-29
    }
}
