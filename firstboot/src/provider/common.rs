//! What every metadata provider shares: the [`Metadata`] a provider returns, the
//! [`MetadataSource`] trait, the [`Context`] a fetch runs in, the report-back channel types,
//! and the HTTP helpers (token checks, parallel GETs, API address resolution). A leaf of
//! `provider/`: each provider imports it, it imports none of them.

use crate::contract::Provider;
use crate::error::Error;
use crate::http::{Client, HttpError};
use crate::json::{self, Value};
use crate::netaddr::Candidate;
use crate::netaddr::{self, IpFamily};
use crate::redact::{Collected, Redacted};
use crate::Reason;
use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};

/// The real link-local metadata address: the default base URL of every HTTP source.
pub const LINK_LOCAL: &str = "http://169.254.169.254";

/// What a metadata source knows about this instance. Empty strings mean "not known".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    /// The node name the platform suggests (hostname or instance name).
    pub hostname: String,
    /// The node addresses the source offers, both families, in the order it prefers them
    /// (the primary interface's first); the caller checks them ([`crate::netaddr`]).
    pub addresses: Vec<Candidate>,
    pub instance_id: String,
    pub instance_type: String,
    pub zone: String,
    pub region: String,
    pub provider_id: String,
    /// AWS: the Auto Scaling target lifecycle state (`Ok("")` outside a group), or why it
    /// could not be read; `None` for a source that has no such thing (docs/contract.md,
    /// "Warm pools").
    pub lifecycle_state: Option<Result<String, String>>,
}

/// Everything a source may use: paths are under `root`, URLs under `base_url`.
#[derive(Debug)]
pub struct Context<'a> {
    pub root: &'a Path,
    /// `--metadata-url`, else the source's default.
    pub base_url: Option<&'a str>,
    pub client: &'a Client,
    /// Path of `vmware-rpctool`.
    pub rpctool: &'a str,
    /// `API_SERVER` from node.env, for the route-based node IP.
    pub api_server: &'a str,
    /// `CLUSTER_NAME` from node.env, for a provider ID that names the cluster (IBM Cloud).
    pub cluster: &'a str,
    /// `IP_FAMILY` from node.env, when set.
    pub ip_family: Option<IpFamily>,
    /// Where a source notes the secrets it is handed (a metadata session token), so the
    /// run's redactor keeps them out of every output.
    pub secrets: &'a Collected,
}

impl Context<'_> {
    /// Whether the node may need an address of `family`: `IP_FAMILY` names it (or `dual`),
    /// or, unset, the API server's address is of that family. A source asks its slower
    /// fallbacks for a family only then.
    pub fn wants(&self, family: IpFamily) -> bool {
        match self.ip_family {
            Some(f) => f == family || f == IpFamily::Dual,
            None => {
                family == IpFamily::Ipv4 || netaddr::literal_family(self.api_server) == Some(family)
            }
        }
    }

    /// The base URL without a trailing slash.
    pub fn base(&self) -> &str {
        self.base_url.unwrap_or(LINK_LOCAL).trim_end_matches('/')
    }
}

/// Where a platform's report-back channel is: owned, so the status reporter can keep it
/// until the run ends. Paths are under `root`, URLs under `base_url`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportTarget {
    /// The `--root` prefix.
    pub root: PathBuf,
    /// `--metadata-url`, else the platform's default.
    pub base_url: Option<String>,
    /// Path of `vmware-rpctool`.
    pub rpctool: PathBuf,
}

/// A channel that did not take the status (a warning, never a failed boot).
#[derive(Debug)]
pub struct ChannelError {
    /// Which channel: `vmware`, `gcp`, `azure-kvp`.
    pub channel: &'static str,
    /// The tool, URL or file it went to.
    pub target: String,
    /// What went wrong.
    pub what: String,
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} channel {}: {}", self.channel, self.target, self.what)
    }
}

impl std::error::Error for ChannelError {}

/// One platform's metadata service.
pub trait MetadataSource {
    /// Which provider this is.
    fn provider(&self) -> Provider;

    /// The name used in `PROVIDER=` and `kubelet.env`.
    fn name(&self) -> &'static str {
        self.provider().name()
    }

    /// Reads this instance's metadata.
    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error>;

    /// Publishes the final status JSON on the platform's own channel, one that needs no
    /// inbound connectivity (`docs/contract.md#cloud-channels`). Most platforms have none:
    /// the serial console is their channel, and this does nothing.
    fn report_back(&self, to: &ReportTarget, status_json: &Redacted) -> Result<(), ChannelError> {
        let _ = (to, status_json);
        Ok(())
    }
}

/// Checks a metadata value is one printable token, so it is safe in kubelet's flags.
pub fn check_token(value: &str, what: &str, source: &str) -> Result<(), Error> {
    let bad = value
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '"' | '\'' | '\\' | '$' | '`'));
    match bad {
        None => Ok(()),
        Some(c) => Err(Error::metadata(
            Reason::MetadataInvalid,
            format!("{source}: {what}: expected one printable token, found {c:?} in {value:?}"),
        )),
    }
}

/// Maps a transport failure to the metadata error it stands for.
pub fn http_error(e: HttpError) -> Error {
    match e {
        HttpError::Unreachable(m) => Error::metadata(Reason::MetadataUnreachable, m),
        HttpError::Invalid(m) => Error::metadata(Reason::MetadataInvalid, m),
    }
}

/// An answer other than 200 (or an allowed 404) to `GET url`.
pub fn unexpected_status(url: &str, status: u16) -> Error {
    Error::metadata(
        Reason::MetadataInvalid,
        format!("GET {url}: expected HTTP 200, found HTTP {status}"),
    )
}

/// A response body as UTF-8 text, or an error naming the URL and the first bad byte.
pub fn body_text(url: &str, body: Vec<u8>) -> Result<String, Error> {
    String::from_utf8(body).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        Error::metadata(
            Reason::MetadataInvalid,
            format!(
                "GET {url}: expected UTF-8 text, found byte 0x{:02x} at offset {at}",
                e.as_bytes()[at]
            ),
        )
    })
}

/// GETs one text value. `optional`: a 404 means "not set" instead of an error.
pub fn get_text(
    cx: &Context<'_>,
    url: &str,
    headers: &[(&str, &str)],
    optional: bool,
) -> Result<Option<String>, Error> {
    let resp = cx.client.send("GET", url, headers).map_err(http_error)?;
    match resp.status {
        200 => {
            let text = body_text(url, resp.body)?;
            let v = text.trim().to_string();
            check_token(&v, "value", url)?;
            Ok(Some(v))
        }
        404 if optional => Ok(None),
        s => Err(unexpected_status(url, s)),
    }
}

/// GETs a document that may be absent: its text, or the empty string for a 404 (EC2's
/// `local-ipv4s` and `ipv6s` lists, OpenStack's `network_data.json`).
pub fn get_optional(
    cx: &Context<'_>,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<String, Error> {
    let resp = cx.client.send("GET", url, headers).map_err(http_error)?;
    match resp.status {
        200 => body_text(url, resp.body),
        404 => Ok(String::new()),
        s => Err(unexpected_status(url, s)),
    }
}

/// GETs a JSON document that must be there (Azure's instance document, OpenStack's
/// `meta_data.json`).
pub fn get_json(cx: &Context<'_>, url: &str, headers: &[(&str, &str)]) -> Result<Value, Error> {
    let resp = cx.client.send("GET", url, headers).map_err(http_error)?;
    if resp.status != 200 {
        return Err(unexpected_status(url, resp.status));
    }
    parse_json(url, &body_text(url, resp.body)?)
}

/// Parses the JSON document `url` answered.
pub fn parse_json(url: &str, text: &str) -> Result<Value, Error> {
    json::parse(text)
        .map_err(|e| Error::metadata(Reason::MetadataInvalid, format!("GET {url}: {e}")))
}

/// The text at `path` in the document `url` answered, token-checked; empty when absent,
/// unless `required`.
pub fn doc_field(doc: &Value, url: &str, path: &str, required: bool) -> Result<String, Error> {
    match doc.pointer(path).and_then(Value::as_text) {
        Some(v) => {
            check_token(v, path, url)?;
            Ok(v.to_string())
        }
        None if required => Err(Error::metadata(
            Reason::MetadataInvalid,
            format!("GET {url}: expected the field {path}, found none"),
        )),
        None => Ok(String::new()),
    }
}

/// One metadata lookup that can run on its own thread: `(key, optional)` to a value.
pub type Get<'a> = &'a (dyn Fn(&str, bool) -> Result<String, Error> + Sync);

/// Runs `get` for every `(key, optional)` side by side and returns the values in order, or
/// the first error in order. Metadata round trips dominate a boot's critical path; they do
/// not depend on each other, so they need not wait for each other.
pub fn parallel(keys: &[(&str, bool)], get: Get<'_>) -> Result<Vec<String>, Error> {
    each(keys, get).into_iter().collect()
}

/// [`parallel`], with every lookup's own result: for a caller that can go on without some.
pub fn each(keys: &[(&str, bool)], get: Get<'_>) -> Vec<Result<String, Error>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = keys
            .iter()
            .map(|&(key, optional)| s.spawn(move || get(key, optional)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::metadata(
                        Reason::Internal,
                        "a metadata lookup thread panicked".to_string(),
                    ))
                })
            })
            .collect()
    })
}

/// The first address `API_SERVER`'s host resolves to (port 443 unless given).
fn resolve_api(api_server: &str) -> Result<SocketAddr, Error> {
    let fail = |m: String| Error::metadata(Reason::MetadataInvalid, m);
    let hostport = api_server
        .strip_prefix("https://")
        .unwrap_or(api_server)
        .split('/')
        .next()
        .unwrap_or("");
    let cannot = |e: &dyn fmt::Display| {
        fail(format!(
            "API_SERVER {api_server}: cannot resolve for the route to it: {e}"
        ))
    };
    // Port 443 unless given; an IPv6 address is bracketed in the URL, not in the lookup. A
    // bad port is said in std's words, as resolving `host:port` text says it.
    let (host, port) = match hostport.rsplit_once(':') {
        Some((host, port)) if !hostport.ends_with(']') => (
            host,
            port.parse().map_err(|_| cannot(&"invalid port value"))?,
        ),
        _ => (hostport, 443),
    };
    // The brackets go whatever is inside: a scoped link-local address (`fe80::1%2`) is not
    // an `Ipv6Addr` to std, but the C resolver reads it.
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (host, port)
        .to_socket_addrs()
        .map_err(|e| cannot(&e))?
        .next()
        .ok_or_else(|| fail(format!("API_SERVER {api_server}: resolves to no address")))
}

/// The API server's address family: from the URL when the host is an address, else from
/// its first resolved address; `None` when the name does not resolve.
pub fn api_family(api_server: &str) -> Option<IpFamily> {
    netaddr::literal_family(api_server)
        .or_else(|| resolve_api(api_server).ok().map(|a| IpFamily::of(a.ip())))
}

/// The local address of the route to `API_SERVER`: a connected UDP socket's local address.
/// Connecting a UDP socket sends no packet; it only asks the kernel for a route.
pub fn route_ip(api_server: &str) -> Result<IpAddr, Error> {
    let addr = resolve_api(api_server)?;
    let local = if addr.is_ipv4() {
        SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0))
    } else {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
    };
    let sock = UdpSocket::bind(local)
        .and_then(|s| s.connect(addr).map(|_| s))
        .and_then(|s| s.local_addr())
        .map_err(|e| {
            Error::metadata(
                Reason::MetadataInvalid,
                format!("no route to API_SERVER {addr}: {e}"),
            )
        })?;
    Ok(sock.ip())
}

/// The metadata of a source of named values that uses kiln's own names (QEMU's fw_cfg
/// entries, VMware's guestinfo keys), read with `get` in this order: `hostname`,
/// `local-ipv4`, `local-ipv6`, `instance-type`, `zone`, `region`. `field` names where an
/// address came from (`fw_cfg opt/kiln/`, to which the key is added).
pub fn named_values(
    field: &str,
    get: &dyn Fn(&str) -> Result<String, Error>,
    instance_id: String,
    provider_id: String,
) -> Result<Metadata, Error> {
    let hostname = get("hostname")?;
    let mut addresses = Vec::new();
    for key in ["local-ipv4", "local-ipv6"] {
        addresses.push(Candidate::new(format!("{field}{key}"), get(key)?));
    }
    Ok(Metadata {
        hostname,
        addresses,
        instance_type: get("instance-type")?,
        zone: get("zone")?,
        region: get("region")?,
        provider_id,
        instance_id,
        lifecycle_state: None,
    })
}

/// The last `/`-separated segment: GCP answers `projects/1/zones/us-central1-a`.
pub fn last_segment(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}
