//! Test harness: a temp root laid out like a node, a loopback HTTP server that plays a
//! metadata service from fixtures (and its faults), stand-in scripts that record their
//! arguments, and a runner for the real `kiln-firstboot` binary.
#![allow(dead_code)]

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub const TOKEN: &str = "abcdef.0123456789abcdef";

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A node root in a fresh temp dir, removed on drop.
pub struct Root {
    pub dir: PathBuf,
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

impl Root {
    /// An empty root.
    pub fn empty() -> Root {
        let dir = std::env::temp_dir().join(format!(
            "kiln-fb-{}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        fs::create_dir_all(&dir).unwrap();
        Root { dir }
    }

    /// A root with a valid image, node config (token credential) and the given DMI vendor.
    pub fn node(sys_vendor: &str) -> Root {
        let r = Root::empty();
        r.write(
            "usr/lib/kiln/image.env",
            "KILN_CONTRACT=1\nKILN_IMAGE_ID=sha256:3f0c1b2a3f0c1b2a3f0c1b2a3f0c1b2a\nKILN_IMAGE_NAME=ubuntu\n\
             KILN_VERSION=0.1.0\nKILN_OS=linux\nKILN_ARCH=amd64\nKUBERNETES_VERSION=v1.34.2\n",
        );
        r.write(
            "usr/lib/kiln/max-pods.map",
            "# instance-type pods\nm5.large 29\nm5.xlarge 58\nStandard_D4s_v5 110\nn2-standard-4 32\n",
        );
        r.node_env("");
        r.write(
            "etc/kiln/ca.crt",
            "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n",
        );
        r.write_mode("etc/kiln/bootstrap-token", &format!("{TOKEN}\n"), 0o600);
        if !sys_vendor.is_empty() {
            r.write("sys/class/dmi/id/sys_vendor", &format!("{sys_vendor}\n"));
        }
        r
    }

    /// Rewrites node.env with the base keys plus `extra` lines.
    pub fn node_env(&self, extra: &str) {
        self.write(
            "etc/kiln/node.env",
            &format!(
                "KILN_CONTRACT=1\nAPI_SERVER=https://127.0.0.1:6443\nCLUSTER_NAME=test\n{extra}"
            ),
        );
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    pub fn write(&self, rel: &str, content: &str) {
        self.write_bytes(rel, content.as_bytes());
    }

    pub fn write_bytes(&self, rel: &str, content: &[u8]) {
        let p = self.path(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, content).unwrap();
    }

    pub fn write_mode(&self, rel: &str, content: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        self.write(rel, content);
        fs::set_permissions(self.path(rel), fs::Permissions::from_mode(mode)).unwrap();
    }

    pub fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    /// A stand-in program: a shell script that appends its arguments to `<name>.calls`
    /// and then runs `body`. Returns its path.
    pub fn stub(&self, name: &str, body: &str) -> String {
        let p = self.path(&format!("stubs/{name}"));
        let calls = self.path(&format!("stubs/{name}.calls"));
        self.write_mode(
            &format!("stubs/{name}"),
            &format!("#!/bin/sh\necho \"$*\" >> '{}'\n{body}\n", calls.display()),
            0o755,
        );
        p.display().to_string()
    }

    /// The recorded calls of a stub, one line each.
    pub fn calls(&self, name: &str) -> Vec<String> {
        fs::read_to_string(self.path(&format!("stubs/{name}.calls")))
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// Every file under `run/` (relative paths), to check nothing half-written is left.
    pub fn run_files(&self) -> Vec<String> {
        let mut out = Vec::new();
        walk(&self.path("run"), &self.dir, &mut out);
        out.sort();
        out
    }
}

fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, base, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// What one run of the binary did.
#[derive(Debug)]
pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Outcome {
    /// Runs `cmd` with a clean environment (only `PATH`) and records how it ended.
    pub fn of(cmd: &mut Command) -> Outcome {
        let started = Instant::now();
        let out = cmd
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .output()
            .expect("run kiln-firstboot");
        Outcome {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            elapsed: started.elapsed(),
        }
    }
}

/// Runs the real binary with `--root` and `args`. A console file inside the root keeps
/// the run away from the machine's real console. kubelet is played by a stand-in that is
/// already healthy (a loopback `/healthz` answering `ok`) and joined (its client certificate
/// in place), so runs that start kubelet get through the wait phases; the reporting tests
/// (`report_*.rs`) act out the failures.
pub fn firstboot(root: &Root, args: &[&str]) -> Outcome {
    let console = root.path("console.log");
    let healthz = Server::start(|_| ok("ok"));
    let cert = "var/lib/kubelet/pki/kubelet-client-current.pem";
    if !root.exists(cert) {
        root.write(
            cert,
            "-----BEGIN CERTIFICATE-----\nMIIBstandin\n-----END CERTIFICATE-----\n",
        );
    }
    Outcome::of(
        Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"))
            .arg("run")
            .arg("--root")
            .arg(&root.dir)
            .arg("--console")
            .arg(&console)
            .arg("--healthz-url")
            .arg(format!("{}/healthz", healthz.url))
            .args(args),
    )
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Req {
    pub method: String,
    /// Path with query.
    pub path: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
}

impl Req {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The path without its query.
    pub fn route(&self) -> &str {
        self.path.split('?').next().unwrap()
    }
}

/// How the server answers one request.
#[derive(Debug)]
pub enum Reply {
    /// A complete response: status, extra headers, body (sent with Content-Length).
    Http(u16, Vec<(String, String)>, Vec<u8>),
    /// Bytes written as they are, then the connection is closed.
    Raw(Vec<u8>),
    /// Headers, then the body one byte per `gap`.
    Slow(Vec<u8>, Duration),
    /// Reads the request and never answers.
    Hang,
}

pub fn ok(body: &str) -> Reply {
    Reply::Http(200, vec![], body.as_bytes().to_vec())
}

pub fn status(code: u16) -> Reply {
    Reply::Http(code, vec![], format!("status {code}\n").into_bytes())
}

type Handler = dyn Fn(&Req) -> Reply + Send + Sync;

/// A loopback HTTP/1.1 server on port 0.
#[derive(Debug)]
pub struct Server {
    pub url: String,
    log: Arc<Mutex<Vec<Req>>>,
}

impl Server {
    pub fn start(handler: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let l2 = log.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (h, log) = (handler.clone(), l2.clone());
                thread::spawn(move || serve(conn, &*h, &log));
            }
        });
        Server { url, log }
    }

    /// Serves files under `fixtures/<dir>/` by request path (query ignored); 404 otherwise.
    /// `headers` go on every answer, as the real service sends them.
    pub fn fixtures(dir: &str, headers: &[(&str, &str)]) -> Server {
        let base = fixtures().join(dir);
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Server::start(move |r| fixture_reply(&base, &headers, r))
    }

    pub fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }
}

/// The fixture answer for `r`: the file at its path, or 404.
pub fn fixture_reply(base: &Path, headers: &[(String, String)], r: &Req) -> Reply {
    let p = base.join(r.route().trim_start_matches('/'));
    match fs::read(&p) {
        Ok(body) if p.is_file() => Reply::Http(200, headers.to_vec(), body),
        _ => Reply::Http(404, headers.to_vec(), b"Not Found".to_vec()),
    }
}

/// A listener that accepts connections into its backlog but never answers.
pub fn silent_listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    (l, url)
}

fn read_request(conn: &mut TcpStream) -> Option<Req> {
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut b).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&b[..n]);
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let path = first.next()?.to_string();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(Req {
        method,
        path,
        headers,
    })
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        301 => "Moved Permanently",
        302 => "Found",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Other",
    }
}

fn serve(mut conn: TcpStream, handler: &Handler, log: &Mutex<Vec<Req>>) {
    let Some(req) = read_request(&mut conn) else {
        return;
    };
    log.lock().unwrap().push(req.clone());
    match handler(&req) {
        Reply::Http(code, headers, body) => {
            let mut head = format!("HTTP/1.1 {code} {}\r\n", reason(code));
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str(&format!(
                "Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            ));
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body);
        }
        Reply::Raw(bytes) => {
            let _ = conn.write_all(&bytes);
        }
        Reply::Slow(body, gap) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes());
            for b in body {
                thread::sleep(gap);
                if conn.write_all(&[b]).is_err() {
                    return;
                }
            }
        }
        Reply::Hang => thread::sleep(Duration::from_secs(120)),
    }
}
