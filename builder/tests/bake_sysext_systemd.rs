//! Debian's systemd reads the sysext: `systemd-dissect` recognises it as a system extension
//! under both names it is used by, and `systemd-sysext merge` overlays it onto a scratch root
//! whose os-release says Flatcar. The merge runs inside a private mount namespace
//! (`unshare -m`), so nothing outside the scratch root is ever mounted over and nothing
//! stays mounted after the test.

use crate::bake_support;

use std::process::Command;

use bake_support::*;

#[test]
fn systemd_dissect_and_sysext_accept_the_image() {
    let fx = fixture(Bins::Real);
    let d = fx.dir.path();
    let out = d.join("out");
    ok(
        &bake_cli(
            &fx,
            &repo().join("images/flatcar.toml"),
            "sysext",
            "amd64",
            &out,
            &[],
        ),
        "bake",
    );
    let raw = out.join(format!("kubernetes-{}-x86-64.raw", kube_version()));
    // Under its published name and under the name sysupdate links it as.
    let linked = d.join("kubernetes.raw");
    std::fs::copy(&raw, &linked).unwrap();
    for img in [&raw, &linked] {
        let r = Command::new("systemd-dissect")
            .arg("--json=short")
            .arg(img)
            .output()
            .unwrap();
        ok(&r, "systemd-dissect");
        let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
        assert_eq!(v["useSystemExtension"], true, "{}: {v}", img.display());
        assert_eq!(v["mounts"][0]["fstype"], "squashfs");
    }

    // A scratch Flatcar root with the extension where systemd-sysext looks for it.
    let root = d.join("flatcar");
    std::fs::create_dir_all(root.join("usr/lib")).unwrap();
    std::fs::create_dir_all(root.join("var/lib/extensions")).unwrap();
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::write(root.join("usr/bin/flatcar-own"), b"base").unwrap();
    std::fs::write(
        root.join("usr/lib/os-release"),
        "ID=flatcar\nSYSEXT_LEVEL=1.0\nVERSION_ID=4230.2.0\n",
    )
    .unwrap();
    std::fs::copy(&raw, root.join("var/lib/extensions/kubernetes.raw")).unwrap();
    // Everything happens in a private mount namespace: every inherited mount is made private
    // first (nothing propagates to the host), then /run (a fresh tmpfs, where systemd-sysext
    // stages) and the scratch root become shared peer groups of this namespace only, so the
    // overlay systemd-sysext builds in its own child namespace shows up here.
    let script = r#"set -e
mount --make-rprivate /
mount -t tmpfs tmpfs /run
mount --make-shared /run
mount --bind "$1" "$1"
mount --make-shared "$1"
systemd-sysext merge --root="$1"
test -x "$1/usr/bin/kubelet"
test -f "$1/usr/bin/flatcar-own"
cat "$1/usr/lib/kiln/image.env"
systemd-sysext list --root="$1" --no-pager
"#;
    // Probed first: a refusal by the environment is not the merge failing.
    if let Some(why) = optout::mount_namespace_unavailable() {
        return optout::cannot_run("mount-namespace", &why);
    }
    let r = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
        .arg(&root)
        .output()
        .unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr),
    );
    assert!(r.status.success(), "merge failed: {}\n{so}\n{se}", r.status);
    assert!(so.contains("KILN_IMAGE_NAME=flatcar"), "{so}");
    assert!(so.contains("kubernetes"), "{so}");
    // The namespace is gone: the scratch root's /usr is the plain directory again.
    assert!(!root.join("usr/bin/kubelet").exists());
}
