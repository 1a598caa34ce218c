//! Test harness: a temp root laid out like a node, a loopback HTTP server that plays a
//! metadata service from fixtures (and its faults), stand-in scripts that record their
//! arguments, and a runner for the real `kiln-firstboot` binary.
#![allow(dead_code)]

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
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
/// (`report_*.rs`) act out the failures. Its journal (unless the test passes `--journalctl`)
/// holds kubelet's registered line, as a real kubelet's does once its Node exists.
pub fn firstboot(root: &Root, args: &[&str]) -> Outcome {
    let journalctl;
    let mut args = args.to_vec();
    if !args.contains(&"--journalctl") {
        journalctl = registered_journal(root);
        args.extend(["--journalctl", journalctl.as_str()]);
    }
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

/// kubelet's line once its Node exists (pkg/kubelet/kubelet_node_status.go).
pub const REGISTERED: &str = "I0115 10:12:09.000001    1234 kubelet_node_status.go:78] \"Successfully registered node\" node=\"ip-10-0-3-7.eu-west-1.compute.internal\"";

/// A `journalctl` stand-in whose kubelet journal is `REGISTERED` (and nothing for other units).
pub fn registered_journal(root: &Root) -> String {
    root.stub(
        "journalctl",
        &format!("case \"$*\" in *kubelet*) echo '{REGISTERED}';; esac"),
    )
}

use kiln_firstboot::standin::MetadataServer;
pub use kiln_firstboot::standin::{fixture_reply, Reply, Request as Req};

pub fn ok(body: &str) -> Reply {
    Reply::Http(200, vec![], body.as_bytes().to_vec())
}

pub fn status(code: u16) -> Reply {
    Reply::status(code)
}

/// The shared metadata stand-in ([`kiln_firstboot::standin`]), started the way these tests
/// use it: on a free loopback port, panicking if it cannot bind; `url` and `requests()` are
/// the stand-in's.
#[derive(Debug)]
pub struct Server(MetadataServer);

impl std::ops::Deref for Server {
    type Target = MetadataServer;
    fn deref(&self) -> &MetadataServer {
        &self.0
    }
}

impl Server {
    pub fn start(handler: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> Server {
        Server(MetadataServer::start(handler).expect("binding the metadata stand-in"))
    }

    /// The same on another loopback address: `[::1]:0` plays an IPv6 endpoint.
    pub fn start_on(addr: &str, handler: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> Server {
        Server(MetadataServer::bind(addr, handler).expect("binding the metadata stand-in"))
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
}

/// A listener that accepts connections into its backlog but never answers.
pub fn silent_listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    (l, url)
}
