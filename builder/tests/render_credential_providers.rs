//! node.toml's `[[kubelet.credential_provider]]`: `kiln render` writes kubelet's
//! `CredentialProviderConfig` (0600) and refuses, naming the entry, what kubelet v1.36 would
//! refuse at start (the rules the stand-in kubelet runs: `kiln-kubelet-config`'s
//! `credential_provider`) and what kiln cannot carry.

use kiln::render::config::NodeConfig;
use kiln::render::model::CREDENTIAL_PROVIDERS;
use kiln_kubelet_config::credential_provider::register;

use crate::render_support;

const NODE: &str = "api_server = \"https://127.0.0.1:6443\"\ncluster_name = \"c\"\n\
[ca]\nfile = \"ca.crt\"\n[bootstrap]\ntoken = \"abcdef.0123456789abcdef\"\n";

const ECR_GCP: &str = "\n[[kubelet.credential_provider]]\nname = \"ecr-credential-provider\"\n\
match_images = [\"*.dkr.ecr.*.amazonaws.com\", \"*.dkr.ecr.*.amazonaws.com.cn\"]\n\
default_cache_duration = \"12h\"\nenv = { AWS_REGION = \"eu-west-1\" }\n\
\n[[kubelet.credential_provider]]\nname = \"auth-provider-gcp\"\n\
match_images = [\"gcr.io\", \"*.gcr.io\", \"*.pkg.dev\", \"container.cloud.google.com\"]\n\
default_cache_duration = \"1m\"\nargs = [\"get-credentials\", \"--v=3\"]\n";

fn load(extra: &str) -> (tempfile::TempDir, Result<NodeConfig, String>) {
    let dir = render_support::node_dir(&format!("{NODE}[kubelet]\n{extra}"));
    let cfg = NodeConfig::load(&dir.path().join("node.toml")).map_err(|e| e.to_string());
    (dir, cfg)
}

#[cfg(unix)]
#[test]
fn the_config_kiln_writes_is_one_kubelet_registers() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, cfg) = load(ECR_GCP);
    let files = cfg.unwrap().files();
    let f = files
        .iter()
        .find(|f| f.name == CREDENTIAL_PROVIDERS)
        .unwrap();
    assert_eq!(f.mode, 0o600);
    let path = dir.path().join("credential-providers.json");
    std::fs::write(&path, &f.contents).unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for name in ["ecr-credential-provider", "auth-provider-gcp"] {
        std::fs::write(bin.join(name), "").unwrap();
        std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let names = register(path.to_str().unwrap(), bin.to_str().unwrap(), true).unwrap();
    assert_eq!(names, ["ecr-credential-provider", "auth-provider-gcp"]);
    let doc: serde_json::Value = serde_json::from_slice(&f.contents).unwrap();
    assert_eq!(doc["apiVersion"], "kubelet.config.k8s.io/v1");
    let ecr = &doc["providers"][0];
    assert_eq!(ecr["apiVersion"], "credentialprovider.kubelet.k8s.io/v1");
    assert_eq!(ecr["env"][0]["name"], "AWS_REGION");
    assert_eq!(doc["providers"][1]["args"][0], "get-credentials");
    // No providers, no file (and so no flags on the node).
    let (_d, cfg) = load("");
    assert!(cfg
        .unwrap()
        .files()
        .iter()
        .all(|f| f.name != CREDENTIAL_PROVIDERS));
}

#[test]
fn each_refusal_names_the_entry_and_what_kubelet_says() {
    let entry = |body: &str| {
        format!("\n[[kubelet.credential_provider]]\nname = \"p\"\nmatch_images = [\"gcr.io\"]\ndefault_cache_duration = \"1m\"\n{body}")
    };
    for (extra, needles) in [
        (
            "\n[[kubelet.credential_provider]]\nname = \"a/b\"\nmatch_images = [\"gcr.io\"]\ndefault_cache_duration = \"1m\"\n".to_string(),
            vec!["key `kubelet.credential_provider[0].name`", "CREDENTIAL_PROVIDER_BIN_DIR", "\"a/b\""],
        ),
        (
            "\n[[kubelet.credential_provider]]\nname = \"p\"\nmatch_images = []\ndefault_cache_duration = \"1m\"\n".to_string(),
            vec!["kubelet.credential_provider[0]`", "at least 1 item in matchImages is required"],
        ),
        (
            "\n[[kubelet.credential_provider]]\nname = \"p\"\nmatch_images = [\"a.io/%zz\"]\ndefault_cache_duration = \"1m\"\n".to_string(),
            vec!["match image is invalid", "invalid URL escape"],
        ),
        (
            "\n[[kubelet.credential_provider]]\nname = \"p\"\nmatch_images = [\"gcr.io\"]\ndefault_cache_duration = \"-1h\"\n".to_string(),
            vec!["must be greater than or equal to 0"],
        ),
        (
            "\n[[kubelet.credential_provider]]\nname = \"p\"\nmatch_images = [\"gcr.io\"]\ndefault_cache_duration = \"12 hours\"\n".to_string(),
            vec!["time: unknown unit"],
        ),
        (entry("api_version = \"credentialprovider.kubelet.k8s.io/v2\"\n"), vec!["Unsupported value"]),
        (entry("env = { \"BAD-NAME\" = \"x\" }\n"), vec!["kubelet.credential_provider[0].env", "\"BAD-NAME\""]),
        (entry("token = \"x\"\n"), vec!["unknown field `token`"]),
        (
            format!("extra_args = [\"--image-credential-provider-bin-dir=/x\"]\n{}", entry("")),
            vec!["kubelet.extra_args[0]", "sets both"],
        ),
        (format!("{}{}", entry(""), entry("")), vec!["kubelet.credential_provider[1].name", "each provider once"]),
        ((0..17).map(|_| entry("")).collect::<String>(), vec!["at most 16 providers"]),
    ] {
        let (_d, cfg) = load(&extra);
        let err = cfg.unwrap_err();
        for n in needles {
            assert!(err.contains(n), "{n:?} not in {err}");
        }
    }
}

#[test]
fn the_windows_provisioner_refuses_and_render_check_reads_the_file_back() {
    let dir = render_support::node_dir(&format!("{NODE}[kubelet]\n{ECR_GCP}"));
    let node = dir.path().join("node.toml");
    let o = render_support::kiln()
        .args(["render", "-p", "windows"])
        .arg(&node)
        .output()
        .unwrap();
    // As for [trust] and [sysctl]: the payload cannot be made (exit 1), naming the section.
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("[[kubelet.credential_provider]]"));
    let tree = dir.path().join("tree");
    render_support::run(
        render_support::kiln()
            .args(["render", "-p", "files", "-o"])
            .arg(&tree)
            .arg(&node),
    );
    let check = || {
        render_support::kiln()
            .args(["render", "--check"])
            .arg(&tree)
            .output()
            .unwrap()
    };
    assert_eq!(check().status.code(), Some(0), "{:?}", check());
    let file = tree.join("etc/kiln").join(CREDENTIAL_PROVIDERS);
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("\"12h\"", "\"-12h\"")).unwrap();
    let o = check();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("credential-providers.json") && err.contains("greater than or equal to 0"),
        "{err}"
    );
}

/// `render --check` never shows a provider's `env` values, even when kubelet's own error
/// would echo the whole document; and kiln does not write a file larger than kiln-firstboot
/// reads.
#[test]
fn check_does_not_echo_env_values_and_render_caps_the_file() {
    let secret = "SUPERSECRETVALUE123";
    let dir = render_support::node_dir(&format!(
        "{NODE}[kubelet]\n[[kubelet.credential_provider]]\nname = \"p\"\nmatch_images = [\"gcr.io\"]\n\
         default_cache_duration = \"1m\"\nenv = {{ TOKEN = \"{secret}\" }}\n"
    ));
    let tree = dir.path().join("tree");
    render_support::run(
        render_support::kiln()
            .args(["render", "-p", "files", "-o"])
            .arg(&tree)
            .arg(dir.path().join("node.toml")),
    );
    let file = tree.join("etc/kiln").join(CREDENTIAL_PROVIDERS);
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("\"kind\": \"CredentialProviderConfig\",", ""),
    )
    .unwrap();
    let o = render_support::kiln()
        .args(["render", "--check"])
        .arg(&tree)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("Object 'Kind' is missing (the document is not shown)"),
        "{err}"
    );
    assert!(!err.contains(secret), "{err}");

    let big = "x".repeat(300 * 1024);
    let (_d, cfg) = load(&format!(
        "\n[[kubelet.credential_provider]]\nname = \"p\"\nmatch_images = [\"gcr.io\"]\n\
         default_cache_duration = \"1m\"\nenv = {{ BIG = \"{big}\" }}\n"
    ));
    let err = cfg.unwrap_err();
    assert!(
        err.contains("at most 262144 bytes as written"),
        "{}",
        &err[..err.len().min(300)]
    );
    assert!(!err.contains(&big[..100]));
}
