//! Metadata captured from real instances by other projects (`fixtures/captured/<cloud>/<case>/`,
//! each with its SOURCE.txt), served on loopback the way each service serves it: EC2's
//! IMDSv2 token rules and text tree, GCE's `Metadata-Flavor` in both directions and its
//! kebab-case leaves over the camelCase recursive document, Azure's `Metadata: true` rule and
//! its 400 answer, OpenStack's JSON documents beside EC2-compatible leaves.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kiln_firstboot::json::{self, Value};

use kiln_firstboot::standin::aws_imdsv2;

use crate::common::{firstboot, fixtures, Outcome, Reply, Req, Root, Server};

/// `fixtures/captured/`.
pub fn captured() -> PathBuf {
    fixtures().join("captured")
}

/// A captured JSON file, parsed.
pub fn load(rel: &str) -> Value {
    let p = captured().join(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    json::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `base` with `top`'s members added (replacing same-named ones), recursively for objects.
pub fn merge(base: Value, top: Value) -> Value {
    match (base, top) {
        (Value::Object(mut a), Value::Object(b)) => {
            for (k, v) in b {
                match a.iter().position(|(ak, _)| *ak == k) {
                    Some(i) => {
                        let old = std::mem::replace(&mut a[i].1, Value::Null);
                        a[i].1 = merge(old, v);
                    }
                    None => a.push((k, v)),
                }
            }
            Value::Object(a)
        }
        (_, top) => top,
    }
}

/// `v` as compact JSON.
pub fn to_json(v: &Value) -> String {
    let mut out = String::new();
    write_json(&mut out, v);
    out
}

fn write_json(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(n),
        Value::String(s) => json::write_str(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(out, item);
            }
            out.push(']');
        }
        Value::Object(members) => {
            out.push('{');
            for (i, (k, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json::write_str(out, k);
                out.push(':');
                write_json(out, item);
            }
            out.push('}');
        }
    }
}

/// Replaces the member at `path` (`/`-separated object keys) with `value`.
pub fn set(v: &mut Value, path: &str, value: Value) {
    let mut cur = v;
    let keys: Vec<&str> = path.split('/').collect();
    for (i, k) in keys.iter().enumerate() {
        let Value::Object(members) = cur else {
            panic!("{path}: {k} is not in an object")
        };
        let at = match members.iter().position(|(mk, _)| mk == k) {
            Some(at) => at,
            None => {
                members.push((k.to_string(), Value::Object(vec![])));
                members.len() - 1
            }
        };
        if i + 1 == keys.len() {
            members[at].1 = value;
            return;
        }
        cur = &mut members[at].1;
    }
}

/// The node at `path` (`/`-separated; array items by index), with `key` mapping a path
/// segment to the document's member name.
fn lookup<'a>(root: &'a Value, path: &str, key: &dyn Fn(&str) -> String) -> Option<&'a Value> {
    let mut cur = root;
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        cur = match cur {
            Value::Object(m) => {
                let k = key(seg);
                &m.iter().find(|(mk, _)| *mk == k || mk == seg)?.1
            }
            Value::Array(items) => items.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// A tree node as a metadata server's text: a leaf's value; a list's items one per line; an
/// object's member names one per line, sub-trees with a trailing `/`. `null` is absent.
fn tree_text(v: &Value) -> Option<String> {
    Some(match v {
        Value::Null => return None,
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.clone(),
        Value::String(s) => s.clone(),
        Value::Array(items) => items
            .iter()
            .filter_map(tree_text)
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                Value::Object(_) => format!("{k}/"),
                _ => k.clone(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
    })
}

fn hdrs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The IMDSv2 token this server hands out.
pub const EC2_TOKEN: &str = "AQAEAK-captured-test-token==";

/// EC2 IMDSv2 serving `meta_data` (the `meta-data/` tree) on `bind` (`127.0.0.1:0` or
/// `[::1]:0`): the stand-in's token protocol ([`aws_imdsv2`]: a token from a PUT with a TTL
/// header, then GETs carrying it, 401 without), `text/plain` leaves, 404 for anything
/// absent.
pub fn ec2(meta_data: Value, bind: &str) -> Server {
    let h = hdrs(&[("Content-Type", "text/plain"), ("Server", "EC2ws")]);
    let answer = move |r: &Req| {
        let Some(path) = r.route().strip_prefix("/latest/meta-data/") else {
            return Reply::Http(404, h.clone(), b"Not Found".to_vec());
        };
        match lookup(&meta_data, path, &|s| s.to_string()).and_then(tree_text) {
            Some(text) => Reply::Http(200, h.clone(), text.into_bytes()),
            None => Reply::Http(404, h.clone(), b"Not Found".to_vec()),
        }
    };
    Server::start_on(bind, aws_imdsv2(EC2_TOKEN.to_string(), answer))
}

/// `network-interfaces` → `networkInterfaces`: the recursive document's member names.
fn camel(seg: &str) -> String {
    let mut out = String::with_capacity(seg.len());
    let mut up = false;
    for c in seg.chars() {
        if c == '-' {
            up = true;
        } else if up {
            out.push(c.to_ascii_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The GCE metadata server playing a `?recursive=true` capture: leaves under
/// `/computeMetadata/v1/` by their kebab-case names, only for requests with
/// `Metadata-Flavor: Google` (403 without, as the real server), every answer carrying the
/// header back.
pub fn gce(recursive: Value) -> Server {
    let h = hdrs(&[
        ("Metadata-Flavor", "Google"),
        ("Content-Type", "application/text"),
        ("Server", "Metadata Server for VM"),
    ]);
    Server::start(move |r: &Req| {
        if r.header("metadata-flavor") != Some("Google") {
            return Reply::Http(
                403,
                h.clone(),
                b"Missing Metadata-Flavor:Google header.".to_vec(),
            );
        }
        let Some(path) = r.route().strip_prefix("/computeMetadata/v1/") else {
            return Reply::Http(404, h.clone(), b"Not Found".to_vec());
        };
        match lookup(&recursive, path, &camel).and_then(tree_text) {
            Some(text) => Reply::Http(200, h.clone(), text.into_bytes()),
            None => Reply::Http(404, h.clone(), b"Not Found".to_vec()),
        }
    })
}

/// What Azure IMDS answers without `Metadata: true` (captured on an AKS node, see
/// `azure/aks-vmss-nodepool1-capture/SOURCE.txt`).
pub const AZURE_NO_HEADER: &str =
    "{ \"error\": \"Bad request: . Required metadata header not specified\" }";

/// Azure IMDS serving `instance` at `/metadata/instance` for requests with `Metadata: true`
/// and an `api-version` (400 otherwise).
pub fn azure(instance: Value) -> Server {
    let body = to_json(&instance);
    let h = hdrs(&[("Content-Type", "application/json; charset=utf-8")]);
    Server::start(move |r: &Req| {
        if r.header("metadata") != Some("true") {
            return Reply::Http(400, h.clone(), AZURE_NO_HEADER.as_bytes().to_vec());
        }
        if r.route() != "/metadata/instance" || !r.path.contains("api-version=") {
            return Reply::Http(404, h.clone(), b"Not Found".to_vec());
        }
        Reply::Http(200, h.clone(), body.clone().into_bytes())
    })
}

/// Nova's metadata service from a capture directory laid out as a config drive
/// (`openstack/latest/*.json`, `ec2/latest/meta-data.json`; `ec2_meta` overrides the
/// latter): the JSON documents as files, the EC2 document as `/latest/meta-data/` leaves.
pub fn openstack(dir: &Path, ec2_meta: Option<Value>) -> Server {
    let dir = dir.to_path_buf();
    let ec2 = ec2_meta.or_else(|| {
        let p = dir.join("ec2/latest/meta-data.json");
        p.is_file()
            .then(|| json::parse(&std::fs::read_to_string(p).unwrap()).unwrap())
    });
    let h = hdrs(&[("Content-Type", "text/plain; charset=UTF-8")]);
    Server::start(move |r: &Req| {
        let route = r.route();
        if let Some(leaf) = route.strip_prefix("/latest/meta-data/") {
            return match ec2
                .as_ref()
                .and_then(|t| lookup(t, leaf, &|s| s.to_string()))
                .and_then(tree_text)
            {
                Some(text) => Reply::Http(200, h.clone(), text.into_bytes()),
                None => Reply::Http(404, h.clone(), b"Not Found".to_vec()),
            };
        }
        if route.starts_with("/openstack/") && route.ends_with(".json") {
            if let Some(body) = openstack_file(&dir, route) {
                return Reply::Http(200, hdrs(&[("Content-Type", "application/json")]), body);
            }
        }
        Reply::Http(404, h.clone(), b"Not Found".to_vec())
    })
}

/// A document under `openstack/`; `latest` is the newest dated version present, as Nova
/// serves it (a capture of `2012-08-10` only answers `latest` too).
fn openstack_file(dir: &Path, route: &str) -> Option<Vec<u8>> {
    let rel = route.trim_start_matches('/');
    if let Ok(body) = std::fs::read(dir.join(rel)) {
        return Some(body);
    }
    let file = rel.strip_prefix("openstack/latest/")?;
    let mut versions: Vec<PathBuf> = std::fs::read_dir(dir.join("openstack"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    versions.sort();
    std::fs::read(versions.last()?.join(file)).ok()
}

// --- Running the binary against a capture ------------------------------------------------

/// Writes DMI values under the root.
pub fn dmi(root: &Root, pairs: &[(&str, &str)]) {
    for (k, v) in pairs {
        root.write(&format!("sys/class/dmi/id/{k}"), &format!("{v}\n"));
    }
}

/// Writes a captured DMI case (`aws/xen-t2-dmi-4.2.amazon`) under the root: its files as
/// `/sys/class/dmi/id/<name>`, `hypervisor_uuid` as `/sys/hypervisor/uuid`.
pub fn dmi_capture(root: &Root, case: &str) {
    for e in std::fs::read_dir(captured().join(case)).unwrap().flatten() {
        let name = e.file_name().into_string().unwrap();
        let value = std::fs::read_to_string(e.path()).unwrap();
        match name.as_str() {
            "SOURCE.txt" => {}
            "hypervisor_uuid" => root.write("sys/hypervisor/uuid", &value),
            _ => root.write(&format!("sys/class/dmi/id/{name}"), &value),
        }
    }
}

/// One `--no-start` run against `url`, with `--provider` when given.
pub fn run(root: &Root, url: &str, provider: Option<&str>) -> Outcome {
    let mut args = vec!["--no-start", "--deadline", "10", "--metadata-url", url];
    if let Some(p) = provider {
        args.extend(["--provider", p]);
    }
    firstboot(root, &args)
}

/// The identity lines of kubelet.env, in the contract's order.
pub const IDENTITY: [&str; 8] = [
    "PROVIDER=",
    "NODE_NAME=",
    "NODE_IP=",
    "INSTANCE_ID=",
    "INSTANCE_TYPE=",
    "ZONE=",
    "REGION=",
    "PROVIDER_ID=",
];

pub fn identity(env: &str) -> Vec<String> {
    env.lines()
        .filter(|l| IDENTITY.iter().any(|k| l.starts_with(k)))
        .map(str::to_string)
        .collect()
}

/// Runs with `--provider` and with auto-detection over the DMI already under `root`; both
/// must succeed with `want` as the identity, the same kubelet.env, kubelet's `--node-ip` and
/// `--provider-id` matching, and no auto-detected `none`. Returns the status.json of the
/// auto run.
pub fn both_ways(root: &Root, provider: &str, url: &str, want: &[&str]) -> String {
    let explicit = run(root, url, Some(provider));
    assert_eq!(explicit.code, 0, "--provider {provider}: {explicit:#?}");
    let env = root.read("run/kiln/kubelet.env");
    assert_eq!(identity(&env), want, "--provider {provider}:\n{env}");
    let node_ip = want[2].trim_start_matches("NODE_IP=");
    let flag = format!("--node-ip={node_ip}");
    assert!(
        env.contains(&format!("{flag} ")) || env.contains(&format!("{flag}\"")),
        "{env}"
    );
    // The provider ID is a KubeletConfiguration field: in the node's drop-in, not a flag.
    let dropin = root.read("run/kiln/kubelet.conf.d/10-kiln-node.conf");
    let provider_id = want[7].trim_start_matches("PROVIDER_ID=");
    if provider_id.is_empty() {
        assert!(!dropin.contains("providerID"), "{dropin}");
    } else {
        assert!(
            dropin.contains(&format!("\"providerID\":\"{provider_id}\"")),
            "{dropin}"
        );
    }
    assert!(!env.contains("--provider-id"), "{env}");

    let auto = run(root, url, None);
    assert_eq!(auto.code, 0, "auto: {auto:#?}");
    assert_eq!(
        root.read("run/kiln/kubelet.env"),
        env,
        "auto-detection gave another kubelet.env"
    );
    assert_eq!(
        root.read("run/kiln/kubelet.conf.d/10-kiln-node.conf"),
        dropin,
        "auto-detection gave another drop-in"
    );
    let status = root.read("run/kiln/status.json");
    assert!(
        !status.contains("no known platform") && !auto.stderr.contains("no known platform"),
        "{status}\n{}",
        auto.stderr
    );
    status
}

pub fn want(lines: [&str; 8]) -> [&str; 8] {
    for (l, k) in lines.iter().zip(IDENTITY) {
        assert!(l.starts_with(k), "{l} is not {k}");
    }
    lines
}
