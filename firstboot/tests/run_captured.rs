//! The real binary against metadata other projects captured from real instances
//! (`fixtures/captured/`, each case with its SOURCE.txt), served on loopback with each
//! service's header rules. Every case runs twice, with `--provider` and with `PROVIDER=auto`
//! over DMI files under `--root`, and both runs must write the same `kubelet.env` with the
//! identity listed here; none may end in a silent `none`.

#![cfg(unix)]

#[path = "common/captured.rs"]
mod captured;
use crate::common;

use captured::*;
use common::*;
use kiln_firstboot::json::Value;

/// Azure's DMI as cloud-init's rule reads it (the asset tag is the rule; vendor and product
/// are Hyper-V's). Not a capture.
const AZURE_DMI: &[(&str, &str)] = &[
    ("sys_vendor", "Microsoft Corporation"),
    ("product_name", "Virtual Machine"),
    ("chassis_asset_tag", "7783-7084-3265-9085-8269-3286-77"),
];
/// GCE's DMI as cloud-init's rule reads it. Not a capture.
const GCE_DMI: &[(&str, &str)] = &[
    ("sys_vendor", "Google"),
    ("product_name", "Google Compute Engine"),
];
/// OpenStack's DMI as cloud-init's rule reads it (`OpenStack Compute` is RDO's). Not a
/// capture.
const OPENSTACK_DMI: &[(&str, &str)] =
    &[("sys_vendor", "RDO"), ("product_name", "OpenStack Compute")];

// --- AWS -------------------------------------------------------------------------------

const T2_SMALL: &str = "aws/cloudinit-2016-09-02-t2small-dualstack/meta-data.json";

/// A Xen-era t2.small on API version 2016-09-02 (no placement/region, no top-level ipv6),
/// detected from a real Xen-era instance's DMI (`Xen`, `HVM domU`, `4.2.amazon`, `ec2` UUIDs).
#[test]
fn aws_xen_t2_small_2016_api() {
    let root = Root::node("");
    dmi_capture(&root, "aws/xen-t2-dmi-4.2.amazon");
    let srv = ec2(load(T2_SMALL), "127.0.0.1:0");
    both_ways(
        &root,
        "aws",
        &srv.url,
        &want([
            "PROVIDER=aws",
            "NODE_NAME=ip-172-3-3-15.us-east-2.compute.internal",
            "NODE_IP=172.3.3.15",
            "INSTANCE_ID=i-0a33f80f09c96477f",
            "INSTANCE_TYPE=t2.small",
            "ZONE=us-east-2b",
            "REGION=us-east-2",
            "PROVIDER_ID=aws:///us-east-2b/i-0a33f80f09c96477f",
        ]),
    );
    // The usual boot asks no interface list: local-ipv4 answered.
    assert!(
        srv.requests()
            .iter()
            .all(|r| !r.route().contains("/network/interfaces/")),
        "{:?}",
        srv.requests()
    );
}

/// The same instance dual-stack: the 2016 API has no `meta-data/ipv6`, so the IPv6 address
/// comes from the primary interface's `ipv6s`.
#[test]
fn aws_xen_t2_small_dual_stack_from_the_interface_list() {
    let root = Root::node("");
    root.node_env("IP_FAMILY=dual\n");
    dmi_capture(&root, "aws/xen-t2-dmi-4.2.amazon");
    let srv = ec2(load(T2_SMALL), "127.0.0.1:0");
    both_ways(
        &root,
        "aws",
        &srv.url,
        &want([
            "PROVIDER=aws",
            "NODE_NAME=ip-172-3-3-15.us-east-2.compute.internal",
            "NODE_IP=172.3.3.15,2600:1f16:aeb:b20b:9d87:a4af:5cc9:73dc",
            "INSTANCE_ID=i-0a33f80f09c96477f",
            "INSTANCE_TYPE=t2.small",
            "ZONE=us-east-2b",
            "REGION=us-east-2",
            "PROVIDER_ID=aws:///us-east-2b/i-0a33f80f09c96477f",
        ]),
    );
    assert!(srv
        .requests()
        .iter()
        .any(|r| r.route() == "/latest/meta-data/network/interfaces/macs/06:17:04:d7:26:09/ipv6s"));
}

/// `local-ipv4` answered `0.0.0.0`: refused with the field named (stderr and status.json),
/// and the primary interface's `local-ipv4s` gives the address.
#[test]
fn aws_unspecified_local_ipv4_is_refused_and_the_interface_list_answers() {
    let root = Root::node("");
    dmi_capture(&root, "aws/xen-t2-dmi-4.2.amazon");
    let mut md = load(T2_SMALL);
    set(&mut md, "local-ipv4", Value::String("0.0.0.0".into()));
    let srv = ec2(md, "127.0.0.1:0");
    let status = both_ways(
        &root,
        "aws",
        &srv.url,
        &want([
            "PROVIDER=aws",
            "NODE_NAME=ip-172-3-3-15.us-east-2.compute.internal",
            "NODE_IP=172.3.3.15",
            "INSTANCE_ID=i-0a33f80f09c96477f",
            "INSTANCE_TYPE=t2.small",
            "ZONE=us-east-2b",
            "REGION=us-east-2",
            "PROVIDER_ID=aws:///us-east-2b/i-0a33f80f09c96477f",
        ]),
    );
    assert!(
        status.contains("meta-data/local-ipv4: refused 0.0.0.0 (unspecified address"),
        "{status}"
    );
}

/// A t2.micro on API version 2018-09-24 with three IPv6 addresses on its interface: IPv6
/// asked for, the first one is the node's; detected from a Xen 4.11 DMI capture whose
/// product_uuid and product_serial both start with `ec2`.
#[test]
fn aws_xen_t2_micro_2018_api_ipv6() {
    let root = Root::node("");
    root.node_env("IP_FAMILY=ipv6\n");
    dmi_capture(&root, "aws/xen-dmi-4.11.amazon");
    let srv = ec2(
        load("aws/cloudinit-2018-09-24-t2micro-multi-ipv6/meta-data.json"),
        "127.0.0.1:0",
    );
    both_ways(
        &root,
        "aws",
        &srv.url,
        &want([
            "PROVIDER=aws",
            "NODE_NAME=ip-172-31-44-13.us-east-2.compute.internal",
            "NODE_IP=2600:1f16:292:100:c187:593c:4349:136",
            "INSTANCE_ID=i-069e01e8cc43732f8",
            "INSTANCE_TYPE=t2.micro",
            "ZONE=us-east-2c",
            "REGION=us-east-2",
            "PROVIDER_ID=aws:///us-east-2c/i-069e01e8cc43732f8",
        ]),
    );
}

/// An IPv6-only Nitro instance (captured interfaces; the leaves the capture lacks are
/// kiln's, see its SOURCE.txt) through IMDS on an IPv6 address (`[::1]` here, as
/// `[fd00:ec2::254]` on EC2) with an IPv6 API server: no `local-ipv4`, so the node is IPv6
/// without being told.
fn ipv6_only() -> Value {
    let dir = "aws/cloudinit-ipv6-only-multinic";
    let mut md = load(&format!("{dir}/kiln-added.json"));
    set(
        &mut md,
        "network/interfaces",
        load(&format!("{dir}/network-interfaces.json")),
    );
    md
}

const IPV6_ONLY: [&str; 8] = [
    "PROVIDER=aws",
    "NODE_NAME=i-0951b6d0b66337123.us-east-2.compute.internal",
    "NODE_IP=2600:1f16:67f:f201:6613:29a2:dbf7:2f1f",
    "INSTANCE_ID=i-0951b6d0b66337123",
    "INSTANCE_TYPE=t4g.large",
    "ZONE=us-east-2a",
    "REGION=us-east-2",
    "PROVIDER_ID=aws:///us-east-2a/i-0951b6d0b66337123",
];

#[test]
fn aws_nitro_ipv6_only_over_the_ipv6_endpoint() {
    let root = Root::node("");
    root.node_env("");
    root.write(
        "etc/kiln/node.env",
        "KILN_CONTRACT=1\nAPI_SERVER=https://[::1]:6443\nCLUSTER_NAME=test\n",
    );
    dmi_capture(&root, "aws/nitro-t4g-dmi");
    let srv = ec2(ipv6_only(), "[::1]:0");
    assert!(srv.url.starts_with("http://[::1]:"), "{}", srv.url);
    both_ways(&root, "aws", &srv.url, &want(IPV6_ONLY));
    assert!(srv
        .requests()
        .iter()
        .all(|r| r.header("host") == Some(srv.url.trim_start_matches("http://"))));
}

/// The same without the top-level `ipv6` leaf (older API versions): the primary
/// interface's `ipv6s`, found through `mac`.
#[test]
fn aws_nitro_ipv6_only_from_the_interface_list() {
    let root = Root::node("");
    dmi_capture(&root, "aws/nitro-t4g-dmi");
    let mut md = ipv6_only();
    set(&mut md, "ipv6", Value::Null);
    let srv = ec2(md, "127.0.0.1:0");
    both_ways(&root, "aws", &srv.url, &want(IPV6_ONLY));
}

// --- Azure -----------------------------------------------------------------------------

const AKS: &str = "azure/aks-vmss-nodepool1-capture/instance.json";

/// A real AKS node of a uniform scale set: the provider ID addresses the set's instance 0,
/// the node name is the computer name, the region is lower-cased.
#[test]
fn azure_aks_uniform_scale_set_node() {
    let root = Root::node("");
    dmi(&root, AZURE_DMI);
    let srv = azure(load(AKS));
    both_ways(
        &root,
        "azure",
        &srv.url,
        &want([
            "PROVIDER=azure",
            "NODE_NAME=aks-nodepool1-22790412-vmss000000",
            "NODE_IP=10.224.0.5",
            "INSTANCE_ID=d89dcaf9-bd2e-45f9-8435-a778a750d9ba",
            "INSTANCE_TYPE=Standard_B2ms",
            "ZONE=",
            "REGION=swedencentral",
            "PROVIDER_ID=azure:///subscriptions/redacts-1111-1111-1111-111111111111/resourceGroups/MC_rg_aks_swedencentral/providers/Microsoft.Compute/virtualMachineScaleSets/aks-nodepool1-22790412-vmss/virtualMachines/0",
        ]),
    );
    // The service's rule: without the header it answers 400 (as captured), and firstboot
    // always sends it.
    assert!(srv
        .requests()
        .iter()
        .all(|r| r.header("metadata") == Some("true")));
}

/// The AKS node dual-stack: its compute object with the network interface of an AKS
/// dual-stack node (two captures of the same kind of node, joined here).
#[test]
fn azure_aks_dual_stack_node() {
    let root = Root::node("");
    root.node_env("IP_FAMILY=dual\n");
    dmi(&root, AZURE_DMI);
    let mut doc = load(AKS);
    set(
        &mut doc,
        "network/interface",
        load("azure/aks-dualstack-node-interface/network-interface.json"),
    );
    let srv = azure(doc);
    let want_lines = want([
        "PROVIDER=azure",
        "NODE_NAME=aks-nodepool1-22790412-vmss000000",
        "NODE_IP=10.224.0.4,fd85:534e:4cd6:ab02::5",
        "INSTANCE_ID=d89dcaf9-bd2e-45f9-8435-a778a750d9ba",
        "INSTANCE_TYPE=Standard_B2ms",
        "ZONE=",
        "REGION=swedencentral",
        "PROVIDER_ID=azure:///subscriptions/redacts-1111-1111-1111-111111111111/resourceGroups/MC_rg_aks_swedencentral/providers/Microsoft.Compute/virtualMachineScaleSets/aks-nodepool1-22790412-vmss/virtualMachines/0",
    ]);
    both_ways(&root, "azure", &srv.url, &want_lines);

    // IPv6 first when the API server is IPv6.
    root.write(
        "etc/kiln/node.env",
        "KILN_CONTRACT=1\nAPI_SERVER=https://[::1]:6443\nCLUSTER_NAME=test\nIP_FAMILY=dual\n",
    );
    let out = run(&root, &srv.url, Some("azure"));
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(root
        .read("run/kiln/kubelet.env")
        .contains("NODE_IP=fd85:534e:4cd6:ab02::5,10.224.0.4\n"));
}

/// A flexible-orchestration scale set VM (Microsoft's published example; its instance name
/// is not `<set>_<n>`, so it is addressed as a VM), without a network section: the address
/// comes from the route to the API server.
#[test]
fn azure_flexible_scale_set_vm_without_network() {
    let root = Root::node("");
    dmi(&root, AZURE_DMI);
    let mut doc = Value::Object(vec![]);
    set(
        &mut doc,
        "compute",
        load("azure/msdocs-vmss-trustedlaunch/compute.json"),
    );
    let srv = azure(doc);
    both_ways(
        &root,
        "azure",
        &srv.url,
        &want([
            "PROVIDER=azure",
            "NODE_NAME=examplevmname",
            "NODE_IP=127.0.0.1",
            "INSTANCE_ID=02aab8a4-74ef-476e-8182-f6d2ba4166a6",
            "INSTANCE_TYPE=Standard_A3",
            "ZONE=",
            "REGION=westus",
            "PROVIDER_ID=azure:///subscriptions/xxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxx/resourceGroups/macikgo-test-may-23/providers/Microsoft.Compute/virtualMachines/examplevmname",
        ]),
    );
}

#[test]
fn azure_standalone_vms() {
    for (doc, lines) in [
        (
            "azure/cloudinit-ds1v2-eastus2/instance.json",
            want([
                "PROVIDER=azure",
                "NODE_NAME=my-hostname",
                "NODE_IP=10.0.0.4",
                "INSTANCE_ID=ff702a6b-cb6a-4fcd-ad68-b4ce38227642",
                "INSTANCE_TYPE=Standard_DS1_v2",
                "ZONE=",
                "REGION=eastus2",
                "PROVIDER_ID=azure:///subscriptions/12aad61c-6de4-4e53-a6c6-5aff52a83777/resourceGroups/srugroup1/providers/Microsoft.Compute/virtualMachines/my-hostname",
            ]),
        ),
        (
            "azure/walinuxagent-valid/instance.json",
            want([
                "PROVIDER=azure",
                "NODE_NAME=health",
                "NODE_IP=10.0.1.4",
                "INSTANCE_ID=e7fdbfc4-2deb-4a4e-8615-ea6aaf50162e",
                "INSTANCE_TYPE=Standard_D2_V2",
                "ZONE=",
                "REGION=westus",
                "PROVIDER_ID=azure:///subscriptions/21b2dc34-bce6-4e63-9449-d2a8d1c2339e/resourceGroups/tests/providers/Microsoft.Compute/virtualMachines/health",
            ]),
        ),
    ] {
        let root = Root::node("");
        dmi(&root, AZURE_DMI);
        let srv = azure(load(doc));
        both_ways(&root, "azure", &srv.url, &lines);
    }
}

// --- GCP -------------------------------------------------------------------------------

/// An older recursive answer without `instance/name`: the name is the hostname's first
/// label, in the node name and the provider ID.
#[test]
fn gcp_answer_without_instance_name() {
    let root = Root::node("");
    dmi(&root, GCE_DMI);
    let srv = gce(load(
        "gcp/mackerel-g1small-no-name/computeMetadata-v1-recursive.json",
    ));
    both_ways(
        &root,
        "gcp",
        &srv.url,
        &want([
            "PROVIDER=gcp",
            "NODE_NAME=gce-1",
            "NODE_IP=192.0.2.1",
            "INSTANCE_ID=4567890123456789123",
            "INSTANCE_TYPE=g1-small",
            "ZONE=asia-east1-a",
            "REGION=asia-east1",
            "PROVIDER_ID=gce://dummyprof-987/asia-east1-a/gce-1",
        ]),
    );
    assert!(srv
        .requests()
        .iter()
        .all(|r| r.header("metadata-flavor") == Some("Google")));
}

/// The same answer with an IPv6 list on the primary interface (no captured answer with
/// `ipv6s` was found; the addresses here are documentation ones, added by the test):
/// IP_FAMILY=dual takes the first, a link-local one before it is refused.
#[test]
fn gcp_dual_stack_from_ipv6s() {
    let root = Root::node("");
    root.node_env("IP_FAMILY=dual\n");
    dmi(&root, GCE_DMI);
    let mut doc = load("gcp/mackerel-g1small-no-name/computeMetadata-v1-recursive.json");
    if let Value::Object(m) = &mut doc {
        let (_, instance) = m.iter_mut().find(|(k, _)| k == "instance").unwrap();
        if let Value::Object(i) = instance {
            let (_, nics) = i
                .iter_mut()
                .find(|(k, _)| k == "networkInterfaces")
                .unwrap();
            if let Value::Array(nics) = nics {
                set(
                    &mut nics[0],
                    "ipv6s",
                    Value::Array(vec![
                        Value::String("fe80::4001:aff:fe80:2".into()),
                        Value::String("2001:db8:4150:ba95::2".into()),
                    ]),
                );
            }
        }
    }
    let srv = gce(doc);
    let status = both_ways(
        &root,
        "gcp",
        &srv.url,
        &want([
            "PROVIDER=gcp",
            "NODE_NAME=gce-1",
            "NODE_IP=192.0.2.1,2001:db8:4150:ba95::2",
            "INSTANCE_ID=4567890123456789123",
            "INSTANCE_TYPE=g1-small",
            "ZONE=asia-east1-a",
            "REGION=asia-east1",
            "PROVIDER_ID=gce://dummyprof-987/asia-east1-a/gce-1",
        ]),
    );
    assert!(
        status.contains("network-interfaces/0/ipv6s: refused fe80::4001:aff:fe80:2 (link-local"),
        "{status}"
    );
}

/// A minimal answer without hostname or interfaces: the instance name names the node, the
/// route to the API server gives the address.
#[test]
fn gcp_minimal_answer() {
    let root = Root::node("");
    dmi(&root, GCE_DMI);
    let srv = gce(load(
        "gcp/elastic-n1standard1/computeMetadata-v1-recursive.json",
    ));
    both_ways(
        &root,
        "gcp",
        &srv.url,
        &want([
            "PROVIDER=gcp",
            "NODE_NAME=basepi-test",
            "NODE_IP=127.0.0.1",
            "INSTANCE_ID=4306570268266786072",
            "INSTANCE_TYPE=n1-standard-1",
            "ZONE=us-west3-a",
            "REGION=us-west3",
            "PROVIDER_ID=gce://elastic-apm/us-west3-a/basepi-test",
        ]),
    );
}

/// A partial answer with only the zone fails the boot, naming the first missing field,
/// both ways; it is never a silent `none`.
#[test]
fn gcp_partial_answer_fails_naming_the_field() {
    let root = Root::node("");
    dmi(&root, GCE_DMI);
    let srv = gce(load(
        "gcp/esp-partial-zone-only/computeMetadata-v1-recursive.json",
    ));
    for provider in [Some("gcp"), None] {
        let out = run(&root, &srv.url, provider);
        assert_eq!(out.code, 4, "{provider:?}: {out:#?}");
        assert!(
            out.stderr.contains("METADATA_INVALID")
                && out.stderr.contains("/computeMetadata/v1/instance/id")
                && out.stderr.contains("HTTP 404"),
            "{}",
            out.stderr
        );
        assert!(!root.exists("run/kiln/kubelet.env"));
    }
}

// --- OpenStack -------------------------------------------------------------------------

fn openstack_dir(case: &str) -> std::path::PathBuf {
    captured().join("openstack").join(case)
}

/// A Fedora CoreOS VM's config drive (served as Nova's metadata service serves the same
/// documents): meta_data.json for identity, the EC2 document for address and flavor.
#[test]
fn openstack_fcos_config_drive() {
    let root = Root::node("");
    dmi(&root, OPENSTACK_DMI);
    let srv = openstack(&openstack_dir("afterburn-configdrive-fcos"), None);
    both_ways(
        &root,
        "openstack",
        &srv.url,
        &want([
            "PROVIDER=openstack",
            "NODE_NAME=abai-fcos-afterburn-test",
            "NODE_IP=10.0.151.35",
            "INSTANCE_ID=b3c7f4de-da0b-44ae-a42c-fa3806b61d7f",
            "INSTANCE_TYPE=m1.small",
            "ZONE=nova",
            "REGION=",
            "PROVIDER_ID=openstack:///b3c7f4de-da0b-44ae-a42c-fa3806b61d7f",
        ]),
    );
}

/// The EC2-compatible `local-ipv4` of `0.0.0.0` some deployments serve (cloud-init's
/// capture): refused with the field named; network_data.json has no fixed address
/// (DHCP networks) in the config-drive capture, so the route to the API server answers.
#[test]
fn openstack_unspecified_local_ipv4_falls_back() {
    for case in ["cloudinit-metadata-service", "cloudinit-configdrive"] {
        let root = Root::node("");
        dmi(&root, OPENSTACK_DMI);
        let ec2_meta = if case == "cloudinit-metadata-service" {
            Some(load(
                "openstack/cloudinit-metadata-service/ec2/meta-data.json",
            ))
        } else {
            None
        };
        let srv = openstack(&openstack_dir(case), ec2_meta);
        let status = both_ways(
            &root,
            "openstack",
            &srv.url,
            &want([
                "PROVIDER=openstack",
                "NODE_NAME=sm-foo-test",
                "NODE_IP=127.0.0.1",
                "INSTANCE_ID=b0fa911b-69d4-4476-bbe2-1c92bff6535c",
                "INSTANCE_TYPE=m1.tiny",
                "ZONE=nova",
                "REGION=",
                "PROVIDER_ID=openstack:///b0fa911b-69d4-4476-bbe2-1c92bff6535c",
            ]),
        );
        if case == "cloudinit-metadata-service" {
            assert!(
                status.contains("meta-data/local-ipv4: refused 0.0.0.0 (unspecified address"),
                "{status}"
            );
        } else {
            assert!(srv
                .requests()
                .iter()
                .any(|r| r.route() == "/openstack/latest/network_data.json"));
        }
    }
}

/// A fixed address in network_data.json is the next source after a loopback `local-ipv4`.
#[test]
fn openstack_network_data_address_after_a_loopback_local_ipv4() {
    let root = Root::node("");
    dmi(&root, OPENSTACK_DMI);
    let dir = openstack_dir("cloudinit-configdrive");
    let mut ec2_meta = load("openstack/cloudinit-configdrive/ec2/latest/meta-data.json");
    set(
        &mut ec2_meta,
        "local-ipv4",
        Value::String("127.0.0.1".into()),
    );
    // The capture's networks are DHCP; give the second one a fixed address of each family.
    let tmp = Root::empty();
    let mut network = load("openstack/cloudinit-configdrive/openstack/latest/network_data.json");
    if let Value::Object(m) = &mut network {
        if let Some((_, Value::Array(nets))) = m.iter_mut().find(|(k, _)| k == "networks") {
            set(&mut nets[1], "type", Value::String("ipv4".into()));
            set(
                &mut nets[1],
                "ip_address",
                Value::String("10.20.0.9".into()),
            );
            set(&mut nets[2], "type", Value::String("ipv6".into()));
            set(
                &mut nets[2],
                "ip_address",
                Value::String("fd00:20::9".into()),
            );
        }
    }
    tmp.write(
        "openstack/latest/meta_data.json",
        &std::fs::read_to_string(dir.join("openstack/latest/meta_data.json")).unwrap(),
    );
    tmp.write("openstack/latest/network_data.json", &to_json(&network));
    let srv = openstack(&tmp.dir, Some(ec2_meta));
    root.node_env("IP_FAMILY=dual\n");
    let status = both_ways(
        &root,
        "openstack",
        &srv.url,
        &want([
            "PROVIDER=openstack",
            "NODE_NAME=sm-foo-test",
            "NODE_IP=10.20.0.9,fd00:20::9",
            "INSTANCE_ID=b0fa911b-69d4-4476-bbe2-1c92bff6535c",
            "INSTANCE_TYPE=m1.tiny",
            "ZONE=nova",
            "REGION=",
            "PROVIDER_ID=openstack:///b0fa911b-69d4-4476-bbe2-1c92bff6535c",
        ]),
    );
    assert!(
        status.contains("meta-data/local-ipv4: refused 127.0.0.1 (loopback address"),
        "{status}"
    );
}

/// Minimal documents: a config drive with only `uuid` (the UUID names the node), and a
/// 2012-08-10 metadata-service answer with no EC2 leaves; the route gives the address.
#[test]
fn openstack_minimal_documents() {
    for (case, lines) in [
        (
            "afterburn-configdrive2-uuid-only",
            want([
                "PROVIDER=openstack",
                "NODE_NAME=b3f43d9c-9198-4cd4-ac9f-bed14960794b",
                "NODE_IP=127.0.0.1",
                "INSTANCE_ID=b3f43d9c-9198-4cd4-ac9f-bed14960794b",
                "INSTANCE_TYPE=",
                "ZONE=",
                "REGION=",
                "PROVIDER_ID=openstack:///b3f43d9c-9198-4cd4-ac9f-bed14960794b",
            ]),
        ),
        (
            "afterburn-metadata-2012-08-10",
            want([
                "PROVIDER=openstack",
                "NODE_NAME=mule",
                "NODE_IP=127.0.0.1",
                "INSTANCE_ID=99dcf33b-6eb5-4acf-9abb-d81723e0c949",
                "INSTANCE_TYPE=",
                "ZONE=nova",
                "REGION=",
                "PROVIDER_ID=openstack:///99dcf33b-6eb5-4acf-9abb-d81723e0c949",
            ]),
        ),
    ] {
        let root = Root::node("");
        dmi(&root, OPENSTACK_DMI);
        let srv = openstack(&openstack_dir(case), None);
        both_ways(&root, "openstack", &srv.url, &lines);
    }
}

// --- Detection -------------------------------------------------------------------------

/// Each captured DMI set, alone under `--root` with PROVIDER=auto, picks AWS (and so asks
/// IMDS, which answers here).
#[test]
fn every_captured_aws_dmi_is_detected() {
    for case in [
        "aws/xen-t2-dmi-4.2.amazon",
        "aws/xen-dmi-4.11.amazon",
        "aws/nitro-t4g-dmi",
    ] {
        let root = Root::node("");
        dmi_capture(&root, case);
        let srv = ec2(load(T2_SMALL), "127.0.0.1:0");
        let out = run(&root, &srv.url, None);
        assert_eq!(out.code, 0, "{case}: {out:#?}");
        assert!(root
            .read("run/kiln/kubelet.env")
            .starts_with("KILN_CONTRACT=1\nPROVIDER=aws\n"));
    }
}

/// A Xen guest whose BIOS says `.amazon` but whose UUIDs do not start with `ec2`: PROVIDER=auto
/// stops, naming the marker and every DMI value; PROVIDER=none boots it.
#[test]
fn a_partial_aws_marker_stops_auto_and_none_is_explicit() {
    let root = Root::node("");
    dmi(
        &root,
        &[
            ("sys_vendor", "Xen"),
            ("product_name", "HVM domU"),
            ("bios_version", "4.11.amazon"),
            ("product_uuid", "5a0e3b5c-77d4-4c62-9a8e-0c9b6d1e2f30"),
        ],
    );
    root.write("etc/hostname", "xen-guest-1\n");
    let srv = Server::start(|_| status(500));
    let out = run(&root, &srv.url, None);
    assert_eq!(out.code, 4, "{out:#?}");
    for needle in [
        "PROVIDER_UNKNOWN",
        "AWS's markers (bios_version=\"4.11.amazon\")",
        "product_uuid=\"5a0e3b5c-77d4-4c62-9a8e-0c9b6d1e2f30\"",
    ] {
        assert!(out.stderr.contains(needle), "{needle}: {}", out.stderr);
    }
    assert!(!root.exists("run/kiln/kubelet.env"));
    assert!(srv.requests().is_empty(), "detection is offline");

    root.node_env("PROVIDER=none\n");
    let out = run(&root, &srv.url, None);
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
}

/// A cloud kiln recognises but has no source for (Alibaba) stops auto with the cloud named.
#[test]
fn recognised_unsupported_clouds_stop_auto() {
    let root = Root::node("");
    dmi(&root, &[("product_name", "Alibaba Cloud ECS")]);
    let out = run(&root, "http://127.0.0.1:9", None);
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("PROVIDER_UNKNOWN")
            && out.stderr.contains("DMI names Alibaba Cloud")
            && out.stderr.contains("PROVIDER=none"),
        "{}",
        out.stderr
    );
}

/// Unknown hardware boots as `none`, never silently: a warning naming the DMI values on
/// stderr, the console and in status.json.
#[test]
fn auto_none_warns_with_the_dmi_values() {
    let root = Root::node("");
    dmi(
        &root,
        &[
            ("sys_vendor", "Dell Inc."),
            ("product_name", "PowerEdge R640"),
        ],
    );
    root.write("etc/hostname", "metal-07\n");
    let out = run(&root, "http://127.0.0.1:9", None);
    assert_eq!(out.code, 0, "{out:#?}");
    let needle = "PROVIDER=auto found no known platform in DMI (sys_vendor=\\\"Dell Inc.\\\" product_name=\\\"PowerEdge R640\\\")";
    let status = root.read("run/kiln/status.json");
    assert!(status.contains(needle), "{status}");
    assert!(status.contains("\"warnings\":["), "{status}");
    assert!(
        root.read("console.log")
            .contains("kiln-firstboot: warning: PROVIDER=auto found no known platform"),
        "{}",
        root.read("console.log")
    );
    assert!(
        out.stderr.contains("warning: PROVIDER=auto"),
        "{}",
        out.stderr
    );
    assert!(root
        .read("run/kiln/kubelet.env")
        .contains("PROVIDER=none\n"));
}

/// Hostile metadata: an Azure answer with 200 interfaces of unusable addresses before a good
/// one. The good one is found; status.json keeps 8 warnings, and stderr says once that the
/// rest are not shown instead of printing 200 lines.
#[test]
fn a_flood_of_unusable_addresses_is_capped() {
    let root = Root::node("");
    dmi(&root, AZURE_DMI);
    let mut doc = load("azure/walinuxagent-valid/instance.json");
    let mut nics = Vec::new();
    for i in 0..200 {
        let mut nic = Value::Object(vec![]);
        let ip = if i % 2 == 0 { "0.0.0.0" } else { "ff02::1" };
        let family = if i % 2 == 0 { "ipv4" } else { "ipv6" };
        let mut addr = Value::Object(vec![]);
        set(&mut addr, "privateIpAddress", Value::String(ip.into()));
        set(
            &mut nic,
            &format!("{family}/ipAddress"),
            Value::Array(vec![addr]),
        );
        nics.push(nic);
    }
    let mut good = Value::Object(vec![]);
    set(
        &mut good,
        "privateIpAddress",
        Value::String("10.0.1.4".into()),
    );
    let mut nic = Value::Object(vec![]);
    set(&mut nic, "ipv4/ipAddress", Value::Array(vec![good]));
    nics.push(nic);
    set(&mut doc, "network/interface", Value::Array(nics));
    let srv = azure(doc);
    let out = run(&root, &srv.url, Some("azure"));
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(root
        .read("run/kiln/kubelet.env")
        .contains("NODE_IP=10.0.1.4\n"));
    let lines = out
        .stderr
        .lines()
        .filter(|l| l.contains("warning:"))
        .count();
    assert_eq!(lines, 9, "{}", out.stderr);
    assert!(out
        .stderr
        .contains("more than 8 warnings: the rest are not shown"));
    let status = root.read("run/kiln/status.json");
    assert_eq!(status.matches("refused").count(), 8, "{status}");
}
