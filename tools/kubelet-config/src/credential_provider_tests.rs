//! kubelet v1.36's credential provider rules (`config.go`, `plugin.go`), each one failing.

use super::*;

const GOOD: &str = r#"{"apiVersion":"kubelet.config.k8s.io/v1","kind":"CredentialProviderConfig",
"providers":[{"name":"ecr-credential-provider","matchImages":["*.dkr.ecr.*.amazonaws.com"],
"defaultCacheDuration":"12h","apiVersion":"credentialprovider.kubelet.k8s.io/v1",
"args":["get-credentials"],"env":[{"name":"AWS_REGION","value":"eu-west-1"}]}]}"#;

fn one(provider: &str) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n{provider}"
    )
}

#[test]
fn a_good_config_decodes_in_json_and_yaml() {
    let p = decode(GOOD).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].name, "ecr-credential-provider");
    assert_eq!(p[0].default_cache_duration, Some(12 * 3600 * 1_000_000_000));
    assert!(validate(&p, true).is_empty());
    let y = decode(&one(
        "- name: gcp\n  matchImages: [gcr.io, \"*.pkg.dev\"]\n  defaultCacheDuration: 0s\n  apiVersion: credentialprovider.kubelet.k8s.io/v1beta1\n",
    ))
    .unwrap();
    assert_eq!(y[0].match_images, ["gcr.io", "*.pkg.dev"]);
    assert!(validate(&y, true).is_empty(), "{:?}", validate(&y, true));
}

#[test]
fn decoding_is_strict_and_typed() {
    for (text, needle) in [
        (
            GOOD.replace("\"args\"", "\"argz\""),
            "strict decoding error: unknown field \"providers[0].argz\"",
        ),
        (
            GOOD.replace("\"value\":\"eu-west-1\"", "\"value\":\"x\",\"from\":\"y\""),
            "unknown field \"providers[0].env[0].from\"",
        ),
        (
            GOOD.replace("kubelet.config.k8s.io/v1\"", "kubelet.config.k8s.io/v2\""),
            "no kind \"CredentialProviderConfig\" is registered for version \"kubelet.config.k8s.io/v2\"",
        ),
        (GOOD.replace("\"kind\":\"CredentialProviderConfig\",", ""), "Object 'Kind' is missing"),
        (
            GOOD.replace("\"12h\"", "12"),
            "json: cannot unmarshal number into Go struct field CredentialProvider.providers.defaultCacheDuration of type string",
        ),
        (GOOD.replace("\"12h\"", "\"12 hours\""), "time: unknown unit \" hours\""),
        (
            one("- name: a\n  tokenAttributes: {}\n").replace("/v1\n", "/v1beta1\n"),
            "unknown field \"providers[0].tokenAttributes\"",
        ),
    ] {
        let e = decode(&text).unwrap_err();
        assert!(e.contains(needle), "{needle:?} not in {e}");
    }
}

#[test]
fn each_field_rule_is_reported_as_kubelet_words_it() {
    let base = Provider {
        name: "p".into(),
        match_images: vec!["gcr.io".into()],
        default_cache_duration: Some(0),
        api_version: PROVIDER_API_VERSIONS[0].into(),
        token_attributes: None,
    };
    assert_eq!(
        validate(&[], true),
        ["providers: Required value: at least 1 item in plugins is required"]
    );
    let case = |f: &dyn Fn(&mut Provider)| {
        let mut p = base.clone();
        f(&mut p);
        validate(&[p], true)
    };
    assert_eq!(
        case(&|p| p.name = "a/b".into()),
        ["providers.name: Invalid value: \"a/b\": provider name cannot contain '/'"]
    );
    assert_eq!(
        case(&|p| p.name = "a b".into()),
        ["providers.name: Invalid value: \"a b\": provider name cannot contain spaces"]
    );
    assert_eq!(case(&|p| p.name = "..".into()).len(), 1);
    assert_eq!(
        case(&|p| p.api_version = "credentialprovider.kubelet.k8s.io/v2".into()),
        ["providers.apiVersion: Unsupported value: \"credentialprovider.kubelet.k8s.io/v2\": supported values: \"credentialprovider.kubelet.k8s.io/v1\", \"credentialprovider.kubelet.k8s.io/v1alpha1\", \"credentialprovider.kubelet.k8s.io/v1beta1\""]
    );
    assert_eq!(
        case(&|p| p.api_version.clear()),
        ["providers.apiVersion: Required value"]
    );
    assert_eq!(
        case(&|p| p.match_images.clear()),
        ["providers.matchImages: Required value: at least 1 item in matchImages is required"]
    );
    assert!(
        case(&|p| p.match_images = vec!["a.io/%zz".into()])[0].contains(
            "match image is invalid: parse \"https://a.io/%zz\": invalid URL escape \"%zz\""
        )
    );
    assert!(case(&|p| p.match_images = vec!["a.io:x".into()])[0]
        .contains("invalid port \":x\" after host"));
    // net/url refuses these in a host name; kubelet then exits 1 on every node.
    for bad in ["a b.io", "gcr.io|x", "{x}.io", "a\\b.io"] {
        let e = case(&|p| p.match_images = vec![bad.into()]);
        assert!(e[0].contains("in host name"), "{bad}: {e:?}");
    }
    assert!(
        case(&|p| p.match_images = vec!["*.dkr.ecr.*.amazonaws.com:443/team".into()]).is_empty()
    );
    assert_eq!(
        case(&|p| p.default_cache_duration = None),
        ["providers.defaultCacheDuration: Required value"]
    );
    assert_eq!(
        case(&|p| p.default_cache_duration = Some(-60_000_000_000)),
        ["providers.defaultCacheDuration: Invalid value: \"-1m0s\": must be greater than or equal to 0"]
    );
    // Two providers of one name; both errors of one provider together.
    assert_eq!(
        validate(&[base.clone(), base.clone()], true),
        ["providers.name: Duplicate value: \"p\""]
    );
    assert_eq!(
        case(&|p| {
            p.name = "a/b c".into();
            p.match_images.clear();
        })
        .len(),
        3
    );
}

#[test]
fn token_attributes_rules() {
    let mut t = Map::new();
    t.insert(
        "serviceAccountTokenAudience".into(),
        "sts.amazonaws.com".into(),
    );
    t.insert("requireServiceAccount".into(), false.into());
    t.insert("cacheType".into(), "Token".into());
    let p = Provider {
        name: "p".into(),
        match_images: vec!["gcr.io".into()],
        default_cache_duration: Some(0),
        api_version: PROVIDER_API_VERSIONS[0].into(),
        token_attributes: Some(t.clone()),
    };
    assert!(validate(std::slice::from_ref(&p), true).is_empty());
    assert!(validate(std::slice::from_ref(&p), false)[0].contains("feature gate is disabled"));
    let mut bad = p.clone();
    let mut t2 = t.clone();
    t2.insert("cacheType".into(), "Forever".into());
    t2.insert(
        "requiredServiceAccountAnnotationKeys".into(),
        serde_json::json!(["a.io/x"]),
    );
    bad.token_attributes = Some(t2);
    bad.api_version = PROVIDER_API_VERSIONS[2].into();
    let errs = validate(&[bad], true);
    for needle in [
        "only supported for credentialprovider.kubelet.k8s.io/v1 API version",
        "requireServiceAccount cannot be false",
        "cacheType: Unsupported value: \"Forever\"",
    ] {
        assert!(
            errs.iter().any(|e| e.contains(needle)),
            "{needle}: {errs:?}"
        );
    }
}

/// A scratch directory removed when dropped.
struct Scratch(std::path::PathBuf);
impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("kiln-cp-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("bin")).unwrap();
        Scratch(d)
    }
    fn p(&self, rel: &str) -> String {
        self.0.join(rel).to_string_lossy().into_owned()
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(unix)]
#[test]
fn registration_checks_the_bin_dir_the_files_and_each_binary() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("register");
    let (cfg, bin) = (s.p("config.json"), s.p("bin"));
    assert_eq!(
        register(&cfg, &s.p("nope"), true).unwrap_err(),
        format!("plugin binary directory {} did not exist", s.p("nope"))
    );
    assert_eq!(
        register("", &bin, true).unwrap_err(),
        "credential provider config path is empty"
    );
    assert!(register(&cfg, &bin, true)
        .unwrap_err()
        .starts_with(&format!(
            "unable to access path \"{cfg}\": stat {cfg}: no such file"
        )));
    std::fs::write(&cfg, GOOD).unwrap();
    // The binary is looked up last, and kubelet's message names no path (exec.LookPath).
    assert_eq!(
        register(&cfg, &bin, true).unwrap_err(),
        "plugin binary executable  did not exist"
    );
    let exe = s.p("bin/ecr-credential-provider");
    std::fs::write(&exe, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(register(&cfg, &bin, true)
        .unwrap_err()
        .ends_with("permission denied"));
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(
        register(&cfg, &bin, true).unwrap(),
        ["ecr-credential-provider"]
    );
    // A validation error comes before any binary is looked at.
    std::fs::write(&cfg, GOOD.replace("\"12h\"", "\"-1h\"")).unwrap();
    assert!(register(&cfg, &bin, true).unwrap_err().starts_with(
        "failed to validate credential provider config: providers.defaultCacheDuration"
    ));
}

#[cfg(unix)]
#[test]
fn a_directory_of_configs_is_read_in_order_and_a_name_twice_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("dir");
    let (dir, bin) = (s.p("conf.d"), s.p("bin"));
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(
        register(&dir, &bin, true).unwrap_err(),
        format!("no configuration files found in directory \"{dir}\"")
    );
    for n in ["a", "b"] {
        let exe = s.p(&format!("bin/{n}"));
        std::fs::write(&exe, "").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let provider = |n: &str| {
        one(&format!(
            "- name: {n}\n  matchImages: [gcr.io]\n  defaultCacheDuration: 1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n"
        ))
    };
    std::fs::write(s.p("conf.d/20-b.yaml"), provider("b")).unwrap();
    std::fs::write(s.p("conf.d/10-a.json"), provider("a")).unwrap();
    std::fs::write(s.p("conf.d/README.md"), "not read").unwrap();
    assert_eq!(register(&dir, &bin, true).unwrap(), ["a", "b"]);
    std::fs::write(s.p("conf.d/30-a.yml"), provider("a")).unwrap();
    assert_eq!(
        register(&dir, &bin, true).unwrap_err(),
        "duplicate provider name \"a\" found in configuration file(s)"
    );
}
