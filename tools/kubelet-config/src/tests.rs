use super::*;
use crate::validate::{aggregate, run_checks, validate};

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn with(body: &str) -> Result<Loaded, String> {
    decode(&format!("{HEAD}{body}"))
}

#[test]
fn kilns_baked_config_decodes_strictly_and_validates() {
    let l = with("authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: true\n  x509:\n    clientCAFile: /etc/kiln/ca.crt\nauthorization:\n  mode: Webhook\ncgroupDriver: systemd\nclusterDomain: cluster.local\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\nrotateCertificates: true\nserverTLSBootstrap: true\nreadOnlyPort: 0\n").unwrap();
    assert_eq!(l.lenient, None);
    assert_eq!(validate(&l.config), Vec::<String>::new());
    assert_eq!(l.config.cgroup_driver.as_deref(), Some("systemd"));
}

#[test]
fn unknown_and_duplicate_fields_fall_back_to_lenient() {
    let l = with("maxPods: 10\nfooBar: 1\nauthentication:\n  webhok: {}\nmaxPods: 20\n").unwrap();
    let w = l.lenient.unwrap();
    assert!(
        w.starts_with("strict decoding error: error converting YAML to JSON"),
        "{w}"
    );
    assert!(w.contains("key \"maxPods\" already set in map"), "{w}");
    assert!(w.contains("unknown field \"fooBar\""), "{w}");
    assert!(w.contains("unknown field \"authentication.webhok\""), "{w}");
    // Lenient: the later key wins, the unknown ones are dropped.
    assert_eq!(l.config.max_pods, Some(20));
    // Field names are case-sensitive, as sigs.k8s.io/json decodes them.
    assert!(with("MaxPods: 3\n").unwrap().lenient.is_some());
}

#[test]
fn wrong_types_and_bad_documents_are_fatal() {
    for (body, want) in [
        (
            "maxPods: \"110\"\n",
            "failed to decode: json: invalid type: string \"110\"",
        ),
        (
            "maxPods: 1.5\n",
            "failed to decode: json: invalid type: floating point",
        ),
        (
            "maxPods: 4294967296\n",
            "failed to decode: json: invalid value",
        ),
        ("syncFrequency: 1m\nfoo: 1\n", ""),
        (
            "syncFrequency: 10\n",
            "failed to decode: json: invalid type: integer",
        ),
        (
            "syncFrequency: 5d\n",
            "json: time: unknown unit \"d\" in duration \"5d\"",
        ),
        (
            "featureGates:\n  X: maybe\n",
            "failed to decode: json: invalid type: string",
        ),
        (
            "evictionHard: [a]\n",
            "failed to decode: json: invalid type: sequence",
        ),
    ] {
        let r = with(body);
        if want.is_empty() {
            assert!(r.is_ok(), "{body}");
            continue;
        }
        let e = r.unwrap_err();
        assert!(
            e.starts_with("failed to decode: ") && e.contains(want),
            "{body}: {e}"
        );
    }
    assert!(decode("kind: KubeletConfiguration\n")
        .unwrap_err()
        .contains("Object 'apiVersion' is missing"));
    assert!(decode("apiVersion: kubelet.config.k8s.io/v1beta1\n")
        .unwrap_err()
        .contains("Object 'Kind' is missing"));
    assert!(decode("apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n")
        .unwrap_err()
        .contains("no kind \"KubeletConfiguration\" is registered for version \"kubelet.config.k8s.io/v1\""));
    assert!(
        decode("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n")
            .is_err()
    );
    assert!(decode("- a\n")
        .unwrap_err()
        .starts_with("failed to decode: couldn't get version/kind"));
    assert!(decode("a: [\n")
        .unwrap_err()
        .starts_with("failed to decode: error converting YAML to JSON"));
}

#[test]
fn empty_and_missing_files_as_kubelet_says() {
    let dir = std::env::temp_dir().join(format!("standin-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.yaml");
    std::fs::write(&empty, "").unwrap();
    let p = empty.to_str().unwrap();
    assert_eq!(
        load(p).unwrap_err(),
        format!("failed to load kubelet config file, path: {p}, error: failed to load Kubelet config file {p}, error kubelet config file \"{p}\" was empty")
    );
    assert!(load("/nonexistent/c.yaml")
        .unwrap_err()
        .ends_with("open /nonexistent/c.yaml: no such file or directory"));
}

/// Each validation rule refuses a bad value with kubelet's words.
#[test]
fn validation_rules_refuse_bad_values() {
    for (body, want) in [
        ("maxPods: -1\n", "invalid configuration: maxPods (--max-pods) -1 must not be a negative number"),
        ("healthzPort: 70000\n", "invalid configuration: healthzPort (--healthz-port) 70000 must be between 1 and 65535, inclusive"),
        ("port: 65536\n", "invalid configuration: port (--port) 65536 must be between 1 and 65535, inclusive"),
        ("readOnlyPort: -5\n", "invalid configuration: readOnlyPort (--read-only-port) -5 must be between 0 and 65535, inclusive"),
        ("imageGCHighThresholdPercent: 101\n", "imageGCHighThresholdPercent (--image-gc-high-threshold) 101 must be between 0 and 100, inclusive"),
        ("imageGCLowThresholdPercent: 90\n", "imageGCLowThresholdPercent (--image-gc-low-threshold) 90 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 85"),
        ("imageMinimumGCAge: -1m\n", "imageMinimumGCAge -1m0s must not be negative"),
        ("oomScoreAdj: -1001\n", "oomScoreAdj (--oom-score-adj) -1001 must be between -1000 and 1000, inclusive"),
        ("eventRecordQPS: -1\n", "eventRecordQPS (--event-qps) -1 must not be a negative number"),
        ("kubeAPIQPS: -1\n", "kubeAPIQPS (--kube-api-qps) -1 must not be a negative number"),
        ("registryBurst: -1\n", "registryBurst (--registry-burst) -1 must not be a negative number"),
        ("podsPerCore: -1\n", "podsPerCore (--pods-per-core) -1 must not be a negative number"),
        ("nodeStatusMaxImages: -2\n", "nodeStatusMaxImages (--node-status-max-images) -2 must be -1 or greater"),
        ("nodeLeaseDurationSeconds: -1\n", "nodeLeaseDurationSeconds must be greater than 0"),
        ("maxParallelImagePulls: 3\n", "maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls"),
        ("runOnce: true\n", "Runonce mode has been deprecated"),
        ("systemCgroups: /system\n", "systemCgroups (--system-cgroups) was specified and cgroupRoot (--cgroup-root) was not specified"),
        ("topologyManagerPolicy: fastest\n", "topologyManagerPolicy (--topology-manager-policy) \"fastest\" must be one of"),
        ("topologyManagerScope: node\n", "topologyManagerScope (--topology-manager-scope) \"node\" must be one of"),
        ("hairpinMode: always\n", "option \"always\" specified for hairpinMode (--hairpin-mode)"),
        ("memorySwap:\n  swapBehavior: UnlimitedSwap\n", "memorySwap.swapBehavior \"UnlimitedSwap\" must be one of"),
        ("enforceNodeAllocatable: [pods, kube-reserved]\n", "kubeReservedCgroup (--kube-reserved-cgroup) must be specified"),
        ("enforceNodeAllocatable: [none, pods]\n", "may not contain additional enforcements when \"none\" is specified"),
        ("enforceNodeAllocatable: [everything]\n", "option \"everything\" specified for enforceNodeAllocatable"),
        ("cgroupsPerQOS: false\n", "cgroupsPerQOS (--cgroups-per-qos) must be set to true when \"pods\""),
        ("shutdownGracePeriod: 500ms\n", "shutdownGracePeriod {500ms} must be either zero or otherwise >= 1 sec"),
        ("shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n", "shutdownGracePeriodCriticalPods {20s} must be <= shutdownGracePeriod {10s}"),
        ("memoryThrottlingFactor: 1.5\n", "memoryThrottlingFactor 1.5 must be greater than 0 and less than or equal to 1.0"),
        ("memoryReservationPolicy: All\n", "option \"All\" specified for memoryReservationPolicy"),
        ("containerRuntimeEndpoint: \"\"\n", ""),
        ("containerLogMaxFiles: 1\n", "containerLogMaxFiles must be greater than 1"),
        ("containerLogMaxWorkers: 0\n", "containerLogMaxWorkers must be greater than or equal to 1"),
        ("containerLogMonitorInterval: 1s\n", "containerLogMonitorInterval must be a positive time duration greater than or equal to 3s"),
        ("podLogsDir: var/log/pods\n", "pod logs path \"var/log/pods\" must be absolute path"),
        ("registerWithTaints:\n- key: a\n  effect: Sometimes\n", "invalid taint: a:Sometimes"),
    ] {
        let errs = validate(&with(body).unwrap().config);
        if want.is_empty() {
            continue;
        }
        assert!(errs.iter().any(|e| e.contains(want)), "{body}: {errs:?}");
    }
    assert_eq!(aggregate(&["a".into()]), "a");
    assert_eq!(aggregate(&["a".into(), "b".into()]), "[a, b]");
}

#[test]
fn run_checks_refuse_bad_reservations_and_thresholds() {
    for (body, want) in [
        (
            "kubeReserved:\n  gpu: \"1\"\n",
            "cannot reserve \"gpu\" resource",
        ),
        (
            "kubeReserved:\n  memory: lots\n",
            "failed to parse quantity \"lots\" for \"memory\" resource: quantities must match",
        ),
        (
            "systemReserved:\n  cpu: \"-1\"\n",
            "resource quantity for \"cpu\" cannot be negative: -1",
        ),
        (
            "evictionHard:\n  disk.available: 1Gi\n",
            "unsupported eviction signal disk.available",
        ),
        (
            "evictionHard:\n  nodefs.available: 110%\n",
            "eviction percentage threshold nodefs.available must be <= 100%: 110%",
        ),
        (
            "evictionHard:\n  memory.available: \"-1Mi\"\n",
            "eviction threshold memory.available must be positive: -1Mi",
        ),
        (
            "evictionHard:\n  memory.available: much\n",
            "quantities must match",
        ),
    ] {
        let e = run_checks(&with(body).unwrap().config).unwrap_err();
        assert!(e.contains(want), "{body}: {e}");
    }
    let ok = with("kubeReserved:\n  cpu: 100m\n  memory: 300Mi\nevictionHard:\n  memory.available: 100Mi\n  nodefs.available: 10%\n").unwrap();
    assert_eq!(run_checks(&ok.config), Ok(()));
}
