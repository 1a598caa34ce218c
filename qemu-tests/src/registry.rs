//! A registry mirror with its own CA for the guest (docs/boot-tests.md, "Registry mirror"):
//! Debian's `docker-registry` on loopback, TLS from a CA made here with openssl (the server
//! certificate names 127.0.0.1 and [`MIRROR_IP`], the address the guest dials through the
//! forward), no auth; the test image pushed into it from the boot tests' OCI archive with
//! skopeo. Only a node that trusts this CA can pull from it.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{io_err, run, Error, Result};

/// The guest's address of the mirror: [`crate::vm::MIRROR_ADDR`]'s.
pub const MIRROR_IP: &str = "169.254.169.80";

/// A running mirror; the registry is killed when dropped.
#[derive(Debug)]
pub struct RegistryMirror {
    child: Child,
    _dir: tempfile::TempDir,
    /// The loopback port (the guest forward's target).
    pub port: u16,
    /// The CA's certificate (PEM): what node.toml's `ca.pem` carries.
    pub ca_pem: String,
}

impl Drop for RegistryMirror {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn need(tool: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    if found {
        Ok(())
    } else {
        Err(Error::Missing {
            what: tool.into(),
            hint: "scripts/deps.sh installs docker-registry, skopeo and openssl".into(),
        })
    }
}

/// Starts the mirror and pushes the image tagged `tag` in the OCI archive `archive` as
/// `repo:tag` (the repository path the node's image reference has after its registry).
pub fn start(archive: &Path, tag: &str, repo: &str) -> Result<RegistryMirror> {
    for t in ["docker-registry", "skopeo", "openssl"] {
        need(t)?;
    }
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let p = |n: &str| d.join(n);
    run(Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=kiln boot-test mirror CA", "-keyout"])
        .arg(p("ca.key"))
        .arg("-out")
        .arg(p("ca.pem")))?;
    run(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-subj", "/CN=kiln boot-test mirror", "-keyout"])
        .arg(p("server.key"))
        .arg("-out")
        .arg(p("server.csr")))?;
    let ext = p("san.ext");
    std::fs::write(
        &ext,
        format!(
            "subjectAltName=IP:{MIRROR_IP},IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             extendedKeyUsage=serverAuth\n"
        ),
    )
    .map_err(io_err(&ext))?;
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-CAcreateserial", "-in"])
        .arg(p("server.csr"))
        .arg("-CA")
        .arg(p("ca.pem"))
        .arg("-CAkey")
        .arg(p("ca.key"))
        .arg("-extfile")
        .arg(&ext)
        .arg("-out")
        .arg(p("server.pem")))?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let cfg = p("config.yml");
    std::fs::write(
        &cfg,
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {}\n    key: {}\n",
            p("data").display(),
            p("server.pem").display(),
            p("server.key").display()
        ),
    )
    .map_err(io_err(&cfg))?;
    let log = std::fs::File::create(p("registry.log"))?;
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(&cfg)
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| Error::Command {
            command: "docker-registry serve".into(),
            detail: e.to_string(),
        })?;
    let ca_pem = std::fs::read_to_string(p("ca.pem")).map_err(io_err(&p("ca.pem")))?;
    let mirror = RegistryMirror {
        child,
        _dir: dir,
        port,
        ca_pem,
    };
    let until = Instant::now() + Duration::from_secs(30);
    let d = mirror._dir.path();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > until {
            return Err(Error::Command {
                command: "docker-registry serve".into(),
                detail: format!(
                    "not listening on 127.0.0.1:{port} after 30 s: {}",
                    std::fs::read_to_string(d.join("registry.log")).unwrap_or_default()
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let certs = d.join("certs");
    std::fs::create_dir_all(&certs).map_err(io_err(&certs))?;
    std::fs::copy(d.join("ca.pem"), certs.join("ca.crt")).map_err(io_err(&certs))?;
    run(Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-cert-dir"])
        .arg(&certs)
        .arg(format!("oci-archive:{}:{tag}", archive.display()))
        .arg(format!("docker://127.0.0.1:{port}/{repo}:{tag}")))?;
    Ok(mirror)
}
