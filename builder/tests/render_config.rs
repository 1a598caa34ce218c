//! node.toml → contract files: validation errors name the file and key, node.env is exactly
//! what the contract specifies, and kubeadm mode yields a v1beta4 JoinConfiguration whose CA
//! pin matches the one openssl computes.

use crate::render_support;

use std::path::Path;

use kiln::render::{NodeConfig, NodeFile};
use render_support::*;

fn load(dir: &Path) -> Result<NodeConfig, String> {
    NodeConfig::load(&dir.join("node.toml")).map_err(|e| e.to_string())
}

fn file<'a>(files: &'a [NodeFile], name: &str) -> &'a NodeFile {
    files
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no {name} in {files:?}"))
}

#[test]
fn kubelet_mode_writes_the_contract_files() {
    let dir = node_dir(&full_node_toml("kubelet"));
    let node = load(dir.path()).unwrap();
    let files = node.files();
    let names: Vec<(&str, u32)> = files.iter().map(|f| (f.name.as_str(), f.mode)).collect();
    assert_eq!(
        names,
        [
            ("node.env", 0o644),
            ("ca.crt", 0o644),
            ("bootstrap-token", 0o600),
            ("containerd/certs.d/docker.io/hosts.toml", 0o644),
            ("containerd/certs.d/registry.internal_5000_/ca.crt", 0o644),
            (
                "containerd/certs.d/registry.internal_5000_/hosts.toml",
                0o644
            )
        ]
    );
    assert_eq!(
        String::from_utf8(file(&files, "node.env").contents.clone()).unwrap(),
        "# kiln node contract v1: written by `kiln render` from node.toml.\n\
         KILN_CONTRACT=1\n\
         API_SERVER=https://127.0.0.1:6443\n\
         CLUSTER_NAME=prod-eu1\n\
         JOIN_MODE=kubelet\n\
         PROVIDER=aws\n\
         NODE_NAME=worker-1\n\
         NODE_IP=10.0.3.7\n\
         NODE_LABELS=node.kubernetes.io/role=worker,tier=web\n\
         NODE_TAINTS=gpu=true:NoSchedule,dedicated:NoExecute\n\
         MAX_PODS=58\n\
         CLUSTER_DNS=10.96.0.10\n\
         KUBELET_EXTRA_ARGS=\"--v=2 --serialize-image-pulls=false\"\n\
         KILN_DEADLINE=600\n\
         HTTP_PROXY=http://proxy.internal:3128\n\
         HTTPS_PROXY=http://proxy.internal:3128\n\
         NO_PROXY=10.0.0.0/8,.svc,localhost,169.254.169.254\n"
    );
    assert_eq!(
        file(&files, "bootstrap-token").contents,
        format!("{TOKEN}\n").into_bytes()
    );
    assert_eq!(
        file(&files, "ca.crt").contents,
        std::fs::read(dir.path().join("ca.crt")).unwrap()
    );
    // The env file reads back with the contract's own rules.
    let env = kiln_firstboot::contract::envfile::parse(
        std::str::from_utf8(&file(&files, "node.env").contents).unwrap(),
    )
    .unwrap();
    let pairs = env.entries();
    assert_eq!(
        pairs[11],
        (
            "KUBELET_EXTRA_ARGS".into(),
            "--v=2 --serialize-image-pulls=false".into()
        )
    );
    assert!(kiln::render::contract_problems(&files).is_empty());
}

#[test]
fn minimal_config_and_optional_files() {
    let dir = node_dir(
        "api_server = \"https://api.example.internal\"\ncluster_name = \"c1\"\n\
         [ca]\nfile = \"ca.crt\"\n[bootstrap]\nkubeconfig_file = \"bootstrap.kubeconfig\"\n\
         [kubelet]\nconfig_file = \"kubelet.yaml\"\n",
    );
    let kubeconfig = "apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\n";
    std::fs::write(dir.path().join("bootstrap.kubeconfig"), kubeconfig).unwrap();
    let kubelet = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                   imageGCHighThresholdPercent: 90\nfeatureGates:\n  NodeSwap: true\n";
    std::fs::write(dir.path().join("kubelet.yaml"), kubelet).unwrap();
    let files = load(dir.path()).unwrap().files();
    let names: Vec<(&str, u32)> = files.iter().map(|f| (f.name.as_str(), f.mode)).collect();
    assert_eq!(
        names,
        [
            ("node.env", 0o644),
            ("ca.crt", 0o644),
            ("bootstrap-kubeconfig", 0o600),
            ("kubelet-dropin.conf", 0o644)
        ]
    );
    assert_eq!(
        file(&files, "bootstrap-kubeconfig").contents,
        kubeconfig.as_bytes()
    );
    // A drop-in kubelet merges over the image's config, never a replacement of it: the
    // file's fields as JSON, checked with the stand-in kubelet's rules.
    assert_eq!(
        String::from_utf8(file(&files, "kubelet-dropin.conf").contents.clone()).unwrap(),
        "{\n  \"apiVersion\": \"kubelet.config.k8s.io/v1beta1\",\n  \"featureGates\": {\n    \"NodeSwap\": true\n  },\n  \
         \"imageGCHighThresholdPercent\": 90,\n  \"kind\": \"KubeletConfiguration\"\n}\n"
    );
    assert_eq!(
        String::from_utf8(file(&files, "node.env").contents.clone()).unwrap(),
        "# kiln node contract v1: written by `kiln render` from node.toml.\n\
         KILN_CONTRACT=1\nAPI_SERVER=https://api.example.internal\nCLUSTER_NAME=c1\n\
         JOIN_MODE=kubelet\nPROVIDER=auto\n"
    );
}

/// Every provider kiln-firstboot has (issue 40's platforms included) renders into node.env
/// as itself, and firstboot's own node.env reader takes it back.
#[test]
fn every_firstboot_provider_renders() {
    use kiln_firstboot::contract::node_env::{Provider, PROVIDER};
    for p in Provider::ALL {
        let toml = full_node_toml("kubelet").replace(
            "provider = \"aws\"",
            &format!("provider = \"{}\"", p.name()),
        );
        let dir = node_dir(&toml);
        let files = load(dir.path()).unwrap().files();
        let env = String::from_utf8(file(&files, "node.env").contents.clone()).unwrap();
        let line = format!("{PROVIDER}={}", p.name());
        assert!(env.lines().any(|l| l == line), "{line}:\n{env}");
        let parsed = kiln_firstboot::contract::envfile::parse(&env).unwrap();
        assert_eq!(
            Provider::parse_choice(parsed.get(PROVIDER).unwrap()),
            Ok(Some(p))
        );
    }
}

#[test]
fn server_tls_bootstrap_reaches_node_env_only_when_on() {
    let with = |v: &str| {
        let dir = node_dir(&format!(
            "api_server = \"https://127.0.0.1:6443\"\ncluster_name = \"c1\"\n\
             [ca]\nfile = \"ca.crt\"\n[bootstrap]\ntoken = \"{TOKEN}\"\n\
             [kubelet]\nextra_args = [\"--v=2\"]\n{v}"
        ));
        load(dir.path())
            .map(|n| String::from_utf8(file(&n.files(), "node.env").contents.clone()).unwrap())
    };
    let on = with("server_tls_bootstrap = true\n").unwrap();
    assert!(
        on.ends_with("KUBELET_EXTRA_ARGS=--v=2\nKUBELET_SERVER_TLS_BOOTSTRAP=true\n"),
        "{on}"
    );
    for off in ["server_tls_bootstrap = false\n", ""] {
        let env = with(off).unwrap();
        assert!(!env.contains("KUBELET_SERVER_TLS_BOOTSTRAP"), "{env}");
    }
    let err = with("server_tls_bootstrap = \"yes\"\n").unwrap_err();
    assert!(
        err.contains("server_tls_bootstrap") && err.contains("expected a boolean"),
        "{err}"
    );
}

#[test]
fn errors_name_the_file_the_key_and_what_was_found() {
    let base = full_node_toml("kubelet");
    let cases: Vec<(String, &str)> = vec![
        (format!("{base}\nsurprise = 1\n"), "unknown field `surprise`"),
        (base.replace("max_pods = 58", "max_pods = 58\nmaxpods = 3"), "unknown field `maxpods`"),
        (base.replace("https://127.0.0.1:6443", "http://127.0.0.1:6443"), "key `api_server`: expected an https://host[:port] URL"),
        (base.replace("127.0.0.1:6443", "127.0.0.1:99999"), "key `api_server`"),
        (base.replace("https://127.0.0.1:6443", "https://127.0.0.1:6443/api"), "key `api_server`"),
        (base.replace("prod-eu1", "prod eu1"), "key `cluster_name`"),
        (base.replace("join_mode = \"kubelet\"", "join_mode = \"magic\""), "unknown variant `magic`"),
        (base.replace("provider = \"aws\"", "provider = \"ibm\""), "unknown variant `ibm`"),
        (base.replace("deadline = 600", "deadline = 0"), "key `deadline`"),
        (base.replace(TOKEN, "ABCDEF.0123456789abcdef"), "key `bootstrap.token`: expected a bootstrap token"),
        (base.replace("[bootstrap]\n", "[bootstrap]\nkubeconfig_file = \"k\"\n"), "key `bootstrap`: expected exactly one of"),
        (base.replace("file = \"ca.crt\"", "file = \"ca.crt\"\npem = \"x\""), "key `ca`: expected exactly one of `ca.pem` (inline PEM) or `ca.file` (a path), found both"),
        (base.replace("file = \"ca.crt\"", "pem = \"not a cert\""), "key `ca`: expected a PEM bundle of one or more X.509 certificates, found no -----BEGIN CERTIFICATE----- block"),
        (base.replace("file = \"ca.crt\"", "file = \"missing.crt\""), "missing.crt: cannot read"),
        (base.replace("worker-1", "Worker_1"), "key `node.name`"),
        (base.replace("10.0.3.7", "10.0.3"), "key `node.ip`"),
        (base.replace("tier = \"web\"", "tier = \"-web\""), "key `node.labels.\"tier\"`"),
        (base.replace("NoSchedule", "Sometimes"), "key `node.taints[0].effect`: expected NoSchedule, PreferNoSchedule or NoExecute, found \"Sometimes\""),
        (base.replace("\"--v=2\"", "\"-v 2\""), "key `kubelet.extra_args[0]`"),
        (base.replace("\"--v=2\"", "\"--v=$(id)\""), "key `kubelet.extra_args[0]`"),
        (base.replace("10.96.0.10", "dns"), "key `kubelet.cluster_dns[0]`"),
        (base.replace("http://proxy.internal:3128\"\nhttps", "proxy.internal:3128\"\nhttps"), "key `proxy.http`"),
        (base.replace("\"localhost\"", "\"a,b\""), "key `proxy.no_proxy[2]`"),
        // kiln-firstboot's doctor rule, at render time: the proxy must not catch the
        // metadata address or the API server.
        (base.replace(", \"169.254.169.254\"", ""), "key `proxy.no_proxy`: expected entries that cover the API server and the metadata address 169.254.169.254 when a proxy is set (kiln-firstboot's doctor fails `proxy` otherwise), found [\"10.0.0.0/8\", \".svc\", \"localhost\"], which does not cover the metadata address 169.254.169.254"),
        (base.replace("https://127.0.0.1:6443", "https://api.example.com"), "which does not cover the API server api.example.com"),
        (format!("kiln_contract = 2\n{base}"), "key `kiln_contract`: expected 1"),
        // [[containerd.registry]]: each refusal names the registry's index and key.
        (base.replace("host = \"docker.io\"", "host = \"https://docker.io\""), "key `containerd.registry[1].host`: expected a registry as image references name it"),
        (base.replace("host = \"docker.io\"", "host = \"registry.internal:5000\""), "key `containerd.registry[1].host`: expected each registry listed once, found \"registry.internal:5000\" a second time"),
        (base.replace("\"https://hub-mirror.internal\"", "\"https://u:secret-pw@hub-mirror.internal\""), "key `containerd.registry[1].mirrors[0]`: expected a URL without credentials"),
        (base.replace("\"https://hub-mirror.internal\"", "\"ftp://hub-mirror.internal\""), "key `containerd.registry[1].mirrors[0]`: expected an http:// or https:// URL"),
        (base.replace("\"https://hub-mirror.internal\"", "\"https://hub-mirror.internal?x=1\""), "key `containerd.registry[1].mirrors[0]`"),
        (base.replace("\"https://hub-mirror.internal\"", "3"), "key `containerd.registry[1].mirrors[0]`: expected a URL string or a `{ url, capabilities }` table, found integer"),
        (base.replace("capabilities = [\"pull\"]", "capabilities = [\"pull\", \"fly\"]"), "key `containerd.registry[0].mirrors[1].capabilities`: expected a non-empty list of `pull`, `resolve`, `push`, each once, found \"fly\""),
        (base.replace("capabilities = [\"pull\"]", "capabilities = []"), "key `containerd.registry[0].mirrors[1].capabilities`"),
        (base.replace("capabilities = [\"pull\"]", "capability = [\"pull\"]"), "key `containerd.registry[0].mirrors[1]`: expected a mirror table with `url` and optional `capabilities`, found key \"capability\""),
        (base.replace("mirrors = [\"https://hub-mirror.internal\"]", "skip_verify = true"), "key `containerd.registry[1].skip_verify`: expected no skip_verify: kiln never turns containerd's TLS verification off"),
        (base.replace("mirrors = [\"https://hub-mirror.internal\"]", ""), "key `containerd.registry[1]`: expected a mirror, a CA or another server"),
        (base.replace("file = \"./ca.crt\"", "pem = \"-----BEGIN CERTIFICATE-----\\nAAAA\\n\""), "key `containerd.registry[0].ca`: expected a PEM bundle of one or more X.509 certificates, found certificate 1 has no -----END CERTIFICATE----- line"),
        (base.replace("file = \"./ca.crt\"", "file = \"./ca.crt\", pem = \"x\""), "key `containerd.registry[0].ca`: expected exactly one of `pem` (inline PEM) or `file` (a path), found both"),
        (base.replace("\"https://mirror-a.internal\", ", "").replace("host = \"registry.internal:5000\"", "host = \"registry.internal:5000\"\nserver = \"http://registry.internal:5000\""), "key `containerd.registry[0].ca`: expected a CA only for a registry with an https:// endpoint, found only http:// endpoints"),
    ];
    for (toml, want) in cases {
        let dir = node_dir(&toml);
        let err = load(dir.path()).expect_err(want);
        let file = dir.path().join(if want.contains("missing.crt") {
            "missing.crt"
        } else {
            "node.toml"
        });
        assert!(err.starts_with(&file.display().to_string()), "{err}");
        assert!(err.contains(want), "want {want:?} in:\n{err}");
    }
}

#[test]
fn a_bad_token_is_described_but_never_echoed() {
    let secret = "abcdef.0123456789ABCDEF";
    let dir = node_dir(&full_node_toml("kubelet").replace(TOKEN, secret));
    let err = load(dir.path()).unwrap_err();
    assert!(!err.contains("0123456789"), "{err}");
    assert!(err.contains("\"xxxxxx.xxxxxxxxxx??????\""), "{err}");
}

#[test]
fn kubeadm_mode_writes_a_v1beta4_join_configuration() {
    let dir = node_dir(&full_node_toml("kubeadm"));
    let node = load(dir.path()).unwrap();
    let files = node.files();
    let names: Vec<(&str, u32)> = files.iter().map(|f| (f.name.as_str(), f.mode)).collect();
    assert_eq!(
        names,
        [
            ("node.env", 0o644),
            ("ca.crt", 0o644),
            ("kubeadm-join.yaml", 0o600),
            ("containerd/certs.d/docker.io/hosts.toml", 0o644),
            ("containerd/certs.d/registry.internal_5000_/ca.crt", 0o644),
            (
                "containerd/certs.d/registry.internal_5000_/hosts.toml",
                0o644
            )
        ]
    );
    let pin = openssl_spki_pin(&dir.path().join("ca.crt"));
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_slice(&file(&files, "kubeadm-join.yaml").contents).unwrap();
    let s = |path: &[&str]| {
        let mut v = &doc;
        for p in path {
            v = v
                .get(*p)
                .unwrap_or_else(|| panic!("no {path:?} in {doc:?}"));
        }
        v.clone()
    };
    assert_eq!(s(&["apiVersion"]).as_str(), Some("kubeadm.k8s.io/v1beta4"));
    assert_eq!(s(&["kind"]).as_str(), Some("JoinConfiguration"));
    assert_eq!(
        s(&["discovery", "bootstrapToken", "apiServerEndpoint"]).as_str(),
        Some("127.0.0.1:6443")
    );
    assert_eq!(
        s(&["discovery", "bootstrapToken", "token"]).as_str(),
        Some(TOKEN)
    );
    assert_eq!(s(&["discovery", "tlsBootstrapToken"]).as_str(), Some(TOKEN));
    let hashes = s(&["discovery", "bootstrapToken", "caCertHashes"]);
    assert_eq!(hashes.as_sequence().unwrap().len(), 1);
    assert_eq!(hashes[0].as_str(), Some(pin.as_str()));
    assert_eq!(s(&["nodeRegistration", "name"]).as_str(), Some("worker-1"));
    assert_eq!(
        s(&["nodeRegistration", "criSocket"]).as_str(),
        Some("unix:///run/containerd/containerd.sock")
    );
    let taints = s(&["nodeRegistration", "taints"]);
    assert_eq!(taints[0]["key"].as_str(), Some("gpu"));
    assert_eq!(taints[0]["value"].as_str(), Some("true"));
    assert_eq!(taints[1]["effect"].as_str(), Some("NoExecute"));
    assert!(taints[1].get("value").is_none());
    let args: Vec<(String, String)> = s(&["nodeRegistration", "kubeletExtraArgs"])
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["name"].as_str().unwrap().to_string(),
                a["value"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want = [
        ("node-labels", "node.kubernetes.io/role=worker,tier=web"),
        ("node-ip", "10.0.3.7"),
        ("v", "2"),
        ("serialize-image-pulls", "false"),
    ];
    assert_eq!(
        args,
        want.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<Vec<_>>()
    );
    // Max pods is a KubeletConfiguration field: it goes through kiln-firstboot's patch in the
    // directory the JoinConfiguration names (node.env's MAX_PODS), not a deprecated flag.
    assert_eq!(
        s(&["patches", "directory"]).as_str(),
        Some("/run/kiln/kubeadm-patches")
    );
    let env = String::from_utf8(file(&files, "node.env").contents.clone()).unwrap();
    assert!(env.contains("\nJOIN_MODE=kubeadm\n"), "{env}");
    assert!(kiln::render::contract_problems(&files).is_empty());

    // kubeadm discovers with a token: a kubeconfig cannot stand in for it.
    let other = node_dir(
        &full_node_toml("kubeadm")
            .replace(&format!("token = \"{TOKEN}\""), "kubeconfig_file = \"k\""),
    );
    assert!(load(other.path())
        .unwrap_err()
        .contains("key `bootstrap.kubeconfig_file`"));
}

#[test]
fn ca_pins_match_openssl_for_rsa_ec_and_bundles() {
    let dir = tempfile::tempdir().unwrap();
    let rsa = make_ca(dir.path(), "rsa");
    let ec = make_ca(dir.path(), "ec");
    let mut bundle = std::fs::read_to_string(&rsa).unwrap();
    bundle.push_str(&std::fs::read_to_string(&ec).unwrap());
    let ders = kiln::render::kubeadm::pem_certificates(&bundle).unwrap();
    assert_eq!(ders.len(), 2);
    let pins: Vec<String> = ders
        .iter()
        .map(|d| kiln::render::kubeadm::spki_sha256(d).unwrap())
        .collect();
    assert_eq!(pins, vec![openssl_spki_pin(&rsa), openssl_spki_pin(&ec)]);
    // A truncated certificate is refused, not hashed.
    assert!(kiln::render::kubeadm::spki_sha256(&ders[0][..200]).is_err());
}

/// Every key path of a YAML document, `[]` marking list items.
fn key_paths(v: &serde_yaml_ng::Value, at: &str, out: &mut Vec<String>) {
    match v {
        serde_yaml_ng::Value::Mapping(m) => {
            for (k, v) in m {
                let p = format!("{at}.{}", k.as_str().unwrap());
                out.push(p.clone());
                key_paths(v, &p, out);
            }
        }
        serde_yaml_ng::Value::Sequence(items) => {
            for v in items {
                key_paths(v, &format!("{at}[]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn join_configuration_uses_only_v1beta4_fields() {
    // The JSON field names of kubeadm's v1beta4 JoinConfiguration, Discovery,
    // BootstrapTokenDiscovery, NodeRegistrationOptions, Arg and core/v1 Taint, as declared in
    // kubernetes/kubernetes cmd/kubeadm/app/apis/kubeadm/v1beta4/types.go: a typo here would
    // be ignored by kubeadm's lenient decoder and silently lose the setting.
    let known = [
        ".apiVersion",
        ".kind",
        ".dryRun",
        ".caCertPath",
        ".skipPhases",
        ".patches",
        ".patches.directory",
        ".timeouts",
        ".controlPlane",
        ".discovery",
        ".discovery.bootstrapToken",
        ".discovery.file",
        ".discovery.tlsBootstrapToken",
        ".discovery.bootstrapToken.token",
        ".discovery.bootstrapToken.apiServerEndpoint",
        ".discovery.bootstrapToken.caCertHashes",
        ".discovery.bootstrapToken.unsafeSkipCAVerification",
        ".nodeRegistration",
        ".nodeRegistration.name",
        ".nodeRegistration.criSocket",
        ".nodeRegistration.taints",
        ".nodeRegistration.taints[].key",
        ".nodeRegistration.taints[].value",
        ".nodeRegistration.taints[].effect",
        ".nodeRegistration.kubeletExtraArgs",
        ".nodeRegistration.kubeletExtraArgs[].name",
        ".nodeRegistration.kubeletExtraArgs[].value",
        ".nodeRegistration.ignorePreflightErrors",
        ".nodeRegistration.imagePullPolicy",
        ".nodeRegistration.imagePullSerial",
    ];
    for mode_toml in [full_node_toml("kubeadm"), full_node_toml("kubeadm").replace("[node]\n", "[node]\n# no taints\n").replace("taints = [{ key = \"gpu\", value = \"true\", effect = \"NoSchedule\" }, { key = \"dedicated\", effect = \"NoExecute\" }]\n", "")] {
        let dir = node_dir(&mode_toml);
        let files = load(dir.path()).unwrap().files();
        let doc: serde_yaml_ng::Value =
            serde_yaml_ng::from_slice(&file(&files, "kubeadm-join.yaml").contents).unwrap();
        let mut paths = Vec::new();
        key_paths(&doc, "", &mut paths);
        let unknown: Vec<&String> = paths.iter().filter(|p| !known.contains(&p.as_str())).collect();
        assert!(unknown.is_empty(), "not v1beta4 JoinConfiguration fields: {unknown:?}");
        assert!(paths.contains(&".nodeRegistration.taints".to_string()), "taints always explicit");
        let taints = doc["nodeRegistration"]["taints"].as_sequence().unwrap();
        assert_eq!(taints.is_empty(), !mode_toml.contains("taints ="));
    }
}

/// Issue 34 item 6: proxy credentials would land in node.env, kubelet.env and containerd.env,
/// all 0644: a proxy URL with userinfo is refused, the message says how to pass them, and the
/// password is never echoed.
#[test]
fn proxy_credentials_are_refused_without_echoing_them() {
    let base = full_node_toml("kubelet");
    for (from, to, key) in [
        (
            "https = \"http://proxy.internal:3128\"",
            "https = \"http://u:PW0rd@h:3128\"",
            "proxy.https",
        ),
        (
            "http = \"http://proxy.internal:3128\"",
            "http = \"http://user@h:3128\"",
            "proxy.http",
        ),
        (
            "https = \"http://proxy.internal:3128\"",
            "https = \"https://u:PW0rd@h\"",
            "proxy.https",
        ),
    ] {
        let dir = node_dir(&base.replace(from, to));
        let err = load(dir.path()).expect_err(to);
        assert!(err.contains(&format!("key `{key}`")), "{err}");
        assert!(err.contains("credentials"), "{err}");
        assert!(!err.contains("PW0rd") && !err.contains("user@"), "{err}");
    }
}

/// Runs `load` on another thread: a FIFO must not hang it.
fn load_within(dir: &Path, secs: u64) -> Result<NodeConfig, String> {
    let dir = dir.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(load(&dir));
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .expect("reading node.toml's files hung")
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Issue 34 item 7: the files node.toml names are regular files of bounded size: a FIFO is
/// refused at once, `/dev/zero` is not read until memory runs out, an oversized CA is refused.
#[test]
fn special_and_oversized_files_are_refused_before_reading() {
    let base = full_node_toml("kubelet");
    // The CA as a FIFO, as /dev/zero, and 2 MiB of PEM-ish text.
    let dir = node_dir(&base.replace("file = \"ca.crt\"", "file = \"fifo\""));
    mkfifo(&dir.path().join("fifo"));
    let err = load_within(dir.path(), 20).unwrap_err();
    assert!(
        err.contains("not a regular file") && err.contains("ca.file"),
        "{err}"
    );

    let dir = node_dir(&base.replace("file = \"ca.crt\"", "file = \"/dev/zero\""));
    let err = load_within(dir.path(), 20).unwrap_err();
    assert!(
        err.contains("/dev/zero") && err.contains("not a regular file"),
        "{err}"
    );

    let dir = node_dir(&base.replace("file = \"ca.crt\"", "file = \"big.crt\""));
    std::fs::write(dir.path().join("big.crt"), vec![b'A'; 2 << 20]).unwrap();
    let err = load_within(dir.path(), 20).unwrap_err();
    assert!(
        err.contains("big.crt") && err.contains("more than"),
        "{err}"
    );

    // The token file as a FIFO and as a large file.
    let with_file = base.replace(&format!("token = \"{TOKEN}\""), "token_file = \"tok\"");
    let dir = node_dir(&with_file);
    mkfifo(&dir.path().join("tok"));
    let err = load_within(dir.path(), 20).unwrap_err();
    assert!(
        err.contains("not a regular file") && err.contains("tok"),
        "{err}"
    );
    let dir = node_dir(&with_file);
    std::fs::write(dir.path().join("tok"), vec![b'a'; 8192]).unwrap();
    let err = load_within(dir.path(), 20).unwrap_err();
    assert!(err.contains("more than"), "{err}");
}

/// Issue 34 item 7: a `token_file` that is some other file (here shaped like /etc/shadow) is
/// not described: no character-class shape, no contents, at most its length.
#[test]
fn a_token_file_that_is_no_token_is_not_described() {
    let base = full_node_toml("kubelet");
    let dir = node_dir(&base.replace(&format!("token = \"{TOKEN}\""), "token_file = \"tok\""));
    let shadow =
        "root:$6$s3cretsalt$hashhashhash:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n";
    std::fs::write(dir.path().join("tok"), shadow).unwrap();
    let err = load(dir.path()).unwrap_err();
    assert!(err.contains("key `bootstrap.token_file`"), "{err}");
    assert!(err.contains("not a bootstrap token"), "{err}");
    for leak in ["root", "s3cret", "xxxx", "????", "shaped", "19000"] {
        assert!(!err.contains(leak), "{leak:?} in {err}");
    }
}

/// `[sysctl]`: names and values by the contract's rules (the code kiln-firstboot reads the
/// file with), integers as text, sorted by name; what kubelet needs otherwise, a glob, a
/// float and a name that would leave /proc/sys are refused, each naming its key; the Windows
/// provisioner refuses the file; `render --check` judges a hand-written one the same way.
#[test]
fn sysctl_table_becomes_the_checked_sysctl_conf() {
    let base = "api_server = \"https://127.0.0.1:6443\"\ncluster_name = \"c1\"\n\
                [ca]\nfile = \"ca.crt\"\n[bootstrap]\ntoken = \"abcdef.0123456789abcdef\"\n";
    let dir = node_dir(&format!(
        "{base}[sysctl]\n\"vm.max_map_count\" = 262144\n\"net.ipv4.tcp_rmem\" = \"4096 87380 6291456\"\n\
         \"net/ipv4/conf/eth0.100/rp_filter\" = 2\n"
    ));
    let files = load(dir.path()).unwrap().files();
    assert_eq!(
        String::from_utf8(file(&files, "sysctl.conf").contents.clone()).unwrap(),
        "# kiln node contract v1: written by `kiln render` from node.toml's [sysctl].\n\
         net.ipv4.tcp_rmem = 4096 87380 6291456\nnet/ipv4/conf/eth0.100/rp_filter = 2\n\
         vm.max_map_count = 262144\n"
    );
    assert_eq!(file(&files, "sysctl.conf").mode, 0o644);
    assert!(kiln::render::contract_problems(&files).is_empty());
    let windows = kiln::render::render_payload(
        &files,
        kiln::render::Provisioner::Windows,
        Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        windows.contains("[sysctl] sets Linux kernel parameters"),
        "{windows}"
    );

    for (entry, key, says) in [
        (
            "\"net.ipv4.ip_forward\" = 0",
            "sysctl.\"net.ipv4.ip_forward\"",
            "expected 1 or no setting",
        ),
        (
            "\"vm.overcommit_memory\" = 2",
            "sysctl.\"vm.overcommit_memory\"",
            "kubelet sets it at every start",
        ),
        (
            "\"kernel.*\" = 1",
            "sysctl.\"kernel.*\"",
            "expected a sysctl name",
        ),
        (
            "\"net/../../etc/passwd\" = 1",
            "sysctl.\"net/../../etc/passwd\"",
            "expected a sysctl name",
        ),
        (
            "\"vm.swappiness\" = 1.5",
            "sysctl.\"vm.swappiness\"",
            "expected a string or an integer, found float",
        ),
        (
            "\"vm.swappiness\" = \"\"",
            "sysctl.\"vm.swappiness\"",
            "expected a value, found an empty one",
        ),
        (
            "\"vm.swappiness\" = \"1\\n2\"",
            "sysctl.\"vm.swappiness\"",
            "one line",
        ),
    ] {
        let dir = node_dir(&format!("{base}[sysctl]\n{entry}\n"));
        let e = load(dir.path()).unwrap_err();
        assert!(
            e.contains(&format!("key `{key}`")) && e.contains(says),
            "{entry}: {e}"
        );
    }

    // A hand-written sysctl.conf in user data: the contract's parse, then kubelet's needs.
    let check = |contents: &str| {
        kiln::render::contract_problems(&[NodeFile {
            name: "sysctl.conf".into(),
            mode: 0o644,
            contents: contents.as_bytes().to_vec(),
        }])
    };
    let problems = check("net.ipv4.ip_forward = 0\n");
    assert!(
        problems
            .iter()
            .any(|p| p.contains("net.ipv4.ip_forward: expected 1")),
        "{problems:?}"
    );
    let problems = check("kernel/../x = 1\n");
    assert!(
        problems
            .iter()
            .any(|p| p.contains("line 1: expected a sysctl name")),
        "{problems:?}"
    );
}

/// A TOML error quotes the offending line; a line of megabytes is cut, not echoed whole.
#[test]
fn a_huge_line_in_a_parse_error_is_cut() {
    let dir = node_dir(&format!(
        "{}\nbad = [{}\n",
        full_node_toml("kubelet"),
        "1, ".repeat(200_000)
    ));
    let e = load(dir.path()).unwrap_err();
    assert!(e.contains("TOML parse error"), "{}", &e[..e.len().min(400)]);
    assert!(e.len() < 2000, "{} bytes of error", e.len());
    assert!(e.contains('…'), "{e}");
}

/// `node.kube_reserved`, `node.system_reserved`, `node.eviction_hard`: written to node.env in
/// the shape kiln-firstboot reads (sorted, eviction quoted for `<`), and refused when kubelet
/// would refuse them before it starts (a resource it cannot reserve, an unknown signal) or
/// when they are not quantities.
#[test]
fn reservations_reach_node_env_in_kubelets_terms() {
    let base = "api_server = \"https://127.0.0.1:6443\"\ncluster_name = \"c1\"\n\
                [ca]\nfile = \"ca.crt\"\n[bootstrap]\ntoken = \"abcdef.0123456789abcdef\"\n[node]\n";
    let dir = node_dir(&format!(
        "{base}kube_reserved = {{ memory = \"1Gi\", cpu = \"250m\" }}\n\
         system_reserved = {{ pid = \"1000\" }}\n\
         eviction_hard = {{ \"memory.available\" = \"500Mi\", \"nodefs.available\" = \"5%\" }}\n"
    ));
    let env = String::from_utf8(
        file(&load(dir.path()).unwrap().files(), "node.env")
            .contents
            .clone(),
    )
    .unwrap();
    assert!(
        env.contains("\nKUBE_RESERVED=cpu=250m,memory=1Gi\n"),
        "{env}"
    );
    assert!(env.contains("\nSYSTEM_RESERVED=pid=1000\n"), "{env}");
    assert!(
        env.contains("\nEVICTION_HARD=\"memory.available<500Mi,nodefs.available<5%\"\n"),
        "{env}"
    );
    // What kiln-firstboot reads back.
    let parsed = kiln_firstboot::contract::envfile::parse(&env).unwrap();
    assert_eq!(
        parsed.get("EVICTION_HARD"),
        Some("memory.available<500Mi,nodefs.available<5%")
    );
    for (entry, says) in [
        (
            "kube_reserved = { gpu = \"1\" }",
            "cannot reserve \"gpu\" resource",
        ),
        (
            "kube_reserved = { cpu = \"-1\" }",
            "resource=quantity pairs",
        ),
        (
            "system_reserved = { memory = \"lots\" }",
            "resource=quantity pairs",
        ),
        (
            "eviction_hard = { \"disk.available\" = \"1Gi\" }",
            "unsupported eviction signal disk.available",
        ),
        (
            "eviction_hard = { \"memory.available\" = \"150%\" }",
            "must be <= 100%",
        ),
    ] {
        let dir = node_dir(&format!("{base}{entry}\n"));
        let e = load(dir.path()).unwrap_err();
        assert!(e.contains("key `node.") && e.contains(says), "{entry}: {e}");
    }
}

/// docs/render.md's registry example: the node.toml snippet renders exactly the hosts.toml
/// the page shows.
#[test]
fn the_documented_registry_example_renders_as_shown() {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/render.md")).unwrap();
    let section = &page[page.find("### Registries").expect("the section")..];
    let blocks: Vec<&str> = section
        .split("```toml\n")
        .skip(1)
        .take(2)
        .map(|b| &b[..b.find("```").unwrap()])
        .collect();
    let [snippet, hosts] = blocks[..] else {
        panic!("two toml blocks expected")
    };
    let base = full_node_toml("kubelet");
    let base = &base[..base.find("\n[[containerd.registry]]").unwrap()];
    let dir = node_dir(&format!("{base}\n{snippet}"));
    std::fs::copy(
        dir.path().join("ca.crt"),
        dir.path().join("registry-ca.pem"),
    )
    .unwrap();
    let files = load(dir.path()).unwrap().files();
    let got = file(
        &files,
        "containerd/certs.d/registry.example.com_5000_/hosts.toml",
    );
    assert_eq!(String::from_utf8_lossy(&got.contents), hosts);
    let ca = file(
        &files,
        "containerd/certs.d/registry.example.com_5000_/ca.crt",
    );
    assert_eq!(
        ca.contents,
        std::fs::read(dir.path().join("ca.crt")).unwrap()
    );
}

/// `[trust]`: a parsed PEM bundle becomes `trust.d/bundle.crt`; Linux provisioners only.
#[test]
fn trust_bundle_is_checked_and_linux_only() {
    let base = full_node_toml("kubelet");
    let dir = node_dir(&format!("{base}\n[trust]\nfile = \"ca.crt\"\n"));
    let files = load(dir.path()).unwrap().files();
    let bundle = file(&files, "trust.d/bundle.crt");
    assert_eq!(bundle.mode, 0o644);
    assert_eq!(
        bundle.contents,
        std::fs::read(dir.path().join("ca.crt")).unwrap()
    );
    // Read back from cloud-init user data and Ignition, it keeps to the contract.
    for p in [
        kiln::render::Provisioner::CloudInit,
        kiln::render::Provisioner::Ignition,
    ] {
        let payload = kiln::render::render_payload(&files, p, Default::default()).unwrap();
        let back = kiln::render::check_payload(&payload, "ud").unwrap().files;
        assert_eq!(back, files);
        assert_eq!(kiln::render::contract_problems(&back), Vec::<String>::new());
        let mut broken = back.clone();
        broken
            .iter_mut()
            .find(|f| f.name == "trust.d/bundle.crt")
            .unwrap()
            .contents = b"x".to_vec();
        let problems = kiln::render::contract_problems(&broken);
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("/etc/kiln/trust.d/bundle.crt: expected a PEM")),
            "{problems:?}"
        );
    }
    // Windows takes it too, into LocalMachine\Root (render_roundtrip's
    // windows_trust_goes_into_the_machine_root_store).
    let out = kiln()
        .args(["render", "-p", "windows"])
        .arg(dir.path().join("node.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Add-KilnRoot '"));
    for (trust, want) in [
        ("pem = \"not a cert\"", "key `trust`: expected a PEM bundle of one or more X.509 certificates, found no -----BEGIN CERTIFICATE----- block"),
        ("file = \"ca.crt\"\npem = \"x\"", "key `trust`: expected exactly one of `pem` (inline PEM) or `file` (a path), found both"),
        ("file = \"/dev/zero\"", "not a regular file"),
        ("files = [\"ca.crt\"]", "unknown field `files`"),
    ] {
        let dir = node_dir(&format!("{base}\n[trust]\n{trust}\n"));
        let err = load(dir.path()).expect_err(want);
        assert!(err.contains(want), "want {want:?} in:\n{err}");
    }
}

/// `[swap]`: kubelet's two fields in the drop-in, the file's size in node.env (the rule
/// kiln-firstboot applies again), one place deciding, Linux only.
#[test]
fn swap_is_the_drop_in_and_node_envs_file_size() {
    let base = full_node_toml("kubelet");
    let dir = node_dir(&format!(
        "{base}\n[swap]\nfile_size = \"4Gi\"\nbehavior = \"NoSwap\"\n"
    ));
    let node = load(dir.path()).unwrap();
    let files = node.files();
    let env = String::from_utf8(file(&files, "node.env").contents.clone()).unwrap();
    assert!(env.contains("\nSWAP_FILE_SIZE=4294967296\n"), "{env}");
    let parsed = kiln_firstboot::contract::envfile::parse(&env).unwrap();
    let typed = kiln_firstboot::contract::node_env::NodeEnv::from_env(&parsed).unwrap();
    assert_eq!(typed.swap_file_size, Some(4 << 30));
    let dropin: serde_json::Value =
        serde_json::from_slice(&file(&files, "kubelet-dropin.conf").contents).unwrap();
    assert_eq!(dropin["failSwapOn"], false);
    assert_eq!(dropin["memorySwap"]["swapBehavior"], "NoSwap");
    let out = kiln()
        .args(["render", "-p", "windows"])
        .arg(dir.path().join("node.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("swap.file_size makes a Linux swap file"));
    for (extra, want) in [
        ("[swap]\nfile_size = 40000\n", "key `swap.file_size`: expected a size in bytes or a quantity"),
        ("[swap]\nfile_size = \"2.5Ki\"\n", "key `swap.file_size`"),
        ("[swap]\nbehavior = \"UnlimitedSwap\"\n", "key `swap.behavior`: expected LimitedSwap or NoSwap (kubelet's memorySwap.swapBehavior), found \"UnlimitedSwap\""),
        ("[swap]\n[kubelet.config]\nfailSwapOn = false\n", "key `kubelet.config.failSwapOn`: expected swap set in one place"),
        ("[swap]\nsize = 1\n", "unknown field `size`"),
    ] {
        let dir = node_dir(&format!("{base}\n{extra}"));
        let err = load(dir.path()).expect_err(want);
        assert!(err.contains(want), "want {want:?} in:\n{err}");
    }
}
