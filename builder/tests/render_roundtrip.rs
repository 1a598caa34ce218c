//! The kiln binary end to end: `kiln render` for every provisioner, then `kiln render --check`
//! on what it wrote must list exactly the same files, modes and hashes; output is
//! deterministic; contract violations fail the check.

use crate::render_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use kiln::render::{NodeConfig, NodeFile};
use render_support::*;
use serde_json::Value;

fn expected(dir: &Path) -> Vec<NodeFile> {
    NodeConfig::load(&dir.join("node.toml")).unwrap().files()
}

/// `kiln --json render --check PATH` → (path, mode, size, sha256) per file.
fn check_json(path: &Path) -> Vec<(String, String, u64, String)> {
    let out = run(kiln().args(["--json", "render", "--check"]).arg(path));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        // the file events; then `checked` and the `result` (docs/cli.md, JSON output)
        .filter(|v| v["event"] == "file")
        .map(|v| {
            (
                v["path"].as_str().unwrap().to_string(),
                v["mode"].as_str().unwrap().to_string(),
                v["size"].as_u64().unwrap(),
                v["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn listing(files: &[NodeFile]) -> Vec<(String, String, u64, String)> {
    files
        .iter()
        .map(|f| {
            (
                f.linux_path(),
                format!("{:04o}", f.mode),
                f.contents.len() as u64,
                f.sha256(),
            )
        })
        .collect()
}

#[test]
fn every_provisioner_round_trips_through_check() {
    for mode in ["kubelet", "kubeadm"] {
        let dir = node_dir(&full_node_toml(mode));
        let want = listing(&expected(dir.path()));
        for provisioner in ["cloud-init", "ignition", "windows"] {
            for gzip in [false, true] {
                let out = dir.path().join(format!("{provisioner}-{gzip}.ud"));
                let mut cmd = kiln();
                cmd.args(["render", "--provisioner", provisioner])
                    .arg(dir.path().join("node.toml"))
                    .arg("--output")
                    .arg(&out);
                if gzip {
                    cmd.arg("--gzip");
                }
                let report = String::from_utf8(run(&mut cmd).stdout).unwrap();
                assert!(report.contains("EC2 user data"), "{report}");
                // User data holds secrets: the file is the owner's only.
                let perm = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
                assert_eq!(perm, 0o600, "{}", out.display());
                assert_eq!(check_json(&out), want, "{mode} {provisioner} gzip={gzip}");
            }
        }
        let tree = dir.path().join("tree");
        run(kiln()
            .args(["render", "-p", "files"])
            .arg(dir.path().join("node.toml"))
            .arg("-o")
            .arg(&tree));
        assert_eq!(check_json(&tree), want, "{mode} files");
        firstboot_accepts(&tree, mode);
        for f in expected(dir.path()) {
            let meta = std::fs::metadata(tree.join("etc/kiln").join(&f.name)).unwrap();
            assert_eq!(meta.permissions().mode() & 0o777, f.mode, "{}", f.name);
        }
    }
}

#[test]
fn output_is_deterministic_and_goes_to_stdout_by_default() {
    let dir = node_dir(&full_node_toml("kubelet"));
    for provisioner in ["cloud-init", "ignition", "windows"] {
        let render = || {
            run(kiln()
                .args(["render", "-p", provisioner])
                .arg(dir.path().join("node.toml")))
        };
        let (a, b) = (render(), render());
        assert!(!a.stdout.is_empty());
        assert_eq!(a.stdout, b.stdout, "{provisioner}");
        // The size report went to stderr, so stdout is exactly the user data.
        let stderr = String::from_utf8(a.stderr).unwrap();
        assert!(
            stderr.contains(&format!(
                "{provisioner} user data, {} bytes",
                a.stdout.len()
            )),
            "{stderr}"
        );
        // --check reads stdin too.
        let mut child = kiln()
            .args(["render", "--check", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&a.stdout).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("writes 6 kiln contract files"), "{text}");
    }
}

#[test]
fn the_files_tree_drops_a_stale_credential() {
    let dir = node_dir(&full_node_toml("kubelet"));
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("etc/kiln")).unwrap();
    std::fs::write(tree.join("etc/kiln/bootstrap-kubeconfig"), "old").unwrap();
    run(kiln()
        .args(["render", "-p", "files"])
        .arg(dir.path().join("node.toml"))
        .arg("-o")
        .arg(&tree));
    assert!(!tree.join("etc/kiln/bootstrap-kubeconfig").exists());
    assert_eq!(check_json(&tree), listing(&expected(dir.path())));
}

#[test]
fn check_fails_on_contract_violations_and_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let ud = dir.path().join("hand-written");
    std::fs::write(
        &ud,
        "#cloud-config\nruncmd: [[\"sh\", \"-c\", \"echo hi\"]]\nwrite_files:\n\
         - path: /etc/kiln/node.env\n  content: |\n    KILN_CONTRACT=1\n    API_SERVER=https://a:6443\n    CLUSTER_NAME=c\n\
         - path: /etc/kiln/ca.crt\n  content: pem\n\
         - path: /etc/kiln/bootstrap-token\n  permissions: '0644'\n  content: abcdef.0123456789abcdef\n",
    )
    .unwrap();
    let out = kiln()
        .args(["render", "--check"])
        .arg(&ud)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "a failed check exits 3");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stdout.contains("note: also sets cloud-init module `runcmd`"),
        "{stdout}"
    );
    assert!(stderr.contains("breaks node contract v1"), "{stderr}");
    assert!(
        stderr.contains("/etc/kiln/bootstrap-token: mode 0644, the contract requires 0600"),
        "{stderr}"
    );

    // --quiet: no table, no notes on stdout; the verdict (stderr, exit 3) is unchanged.
    let out = kiln()
        .args(["--quiet", "render", "--check"])
        .arg(&ud)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert!(String::from_utf8_lossy(&out.stderr).contains("breaks node contract v1"));
}

#[test]
fn usage_errors_are_clear() {
    let dir = node_dir(&full_node_toml("kubelet"));
    let node = dir.path().join("node.toml");
    let out = kiln()
        .args(["render", "-p", "files"])
        .arg(&node)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--output DIR"));
    let out = kiln().args(["render"]).arg(&node).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "clap usage error");
    let out = kiln()
        .args(["render", "-p", "cloud-init"])
        .arg(dir.path().join("nope.toml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nope.toml: cannot read"), "{stderr}");
}

/// The worked examples in docs/render.md are these files; they must be what kiln renders now.
/// `make render-examples` (KILN_BLESS=1) rewrites them after an intended change.
#[test]
fn docs_examples_are_current() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/render");
    let bless = std::env::var_os("KILN_BLESS").is_some();
    for (toml, provisioner, golden) in [
        ("node.toml", "cloud-init", "user-data.cloud-init"),
        ("node.toml", "ignition", "config.ign"),
        ("node.toml", "windows", "user-data.windows.ps1"),
        (
            "node-kubeadm.toml",
            "cloud-init",
            "user-data-kubeadm.cloud-init",
        ),
    ] {
        let out = run(kiln()
            .args(["render", "-p", provisioner])
            .arg(examples.join(toml)));
        let path = examples.join(golden);
        if bless {
            std::fs::write(&path, &out.stdout).unwrap();
            continue;
        }
        let want = std::fs::read(&path).unwrap_or_default();
        assert!(
            out.stdout == want,
            "{} is stale: run `make render-examples`\n--- rendered ---\n{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

#[test]
fn firstboot_reads_the_kubeconfig_and_kubelet_config_variants() {
    let dir = node_dir(
        "api_server = \"https://api.example.internal\"\ncluster_name = \"c1\"\n\
         [ca]\nfile = \"ca.crt\"\n[bootstrap]\nkubeconfig_file = \"bootstrap.kubeconfig\"\n\
         [kubelet]\nconfig_file = \"kubelet.yaml\"\n",
    );
    std::fs::write(
        dir.path().join("bootstrap.kubeconfig"),
        "apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("kubelet.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
    )
    .unwrap();
    let tree = dir.path().join("tree");
    run(kiln()
        .args(["render", "-p", "files"])
        .arg(dir.path().join("node.toml"))
        .arg("-o")
        .arg(&tree));
    let image = tree.join("usr/lib/kiln");
    std::fs::create_dir_all(&image).unwrap();
    std::fs::write(
        image.join("image.env"),
        "KILN_CONTRACT=1\nKILN_IMAGE_ID=sha256:00\nKILN_IMAGE_NAME=t\nKILN_VERSION=0.1.0\n\
         KILN_OS=linux\nKILN_ARCH=amd64\nKUBERNETES_VERSION=v1.30.0-test\n",
    )
    .unwrap();
    let config = kiln_firstboot::config::load(
        &kiln_firstboot::contract::paths::NodePaths::under(&tree),
        None,
    )
    .unwrap();
    assert_eq!(
        config.credential,
        kiln_firstboot::config::Credential::Kubeconfig
    );
    // kubelet.config_file is a drop-in now: the baked config stays kubelet's --config.
    assert_eq!(config.kubelet_config, "/usr/lib/kiln/kubelet-config.yaml");
    assert_eq!(
        config.kubelet_dropin.as_deref(),
        Some(
            "{\n  \"apiVersion\": \"kubelet.config.k8s.io/v1beta1\",\n  \"kind\": \"KubeletConfiguration\"\n}\n"
        )
    );
    assert_eq!(config.node.provider, None, "PROVIDER=auto");
    assert_eq!(config.node.api_server, "https://api.example.internal");
}

/// Renders `provisioner` user data for a kubelet-mode node.toml into `dir`.
fn rendered(dir: &Path, provisioner: &str) -> String {
    let out = dir.join(format!("{provisioner}.ud"));
    run(kiln()
        .args(["--quiet", "render", "-p", provisioner])
        .arg(dir.join("node.toml"))
        .arg("-o")
        .arg(&out));
    std::fs::read_to_string(out).unwrap()
}

/// `kiln render --check` on `text`: its exit code and stderr.
fn check_text(dir: &Path, name: &str, text: &str) -> (Option<i32>, String) {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    let out = kiln().args(["render", "--check"]).arg(&p).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 34 item 4: user data that breaks the contract around the files (the directory's mode
/// and owner, a link in its place or into kiln's other paths, a secret's owner, a second write
/// of the token appended to the first) fails `--check`, naming the payload and the path.
#[test]
fn check_refuses_owners_modes_and_links_around_the_contract_files() {
    let dir = node_dir(&full_node_toml("kubelet"));
    let ign: Value = serde_json::from_str(&rendered(dir.path(), "ignition")).unwrap();
    let (code, _) = check_text(dir.path(), "good.ign", &ign.to_string());
    assert_eq!(code, Some(0), "the rendered config passes");
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit, &str); 7] = [
        (
            "dir-0777",
            |v| v["storage"]["directories"][0]["mode"] = 0o777.into(),
            "/etc/kiln",
        ),
        (
            "dir-uid",
            |v| v["storage"]["directories"][0]["user"] = serde_json::json!({"id": 1000}),
            "/etc/kiln",
        ),
        (
            "dir-group",
            |v| v["storage"]["directories"][0]["group"] = serde_json::json!({"name": "users"}),
            "/etc/kiln",
        ),
        (
            "dir-link",
            |v| {
                v["storage"]["links"] = serde_json::json!([{"path": "/etc/kiln", "target": "/tmp"}])
            },
            "/etc/kiln",
        ),
        (
            "token-uid",
            |v| {
                for f in v["storage"]["files"].as_array_mut().unwrap() {
                    if f["path"] == "/etc/kiln/bootstrap-token" {
                        f["user"] = serde_json::json!({"id": 1000});
                    }
                }
            },
            "/etc/kiln/bootstrap-token",
        ),
        (
            "usr-lib-link",
            |v| v["storage"]["links"] = serde_json::json!([{"path": "/usr/lib/kiln/kubelet-config.yaml", "target": "/tmp/k"}]),
            "/usr/lib/kiln/kubelet-config.yaml",
        ),
        (
            "run-link",
            |v| {
                v["storage"]["links"] =
                    serde_json::json!([{"path": "/run//kiln", "target": "/tmp", "hard": false}])
            },
            "/run/kiln",
        ),
    ];
    for (name, edit, path) in cases {
        let mut v = ign.clone();
        edit(&mut v);
        let (code, err) = check_text(dir.path(), &format!("{name}.ign"), &v.to_string());
        assert_eq!(code, Some(3), "{name}: {err}");
        assert!(
            err.contains(&format!("{name}.ign")) && err.contains(path),
            "{name}: {err}"
        );
        assert!(err.contains("expected"), "{name}: {err}");
    }

    let ci = rendered(dir.path(), "cloud-init");
    let (code, _) = check_text(dir.path(), "good.ci", &ci);
    assert_eq!(code, Some(0), "the rendered cloud-config passes");
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&ci).unwrap();
    let files = doc["write_files"].as_sequence_mut().unwrap();
    let at = files
        .iter()
        .position(|f| f["path"].as_str() == Some("/etc/kiln/bootstrap-token"))
        .unwrap();
    let mut owned = doc.clone();
    owned["write_files"][at]["owner"] = "nobody".into();
    let mut appended = doc.clone();
    let mut second = appended["write_files"][at].clone();
    second["append"] = true.into();
    appended["write_files"]
        .as_sequence_mut()
        .unwrap()
        .push(second);
    for (name, v) in [("owner.ci", owned), ("append.ci", appended)] {
        let text = format!("#cloud-config\n{}", serde_yaml_ng::to_string(&v).unwrap());
        let (code, err) = check_text(dir.path(), name, &text);
        assert_eq!(code, Some(3), "{name}: {err}");
        assert!(
            err.contains(name) && err.contains("/etc/kiln/bootstrap-token"),
            "{name}: {err}"
        );
        assert!(err.contains("expected"), "{name}: {err}");
    }
}

/// `[trust]` on Windows: the bundle is written, and each of its certificates is added to
/// `LocalMachine\Root` (what Go on Windows verifies against) by one `Add-KilnRoot` line with
/// its DER; `--check` reads them back and refuses a payload whose lines and bundle disagree.
#[test]
fn windows_trust_goes_into_the_machine_root_store() {
    let toml = "api_server = \"https://127.0.0.1:6443\"\ncluster_name = \"c\"\n\
                [ca]\nfile = \"ca.crt\"\n[bootstrap]\ntoken = \"07401b.f395accd246ae52d\"\n\
                [trust]\nfile = \"bundle.pem\"\n";
    let dir = node_dir(toml);
    let second = make_ca(dir.path(), "rsa");
    let bundle = format!(
        "{}{}",
        std::fs::read_to_string(dir.path().join("ca.crt")).unwrap(),
        std::fs::read_to_string(&second).unwrap()
    );
    std::fs::write(dir.path().join("bundle.pem"), &bundle).unwrap();
    let ps = rendered(dir.path(), "windows");
    assert!(
        ps.contains("Write-KilnFile 'trust.d\\bundle.crt' '"),
        "{ps}"
    );
    let ders = kiln::render::pki::pem_certificates(&bundle).unwrap();
    let lines: Vec<&str> = ps
        .lines()
        .filter(|l| l.starts_with("Add-KilnRoot "))
        .collect();
    assert_eq!(lines.len(), 2, "{ps}");
    for (line, der) in lines.iter().zip(&ders) {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        assert_eq!(*line, format!("Add-KilnRoot '{b64}'"));
    }
    assert!(
        ps.contains("X509Store -ArgumentList 'Root', 'LocalMachine'"),
        "{ps}"
    );
    let (code, err) = check_text(dir.path(), "good.ps1", &ps);
    assert_eq!(code, Some(0), "{err}");
    // One certificate fewer in the store than in the bundle: refused.
    let dropped: String = ps
        .lines()
        .filter(|l| *l != lines[1])
        .map(|l| format!("{l}\n"))
        .collect();
    // A payload --check cannot read as kiln's (as a malformed Write-KilnFile line): exit 1.
    let (code, err) = check_text(dir.path(), "dropped.ps1", &dropped);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("one Add-KilnRoot line per certificate of trust.d/bundle.crt (2 there)"),
        "{err}"
    );
}

/// The hostile review's ways around the Windows read-back: kiln's commands in another case or
/// with a tab (PowerShell would run them; --check would not have seen them), and a second write
/// of the bundle (the node keeps the last).
#[test]
fn windows_check_refuses_other_spellings_and_second_writes() {
    let toml = "api_server = \"https://127.0.0.1:6443\"\ncluster_name = \"c\"\n\
                [ca]\nfile = \"ca.crt\"\n[bootstrap]\ntoken = \"07401b.f395accd246ae52d\"\n\
                [trust]\nfile = \"ca.crt\"\n";
    let dir = node_dir(toml);
    let ps = rendered(dir.path(), "windows");
    let root = ps.lines().find(|l| l.starts_with("Add-KilnRoot ")).unwrap();
    let write = ps
        .lines()
        .find(|l| l.starts_with("Write-KilnFile 'trust.d\\bundle.crt'"))
        .unwrap();
    for (name, extra, needle) in [
        (
            "lower.ps1",
            root.replacen("Add-KilnRoot", "add-kilnroot", 1),
            "spelled as kiln render writes it",
        ),
        (
            "tab.ps1",
            root.replacen("Add-KilnRoot ", "Add-KilnRoot\t", 1),
            "spelled as kiln render writes it",
        ),
        (
            "twice.ps1",
            write.to_string(),
            "trust.d/bundle.crt is written twice",
        ),
    ] {
        let text = ps.replace("</powershell>", &format!("{extra}\n</powershell>"));
        let (code, err) = check_text(dir.path(), name, &text);
        assert_ne!(code, Some(0), "{name}: {err}");
        assert!(err.contains(needle), "{name}: {err}");
    }
}
