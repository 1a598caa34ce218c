//! Rendered user data checked by the real validators: Debian's `cloud-init schema`, cloud-init's
//! own `write_files` module writing into a temp root, and Ignition's published 3.4 JSON schema
//! (vendored under tests/data/render/ignition-3.4/).

use crate::render_support;

use std::path::Path;
use std::process::Command;

use kiln::render::{self, files, NodeConfig, NodeFile, Provisioner, RenderOptions};
use render_support::*;
use serde_json::Value;

fn node_files(join_mode: &str) -> (tempfile::TempDir, Vec<NodeFile>) {
    let dir = node_dir(&full_node_toml(join_mode));
    let files = NodeConfig::load(&dir.path().join("node.toml"))
        .unwrap()
        .files();
    (dir, files)
}

/// Extra files that make every encoding path of the renderers run.
fn awkward_files(mut base: Vec<NodeFile>) -> Vec<NodeFile> {
    // In the contract's order, as a tree reads back: after node.env, ca.crt and the credential.
    base.insert(
        3,
        NodeFile {
            name: "kubelet-config.yaml".into(),
            mode: 0o644,
            // Tabs, no final newline and non-ASCII force base64 in cloud-init.
            contents: "kind: KubeletConfiguration\n# caf\u{e9}\tx"
                .as_bytes()
                .to_vec(),
        },
    );
    base
}

fn cloud_init_schema(path: &Path) -> std::process::Output {
    Command::new("cloud-init")
        .args(["schema", "--config-file"])
        .arg(path)
        .output()
        .expect("cloud-init is installed by scripts/deps.sh")
}

#[test]
fn cloud_init_output_passes_the_real_schema_check() {
    let (dir, files) = node_files("kubelet");
    for (label, files) in [("plain", files.clone()), ("awkward", awkward_files(files))] {
        let payload =
            render::render_payload(&files, Provisioner::CloudInit, RenderOptions::default())
                .unwrap();
        let path = dir.path().join(format!("user-data-{label}"));
        std::fs::write(&path, &payload).unwrap();
        let out = cloud_init_schema(&path);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("Valid cloud-config"),
            "{label}: cloud-init schema rejected it:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The validator is real: it refuses what cloud-init would refuse.
    let bad = dir.path().join("bad");
    std::fs::write(
        &bad,
        "#cloud-config\nwrite_files:\n  - path: /etc/kiln/x\n    permissions: [1]\n",
    )
    .unwrap();
    assert!(!cloud_init_schema(&bad).status.success());
}

/// Runs cloud-init's own write_files module on user data, rebasing every path under `root`.
fn cloud_init_write_files(user_data: &Path, root: &Path) {
    let script = r#"
import sys
from cloudinit import util
from cloudinit.config.cc_write_files import write_files
text = util.decomp_gzip(open(sys.argv[1], 'rb').read(), quiet=True)
files = util.load_yaml(text)['write_files']
for f in files:
    f['path'] = sys.argv[2] + f['path']
write_files('write_files', files, 'root:root')
"#;
    // Debian's python3, which is the one that has the cloudinit package.
    run(Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(script)
        .arg(user_data)
        .arg(root));
}

#[test]
fn real_cloud_init_writes_exactly_the_rendered_files() {
    let (dir, files) = node_files("kubeadm");
    let files = awkward_files(files);
    for gzip in [false, true] {
        let payload = render::render_payload(
            &files,
            Provisioner::CloudInit,
            RenderOptions {
                gzip,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(payload.starts_with(&[0x1f, 0x8b]), gzip);
        let ud = dir.path().join(format!("ud-{gzip}"));
        std::fs::write(&ud, &payload).unwrap();
        let root = dir.path().join(format!("root-{gzip}"));
        std::fs::create_dir(&root).unwrap();
        cloud_init_write_files(&ud, &root);
        let written = files::read_tree(&root).unwrap();
        assert_eq!(written, files, "gzip={gzip}");
        firstboot_accepts(&root, "kubeadm");
        // ...and --check reads the same list back.
        assert_eq!(render::check_payload(&payload, "ud").unwrap().files, files);
    }
}

/// Resolves a `#/definitions/...` reference inside the schema.
fn resolve<'a>(schema: &'a Value, node: &'a Value) -> &'a Value {
    match node.get("$ref").and_then(Value::as_str) {
        Some(r) => resolve(schema, schema.pointer(r.trim_start_matches('#')).expect(r)),
        None => node,
    }
}

/// Fails on any key the schema does not define. The published schema allows unknown keys, but
/// Ignition's parser warns about them and a typo would silently do nothing.
fn unknown_keys(schema: &Value, node: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
    let node = resolve(schema, node);
    let parts: Vec<&Value> = match node.get("allOf").and_then(Value::as_array) {
        Some(all) => all.iter().map(|n| resolve(schema, n)).collect(),
        None => vec![node],
    };
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match parts
                    .iter()
                    .find_map(|p| p.get("properties").and_then(|ps| ps.get(k)))
                {
                    Some(sub) => unknown_keys(schema, sub, v, &format!("{at}.{k}"), out),
                    None => out.push(format!("{at}.{k}")),
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = parts.iter().find_map(|p| p.get("items")) {
                for (i, v) in items.iter().enumerate() {
                    unknown_keys(schema, sub, v, &format!("{at}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

fn ignition_schema() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/render/ignition-3.4/ignition.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn ignition_output_passes_the_published_3_4_schema() {
    let schema = ignition_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let (_dir, files) = node_files("kubelet");
    for gzip in [false, true] {
        let files = awkward_files(files.clone());
        let payload = render::render_payload(
            &files,
            Provisioner::Ignition,
            RenderOptions {
                gzip,
                ..Default::default()
            },
        )
        .unwrap();
        let config: Value = serde_json::from_slice(&payload).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&config)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "schema errors: {errors:?}");
        let mut unknown = Vec::new();
        unknown_keys(&schema, &schema, &config, "$", &mut unknown);
        assert!(unknown.is_empty(), "keys outside the 3.4 spec: {unknown:?}");
        assert_eq!(config["ignition"]["version"], "3.4.0");
        for f in config["storage"]["files"].as_array().unwrap() {
            let source = f["contents"]["source"].as_str().unwrap();
            assert!(source.starts_with("data:"), "network fetch in {f}");
        }
        assert_eq!(render::check_payload(&payload, "ign").unwrap().files, files);
    }
    // The schema check is real: a mode given as an octal string is refused.
    let mut bad: Value = serde_json::from_slice(
        &render::render_payload(&files, Provisioner::Ignition, RenderOptions::default()).unwrap(),
    )
    .unwrap();
    bad["storage"]["files"][0]["mode"] = Value::String("0644".into());
    assert!(!validator.is_valid(&bad));
    bad["storage"]["files"][0]["mode"] = Value::from(420);
    bad["storage"]["files"][0]["contents"]["sourc"] = Value::String("typo".into());
    let mut unknown = Vec::new();
    unknown_keys(&schema, &schema, &bad, "$", &mut unknown);
    assert_eq!(unknown, ["$.storage.files[0].contents.sourc"]);
}

#[test]
fn vendored_schema_is_the_upstream_file() {
    // Pinned so an accidental edit of the vendored file is caught (see its README).
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/render/ignition-3.4/ignition.json");
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(bytes.len(), 16_193);
    let readme = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/render/ignition-3.4/README.md"),
    )
    .unwrap();
    let sum = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    assert!(
        readme.contains(&sum),
        "README.md does not record sha256 {sum}"
    );
}

fn render_cli_ignition(dir: &Path, spec: &str, gzip: bool) -> std::path::PathBuf {
    let out = dir.join(format!("config-{spec}-{gzip}.ign"));
    let mut cmd = kiln();
    cmd.args([
        "--quiet",
        "render",
        "-p",
        "ignition",
        "--ignition-spec",
        spec,
    ])
    .arg(dir.join("node.toml"))
    .arg("-o")
    .arg(&out);
    if gzip {
        cmd.arg("--gzip");
    }
    run(&mut cmd);
    out
}

#[test]
fn real_ignition_validates_and_writes_the_rendered_files() {
    let (dir, files) = node_files("kubeadm");
    let d = dir.path();
    // Ignition 2.14 reads spec 3.3.0 at most: it refuses 3.4.0, which is why
    // --ignition-spec 3.3.0 exists; everything else in the config is the same.
    let v34 = render_cli_ignition(d, "3.4.0", false);
    let out = Command::new(IGNITION_VALIDATE)
        .arg(&v34)
        .output()
        .expect("ignition is installed by scripts/deps.sh");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unsupported config version"));

    for gzip in [false, true] {
        let config = render_cli_ignition(d, "3.3.0", gzip);
        let out = run(Command::new(IGNITION_VALIDATE).arg(&config));
        assert!(
            out.stdout.is_empty() && out.stderr.is_empty(),
            "warnings: {out:?}"
        );

        let (sysroot, out) = run_ignition(&d.join(format!("ign-{gzip}")), &config);
        let log = String::from_utf8_lossy(&out.stdout);
        assert!(log.contains("Ignition finished successfully"), "{log}");
        assert_eq!(files::read_tree(&sysroot).unwrap(), files, "gzip={gzip}");
        firstboot_accepts(&sysroot, "kubeadm");
    }
}

/// cloudbase-init 1.1.9 from PyPI, installed in its own venv by scripts/deps.sh.
const CLOUDBASE_INIT_PYTHON: &str = "/opt/kiln/cloudbase-init/bin/python";

/// Runs cloudbase-init's real `UserDataPlugin` on `user_data`; only the OS utilities that would
/// start powershell.exe are replaced by a recorder (see tests/data/render/cloudbase_init_run.py).
fn cloudbase_init_runs(user_data: &Path) -> Value {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/render/cloudbase_init_run.py");
    let out = Command::new(CLOUDBASE_INIT_PYTHON)
        .arg(script)
        .arg(user_data)
        .output()
        .expect("cloudbase-init's venv is installed by scripts/deps.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn real_cloudbase_init_runs_the_windows_user_data_as_powershell() {
    let (dir, files) = node_files("kubelet");
    for gzip in [false, true] {
        let payload = render::render_payload(
            &files,
            Provisioner::Windows,
            RenderOptions {
                gzip,
                ..Default::default()
            },
        )
        .unwrap();
        let path = dir.path().join(format!("windows-{gzip}"));
        std::fs::write(&path, &payload).unwrap();
        let report = cloudbase_init_runs(&path);
        let runs = report["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1, "{report}");
        assert_eq!(runs[0]["executor"], "powershell", "{report}");
        assert_eq!(runs[0]["sysnative"], true, "64-bit PowerShell");
        // What PowerShell receives is exactly the block between the tags...
        let plain = if gzip {
            render::gunzip(&payload, "p").unwrap()
        } else {
            payload.clone()
        };
        let text = String::from_utf8(plain).unwrap();
        let body = text
            .trim_start_matches("<powershell>")
            .trim_end()
            .trim_end_matches("</powershell>")
            .trim();
        let script = runs[0]["script"].as_str().unwrap();
        assert_eq!(script, body);
        // ...and it still carries every file.
        let handed = format!("<powershell>\n{script}\n</powershell>\n");
        assert_eq!(
            render::check_payload(handed.as_bytes(), "ps")
                .unwrap()
                .files,
            files
        );
    }
    // The harness tells formats apart: a shell script is not run as PowerShell.
    let sh = dir.path().join("sh");
    std::fs::write(&sh, "rem cmd \necho hi\n").unwrap();
    assert_eq!(cloudbase_init_runs(&sh)["runs"][0]["executor"], "process");
}

/// Builds multipart user data with cloud-init's own `make-mime`.
fn make_mime(dir: &Path, name: &str, parts: &[&Path]) -> std::path::PathBuf {
    let mut cmd = Command::new("cloud-init");
    cmd.args(["devel", "make-mime"]);
    for p in parts {
        cmd.arg("-a").arg(format!("{}:cloud-config", p.display()));
    }
    let out = run(&mut cmd);
    let path = dir.join(name);
    std::fs::write(&path, out.stdout).unwrap();
    path
}

/// Merges multipart user data with cloud-init's own part handler; returns the merged file.
fn cloud_init_merge(user_data: &Path) -> std::path::PathBuf {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/render/cloud_init_merge.py");
    let merged = user_data.with_extension("merged");
    run(Command::new("/usr/bin/python3")
        .arg(script)
        .arg(user_data)
        .arg(&merged));
    merged
}

#[test]
fn multipart_user_data_merges_like_cloud_init_and_check_agrees() {
    let (dir, files) = node_files("kubelet");
    let d = dir.path();
    let kiln_part = d.join("kiln.yaml");
    std::fs::write(
        &kiln_part,
        render::render_payload(&files, Provisioner::CloudInit, RenderOptions::default()).unwrap(),
    )
    .unwrap();
    let theirs = d.join("theirs.yaml");
    std::fs::write(
        &theirs,
        "#cloud-config\nwrite_files:\n  - path: /etc/motd\n    content: hello\n",
    )
    .unwrap();
    let theirs_appending = d.join("theirs-appending.yaml");
    std::fs::write(
        &theirs_appending,
        "#cloud-config\nmerge_how: 'list(append)+dict(no_replace,recurse_list)+str()'\n\
         write_files:\n  - path: /etc/motd\n    content: hello\n",
    )
    .unwrap();

    // (parts in order, does kiln's write_files survive the merge?)
    let cases: [(&str, Vec<&Path>, bool); 3] = [
        ("theirs-then-kiln", vec![&theirs, &kiln_part], true),
        ("kiln-then-theirs", vec![&kiln_part, &theirs], false),
        (
            "kiln-then-appending",
            vec![&kiln_part, &theirs_appending],
            true,
        ),
    ];
    for (name, parts, survives) in cases {
        let mime = make_mime(d, name, &parts);
        let merged = cloud_init_merge(&mime);
        // What real cloud-init writes from the merged config...
        let root = d.join(format!("root-{name}"));
        std::fs::create_dir(&root).unwrap();
        cloud_init_write_files(&merged, &root);
        let real = if root.join("etc/kiln").exists() {
            files::read_tree(&root).unwrap()
        } else {
            Vec::new()
        };
        assert_eq!(real.is_empty(), !survives, "{name}");
        if survives {
            assert_eq!(real, files, "{name}");
            assert_eq!(
                std::fs::read(root.join("etc/motd")).unwrap(),
                b"hello",
                "{name}"
            );
        }
        // ...is what --check predicts from the multipart message.
        let checked = render::check_payload(&std::fs::read(&mime).unwrap(), name).unwrap();
        assert_eq!(checked.files, real, "{name}");
        assert!(
            checked.notes.iter().any(|n| n.contains("/etc/motd")),
            "{name}: {:?}",
            checked.notes
        );
        assert_eq!(
            render::contract_problems(&checked.files).is_empty(),
            survives,
            "{name}"
        );
    }
}
