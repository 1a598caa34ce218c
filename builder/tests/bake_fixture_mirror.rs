//! The shipped definitions bake from the shared fixture mirror (`scripts/fixture-mirror.sh`):
//! a signed lock verified with the fixture key, real Debian containerd/runc/CNI binaries in
//! upstream layouts passing the inspection gate, and the workspace's stand-ins (kubelet,
//! crictl, and the Windows `.exe` files as real PE programs) for the Linux and Windows layers.
//!
//! The fixture's kubelet version is the images' `kubernetes.version` plus `-standin` (e.g.
//! `v1.36.1-standin`): the test adapts copies of the definitions to that (and says so). Everything else, crictl included, is as shipped.

use crate::bake_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use bake_support::fixture_mirror::*;
use bake_support::*;

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario from its setup to its last assertion, each step depending on the one before; its helpers are in support/"
)]
fn flatcar_ubuntu_and_windows_bake_from_the_fixture_mirror() {
    let d = tempfile::tempdir().unwrap();
    let fx = d.path().join("fx");
    build_fixture(&fx);
    let firstboot = repo().join("target/firstboot/kiln-firstboot");
    let firstboot = if firstboot.is_file() {
        firstboot
    } else {
        PathBuf::from("/bin/true")
    };
    // arm64: the static aarch64 kiln-firstboot `make firstboot` builds; without it, any
    // aarch64 ELF (the fixture's own arm64 kubelet stand-in) stands in, as /bin/true does for
    // amd64 above. Either way the inspection gate must accept it as linux/arm64.
    let firstboot_arm64 = repo().join("target/firstboot/arm64/kiln-firstboot");
    let firstboot_arm64 = if firstboot_arm64.is_file() {
        firstboot_arm64
    } else {
        repo().join("target/standins/out/linux-arm64/kubelet")
    };
    let v = standin();
    for (image, format, arch, firstboot, main, base) in [
        (
            "flatcar.toml",
            "sysext",
            "amd64",
            &firstboot,
            format!("kubernetes-{v}-x86-64.raw"),
            format!("flatcar-{v}-amd64"),
        ),
        (
            "ubuntu.toml",
            "rootfs",
            "amd64",
            &firstboot,
            format!("ubuntu-{v}-amd64.tar.zst"),
            format!("ubuntu-{v}-amd64"),
        ),
        (
            "flatcar.toml",
            "sysext",
            "arm64",
            &firstboot_arm64,
            format!("kubernetes-{v}-arm64.raw"),
            format!("flatcar-{v}-arm64"),
        ),
        (
            "ubuntu.toml",
            "rootfs",
            "arm64",
            &firstboot_arm64,
            format!("ubuntu-{v}-arm64.tar.zst"),
            format!("ubuntu-{v}-arm64"),
        ),
    ] {
        let def = adapt(image, d.path());
        let out = d.path().join(format!("{format}-{arch}"));
        let r = kiln()
            .arg("bake")
            .arg(&def)
            .args(["--format", format, "--arch", arch, "--out"])
            .arg(&out)
            .arg("--lock")
            .arg(fx.join("artifacts.lock"))
            .arg("--trusted-key")
            .arg(fx.join("keys/fixture.pub"))
            .arg("--store")
            .arg(fx.join("mirror"))
            .arg("--firstboot")
            .arg(firstboot)
            .output()
            .unwrap();
        ok(
            &r,
            &format!("bake {image} --arch {arch} from the fixture mirror"),
        );
        assert!(out.join(&main).is_file(), "{main}");
        // containerd's config follows the fixture's (Debian) containerd version.
        let m: serde_json::Value = serde_json::from_slice(
            &std::fs::read(out.join(format!("{base}.manifest.json"))).unwrap(),
        )
        .unwrap();
        let ctd = m["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "containerd")
            .unwrap();
        let cfg = m["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "usr/lib/kiln/containerd/config.toml")
            .unwrap();
        assert_eq!(
            cfg["origin"]["config"]["lock.containerd.version"],
            ctd["version"]
        );
        assert_eq!(m["arch"], arch, "{base}.manifest.json");
        // The rootfs layer's programs are for the architecture asked for, every one of them.
        if format == "rootfs" {
            let want = match arch {
                "arm64" => kiln::supply::lock::Arch::Arm64,
                _ => kiln::supply::lock::Arch::Amd64,
            };
            let layer = std::fs::File::open(out.join(&main)).unwrap();
            let mut tar = tar::Archive::new(zstd::Decoder::new(layer).unwrap());
            let mut checked = Vec::new();
            for e in tar.entries().unwrap() {
                let mut e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                let name = path.trim_start_matches("usr/bin/");
                if !path.starts_with("usr/bin/") || !e.header().entry_type().is_file() {
                    continue;
                }
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut bytes).unwrap();
                kiln::supply::inspect::check_bytes(
                    &bytes,
                    &path,
                    kiln::supply::lock::Os::Linux,
                    want,
                )
                .unwrap_or_else(|e| panic!("{main}: {e}"));
                checked.push(name.to_string());
            }
            for must in ["kubelet", "containerd", "runc", "crictl", "kiln-firstboot"] {
                assert!(
                    checked.iter().any(|c| c == must),
                    "{main}: no usr/bin/{must} among {checked:?}"
                );
            }
        }
    }

    // An amd64 kiln-firstboot in an arm64 bake is refused (exit 3), naming the binary, what
    // it is and what the bake wants.
    let r = kiln()
        .arg("bake")
        .arg(adapt("ubuntu.toml", d.path()))
        .args(["--format", "rootfs", "--arch", "arm64", "--out"])
        .arg(d.path().join("wrong-arch"))
        .arg("--lock")
        .arg(fx.join("artifacts.lock"))
        .arg("--trusted-key")
        .arg(fx.join("keys/fixture.pub"))
        .arg("--store")
        .arg(fx.join("mirror"))
        .arg("--firstboot")
        .arg(repo().join("target/standins/out/linux-amd64/kubelet"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(3), "{err}");
    for part in [
        "kiln-firstboot",
        "linux-amd64/kubelet",
        "expected a linux/arm64 binary",
        "found linux/amd64",
    ] {
        assert!(err.contains(part), "{part:?} not in: {err}");
    }
    // The Windows layout from the same mirror: the fixture's Windows entries are real PE32+
    // stand-ins, so the PE gate passes them as it would upstream's. Any PE stands in for
    // kiln-firstboot.exe here (`make binary-gate` bakes the real one, windows_layer.rs).
    let exe = repo().join("target/firstboot/kiln-firstboot.exe");
    let exe = if exe.is_file() {
        exe
    } else {
        repo().join("target/standins/out/windows-amd64/tool.exe")
    };
    let out = d.path().join("windows");
    let r = kiln()
        .arg("bake")
        .arg(adapt("windows.toml", d.path()))
        .args(["--format", "windows", "--arch", "amd64", "--out"])
        .arg(&out)
        .arg("--lock")
        .arg(fx.join("artifacts.lock"))
        .arg("--trusted-key")
        .arg(fx.join("keys/fixture.pub"))
        .arg("--store")
        .arg(fx.join("mirror"))
        .arg("--firstboot")
        .arg(&exe)
        .output()
        .unwrap();
    ok(&r, "bake windows.toml from the fixture mirror");
    let zip = std::fs::File::open(out.join(format!("windows-{v}-amd64.zip"))).unwrap();
    let mut zip = zip::ZipArchive::new(zip).unwrap();
    for name in [
        "k/kubelet.exe",
        "k/kubeadm.exe",
        "k/kubectl.exe",
        "k/containerd.exe",
        "k/containerd-shim-runhcs-v1.exe",
        "k/crictl.exe",
    ] {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut zip.by_name(name).unwrap(), &mut bytes).unwrap();
        let info = kiln::supply::inspect::check_bytes(
            &bytes,
            name,
            kiln::supply::lock::Os::Windows,
            kiln::supply::lock::Arch::Amd64,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            info.format,
            kiln::supply::inspect::BinaryFormat::Pe,
            "{name}"
        );
    }

    // Without the fixture key the signed lock is refused: exit 3.
    let r = kiln()
        .arg("bake")
        .arg(adapt("ubuntu.toml", d.path()))
        .args(["--format", "rootfs", "--out"])
        .arg(d.path().join("nokey"))
        .arg("--lock")
        .arg(fx.join("artifacts.lock"))
        .arg("--store")
        .arg(fx.join("mirror"))
        .arg("--firstboot")
        .arg(&firstboot)
        .output()
        .unwrap();
    assert_eq!(
        r.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
}

/// `kiln fetch` and `kiln bake` chain without a store flag (issue 20): bake reads the cache
/// fetch filled, and says so; `bake --fetch --mirror` fills an empty store itself, fetching
/// only what the definition needs; `--fetch` with no source is refused before any work.
#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario from its setup to its last assertion, each step depending on the one before; its helpers are in support/"
)]
fn fetch_then_bake_share_the_default_store_and_bake_fetch_fills_it() {
    let d = tempfile::tempdir().unwrap();
    let fx = d.path().join("fx");
    build_fixture(&fx);
    let fixture_flags = |c: &mut Command| {
        c.arg("--lock")
            .arg(fx.join("artifacts.lock"))
            .arg("--trusted-key")
            .arg(fx.join("keys/fixture.pub"))
            .arg("--firstboot")
            .arg("/bin/true");
    };
    // Step 1 and 2 of a new user: fetch, then bake, no --store, no --cache.
    let xdg = d.path().join("xdg");
    let clean = |c: &mut Command, xdg: &Path| {
        c.env("XDG_CACHE_HOME", xdg)
            .env_remove("KILN_STORE")
            .env_remove("KILN_CACHE")
            .env("KILN_BAKE_CACHE", d.path().join("bake-cache"));
    };
    let mut fetch = kiln();
    fetch
        .arg("fetch")
        .arg(fx.join("artifacts.lock"))
        .arg("--trusted-key")
        .arg(fx.join("keys/fixture.pub"))
        .arg("--mirror")
        .arg(fx.join("mirror"));
    clean(&mut fetch, &xdg);
    ok(
        &fetch.output().unwrap(),
        "kiln fetch into the default cache",
    );
    let def = adapt("flatcar.toml", d.path());
    let mut bake = kiln();
    bake.arg("bake")
        .arg(&def)
        .args(["--arch", "amd64", "--out"])
        .arg(d.path().join("out1"));
    fixture_flags(&mut bake);
    clean(&mut bake, &xdg);
    let o = bake.output().unwrap();
    ok(&o, "kiln bake from kiln fetch's default cache");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("using the store {}", xdg.join("kiln").display())),
        "{err}"
    );

    // An empty XDG_CACHE_HOME means unset (XDG Base Directory spec): the bake cache goes to
    // $HOME/.cache/kiln/bake, never to a `kiln/bake` relative to the working directory.
    let (home, cwd) = (d.path().join("home"), d.path().join("cwd"));
    std::fs::create_dir_all(&cwd).unwrap();
    let mut bake = kiln();
    bake.current_dir(&cwd)
        .arg("bake")
        .arg(&def)
        .args(["--arch", "amd64", "--out"])
        .arg(d.path().join("out-empty-xdg"))
        .arg("--store")
        .arg(xdg.join("kiln"));
    fixture_flags(&mut bake);
    bake.env("XDG_CACHE_HOME", "")
        .env("HOME", &home)
        .env_remove("KILN_STORE")
        .env_remove("KILN_CACHE")
        .env_remove("KILN_BAKE_CACHE");
    ok(
        &bake.output().unwrap(),
        "kiln bake with XDG_CACHE_HOME=\"\"",
    );
    assert!(
        !cwd.join("kiln").exists(),
        "the bake cache went to a path relative to the working directory"
    );
    assert!(home.join(".cache/kiln/bake").is_dir());

    // `kiln plan` against the same store: covered, every blob there, and it names exactly
    // the files the bake wrote.
    let mut plan = kiln();
    plan.args(["--json", "plan"])
        .arg(&def)
        .args(["--format", "sysext", "--arch", "amd64"]);
    fixture_flags(&mut plan);
    clean(&mut plan, &xdg);
    let o = plan.output().unwrap();
    ok(&o, "kiln plan");
    // The plan event, then the result (docs/cli.md, JSON output).
    let p: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(p["covered"], true, "{p}");
    let t = &p["targets"][0];
    assert!(
        t["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["in_store"] == true && a["pin"].is_object()),
        "{t}"
    );
    let mut planned: Vec<String> = t["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let mut written: Vec<String> = std::fs::read_dir(d.path().join("out1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    planned.sort();
    written.sort();
    assert_eq!(
        planned, written,
        "kiln plan's outputs vs what kiln bake wrote"
    );

    // An empty default store: bake --fetch --mirror fills it with what flatcar amd64 needs.
    let xdg2 = d.path().join("xdg2");
    let mut bake = kiln();
    bake.arg("bake")
        .arg(&def)
        .args(["--arch", "amd64", "--fetch", "--mirror"])
        .arg(fx.join("mirror"))
        .arg("--out")
        .arg(d.path().join("out2"));
    fixture_flags(&mut bake);
    clean(&mut bake, &xdg2);
    ok(&bake.output().unwrap(), "kiln bake --fetch --mirror");
    let blobs = std::fs::read_dir(xdg2.join("kiln/blobs/sha256"))
        .unwrap()
        .filter(|e| {
            let n = e.as_ref().unwrap().file_name();
            n.to_string_lossy().len() == 64
        })
        .count();
    let all = std::fs::read_dir(fx.join("mirror/blobs/sha256"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().len() == 64)
        .count();
    assert!(
        blobs > 0 && blobs < all,
        "fetched {blobs} blobs of the mirror's {all}: only the amd64 flatcar ones were wanted"
    );
    // The two bakes made the same layer.
    let v = standin();
    assert_eq!(
        std::fs::read(d.path().join(format!("out1/kubernetes-{v}-x86-64.raw"))).unwrap(),
        std::fs::read(d.path().join(format!("out2/kubernetes-{v}-x86-64.raw"))).unwrap()
    );

    // --fetch without a source: refused, naming what is missing, nothing fetched or baked.
    let xdg3 = d.path().join("xdg3");
    let mut bake = kiln();
    bake.arg("bake")
        .arg(&def)
        .args(["--fetch", "--out"])
        .arg(d.path().join("out3"));
    fixture_flags(&mut bake);
    clean(&mut bake, &xdg3);
    let o = bake.output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--fetch needs a source: --mirror"));
    assert!(
        !xdg3.join("kiln/blobs/sha256").exists()
            || std::fs::read_dir(xdg3.join("kiln/blobs/sha256"))
                .unwrap()
                .count()
                == 0
    );
}

/// `kiln plan` covers every shipped definition from the committed lock without a store
/// (issue 17: the Windows crictl and CNI plugins are optional there and left out, with the
/// reason), and names what the lock does not pin for a required artifact before any blob is
/// needed, exiting 3.
#[test]
fn plan_covers_every_shipped_definition_and_names_what_the_lock_lacks() {
    let d = tempfile::tempdir().unwrap();
    let plan = |def: &Path| {
        kiln()
            .current_dir(repo())
            .env("XDG_CACHE_HOME", d.path())
            .env_remove("KILN_STORE")
            .env_remove("KILN_CACHE")
            .arg("plan")
            .arg(def)
            .output()
            .unwrap()
    };
    let mut defs: Vec<PathBuf> = std::fs::read_dir(repo().join("images"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        // The known advisories live beside the definitions and the lock; not a definition.
        .filter(|p| !p.ends_with("advisories.toml"))
        .collect();
    defs.sort();
    assert!(defs.len() >= 3, "{defs:?}");
    for def in &defs {
        let o = plan(def);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}: {out}{}",
            def.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!out.contains("NOT COVERED"), "{out}");
    }
    let o = plan(&repo().join("images/windows.toml"));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("crictl          left out: not in the lock for windows/amd64 (optional: a debugging client"),
        "{out}"
    );
    // The same definition with crictl required: not covered, named, exit 3.
    let text = std::fs::read_to_string(repo().join("images/windows.toml")).unwrap();
    let required: String = text
        .split_inclusive('\n')
        .scan(false, |in_crictl, line| {
            if line.starts_with("name = ") {
                *in_crictl = line.contains("\"crictl\"");
            }
            let drop = *in_crictl && (line.starts_with("optional") || line.starts_with("reason"));
            Some(if drop { "" } else { line })
        })
        .collect();
    assert_ne!(required, text);
    let def = d.path().join("windows.toml");
    std::fs::write(&def, required).unwrap();
    let o = kiln()
        .current_dir(repo())
        .env("XDG_CACHE_HOME", d.path())
        .env_remove("KILN_STORE")
        .env_remove("KILN_CACHE")
        .args(["plan", "--lock", "images/artifacts.lock"])
        .arg(&def)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{out}{err}");
    assert!(
        out.contains("crictl          not in the lock for windows/amd64"),
        "{out}"
    );
    assert!(
        err.contains("needs: crictl for windows/amd64") && !err.contains("cni-plugins"),
        "{err}"
    );
    // Nothing was created: plan only looks.
    assert!(!d.path().join("kiln").exists());
    // A lock altered after signing is refused as every command refuses it: exit 3.
    let lock = d.path().join("altered.lock");
    let text = std::fs::read_to_string(repo().join("images/artifacts.lock")).unwrap();
    let altered = text.replacen(
        "\n[[artifact]]",
        "\n# edited after signing\n[[artifact]]",
        1,
    );
    assert_ne!(altered, text);
    std::fs::write(&lock, altered).unwrap();
    std::fs::copy(
        repo().join("images/artifacts.lock.minisig"),
        d.path().join("altered.lock.minisig"),
    )
    .unwrap();
    let o = kiln()
        .current_dir(repo())
        .args(["plan", "images/ubuntu.toml", "--lock"])
        .arg(&lock)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("does not match its signature"), "{err}");
}
