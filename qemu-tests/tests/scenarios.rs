//! The kiln boot scenarios: what kiln baked, booted under QEMU with real systemd, real
//! containerd and the real kiln-firstboot, asserted on from the serial console.
//! docs/boot-tests.md says what each proves.

#[path = "../../testkit/deadline.rs"]
mod deadline;

use std::time::Duration;

use kiln_qemu_tests::expect_ok;
use kiln_qemu_tests::image_node::Vendor;
use kiln_qemu_tests::metadata::{AwsInstance, IMDS_TOKEN};
use kiln_qemu_tests::node::{
    boot_rootfs_node, boot_rootfs_node_edited, test_instance, timeline, Booted, Metadata, NodeBoot,
};
use kiln_qemu_tests::scenario::NodeConfig;

fn spec(name: &str, kubelet_mode: &str, metadata: Metadata, deadline: u32) -> NodeBoot {
    NodeBoot {
        name: name.into(),
        kubelet_mode: kubelet_mode.into(),
        node: NodeConfig {
            provider: "auto".into(),
            deadline,
            join_mode: "kubelet".into(),
            extra: String::new(),
        },
        metadata,
        timeout: Duration::from_secs(420),
        pod: false,
    }
}

/// [`spec`] for a scenario that asserts the real pod ran ([`assert_pod_ran`]).
fn spec_with_pod(name: &str, kubelet_mode: &str, metadata: Metadata, deadline: u32) -> NodeBoot {
    NodeBoot {
        pod: true,
        ..spec(name, kubelet_mode, metadata, deadline)
    }
}

/// The real pod (docs/boot-tests.md, "A real pod"): a sandbox from the definition's sandbox
/// image and a container ran with an address of the scenario's CNI network, and were removed.
fn assert_pod_ran(o: &kiln_qemu_tests::scenario::Outcome, image: &str) {
    let sandbox = expect_ok(kiln_qemu_tests::pod::sandbox_image(image));
    let driver = expect_ok(kiln_qemu_tests::pod::cgroup_driver(image));
    if let Err(e) = kiln_qemu_tests::pod::check_ran(o, &sandbox, &driver) {
        panic!("{e}\nstatus: {}", o.status);
    }
}

/// kiln-firstboot counted the node as joined on kubelet's own evidence that its Node exists:
/// the wait-joined phase's console line ends `node=NAME`, the name in kubelet's
/// `"Successfully registered node"` journal line (docs/contract.md, "Joined"), which is the
/// name kiln gave kubelet where it gave one (`--hostname-override`, lower-cased by kubelet).
fn assert_registered(o: &kiln_qemu_tests::scenario::Outcome) {
    let line = o
        .phase_lines
        .iter()
        .find(|l| l.text.contains("phase=wait-joined result=success"))
        .unwrap_or_else(|| panic!("no successful wait-joined phase: {:?}", o.phase_lines));
    let node = line
        .text
        .rsplit_once(" node=")
        .map_or("", |(_, n)| n.trim());
    assert!(
        !node.is_empty(),
        "wait-joined names no registered node: {}",
        line.text
    );
    let args = o.kubelet_args();
    if let Some(given) = args
        .iter()
        .find_map(|a| a.strip_prefix("--hostname-override="))
    {
        assert_eq!(node, given.to_lowercase(), "{}", line.text);
    }
}

/// `kiln-firstboot doctor` ran on the joined node and its table reached the console: the
/// node's own checks pass (the real containerd answered CRI Status, the stand-in kubelet holds
/// a certificate signed by the node config's CA), and the API server, which the boot world
/// does not have, is reported unreachable by name.
fn assert_doctor(o: &kiln_qemu_tests::scenario::Outcome) {
    eprintln!("doctor on the node: {:#?}", o.doctor);
    for name in [
        "swap",
        "cgroup-v2",
        "cgroup-driver",
        "br-netfilter",
        "ip-forward",
        "cri",
        "bootstrap-credential",
        "kubelet-client-cert",
    ] {
        let (verdict, detail) = o
            .doctor
            .get(name)
            .unwrap_or_else(|| panic!("no {name} row in {:?}", o.doctor));
        assert_eq!(verdict, "ok", "{name}: {detail}");
    }
    // node.toml leaves serverTLSBootstrap to the kubelet configuration: nothing to check.
    let (verdict, detail) = &o.doctor["kubelet-serving-cert"];
    assert_eq!(verdict, "skip", "{detail}");
    let (verdict, detail) = &o.doctor["api-server"];
    assert_eq!(verdict, "fail", "{detail}");
    let api = format!("https://{}: ", kiln_qemu_tests::scenario::API_SERVER);
    assert!(detail.starts_with(&api), "{detail}");
    assert_eq!(o.doctor_exit, Some(9), "{:?}", o.doctor);
}

/// What an AWS node that joined shows, on amd64 and arm64 alike: kubelet's environment from
/// IMDSv2 and the baked max-pods table (3 x (10-1) + 2 for an m5/m6g.large), the EKS
/// reservation on the guest's one vCPU (vm.rs: -smp 1; 6 % of a core, 11 x 29 + 255 MiB), the
/// kubelet systemd started really got them (plus `extra_args`), both units active, the
/// success sentinel and no failure file, and IMDSv2: the token PUT first and every IMDS API read
/// (`GET /latest/…`) carrying the token.
fn assert_aws_node(b: &Booted, i: &AwsInstance, extra_args: &[&str]) {
    let o = &b.outcome;
    assert_eq!(
        o.kubelet_env("NODE_IP").as_deref(),
        Some(i.local_ipv4.as_str())
    );
    let provider_id = format!("aws:///{}/{}", i.zone, i.instance_id);
    assert_eq!(
        o.kubelet_env("PROVIDER_ID").as_deref(),
        Some(provider_id.as_str())
    );
    assert_eq!(o.kubelet_env("MAX_PODS").as_deref(), Some("29"));
    let eks = format!(
        "cpu={}m,memory=574Mi,ephemeral-storage=1Gi",
        tiered_cpu_millicores(kiln_qemu_tests::vm::guest_cpus())
    );
    assert_eq!(
        o.kubelet_env("KUBE_RESERVED").as_deref(),
        Some(eks.as_str())
    );
    let args = o.kubelet_args();
    let mut want = vec![
        format!("--node-ip={}", i.local_ipv4),
        "--config-dir=/run/kiln/kubelet.conf.d".to_string(),
    ];
    want.extend(extra_args.iter().map(|a| a.to_string()));
    for want in want {
        assert!(
            args.iter().any(|a| a == &want),
            "kubelet args lack {want}: {args:?}"
        );
    }
    // The config-file facts reach kubelet through kiln's drop-in, merged as kubelet merges
    // it, and no flag kiln passes is one kubelet calls deprecated.
    let kc = o.kubelet_config();
    assert_eq!(kc["providerID"], provider_id.as_str(), "{kc}");
    assert_eq!(kc["maxPods"], 29, "{kc}");
    let reserved: Vec<String> = kc["kubeReserved"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    let mut want_reserved: Vec<&str> = eks.split(',').collect();
    want_reserved.sort_unstable();
    assert_eq!(reserved, want_reserved, "{kc}");
    assert_eq!(kc["evictionHard"]["memory.available"], "100Mi", "{kc}");
    assert_eq!(
        kc["containerRuntimeEndpoint"], "unix:///run/containerd/containerd.sock",
        "{kc}"
    );
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--max-pods") || a.starts_with("--provider-id")),
        "{args:?}"
    );
    assert_eq!(o.kubelet_flag_warnings(), Vec::<String>::new(), "{args:?}");
    for unit in ["containerd", "kubelet"] {
        assert_eq!(
            o.units.get(unit).map(String::as_str),
            Some("active"),
            "{:?}",
            o.units
        );
    }
    assert!(
        o.files
            .contains_key("/run/cluster-api/bootstrap-success.complete"),
        "{:?}",
        o.files.keys()
    );
    assert!(!o
        .files
        .contains_key("/run/cluster-api/bootstrap-failure.reason"));
    let first = b
        .requests
        .first()
        .expect("the guest asked the metadata service");
    assert_eq!(
        (first.method.as_str(), first.path.as_str()),
        ("PUT", "/latest/api/token")
    );
    // Every IMDS API read carries the token. Doctor's clock check (run when PROVIDER names
    // the cloud, as on the arm64 node) reads only the `Date` of a plain `GET /`, which IMDSv2
    // answers too (401 with a Date), so it is not an API read.
    let api: Vec<_> = b
        .requests
        .iter()
        .filter(|r| r.method == "GET" && r.path.starts_with("/latest/"))
        .collect();
    assert!(!api.is_empty(), "no IMDS reads: {:?}", b.requests);
    for r in api {
        assert_eq!(
            r.header("x-aws-ec2-metadata-token"),
            Some(IMDS_TOKEN),
            "{r:?}"
        );
    }
}

/// The EKS/GKE CPU reservation for a guest of `cpus` vCPUs, worked out by hand from the
/// published tiers (6 % of the first core, 1 % of the second, 0.5 % each of the third and
/// fourth): the guests here have one (`make test`) or two (`bench/boot.sh`).
fn tiered_cpu_millicores(cpus: u32) -> u32 {
    match cpus {
        1 => 60,
        2 => 70,
        3 => 75,
        4 => 80,
        n => panic!("KILN_QEMU_CPUS={n}: no expected CPU reservation written down for it"),
    }
}

#[test]
fn ubuntu_aws() {
    let b = expect_ok(boot_rootfs_node(&spec_with_pod(
        "ubuntu_aws",
        "success",
        Metadata::Aws,
        240,
    )));
    eprintln!(
        "ubuntu-aws timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    eprintln!("{}", kiln_qemu_tests::node::bench_line("ubuntu-aws", &b));
    let o = &b.outcome;
    let i = test_instance();
    assert_eq!(o.result(), "success", "status: {}", o.status);
    assert_registered(o);
    assert_pod_ran(o, "ubuntu");
    assert_eq!(o.status["provider"], "aws", "auto detection from DMI");
    // kubelet's start was queued over systemd's private socket, not by a systemctl process.
    assert!(
        o.phase_lines
            .iter()
            .any(|l| l.text.contains("phase=start-kubelet result=success")
                && l.text.ends_with(" via=bus")),
        "{:?}",
        o.phase_lines
    );
    assert_doctor(o);
    assert_aws_node(&b, &i, &[]);
}

#[test]
fn metadata_down() {
    let deadline = 30;
    let b = expect_ok(boot_rootfs_node(&spec(
        "metadata_down",
        "success",
        Metadata::Nowhere,
        deadline,
    )));
    eprintln!(
        "metadata-down timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    eprintln!("{}", kiln_qemu_tests::node::bench_line("metadata-down", &b));
    let o = &b.outcome;
    assert_eq!(o.result(), "failure", "status: {}", o.status);
    assert_eq!(o.reason(), "METADATA_UNREACHABLE", "status: {}", o.status);
    let (start, end, result) = o.phase("metadata").expect("a metadata phase");
    assert_eq!(result, "failure");
    let config_start = o.phase("config").map(|p| p.0).unwrap_or(start);
    // The deadline ended it (unbounded retries would not end); the guest's speed under
    // TCG on a loaded machine is not the claim, so the slack is testkit's SLACK.
    assert!(
        end - config_start <= u64::from(deadline) * 1000 + deadline::SLACK.as_millis() as u64,
        "gave up after {} ms, deadline {deadline} s",
        end - config_start
    );
    assert!(!o
        .files
        .contains_key("/run/cluster-api/bootstrap-success.complete"));
    let failure = &o.files["/run/cluster-api/bootstrap-failure.reason"];
    assert_eq!(
        failure.first().map(String::as_str),
        Some("METADATA_UNREACHABLE")
    );
    assert!(o.kubelet_args().is_empty(), "kubelet must not have started");
}

/// A wrong CA: kubelet (here the stand-in, as kubelet 1.36 does) stays up with `/healthz` ok
/// and retries its bootstrap request, logging the x509 error each time. kiln-firstboot must
/// name it from kubelet's log within 25 s of the retries (plus slack), while kubelet still
/// runs, not at the run's deadline, which is set far past that bound here.
#[test]
fn kubelet_x509() {
    let deadline = 300;
    let b = expect_ok(boot_rootfs_node(&spec(
        "kubelet_x509",
        "x509",
        Metadata::Aws,
        deadline,
    )));
    eprintln!(
        "kubelet-x509 timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    eprintln!("{}", kiln_qemu_tests::node::bench_line("kubelet-x509", &b));
    let o = &b.outcome;
    assert_eq!(o.result(), "failure", "status: {}", o.status);
    assert_eq!(o.reason(), "API_X509", "status: {}", o.status);
    let hint = o.status["hint"].as_str().unwrap_or("");
    assert!(hint.contains("ca.crt"), "hint: {hint}");
    // The diagnosis is on the console for an operator: the phase line names the reason.
    assert!(
        o.phase_lines
            .iter()
            .any(|l| l.text.contains("reason=API_X509")),
        "{:?}",
        o.phase_lines
    );
    // kubelet was healthy and still running: its log, not its exit, told.
    let (_, _, healthy) = o.phase("wait-healthy").expect("a wait-healthy phase");
    assert_eq!(healthy, "success", "status: {}", o.status);
    let (_, failed_at, joined) = o.phase("wait-joined").expect("a wait-joined phase");
    assert_eq!(joined, "failure", "status: {}", o.status);
    let message = o.status["message"].as_str().unwrap_or("");
    assert!(
        message.contains("kubelet is running") && message.contains("x509"),
        "{message}"
    );
    assert_eq!(
        o.units.get("kubelet").map(String::as_str),
        Some("active"),
        "{:?}",
        o.units
    );
    // Within kiln-firstboot's 25 s of retries after kubelet started (plus testkit's slack),
    // far from the deadline.
    let started = o.kubelet_started_ms().expect("kubelet's start time");
    let took = Duration::from_millis(failed_at.saturating_sub(started));
    eprintln!("API_X509 reported {took:?} after kubelet started");
    deadline::bounded(took, 25);
    assert!(
        took < Duration::from_secs(deadline.into()),
        "ended at the deadline: {took:?}"
    );
    assert!(!o
        .files
        .contains_key("/run/cluster-api/bootstrap-success.complete"));
    assert_eq!(
        o.units.get("containerd").map(String::as_str),
        Some("active")
    );
}

/// The API server refuses kubelet's Node (an admission policy; the stand-in's
/// `register-forbidden` mode): kubelet holds its certificate and keeps retrying the create,
/// so the node is not joined, and kiln-firstboot names the refusal from kubelet's log.
#[test]
fn node_registration_refused() {
    let b = expect_ok(boot_rootfs_node(&spec(
        "node_registration_refused",
        "register-forbidden",
        Metadata::Aws,
        300,
    )));
    eprintln!(
        "node-registration-refused timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    let o = &b.outcome;
    assert_eq!(o.result(), "failure", "status: {}", o.status);
    assert_eq!(
        o.reason(),
        "NODE_REGISTRATION_REFUSED",
        "status: {}",
        o.status
    );
    let message = o.status["message"].as_str().unwrap_or("");
    assert!(message.contains("is forbidden"), "{message}");
    assert!(!o
        .files
        .contains_key("/run/cluster-api/bootstrap-success.complete"));
    assert_eq!(
        o.files["/run/cluster-api/bootstrap-failure.reason"]
            .first()
            .map(String::as_str),
        Some("NODE_REGISTRATION_REFUSED")
    );
    assert_eq!(o.units.get("kubelet").map(String::as_str), Some("active"));
}

#[test]
fn flatcar_sysext() {
    let mut s = spec_with_pod("flatcar_sysext", "success", Metadata::ConfigDrive, 240);
    s.node.provider = "auto".into();
    let (b, mirror) = expect_ok(kiln_qemu_tests::node::boot_sysext_node(&s));
    eprintln!(
        "flatcar-sysext timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    eprintln!(
        "{}",
        kiln_qemu_tests::node::bench_line("flatcar-sysext", &b)
    );
    let o = &b.outcome;
    assert_eq!(o.result(), "success", "status: {}", o.status);
    assert_registered(o);
    assert_pod_ran(o, "flatcar");
    // Found by its label, mounted by kiln-firstboot (ISO 9660), read, and unmounted.
    assert_eq!(
        o.status["provider"], "configdrive",
        "auto detection: a volume labelled config-2: {}",
        o.status
    );
    assert_eq!(
        o.kubelet_env("INSTANCE_ID"),
        Some(test_instance().instance_id)
    );
    assert_eq!(o.kubelet_env("ZONE"), Some(test_instance().zone));
    // systemd-sysext really merged the extension at boot: the one Ignition fetched into
    // /opt/extensions/ (from `kiln render --sysext`), through the /etc/extensions/ link.
    assert!(
        b.lines
            .iter()
            .any(|l| l.text.contains("Merge System Extension Images")
                || l.text.contains("systemd-sysext")),
        "no systemd-sysext on the console"
    );
    let dir = "/opt/extensions/kubernetes";
    let steps = kiln_qemu_tests::after_join::steps(&b.lines);
    let step = |name: &str, key: &str| {
        steps
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.get(key))
            .unwrap_or_else(|| panic!("no {name} step with {key}=: {steps:?}"))
            .to_string()
    };
    assert_eq!(
        step("sysupdate-before", "link"),
        format!("{dir}/{}", mirror.current)
    );
    assert!(
        o.facts
            .get("sysext-status")
            .is_some_and(|s| s.contains("/usr") && s.contains("kubernetes")),
        "{:?}",
        o.facts
    );
    // The extension is a signed disk image: the boot merged it under the signed-only policy
    // kiln render installed, and systemd-sysext, alone in a private mount namespace, merges
    // the good copy and refuses each tampered one (qemu-tests/src/signed_sysext.rs).
    assert_eq!(
        step("ddi-policy", "exec"),
        "image-policy=root=signed+absent:usr=signed+absent"
    );
    for case in kiln_qemu_tests::signed_sysext::CASES {
        let log = kiln_qemu_tests::after_join::step_files(&b.lines, &format!("ddi-{case}-log"));
        let want = if *case == "good" { "merged" } else { "refused" };
        assert_eq!(
            step(&format!("ddi-{case}"), "result"),
            want,
            "{case}: {log:?}"
        );
    }
    let good = kiln_qemu_tests::after_join::step_files(&b.lines, "ddi-good-sig");
    assert!(
        format!("{good:?}").contains("validation succeeded"),
        "systemd says which signature check accepted the good copy: {good:?}"
    );
    for case in ["sig-flipped", "other-key"] {
        let sig = kiln_qemu_tests::after_join::step_files(&b.lines, &format!("ddi-{case}-sig"));
        assert!(
            format!("{sig:?}").contains("PKCS#7 validation failed"),
            "{case} is refused by the signature check: {sig:?}"
        );
    }
    let unsigned = kiln_qemu_tests::after_join::step_files(&b.lines, "ddi-unsigned-log");
    assert!(
        format!("{unsigned:?}").contains("policy"),
        "the unsigned image is refused by the policy: {unsigned:?}"
    );
    // Then the node's systemd-sysupdate, with the transfer file and drop-in Ignition placed,
    // took the next patch release from the mirror, never the next minor, moved the link
    // and asked for a reboot.
    let journal = kiln_qemu_tests::after_join::step_files(&b.lines, "sysupdate-journal");
    assert_eq!(step("sysupdate", "result"), "ran", "{journal:?}");
    assert_eq!(
        step("sysupdate-after", "link"),
        format!("{dir}/{}", mirror.next_patch)
    );
    let installed = step("sysupdate-installed", "files");
    assert!(installed.contains(&mirror.current), "{installed}");
    assert!(installed.contains(&mirror.next_patch), "{installed}");
    assert!(!installed.contains(&mirror.next_minor), "{installed}");
    assert_eq!(step("reboot-required", "present"), "yes");
    assert!(
        o.facts
            .get("sysext-link")
            .is_some_and(|l| l.ends_with(&mirror.next_patch)),
        "{:?}",
        o.facts
    );
    assert_eq!(o.kubelet_env("NODE_IP").as_deref(), Some("10.0.4.9"));
    // A config drive names no provider ID: the cloud controller sets its own.
    assert_eq!(o.kubelet_env("PROVIDER_ID").as_deref(), Some(""));
    // The flavor from the drive's EC2 document, through max-pods.map.
    assert_eq!(o.kubelet_env("MAX_PODS").as_deref(), Some("29"));
    let args = o.kubelet_args();
    assert!(args.iter().any(|a| a == "--node-ip=10.0.4.9"), "{args:?}");
    let kc = o.kubelet_config();
    assert!(kc.get("providerID").is_none(), "{kc}");
    assert_eq!(kc["maxPods"], 29, "{kc}");
    // images/flatcar.toml: the GKE formula on the guest's vCPUs and 1 GiB of RAM (MemTotal
    // under 1 GiB: 255 MiB).
    let cpu = format!(
        "{}m",
        tiered_cpu_millicores(kiln_qemu_tests::vm::guest_cpus())
    );
    assert_eq!(kc["kubeReserved"]["cpu"], cpu.as_str(), "{kc}");
    assert_eq!(kc["kubeReserved"]["memory"], "255Mi", "{kc}");
    assert_eq!(o.kubelet_flag_warnings(), Vec::<String>::new());
    assert_eq!(
        o.units.get("containerd").map(String::as_str),
        Some("active"),
        "{:?}",
        o.units
    );
    assert!(o
        .files
        .contains_key("/run/cluster-api/bootstrap-success.complete"));
}

#[test]
fn cloud_init() {
    // A provisioning-time kubelet drop-in (node.toml's [kubelet.config]), carried by
    // cloud-init's write_files like every contract file.
    // An instance of an Auto Scaling warm pool (Warmed:Running for 15 s after the node first
    // asks, then InService): prepared, held, then joined in the same boot.
    let warm = AwsInstance {
        warmed_for: Some(Duration::from_secs(15)),
        ..test_instance()
    };
    let mut s = spec_with_pod("cloud_init", "success", Metadata::AwsAs(warm), 240);
    // And kernel parameters, other than the guest kernel's defaults (4096 and 65530).
    s.node.extra =
        "\n[kubelet.config]\nimageGCHighThresholdPercent = 90\nimageGCLowThresholdPercent = 75\n\
                    \n[sysctl]\n\"net.core.somaxconn\" = 8192\n\"vm.max_map_count\" = 262144\n\
                    \n[swap]\nfile_size = \"64Mi\"\n\
                    \n[containerd.config]\nversion = 3\n\
                    [containerd.config.plugins.'io.containerd.internal.v1.opt']\n\
                    path = '/opt/kiln-test/containerd-opt'\n"
            .into();
    // And a registry mirror with its own CA ([[containerd.registry]]): the pod's image is not
    // imported but pulled by the node's containerd through the hosts.toml and CA cloud-init
    // wrote, from a TLS registry on loopback that only that CA verifies.
    let (b, user_data) = expect_ok(kiln_qemu_tests::node::boot_cloudinit_node_pulling(&s));
    eprintln!(
        "cloud-init timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    eprintln!("{}", kiln_qemu_tests::node::bench_line("cloud-init", &b));
    assert!(user_data.starts_with("#cloud-config"), "{user_data}");
    let o = &b.outcome;
    assert_eq!(o.result(), "success", "status: {}", o.status);
    assert_registered(o);
    // The pod ran with the image the node pulled through the mirror.
    assert_pod_ran(o, "ubuntu");
    let pod = kiln_qemu_tests::pod::report(o);
    let pull = kiln_qemu_tests::pod::PULL_IMAGE;
    assert!(
        pod.get("pulled")
            .is_some_and(|p| p.starts_with(&format!("{pull} sha256:"))),
        "{pod:?}"
    );
    assert!(
        user_data.contains("path: /etc/kiln/containerd/certs.d/pull-test.kiln.invalid/hosts.toml"),
        "cloud-init carried the registry's hosts.toml"
    );
    // cloud-init itself ran on this boot (its own console banner) and wrote /etc/kiln/.
    assert!(
        b.lines
            .iter()
            .any(|l| l.text.contains("Cloud-init v.") && l.text.contains("running 'init")),
        "no cloud-init run on the console"
    );
    assert_eq!(o.kubelet_env("MAX_PODS").as_deref(), Some("29"));
    assert!(o
        .files
        .contains_key("/run/cluster-api/bootstrap-success.complete"));
    // kubelet ran with the baked config, kiln's node drop-in and the provisioned one merged
    // in that order (the stand-in merges --config-dir with kubelet's rules).
    let kc = o.kubelet_config();
    assert_eq!(kc["imageGCHighThresholdPercent"], 90, "{kc}");
    assert_eq!(kc["imageGCLowThresholdPercent"], 75, "{kc}");
    assert_eq!(kc["maxPods"], 29, "the node's own drop-in: {kc}");
    assert_eq!(kc["cgroupDriver"], "systemd", "the baked config: {kc}");
    assert_eq!(kc["authentication"]["webhook"]["enabled"], true, "{kc}");
    assert_eq!(o.kubelet_flag_warnings(), Vec::<String>::new());
    // The [sysctl] values, read back from the guest's /proc/sys after the join, and each
    // reported applied in status.json.
    for (path, want) in [
        ("net/core/somaxconn", "8192"),
        ("vm/max_map_count", "262144"),
    ] {
        assert_eq!(
            o.facts.get(&format!("sysctl:{path}")).map(String::as_str),
            Some(want),
            "{:?}",
            o.facts
        );
    }
    // The warm pool: kubelet was held while the instance was Warmed:Running, and started
    // once it was InService. The stand-in's 15 s start at the node's first question, in the
    // metadata phase; the hold starts after the write phase and the image import (seconds
    // under TCG), so what is certain is at least one 5 s poll held.
    let warnings: Vec<&str> = o.status["warnings"]
        .as_array()
        .map(|w| w.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    assert!(
        warnings.contains(&"warm pool: target lifecycle state Warmed:Running: node prepared, kubelet held until the instance is in service"),
        "{warnings:?}"
    );
    let waited: u64 = warnings
        .iter()
        .find_map(|w| w.strip_prefix("warm pool: target lifecycle state InService after "))
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no join after the pool in {warnings:?}"));
    assert!(waited >= 5, "held {waited} s: {warnings:?}");
    // [containerd.config]: containerd ran with the node's fragment (its `opt` plugin made the
    // directory the fragment names, with `bin` and `lib` in it), and the running containerd
    // is the one kiln-firstboot restarted for it (the fingerprint in its environment).
    assert_eq!(
        o.facts.get("containerd-opt").map(|s| s.trim()),
        Some("bin lib"),
        "{:?}",
        o.facts
    );
    assert_eq!(
        o.facts.get("containerd-environ-config").map(String::as_str),
        Some("1"),
        "{:?}",
        o.facts
    );
    // [swap]: the swap file kiln-firstboot made is on (in /proc/swaps, 64 MiB in KiB), and
    // kubelet runs with LimitedSwap and failSwapOn off from the provisioned drop-in.
    assert_eq!(
        o.facts.get("swaps").map(|s| s.trim()),
        Some("/var/lib/kiln/swapfile:65532"),
        "{:?}",
        o.facts
    );
    assert_eq!(kc["failSwapOn"], false, "{kc}");
    assert_eq!(kc["memorySwap"]["swapBehavior"], "LimitedSwap", "{kc}");
    let sysctl = o.status["sysctl"].as_array().cloned().unwrap_or_default();
    assert_eq!(sysctl.len(), 2, "{}", o.status);
    assert!(sysctl.iter().all(|e| e["result"] == "ok"), "{}", o.status);
}

/// node.toml's `deadline` for `cgroup_driver_mismatch`: the first refused sandbox comes
/// about 40 s after kiln-firstboot starts on a loaded machine (the pod waits for the test
/// image's import), so 80 s leaves it room and ends the boot 40 s sooner than 120 s did.
const MISMATCH_DEADLINE: u32 = 80;

/// A node whose kubelet config says `cgroupfs` while kiln's containerd config says
/// `SystemdCgroup = true` (an image build or an operator changed one and not the other).
/// Nothing fails until the first pod: kubelet hands containerd a cgroupfs parent, and runc
/// refuses it. The real runc error must reach kiln-firstboot's diagnosis.
///
/// kiln-firstboot keeps waiting for the join while kubelet retries the pod, and diagnoses
/// when its deadline passes, so the boot lasts as long as the deadline: a test setting of
/// [`MISMATCH_DEADLINE`] s (docs/boot-tests.md, "Test settings").
#[test]
fn cgroup_driver_mismatch() {
    let b = expect_ok(boot_rootfs_node_edited(
        &spec_with_pod(
            "cgroup_driver_mismatch",
            "success",
            Metadata::Aws,
            MISMATCH_DEADLINE,
        ),
        |root| {
            let path = root.dir.join("usr/lib/kiln/kubelet-config.yaml");
            let text = std::fs::read_to_string(&path).expect("the baked kubelet config");
            assert!(text.contains("cgroupDriver: systemd\n"), "{text}");
            root.write(
                "usr/lib/kiln/kubelet-config.yaml",
                text.replace("cgroupDriver: systemd\n", "cgroupDriver: cgroupfs\n"),
                0o644,
            )
            .map(drop)
        },
    ));
    eprintln!(
        "cgroup-driver-mismatch timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    let o = &b.outcome;
    assert_eq!(o.result(), "failure", "status: {}", o.status);
    assert_eq!(o.reason(), "CGROUP_DRIVER_MISMATCH", "status: {}", o.status);
    // The pod really was tried, with kubelet's cgroupfs parent, and runc refused it.
    let log = o.status["log"].to_string();
    assert!(
        log.contains("expected cgroupsPath to be of format"),
        "runc's own error is not in the status log: {log}"
    );
    assert!(!o
        .files
        .contains_key("/run/cluster-api/bootstrap-success.complete"));
}

/// The node's kubelet config override (`/etc/kiln/kubelet-config.yaml`) is the baked config
/// with `extra` appended, as an operator's edit would make it.
fn with_kubelet_config(
    extra: &'static str,
) -> impl FnOnce(&kiln_qemu_tests::guest::Root) -> kiln_qemu_tests::Result<()> {
    move |root| {
        let baked = root.dir.join("usr/lib/kiln/kubelet-config.yaml");
        let text = std::fs::read_to_string(&baked).expect("the baked kubelet config");
        assert!(
            !text.contains(extra.split(':').next().unwrap_or("")),
            "{text}"
        );
        root.write(
            "etc/kiln/kubelet-config.yaml",
            format!("{text}{extra}"),
            0o644,
        )
        .map(drop)
    }
}

/// A kubelet config with a value kubelet's validation refuses: the strict kubelet double exits
/// as kubelet does (`failed to validate kubelet configuration`), systemd restarts it, and
/// firstboot names the field with its own reason; the doctor's findings ride along.
#[test]
fn kubelet_config_invalid() {
    let b = expect_ok(boot_rootfs_node_edited(
        &spec("kubelet_config_invalid", "success", Metadata::Aws, 120),
        with_kubelet_config("imageGCHighThresholdPercent: 101\n"),
    ));
    eprintln!(
        "kubelet-config-invalid timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    let o = &b.outcome;
    assert_eq!(o.result(), "failure", "status: {}", o.status);
    assert_eq!(o.reason(), "KUBELET_CONFIG_INVALID", "status: {}", o.status);
    let message = o.status["message"].as_str().unwrap_or("");
    assert!(
        message.contains(
            "imageGCHighThresholdPercent (--image-gc-high-threshold) 101 must be between 0 and 100"
        ),
        "{message}"
    );
    // doctor ran after the failure: its problems are in the status.
    let doctor = &o.status["doctor"];
    assert!(
        doctor["checks"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["name"] == "api-server")),
        "no doctor findings in {}",
        o.status
    );
}

/// The operator's kubelet config of the unknown-field case (formerly its own boot,
/// `kubelet_config_unknown_field`, now asserted on `runtime::proxy_set`'s boot): a field
/// kubelet does not know.
const UNKNOWN_FIELD: &str = "maxPodz: 64\n";

/// A kubelet config with a field kubelet does not know ([`UNKNOWN_FIELD`]): kubelet logs its
/// strict decoding error, decodes leniently and runs; the node joins and status.json says
/// which field was ignored.
fn assert_unknown_field_warned(o: &kiln_qemu_tests::scenario::Outcome) {
    assert_eq!(o.result(), "success", "status: {}", o.status);
    assert_registered(o);
    let warnings = o.status["warnings"].to_string();
    assert!(
        warnings.contains("unknown field")
            && warnings.contains("maxPodz")
            && warnings.contains("/etc/kiln/kubelet-config.yaml"),
        "{warnings}"
    );
}

/// JOIN_MODE=kubeadm: kiln-firstboot runs `kubeadm join --config` (the kubeadm double, with a
/// file standing in for the cluster), kubeadm writes its kubelet files and restarts kubelet
/// through systemd, and the strict kubelet stand-in TLS-bootstraps into
/// /etc/kubernetes/kubelet.conf with kubeadm's drop-in command line.
#[test]
fn kubeadm_join() {
    let mut s = spec_with_pod("kubeadm_join", "success", Metadata::Aws, 300);
    s.node.join_mode = "kubeadm".into();
    let b = expect_ok(boot_rootfs_node_edited(
        &s,
        kiln_qemu_tests::kubeadm::install,
    ));
    eprintln!(
        "kubeadm-join timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    let o = &b.outcome;
    let i = test_instance();
    assert_eq!(o.result(), "success", "status: {}", o.status);
    assert_registered(o);
    assert_pod_ran(o, "ubuntu");
    // kubeadm's drop-in command line: its kubeconfig, bootstrap kubeconfig, config file and
    // flags env file, then kiln's node flags.
    let args = o.kubelet_args();
    for want in [
        "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf".to_string(),
        "--kubeconfig=/etc/kubernetes/kubelet.conf".to_string(),
        "--config=/var/lib/kubelet/config.yaml".to_string(),
        "--container-runtime-endpoint=unix:///run/containerd/containerd.sock".to_string(),
        format!("--node-ip={}", i.local_ipv4),
    ] {
        assert!(
            args.iter().any(|a| a == &want),
            "kubelet args lack {want}: {args:?}"
        );
    }
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--max-pods") || a.starts_with("--provider-id")),
        "config-file facts go through kubeadm's patch: {args:?}"
    );
    let flags = o
        .files
        .get("/var/lib/kubelet/kubeadm-flags.env")
        .expect("kubeadm-flags.env");
    assert!(
        flags
            .iter()
            .any(|l| l.starts_with("KUBELET_KUBEADM_ARGS=\"")),
        "{flags:?}"
    );
    // kiln-firstboot's patch reached the config kubeadm wrote, over the cluster's.
    let config = o
        .files
        .get("/var/lib/kubelet/config.yaml")
        .expect("config.yaml")
        .join("\n");
    let provider_id = format!("aws:///{}/{}", i.zone, i.instance_id);
    let cpu = format!(
        "cpu: {}m",
        tiered_cpu_millicores(kiln_qemu_tests::vm::guest_cpus())
    );
    for want in [
        "maxPods: 29",
        &format!("providerID: {provider_id}"),
        "cgroupDriver: systemd",
        &cpu,
    ] {
        assert!(config.contains(want), "config.yaml lacks {want}:\n{config}");
    }
    // kubelet's TLS bootstrap wrote the kubeconfig kubeadm waited for.
    let conf = o
        .files
        .get("/etc/kubernetes/kubelet.conf")
        .expect("kubelet.conf")
        .join("\n");
    assert!(conf.contains("kubelet-client-current.pem"), "{conf}");
    assert_eq!(
        o.units.get("kubelet").map(String::as_str),
        Some("active"),
        "{:?}",
        o.units
    );
    assert!(o
        .files
        .contains_key("/run/cluster-api/bootstrap-success.complete"));
}

// The arm64 node (issue 23), in its own file to keep this one short.
#[path = "scenarios/arm64.rs"]
mod arm64;

// After the join (issue 15): a kubelet crash loop and a proxy, in their own file to keep this
// one short.
#[path = "scenarios/runtime.rs"]
mod runtime;

/// The Packer-free pipeline (docs/image.md): a vendor-style bootable disk (GPT, ext4 root,
/// GRUB in the BIOS boot partition) through `kiln image --node` to qcow2, booted by QEMU's
/// firmware and the image's own GRUB, with no `-kernel`: the node joins from what `kiln
/// image` put on the disk alone (layer and node config).
#[test]
fn image_boot() {
    let (b, imaged) = expect_ok(kiln_qemu_tests::image_node::boot_image_node(
        &spec_with_pod("image_boot", "success", Metadata::Aws, 240),
        Vendor::Ubuntu,
    ));
    eprintln!("kiln image said:\n{}", imaged.report);
    eprintln!(
        "image-boot timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    let o = &b.outcome;
    assert!(
        b.lines.iter().any(|l| l.text.contains("GRUB loading")),
        "the node did not boot through the image's own GRUB (log {})",
        b.log.display()
    );
    assert!(
        imaged
            .report
            .contains("node config: wrote /etc/kiln/node.env"),
        "{}",
        imaged.report
    );
    let image_id = imaged
        .report
        .lines()
        .find_map(|l| {
            l.split_once("image id ")
                .map(|(_, id)| id.trim().to_string())
        })
        .expect("kiln image names the image id");
    assert_eq!(o.result(), "success", "status: {}", o.status);
    assert_registered(o);
    assert_eq!(
        o.status["image_id"],
        image_id.as_str(),
        "status: {}",
        o.status
    );
    assert_eq!(o.status["provider"], "aws", "auto detection from DMI");
    assert_pod_ran(o, "ubuntu");
    assert_aws_node(&b, &test_instance(), &[]);
}

/// The same pipeline from a Flatcar-style vendor disk (partition 9 `ROOT`, `ID=flatcar`,
/// systemd-sysext at boot): `kiln image` places the sysext in the ROOT partition's
/// `/etc/extensions/` and the node config in `/etc/kiln/`; UEFI firmware (OVMF) boots the
/// image's GRUB from its EFI system partition (the disk has no BIOS boot partition), the
/// real systemd-sysext merges the extension kiln placed, and the node joins from a NoCloud
/// volume.
#[test]
fn image_boot_flatcar() {
    let mut s = spec_with_pod("image_boot_flatcar", "success", Metadata::NoCloud, 240);
    s.node.provider = "auto".into();
    let (b, imaged) = expect_ok(kiln_qemu_tests::image_node::boot_image_node(
        &s,
        Vendor::Flatcar,
    ));
    eprintln!("kiln image said:\n{}", imaged.report);
    let o = &b.outcome;
    // UEFI only: the kernel names the firmware that started it (EDK II is OVMF), and the
    // disk has no BIOS boot partition, so GRUB's EFI image on the ESP is what booted.
    assert!(
        b.lines
            .iter()
            .any(|l| l.text.contains("efi: EFI v") && l.text.contains("EDK II")),
        "the node did not boot through UEFI (log {})",
        b.log.display()
    );
    assert!(
        !b.lines.iter().any(|l| l.text.contains("GRUB loading")),
        "a BIOS boot sector ran (log {})",
        b.log.display()
    );
    assert_eq!(o.result(), "success", "status: {}", o.status);
    assert_registered(o);
    // The NoCloud volume (FAT, CIDATA), found by label and mounted by kiln-firstboot: the
    // name from meta-data, the address from network-config.
    assert_eq!(o.status["provider"], "nocloud", "status: {}", o.status);
    assert_eq!(
        o.status["node_name"], "flatcar-node-1",
        "status: {}",
        o.status
    );
    assert_pod_ran(o, "flatcar");
    // Placed by kiln image as a file (no link), merged by the real systemd-sysext.
    assert_eq!(
        o.facts.get("sysext-link").map(String::as_str),
        Some(""),
        "{:?}",
        o.facts
    );
    assert!(
        o.facts
            .get("sysext-status")
            .is_some_and(|s| s.contains("/usr") && s.contains("kubernetes")),
        "{:?}",
        o.facts
    );
    assert!(
        imaged
            .report
            .contains(&format!("etc/extensions/{}", imaged.layer_name)),
        "{}",
        imaged.report
    );
    assert_eq!(o.kubelet_env("NODE_IP").as_deref(), Some("10.0.4.9"));
    assert_eq!(
        o.units.get("containerd").map(String::as_str),
        Some("active"),
        "{:?}",
        o.units
    );
}
