//! Bakes the three shipped definitions (images/*.toml) from a fixture store and checks the
//! outputs with the real tools: unsquashfs, tar, unzip, and the SBOM/manifest contents.

use crate::bake_support;

use std::process::Command;

use bake_support::*;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    ok(&out, &format!("{cmd:?}"));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn sysext_is_read_by_unsquashfs_and_holds_only_usr() {
    let fx = fixture(Bins::Real);
    let out = fx.dir.path().join("out");
    let r = bake_cli(
        &fx,
        &repo().join("images/flatcar.toml"),
        "sysext",
        "amd64",
        &out,
        &[],
    );
    ok(&r, "kiln bake sysext");
    let raw = out.join(format!("kubernetes-{}-x86-64.raw", kube_version()));
    let list = run(Command::new("unsquashfs").arg("-lln").arg(&raw));
    for want in [
        "squashfs-root/usr/bin/kubelet",
        "squashfs-root/usr/bin/containerd-shim-runc-v2",
        "squashfs-root/usr/bin/kiln-firstboot",
        "squashfs-root/usr/libexec/cni/bridge",
        "squashfs-root/usr/lib/kiln/image.env",
        "squashfs-root/usr/lib/kiln/max-pods.map",
        "squashfs-root/usr/lib/kiln/containerd/config.toml",
        "squashfs-root/usr/lib/extension-release.d/extension-release.kubernetes",
        "squashfs-root/usr/lib/systemd/system/multi-user.target.wants/kiln-firstboot.service -> ../kiln-firstboot.service",
    ] {
        assert!(list.contains(want), "{want} missing from:\n{list}");
    }
    for line in list.lines() {
        let path = line.split_whitespace().nth(5).unwrap_or("");
        assert!(
            path == "squashfs-root" || path.starts_with("squashfs-root/usr"),
            "outside /usr: {line}"
        );
        assert!(line.contains(" 0/0 "), "not root-owned: {line}");
        assert!(
            line.contains("2024-01-01 00:00"),
            "mtime not SOURCE_DATE_EPOCH: {line}"
        );
    }
    // The bytes inside are the artifact's bytes.
    let x = fx.dir.path().join("x");
    run(Command::new("unsquashfs")
        .arg("-d")
        .arg(&x)
        .arg(&raw)
        .arg("usr/bin/kubelet")
        .arg("usr/lib/kiln/image.env")
        .arg("usr/lib/extension-release.d"));
    let kubelet = fx
        .arts
        .iter()
        .find(|a| a.name == "kubelet" && a.os == "linux" && a.arch == "amd64")
        .unwrap();
    assert_eq!(
        std::fs::read(x.join("usr/bin/kubelet")).unwrap(),
        kubelet.bytes
    );
    let env = std::fs::read_to_string(x.join("usr/lib/kiln/image.env")).unwrap();
    for want in [
        "KILN_CONTRACT=1\n".to_string(),
        "KILN_IMAGE_NAME=flatcar\n".into(),
        "KILN_ARCH=amd64\n".into(),
        format!("KUBERNETES_VERSION={}\n", kube_version()),
        "CONTAINERD_VERSION=1.6.20\n".into(),
        "CNI_PLUGINS_VERSION=1.1.1\n".into(),
    ] {
        assert!(env.contains(&want), "{want} not in image.env:\n{env}");
    }
    let rel =
        std::fs::read_to_string(x.join("usr/lib/extension-release.d/extension-release.kubernetes"))
            .unwrap();
    assert_eq!(
        rel,
        "ID=flatcar\nSYSEXT_LEVEL=1.0\nARCHITECTURE=x86-64\nEXTENSION_RELOAD_MANAGER=1\n"
    );
    // SHA256SUMS is what sha256sum itself would check.
    run(Command::new("sha256sum")
        .arg("-c")
        .arg("SHA256SUMS")
        .current_dir(&out));
    let conf = std::fs::read_to_string(out.join("kubernetes.conf")).unwrap();
    // The pattern keeps the minor and lets the patch float: v1.36.1 -> v1.36.@v.
    let minor = kube_version().rsplit_once('.').unwrap().0.to_string();
    assert!(
        conf.contains(&format!("MatchPattern=kubernetes-{minor}.@v-x86-64.raw")),
        "{conf}"
    );
    // The image id in image.env is the one kiln printed.
    let stdout = String::from_utf8_lossy(&r.stdout);
    let id = env
        .lines()
        .find_map(|l| l.strip_prefix("KILN_IMAGE_ID="))
        .unwrap();
    assert!(stdout.contains(id), "{stdout}");
    assert!(id.starts_with("sha256:") && id.len() == 7 + 32, "{id}");
}

#[test]
fn rootfs_is_read_by_tar_and_carries_etc_enablement() {
    let fx = fixture(Bins::Real);
    let out = fx.dir.path().join("out");
    ok(
        &bake_cli(
            &fx,
            &repo().join("images/ubuntu.toml"),
            "rootfs",
            "amd64",
            &out,
            &[],
        ),
        "bake rootfs",
    );
    let tarball = out.join(format!("ubuntu-{}-amd64.tar.zst", kube_version()));
    let list = run(Command::new("tar").arg("--zstd").arg("-tvf").arg(&tarball));
    for want in [
        "usr/bin/kubelet",
        "usr/lib/kiln/install.manifest",
        "usr/lib/kiln/containerd/certs.d/docker.io/hosts.toml",
        "usr/lib/sysctl.d/90-kiln.conf",
        "usr/lib/modules-load.d/kiln.conf",
        "etc/systemd/system/multi-user.target.wants/containerd.service -> /usr/lib/systemd/system/containerd.service",
    ] {
        assert!(list.contains(want), "{want} missing from:\n{list}");
    }
    assert!(
        !list.contains("kubelet.service ->"),
        "kubelet must not be enabled:\n{list}"
    );
    for line in list.lines() {
        assert!(line.contains("root/root"), "{line}");
    }
    // zstd itself verifies the frame checksum.
    run(Command::new("zstd").arg("-t").arg("-q").arg(&tarball));
}

#[test]
fn windows_zip_has_the_c_k_layout_and_pe_binaries() {
    let fx = fixture(Bins::Real);
    let out = fx.dir.path().join("out");
    ok(
        &bake_cli(
            &fx,
            &repo().join("images/windows.toml"),
            "windows",
            "amd64",
            &out,
            &[],
        ),
        "bake windows",
    );
    let zip = out.join(format!("windows-{}-amd64.zip", kube_version()));
    let list = run(Command::new("unzip").arg("-Z1").arg(&zip));
    let names: Vec<&str> = list.lines().collect();
    for want in [
        "k/kubelet.exe",
        "k/kubeadm.exe",
        "k/kubectl.exe",
        "k/containerd.exe",
        "k/containerd-shim-runhcs-v1.exe",
        "k/crictl.exe",
        "k/kiln-firstboot.exe",
        "k/kiln/image.env",
        "k/kiln/max-pods.map",
        "k/kiln/kubelet-config.yaml",
        "k/kiln/kiln-report.xml",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    run(Command::new("unzip").arg("-tq").arg(&zip));
    // Every .exe in the zip is a PE for windows/amd64, checked by kiln inspect.
    let x = fx.dir.path().join("x");
    run(Command::new("unzip").arg("-q").arg("-d").arg(&x).arg(&zip));
    let mut c = kiln();
    c.arg("inspect")
        .args(["--os", "windows", "--arch", "amd64"]);
    for n in names.iter().filter(|n| n.ends_with(".exe")) {
        c.arg(x.join(n));
    }
    run(&mut c);
}

/// An optional artifact the lock does not pin for the target is left out with a warning
/// that names it and the reason (issue 17: the committed lock pins no Windows crictl); a
/// required one the lock lacks still stops the bake, naming it.
#[test]
fn windows_bake_leaves_out_an_optional_artifact_the_lock_does_not_pin() {
    let mut fx = fixture(Bins::Tiny);
    let without = |fx: &Fixture, name: &str| -> Vec<Art> {
        fx.arts
            .iter()
            .filter(|a| !(a.name == name && a.os == "windows"))
            .cloned()
            .collect()
    };
    let arts = without(&fx, "crictl");
    assert!(
        arts.len() < fx.arts.len(),
        "the fixture pins a Windows crictl"
    );
    std::fs::write(&fx.lock, lock_text(&arts)).unwrap();
    let out = fx.dir.path().join("out");
    let o = bake_cli(
        &fx,
        &repo().join("images/windows.toml"),
        "windows",
        "amd64",
        &out,
        &[],
    );
    ok(&o, "bake windows without crictl in the lock");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("kiln: warning: crictl left out of the windows amd64 layer")
            && err.contains("(optional: a debugging client"),
        "{err}"
    );
    let zip = out.join(format!("windows-{}-amd64.zip", kube_version()));
    let list = run(Command::new("unzip").arg("-Z1").arg(&zip));
    assert!(!list.contains("crictl"), "{list}");
    assert!(list.contains("k/containerd.exe"), "{list}");
    let env = run(Command::new("unzip")
        .arg("-p")
        .arg(&zip)
        .arg("k/kiln/image.env"));
    assert!(!env.contains("CRICTL_VERSION"), "{env}");
    // containerd is required: without it the bake stops and names it.
    let arts = without(&fx, "containerd");
    std::fs::write(&fx.lock, lock_text(&arts)).unwrap();
    fx.arts = arts;
    let o = bake_cli(
        &fx,
        &repo().join("images/windows.toml"),
        "windows",
        "amd64",
        &fx.dir.path().join("out2"),
        &[],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("artifact \"containerd\" for windows/amd64 is not in the lock"),
        "{err}"
    );
}

#[test]
fn sbom_lists_every_file_with_hashes_and_origins() {
    let fx = fixture(Bins::Real);
    let out = fx.dir.path().join("out");
    ok(
        &bake_cli(
            &fx,
            &repo().join("images/ubuntu.toml"),
            "rootfs",
            "amd64",
            &out,
            &[],
        ),
        "bake rootfs",
    );
    let sbom: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join(format!("ubuntu-{}-amd64.spdx.json", kube_version()))).unwrap(),
    )
    .unwrap();
    assert_eq!(sbom["spdxVersion"], "SPDX-2.3");
    assert_eq!(sbom["creationInfo"]["created"], "2024-01-01T00:00:00Z");
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join(format!("ubuntu-{}-amd64.manifest.json", kube_version()))).unwrap(),
    )
    .unwrap();
    let files = sbom["files"].as_array().unwrap();
    let mfiles: Vec<&serde_json::Value> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["type"] == "file")
        .collect();
    assert_eq!(files.len(), mfiles.len());
    // Cross-check against sha256sum/sha1sum of the extracted tree.
    let x = fx.dir.path().join("x");
    std::fs::create_dir_all(&x).unwrap();
    run(Command::new("tar")
        .arg("--zstd")
        .arg("-xf")
        .arg(out.join(format!("ubuntu-{}-amd64.tar.zst", kube_version())))
        .arg("-C")
        .arg(&x));
    for f in files {
        let name = f["fileName"].as_str().unwrap();
        let sums = f["checksums"].as_array().unwrap();
        let get = |alg: &str| {
            sums.iter().find(|c| c["algorithm"] == alg).unwrap()["checksumValue"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let s256 = run(Command::new("sha256sum").arg(x.join(name)));
        let s1 = run(Command::new("sha1sum").arg(x.join(name)));
        assert_eq!(
            s256.split_whitespace().next().unwrap(),
            get("SHA256"),
            "{name}"
        );
        assert_eq!(s1.split_whitespace().next().unwrap(), get("SHA1"), "{name}");
    }
    let kubelet = files
        .iter()
        .find(|f| f["fileName"] == "./usr/bin/kubelet")
        .unwrap();
    assert_eq!(
        kubelet["comment"],
        format!("artifact kubelet {}, member kubelet", kube_version())
    );
    let pkgs = sbom["packages"].as_array().unwrap();
    let k = pkgs.iter().find(|p| p["name"] == "kubelet").unwrap();
    assert_eq!(k["versionInfo"], kube_version());
    assert_eq!(
        k["downloadLocation"],
        "https://example.invalid/linux/amd64/kubelet"
    );
}

#[test]
fn sysext_in_every_compression_holds_the_same_files() {
    // zstd and gzip go through kiln's squashfs writer, xz through mksquashfs: the same layer
    // must come out of each, byte for byte.
    let fx = fixture(Bins::Real);
    let def = std::fs::read_to_string(repo().join("images/flatcar.toml")).unwrap();
    let mut trees = Vec::new();
    for comp in ["zstd", "gzip", "xz"] {
        let toml = fx.dir.path().join(format!("flatcar-{comp}.toml"));
        std::fs::write(
            &toml,
            def.replace(
                "compression = \"zstd\"",
                &format!("compression = \"{comp}\""),
            ),
        )
        .unwrap();
        let out = fx.dir.path().join(format!("out-{comp}"));
        let r = bake_cli(&fx, &toml, "sysext", "amd64", &out, &[]);
        ok(&r, &format!("kiln bake sysext ({comp})"));
        let raw = out.join(format!("kubernetes-{}-x86-64.raw", kube_version()));
        let sb = run(Command::new("unsquashfs").arg("-s").arg(&raw));
        assert!(sb.contains(&format!("Compression {comp}")), "{sb}");
        let x = fx.dir.path().join(format!("x-{comp}"));
        run(Command::new("unsquashfs")
            .arg("-q")
            .arg("-d")
            .arg(&x)
            .arg(&raw));
        let listing = run(Command::new("sh").arg("-c").arg(format!(
            "cd '{}' && find . -printf '%y %m %s %l %p\\n' | sort && find . -type f -print0 | sort -z | xargs -0 sha256sum",
            x.display()
        )));
        trees.push((comp, listing));
    }
    for (comp, listing) in &trees[1..] {
        assert_eq!(listing, &trees[0].1, "{comp} differs from zstd");
    }
}

/// A definition that lists a credential provider from the lock bakes its binary, executable,
/// where the image's `CREDENTIAL_PROVIDER_BIN_DIR` says and under the provider's own name
/// (what kubelet looks up), as the committed lock's entries place it.
#[test]
fn a_credential_provider_from_the_lock_lands_in_the_bin_dir_image_env_names() {
    let mut fx = fixture(Bins::Tiny);
    fx.arts.push(Art {
        name: "ecr-credential-provider".into(),
        version: "v1.31.7".into(),
        os: "linux",
        arch: "amd64",
        format: "binary",
        file: "ecr-credential-provider-linux-amd64".into(),
        bytes: tiny_elf(X86_64, "ecr-credential-provider"),
        members: vec![(
            "ecr-credential-provider-linux-amd64".into(),
            "libexec/kiln/credential-providers/ecr-credential-provider".into(),
        )],
    });
    let (store, lock) = write_store(fx.dir.path(), &fx.arts);
    fx.store = store;
    fx.lock = lock;
    // Beside a copy of images/data, which the definition names relatively.
    let def = fx.dir.path().join("def.toml");
    std::fs::create_dir_all(fx.dir.path().join("data")).unwrap();
    for e in std::fs::read_dir(repo().join("images/data")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), fx.dir.path().join("data").join(e.file_name())).unwrap();
    }
    let base = std::fs::read_to_string(repo().join("images/ubuntu.toml")).unwrap();
    std::fs::write(
        &def,
        format!("{base}\n[[artifact]]\nname = \"ecr-credential-provider\"\n"),
    )
    .unwrap();
    let out = fx.dir.path().join("out");
    ok(
        &bake_cli(&fx, &def, "rootfs", "amd64", &out, &[]),
        "bake rootfs",
    );
    let tarball = out.join(format!("ubuntu-{}-amd64.tar.zst", kube_version()));
    let list = run(Command::new("tar").arg("--zstd").arg("-tvf").arg(&tarball));
    let line = list
        .lines()
        .find(|l| l.ends_with(" usr/libexec/kiln/credential-providers/ecr-credential-provider"))
        .unwrap_or_else(|| panic!("no provider in:\n{list}"));
    assert!(line.starts_with("-rwxr-xr-x"), "{line}");
    let env = run(Command::new("tar")
        .arg("--zstd")
        .arg("-xOf")
        .arg(&tarball)
        .arg("usr/lib/kiln/image.env"));
    assert!(
        env.contains("CREDENTIAL_PROVIDER_BIN_DIR=/usr/libexec/kiln/credential-providers\n"),
        "{env}"
    );
}
