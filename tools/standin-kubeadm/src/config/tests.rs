use super::*;

/// The shape `kiln render` writes (builder/src/render/kubeadm.rs).
const KILN: &str = "# kiln node contract v1\napiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n    apiServerEndpoint: \"10.0.0.10:6443\"\n    token: \"07401b.f395accd246ae52d\"\n    caCertHashes:\n      - \"sha256:aa\"\n  tlsBootstrapToken: \"07401b.f395accd246ae52d\"\nnodeRegistration:\n  name: \"w1\"\n  criSocket: \"unix:///run/containerd/containerd.sock\"\n  taints: []\n  kubeletExtraArgs:\n    - name: \"node-labels\"\n      value: \"tier=web\"\npatches:\n  directory: \"/run/kiln/kubeadm-patches\"\n";

fn kiln() -> String {
    KILN.to_string()
}

#[test]
fn kilns_join_configuration_loads_without_warnings_and_validates() {
    let l = load(&kiln()).unwrap();
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    assert!(validate(&l.config).is_empty(), "{:?}", validate(&l.config));
    assert_eq!(
        l.config.patches.unwrap().directory,
        "/run/kiln/kubeadm-patches"
    );
}

#[test]
fn documents_need_api_version_and_kind_and_old_versions_are_refused() {
    let e = load("kind: JoinConfiguration\n").unwrap_err();
    assert!(e.contains("kind and apiVersion is mandatory"), "{e}");
    let e = load(&kiln().replace("v1beta4", "v1beta2")).unwrap_err();
    assert!(
        e.contains("old API spec: \"kubeadm.k8s.io/v1beta2\""),
        "{e}"
    );
    let e = load(&kiln().replace("v1beta4", "v1beta9")).unwrap_err();
    assert!(
        e.contains("no kind \"JoinConfiguration\" is registered"),
        "{e}"
    );
    let twice = format!("{}---\n{}", kiln(), kiln());
    assert!(load(&twice).unwrap_err().contains("specified twice"));
    let e = load("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
        .unwrap_err();
    assert!(e.contains("no JoinConfiguration found"), "{e}");
}

#[test]
fn an_unknown_field_is_a_warning_and_a_wrong_type_is_fatal() {
    let l = load(&kiln().replace("  taints: []\n", "  taints: []\n  nodeIP: 1.2.3.4\n")).unwrap();
    assert_eq!(l.warnings.len(), 1);
    assert!(
        l.warnings[0].contains("strict decoding error: unknown field \"nodeRegistration.nodeIP\""),
        "{:?}",
        l.warnings
    );
    // v1beta3's map form of kubeletExtraArgs is a type error in v1beta4.
    let e = load(&kiln().replace(
        "  kubeletExtraArgs:\n    - name: \"node-labels\"\n      value: \"tier=web\"\n",
        "  kubeletExtraArgs:\n    node-labels: tier=web\n",
    ))
    .unwrap_err();
    assert!(e.starts_with("json: "), "{e}");
}

#[test]
fn validation_refuses_each_bad_value() {
    let cases = [
        (
            "token: \"07401b.f395accd246ae52d\"\n    caCertHashes",
            "token: \"bad\"\n    caCertHashes",
            "the bootstrap token is invalid",
        ),
        (
            "    caCertHashes:\n      - \"sha256:aa\"\n",
            "",
            "without caCertHashes can be unsafe",
        ),
        (
            "\"10.0.0.10:6443\"",
            "\"10.0.0.10\"",
            "missing port in address",
        ),
        (
            "unix:///run",
            "tcp:///run",
            "URL scheme tcp is not supported",
        ),
        (
            "name: \"w1\"",
            "name: \"W_1\"",
            "lowercase RFC 1123 subdomain",
        ),
    ];
    for (from, to, want) in cases {
        let text = kiln().replace(from, to);
        assert_ne!(text, kiln(), "{from}");
        let errs = validate(&load(&text).unwrap().config);
        assert!(errs.iter().any(|e| e.contains(want)), "{want}: {errs:?}");
    }
}

#[test]
fn durations_parse_as_go_does() {
    assert_eq!(duration("4m0s").unwrap().as_secs(), 240);
    assert_eq!(duration("1h").unwrap().as_secs(), 3600);
    assert_eq!(duration("500ms").unwrap().as_millis(), 500);
    assert!(duration("5 minutes").is_err());
    assert!(duration("").is_err());
    let t = Timeouts {
        tls_bootstrap: Some("soon".into()),
        ..Default::default()
    };
    assert!(Waits::of(Some(&t))
        .unwrap_err()
        .contains("invalid duration"));
    let w = Waits::of(None).unwrap();
    assert_eq!(
        (
            w.kubelet_health_check.as_secs(),
            w.tls_bootstrap.as_secs(),
            w.discovery.as_secs()
        ),
        (240, 300, 300)
    );
}
