//! The real systemd-sysupdate (Debian's systemd 254 from bookworm-backports, unpacked by
//! `scripts/sysupdate-tools.sh` into `target/sysupdate`; `KILN_SYSUPDATE_DIR` points
//! elsewhere) takes kiln's transfer file as it is baked, fetches `SHA256SUMS` and the signed
//! `SHA256SUMS.gpg` from a loopback HTTP server, checks the signature with systemd-pull and
//! installs the sysext into a scratch root (`--root`). The keyring systemd-pull reads is the
//! fixed path `/etc/systemd/import-pubring.gpg`, so the run happens inside a private mount
//! namespace (`unshare -m`) with a tmpfs over `/etc/systemd`: nothing on the host changes.

use crate::bake_support;
#[path = "support/server.rs"]
#[allow(dead_code)]
mod server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bake_support::gpg::GpgHome;
use bake_support::*;

fn tools() -> Option<PathBuf> {
    let dir = std::env::var_os("KILN_SYSUPDATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/sysupdate"));
    if dir.join("lib/systemd/systemd-sysupdate").exists() {
        Some(dir)
    } else {
        optout::cannot_run(
            "sysupdate",
            &format!(
                "no systemd-sysupdate under {} (run `scripts/sysupdate-tools.sh \
                 target/sysupdate`; `make unit` does), so the transfer file cannot be run \
                 through the real systemd-sysupdate",
                dir.display()
            ),
        );
        None
    }
}

/// Runs `systemd-sysupdate ARGS` in a private mount namespace whose /etc/systemd holds only
/// `keyring` as import-pubring.gpg. `None` when the machine does not allow `unshare -m`
/// (probed first, so a failure of the real command is never mistaken for a refusal).
fn sysupdate(tools: &Path, keyring: &Path, defs: &Path, root: &Path, args: &str) -> Option<Output> {
    if let Some(why) = optout::mount_namespace_unavailable() {
        optout::cannot_run("mount-namespace", &why);
        return None;
    }
    let script = r#"set -e
mount --make-rprivate /
mount -t tmpfs kiln-test /etc/systemd
cp "$1" /etc/systemd/import-pubring.gpg
t="$2"; shift 2
export LD_LIBRARY_PATH="$t/usr/lib/x86_64-linux-gnu/systemd" SYSTEMD_PULL_PATH="$t/lib/systemd/systemd-pull"
exec "$t/lib/systemd/systemd-sysupdate" --definitions="$DEFS" --root="$ROOT" --no-pager "$@"
"#;
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
        .arg(keyring)
        .arg(tools)
        .args(args.split_whitespace())
        .env("DEFS", defs)
        .env("ROOT", root)
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .unwrap();
    Some(out)
}

fn text(o: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn systemd_sysupdate_verifies_and_installs_the_signed_sysext() {
    let Some(tools) = tools() else { return };
    let srv = server::Server::start();
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let def = std::fs::read_to_string(repo().join("images/flatcar.toml"))
        .unwrap()
        .replace(
            "update_url = \"https://images.example.com/kiln/flatcar/\"",
            &format!("update_url = \"{}/\"", srv.base()),
        );
    assert!(def.contains(&srv.base()), "flatcar.toml's update_url moved");
    std::fs::write(d.join("flatcar.toml"), def).unwrap();

    let gpg = GpgHome::generate();
    let out = d.join("out");
    let home = gpg.path().to_string_lossy().into_owned();
    ok(
        &bake_cli(
            &fx,
            &d.join("flatcar.toml"),
            "sysext",
            "amd64",
            &out,
            &["--sign-key", &gpg.fingerprint, "--gpg-homedir", &home],
        ),
        "kiln bake --sign-key",
    );
    let image = format!("kubernetes-{}-x86-64.raw", kube_version());
    let image = image.as_str();
    for f in [image, "SHA256SUMS", "SHA256SUMS.gpg"] {
        srv.add(&format!("/{f}"), std::fs::read(out.join(f)).unwrap());
    }
    let defs = d.join("sysupdate.d");
    std::fs::create_dir_all(&defs).unwrap();
    std::fs::copy(out.join("kubernetes.conf"), defs.join("kubernetes.conf")).unwrap();
    let root = d.join("root");
    std::fs::create_dir_all(root.join("opt/extensions/kubernetes")).unwrap();
    std::fs::create_dir_all(root.join("etc/extensions")).unwrap();
    let keyring = d.join("import-pubring.gpg");
    gpg.export_keyring(&keyring);

    // A new version is on offer: the manifest's signature verified.
    let Some(r) = sysupdate(&tools, &keyring, &defs, &root, "check-new") else {
        return;
    };
    assert!(r.status.success(), "check-new: {}", text(&r));
    // The transfer pattern keeps the minor and lets the patch float (v1.36.@v): the version
    // systemd-sysupdate offers is the pin's patch number.
    assert_eq!(
        String::from_utf8_lossy(&r.stdout).trim(),
        kube_version().rsplit_once('.').unwrap().1,
        "{}",
        text(&r)
    );
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("Signature verification succeeded"),
        "{}",
        text(&r)
    );

    // update downloads, checks the image against SHA256SUMS and links it.
    let r = sysupdate(&tools, &keyring, &defs, &root, "update").unwrap();
    assert!(r.status.success(), "update: {}", text(&r));
    let installed = root.join("opt/extensions/kubernetes").join(image);
    assert_eq!(
        sha256_file(&installed),
        sha256_file(&out.join(image)),
        "installed image differs"
    );
    let link = std::fs::read_link(root.join("etc/extensions/kubernetes.raw")).unwrap();
    assert!(link.ends_with(image), "{}", link.display());

    // A SHA256SUMS that does not match its signature is refused.
    let mut sums = std::fs::read_to_string(out.join("SHA256SUMS")).unwrap();
    sums.push_str(&format!(
        "{}  kubernetes-{}.99-x86-64.raw\n",
        "0".repeat(64),
        kube_version().rsplit_once('.').unwrap().0
    ));
    srv.add("/SHA256SUMS", sums.into_bytes());
    let r = sysupdate(&tools, &keyring, &defs, &root, "check-new").unwrap();
    assert!(
        !r.status.success(),
        "a tampered SHA256SUMS was accepted: {}",
        text(&r)
    );
}
