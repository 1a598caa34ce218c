//! The Windows layer carries containerd's own configuration (`k/containerd/config.toml`,
//! `certs.d/<host>/hosts.toml` with CA files, the proxy environment), rendered from the
//! image definition. The files are parsed by the toml crate and by a real containerd:
//! Debian's `containerd config dump` (a Linux build, containerd 1.6) loads the config and
//! prints what its CRI plugin understood, which proves config version 2 field by field;
//! containerd 1.6 does not know version 3's plugin names, so for 2.x configs it proves the
//! syntax only (docs/bake.md says so).

use crate::bake_support;

use std::path::Path;
use std::process::Command;

use bake_support::*;
use kiln::bake::render;
use kiln::image_def::ImageDef;

// `KUBE_VERSION` becomes the images' version (the fixture lock's kubelet), see `def()`.
const DEF: &str = r#"
name = "win-ctd"
os = "windows"
arch = ["amd64"]
formats = ["windows"]

[kubernetes]
version = "KUBE_VERSION"

[containerd]
sandbox_image = "registry.example.com:5000/pause:3.10"

[containerd.proxy]
http = "http://proxy.example.com:3128"
https = "http://proxy.example.com:3128"
no_proxy = "10.0.0.0/8,.cluster.local"

[[containerd.registry]]
host = "docker.io"
mirrors = ["https://mirror.example.com"]

[[containerd.registry]]
host = "registry.example.com:5000"
ca = ["registry-ca.pem"]

[[artifact]]
name = "kubelet"
[[artifact]]
name = "containerd"
"#;

/// The test definition, pinned to the version the fixture lock's kubelet carries.
fn def_text() -> String {
    DEF.replace("KUBE_VERSION", &kube_version())
}

/// containerd (Debian's); a test without it fails unless the check is opted out.
fn containerd() -> Option<&'static str> {
    let ok = Command::new("containerd")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        optout::cannot_run(
            "containerd",
            "`containerd` is not installed (make deps installs it), so the baked config \
             cannot be parsed by the real containerd",
        );
    }
    ok.then_some("containerd")
}

/// Runs `containerd --config FILE config dump` and returns what it printed.
fn dump(bin: &str, config: &Path) -> String {
    let out = Command::new(bin)
        .arg("--config")
        .arg(config)
        .args(["config", "dump"])
        .output()
        .unwrap();
    ok(
        &out,
        &format!("containerd --config {} config dump", config.display()),
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn windows_zip_holds_containerd_config_hosts_and_proxy() {
    let fx = fixture(Bins::Tiny);
    let defdir = fx.dir.path().join("def");
    std::fs::create_dir_all(&defdir).unwrap();
    let def_path = defdir.join("win.toml");
    std::fs::write(&def_path, def_text()).unwrap();
    let ca = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
    std::fs::write(defdir.join("registry-ca.pem"), ca).unwrap();

    let out = fx.dir.path().join("out");
    ok(
        &bake_cli(&fx, &def_path, "windows", "amd64", &out, &[]),
        "kiln bake windows",
    );
    let x = fx.dir.path().join("x");
    let unzip = Command::new("unzip")
        .arg("-q")
        .arg("-d")
        .arg(&x)
        .arg(out.join(format!("win-ctd-{}-amd64.zip", kube_version())))
        .output()
        .unwrap();
    ok(&unzip, "unzip");

    // config.toml: the fixture's Windows containerd is 1.7.24, so config version 2.
    let cfg_path = x.join("k/containerd/config.toml");
    let cfg_text = std::fs::read_to_string(&cfg_path).unwrap();
    let cfg: toml::Value = toml::from_str(&cfg_text).unwrap();
    assert_eq!(cfg["version"].as_integer(), Some(2), "{cfg_text}");
    assert_eq!(
        cfg["root"].as_str(),
        Some(r"C:\ProgramData\containerd\root")
    );
    assert_eq!(
        cfg["grpc"]["address"].as_str(),
        Some(r"\\.\pipe\containerd-containerd")
    );
    let cri = &cfg["plugins"]["io.containerd.grpc.v1.cri"];
    assert_eq!(
        cri["sandbox_image"].as_str(),
        Some("registry.example.com:5000/pause:3.10")
    );
    assert_eq!(cri["cni"]["bin_dir"].as_str(), Some(r"C:\k\cni\bin"));
    assert_eq!(cri["cni"]["conf_dir"].as_str(), Some(r"C:\k\cni\config"));
    assert_eq!(cri["containerd"]["snapshotter"].as_str(), Some("windows"));
    assert_eq!(
        cri["containerd"]["runtimes"]["runhcs-wcow-process"]["runtime_type"].as_str(),
        Some("io.containerd.runhcs.v1")
    );
    assert_eq!(
        cri["registry"]["config_path"].as_str(),
        Some(r"C:\ProgramData\kiln\containerd\certs.d;C:\k\containerd\certs.d")
    );
    assert!(
        !cfg_text.contains("SystemdCgroup") && !cfg_text.contains("runc"),
        "no cgroup driver or runc on Windows:\n{cfg_text}"
    );

    // hosts.toml per registry; `host:port` becomes `host_port_` (no `:` in Windows names).
    let hub: toml::Value = toml::from_str(
        &std::fs::read_to_string(x.join("k/containerd/certs.d/docker.io/hosts.toml")).unwrap(),
    )
    .unwrap();
    assert_eq!(hub["server"].as_str(), Some("https://registry-1.docker.io"));
    assert!(hub["host"]
        .as_table()
        .unwrap()
        .contains_key("https://mirror.example.com"));
    let regdir = x.join("k/containerd/certs.d/registry.example.com_5000_");
    let reg: toml::Value =
        toml::from_str(&std::fs::read_to_string(regdir.join("hosts.toml")).unwrap()).unwrap();
    assert_eq!(
        reg["host"]["https://registry.example.com:5000"]["ca"][0].as_str(),
        Some(r"C:\k\containerd\certs.d\registry.example.com_5000_\ca-0.crt")
    );
    assert_eq!(
        std::fs::read_to_string(regdir.join("ca-0.crt")).unwrap(),
        ca
    );

    // The proxy, for kiln-firstboot install to put into containerd's service environment.
    let env = std::fs::read_to_string(x.join("k/containerd/containerd.env")).unwrap();
    for want in [
        "HTTP_PROXY=http://proxy.example.com:3128\n",
        "HTTPS_PROXY=http://proxy.example.com:3128\n",
        "NO_PROXY=10.0.0.0/8,.cluster.local\n",
    ] {
        assert!(env.contains(want), "{want:?} missing from:\n{env}");
    }

    // A real containerd loads the file and its CRI plugin takes every value.
    if let Some(bin) = containerd() {
        let d = dump(bin, &cfg_path);
        for want in [
            r#"root = "C:\\ProgramData\\containerd\\root""#,
            r#"address = "\\\\.\\pipe\\containerd-containerd""#,
            r#"sandbox_image = "registry.example.com:5000/pause:3.10""#,
            r#"snapshotter = "windows""#,
            r#"default_runtime_name = "runhcs-wcow-process""#,
            r#"runtime_type = "io.containerd.runhcs.v1""#,
            r#"bin_dir = "C:\\k\\cni\\bin""#,
            r#"conf_dir = "C:\\k\\cni\\config""#,
            r#"config_path = "C:\\ProgramData\\kiln\\containerd\\certs.d;C:\\k\\containerd\\certs.d""#,
        ] {
            assert!(
                d.contains(want),
                "containerd config dump lacks {want}:\n{d}"
            );
        }
    }
}

#[test]
fn containerd_2_gets_config_version_3_that_containerd_parses() {
    let dir = tempfile::tempdir().unwrap();
    let def = ImageDef::parse(&def_text(), Path::new("win.toml")).unwrap();
    let text = render::containerd_config_windows(&def, Some("2.1.4"));
    let cfg: toml::Value = toml::from_str(&text).unwrap();
    assert_eq!(cfg["version"].as_integer(), Some(3));
    let images = &cfg["plugins"]["io.containerd.cri.v1.images"];
    assert_eq!(images["snapshotter"].as_str(), Some("windows"));
    assert_eq!(
        images["pinned_images"]["sandbox"].as_str(),
        Some("registry.example.com:5000/pause:3.10")
    );
    assert_eq!(images["use_local_image_pull"].as_bool(), Some(true));
    assert_eq!(
        images["registry"]["config_path"].as_str(),
        Some(r"C:\ProgramData\kiln\containerd\certs.d;C:\k\containerd\certs.d")
    );
    let rt = &cfg["plugins"]["io.containerd.cri.v1.runtime"];
    assert_eq!(rt["cni"]["bin_dirs"][0].as_str(), Some(r"C:\k\cni\bin"));
    assert_eq!(
        rt["containerd"]["runtimes"]["runhcs-wcow-process"]["runtime_type"].as_str(),
        Some("io.containerd.runhcs.v1")
    );
    // containerd 2.0 knows only the older `bin_dir` string.
    let old: toml::Value =
        toml::from_str(&render::containerd_config_windows(&def, Some("v2.0.7"))).unwrap();
    assert_eq!(
        old["plugins"]["io.containerd.cri.v1.runtime"]["cni"]["bin_dir"].as_str(),
        Some(r"C:\k\cni\bin")
    );
    if let Some(bin) = containerd() {
        let p = dir.path().join("config.toml");
        std::fs::write(&p, &text).unwrap();
        // containerd 1.6 reads the TOML (a syntax error fails the dump) and keeps the
        // top-level keys it knows.
        let d = dump(bin, &p);
        assert!(
            d.contains(r#"root = "C:\\ProgramData\\containerd\\root""#),
            "{d}"
        );
        std::fs::write(&p, text.replace("[grpc]", "[grpc")).unwrap();
        let bad = Command::new(bin)
            .arg("--config")
            .arg(&p)
            .args(["config", "dump"])
            .output()
            .unwrap();
        assert!(!bad.status.success(), "containerd accepted broken TOML");
    }
}
