//! The platforms of issue 40, through the real binary: Hetzner, DigitalOcean, Oracle Cloud,
//! Akamai and Scaleway from the documents other projects captured (`fixtures/captured/`,
//! each with its SOURCE.txt), IBM Cloud VPC from its documented field names
//! (`fixtures/ibmcloud/`), each served on loopback with the service's header and token
//! rules; config drives and NoCloud seeds as directories (`--metadata-url DIR`), over HTTP
//! (`ds=nocloud;s=http://…/`), and hostile ones. The mount itself runs in the boot scenarios
//! (`qemu-tests`, `nocloud_volume`, `config_drive`).

#![cfg(unix)]

#[path = "common/captured.rs"]
mod captured;
use crate::common;

use captured::*;
use common::*;

/// `dir`'s files by request path; a path ending in `/` is its `index.json`; `need` is a
/// header every request must carry (else 401, as Oracle's v2 endpoints answer).
fn files(dir: &str, need: Option<(&'static str, &'static str)>) -> Server {
    let base = captured().join(dir);
    Server::start(move |r: &Req| {
        if let Some((k, v)) = need {
            if r.header(k) != Some(v) {
                return Reply::status(401);
            }
        }
        let route = r.route();
        let rel = match route.strip_suffix('/') {
            Some(d) => format!("{d}/index.json"),
            None => route.to_string(),
        };
        fixture_reply(
            &base,
            &[],
            &Req {
                path: rel,
                ..r.clone()
            },
        )
    })
}

fn hetzner(serial: &str) -> (Root, Server) {
    let root = Root::node("");
    dmi(
        &root,
        &[("sys_vendor", "Hetzner"), ("product_serial", serial)],
    );
    let dir = captured().join("hetzner/afterburn-metadata");
    let srv = Server::start(move |r: &Req| {
        let file = match r.route() {
            "/hetzner/v1/metadata" => "metadata.yaml",
            "/hetzner/v1/metadata/private-networks" => "private-networks.yaml",
            _ => return Reply::status(404),
        };
        ok(&std::fs::read_to_string(dir.join(file)).unwrap())
    });
    (root, srv)
}

/// Hetzner's YAML: the private network's address first (the CCM's InternalIP), the location
/// as region (not the network zone `eu-central`), `hcloud://<id>`.
#[test]
fn hetzner_yaml_metadata_and_private_networks() {
    let (root, srv) = hetzner("42");
    both_ways(
        &root,
        "hetzner",
        &srv.url,
        &want([
            "PROVIDER=hetzner",
            "NODE_NAME=my-server",
            "NODE_IP=10.0.0.2",
            "INSTANCE_ID=42",
            "INSTANCE_TYPE=",
            "ZONE=hel1-dc2",
            "REGION=hel1",
            "PROVIDER_ID=hcloud://42",
        ]),
    );
}

/// cloud-init's Hetzner check: a service whose instance ID is not the DMI serial is another
/// server's, and is refused with both named.
#[test]
fn hetzner_refuses_an_answer_for_another_server() {
    let (root, srv) = hetzner("4711");
    let out = run(&root, &srv.url, Some("hetzner"));
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("METADATA_INVALID")
            && out
                .stderr
                .contains("\"42\" differs from DMI product_serial \"4711\""),
        "{}",
        out.stderr
    );
}

#[test]
fn digitalocean_droplets() {
    let root = Root::node("DigitalOcean");
    let srv = files("digitalocean/cloudinit-droplet", None);
    both_ways(
        &root,
        "digitalocean",
        &srv.url,
        &want([
            "PROVIDER=digitalocean",
            "NODE_NAME=utl-96268",
            "NODE_IP=10.132.6.205",
            "INSTANCE_ID=22532410",
            "INSTANCE_TYPE=",
            "ZONE=",
            "REGION=nyc3",
            "PROVIDER_ID=digitalocean://22532410",
        ]),
    );
    // The id as a JSON number, and no private interface: the public address.
    let srv = files("digitalocean/cloudinit-droplet-public-only", None);
    let out = run(&root, &srv.url, None);
    assert_eq!(out.code, 0, "{out:#?}");
    let env = root.read("run/kiln/kubelet.env");
    for l in [
        "NODE_IP=203.0.113.20",
        "INSTANCE_ID=27223699",
        "PROVIDER_ID=digitalocean://27223699",
    ] {
        assert!(identity(&env).contains(&l.to_string()), "{l}\n{env}");
    }
}

#[test]
fn oracle_cloud_with_its_header() {
    let root = Root::node("");
    dmi(&root, &[("chassis_asset_tag", "OracleCloud.com")]);
    let srv = files(
        "oraclecloud/cloudinit-vm-standard2",
        Some(("authorization", "Bearer Oracle")),
    );
    let id = "ocid1.instance.oc1.phx.anyhqljtniwq6syc3nex55sep5w34qbwmw6TRUNCATED";
    let status = both_ways(
        &root,
        "oraclecloud",
        &srv.url,
        &want([
            "PROVIDER=oraclecloud",
            "NODE_NAME=instance-20200320-1400",
            "NODE_IP=10.0.0.183",
            &format!("INSTANCE_ID={id}"),
            "INSTANCE_TYPE=VM.Standard2.1",
            "ZONE=PHX-AD-1",
            "REGION=phx",
            &format!("PROVIDER_ID=oci://{id}"),
        ]),
    );
    assert!(status.contains("\"provider\":\"oraclecloud\""), "{status}");
}

/// Linode's token: `PUT /v1/token` with its expiry header, then every GET with
/// `Metadata-Token` (else 401) and `Accept: application/json` (else the text format).
#[test]
fn akamai_token_then_json() {
    const T: &str = "akamai-captured-session-token-0123456789";
    let root = Root::node("Linode");
    let base = captured().join("akamai/afterburn-mock");
    let srv = Server::start(move |r: &Req| match (r.method.as_str(), r.route()) {
        ("PUT", "/v1/token") if r.header("metadata-token-expiry-seconds").is_some() => ok(T),
        ("PUT", _) => Reply::status(400),
        (_, route) if r.header("metadata-token") != Some(T) => {
            let _ = route;
            Reply::status(401)
        }
        _ if r.header("accept") != Some("application/json") => ok("id: 12345678\n"),
        _ => fixture_reply(&base, &[], r),
    });
    let status = both_ways(
        &root,
        "akamai",
        &srv.url,
        &want([
            "PROVIDER=akamai",
            "NODE_NAME=my-linode",
            "NODE_IP=192.168.1.1",
            "INSTANCE_ID=12345678",
            "INSTANCE_TYPE=g6-nanode-1",
            "ZONE=",
            "REGION=us-ord",
            "PROVIDER_ID=linode://12345678",
        ]),
    );
    assert!(!status.contains(T), "{status}");
}

/// IBM Cloud VPC: no DMI rule (cloud-init and afterburn have none), so only an explicit
/// provider; an instance identity token, then the instance with `Authorization: Bearer`.
#[test]
fn ibmcloud_identity_token_then_instance() {
    const T: &str = "eyJhbGciOiJSUzI1NiJ9.kiln-ibm-test-token.c2ln";
    let root = Root::node("");
    let base = fixtures().join("ibmcloud");
    let srv = Server::start(move |r: &Req| {
        let versioned = r.path.ends_with("?version=2022-03-01");
        match (r.method.as_str(), r.route()) {
            ("PUT", "/instance_identity/v1/token")
                if versioned && r.header("metadata-flavor") == Some("ibm") =>
            {
                ok(&format!(
                    "{{\"access_token\":\"{T}\",\"created_at\":\"2026-11-29T10:00:00Z\",\"expires_at\":\"2026-11-29T10:05:00Z\",\"expires_in\":300}}"
                ))
            }
            ("PUT", _) => Reply::status(400),
            _ if r.header("authorization") != Some(&format!("Bearer {T}")) => Reply::status(401),
            _ if !versioned => Reply::status(400),
            _ => fixture_reply(&base, &[], r),
        }
    });
    let out = run(&root, &srv.url, Some("ibmcloud"));
    assert_eq!(out.code, 0, "{out:#?}");
    let id = "0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0";
    assert_eq!(
        identity(&root.read("run/kiln/kubelet.env")),
        want([
            "PROVIDER=ibmcloud",
            "NODE_NAME=kiln-worker-3",
            "NODE_IP=10.240.0.4",
            &format!("INSTANCE_ID={id}"),
            "INSTANCE_TYPE=bx2-4x16",
            "ZONE=us-south-1",
            "REGION=us-south",
            &format!("PROVIDER_ID=ibm://aa2432b1fa4d4ace891e9b80fc104e34///test/{id}"),
        ])
    );
    assert!(!root.read("run/kiln/status.json").contains(T));
}

#[test]
fn scaleway_conf_json() {
    let root = Root::node("Scaleway");
    let base = captured().join("scaleway/afterburn-mock");
    let srv = Server::start(move |r: &Req| match r.path.as_str() {
        "/conf?format=json" => fixture_reply(&base, &[], r),
        _ => Reply::status(404),
    });
    let id = "11111111-1111-1111-1111-111111111111";
    both_ways(
        &root,
        "scaleway",
        &srv.url,
        &want([
            "PROVIDER=scaleway",
            "NODE_NAME=frontend-0",
            "NODE_IP=10.0.0.2",
            &format!("INSTANCE_ID={id}"),
            "INSTANCE_TYPE=GP1-M",
            "ZONE=fr-par-1",
            "REGION=fr-par",
            &format!("PROVIDER_ID=scaleway://instance/fr-par-1/{id}"),
        ]),
    );
}

/// A missing instance ID, and one of the wrong type, are refused naming the field.
#[test]
fn documents_without_a_usable_id_are_refused() {
    let root = Root::node("DigitalOcean");
    for body in [
        "{\"hostname\": \"a\"}",
        "{\"droplet_id\": {\"n\": 1}}",
        "{\"droplet_id\": null}",
    ] {
        let b = body.to_string();
        let srv = Server::start(move |_: &Req| ok(&b));
        let out = run(&root, &srv.url, None);
        assert_eq!(out.code, 4, "{body}: {out:#?}");
        assert!(
            out.stderr.contains("METADATA_INVALID")
                && out.stderr.contains("expected the instance ID (droplet_id)"),
            "{}",
            out.stderr
        );
    }
}

// --- Volumes ----------------------------------------------------------------------------

/// Marks a volume as attached for `auto` (udev's label link; its target is not read when
/// `--metadata-url` names the files).
fn label(root: &Root, l: &str) {
    root.write(&format!("dev/disk/by-label/{l}"), "");
}

/// Nova's config drive, read as files: the same identity the metadata service gives, with
/// no provider ID (the cloud controller sets its own).
#[test]
fn config_drive_captures() {
    let root = Root::node("");
    label(&root, "config-2");
    let dir = captured().join("openstack/afterburn-configdrive-fcos");
    both_ways(
        &root,
        "configdrive",
        dir.to_str().unwrap(),
        &want([
            "PROVIDER=configdrive",
            "NODE_NAME=abai-fcos-afterburn-test",
            "NODE_IP=10.0.151.35",
            "INSTANCE_ID=b3c7f4de-da0b-44ae-a42c-fa3806b61d7f",
            "INSTANCE_TYPE=m1.small",
            "ZONE=nova",
            "REGION=",
            "PROVIDER_ID=",
        ]),
    );
}

#[test]
fn nocloud_seeds() {
    for (case, name, ip) in [
        (
            "afterburn-kubevirt-v2",
            "test-nocloud-v2.foo.cloud",
            "192.168.1.10",
        ),
        (
            "afterburn-kubevirt-v1",
            "test-nocloud-v1.foo.cloud",
            "192.168.1.10",
        ),
        // Proxmox names the VM only in user-data, which firstboot does not read (it holds
        // the node's secrets): the instance ID is the name, the route the address.
        (
            "afterburn-proxmoxve-dhcp-dual",
            "15a9919cb91024fbd1d70fa07f0efa749cbba03b",
            "127.0.0.1",
        ),
    ] {
        let root = Root::node("");
        label(&root, "CIDATA");
        let dir = captured().join("nocloud").join(case);
        let out = run(&root, dir.to_str().unwrap(), None);
        assert_eq!(out.code, 0, "{case}: {out:#?}");
        let env = root.read("run/kiln/kubelet.env");
        let id = identity(&env);
        assert_eq!(id[0], "PROVIDER=nocloud", "{case}");
        assert_eq!(id[1], format!("NODE_NAME={name}"), "{case}");
        assert_eq!(id[2], format!("NODE_IP={ip}"), "{case}");
        assert_eq!(id[7], "PROVIDER_ID=", "{case}");
    }
}

/// cloud-init's `ds=nocloud` on the kernel command line: `i=`/`h=` beat `meta-data`, and
/// `s=http://…/` is a seed served over HTTP. An `https://` seed is refused by name.
#[test]
fn nocloud_from_the_kernel_command_line() {
    let root = Root::node("");
    let dir = captured().join("nocloud/afterburn-kubevirt-v2");
    let srv = Server::start(move |r: &Req| match r.route().strip_prefix("/seed/") {
        Some(f) => match std::fs::read_to_string(dir.join(f)) {
            Ok(s) => ok(&s),
            Err(_) => Reply::status(404),
        },
        None => Reply::status(404),
    });
    root.write(
        "proc/cmdline",
        &format!(
            "console=ttyS0 ds=nocloud;s={}/seed/;i=iid-from-cmdline;h=node-from-cmdline quiet\n",
            srv.url
        ),
    );
    let mut args = vec!["--no-start", "--deadline", "10"];
    let out = firstboot(&root, &args);
    assert_eq!(out.code, 0, "{out:#?}");
    let id = identity(&root.read("run/kiln/kubelet.env"));
    assert_eq!(
        &id[..4],
        [
            "PROVIDER=nocloud",
            "NODE_NAME=node-from-cmdline",
            "NODE_IP=192.168.1.10",
            "INSTANCE_ID=iid-from-cmdline"
        ]
    );
    root.write("proc/cmdline", "ds=nocloud;s=https://seed.example/\n");
    args.extend(["--provider", "nocloud"]);
    let out = firstboot(&root, &args);
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(out.stderr.contains("no TLS client"), "{}", out.stderr);
}

/// Hostile volumes: a symlink out of the volume (file or directory), a FIFO, an endless
/// file, a YAML alias; each refused naming the file, none followed, none blocking.
#[test]
fn hostile_volumes_are_refused() {
    let root = Root::node("");
    let seed = Root::empty();
    type Make<'a> = &'a dyn Fn(&std::path::Path);
    let cases: [(&str, Make<'_>, &str); 5] = [
        (
            "nocloud",
            &|d| std::os::unix::fs::symlink("/etc/shadow", d.join("meta-data")).unwrap(),
            "expected a regular file",
        ),
        (
            "configdrive",
            &|d| std::os::unix::fs::symlink("/etc", d.join("openstack")).unwrap(),
            "symbolic link",
        ),
        (
            "nocloud",
            &|d| {
                let st = std::process::Command::new("mkfifo")
                    .arg(d.join("meta-data"))
                    .status()
                    .unwrap();
                assert!(st.success());
            },
            "expected a regular file",
        ),
        (
            "nocloud",
            &|d| {
                let big = format!("instance-id: a\npad: {}\n", "x".repeat(300 * 1024));
                std::fs::write(d.join("meta-data"), big).unwrap();
            },
            "expected at most 262144 bytes",
        ),
        (
            "nocloud",
            &|d| std::fs::write(d.join("meta-data"), "x: &a secret\ninstance-id: *a\n").unwrap(),
            "line 1: anchors, aliases and tags are not read",
        ),
    ];
    for (i, (provider, make, want)) in cases.iter().enumerate() {
        let d = seed.path(&format!("case{i}"));
        std::fs::create_dir_all(&d).unwrap();
        make(&d);
        let out = run(&root, d.to_str().unwrap(), Some(provider));
        assert_eq!(out.code, 4, "case {i}: {out:#?}");
        assert!(
            out.stderr.contains(want) && !out.stderr.contains("secret"),
            "case {i}: {}",
            out.stderr
        );
    }
}

/// `PROVIDER=nocloud` with no volume, seed or directory: unreachable, naming the labels.
#[test]
fn a_named_volume_that_is_not_there() {
    let root = Root::node("");
    let out = firstboot(
        &root,
        &["--no-start", "--deadline", "10", "--provider", "nocloud"],
    );
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("METADATA_UNREACHABLE")
            && out
                .stderr
                .contains("expected a volume labelled cidata or CIDATA"),
        "{}",
        out.stderr
    );
}
