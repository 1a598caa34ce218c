//! Metadata sources described as data: which documents to read (over HTTP from a metadata
//! service, or as files of a mounted volume), with which headers and session token, and
//! where in them each [`Metadata`] field is. One reader ([`Table::read`]) serves every
//! platform in `platforms.rs`, so a platform costs a table, not a parser: kiln-firstboot's
//! size budget (docs/firstboot.md) is what made this the shape.
//!
//! Documents are JSON or YAML (`crate::yaml`, which reads JSON too). A path is `/`-separated
//! object keys and array indexes; `*` is every element of an array or value of an object.

use std::path::Path;

use crate::contract::Provider;
use crate::error::Error;
use crate::fsutil;
use crate::json::Value;
use crate::netaddr::Candidate;
use crate::provider::common::{body_text, check_token, get_optional, http_error, parallel};
use crate::provider::common::{Context, Metadata, MetadataSource};
use crate::Reason;

/// The largest metadata document read: Nova's `meta_data.json` with keys and a random seed
/// is a few KiB, a cloud's instance document a few more.
pub const DOC_CAP: u64 = 256 * 1024;

/// What is done to a value before it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// As it is.
    Text,
    /// Lower-cased (a name a cloud controller matches lower-case node names against).
    Lower,
    /// The part after the last `:` (OCI's `qIZq:PHX-AD-1` availability domain).
    AfterColon,
    /// Without its last `-` part: the region of a zone (`fr-par-1` → `fr-par`).
    ZoneRegion,
    /// The part before `-dc` (Hetzner's `hel1-dc2` → location `hel1`).
    Location,
    /// An address without its `/prefix` length.
    Address,
    /// The account of an IBM CRN (`crn:v1:bluemix:public:is:us-south-1:a/<account>::…`).
    CrnAccount,
}

/// One place a value is found: document (index into [`Table::docs`]), path, treatment.
#[derive(Debug)]
pub struct Pick(pub u8, pub &'static str, pub How);

/// A session token fetched before the documents: `PUT path` with `headers` and `body`; the
/// token is the answer's text, or its JSON member `field`; it is sent on every document
/// request as `header: <prefix><token>`, and is a secret (kept out of every output).
#[derive(Debug)]
pub struct Token {
    pub path: &'static str,
    pub headers: &'static [(&'static str, &'static str)],
    pub body: &'static str,
    pub field: &'static str,
    pub header: &'static str,
    pub prefix: &'static str,
}

/// What a document is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doc {
    /// JSON or YAML that must be there.
    Required,
    /// JSON or YAML that may be absent (HTTP 404, no file, or empty): then it is null.
    Optional,
    /// One text value (an EC2-style leaf), read whole; absent is null.
    Leaf,
}

/// The fields of [`Table::fields`], in order.
pub const ID: usize = 0;
pub const HOST: usize = 1;
pub const TYPE: usize = 2;
pub const ZONE: usize = 3;
pub const REGION: usize = 4;
/// A value only the provider ID uses (`{aux}`).
pub const AUX: usize = 5;

/// One platform's source.
#[derive(Debug)]
pub struct Table {
    pub provider: Provider,
    /// The metadata service's base URL; unused by a volume.
    pub base: &'static str,
    /// Headers on every document request.
    pub headers: &'static [(&'static str, &'static str)],
    pub token: Option<&'static Token>,
    /// Document paths under the base (or the volume's root), and what each is.
    pub docs: &'static [(&'static str, Doc)],
    /// Where each of [`ID`] … [`AUX`] is: the first pick that gives a value wins.
    pub fields: [&'static [Pick]; 6],
    /// Every address candidate, in the order the platform prefers them.
    pub addresses: &'static [Pick],
    /// The provider ID, with `{id}`, `{zone}`, `{cluster}` and `{aux}` filled in; empty
    /// when the platform's cloud controller sets it itself.
    pub provider_id: &'static str,
    /// Whether DMI `product_serial` must equal the instance ID when it is set (cloud-init's
    /// Hetzner check: another server answering on the address has another ID).
    pub serial_is_id: bool,
}

/// Where the documents come from.
#[derive(Debug, Clone, Copy)]
pub enum From<'a> {
    /// A metadata service at this base URL.
    Http(&'a str),
    /// Files of a directory (a mounted volume).
    Dir(&'a Path),
}

fn invalid(m: String) -> Error {
    Error::metadata(Reason::MetadataInvalid, m)
}

/// Every value at `path` (with `*`s) under `v`, with the concrete path of each.
fn walk<'v>(v: &'v Value, path: &str, at: String, out: &mut Vec<(String, &'v Value)>) {
    let Some((part, rest)) = path.split_once('/').or(Some((path, ""))) else {
        return;
    };
    let join = |k: &str| match at.is_empty() {
        true => k.to_string(),
        false => format!("{at}/{k}"),
    };
    let mut next = |k: String, v: &'v Value| match rest {
        "" => out.push((k, v)),
        r => walk(v, r, k, out),
    };
    match (part, v) {
        ("*", Value::Array(a)) => a
            .iter()
            .enumerate()
            .for_each(|(i, e)| next(join(&i.to_string()), e)),
        ("*", Value::Object(m)) => m.iter().for_each(|(k, e)| next(join(k), e)),
        (p, v) => {
            if let Some(e) = v.pointer(p) {
                next(join(p), e);
            }
        }
    }
}

fn apply(how: How, v: &str) -> String {
    let v = v.trim();
    match how {
        How::Text => v,
        How::Lower => return v.to_ascii_lowercase(),
        How::AfterColon => v.rsplit(':').next().unwrap_or(v),
        How::ZoneRegion => v.rsplit_once('-').map_or(v, |(r, _)| r),
        How::Location => v.split("-dc").next().unwrap_or(v),
        How::Address => v.split('/').next().unwrap_or(v),
        How::CrnAccount => v
            .split(':')
            .find_map(|p| p.strip_prefix("a/"))
            .unwrap_or(""),
    }
    .to_string()
}

impl Table {
    /// The documents from `from`, parsed; an absent optional one is null.
    pub fn load(&self, cx: &Context<'_>, from: From<'_>) -> Result<Vec<Value>, Error> {
        let mut auth = None;
        if let (From::Http(base), Some(t)) = (from, self.token) {
            auth = Some((t.header, session(cx, base, t)?));
        }
        // Each document's name in messages, and its text: empty when it is absent (HTTP
        // 404, no file). A service's documents are fetched side by side, as the other
        // sources' are: on OpenStack four round trips become one.
        let texts: Vec<(String, String)> = match from {
            From::Http(base) => {
                let mut headers = self.headers.to_vec();
                headers.extend(auth.as_ref().map(|(h, v)| (*h, v.as_str())));
                let keys: Vec<(&str, bool)> = self.docs.iter().map(|&(p, _)| (p, true)).collect();
                let get = |path: &str, _| get_optional(cx, &format!("{base}{path}"), &headers);
                let got = parallel(&keys, &get)?;
                keys.iter()
                    .zip(got)
                    .map(|(&(p, _), t)| (format!("GET {base}{p}"), t))
                    .collect()
            }
            From::Dir(dir) => {
                let mut v = Vec::new();
                for &(p, _) in self.docs {
                    let file = dir.join(p);
                    v.push((
                        file.display().to_string(),
                        read_file(&file)?.unwrap_or_default(),
                    ));
                }
                v
            }
        };
        let mut out = Vec::new();
        for (&(_, doc), (what, text)) in self.docs.iter().zip(&texts) {
            let text = text.trim();
            out.push(if text.is_empty() {
                if doc == Doc::Required {
                    return Err(invalid(format!(
                        "{what}: expected the document, found none"
                    )));
                }
                Value::Null
            } else if doc == Doc::Leaf {
                Value::String(text.to_string())
            } else {
                crate::yaml::parse(text).map_err(|e| invalid(format!("{what}: {e}")))?
            });
        }
        Ok(out)
    }

    /// The metadata in `docs` (from [`Table::load`]); `what` names the source in messages.
    pub fn read(&self, cx: &Context<'_>, docs: &[Value], what: &str) -> Result<Metadata, Error> {
        let mut f: [String; 6] = Default::default();
        for (slot, picks) in f.iter_mut().zip(self.fields) {
            for Pick(d, path, how) in picks {
                let mut found = Vec::new();
                walk(&docs[*d as usize], path, String::new(), &mut found);
                if let Some(v) = found.iter().find_map(|(_, v)| v.as_text()) {
                    *slot = apply(*how, v);
                    check_token(slot, path, what)?;
                }
                if !slot.is_empty() {
                    break;
                }
            }
        }
        if f[ID].is_empty() {
            let path = self.fields[ID].first().map_or("", |p| p.1);
            return Err(invalid(format!(
                "{what}: expected the instance ID ({path}), found none"
            )));
        }
        if self.serial_is_id {
            serial_matches(cx, &f[ID], what)?;
        }
        let mut addresses = Vec::new();
        for Pick(d, path, how) in self.addresses {
            let mut found = Vec::new();
            walk(&docs[*d as usize], path, String::new(), &mut found);
            for (at, v) in found {
                if let Some(t) = v.as_text() {
                    let doc = self.docs[*d as usize].0.trim_start_matches('/');
                    let field = match at.is_empty() {
                        true => doc.to_string(),
                        false => format!("{doc} {at}"),
                    };
                    addresses.push(Candidate::new(field, apply(*how, t)));
                }
            }
        }
        let provider_id = self
            .provider_id
            .replace("{id}", &f[ID])
            .replace("{zone}", &f[ZONE])
            .replace("{cluster}", cx.cluster)
            .replace("{aux}", &f[AUX]);
        let [instance_id, hostname, instance_type, zone, region, _] = f;
        Ok(Metadata {
            hostname,
            addresses,
            instance_id,
            instance_type,
            zone,
            region,
            provider_id,
            lifecycle_state: None,
        })
    }
}

impl MetadataSource for Table {
    fn provider(&self) -> Provider {
        self.provider
    }

    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error> {
        let base = cx.base_url.unwrap_or(self.base).trim_end_matches('/');
        let docs = self.load(cx, From::Http(base))?;
        self.read(cx, &docs, base)
    }
}

/// A volume's file: a regular file, through real directories only (a crafted volume's
/// symlink is neither followed nor read), at most [`DOC_CAP`] bytes.
pub fn read_file(file: &Path) -> Result<Option<String>, Error> {
    let dir = file.parent().unwrap_or(Path::new("/"));
    match fsutil::real_dir(dir, false) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(invalid(format!("{}: {e}", dir.display()))),
    }
    fsutil::read_regular(file, DOC_CAP).map_err(invalid)
}

/// The session token, with the header value's prefix.
fn session(cx: &Context<'_>, base: &str, t: &Token) -> Result<String, Error> {
    let url = format!("{base}{}", t.path);
    let resp = cx
        .client
        .send_body("PUT", &url, t.headers, t.body.as_bytes())
        .map_err(http_error)?;
    if resp.status != 200 {
        return Err(invalid(format!(
            "PUT {url}: expected HTTP 200 with a session token, found HTTP {}",
            resp.status
        )));
    }
    let text = body_text(&url, resp.body)?;
    let token = match t.field {
        "" => text.trim().to_string(),
        f => crate::yaml::parse(&text)
            .map_err(|e| invalid(format!("PUT {url}: {e}")))?
            .get(f)
            .and_then(Value::as_text)
            .unwrap_or_default()
            .to_string(),
    };
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(format!(
            "PUT {url}: expected a session token of printable characters, found {} bytes that are not",
            token.len()
        )));
    }
    cx.secrets.note(&token);
    Ok(format!("{}{token}", t.prefix))
}

/// cloud-init's check that the service is this instance's: DMI's serial, when the platform
/// sets it, is the instance ID.
fn serial_matches(cx: &Context<'_>, id: &str, what: &str) -> Result<(), Error> {
    let p = crate::contract::paths::under(cx.root, "/sys/class/dmi/id/product_serial");
    let serial = fsutil::read_capped(&p, 4096)
        .ok()
        .flatten()
        .unwrap_or_default();
    let serial = serial.trim();
    match serial.is_empty() || serial == id {
        true => Ok(()),
        false => Err(invalid(format!(
            "{what}: the instance ID {id:?} differs from DMI product_serial {serial:?}: another server answers on the metadata address"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn treatments() {
        for (how, v, want) in [
            (How::Text, " a ", "a"),
            (How::Lower, "Node-A", "node-a"),
            (How::AfterColon, "qIZq:PHX-AD-1", "PHX-AD-1"),
            (How::AfterColon, "PHX-AD-1", "PHX-AD-1"),
            (How::ZoneRegion, "fr-par-1", "fr-par"),
            (How::ZoneRegion, "us-south-1", "us-south"),
            (How::Location, "hel1-dc2", "hel1"),
            (How::Location, "ash", "ash"),
            (How::Address, "10.0.0.1/24", "10.0.0.1"),
            (How::Address, "2001:db8::10/64", "2001:db8::10"),
            (
                How::CrnAccount,
                "crn:v1:bluemix:public:is:us-south-1:a/abc123::instance:0717_x",
                "abc123",
            ),
            (How::CrnAccount, "not-a-crn", ""),
        ] {
            assert_eq!(apply(how, v), want, "{how:?} {v}");
        }
    }

    #[test]
    fn paths_with_wildcards_name_what_they_found() {
        let doc = crate::yaml::parse(
            "ethernets:\n  eth0:\n    addresses: [10.0.0.2/24, '2001:db8::2/64']\n  eth1:\n    dhcp4: true\nlist:\n- ip: 1.1.1.1\n- ip: 2.2.2.2\n",
        )
        .unwrap();
        let mut found = Vec::new();
        walk(&doc, "ethernets/*/addresses/*", String::new(), &mut found);
        let got: Vec<_> = found
            .iter()
            .map(|(p, v)| (p.as_str(), v.as_text().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                ("ethernets/eth0/addresses/0", "10.0.0.2/24"),
                ("ethernets/eth0/addresses/1", "2001:db8::2/64")
            ]
        );
        found.clear();
        walk(&doc, "list/*/ip", String::new(), &mut found);
        assert_eq!(found.len(), 2);
        assert_eq!(found[1].0, "list/1/ip");
        found.clear();
        walk(&doc, "", String::new(), &mut found);
        assert_eq!(found.len(), 1, "an empty path is the document itself");
        found.clear();
        walk(&doc, "missing/*/x", String::new(), &mut found);
        assert!(found.is_empty());
    }
}
