//! `kiln-firstboot doctor` on the real binary, each check once on a healthy and once on a
//! broken root: a faked /proc and /sys under `--root`, a real TLS server (`openssl
//! s_server`) with a test CA made by `openssl`, Debian's real containerd answering CRI on a
//! socket inside the root, a loopback metadata stand-in whose `Date` header plays the
//! provider's clock, and a real tmpfs for a full disk.

// Unix sockets, openssl, containerd and mount: the Windows build does not run these.
#![cfg(unix)]

use crate::common;
#[path = "../../testkit/containerd.rs"]
mod containerd_run;
#[path = "../../testkit/optout.rs"]
mod optout;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Outcome, Reply, Root, Server, TOKEN};
use kiln_firstboot::doctor::net::imf_fixdate;
use kiln_firstboot::json::{self, Value};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (make deps installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA and the certificates it issues, under one directory.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.dir.join("ca.crt")).unwrap()
    }

    /// An EC P-256 leaf `name` with `san` (openssl's subjectAltName syntax), valid `days`
    /// (0: it expires the second it is made); returns (cert, key) paths.
    fn leaf(&self, name: &str, cn: &str, san: &str, days: &str) -> (PathBuf, PathBuf) {
        let (crt, key, csr) = (
            format!("{name}.crt"),
            format!("{name}.key"),
            format!("{name}.csr"),
        );
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={cn}"),
            ],
        );
        std::fs::write(
            self.dir.join(format!("{name}.ext")),
            format!("subjectAltName={san}\n"),
        )
        .unwrap();
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                days,
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
        (self.dir.join(crt), self.dir.join(key))
    }
}

impl Pki {
    /// A new RSA CA whose subject is `/CN=<name>-ca`.
    fn new_named(root: &Root, name: &str) -> Pki {
        let dir = root.path(&format!("pki-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "30",
                "-subj",
                &format!("/CN={name}-ca"),
            ],
        );
        Pki { dir }
    }
}

/// A process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `openssl s_server` on a free loopback port with `cert`/`key` and `extra` flags.
fn tls_server(cert: &Path, key: &Path, extra: &[&str]) -> (Proc, u16) {
    let port = free_port();
    let child = Command::new("openssl")
        .args([
            "s_server",
            "-quiet",
            "-accept",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("-cert")
        .arg(cert)
        .arg("-key")
        .arg(key)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_server");
    let p = Proc(child);
    let until = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < until,
            "openssl s_server never listened on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (p, port)
}

/// Debian's containerd with its CRI plugin, its socket at `run/containerd/containerd.sock`
/// inside the root; a CNI conflist in its conf dir when `cni`.
fn containerd(root: &Root, cni: bool) -> Option<Proc> {
    let Ok(_) = which("containerd") else {
        optout::cannot_run(
            "containerd",
            "no containerd on PATH (make deps installs it)",
        );
        return None;
    };
    let d = root.path("containerd");
    std::fs::create_dir_all(d.join("cni")).unwrap();
    std::fs::create_dir_all(root.path("run/containerd")).unwrap();
    if cni {
        std::fs::write(
            d.join("cni/10-bridge.conflist"),
            r#"{"cniVersion":"1.0.0","name":"test","plugins":[{"type":"bridge","bridge":"kiln0","ipam":{"type":"host-local","subnet":"10.88.0.0/16"}}]}"#,
        )
        .unwrap();
    }
    let sock = root.path("run/containerd/containerd.sock");
    let cfg = format!(
        "version = 2\nroot = \"{0}/lib\"\nstate = \"{0}/state\"\n[grpc]\n  address = \"{1}\"\n[ttrpc]\n  address = \"{1}.ttrpc\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".cni]\n  conf_dir = \"{0}/cni\"\n  bin_dir = \"{0}/bin\"\n",
        d.display(),
        sock.display()
    );
    std::fs::write(d.join("config.toml"), cfg).unwrap();
    let p = Proc(containerd_run::start(
        &d.join("config.toml"),
        &sock,
        &d.join("log"),
        &[],
    ));
    Some(p)
}

/// Points node.env's `API_SERVER` (https://127.0.0.1:6443 from `Root::node_env`) at `port`.
fn api_server_on(root: &Root, port: impl std::fmt::Display) {
    let env = root
        .read("etc/kiln/node.env")
        .replace("127.0.0.1:6443", &format!("127.0.0.1:{port}"));
    root.write("etc/kiln/node.env", &env);
}

/// A tmpfs of `size` mounted on `dir`, unmounted when dropped; `None` (after recording the
/// opt-out, or failing the test) when this environment cannot mount.
fn tmpfs(dir: &Path, size: &str) -> Option<Unmount> {
    std::fs::create_dir_all(dir).unwrap();
    let m = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir)
        .output()
        .unwrap();
    if !m.status.success() {
        optout::cannot_run(
            "root",
            &format!("mount tmpfs: {}", String::from_utf8_lossy(&m.stderr)),
        );
        return None;
    }
    Some(Unmount(dir.to_path_buf()))
}

struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn which(name: &str) -> Result<PathBuf, ()> {
    ["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .ok_or(())
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A metadata stand-in whose clock is `skew` seconds off the node's.
fn metadata_clock(skew: i64) -> Server {
    Server::start(move |_| {
        Reply::Http(
            200,
            vec![("Date".into(), imf_fixdate(now() + skew))],
            b"ok".to_vec(),
        )
    })
}

/// The host side of a node that works: no swap, cgroup v2, both sysctls, the systemd driver
/// on both sides, a well-formed token, the cluster CA.
fn healthy(root: &Root, pki: &Pki) {
    root.write(
        "proc/swaps",
        "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n",
    );
    root.write(
        "sys/fs/cgroup/cgroup.controllers",
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    );
    root.write("proc/sys/net/bridge/bridge-nf-call-iptables", "1\n");
    root.write("proc/sys/net/ipv4/ip_forward", "1\n");
    root.write("usr/lib/kiln/kubelet-config.yaml", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n");
    root.write("usr/lib/kiln/containerd/config.toml", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n");
    root.write("etc/kiln/ca.crt", &pki.ca_pem());
    root.write_mode("etc/kiln/bootstrap-token", &format!("{TOKEN}\n"), 0o600);
    std::fs::create_dir_all(root.path("var/lib")).unwrap();
}

fn doctor(root: &Root, metadata: &str) -> (Outcome, Value) {
    let o = Outcome::of(
        Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"))
            .args(["doctor", "--json", "--metadata-url", metadata, "--root"])
            .arg(&root.dir),
    );
    let v = json::parse(o.stdout.trim()).unwrap_or_else(|e| panic!("doctor --json: {e}: {o:?}"));
    (o, v)
}

/// (verdict, detail, remedy) of check `name`.
fn check(v: &Value, name: &str) -> (String, String, String) {
    let c = v
        .get("checks")
        .and_then(Value::as_array)
        .unwrap()
        .iter()
        .find(|c| c.get("name").and_then(Value::as_text) == Some(name))
        .unwrap_or_else(|| panic!("no check {name} in {v:?}"));
    let t = |k: &str| c.get(k).and_then(Value::as_text).unwrap_or("").to_string();
    (t("verdict"), t("detail"), t("remedy"))
}

#[test]
fn a_healthy_node_passes_every_check() {
    let root = Root::node("");
    let pki = Pki::new_named(&root, "cluster");
    healthy(&root, &pki);
    // /var/lib on its own empty 64 MiB tmpfs: the disk check measures a file system the test
    // controls, not how full this machine's disk happens to be.
    let Some(_var_lib) = tmpfs(&root.path("var/lib"), "64m") else {
        return;
    };
    let (cert, key) = pki.leaf(
        "apiserver",
        "kube-apiserver",
        "IP:127.0.0.1,DNS:kubernetes",
        "10",
    );
    let (_srv, port) = tls_server(&cert, &key, &[]);
    root.node_env("HTTPS_PROXY=http://proxy.example:3128\nNO_PROXY=169.254.169.254,10.0.0.0/8\n");
    // node_env writes API_SERVER=https://127.0.0.1:6443; point it at the TLS server.
    api_server_on(&root, port);
    let (client, _) = pki.leaf("kubelet", "system:node:n1", "DNS:n1", "365");
    root.write(
        "var/lib/kubelet/pki/kubelet-client-current.pem",
        &std::fs::read_to_string(client).unwrap(),
    );
    let Some(_ctr) = containerd(&root, true) else {
        return;
    };
    let meta = metadata_clock(0);
    // containerd loads the CNI config asynchronously: give NetworkReady a few seconds.
    let until = Instant::now() + Duration::from_secs(30);
    let (o, v) = loop {
        let (o, v) = doctor(&root, &meta.url);
        if check(&v, "cri").0 == "ok" || Instant::now() > until {
            break (o, v);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    for name in [
        "clock",
        "swap",
        "cgroup-v2",
        "cgroup-driver",
        "br-netfilter",
        "ip-forward",
        "proxy",
        "api-server",
        "api-server-cert",
        "bootstrap-credential",
        "kubelet-client-cert",
        "cri",
    ] {
        let (verdict, detail, _) = check(&v, name);
        assert_eq!(verdict, "ok", "{name}: {detail}\n{}", o.stdout);
    }
    let (verdict, detail, _) = check(&v, "disk");
    assert_eq!(verdict, "ok", "disk: {detail}");
    assert!(detail.contains(" MiB free of 64 MiB ("), "{detail}");
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        !o.stdout.contains(TOKEN.split('.').nth(1).unwrap()),
        "the token's secret leaked: {}",
        o.stdout
    );
}

#[test]
fn a_broken_node_fails_each_check_with_a_remedy() {
    let root = Root::node("");
    let pki = Pki::new_named(&root, "cluster");
    root.write(
        "proc/swaps",
        "Filename\tType\tSize\tUsed\tPriority\n/swapfile  file  1048572  0  -2\n",
    );
    std::fs::create_dir_all(root.path("sys/fs/cgroup/memory")).unwrap(); // v1: no cgroup.controllers
    root.write("proc/sys/net/ipv4/ip_forward", "0\n");
    root.write(
        "usr/lib/kiln/kubelet-config.yaml",
        "kind: KubeletConfiguration\ncgroupDriver: cgroupfs\n",
    );
    root.write(
        "usr/lib/kiln/containerd/config.toml",
        "version = 2\n  SystemdCgroup = true\n",
    );
    root.write("etc/kiln/ca.crt", &pki.ca_pem());
    root.write_mode(
        "etc/kiln/bootstrap-token",
        "not-a-token-but-a-secret-value\n",
        0o600,
    );
    let (client, _) = pki.leaf("kubelet", "system:node:n1", "DNS:n1", "0");
    root.write(
        "var/lib/kubelet/pki/kubelet-client-current.pem",
        &std::fs::read_to_string(client).unwrap(),
    );
    let closed = free_port();
    // The API server is on loopback (which Go never proxies) so the test sends nothing off
    // the machine; the metadata address is only matched against NO_PROXY, never contacted.
    root.node_env("HTTPS_PROXY=http://proxy.example:3128\nNO_PROXY=.svc\n");
    api_server_on(&root, closed);
    let meta = metadata_clock(3600);
    std::thread::sleep(Duration::from_millis(1100)); // the 0-day certificate is now expired
    let (o, v) = doctor(&root, &meta.url);
    let (verdict, detail, remedy) = check(&v, "proxy");
    assert_eq!(verdict, "fail", "{detail}");
    assert!(
        detail.contains("metadata address 169.254.169.254") && !detail.contains("API server"),
        "{detail}"
    );
    assert!(remedy.contains("NO_PROXY"), "{remedy}");
    let expect = [
        ("clock", " s behind"),
        ("swap", "swap is on (/swapfile)"),
        ("cgroup-v2", "cgroup v1"),
        ("cgroup-driver", "cgroupDriver cgroupfs"),
        ("br-netfilter", "br_netfilter module is not loaded"),
        ("ip-forward", "ip_forward = 0"),
        ("api-server", &format!("127.0.0.1:{closed}")),
        ("bootstrap-credential", "not a bootstrap token"),
        ("kubelet-client-cert", "expired at"),
        ("cri", "containerd is not running"),
    ];
    for (name, needle) in expect {
        let (verdict, detail, remedy) = check(&v, name);
        assert_eq!(verdict, "fail", "{name}: {detail}");
        assert!(
            detail.contains(needle),
            "{name}: {detail:?} lacks {needle:?}"
        );
        assert!(!remedy.is_empty(), "{name} has no remedy");
    }
    assert_eq!(o.code, 9, "{o:?}");
    assert!(
        !o.stdout.contains("secret-value"),
        "the credential leaked: {}",
        o.stdout
    );
    // The table carries the same verdicts and a remedy under each failure.
    let t = Outcome::of(
        Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"))
            .args(["doctor", "--root"])
            .arg(&root.dir),
    );
    assert_eq!(t.code, 9);
    assert!(
        t.stdout.contains("swap ") && t.stdout.contains("remedy: disable swap"),
        "{}",
        t.stdout
    );
    assert!(t.stdout.contains(" fail, "), "{}", t.stdout);
}

#[test]
fn api_server_certificate_faults_are_named() {
    let root = Root::node("");
    let pki = Pki::new_named(&root, "cluster");
    let other = Pki::new_named(&root, "intercepting-proxy");
    healthy(&root, &pki);
    let cases: Vec<(&str, PathBuf, PathBuf, &[&str], &str)> = {
        let (a, ak) = pki.leaf(
            "wrongname",
            "kube-apiserver",
            "DNS:kubernetes.default.svc",
            "10",
        );
        let (b, bk) = pki.leaf("expired", "kube-apiserver", "IP:127.0.0.1", "0");
        let (c, ck) = other.leaf("mitm", "kube-apiserver", "IP:127.0.0.1", "10");
        let (d, dk) = pki.leaf("tls13", "kube-apiserver", "IP:127.0.0.1", "10");
        vec![
            (
                "api-server-cert",
                a,
                ak,
                &[],
                "names kubernetes.default.svc, not 127.0.0.1",
            ),
            ("api-server-cert", b, bk, &[], "expired at"),
            (
                "api-server-cert",
                c,
                ck,
                &[],
                "issued by a CA not in /etc/kiln/ca.crt",
            ),
            ("api-server", d, dk, &["-tls1_3"], "only TLS 1.3"),
        ]
    };
    std::thread::sleep(Duration::from_millis(1100));
    for (name, cert, key, extra, needle) in cases {
        let (_srv, port) = tls_server(&cert, &key, extra);
        root.node_env("");
        api_server_on(&root, port);
        let (_, v) = doctor(&root, "http://127.0.0.1:1");
        let (verdict, detail, remedy) = check(&v, name);
        assert_eq!(verdict, "fail", "{needle}: {detail}");
        assert!(detail.contains(needle), "{detail:?} lacks {needle:?}");
        assert!(!remedy.is_empty());
    }
    // A port that speaks plain HTTP is not TLS.
    let http = Server::start(|_| common::ok("ok"));
    let port = http.url.rsplit(':').next().unwrap().to_string();
    root.node_env("");
    api_server_on(&root, port);
    let (_, v) = doctor(&root, "http://127.0.0.1:1");
    let (verdict, detail, _) = check(&v, "api-server");
    assert_eq!(verdict, "fail");
    assert!(detail.contains("TCP connects, but TLS"), "{detail}");
}

#[test]
fn cri_network_not_ready_is_named_and_a_non_cri_socket_is_refused() {
    let root = Root::node("");
    let Some(ctr) = containerd(&root, false) else {
        return;
    };
    let (_, v) = doctor(&root, "http://127.0.0.1:1");
    let (verdict, detail, remedy) = check(&v, "cri");
    assert_eq!(verdict, "fail", "{detail}");
    assert!(
        detail.contains("NetworkReady=false") && detail.contains("cni plugin not initialized"),
        "{detail}"
    );
    assert!(remedy.contains("CNI"), "{remedy}");
    drop(ctr);
    // Something else listening on the socket: it answers, but not HTTP/2.
    let sock = root.path("run/containerd/containerd.sock");
    let _ = std::fs::remove_file(&sock);
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let t = std::thread::spawn(move || {
        use std::io::Write;
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    let (_, v) = doctor(&root, "http://127.0.0.1:1");
    let (verdict, detail, _) = check(&v, "cri");
    assert_eq!(verdict, "fail", "{detail}");
    t.join().unwrap();
}

#[test]
fn the_clock_is_judged_against_the_metadata_date() {
    let root = Root::node("");
    // The header has whole seconds, so the measured offset may be a second off the skew.
    for (skew, verdict) in [(0, "ok"), (-40, "warn"), (-900, "fail"), (400, "fail")] {
        let meta = metadata_clock(skew);
        let (_, v) = doctor(&root, &meta.url);
        let (got, detail, _) = check(&v, "clock");
        assert_eq!(got, verdict, "{skew}: {detail}");
        if skew == 0 {
            assert!(detail.contains("agrees within a second"), "{detail}");
            continue;
        }
        let word = if skew < 0 { " s ahead" } else { " s behind" };
        let n: i64 = detail
            .split(word)
            .next()
            .and_then(|h| h.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{detail}"));
        assert!((n - skew.abs()).abs() <= 1, "{skew}: {detail}");
    }
    // No Date header, and no answer: the clock is not judged at all.
    let meta = Server::start(|_| common::ok("ok"));
    let (_, v) = doctor(&root, &meta.url);
    assert_eq!(check(&v, "clock").0, "skip");
}

#[test]
fn a_nearly_full_var_lib_fails_the_disk_check() {
    let root = Root::node("");
    let dir = root.path("var/lib");
    let Some(_u) = tmpfs(&dir, "1m") else {
        return;
    };
    std::fs::write(dir.join("fill"), vec![0u8; 960 * 1024]).unwrap();
    let (_, v) = doctor(&root, "http://127.0.0.1:1");
    let (verdict, detail, remedy) = check(&v, "disk");
    assert_eq!(verdict, "fail", "{detail}");
    assert!(
        detail.starts_with("/var/lib: 0 MiB free of 1 MiB"),
        "{detail}"
    );
    assert!(remedy.contains("nodefs.available<10%"), "{remedy}");
}

#[test]
fn a_failed_run_carries_the_doctors_findings_to_status_json_and_the_console() {
    let root = Root::node("");
    // Swap on, and a metadata service that refuses connections: the run fails in metadata.
    root.write(
        "proc/swaps",
        "Filename\tType\tSize\tUsed\tPriority\n/dev/vda3  partition  1048572  0  -2\n",
    );
    let closed = format!("http://127.0.0.1:{}", free_port());
    let o = common::firstboot(
        &root,
        &[
            "--provider",
            "aws",
            "--metadata-url",
            &closed,
            "--deadline",
            "3",
            "--no-start",
        ],
    );
    assert_eq!(o.code, 4, "{o:?}");
    let status = json::parse(&root.read("run/kiln/status.json")).unwrap();
    let doctor = status
        .get("doctor")
        .unwrap_or_else(|| panic!("no doctor in {status:?}"));
    assert_eq!(doctor.get("result").and_then(Value::as_text), Some("fail"));
    let checks = doctor.get("checks").and_then(Value::as_array).unwrap();
    assert!(
        checks
            .iter()
            .all(|c| c.get("verdict").and_then(Value::as_text) != Some("ok")),
        "only problems: {checks:?}"
    );
    let swap = checks
        .iter()
        .find(|c| c.get("name").and_then(Value::as_text) == Some("swap"))
        .expect("the swap finding");
    assert!(swap
        .get("detail")
        .and_then(Value::as_text)
        .unwrap()
        .contains("/dev/vda3"));
    let console = root.read("console.log");
    assert!(
        console.contains("kiln-firstboot: doctor: fail swap: swap is on (/dev/vda3)"),
        "{console}"
    );
    assert!(console.contains("(remedy: disable swap"), "{console}");
}

#[test]
fn a_server_that_trickles_its_handshake_is_cut_off() {
    // A record header, then one byte a second for ever: each read succeeds, the whole
    // handshake never ends. doctor gives up at twice its 3 s timeout and says so.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::Write;
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.write_all(&[22, 3, 3, 0x40, 0]);
            while s.write_all(&[2]).is_ok() {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    });
    let root = Root::node("");
    root.node_env("");
    api_server_on(&root, port);
    let (_, v) = doctor(&root, "http://127.0.0.1:1");
    let (verdict, detail, _) = check(&v, "api-server");
    assert_eq!(verdict, "fail", "{detail}");
    assert!(detail.contains("the handshake took too long"), "{detail}");
}

#[test]
fn an_unreadable_client_certificate_is_named_not_called_missing() {
    // A link to an endless device: read up to the 1 MiB cap, then refused by name.
    let root = Root::node("");
    let pem = root.path("var/lib/kubelet/pki/kubelet-client-current.pem");
    std::fs::create_dir_all(pem.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &pem).unwrap();
    let (_, v) = doctor(&root, "http://127.0.0.1:1");
    let (verdict, detail, remedy) = check(&v, "kubelet-client-cert");
    assert_eq!(verdict, "fail", "{detail}");
    assert!(
        detail.contains("kubelet-client-current.pem") && detail.contains("at most 1048576 bytes"),
        "{detail}"
    );
    assert!(remedy.contains("restart kubelet"), "{remedy}");
}

#[test]
fn the_serving_certificate_is_checked_only_when_the_cluster_signs_it() {
    const CLIENT: &str = "var/lib/kubelet/pki/kubelet-client-current.pem";
    const SERVING: &str = "var/lib/kubelet/pki/kubelet-server-current.pem";
    let root = Root::node("");
    let pki = Pki::new_named(&root, "cluster");
    let (client, _) = pki.leaf("kubelet", "system:node:n1", "DNS:n1", "365");
    let verdict = |root: &Root| {
        let (_, v) = doctor(root, "http://127.0.0.1:1");
        check(&v, "kubelet-serving-cert")
    };
    // Switch off: kubelet's own configuration decides, there is nothing to expect.
    root.node_env("");
    root.write(CLIENT, &std::fs::read_to_string(&client).unwrap());
    let (v, detail, _) = verdict(&root);
    assert_eq!(v, "skip", "{detail}");
    assert!(detail.contains("KUBELET_SERVER_TLS_BOOTSTRAP"), "{detail}");
    // On, joined, nothing signed yet: the pending CSR, and how to approve it.
    root.node_env("KUBELET_SERVER_TLS_BOOTSTRAP=true\n");
    let (v, detail, remedy) = verdict(&root);
    assert_eq!(v, "warn", "{detail}");
    assert!(detail.contains("kubelet-server-current.pem"), "{detail}");
    assert!(remedy.contains("kubectl certificate approve"), "{remedy}");
    // Signed: ok, with its expiry.
    let (serving, _) = pki.leaf("serving", "system:node:n1", "DNS:n1,IP:10.0.3.7", "30");
    root.write(SERVING, &std::fs::read_to_string(&serving).unwrap());
    let (v, detail, _) = verdict(&root);
    assert_eq!(v, "ok", "{detail}");
    assert!(detail.contains("system:node:n1 valid until"), "{detail}");
    // Not a certificate, or an endless device in its place: named, not called missing.
    root.write(SERVING, "not a certificate\n");
    assert_eq!(verdict(&root).0, "fail");
    std::fs::remove_file(root.path(SERVING)).unwrap();
    std::os::unix::fs::symlink("/dev/zero", root.path(SERVING)).unwrap();
    let (v, detail, _) = verdict(&root);
    assert_eq!(v, "fail", "{detail}");
    assert!(detail.contains("at most 1048576 bytes"), "{detail}");
    // Not joined yet: no serving certificate is asked for before the client one.
    std::fs::remove_file(root.path(CLIENT)).unwrap();
    assert_eq!(verdict(&root).0, "skip");
}

/// A run that read its metadata and then failed hands the doctor the metadata service's
/// `Date` it saw: the clock is judged on that (here an hour off) and the doctor sends the
/// service nothing more (every request it got is the run's: the token PUT and GETs that carry
/// the token).
#[test]
fn a_failed_runs_doctor_judges_the_clock_the_run_saw_and_asks_nothing() {
    let root = Root::node("Amazon EC2");
    let base = common::fixtures().join("aws");
    let token = std::fs::read_to_string(base.join("latest/api/token")).unwrap();
    let srv = Server::start(kiln_firstboot::standin::aws_imdsv2(
        token.clone(),
        move |r| {
            let date = vec![("Date".to_string(), imf_fixdate(now() + 3600))];
            common::fixture_reply(&base, &date, r)
        },
    ));
    let systemctl = root.stub(
        "systemctl",
        "echo 'Unit kubelet.service not found.' >&2; exit 5",
    );
    let o = common::firstboot(
        &root,
        &[
            "--metadata-url",
            &srv.url,
            "--systemctl",
            &systemctl,
            "--deadline",
            "10",
        ],
    );
    assert_eq!(o.code, 6, "{o:?}");
    let status = json::parse(&root.read("run/kiln/status.json")).unwrap();
    let checks = status
        .get("doctor")
        .and_then(|d| d.get("checks"))
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("no doctor checks in {status:?}"));
    let clock = checks
        .iter()
        .find(|c| c.get("name").and_then(Value::as_text) == Some("clock"))
        .unwrap_or_else(|| panic!("no clock finding in {checks:?}"));
    let detail = clock.get("detail").and_then(Value::as_text).unwrap();
    assert_eq!(
        clock.get("verdict").and_then(Value::as_text),
        Some("fail"),
        "{detail}"
    );
    assert!(
        detail.contains("s behind") && detail.ends_with("(seen by the run)"),
        "{detail}"
    );
    let requests = srv.requests();
    assert!(!requests.is_empty());
    for r in &requests {
        let has_token = r
            .headers
            .iter()
            .any(|(k, v)| k == "x-aws-ec2-metadata-token" && *v == token);
        assert!(
            (r.method == "PUT" && r.path == "/latest/api/token") || has_token,
            "a request the run did not make: {} {} {:?}",
            r.method,
            r.path,
            r.headers
        );
    }
}

/// The doctor reads kubelet's configuration as kubelet does: the config file, then the
/// drop-ins kiln-firstboot writes in `/run/kiln/kubelet.conf.d`, in order, a later one
/// winning (kiln writes JSON; a hand-written provisioned one may be YAML). Swap allowed only by a drop-in is a warning, not a failure;
/// a drop-in that changes the cgroup driver is named in the finding.
#[test]
fn swap_and_the_cgroup_driver_are_judged_with_the_drop_ins() {
    let root = Root::node("");
    let pki = Pki::new_named(&root, "cluster");
    healthy(&root, &pki);
    root.write(
        "proc/swaps",
        "Filename\tType\tSize\tUsed\tPriority\n/swapfile  file  1048572  0  -2\n",
    );
    let (_, v) = doctor(&root, "http://127.0.0.1:9");
    assert_eq!(check(&v, "swap").0, "fail");
    root.write(
        "run/kiln/kubelet.conf.d/10-kiln-node.conf",
        "{\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"kind\":\"KubeletConfiguration\",\"maxPods\":29}\n",
    );
    root.write(
        "run/kiln/kubelet.conf.d/50-kiln-provisioned.conf",
        "{\n  \"apiVersion\": \"kubelet.config.k8s.io/v1beta1\",\n  \"failSwapOn\": false,\n  \"kind\": \"KubeletConfiguration\"\n}\n",
    );
    let (_, v) = doctor(&root, "http://127.0.0.1:9");
    let (verdict, detail, _) = check(&v, "swap");
    assert_eq!(verdict, "warn", "{detail}");
    assert!(
        detail.contains("/run/kiln/kubelet.conf.d/50-kiln-provisioned.conf sets failSwapOn: false"),
        "{detail}"
    );
    // A YAML drop-in (a hand-written one) that puts it back and changes the driver.
    root.write(
        "run/kiln/kubelet.conf.d/50-kiln-provisioned.conf",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailSwapOn: true\ncgroupDriver: cgroupfs\n",
    );
    let (_, v) = doctor(&root, "http://127.0.0.1:9");
    assert_eq!(check(&v, "swap").0, "fail");
    let (verdict, detail, _) = check(&v, "cgroup-driver");
    assert_eq!(verdict, "fail", "{detail}");
    assert!(
        detail.contains("50-kiln-provisioned.conf says cgroupDriver cgroupfs"),
        "{detail}"
    );
}
