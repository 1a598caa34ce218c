//! The pieces every kiln scenario shares: the workspace's built tools (kiln, the static
//! kiln-firstboot) and the offline fixture mirror, `kiln bake` and `kiln render` runs, the
//! unit that reports the node's files on the console and the parsed outcome (both in `outcome.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::arch::Arch;
use crate::{io_err, run, Error, Result};

/// The repository root (this crate's parent directory).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// What the scenarios run on the host.
#[derive(Debug, Clone)]
pub struct Tools {
    /// The `kiln` binary (`KILN_BIN`, default `target/debug/kiln`).
    pub kiln: PathBuf,
    /// The static `kiln-firstboot` (`KILN_FIRSTBOOT_BIN`, default `target/firstboot/kiln-firstboot`).
    pub firstboot: PathBuf,
    /// The fixture mirror directory made by `scripts/fixture-mirror.sh`
    /// (`KILN_FIXTURE_MIRROR`, default `target/fixture-mirror`).
    pub fixture: PathBuf,
}

fn existing(var: &str, default: PathBuf, hint: &str) -> Result<PathBuf> {
    let p = std::env::var_os(var).map(PathBuf::from).unwrap_or(default);
    if p.is_file() {
        Ok(p)
    } else {
        Err(Error::Missing {
            what: format!("{} ({var})", p.display()),
            hint: hint.into(),
        })
    }
}

/// The tools, checked once per process; the fixture mirror is generated on first use (under
/// a lock, so parallel tests make it once).
pub fn tools() -> Result<&'static Tools> {
    static TOOLS: OnceLock<std::result::Result<Tools, String>> = OnceLock::new();
    TOOLS
        .get_or_init(|| find_tools().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Missing {
            what: "the scenario tools".into(),
            hint: e.clone(),
        })
}

fn find_tools() -> Result<Tools> {
    let ws = workspace();
    let kiln = existing(
        "KILN_BIN",
        ws.join("target/debug/kiln"),
        "build it with `cargo build -p kiln` (make qemu-test does)",
    )?;
    let firstboot = existing(
        "KILN_FIRSTBOOT_BIN",
        ws.join("target/firstboot/kiln-firstboot"),
        "build it with `make firstboot`",
    )?;
    // `make qemu-test` makes the mirror first and names it; otherwise make or refresh the
    // default one (the script hashes its inputs and takes a lock, so this is cheap and safe
    // from parallel test processes).
    let fixture = match std::env::var_os("KILN_FIXTURE_MIRROR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let dir = ws.join("target/fixture-mirror");
            run(Command::new(ws.join("qemu-tests/assets/fixture.sh"))
                .arg(&dir)
                .env("KILN_BIN", &kiln)
                .current_dir(&ws))?;
            dir
        }
    };
    if !fixture.join("mirror").is_dir() || !fixture.join("artifacts.lock").is_file() {
        return Err(Error::Missing {
            what: format!("the fixture mirror in {}", fixture.display()),
            hint: "make it with qemu-tests/assets/fixture.sh (scripts/fixture-mirror.sh, issue #5)"
                .into(),
        });
    }
    Ok(Tools {
        kiln,
        firstboot,
        fixture,
    })
}

/// Artifact names the fixture lock holds.
pub fn fixture_artifacts(lock_text: &str) -> Vec<String> {
    let mut names: Vec<String> = lock_text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The kubelet version the fixture lock pins: the stand-in's, which scripts/fixture-mirror.sh
/// derives from the images' `kubernetes.version` (e.g. `v1.36.1` gives `v1.36.1-standin`).
pub fn fixture_kubelet_version(lock_text: &str) -> Option<String> {
    let mut lines = lock_text.lines();
    while let Some(l) = lines.next() {
        if l.trim() == "name = \"kubelet\"" {
            return lines.find_map(|l| {
                l.trim()
                    .strip_prefix("version = \"")?
                    .strip_suffix('"')
                    .map(str::to_string)
            });
        }
    }
    None
}

/// An image definition from `images/<name>.toml` for the fixture lock: the `[[artifact]]`
/// entries it cannot provide (none today; crictl is the workspace's stand-in) are dropped, and
/// `kubernetes.version` names the stand-in kubelet's version (`kubelet_version`), which bake
/// checks verbatim against the lock. A relative `aws_table` (the pinned AWS ENI table) points
/// into the workspace's `images/`, since the copy is written elsewhere. Everything else is the
/// real definition.
pub fn fixture_image_def(
    image: &str,
    available: &[String],
    kubelet_version: Option<&str>,
) -> Result<String> {
    let path = workspace().join(format!("images/{image}.toml"));
    let mut text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
    let images = workspace().join("images");
    // The Flatcar sysext's update mirror is the one a boot test's guest reaches through its
    // forward (crate::sysupdate); nothing else in the boot tests reads update_url.
    text = text.replace(
        "update_url = \"https://images.example.com/kiln/flatcar/\"",
        &format!("update_url = \"{}\"", crate::sysupdate::UPDATE_URL),
    );
    text = text.replace(
        "aws_table = \"data/",
        &format!("aws_table = \"{}/data/", images.display()),
    );
    if let Some(v) = kubelet_version {
        let mut in_kubernetes = false;
        text = text
            .lines()
            .map(|l| {
                let t = l.trim_start();
                if t.starts_with('[') {
                    in_kubernetes = t.starts_with("[kubernetes]");
                }
                if in_kubernetes && t.starts_with("version") {
                    format!("version = \"{v}\"")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        text.push('\n');
    }
    let mut out = String::new();
    let mut blocks = text.split("[[artifact]]");
    out.push_str(blocks.next().unwrap_or_default());
    for block in blocks {
        let name = block
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = \"")?.strip_suffix('"'))
            .unwrap_or_default();
        if available.iter().any(|a| a == name) {
            out.push_str("[[artifact]]");
            out.push_str(block);
        } else {
            // Keep what follows the entry (later tables) but not the entry itself.
            let rest: Vec<&str> = block
                .lines()
                .skip_while(|l| !l.trim_start().starts_with('['))
                .collect();
            if !rest.is_empty() {
                out.push_str(&rest.join("\n"));
                out.push('\n');
            }
        }
    }
    Ok(out)
}

/// Bakes `images/<image>.toml` (minus what the fixture lacks) from the fixture mirror for
/// amd64, returning the files kiln reports (kept in the bake cache, shared read-only).
pub fn bake(tools: &Tools, image: &str, format: &str) -> Result<Vec<PathBuf>> {
    bake_for(tools, image, format, Arch::Amd64, &tools.firstboot)
}

/// The static kiln-firstboot for `arch`: [`Tools::firstboot`] for amd64; for arm64
/// `KILN_FIRSTBOOT_ARM64_BIN`, default `target/firstboot/arm64/kiln-firstboot`.
pub fn firstboot_for(tools: &Tools, arch: Arch) -> Result<PathBuf> {
    match arch {
        Arch::Amd64 => Ok(tools.firstboot.clone()),
        Arch::Arm64 => existing(
            "KILN_FIRSTBOOT_ARM64_BIN",
            workspace().join("target/firstboot/arm64/kiln-firstboot"),
            "build it with `make firstboot`",
        ),
    }
}

/// [`bake`] for `arch`, with that architecture's kiln-firstboot: once per set of inputs
/// ([`crate::bakecache`]), however many scenarios boot the layer.
pub fn bake_for(
    tools: &Tools,
    image: &str,
    format: &str,
    arch: Arch,
    firstboot: &Path,
) -> Result<Vec<PathBuf>> {
    let sandbox = crate::pod::sandbox_image(image)?;
    let mut inputs = crate::bakecache::Inputs::default();
    inputs
        .value((image, format, arch.name()))
        .binary(&tools.kiln)?
        .binary(firstboot)?
        .binary(&std::env::current_exe().map_err(io_err("/proc/self/exe"))?)?
        .file(&tools.fixture.join("artifacts.lock"))?
        .tree(&workspace().join("images"))?
        .value(crate::pod::images_archive(&sandbox, arch)?);
    crate::bakecache::cached(
        &format!("{image}-{format}-{}", arch.name()),
        &inputs,
        |out| bake_uncached(tools, image, format, out, arch, firstboot),
    )
}

/// `kiln bake` into `out`, as [`bake_for`] describes.
fn bake_uncached(
    tools: &Tools,
    image: &str,
    format: &str,
    out: &Path,
    arch: Arch,
    firstboot: &Path,
) -> Result<Vec<PathBuf>> {
    let mut lock = tools.fixture.join("artifacts.lock");
    let lock_text = std::fs::read_to_string(&lock).map_err(io_err(&lock))?;
    let kubelet_version = fixture_kubelet_version(&lock_text);
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    // kiln bake wants `kubernetes.version` equal to the lock's kubelet version
    // (`vX.Y.Z-standin` in the fixture lock): the definition's copy below says so.
    // Bake from a copy of the lock, re-signed with the fixture's own throwaway key, that also
    // pins the pause stand-in as an `[[image]]` (issue 16): the layer carries
    // it and kiln-images.service imports it, so the pod's sandbox comes from the baked image
    // with no registry in the guest. Its blobs go into a store made of hard links to the
    // fixture mirror's plus the image's.
    let store = out.join("store");
    run(Command::new("cp")
        .arg("-al")
        .arg(tools.fixture.join("mirror"))
        .arg(&store))?;
    let image_entry = crate::pod::pin_sandbox(image, arch, &store, out)?;
    let mut fixed = lock_text.clone();
    fixed.push_str(&image_entry);
    let copy = out.join("artifacts.lock");
    std::fs::write(&copy, fixed).map_err(io_err(&copy))?;
    run(Command::new(&tools.kiln)
        .args(["--quiet", "lock", "sign"])
        .arg(&copy)
        .arg("--secret-key")
        .arg(tools.fixture.join("keys/fixture.key")))?;
    lock = copy;
    let def = fixture_image_def(
        image,
        &fixture_artifacts(&lock_text),
        kubelet_version.as_deref(),
    )?;
    let def_path = out.join(format!("{image}.toml"));
    std::fs::write(&def_path, def).map_err(io_err(&def_path))?;
    // A sysext is baked as a signed disk image (issue 39): the node's systemd-sysext merges
    // it only once its dm-verity signature verifies (crate::signed_sysext).
    let mut signed = Vec::new();
    if format == "sysext" {
        let prefix = out.join("sysext-signing");
        run(Command::new(&tools.kiln)
            .args(["--quiet", "key", "generate"])
            .arg(&prefix))?;
        signed.push("--sysext-ddi".into());
        signed.push("--attest-key".into());
        signed.push(prefix.with_extension("key").into_os_string());
    }
    let o = run(Command::new(&tools.kiln)
        .arg("--json")
        .arg("bake")
        .arg(&def_path)
        .args(["--format", format, "--arch", arch.name(), "--out"])
        .arg(out)
        .args(&signed)
        .arg("--lock")
        .arg(&lock)
        .arg("--trusted-key")
        .arg(tools.fixture.join("keys/fixture.pub"))
        .arg("--store")
        .arg(&store)
        .arg("--firstboot")
        .arg(firstboot)
        .env("SOURCE_DATE_EPOCH", "1700000000"))?;
    let stdout = String::from_utf8_lossy(&o.stdout);
    // The phase events come first (docs/bake.md); the result object is the line with `files`.
    let v: serde_json::Value = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get("files").is_some())
        .ok_or_else(|| Error::Command {
            command: "kiln --json bake".into(),
            detail: format!("no JSON line in its output:\n{stdout}"),
        })?;
    Ok(v["files"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str())
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default())
}

/// The one file of `files` whose name ends with `suffix`.
pub fn pick(files: &[PathBuf], suffix: &str) -> Result<PathBuf> {
    files
        .iter()
        .find(|f| f.to_string_lossy().ends_with(suffix))
        .cloned()
        .ok_or_else(|| Error::Missing {
            what: format!("a baked file ending in {suffix}"),
            hint: format!("kiln bake wrote {files:?}"),
        })
}

/// `kiln install --root ROOT LAYER`.
pub fn install(tools: &Tools, layer: &Path, root: &Path) -> Result<()> {
    run(Command::new(&tools.kiln)
        .arg("--quiet")
        .arg("install")
        .arg(layer)
        .arg("--root")
        .arg(root))?;
    Ok(())
}

/// The neutral node config a scenario renders with `kiln render`.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// `provider`.
    pub provider: String,
    /// `deadline`, seconds.
    pub deadline: u32,
    /// `join_mode`: `kubelet` or `kubeadm`.
    pub join_mode: String,
    /// More of node.toml, appended as is (a scenario's `[proxy]` table, say).
    pub extra: String,
}

/// A throwaway CA certificate, as the cluster would hand out (made with openssl).
pub fn make_ca(dir: &Path) -> Result<PathBuf> {
    let crt = dir.join("ca.crt");
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ])
        .args(["-days", "2", "-subj", "/CN=kiln-boot-test-ca", "-keyout"])
        .arg(dir.join("ca.key"))
        .arg("-out")
        .arg(&crt))?;
    Ok(crt)
}

/// The client certificate the cluster's CSR signer would issue to this node after its TLS
/// bootstrap: `CN=system:node:kiln-boot-test`, `O=system:nodes`, signed by the CA in `dir`
/// ([`make_ca`]), certificate and key in one PEM as kubelet keeps them. The stand-in kubelet
/// writes it as `kubelet-client-current.pem` (tools/standin-kubelet/README.md).
pub fn signed_client(dir: &Path) -> Result<String> {
    let (key, csr, crt) = (
        dir.join("client.key"),
        dir.join("client.csr"),
        dir.join("client.crt"),
    );
    run(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ])
        .args([
            "-subj",
            "/O=system:nodes/CN=system:node:kiln-boot-test",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&csr))?;
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-in"])
        .arg(&csr)
        .arg("-CA")
        .arg(dir.join("ca.crt"))
        .arg("-CAkey")
        .arg(dir.join("ca.key"))
        .arg("-CAcreateserial")
        .arg("-out")
        .arg(&crt))?;
    let mut pem = std::fs::read_to_string(&crt).map_err(io_err(&crt))?;
    pem.push_str(&std::fs::read_to_string(&key).map_err(io_err(&key))?);
    Ok(pem)
}

/// Where the stand-in kubelet finds the certificate "the cluster signed" for it.
pub const SIGNED_CLIENT: &str = "etc/kubernetes/standin-signed-client.pem";

/// The API server every scenario's node.toml names (`host:port`): a loopback address of the
/// guest, where nothing listens, so no node ever dials out of the guest for it (the project's
/// rule for a test's node.env; the guest's network reaches only the metadata forward anyway).
/// kiln-firstboot's doctor reports it unreachable by this name.
pub const API_SERVER: &str = "127.0.0.1:6443";

/// Writes `node.toml` (and its CA) into `dir` and returns its path.
pub fn node_toml(dir: &Path, cfg: &NodeConfig) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    make_ca(dir)?;
    let text = format!(
        "api_server = \"https://{API_SERVER}\"\ncluster_name = \"boot-test\"\n\
         join_mode = \"{}\"\nprovider = \"{}\"\ndeadline = {}\n\n\
         [ca]\nfile = \"ca.crt\"\n\n[bootstrap]\ntoken = \"07401b.f395accd246ae52d\"\n\n\
         [node]\nlabels = {{ \"node.kubernetes.io/role\" = \"worker\" }}\n{}",
        cfg.join_mode, cfg.provider, cfg.deadline, cfg.extra
    );
    let p = dir.join("node.toml");
    std::fs::write(&p, text).map_err(io_err(&p))?;
    Ok(p)
}

/// `kiln render --provisioner files NODE_TOML --output ROOT`: the provisioner's files placed
/// straight into the guest root, as a Packer file step or a config drive would.
pub fn render_files(tools: &Tools, node: &Path, root: &Path) -> Result<()> {
    run(Command::new(&tools.kiln)
        .args(["--quiet", "render", "--provisioner", "files"])
        .arg(node)
        .arg("--output")
        .arg(root))?;
    Ok(())
}

/// `kiln render --provisioner cloud-init NODE_TOML`: the user data.
pub fn render_cloud_init(tools: &Tools, node: &Path) -> Result<String> {
    let o = run(Command::new(&tools.kiln)
        .args(["--quiet", "render", "--provisioner", "cloud-init"])
        .arg(node))?;
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

pub use crate::outcome::{report_script, Outcome, REPORTED_FILES};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixture_def_drops_only_missing_artifacts() {
        let available = fixture_artifacts(
            "[[artifact]]\nname = \"kubelet\"\n[[artifact]]\nname = \"containerd\"\n",
        );
        assert_eq!(available, ["containerd", "kubelet"]);
        let def = fixture_image_def("ubuntu", &available, Some("1.30.0-standin")).unwrap();
        assert!(def.contains("version = \"1.30.0-standin\""), "{def}");
        let lock = "[[artifact]]\nname = \"runc\"\nversion = \"1.1\"\n[[artifact]]\nname = \"kubelet\"\nversion = \"1.30.0-standin\"\n";
        assert_eq!(
            fixture_kubelet_version(lock).as_deref(),
            Some("1.30.0-standin")
        );
        assert!(def.contains("name = \"kubelet\""));
        assert!(def.contains("name = \"containerd\""));
        assert!(!def.contains("name = \"crictl\""));
        // Tables after the dropped entries survive.
        assert!(def.contains("[sizing]"), "{def}");
        assert!(def.contains("max_pods = \"aws-vpc-cni\""), "{def}");
        // …with the pinned table named where it is, not beside the copy.
        let table = workspace().join("images/data/aws-eni.tsv");
        assert!(
            def.contains(&format!("aws_table = \"{}\"", table.display())),
            "{def}"
        );
    }
}
