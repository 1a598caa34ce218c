//! The providers' report-back channels against local stand-ins: a recording
//! `vmware-rpctool`, a loopback metadata server taking the GCP guest-attribute PUT, and a KVP
//! pool file checked against the Hyper-V record layout (512-byte key, 2048-byte value,
//! NUL-padded).

// These tests play systemctl, kubeadm and friends with /bin/sh stand-ins and check Unix
// modes; the Windows build is tested under Wine by tests/windows.rs (make test-windows).
#![cfg(unix)]

use crate::common;

use std::path::{Path, PathBuf};

use common::{ok, status, Root, Server};
use kiln_firstboot::provider::{self, azure, gcp, ChannelError, Provider, ReportTarget};
use kiln_firstboot::redact::{Redacted, Redactor};

/// The channels take only redacted text.
fn redacted(s: &str) -> Redacted {
    Redactor::shapes_only().redact(s)
}

/// Publishes `json` through `p`'s report-back channel.
fn report(p: Provider, to: &ReportTarget, json: &str) -> Result<(), ChannelError> {
    provider::source(p).report_back(to, &redacted(json))
}

fn target(root: &Path, base_url: Option<&str>, rpctool: &str) -> ReportTarget {
    ReportTarget {
        root: root.to_path_buf(),
        base_url: base_url.map(str::to_string),
        rpctool: PathBuf::from(rpctool),
    }
}

const STATUS: &str = "{\"kiln_contract\":1,\"result\":\"failure\",\"reason\":\"API_X509\",\"message\":\"kubelet: x509: certificate signed by unknown authority\"}";

#[test]
fn vmware_sets_guestinfo_through_rpctool() {
    let root = Root::empty();
    let tool = root.stub("vmware-rpctool", "exit 0");
    let to = target(&root.dir, None, &tool);
    report(Provider::Vmware, &to, STATUS).unwrap();
    assert_eq!(
        root.calls("vmware-rpctool"),
        [format!("info-set guestinfo.kiln.status {STATUS}")]
    );
    // A tool that fails is reported, not fatal.
    let bad = root.stub("bad-rpctool", "echo 'Permission denied' >&2; exit 1");
    let err = report(Provider::Vmware, &target(&root.dir, None, &bad), STATUS).unwrap_err();
    assert!(err.to_string().contains("Permission denied"), "{err}");
}

#[test]
fn gcp_puts_the_guest_attribute() {
    let srv = Server::start(|r| {
        if r.method == "PUT" && r.header("metadata-flavor") == Some("Google") {
            ok("")
        } else {
            status(403)
        }
    });
    let to = target(Path::new("/"), Some(&srv.url), "");
    report(Provider::Gcp, &to, STATUS).unwrap();
    let reqs = srv.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].method, "PUT");
    assert_eq!(
        reqs[0].path,
        "/computeMetadata/v1/instance/guest-attributes/kiln/status"
    );
    // A base URL given with the API prefix lands on the same path.
    let to = target(
        Path::new("/"),
        Some(&format!("{}/computeMetadata/v1/", srv.url)),
        "",
    );
    report(Provider::Gcp, &to, STATUS).unwrap();
    assert_eq!(srv.requests()[1].path, reqs[0].path);

    // Guest attributes disabled: the server says 403 and the error says what to enable.
    let off = Server::start(|_| status(403));
    let errs = gcp::put_status(&off.url, &redacted(STATUS)).unwrap_err();
    assert!(errs.to_string().contains("answered 403"), "{errs}");
    assert!(
        errs.to_string().contains("enable-guest-attributes"),
        "{errs}"
    );
}

#[test]
fn gcp_body_is_the_status() {
    use std::io::{Read, Write};
    // A raw listener, to see the exact bytes of the PUT.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let h = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut buf = Vec::new();
        let mut b = [0u8; 4096];
        loop {
            let n = c.read(&mut b).unwrap();
            buf.extend_from_slice(&b[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            if let Some(i) = text.find("\r\n\r\n") {
                if text.len() >= i + 4 + STATUS.len() {
                    break;
                }
            }
            if n == 0 {
                break;
            }
        }
        c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
        String::from_utf8(buf).unwrap()
    });
    gcp::put_status(&url, &redacted(STATUS)).unwrap();
    let req = h.join().unwrap();
    assert!(
        req.starts_with(
            "PUT /computeMetadata/v1/instance/guest-attributes/kiln/status HTTP/1.1\r\n"
        ),
        "{req}"
    );
    assert!(req.contains("\r\nMetadata-Flavor: Google\r\n"), "{req}");
    assert!(
        req.contains(&format!("\r\nContent-Length: {}\r\n", STATUS.len())),
        "{req}"
    );
    assert!(req.ends_with(&format!("\r\n\r\n{STATUS}")), "{req}");
}

/// One raw record, built by hand from the documented layout.
fn raw_record(key: &str, value: &str) -> Vec<u8> {
    let mut r = vec![0u8; 2560];
    r[..key.len()].copy_from_slice(key.as_bytes());
    r[512..512 + value.len()].copy_from_slice(value.as_bytes());
    r
}

#[test]
fn azure_kvp_records_follow_the_pool_layout() {
    let root = Root::empty();
    let pool = root.path("var/lib/hyperv/.kvp_pool_1");
    // Another writer's record (cloud-init style) is already there.
    let foreign = raw_record(
        "CLOUD_INIT|1|finish|init-network|abc",
        "{\"result\":\"SUCCESS\"}",
    );
    root.write_bytes("var/lib/hyperv/.kvp_pool_1", &foreign);

    // A status longer than the host reads from one value (3011 bytes): split in pieces of at
    // most 1022 bytes, never inside a character.
    let long = format!("{{\"log\":\"{}\"}}", "é".repeat(1500));
    let to = target(&root.dir, None, "");
    report(Provider::Azure, &to, &long).unwrap();
    let bytes = std::fs::read(&pool).unwrap();
    assert_eq!(bytes.len() % 2560, 0, "{} bytes", bytes.len());
    // The foreign record is untouched, byte for byte, in first place.
    assert_eq!(&bytes[..2560], &foreign[..]);
    let recs = azure::kvp_parse(&bytes);
    let keys: Vec<&str> = recs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "CLOUD_INIT|1|finish|init-network|abc",
            "KILN_STATUS",
            "KILN_STATUS|0",
            "KILN_STATUS|1",
            "KILN_STATUS|2"
        ]
    );
    assert_eq!(recs[1].1, "3");
    for (k, v) in &recs[2..] {
        assert!(v.len() <= 1022 && v.len() > 900, "{k}: {} bytes", v.len());
    }
    // Every field is NUL-padded to its fixed size.
    for r in bytes.chunks(2560) {
        let klen = r[..512].iter().position(|&b| b == 0).unwrap();
        assert!(r[klen..512].iter().all(|&b| b == 0));
        let vlen = r[512..].iter().position(|&b| b == 0).unwrap();
        assert!(r[512 + vlen..].iter().all(|&b| b == 0));
    }
    assert_eq!(
        azure::kvp_read_status(&pool, "KILN_STATUS").as_deref(),
        Some(long.as_str())
    );

    // A second publish replaces kiln's records instead of piling them up.
    report(Provider::Azure, &to, STATUS).unwrap();
    let recs = azure::kvp_parse(&std::fs::read(&pool).unwrap());
    assert_eq!(recs.len(), 3, "{recs:?}");
    assert_eq!(recs[0].0, "CLOUD_INIT|1|finish|init-network|abc");
    assert_eq!(
        azure::kvp_read_status(&pool, "KILN_STATUS").as_deref(),
        Some(STATUS)
    );
}

#[test]
fn aws_and_the_others_have_no_channel_but_the_console() {
    // Every channel a provider could use is there and records what reaches it: a tool, a
    // metadata server and a root for the KVP pool. None of them may be touched.
    let root = Root::empty();
    let tool = root.stub("vmware-rpctool", "exit 0");
    let srv = Server::start(|_| ok(""));
    let to = target(&root.dir, Some(&srv.url), &tool);
    for p in [
        Provider::Aws,
        Provider::Openstack,
        Provider::Qemu,
        Provider::None,
    ] {
        report(p, &to, STATUS).unwrap();
    }
    assert!(root.calls("vmware-rpctool").is_empty());
    assert!(srv.requests().is_empty());
    assert!(!root.path("var/lib/hyperv").exists());
}
