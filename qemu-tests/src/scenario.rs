//! The pieces every kiln scenario shares: the workspace's built tools (kiln, the static
//! kiln-firstboot) and the offline fixture mirror, `kiln bake` and `kiln render` runs, the
//! unit that reports the node's files on the console, and the parsed outcome.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::console::Line;
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
/// derives from the images' `kubernetes.version` (e.g. `v1.36.1` gives `1.36.1-standin`).
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

/// Bakes `images/<image>.toml` (minus what the fixture lacks) from the fixture mirror into
/// `out`, returning the files kiln reports.
pub fn bake(tools: &Tools, image: &str, format: &str, out: &Path) -> Result<Vec<PathBuf>> {
    let mut lock = tools.fixture.join("artifacts.lock");
    let lock_text = std::fs::read_to_string(&lock).map_err(io_err(&lock))?;
    let mut kubelet_version = fixture_kubelet_version(&lock_text);
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    // kiln bake wants `kubernetes.version` equal to the lock's kubelet version, with the
    // images' leading `v`; the fixture lock writes the stand-in's without it (`X.Y.Z-standin`).
    // Bake from a copy whose kube* entries say `vX.Y.Z-standin`, re-signed with the fixture's own throwaway
    // key (the bytes and hashes are untouched).
    if let Some(v) = kubelet_version.clone().filter(|v| !v.starts_with('v')) {
        let fixed = lock_text.replace(
            &format!("version = \"{v}\""),
            &format!("version = \"v{v}\""),
        );
        let copy = out.join("artifacts.lock");
        std::fs::write(&copy, fixed).map_err(io_err(&copy))?;
        run(Command::new(&tools.kiln)
            .args(["--quiet", "lock", "sign"])
            .arg(&copy)
            .arg("--secret-key")
            .arg(tools.fixture.join("keys/fixture.key")))?;
        lock = copy;
        kubelet_version = Some(format!("v{v}"));
    }
    let def = fixture_image_def(
        image,
        &fixture_artifacts(&lock_text),
        kubelet_version.as_deref(),
    )?;
    let def_path = out.join(format!("{image}.toml"));
    std::fs::write(&def_path, def).map_err(io_err(&def_path))?;
    let o = run(Command::new(&tools.kiln)
        .arg("--json")
        .arg("bake")
        .arg(&def_path)
        .args(["--format", format, "--arch", "amd64", "--out"])
        .arg(out)
        .arg("--lock")
        .arg(&lock)
        .arg("--trusted-key")
        .arg(tools.fixture.join("keys/fixture.pub"))
        .arg("--store")
        .arg(tools.fixture.join("mirror"))
        .arg("--firstboot")
        .arg(&tools.firstboot)
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

/// Writes `node.toml` (and its CA) into `dir` and returns its path.
pub fn node_toml(dir: &Path, cfg: &NodeConfig) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    make_ca(dir)?;
    let text = format!(
        "api_server = \"https://10.0.0.10:6443\"\ncluster_name = \"boot-test\"\n\
         join_mode = \"{}\"\nprovider = \"{}\"\ndeadline = {}\n\n\
         [ca]\nfile = \"ca.crt\"\n\n[bootstrap]\ntoken = \"07401b.f395accd246ae52d\"\n\n\
         [node]\nlabels = {{ \"node.kubernetes.io/role\" = \"worker\" }}\n",
        cfg.join_mode, cfg.provider, cfg.deadline
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

/// Files the report unit prints, one `KILN-TEST-FILE <path> <line>` per line.
pub const REPORTED_FILES: &[&str] = &[
    "/run/kiln/kubelet.env",
    "/run/kiln/failure",
    "/var/lib/kubelet/standin/args",
    "/run/cluster-api/bootstrap-success.complete",
    "/run/cluster-api/bootstrap-failure.reason",
    crate::pod::REPORT,
];

/// The bash script of the report unit: after kiln-firstboot has finished, print the node's
/// files and unit states on the console, then `KILN-TEST-DONE`.
pub fn report_script() -> String {
    let files = [REPORTED_FILES, crate::kubeadm::REPORTED_FILES]
        .concat()
        .join(" ");
    // Ordering alone is not enough when the kiln units arrive in a sysext merged after
    // systemd loaded its units, so wait for firstboot's final result in status.json too.
    format!(
        "for i in $(seq 600); do grep -Eq '\"result\": ?\"(success|failure)\"' /run/kiln/status.json 2>/dev/null && break; sleep 1; done
for f in {files}; do [ -f \"$f\" ] && sed \"s|^|KILN-TEST-FILE $f |\" \"$f\" && echo; done
for u in containerd kubelet kiln-firstboot; do echo \"KILN-TEST-UNIT $u $(systemctl is-active $u.service)\"; done
kiln-firstboot doctor >/run/kiln-test-doctor.txt 2>&1; echo \"KILN-TEST-DOCTOR-EXIT $?\"
sed 's/^/KILN-TEST-DOCTOR /' /run/kiln-test-doctor.txt
echo KILN-TEST-DONE"
    )
}

/// The outcome of one boot, parsed from the console.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The `KILN-STATUS` JSON.
    pub status: serde_json::Value,
    /// The console line that carried it (with its host time).
    pub status_line: Line,
    /// Files the report unit printed: path → lines.
    pub files: BTreeMap<String, Vec<String>>,
    /// Unit → `systemctl is-active` answer.
    pub units: BTreeMap<String, String>,
    /// `kiln-firstboot doctor`'s table, run on the node after firstboot: check → (verdict,
    /// detail).
    pub doctor: BTreeMap<String, (String, String)>,
    /// Its exit code.
    pub doctor_exit: Option<i32>,
    /// kiln-firstboot's per-phase console lines.
    pub phase_lines: Vec<Line>,
}

impl Outcome {
    /// Parses the console of a finished boot.
    pub fn parse(lines: &[Line]) -> Result<Outcome> {
        let status_line = lines
            .iter()
            .rev()
            .find(|l| l.text.starts_with("KILN-STATUS "))
            .cloned()
            .ok_or_else(|| Error::Missing {
                what: "a KILN-STATUS line on the console".into(),
                hint: "kiln-firstboot did not finish".into(),
            })?;
        let status: serde_json::Value =
            serde_json::from_str(&status_line.text["KILN-STATUS ".len()..]).map_err(|e| {
                Error::Command {
                    command: "parse KILN-STATUS".into(),
                    detail: format!("{e}: {}", status_line.text),
                }
            })?;
        let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut units = BTreeMap::new();
        let mut doctor = BTreeMap::new();
        let mut doctor_exit = None;
        for l in lines {
            if let Some(code) = l.text.strip_prefix("KILN-TEST-DOCTOR-EXIT ") {
                doctor_exit = code.trim().parse().ok();
            } else if let Some(row) = l.text.strip_prefix("KILN-TEST-DOCTOR ") {
                // `NAME  VERDICT DETAIL`; the header, remedy lines and the summary are skipped.
                let mut parts = row.splitn(2, char::is_whitespace);
                let (name, rest) = (
                    parts.next().unwrap_or(""),
                    parts.next().unwrap_or("").trim_start(),
                );
                let (verdict, detail) = rest.split_once(' ').unwrap_or((rest, ""));
                if matches!(verdict, "ok" | "warn" | "fail" | "skip") && !name.is_empty() {
                    doctor.insert(
                        name.to_string(),
                        (verdict.to_string(), detail.trim().to_string()),
                    );
                }
            }
            if let Some(rest) = l.text.strip_prefix("KILN-TEST-FILE ") {
                let (path, line) = rest.split_once(' ').unwrap_or((rest, ""));
                files
                    .entry(path.to_string())
                    .or_default()
                    .push(line.to_string());
            } else if let Some(rest) = l.text.strip_prefix("KILN-TEST-UNIT ") {
                if let Some((u, s)) = rest.split_once(' ') {
                    units.insert(u.to_string(), s.to_string());
                }
            }
        }
        let phase_lines = lines
            .iter()
            .filter(|l| l.text.starts_with("kiln-firstboot: phase="))
            .cloned()
            .collect();
        Ok(Outcome {
            status,
            status_line,
            files,
            units,
            doctor,
            doctor_exit,
            phase_lines,
        })
    }

    /// `result` of the status.
    pub fn result(&self) -> &str {
        self.status["result"].as_str().unwrap_or("")
    }

    /// `reason` of the status.
    pub fn reason(&self) -> &str {
        self.status["reason"].as_str().unwrap_or("")
    }

    /// A `KEY=value` from `/run/kiln/kubelet.env` as reported.
    pub fn kubelet_env(&self, key: &str) -> Option<String> {
        self.files
            .get("/run/kiln/kubelet.env")?
            .iter()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim_matches('"').to_string())
    }

    /// The stand-in kubelet's recorded arguments.
    pub fn kubelet_args(&self) -> Vec<String> {
        self.files
            .get("/var/lib/kubelet/standin/args")
            .cloned()
            .unwrap_or_default()
    }

    /// A phase's (start_ms, end_ms, result) from the status.
    pub fn phase(&self, name: &str) -> Option<(u64, u64, String)> {
        self.status["phases"].as_array()?.iter().find_map(|p| {
            (p["name"] == name).then(|| {
                (
                    p["start_ms"].as_u64().unwrap_or(0),
                    p["end_ms"].as_u64().unwrap_or(0),
                    p["result"].as_str().unwrap_or("").to_string(),
                )
            })
        })
    }

    /// Milliseconds kiln-firstboot itself worked: every phase but the two waits for kubelet.
    pub fn firstboot_own_ms(&self) -> u64 {
        ["config", "metadata", "write", "start-kubelet"]
            .iter()
            .filter_map(|p| self.phase(p))
            .map(|(s, e, _)| e.saturating_sub(s))
            .sum()
    }
}

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

    #[test]
    fn outcome_is_read_off_the_console() {
        let lines: Vec<Line> = [
            "kiln-firstboot: phase=config result=success ms=1",
            "KILN-TEST-FILE /run/kiln/kubelet.env NODE_IP=10.0.3.7",
            "KILN-TEST-FILE /run/kiln/kubelet.env KUBELET_ARGS=\"--max-pods=29\"",
            "KILN-TEST-UNIT containerd active",
            "KILN-TEST-DOCTOR-EXIT 9",
            "KILN-TEST-DOCTOR CHECK                 VERDICT DETAIL",
            "KILN-TEST-DOCTOR swap                  ok      no swap in /proc/swaps",
            "KILN-TEST-DOCTOR api-server            fail    https://10.0.0.10:6443: cannot connect",
            "KILN-TEST-DOCTOR                               remedy: check the route",
            "KILN-TEST-DOCTOR doctor: 1 ok, 0 warn, 1 fail, 0 skipped",
            r#"KILN-STATUS {"result":"success","reason":"OK","phases":[{"name":"config","start_ms":10,"end_ms":12,"result":"success"},{"name":"wait-joined","start_ms":12,"end_ms":900,"result":"success"}]}"#,
        ]
        .iter()
        .enumerate()
        .map(|(i, t)| Line { host_ms: i as u64, text: t.to_string() })
        .collect();
        let o = Outcome::parse(&lines).unwrap();
        assert_eq!(o.result(), "success");
        assert_eq!(o.doctor_exit, Some(9));
        assert_eq!(o.doctor.len(), 2, "{:?}", o.doctor);
        assert_eq!(
            o.doctor["swap"],
            ("ok".to_string(), "no swap in /proc/swaps".to_string())
        );
        assert_eq!(o.doctor["api-server"].0, "fail");
        assert_eq!(o.kubelet_env("NODE_IP").as_deref(), Some("10.0.3.7"));
        assert_eq!(
            o.kubelet_env("KUBELET_ARGS").as_deref(),
            Some("--max-pods=29")
        );
        assert_eq!(o.units["containerd"], "active");
        assert_eq!(o.firstboot_own_ms(), 2);
        assert_eq!(o.phase_lines.len(), 1);
        assert!(Outcome::parse(&lines[..2]).is_err());
    }
}
