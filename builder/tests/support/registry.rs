//! A real OCI registry for tests (issue 16): Debian's `docker-registry` (the CNCF distribution
//! registry) started on 127.0.0.1 with TLS from a test CA (openssl) and htpasswd auth
//! (bcrypt, from `htpasswd -B`); a test image assembled here as an OCI layout (a real static
//! binary in a layer) and pushed with `skopeo`; and a proxy in front of a plain-HTTP registry
//! that plays a bearer-token auth server and injects faults (resets, 503, truncation, wrong
//! bytes). A missing tool fails the test unless opted out (testkit/optout.rs).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::sha256_hex;

#[path = "../../../testkit/optout.rs"]
mod optout;

pub const USER: &str = "kiln-puller";
pub const PASSWORD: &str = "pw-Zx81-never-printed";

/// The tools these tests need, or why not (then the test fails unless opted out).
pub fn tools_or_skip(check: &str) -> bool {
    for t in ["docker-registry", "skopeo", "openssl", "htpasswd", "umoci"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
            .unwrap_or(false);
        if !found {
            optout::cannot_run(
                check,
                &format!("`{t}` is not installed (scripts/deps.sh installs docker-registry, skopeo, umoci, apache2-utils, openssl)"),
            );
            return false;
        }
    }
    true
}

fn ok(c: &mut Command) -> Vec<u8> {
    let o = c.output().unwrap_or_else(|e| panic!("running {c:?}: {e}"));
    assert!(
        o.status.success(),
        "{c:?} failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

/// The port of a config's `addr: 127.0.0.1:PORT` line.
fn free_port_in(cfg: &str) -> u16 {
    cfg.lines()
        .find_map(|l| l.trim().strip_prefix("addr: 127.0.0.1:"))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `docker-registry`; killed (by its own pid) when dropped.
pub struct Registry {
    child: Child,
    pub host: String,
    pub dir: PathBuf,
    /// The test CA's certificate (PEM), when TLS is on.
    pub ca: Option<PathBuf>,
    /// A directory with `ca.crt` for skopeo's `--*-cert-dir`.
    pub cert_dir: Option<PathBuf>,
    /// Whether it asks for [`USER`] and [`PASSWORD`].
    pub auth: bool,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Starts a registry: TLS from a fresh test CA and htpasswd auth when `secure`, plain
    /// HTTP and anonymous otherwise (the proxy adds auth and faults in front of that one).
    pub fn start(dir: &Path, secure: bool) -> Registry {
        Registry::start_with(dir, secure, secure)
    }

    /// [`Registry::start`] with TLS and auth chosen apart: TLS without auth is a node's
    /// mirror that serves anyone who trusts its CA.
    pub fn start_with(dir: &Path, tls: bool, auth: bool) -> Registry {
        assert!(tls || !auth, "auth needs TLS");
        std::fs::create_dir_all(dir).unwrap();
        let port = free_port();
        let mut cfg = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("data").display()
        );
        let (mut ca, mut cert_dir) = (None, None);
        if tls {
            let c = dir.join("ca.pem");
            let k = dir.join("ca.key");
            ok(Command::new("openssl")
                .args([
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=kiln test CA",
                ])
                .arg("-keyout")
                .arg(&k)
                .arg("-out")
                .arg(&c));
            let sk = dir.join("server.key");
            let csr = dir.join("server.csr");
            ok(Command::new("openssl")
                .args([
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-subj",
                    "/CN=127.0.0.1",
                ])
                .arg("-keyout")
                .arg(&sk)
                .arg("-out")
                .arg(&csr));
            let ext = dir.join("san.ext");
            std::fs::write(&ext, "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n").unwrap();
            let sc = dir.join("server.pem");
            ok(Command::new("openssl")
                .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
                .arg("-in")
                .arg(&csr)
                .arg("-CA")
                .arg(&c)
                .arg("-CAkey")
                .arg(&k)
                .arg("-extfile")
                .arg(&ext)
                .arg("-out")
                .arg(&sc));
            let cd = dir.join("certs.d");
            std::fs::create_dir_all(&cd).unwrap();
            std::fs::copy(&c, cd.join("ca.crt")).unwrap();
            cfg.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                sc.display(),
                sk.display(),
            ));
            if auth {
                let pw = ok(Command::new("htpasswd").args(["-Bbn", USER, PASSWORD]));
                let htp = dir.join("htpasswd");
                std::fs::write(&htp, pw).unwrap();
                cfg.push_str(&format!(
                    "auth:\n  htpasswd:\n    realm: kiln-test\n    path: {}\n",
                    htp.display()
                ));
            }
            ca = Some(c);
            cert_dir = Some(cd);
        }
        let cfg_path = dir.join("config.yml");
        // free_port() only finds a port that was free a moment ago: another test may take it
        // before docker-registry binds it. Then our registry exits ("address already in
        // use") while the connect below reaches the other listener, so a registry counts as
        // started only if it is still running after its port answers; else a new port.
        let mut port = port;
        let mut attempt = 0;
        let (child, host) = loop {
            attempt += 1;
            let cfg = cfg.replace(
                &format!("addr: 127.0.0.1:{}", free_port_in(&cfg)),
                &format!("addr: 127.0.0.1:{port}"),
            );
            std::fs::write(&cfg_path, cfg).unwrap();
            let log = std::fs::File::create(dir.join("registry.log")).unwrap();
            let mut child = Command::new("docker-registry")
                .arg("serve")
                .arg(&cfg_path)
                .stdout(Stdio::from(log.try_clone().unwrap()))
                .stderr(Stdio::from(log))
                .spawn()
                .expect("starting docker-registry");
            let host = format!("127.0.0.1:{port}");
            let deadline = Instant::now() + Duration::from_secs(30);
            while TcpStream::connect(&host).is_err() && child.try_wait().unwrap().is_none() {
                assert!(
                    Instant::now() < deadline,
                    "docker-registry did not listen on {host}: {}",
                    std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            std::thread::sleep(Duration::from_millis(200));
            if child.try_wait().unwrap().is_none() {
                break (child, host);
            }
            assert!(
                attempt < 5,
                "docker-registry exited on {host} five times: {}",
                std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
            );
            port = free_port();
        };
        Registry {
            child,
            host,
            dir: dir.to_path_buf(),
            ca,
            cert_dir,
            auth,
        }
    }

    /// Pushes every image of an OCI layout (`oci:LAYOUT:tag`) with skopeo, digests preserved.
    pub fn push(&self, layout: &Path, tag: &str, repo: &str) {
        let mut c = Command::new("skopeo");
        c.args(["copy", "--all", "--preserve-digests", "--quiet"]);
        match &self.cert_dir {
            Some(d) => {
                c.arg("--dest-cert-dir").arg(d);
                if self.auth {
                    c.arg(format!("--dest-creds={USER}:{PASSWORD}"));
                }
            }
            None => {
                c.arg("--dest-tls-verify=false");
            }
        }
        c.arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{repo}:{tag}", self.host));
        ok(&mut c);
    }
}

/// A docker `config.json` with credentials for `host`.
pub fn docker_config(dir: &Path, host: &str, user: &str, password: &str) -> PathBuf {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let p = dir.join("config.json");
    std::fs::write(
        &p,
        format!(r#"{{"auths":{{"{host}":{{"auth":"{auth}"}}}}}}"#),
    )
    .unwrap();
    p
}

/// A test image as an OCI layout: per platform, one gzip layer holding `/pause` (a real
/// static binary for amd64, stand-in bytes elsewhere) and a config naming the platform.
#[derive(Debug)]
pub struct TestImage {
    pub layout: PathBuf,
    pub index_digest: String,
    /// `(os, arch, manifest digest, [config digest, layer digest])`.
    pub platforms: Vec<(String, String, String, Vec<String>)>,
}

fn put_blob(layout: &Path, bytes: &[u8]) -> (String, usize) {
    let hex = sha256_hex(bytes);
    std::fs::write(layout.join("blobs/sha256").join(&hex), bytes).unwrap();
    (format!("sha256:{hex}"), bytes.len())
}

/// Builds the test image for `platforms` (`(arch, pause binary bytes)`, os linux).
pub fn build_image(layout: &Path, tag: &str, platforms: &[(&str, Vec<u8>)]) -> TestImage {
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let mut entries = Vec::new();
    let mut out = Vec::new();
    for (arch, bin) in platforms {
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(bin.len() as u64);
        h.set_mode(0o755);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, "pause", &bin[..]).unwrap();
        let raw = tar.into_inner().unwrap();
        let diff_id = format!("sha256:{}", sha256_hex(&raw));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&raw).unwrap();
        let layer = gz.finish().unwrap();
        let (ld, ls) = put_blob(layout, &layer);
        let config = format!(
            r#"{{"architecture":"{arch}","os":"linux","config":{{"Entrypoint":["/pause"]}},"rootfs":{{"type":"layers","diff_ids":["{diff_id}"]}}}}"#
        );
        let (cd, cs) = put_blob(layout, config.as_bytes());
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{cd}","size":{cs}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{ld}","size":{ls}}}]}}"#
        );
        let (md, ms) = put_blob(layout, manifest.as_bytes());
        entries.push(format!(
            r#"{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{md}","size":{ms},"platform":{{"architecture":"{arch}","os":"linux"}}}}"#
        ));
        out.push(("linux".to_string(), arch.to_string(), md, vec![cd, ld]));
    }
    let index = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{}]}}"#,
        entries.join(",")
    );
    let (id, is) = put_blob(layout, index.as_bytes());
    std::fs::write(
        layout.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"{id}","size":{is},"annotations":{{"org.opencontainers.image.ref.name":"{tag}"}}}}]}}"#
        ),
    )
    .unwrap();
    TestImage {
        layout: layout.to_path_buf(),
        index_digest: id,
        platforms: out,
    }
}

/// An `[[image]]` lock entry for `reference` pinning `img` (the first platform with its
/// manifest digest, the second without) .
pub fn image_entry(reference: &str, img: &TestImage) -> String {
    let mut plats = Vec::new();
    for (i, (os, arch, md, _)) in img.platforms.iter().take(2).enumerate() {
        if i == 0 {
            plats.push(format!(
                r#"{{ os = "{os}", arch = "{arch}", digest = "{md}" }}"#
            ));
        } else {
            plats.push(format!(r#"{{ os = "{os}", arch = "{arch}" }}"#));
        }
    }
    format!(
        "\n[[image]]\nname = \"pause\"\nreference = \"{reference}\"\ndigest = \"{}\"\nverified = \"test image built by the test\"\nplatforms = [{}]\n",
        img.index_digest,
        plats.join(", ")
    )
}

/// A misbehaviour of the proxy for one request whose path contains a pattern.
#[derive(Debug, Clone)]
pub enum ProxyFault {
    /// Answer this status.
    Status(u16),
    /// Send the head and this many body bytes, then reset the connection.
    ResetAfter(usize),
    /// Send the head (full Content-Length) and this many body bytes, then close.
    TruncateAfter(usize),
    /// Send the right length with every byte inverted.
    WrongBytes,
    /// Forward with the registry's own `Host`, so an upload `Location` names another origin.
    ForeignLocation,
}

#[derive(Default)]
struct ProxyState {
    faults: Mutex<VecDeque<(String, ProxyFault)>>,
    always: Mutex<Vec<(String, ProxyFault)>>,
    log: Mutex<Vec<(String, u16)>>,
    auth_seen: Mutex<Vec<String>>,
    stop: AtomicBool,
}

/// A proxy in front of a plain-HTTP registry: a bearer-token server (`/token`, which wants
/// Basic credentials) and faults on demand.
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<ProxyState>,
}

const TOKEN: &str = "tok-4c1d-secret";

impl Proxy {
    pub fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ProxyState::default());
        let st = state.clone();
        let upstream = upstream.to_string();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (st, up) = (st.clone(), upstream.clone());
                std::thread::spawn(move || {
                    let _ = proxy_one(conn, &st, &up, addr);
                });
            }
        });
        Proxy { addr, state }
    }

    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Queues a fault for the next request whose path contains `pattern`.
    pub fn fault(&self, pattern: &str, f: ProxyFault) {
        self.state
            .faults
            .lock()
            .unwrap()
            .push_back((pattern.into(), f));
    }

    /// Applies a fault to every request whose path contains `pattern`.
    pub fn always(&self, pattern: &str, f: ProxyFault) {
        self.state.always.lock().unwrap().push((pattern.into(), f));
    }

    /// `(path, status)` of every request so far.
    pub fn log(&self) -> Vec<(String, u16)> {
        self.state.log.lock().unwrap().clone()
    }

    /// Faults still queued (none once every one was served).
    pub fn pending(&self) -> usize {
        self.state.faults.lock().unwrap().len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn proxy_one(
    conn: TcpStream,
    st: &ProxyState,
    upstream: &str,
    me: SocketAddr,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let method = line.split_whitespace().next().unwrap_or("GET").to_string();
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut fwd = Vec::new();
    let mut auth = None;
    let mut body_len = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        let lower = h.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("authorization:") {
            auth = Some(h[h.len() - v.len()..].trim().to_string());
            continue;
        }
        if let Some(v) = lower.strip_prefix("content-length:") {
            body_len = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("range:")
            || lower.starts_with("accept:")
            || lower.starts_with("content-type:")
        {
            fwd.push(h.trim_end().to_string());
        }
    }
    // A push's body (a blob or a manifest) is forwarded whole.
    let mut body_in = vec![0u8; body_len];
    reader.read_exact(&mut body_in)?;
    let mut w = conn;
    let reply = |w: &mut TcpStream, status: u16, extra: &str, body: &str| {
        st.log.lock().unwrap().push((path.clone(), status));
        write!(
            w,
            "HTTP/1.1 {status} X\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    if path.starts_with("/token") {
        use base64::Engine as _;
        let want = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
        );
        st.auth_seen
            .lock()
            .unwrap()
            .push(auth.clone().unwrap_or_default());
        if auth.as_deref() != Some(want.as_str()) {
            return reply(&mut w, 401, "", "{\"errors\":[]}");
        }
        return reply(&mut w, 200, "", &format!("{{\"token\":\"{TOKEN}\"}}"));
    }
    if auth.as_deref() != Some(format!("Bearer {TOKEN}").as_str()) {
        let ch = format!(
            "WWW-Authenticate: Bearer realm=\"http://{me}/token\",service=\"kiln-test\",scope=\"repository:kiln/pause:pull\"\r\n"
        );
        return reply(&mut w, 401, &ch, "{}");
    }
    let fault = {
        let mut q = st.faults.lock().unwrap();
        match q.iter().position(|(p, _)| path.contains(p.as_str())) {
            Some(i) => q.remove(i).map(|(_, f)| f),
            None => st
                .always
                .lock()
                .unwrap()
                .iter()
                .find(|(p, _)| path.contains(p.as_str()))
                .map(|(_, f)| f.clone()),
        }
    };
    if let Some(ProxyFault::Status(s)) = fault {
        return reply(&mut w, s, "", "fault\n");
    }
    // Forward (HTTP/1.0-style: one request, read to EOF). The registry builds the upload
    // `Location` from `Host`: the proxy's own address, unless the fault says otherwise.
    let host = match fault {
        Some(ProxyFault::ForeignLocation) => upstream.to_string(),
        _ => me.to_string(),
    };
    let mut up = TcpStream::connect(upstream)?;
    write!(
        up,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
    )?;
    for h in &fwd {
        write!(up, "{h}\r\n")?;
    }
    if method == "POST" || method == "PUT" || method == "PATCH" {
        write!(up, "Content-Length: {body_len}\r\n")?;
    }
    write!(up, "\r\n")?;
    up.write_all(&body_in)?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp)?;
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(resp.len(), |i| i + 4);
    let (head, body) = resp.split_at(split);
    let status = std::str::from_utf8(head)
        .ok()
        .and_then(|h| h.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    st.log.lock().unwrap().push((path.clone(), status));
    w.write_all(head)?;
    match fault {
        Some(ProxyFault::ResetAfter(n)) => {
            w.write_all(&body[..n.min(body.len())])?;
            w.flush()?;
            std::thread::sleep(Duration::from_millis(20));
            super::server::reset_conn(&w);
        }
        Some(ProxyFault::TruncateAfter(n)) => {
            w.write_all(&body[..n.min(body.len())])?;
            w.flush()?;
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
        Some(ProxyFault::WrongBytes) => {
            let inv: Vec<u8> = body.iter().map(|b| !b).collect();
            w.write_all(&inv)?;
        }
        _ => w.write_all(body)?,
    }
    Ok(())
}

/// Puts every blob of an OCI layout into the store at `store` (verified, like a sync would),
/// so a bake finds the image without a registry.
pub fn store_layout(layout: &Path, store: &Path) {
    let s = kiln::supply::store::Store::open(store).unwrap();
    for e in std::fs::read_dir(layout.join("blobs/sha256")).unwrap() {
        let p = e.unwrap().path();
        let bytes = std::fs::read(&p).unwrap();
        let hex = p.file_name().unwrap().to_string_lossy().into_owned();
        s.put_reader(
            &bytes[..],
            &kiln::supply::store::Expect {
                sha256: hex,
                size: bytes.len() as u64,
                exact: true,
                what: "test image blob".into(),
            },
        )
        .unwrap();
    }
}

/// The hex of a `sha256:<hex>` digest.
pub fn hex(d: &str) -> &str {
    d.strip_prefix("sha256:").unwrap()
}

/// Every blob in `dir` hashes to its name (nothing wrong was ever stored); returns how many.
pub fn all_blobs_honest(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir.join("blobs/sha256")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        assert_eq!(
            sha256_hex(&std::fs::read(e.path()).unwrap()),
            name,
            "blob {name} does not hash to its name"
        );
        n += 1;
    }
    n
}

/// Runs skopeo (an independent OCI client).
pub fn skopeo(args: &[&str]) -> std::process::Output {
    Command::new("skopeo").args(args).output().unwrap()
}
