//! The real binary against each metadata source played from fixtures over loopback:
//! exact `kubelet.env`, the service-manager call, secrets kept 0600 and unprinted,
//! DMI detection, overrides and idempotent re-runs.

// These tests play systemctl, kubeadm and friends with /bin/sh stand-ins and check Unix
// modes; the Windows build is tested under Wine by tests/windows.rs (make test-windows).
#![cfg(unix)]

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use kiln_firstboot::standin::aws_imdsv2;

/// IMDSv2 as EC2 enforces it: a token from PUT (with a TTL header), then GETs that carry it.
pub fn imdsv2() -> Server {
    let base = fixtures().join("aws");
    let token = std::fs::read_to_string(base.join("latest/api/token")).unwrap();
    let hdrs = vec![
        ("Content-Type".to_string(), "text/plain".to_string()),
        ("Server".to_string(), "EC2ws".to_string()),
    ];
    Server::start(aws_imdsv2(token, move |r| fixture_reply(&base, &hdrs, r)))
}

pub fn start_ok(root: &Root, extra: &[&str], url: &str) -> Outcome {
    let systemctl = root.stub("systemctl", "exit 0");
    let mut args = vec![
        "--metadata-url",
        url,
        "--systemctl",
        &systemctl,
        "--deadline",
        "10",
    ];
    args.extend_from_slice(extra);
    let out = firstboot(root, &args);
    assert_eq!(out.code, 0, "{out:#?}");
    out
}

const AWS_ENV: &str = "KILN_CONTRACT=1
PROVIDER=aws
NODE_NAME=ip-10-0-3-7.eu-west-1.compute.internal
NODE_IP=10.0.3.7
INSTANCE_ID=i-0abc123def4567890
INSTANCE_TYPE=m5.large
ZONE=eu-west-1a
REGION=eu-west-1
PROVIDER_ID=aws:///eu-west-1a/i-0abc123def4567890
MAX_PODS=29
NODE_LABELS=
NODE_TAINTS=
KUBELET_EXTRA_ARGS=
KUBELET_ARGS=\"--config=/usr/lib/kiln/kubelet-config.yaml --config-dir=/run/kiln/kubelet.conf.d \
--kubeconfig=/var/lib/kubelet/kubeconfig --bootstrap-kubeconfig=/run/kiln/bootstrap-kubeconfig \
--hostname-override=ip-10-0-3-7.eu-west-1.compute.internal --node-ip=10.0.3.7\"
";

/// The node's KubeletConfiguration drop-in beside AWS_ENV: what kubelet takes from its
/// config rather than from (deprecated) flags.
const AWS_DROPIN: &str =
    "{\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"kind\":\"KubeletConfiguration\",\
\"containerRuntimeEndpoint\":\"unix:///run/containerd/containerd.sock\",\
\"providerID\":\"aws:///eu-west-1a/i-0abc123def4567890\",\"maxPods\":29}\n";

#[test]
fn aws_imdsv2_end_to_end() {
    let root = Root::node("Amazon EC2");
    let srv = imdsv2();
    let out = start_ok(&root, &[], &srv.url);
    assert_eq!(root.read("run/kiln/kubelet.env"), AWS_ENV);
    assert_eq!(
        root.read("run/kiln/kubelet.conf.d/10-kiln-node.conf"),
        AWS_DROPIN
    );
    // Nothing was provisioned: the directory holds the node's drop-in alone.
    assert!(!root
        .path("run/kiln/kubelet.conf.d/50-kiln-provisioned.conf")
        .exists());
    assert_eq!(
        root.calls("systemctl"),
        ["start --no-block kubelet.service"]
    );

    // The token was fetched once, by PUT, before any GET, and every GET carried it (the
    // warm-pool state among them: docs/contract.md, "Warm pools").
    let reqs = srv.requests();
    assert!(reqs
        .iter()
        .any(|r| r.route() == "/latest/meta-data/autoscaling/target-lifecycle-state"));
    assert_eq!(
        (reqs[0].method.as_str(), reqs[0].route()),
        ("PUT", "/latest/api/token")
    );
    assert_eq!(
        reqs[0].header("x-aws-ec2-metadata-token-ttl-seconds"),
        Some("300")
    );
    assert!(reqs[1..]
        .iter()
        .all(|r| r.method == "GET" && r.header("x-aws-ec2-metadata-token").is_some()));

    // The kubeconfig around the token: 0600, and the token never printed.
    let kc = root.path("run/kiln/bootstrap-kubeconfig");
    assert_eq!(
        std::fs::metadata(&kc).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let kc = root.read("run/kiln/bootstrap-kubeconfig");
    assert!(kc.contains(&format!("token: {TOKEN}\n")), "{kc}");
    assert!(
        kc.contains("server: https://127.0.0.1:6443\n")
            && kc.contains("certificate-authority: /etc/kiln/ca.crt\n")
    );
    assert!(!out.stdout.contains(TOKEN) && !out.stderr.contains(TOKEN));
    assert!(!root.read("run/kiln/kubelet.env").contains(TOKEN));
    assert_eq!(
        root.run_files(),
        [
            "run/cluster-api/bootstrap-success.complete",
            "run/kiln/bootstrap-kubeconfig",
            "run/kiln/kubelet.conf.d/10-kiln-node.conf",
            "run/kiln/kubelet.env",
            "run/kiln/status.json"
        ]
    );
}

#[test]
fn second_run_is_harmless_and_byte_identical() {
    let root = Root::node("Amazon EC2");
    let srv = imdsv2();
    start_ok(&root, &[], &srv.url);
    let first = std::fs::read(root.path("run/kiln/kubelet.env")).unwrap();
    let first_kc = std::fs::read(root.path("run/kiln/bootstrap-kubeconfig")).unwrap();
    start_ok(&root, &[], &srv.url);
    assert_eq!(
        std::fs::read(root.path("run/kiln/kubelet.env")).unwrap(),
        first
    );
    assert_eq!(
        std::fs::read(root.path("run/kiln/bootstrap-kubeconfig")).unwrap(),
        first_kc
    );
    assert_eq!(root.calls("systemctl").len(), 2);
}

#[test]
fn azure_imds_json() {
    let root = Root::node("Microsoft Corporation");
    root.write(
        "sys/class/dmi/id/chassis_asset_tag",
        "7783-7084-3265-9085-8269-3286-77\n",
    );
    let srv = Server::fixtures(
        "azure",
        &[("Content-Type", "application/json; charset=utf-8")],
    );
    start_ok(&root, &[], &srv.url);
    let env = root.read("run/kiln/kubelet.env");
    for line in [
        "PROVIDER=azure\n",
        "NODE_NAME=kiln-worker-0\n",
        "NODE_IP=10.1.0.4\n",
        "INSTANCE_ID=13f56399-bd52-4150-9748-7190aae1ff21\n",
        "INSTANCE_TYPE=Standard_D4s_v5\n",
        "ZONE=westeurope-2\n",
        "REGION=westeurope\n",
        "PROVIDER_ID=azure:///subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/kiln-rg/providers/Microsoft.Compute/virtualMachines/kiln-worker-0\n",
        "MAX_PODS=110\n",
    ] {
        assert!(env.contains(line), "missing {line:?} in\n{env}");
    }
    let reqs = srv.requests();
    assert_eq!(reqs.len(), 1, "one request for the whole document");
    assert_eq!(reqs[0].path, "/metadata/instance?api-version=2021-02-01");
    assert_eq!(reqs[0].header("metadata"), Some("true"));
}

#[test]
fn azure_scale_set_provider_id() {
    let root = Root::node("");
    let doc = std::fs::read_to_string(fixtures().join("azure/metadata/instance"))
        .unwrap()
        .replace("\"name\":\"kiln-worker-0\"", "\"name\":\"kiln-pool_7\"")
        .replace(
            "\"vmScaleSetName\":\"\"",
            "\"vmScaleSetName\":\"kiln-pool\"",
        );
    let srv = Server::start(move |_| ok(&doc));
    start_ok(&root, &["--provider", "azure"], &srv.url);
    assert!(root.read("run/kiln/kubelet.env").contains(
        "PROVIDER_ID=azure:///subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/kiln-rg/providers/Microsoft.Compute/virtualMachineScaleSets/kiln-pool/virtualMachines/7\n"
    ));
}

#[test]
fn gcp_compute_metadata() {
    let root = Root::node("Google");
    root.write("sys/class/dmi/id/product_name", "Google Compute Engine\n");
    let srv = Server::fixtures(
        "gcp",
        &[
            ("Metadata-Flavor", "Google"),
            ("Content-Type", "application/text"),
            ("Server", "Metadata Server for VM"),
        ],
    );
    start_ok(&root, &[], &srv.url);
    let env = root.read("run/kiln/kubelet.env");
    for line in [
        "PROVIDER=gcp\n",
        "NODE_NAME=kiln-worker-0\n",
        "NODE_IP=10.128.0.5\n",
        "INSTANCE_ID=4520031799277581759\n",
        "INSTANCE_TYPE=n2-standard-4\n",
        "ZONE=us-central1-a\n",
        "REGION=us-central1\n",
        "PROVIDER_ID=gce://kiln-test-project/us-central1-a/kiln-worker-0\n",
        "MAX_PODS=32\n",
    ] {
        assert!(env.contains(line), "missing {line:?} in\n{env}");
    }
    assert!(srv
        .requests()
        .iter()
        .all(|r| r.header("metadata-flavor") == Some("Google")));
}

#[test]
fn gcp_answer_without_the_flavor_header_is_refused() {
    let root = Root::node("");
    let srv = Server::fixtures("gcp", &[]);
    let systemctl = root.stub("systemctl", "exit 0");
    let out = firstboot(
        &root,
        &[
            "--provider",
            "gcp",
            "--metadata-url",
            &srv.url,
            "--systemctl",
            &systemctl,
        ],
    );
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("METADATA_INVALID") && out.stderr.contains("Metadata-Flavor"),
        "{}",
        out.stderr
    );
    assert!(root.calls("systemctl").is_empty());
}

#[test]
fn openstack_meta_data_json_and_ec2_leaves() {
    let root = Root::node("OpenStack Foundation");
    let srv = Server::fixtures("openstack", &[]);
    start_ok(&root, &[], &srv.url);
    let env = root.read("run/kiln/kubelet.env");
    for line in [
        "PROVIDER=openstack\n",
        "NODE_NAME=kiln-worker-0\n",
        "NODE_IP=10.0.0.12\n",
        "INSTANCE_ID=d8e02d56-2648-49a3-bf97-6be8f1204f38\n",
        "INSTANCE_TYPE=m1.small\n",
        "ZONE=nova\n",
        "REGION=\n",
        "PROVIDER_ID=openstack:///d8e02d56-2648-49a3-bf97-6be8f1204f38\n",
    ] {
        assert!(env.contains(line), "missing {line:?} in\n{env}");
    }
}

#[test]
fn vmware_guestinfo_through_rpctool() {
    let root = Root::node("VMware, Inc.");
    let uuid = std::fs::read_to_string(fixtures().join("vmware/dmi/product_uuid")).unwrap();
    root.write("sys/class/dmi/id/product_uuid", &uuid);
    // Plays vmware-rpctool: prints the value, or fails like it does for an unset key.
    let dir = fixtures().join("vmware/guestinfo");
    let rpctool = root.stub(
        "vmware-rpctool",
        &format!(
            "key=${{1#info-get guestinfo.}}\nif [ -f '{}'/\"$key\" ]; then cat '{}'/\"$key\"; else echo 'No value found'; exit 1; fi",
            dir.display(),
            dir.display()
        ),
    );
    start_ok(&root, &["--vmware-rpctool", &rpctool], "http://127.0.0.1:9");
    let env = root.read("run/kiln/kubelet.env");
    for line in [
        "PROVIDER=vmware\n",
        "NODE_NAME=kiln-worker-0\n",
        "NODE_IP=192.168.10.21\n",
        "INSTANCE_ID=4237d8c6-2c1f-9e84-56af-1a2b3c4d5e6f\n",
        "INSTANCE_TYPE=vm-4cpu-8gb\n",
        "ZONE=rack-a\n",
        "REGION=dc1\n",
        "PROVIDER_ID=vsphere://4237d8c6-2c1f-9e84-56af-1a2b3c4d5e6f\n",
    ] {
        assert!(env.contains(line), "missing {line:?} in\n{env}");
    }
    assert!(root
        .calls("vmware-rpctool")
        .contains(&"info-get guestinfo.kiln.hostname".to_string()));
}

#[test]
fn qemu_fw_cfg_without_network() {
    let root = Root::node("QEMU");
    for key in [
        "instance-id",
        "hostname",
        "local-ipv4",
        "instance-type",
        "zone",
        "region",
    ] {
        let v =
            std::fs::read_to_string(fixtures().join(format!("qemu/opt/kiln/{key}/raw"))).unwrap();
        root.write(
            &format!("sys/firmware/qemu_fw_cfg/by_name/opt/kiln/{key}/raw"),
            &v,
        );
    }
    // Port 9 on loopback has no listener: qemu must not touch the network at all.
    start_ok(&root, &[], "http://127.0.0.1:9");
    let env = root.read("run/kiln/kubelet.env");
    for line in [
        "PROVIDER=qemu\n",
        "NODE_NAME=kiln-qemu-0\n",
        "NODE_IP=10.0.2.15\n",
        "INSTANCE_ID=kiln-qemu-0001\n",
        "PROVIDER_ID=kiln://qemu/kiln-qemu-0001\n",
        "ZONE=local-a\n",
    ] {
        assert!(env.contains(line), "missing {line:?} in\n{env}");
    }
}

#[test]
fn none_uses_the_route_to_the_api_server_and_the_hostname() {
    let root = Root::node("Dell Inc.");
    root.write("etc/hostname", "Metal-07\n");
    let srv = Server::start(|_| status(500));
    start_ok(&root, &[], &srv.url);
    let env = root.read("run/kiln/kubelet.env");
    assert!(
        env.contains("PROVIDER=none\nNODE_NAME=metal-07\nNODE_IP=127.0.0.1\nINSTANCE_ID=\n"),
        "{env}"
    );
    assert!(
        env.contains("PROVIDER_ID=\n") && !env.contains("--provider-id"),
        "{env}"
    );
    assert!(
        srv.requests().is_empty(),
        "none must not call a metadata service"
    );
}

#[test]
fn node_env_overrides_and_lists() {
    let root = Root::node("Amazon EC2");
    root.node_env(
        "NODE_NAME=worker-1\nNODE_IP=10.9.9.9\nMAX_PODS=58\nNODE_LABELS=role=worker,tier=web\n\
         NODE_TAINTS=gpu=true:NoSchedule\nCLUSTER_DNS=10.96.0.10\nKUBELET_EXTRA_ARGS=\"--v=2 --cgroup-driver=systemd\"\n\
         HTTPS_PROXY=http://proxy:3128\nFUTURE_KEY=ignored\n",
    );
    let srv = imdsv2();
    start_ok(&root, &[], &srv.url);
    let env = root.read("run/kiln/kubelet.env");
    for line in [
        "NODE_NAME=worker-1\n",
        "NODE_IP=10.9.9.9\n",
        "MAX_PODS=58\n",
        "NODE_LABELS=role=worker,tier=web\n",
        "NODE_TAINTS=gpu=true:NoSchedule\n",
        "KUBELET_EXTRA_ARGS=\"--v=2 --cgroup-driver=systemd\"\n",
        "HTTPS_PROXY=http://proxy:3128\n",
    ] {
        assert!(env.contains(line), "missing {line:?} in\n{env}");
    }
    assert!(!env.contains("FUTURE_KEY") && !env.contains("HTTP_PROXY="));
    let args = env
        .lines()
        .find(|l| l.starts_with("KUBELET_ARGS="))
        .unwrap();
    assert!(
        args.ends_with(
            "--hostname-override=worker-1 --node-ip=10.9.9.9 --node-labels=role=worker,tier=web \
             --v=2 --cgroup-driver=systemd\""
        ),
        "{args}"
    );
    let dropin = root.read("run/kiln/kubelet.conf.d/10-kiln-node.conf");
    assert!(
        dropin.ends_with(
            "\"providerID\":\"aws:///eu-west-1a/i-0abc123def4567890\",\"maxPods\":58,\
             \"clusterDNS\":[\"10.96.0.10\"],\
             \"registerWithTaints\":[{\"key\":\"gpu\",\"value\":\"true\",\"effect\":\"NoSchedule\"}]}\n"
        ),
        "{dropin}"
    );
}

#[test]
fn kubeconfig_credential_and_kubelet_config_override() {
    let root = Root::node("QEMU");
    std::fs::remove_file(root.path("etc/kiln/bootstrap-token")).unwrap();
    root.write_mode(
        "etc/kiln/bootstrap-kubeconfig",
        "apiVersion: v1\nkind: Config\n",
        0o600,
    );
    root.write(
        "etc/kiln/kubelet-config.yaml",
        "kind: KubeletConfiguration\n",
    );
    root.write(
        "sys/firmware/qemu_fw_cfg/by_name/opt/kiln/instance-id/raw",
        "q1",
    );
    start_ok(&root, &[], "http://127.0.0.1:9");
    let env = root.read("run/kiln/kubelet.env");
    assert!(
        env.contains("--config=/etc/kiln/kubelet-config.yaml "),
        "{env}"
    );
    assert!(
        env.contains("--bootstrap-kubeconfig=/etc/kiln/bootstrap-kubeconfig "),
        "{env}"
    );
    assert!(!root.exists("run/kiln/bootstrap-kubeconfig"));
    // No hostname from fw_cfg: the instance id names the node.
    assert!(env.contains("NODE_NAME=q1\n"), "{env}");
}

#[test]
fn no_start_writes_but_does_not_start() {
    let root = Root::node("Amazon EC2");
    let srv = imdsv2();
    start_ok(&root, &["--no-start"], &srv.url);
    assert!(root.exists("run/kiln/kubelet.env"));
    assert!(root.calls("systemctl").is_empty());
}

#[test]
fn service_manager_failure() {
    let root = Root::node("Amazon EC2");
    let systemctl = root.stub(
        "systemctl",
        "echo 'Failed to start kubelet.service: Unit kubelet.service not found.' >&2; exit 5",
    );
    let srv = imdsv2();
    let out = firstboot(
        &root,
        &["--metadata-url", &srv.url, "--systemctl", &systemctl],
    );
    assert_eq!(out.code, 6, "{out:#?}");
    assert!(
        out.stderr.contains("START_FAILED")
            && out.stderr.contains("Unit kubelet.service not found"),
        "{}",
        out.stderr
    );
    let missing = firstboot(
        &root,
        &[
            "--metadata-url",
            &srv.url,
            "--systemctl",
            "/nonexistent/systemctl",
        ],
    );
    assert_eq!(missing.code, 6);
    assert!(
        missing.stderr.contains("cannot run /nonexistent/systemctl"),
        "{}",
        missing.stderr
    );
}

#[test]
fn kubelet_unit_and_runtime_endpoint_come_from_the_image() {
    let root = Root::node("QEMU");
    let image = root.read("usr/lib/kiln/image.env");
    root.write(
        "usr/lib/kiln/image.env",
        &format!("{image}KUBELET_UNIT=kubelet-kiln.service\nCONTAINER_RUNTIME_ENDPOINT=unix:///run/crio/crio.sock\nDEFAULT_MAX_PODS=17\n"),
    );
    root.write(
        "sys/firmware/qemu_fw_cfg/by_name/opt/kiln/instance-id/raw",
        "q1",
    );
    start_ok(&root, &[], "http://127.0.0.1:9");
    assert_eq!(
        root.calls("systemctl"),
        ["start --no-block kubelet-kiln.service"]
    );
    let env = root.read("run/kiln/kubelet.env");
    let dropin = root.read("run/kiln/kubelet.conf.d/10-kiln-node.conf");
    assert!(
        dropin.contains("\"containerRuntimeEndpoint\":\"unix:///run/crio/crio.sock\"")
            && dropin.contains("\"maxPods\":17")
            && env.contains("MAX_PODS=17\n"),
        "{env}\n{dropin}"
    );
}

/// A provisioned KubeletConfiguration drop-in is copied after the node's own in kubelet's
/// `--config-dir`, byte for byte; a re-run without it removes the copy; a FIFO or a symlink
/// at its name is a CONFIG_INVALID (exit 3), never read.
#[test]
fn the_provisioned_drop_in_follows_the_nodes_own() {
    let root = Root::node("Amazon EC2");
    let dropin =
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 58\n";
    root.write("etc/kiln/kubelet-dropin.conf", dropin);
    let srv = imdsv2();
    start_ok(&root, &[], &srv.url);
    assert_eq!(
        root.read("run/kiln/kubelet.conf.d/50-kiln-provisioned.conf"),
        dropin
    );
    assert!(root
        .read("run/kiln/kubelet.conf.d/10-kiln-node.conf")
        .contains("\"maxPods\":29"));
    std::fs::remove_file(root.path("etc/kiln/kubelet-dropin.conf")).unwrap();
    start_ok(&root, &[], &srv.url);
    assert!(!root.exists("run/kiln/kubelet.conf.d/50-kiln-provisioned.conf"));

    let fifo = root.path("etc/kiln/kubelet-dropin.conf");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let systemctl = root.stub("systemctl", "exit 0");
    let args = [
        "--metadata-url",
        &srv.url,
        "--systemctl",
        &systemctl,
        "--deadline",
        "5",
    ];
    let out = firstboot(&root, &args);
    assert_eq!(out.code, 3, "{out:#?}");
    assert!(
        out.stderr.contains(
            "kubelet-dropin.conf: expected a regular file, found a symlink or another type"
        ),
        "{}",
        out.stderr
    );
    std::fs::remove_file(&fifo).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &fifo).unwrap();
    let out = firstboot(&root, &args);
    assert_eq!(out.code, 3, "{out:#?}");
    assert!(
        out.stderr
            .contains("expected a regular file, found a symlink or another type"),
        "{}",
        out.stderr
    );
}

/// `/etc/kiln/sysctl.conf` is written to `/proc/sys` (under `--root`) in the write phase,
/// before kubelet starts; a name the kernel lacks is a warning, each outcome is in
/// status.json; a name that would leave `/proc/sys` stops the run as CONFIG_INVALID, naming
/// the file and the line, before anything is written.
#[test]
fn provisioned_sysctls_reach_proc_sys_before_kubelet() {
    let root = Root::node("Amazon EC2");
    root.write(
        "etc/kiln/sysctl.conf",
        "# from node.toml\nnet.core.somaxconn = 4096\nnet.ipv4.tcp_rmem = 4096\t87380 6291456\nfs.kiln.missing = 1\n",
    );
    root.write("proc/sys/net/core/somaxconn", "128\n");
    root.write("proc/sys/net/ipv4/tcp_rmem", "4096 131072 6291456\n");
    let srv = imdsv2();
    let out = start_ok(&root, &[], &srv.url);
    assert_eq!(root.read("proc/sys/net/core/somaxconn"), "4096\n");
    assert_eq!(
        root.read("proc/sys/net/ipv4/tcp_rmem"),
        "4096\t87380 6291456\n"
    );
    assert!(!root.exists("proc/sys/fs/kiln/missing"), "never created");
    let status = root.read("run/kiln/status.json");
    assert!(
        status.contains(
            "\"sysctl\":[{\"name\":\"net.core.somaxconn\",\"value\":\"4096\",\"result\":\"ok\"},\
             {\"name\":\"net.ipv4.tcp_rmem\",\"value\":\"4096\\t87380 6291456\",\"result\":\"ok\"},\
             {\"name\":\"fs.kiln.missing\",\"value\":\"1\",\"result\":\"failed\"}]"
        ),
        "{status}"
    );
    assert!(
        status.contains("sysctl fs.kiln.missing was not applied: ")
            && status.contains("proc/sys/fs/kiln/missing"),
        "{status}"
    );
    assert!(
        out.stderr
            .contains("warning: sysctl fs.kiln.missing was not applied"),
        "{}",
        out.stderr
    );

    root.write(
        "etc/kiln/sysctl.conf",
        "net.core.somaxconn = 1024\nnet/../../etc/passwd = 0\n",
    );
    let systemctl = root.stub("systemctl", "exit 0");
    let out = firstboot(
        &root,
        &[
            "--metadata-url",
            &srv.url,
            "--systemctl",
            &systemctl,
            "--deadline",
            "5",
        ],
    );
    assert_eq!(out.code, 3, "{out:#?}");
    assert!(
        out.stderr
            .contains("sysctl.conf: line 2: expected a sysctl name"),
        "{}",
        out.stderr
    );
    assert_eq!(
        root.read("proc/sys/net/core/somaxconn"),
        "4096\n",
        "nothing applied"
    );
}
