//! `kiln render --sysext`: the Ignition that places a baked Flatcar sysext, run by Debian's
//! real Ignition (2.14, spec 3.3.0) against a loopback HTTP mirror: the image lands
//! byte-identical where systemd-sysext finds it, with the bake's transfer file and the
//! sysupdate timer; a wrong hash is refused by Ignition itself; `render --check` accepts what
//! kiln emits and refuses an unverified remote source.

use crate::render_support;
#[path = "../../testkit/serve.rs"]
mod serve;

use std::path::{Path, PathBuf};
use std::process::Command;

use render_support::*;
use serde_json::Value;

/// A bake output directory: a `.raw` and its transfer file, as `kiln bake --format sysext`
/// names them. The image bytes are not a squashfs: Ignition only moves and hashes them.
fn bake_dir(dir: &Path) -> (PathBuf, Vec<u8>) {
    let raw = dir.join("kubernetes-v1.36.1-x86-64.raw");
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&raw, &bytes).unwrap();
    std::fs::write(
        dir.join("kubernetes.conf"),
        "[Transfer]\nVerify=false\n\n[Source]\nType=url-file\nPath=https://images.example.com/kiln/flatcar/\n\
         MatchPattern=kubernetes-v1.36.@v-x86-64.raw\n\n[Target]\nInstancesMax=3\nType=regular-file\n\
         Path=/opt/extensions/kubernetes\nCurrentSymlink=/etc/extensions/kubernetes.raw\n",
    )
    .unwrap();
    (raw, bytes)
}

fn render(dir: &Path, raw: &Path, url: &str) -> PathBuf {
    let out = dir.join("node.ign");
    run(kiln()
        .args([
            "--quiet",
            "render",
            "-p",
            "ignition",
            "--ignition-spec",
            "3.3.0",
        ])
        .arg(dir.join("node.toml"))
        .arg("--sysext")
        .arg(raw)
        .args(["--sysext-url", url, "-o"])
        .arg(&out));
    out
}

#[test]
fn real_ignition_places_the_sysext_and_its_updates() {
    let dir = node_dir(&full_node_toml("kubelet"));
    let d = dir.path();
    let (raw, bytes) = bake_dir(d);
    let port = serve::serve_bytes(bytes.clone()).unwrap();
    let url = format!("http://127.0.0.1:{port}/kiln/flatcar/kubernetes-v1.36.1-x86-64.raw");
    let config = render(d, &raw, &url);
    let out = run(Command::new(IGNITION_VALIDATE).arg(&config));
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");

    let (root, out) = run_ignition(&d.join("ok"), &config);
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && log.contains("Ignition finished successfully"),
        "{log}"
    );
    let placed = root.join("opt/extensions/kubernetes/kubernetes-v1.36.1-x86-64.raw");
    assert_eq!(std::fs::read(&placed).unwrap(), bytes, "not byte-identical");
    assert_eq!(
        std::fs::read_link(root.join("etc/extensions/kubernetes.raw")).unwrap(),
        Path::new("/opt/extensions/kubernetes/kubernetes-v1.36.1-x86-64.raw")
    );
    let transfer =
        std::fs::read_to_string(root.join("etc/sysupdate.kubernetes.d/kubernetes.conf")).unwrap();
    assert_eq!(
        transfer,
        std::fs::read_to_string(d.join("kubernetes.conf")).unwrap()
    );
    assert!(root.join("etc/sysupdate.d/noop.conf").is_file());
    let dropin = std::fs::read_to_string(
        root.join("etc/systemd/system/systemd-sysupdate.service.d/kiln-kubernetes.conf"),
    )
    .unwrap();
    assert!(dropin.contains("touch /run/reboot-required"), "{dropin}");
    let presets =
        std::fs::read_to_string(root.join("etc/systemd/system-preset/20-ignition.preset")).unwrap();
    assert!(
        presets.contains("enable systemd-sysupdate.timer"),
        "{presets}"
    );
    // The node's own files are there as without --sysext.
    firstboot_accepts(&root, "kubelet");

    // Another image at the URL (a mirror serving the wrong bytes): Ignition refuses it.
    let mut other = bytes.clone();
    other[1000] ^= 1;
    let port = serve::serve_bytes(other).unwrap();
    let bad = render(
        &d.join("."),
        &raw,
        &format!("http://127.0.0.1:{port}/kubernetes-v1.36.1-x86-64.raw"),
    );
    let (root, out) = run_ignition(&d.join("bad"), &bad);
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("hash verification failed"), "{log}");
    assert!(!root
        .join("opt/extensions/kubernetes/kubernetes-v1.36.1-x86-64.raw")
        .exists());
}

#[test]
fn check_accepts_what_kiln_emits_and_refuses_unverified_fetches() {
    let dir = node_dir(&full_node_toml("kubelet"));
    let d = dir.path();
    let (raw, _) = bake_dir(d);
    let config = render(
        d,
        &raw,
        "https://mirror.example/kubernetes-v1.36.1-x86-64.raw",
    );
    let out = run(kiln().args(["render", "--check"]).arg(&config));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("fetches /opt/extensions/kubernetes/kubernetes-v1.36.1-x86-64.raw from https://mirror.example/"),
        "{text}"
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    fn image(doc: &mut Value) -> &mut Value {
        doc["storage"]["files"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|f| f["path"].as_str().unwrap().starts_with("/opt/extensions/"))
            .unwrap()
    }
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit); 4] = [
        ("no verification", |f| {
            f["contents"]
                .as_object_mut()
                .unwrap()
                .remove("verification");
        }),
        ("sha1", |f| {
            f["contents"]["verification"]["hash"] = Value::from("sha1-0123");
        }),
        ("tftp", |f| {
            f["contents"]["source"] = Value::from("tftp://10.0.0.1/k.raw");
        }),
        ("into /etc/kiln", |f| {
            f["path"] = Value::from("/etc/kiln/node.env");
        }),
    ];
    for (what, edit) in cases {
        let mut bad = doc.clone();
        edit(image(&mut bad));
        let p = d.join("bad.ign");
        std::fs::write(&p, serde_json::to_vec(&bad).unwrap()).unwrap();
        let out = kiln().args(["render", "--check"]).arg(&p).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: accepted");
        assert!(
            err.contains("bad.ign") && err.contains("storage.files["),
            "{what}: {err}"
        );
    }
}
