//! node.toml's `[containerd.config]` against the real containerd: the config `kiln bake` writes
//! imports the file `kiln render` writes, and `containerd config dump` (containerd's own
//! loading and merging, no daemon) shows the node's settings merged over the image's, with
//! the image's own kept. Debian's containerd 1.6.20 (bookworm, config version 2) and sid's
//! containerd 2.x (config version 3, the version kiln's lock ships), unpacked from the
//! package, never installed. Also the two containerd 1.x behaviours kiln guards against: a
//! plugin table in an import replaces the image's whole table (so `kiln render` refuses the CRI
//! plugin in a version-2 fragment), and the version-3 CRI settings are ignored without a word
//! (so kiln-firstboot checks the fragment's version against the image's at boot).

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln::bake::render::{containerd_config, NODE_CONF_D};
use kiln::image_def::ImageDef;
use kiln::render::config::NodeConfig;
use kiln::render::model::CONTAINERD_CONFIG;

use crate::render_support;

#[path = "../../testkit/optout.rs"]
mod optout;

const DEF: &str = "name = \"t\"\nos = \"linux\"\narch = [\"amd64\"]\nformats = [\"rootfs\"]\n\
[kubernetes]\nversion = \"v1.36.4\"\n[[artifact]]\nname = \"kubelet\"\n";

const NODE: &str = "api_server = \"https://127.0.0.1:6443\"\ncluster_name = \"c\"\n\
[ca]\nfile = \"ca.crt\"\n[bootstrap]\ntoken = \"abcdef.0123456789abcdef\"\n";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// sid's containerd, unpacked into `dir` from the package cache `scripts/fixture-mirror.sh`
/// fills (fetched here through `scripts/debian-suite.sh` when it is empty).
fn sid_containerd(dir: &Path) -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap()
        .join("kiln/debs/sid/containerd");
    let find = || {
        let mut debs: Vec<PathBuf> = std::fs::read_dir(&cache)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|v| {
                std::fs::read_dir(v.path().join("amd64"))
                    .into_iter()
                    .flatten()
            })
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "deb"))
            .collect();
        debs.sort();
        debs.pop()
    };
    let deb = match find() {
        Some(d) => d,
        None => {
            let fetch = dir.join("fetch");
            let suite = repo().join("scripts/debian-suite.sh");
            let v = Command::new(&suite)
                .args(["sid", "version", "containerd:amd64"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
            let got = v.is_some_and(|v| {
                Command::new(&suite)
                    .args(["sid", "download"])
                    .arg(&fetch)
                    .arg(format!("containerd:amd64={v}"))
                    .status()
                    .is_ok_and(|s| s.success())
            });
            let deb = std::fs::read_dir(&fetch)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "deb"));
            match deb {
                Some(d) if got => d,
                _ => {
                    optout::cannot_run(
                        "containerd-sid",
                        "sid's containerd package is not in the cache and could not be fetched",
                    );
                    return None;
                }
            }
        }
    };
    let root = dir.join("sid");
    let o = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(&root)
        .output()
        .unwrap();
    assert!(o.status.success(), "dpkg-deb -x {}: {o:?}", deb.display());
    Some(root.join("usr/bin/containerd"))
}

/// The merged configuration `containerd` would run with: the image's config (its import
/// pattern pointed at `conf_d`), the node's file in `conf_d`.
fn dump(containerd: &Path, work: &Path, image_config: &str, node_file: Option<&str>) -> String {
    let conf_d = work.join("conf.d");
    let _ = std::fs::remove_dir_all(&conf_d);
    std::fs::create_dir_all(&conf_d).unwrap();
    if let Some(text) = node_file {
        std::fs::write(conf_d.join("provisioned.toml"), text).unwrap();
    }
    let main = work.join("config.toml");
    assert!(image_config.contains(&format!("imports = ['{NODE_CONF_D}/*.toml']")));
    std::fs::write(
        &main,
        image_config.replace(NODE_CONF_D, &conf_d.to_string_lossy()),
    )
    .unwrap();
    let o = Command::new(containerd)
        .arg("--config")
        .arg(&main)
        .args(["config", "dump"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{} config dump: {}",
        containerd.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// The node file `kiln render` writes for node.toml's `extra`.
fn rendered(extra: &str) -> String {
    let dir = render_support::node_dir(&format!("{NODE}{extra}"));
    let cfg = NodeConfig::load(&dir.path().join("node.toml")).unwrap();
    let files = cfg.files();
    let f = files.iter().find(|f| f.name == CONTAINERD_CONFIG).unwrap();
    assert_eq!(f.mode, 0o644);
    String::from_utf8(f.contents.clone()).unwrap()
}

/// The lines of `dump` that mention `needle`, trimmed.
fn lines_with<'a>(dump: &'a str, needle: &str) -> Vec<&'a str> {
    dump.lines()
        .map(str::trim)
        .filter(|l| l.contains(needle))
        .collect()
}

#[test]
fn containerd_2_merges_the_node_fragment_over_the_baked_config() {
    let d = tempfile::tempdir().unwrap();
    let Some(containerd) = sid_containerd(d.path()) else {
        return;
    };
    let def = ImageDef::parse(DEF, Path::new("t.toml")).unwrap();
    let image = containerd_config(&def, Some("2.1.9"), "registry.k8s.io/pause:3.10.2");
    let before = dump(&containerd, d.path(), &image, None);
    assert_eq!(
        lines_with(&before, "max_concurrent_downloads = "),
        [
            "max_concurrent_downloads = 3",
            "max_concurrent_downloads = 3"
        ]
    );
    let node = rendered(
        "[containerd.config]\nversion = 3\ndisabled_plugins = ['io.containerd.tracing.processor.v1.otlp']\n\
         [containerd.config.plugins.'io.containerd.cri.v1.images']\nmax_concurrent_downloads = 7\n\
         [containerd.config.plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gvisor]\n\
         runtime_type = 'io.containerd.runsc.v1'\n",
    );
    let after = dump(&containerd, d.path(), &image, Some(&node));
    // The node's value in the CRI image plugin; the image's settings of the same table stay.
    assert!(
        lines_with(&after, "max_concurrent_downloads = ").contains(&"max_concurrent_downloads = 7"),
        "{after}"
    );
    for kept in [
        "use_local_image_pull = true",
        "sandbox = 'registry.k8s.io/pause:3.10.2'",
        "config_path = '/etc/kiln/containerd/certs.d:/usr/lib/kiln/containerd/certs.d'",
        "SystemdCgroup = true",
        "runtime_type = 'io.containerd.runc.v2'",
    ] {
        assert!(after.contains(kept), "{kept} lost: {after}");
    }
    assert!(
        after.contains("runtime_type = 'io.containerd.runsc.v1'"),
        "{after}"
    );
    // Lists are appended to: the image's disabled snapshotters and the node's plugin.
    let disabled = lines_with(&after, "disabled_plugins = ")[0];
    for id in [
        "io.containerd.snapshotter.v1.btrfs",
        "io.containerd.tracing.processor.v1.otlp",
    ] {
        assert!(disabled.contains(id), "{disabled}");
    }
}

#[test]
fn containerd_1_6_merges_a_version_2_fragment_and_ignores_version_3_cri_settings() {
    if Command::new("containerd")
        .arg("--version")
        .output()
        .is_err()
    {
        optout::cannot_run(
            "containerd",
            "no containerd on PATH (make deps installs it)",
        );
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let def = ImageDef::parse(DEF, Path::new("t.toml")).unwrap();
    let image = containerd_config(&def, Some("1.6.20"), "registry.k8s.io/pause:3.10.2");
    let containerd = Path::new("containerd");
    // No node file: the pattern matches nothing and containerd starts as baked (a file named
    // outright that does not exist would stop containerd 1.x: `failed to load TOML`).
    let before = dump(containerd, d.path(), &image, None);
    assert!(before.contains("oom_score = 0"), "{before}");
    let kept = [
        "sandbox_image = \"registry.k8s.io/pause:3.10.2\"",
        "SystemdCgroup = true",
        "config_path = \"/etc/kiln/containerd/certs.d:/usr/lib/kiln/containerd/certs.d\"",
    ];
    for k in kept {
        assert!(before.contains(k), "{k} not baked: {before}");
    }

    let node = rendered(
        "[containerd.config]\nversion = 2\noom_score = -500\n\
         [containerd.config.plugins.'io.containerd.internal.v1.opt']\npath = '/opt/kiln-test'\n",
    );
    let after = dump(containerd, d.path(), &image, Some(&node));
    assert!(after.contains("oom_score = -500"), "{after}");
    assert!(after.contains("path = \"/opt/kiln-test\""), "{after}");
    for k in kept {
        assert!(after.contains(k), "{k} lost: {after}");
    }

    // Why render refuses the CRI plugin in a version-2 fragment: written by hand (render
    // would not), one setting of it puts the whole plugin back to containerd's defaults.
    let by_hand =
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  max_concurrent_downloads = 7\n";
    let replaced = dump(containerd, d.path(), &image, Some(by_hand));
    assert!(
        replaced.contains("max_concurrent_downloads = 7"),
        "{replaced}"
    );
    assert!(replaced.contains("SystemdCgroup = false"), "{replaced}");
    assert!(
        !replaced.contains("registry.k8s.io/pause:3.10.2"),
        "{replaced}"
    );
    let dir = render_support::node_dir(&format!(
        "{NODE}[containerd.config]\nversion = 2\n\
         [containerd.config.plugins.'io.containerd.grpc.v1.cri']\nmax_concurrent_downloads = 7\n"
    ));
    let err = NodeConfig::load(&dir.path().join("node.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("containerd.config.plugins.\"io.containerd.grpc.v1.cri\"")
            && err.contains("replaces a plugin's whole table"),
        "{err}"
    );

    // What kiln-firstboot's version check is for: the same setting under the version-3 name
    // is dropped, with no error and no warning.
    let v3 = rendered(
        "[containerd.config]\nversion = 3\n\
         [containerd.config.plugins.'io.containerd.cri.v1.images']\nmax_concurrent_downloads = 7\n",
    );
    let ignored = dump(containerd, d.path(), &image, Some(&v3));
    assert!(
        ignored.contains("max_concurrent_downloads = 3"),
        "{ignored}"
    );
    assert!(
        !ignored.contains("max_concurrent_downloads = 7"),
        "{ignored}"
    );
}

/// `kiln render --check` reads the file back with the same rules, and the version line
/// kiln-firstboot checks.
#[test]
fn render_check_refuses_a_tampered_fragment() {
    let dir = render_support::node_dir(&format!(
        "{NODE}[containerd.config]\nversion = 3\n\
         [containerd.config.plugins.'io.containerd.cri.v1.images']\nmax_concurrent_downloads = 5\n"
    ));
    let tree = dir.path().join("tree");
    let node = dir.path().join("node.toml");
    let o = render_support::run(
        render_support::kiln()
            .args(["render", "-p", "files", "-o"])
            .arg(&tree)
            .arg(&node),
    );
    assert!(o.status.success());
    let check = || {
        render_support::kiln()
            .args(["render", "--check"])
            .arg(&tree)
            .output()
            .unwrap()
    };
    assert_eq!(check().status.code(), Some(0), "{:?}", check());
    let file = tree.join("etc/kiln").join(CONTAINERD_CONFIG);
    for (text, needle) in [
        (
            "version = 3\nimports = ['/x/*.toml']\n",
            "imports: expected no imports",
        ),
        ("version = 4\n", "found 4"),
        (
            "\"version\" = 3\n",
            "expected a line `version = 3` before any table",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        let o = check();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{text}: {err}");
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
}

/// The image's config disables snapshotters to spare containerd's start their probes: that
/// skip must never reach a plugin the CRI path needs. Held to the same rule node.toml's
/// `disabled_plugins` is, for both config versions; and the real containerd keeps overlayfs.
#[test]
fn the_image_disables_only_snapshotters_the_cri_path_does_not_need() {
    let def = ImageDef::parse(DEF, Path::new("t.toml")).unwrap();
    for version in ["2.1.9", "1.6.20"] {
        let config = containerd_config(&def, Some(version), "registry.k8s.io/pause:3.10.2");
        let table: toml::Table = config.parse().unwrap();
        let disabled: Vec<&str> = table["disabled_plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(!disabled.is_empty(), "{version}");
        for id in &disabled {
            assert!(
                id.starts_with("io.containerd.snapshotter.v1."),
                "{version}: {id}"
            );
            assert!(
                !kiln::render::containerd_config::needed_by_cri(id),
                "{version}: {id}"
            );
        }
        assert!(config.contains("snapshotter = 'overlayfs'"), "{config}");
    }
    let d = tempfile::tempdir().unwrap();
    let Some(containerd) = sid_containerd(d.path()) else {
        return;
    };
    let image = containerd_config(&def, Some("2.1.9"), "registry.k8s.io/pause:3.10.2");
    let dumped = dump(&containerd, d.path(), &image, None);
    let disabled = lines_with(&dumped, "disabled_plugins = ")[0];
    assert!(!disabled.contains("overlayfs"), "{disabled}");
}
