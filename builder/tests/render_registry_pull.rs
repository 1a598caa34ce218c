//! node.toml's `[[containerd.registry]]` end to end on the real programs: `kiln render`
//! writes the host directory, Debian's containerd (its CRI plugin, as kubelet asks) pulls an
//! image through it from Debian's `docker-registry` on loopback, whose TLS certificate only
//! the registry's own CA (carried in the payload) verifies; the image's baked `certs.d` comes
//! second in `config_path`, as kiln bakes it, and loses to the node's for the same registry.
//! The client is `cri-smoke pull` (one CRI `PullImage`, the call kubelet makes).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use kiln::bake::render::{CERTS_DIR, PROVISIONED_CERTS_DIR};
use support::registry::{self, Registry};

#[path = "../../testkit/containerd.rs"]
mod containerd_run;
#[path = "../../testkit/optout.rs"]
mod optout;

/// The registry the pod's image names: `.invalid` never resolves, so only the mirror can
/// serve it.
const REGISTRY: &str = "pull-test.kiln.invalid";
const IMAGE: &str = "pull-test.kiln.invalid/team/app:1";

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cri_smoke() -> Option<PathBuf> {
    // The workspace builds it beside the test binaries (target/debug/cri-smoke).
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("cri-smoke");
    if p.is_file() {
        Some(p)
    } else {
        optout::cannot_run(
            "cri-smoke",
            &format!(
                "{} is missing (cargo build --workspace builds it)",
                p.display()
            ),
        );
        None
    }
}

/// Debian's containerd with only the CRI pieces a pull needs (the `native` snapshotter: the
/// temp dir may not take overlayfs), `config_path` as kiln bakes it with `root` in front.
fn containerd(work: &Path, root: &Path, vars: &[(&str, String)]) -> Option<(Killed, String)> {
    if Command::new("containerd")
        .arg("--version")
        .output()
        .is_err()
    {
        optout::cannot_run(
            "containerd",
            "no containerd on PATH (make deps installs it)",
        );
        return None;
    }
    let d = work.join(format!("containerd-{}", vars.len()));
    std::fs::create_dir_all(&d).unwrap();
    let sock = d.join("containerd.sock");
    let config_path = format!("{0}{PROVISIONED_CERTS_DIR}:{0}{CERTS_DIR}", root.display());
    let cfg = format!(
        "version = 2\nroot = \"{0}/lib\"\nstate = \"{0}/state\"\n[grpc]\n  address = \"{1}\"\n\
         [ttrpc]\n  address = \"{1}.ttrpc\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"native\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"{config_path}\"\n",
        d.display(),
        sock.display()
    );
    std::fs::write(d.join("config.toml"), cfg).unwrap();
    let p = Killed(containerd_run::start(
        &d.join("config.toml"),
        &sock,
        &d.join("log"),
        vars,
    ));
    Some((p, format!("unix://{}", sock.display())))
}

fn render_files(work: &Path, node_toml: &str, root: &Path) {
    std::fs::write(work.join("node.toml"), node_toml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["render", "-p", "files", "--output"])
        .arg(root)
        .arg(work.join("node.toml"))
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Debian's registry with TLS from its own CA and no auth, holding `team/app:1`.
fn registry_with_image(w: &Path) -> Registry {
    let reg = Registry::start_with(&w.join("registry"), true, false);
    let layout = w.join("layout");
    registry::build_image(&layout, "1", &[("amd64", b"not run, only pulled".to_vec())]);
    reg.push(&layout, "1", "team/app");
    reg
}

fn pull(bin: &Path, endpoint: &str) -> std::process::Output {
    Command::new(bin)
        .args(["pull", "--image", IMAGE, "--call-timeout-secs", "60"])
        .args(["--endpoint", endpoint])
        .output()
        .unwrap()
}

#[test]
fn containerd_pulls_through_the_mirror_and_ca_kiln_render_wrote() {
    if !registry::tools_or_skip("registry pull") {
        return;
    }
    let Some(bin) = cri_smoke() else { return };
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let reg = registry_with_image(w);
    let ca = reg.ca.clone().unwrap();
    std::fs::copy(&ca, w.join("mirror-ca.pem")).unwrap();
    std::fs::copy(&ca, w.join("ca.crt")).unwrap();

    // The image's own configuration of the same registry: a mirror nothing listens on.
    let root = w.join("root");
    let baked = root.join(CERTS_DIR.trim_start_matches('/')).join(REGISTRY);
    std::fs::create_dir_all(&baked).unwrap();
    std::fs::write(
        baked.join("hosts.toml"),
        format!("server = \"https://{REGISTRY}\"\n[host.\"https://127.0.0.1:9\"]\n  capabilities = [\"pull\", \"resolve\"]\n"),
    )
    .unwrap();

    let node = |ca_line: &str| {
        format!(
            "api_server = \"https://127.0.0.1:6443\"\ncluster_name = \"c\"\n[ca]\nfile = \"ca.crt\"\n\
             [bootstrap]\ntoken = \"{}\"\n\n[[containerd.registry]]\nhost = \"{REGISTRY}\"\n\
             mirrors = [\"https://{}\"]\n{ca_line}",
            crate::render_support::TOKEN,
            reg.host
        )
    };
    let Some((_containerd, endpoint)) = containerd(w, &root, &[]) else {
        return;
    };

    // Without the CA the mirror's certificate does not verify, and the pull fails on it.
    render_files(w, &node(""), &root);
    let out = pull(&bin, &endpoint);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "pulled without the CA");
    assert!(
        err.contains("x509") || err.contains("certificate"),
        "the failure is the certificate's: {err}"
    );

    // With it (hosts.toml is read at every pull: no containerd restart), the pull succeeds.
    render_files(w, &node("ca = { file = \"mirror-ca.pem\" }\n"), &root);
    let dir = root.join("etc/kiln/containerd/certs.d").join(REGISTRY);
    assert!(dir.join("ca.crt").is_file() && dir.join("hosts.toml").is_file());
    let out = pull(&bin, &endpoint);
    assert!(
        out.status.success(),
        "{}\ncontainerd: {}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(w.join("containerd-0/log")).unwrap_or_default()
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("sha256:"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // A render without the registry removes its directory; the image's configuration (the
    // dead mirror) applies again and the pull of another tag fails on it.
    let bare = node("").replace(
        &format!(
            "\n[[containerd.registry]]\nhost = \"{REGISTRY}\"\nmirrors = [\"https://{}\"]\n",
            reg.host
        ),
        "",
    );
    render_files(w, &bare, &root);
    assert!(!dir.exists(), "a stale registry directory was left");
    let out = Command::new(&bin)
        .args(["pull", "--image", "pull-test.kiln.invalid/team/app:2"])
        .args(["--call-timeout-secs", "60", "--endpoint", &endpoint])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("127.0.0.1:9"),
        "the image's mirror was tried: {err}"
    );
}

/// `[trust]`: the registry's CA only in the node's trust bundle (no per-registry `ca`); the
/// bundle reaches containerd through the `SSL_CERT_DIR` of the unit kiln bakes, and Go's own
/// `crypto/x509` reads it. Without the bundle the same pull fails on the certificate.
#[test]
fn containerd_trusts_the_bundle_through_the_baked_ssl_cert_dir() {
    if !registry::tools_or_skip("registry pull") {
        return;
    }
    let Some(bin) = cri_smoke() else { return };
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let reg = registry_with_image(w);
    std::fs::copy(reg.ca.as_ref().unwrap(), w.join("proxy-ca.pem")).unwrap();
    std::fs::copy(reg.ca.as_ref().unwrap(), w.join("ca.crt")).unwrap();
    let root = w.join("root");
    let node = |trust: &str| {
        format!(
            "api_server = \"https://127.0.0.1:6443\"\ncluster_name = \"c\"\n[ca]\nfile = \"ca.crt\"\n\
             [bootstrap]\ntoken = \"{}\"\n{trust}\n[[containerd.registry]]\nhost = \"{REGISTRY}\"\n\
             mirrors = [\"https://{}\"]\n",
            crate::render_support::TOKEN,
            reg.host
        )
    };
    // The unit's SSL_CERT_DIR, with the test's root in front of the node's directory.
    let unit = kiln::bake::units::containerd(&[], true);
    let dirs = unit
        .lines()
        .find_map(|l| l.strip_prefix("Environment=SSL_CERT_DIR="))
        .expect("containerd.service sets SSL_CERT_DIR");
    let dirs = dirs.replace(
        kiln::render::model::TRUST_DIR,
        &format!("{}{}", root.display(), kiln::render::model::TRUST_DIR),
    );
    let env = [("SSL_CERT_DIR", dirs)];

    // No bundle: Go's system roots do not know the registry's CA.
    render_files(w, &node(""), &root);
    let Some((first, endpoint)) = containerd(w, &root, &[]) else {
        return;
    };
    let out = pull(&bin, &endpoint);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("x509"), "{err}");
    drop(first);

    // The bundle, and a containerd started as the unit starts it (Go reads the roots once,
    // at the first TLS connection).
    render_files(w, &node("[trust]\nfile = \"proxy-ca.pem\"\n"), &root);
    assert!(root.join("etc/kiln/trust.d/bundle.crt").is_file());
    let Some((_second, endpoint)) = containerd(w, &root, &env) else {
        return;
    };
    let out = pull(&bin, &endpoint);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
