//! Metadata sources: one small trait, one implementation per platform, one `match` from a
//! [`Provider`] to an implementation ([`source`]), and DMI-based detection for
//! `PROVIDER=auto`. A platform that has a report-back channel (VMware guestinfo, GCP guest
//! attributes, Azure KVP) overrides [`MetadataSource::report_back`] in its own file.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};

use crate::contract::paths;
pub use crate::contract::Provider;
use crate::error::Error;
use crate::fsutil;
use crate::http::{Client, HttpError};
pub use crate::netaddr::Candidate;
use crate::netaddr::{self, IpFamily};
use crate::redact::{Collected, Redacted};
use crate::Reason;

pub mod aws;
pub mod azure;
pub mod detect;
pub mod gcp;
pub mod none;
pub mod openstack;
pub mod qemu;
pub mod vmware;

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
}

/// The URL a metadata endpoint name stands for (`METADATA_URL`, `--metadata-url`), or
/// `None` when `name` is no such name (then it is a URL itself).
pub fn named_endpoint(name: &str) -> Option<&'static str> {
    match name {
        "aws-ipv6" => Some(aws::IPV6_ENDPOINT),
        _ => None,
    }
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

/// The one `match` from a provider to its source.
pub fn source(provider: Provider) -> &'static dyn MetadataSource {
    match provider {
        Provider::Aws => &aws::Aws,
        Provider::Azure => &azure::Azure,
        Provider::Gcp => &gcp::Gcp,
        Provider::Openstack => &openstack::OpenStack,
        Provider::Vmware => &vmware::Vmware,
        Provider::Qemu => &qemu::Qemu,
        Provider::None => &none::NoMetadata,
    }
}

/// One DMI file's trimmed content, or empty when it is absent or unreadable.
pub fn dmi_field(root: &Path, field: &str) -> String {
    let p = paths::under(root, detect::DMI_DIR).join(field);
    match fsutil::read_capped(&p, 4096) {
        Ok(Some(s)) => s.trim().to_string(),
        _ => String::new(),
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
        s => Err(Error::metadata(
            Reason::MetadataInvalid,
            format!("GET {url}: expected HTTP 200, found HTTP {s}"),
        )),
    }
}

/// GETs a newline-separated list (EC2's `local-ipv4s`, `ipv6s`); a 404 is the empty list.
/// Items are not token-checked: they are addresses, which [`crate::netaddr`] parses.
pub fn get_list(
    cx: &Context<'_>,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<Vec<String>, Error> {
    let resp = cx.client.send("GET", url, headers).map_err(http_error)?;
    match resp.status {
        200 => Ok(body_text(url, resp.body)?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()),
        404 => Ok(Vec::new()),
        s => Err(Error::metadata(
            Reason::MetadataInvalid,
            format!("GET {url}: expected HTTP 200, found HTTP {s}"),
        )),
    }
}

/// One metadata lookup that can run on its own thread.
pub type Job<'a> = &'a (dyn Fn() -> Result<String, Error> + Sync);

/// Runs lookups side by side and returns their results in order, or the first error in
/// order. Metadata round trips dominate a boot's critical path; they do not depend on each
/// other, so they need not wait for each other.
pub fn parallel(jobs: &[Job<'_>]) -> Result<Vec<String>, Error> {
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs.iter().map(|job| s.spawn(*job)).collect();
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
    let with_port = if hostport.ends_with(']') || !hostport.contains(':') {
        format!("{hostport}:443")
    } else {
        hostport.to_string()
    };
    with_port
        .to_socket_addrs()
        .map_err(|e| {
            fail(format!(
                "API_SERVER {api_server}: cannot resolve for the route to it: {e}"
            ))
        })?
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
        "0.0.0.0:0"
    } else {
        "[::]:0"
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

/// The last `/`-separated segment: GCP answers `projects/1/zones/us-central1-a`.
pub fn last_segment(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// What the providers' unit tests share: the fixtures of `tests/fixtures/<provider>/`
/// served by the one metadata stand-in ([`crate::standin`]), and a fetch against it.
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    use super::{source, Context, Metadata, Provider};
    use crate::error::Error;
    use crate::http::Client;
    use crate::standin::{fixture_reply, MetadataServer, Reply, Request};

    /// `firstboot/tests/fixtures/<dir>`.
    pub fn fixtures(dir: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(dir)
    }

    /// The stand-in serving `fixtures(dir)` with `headers` on every answer.
    pub fn serve(dir: &str, headers: &[(&str, &str)]) -> MetadataServer {
        let base = fixtures(dir);
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        MetadataServer::start(move |r| fixture_reply(&base, &headers, r)).unwrap()
    }

    /// The stand-in answering with `handler`.
    pub fn serve_with(
        handler: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> MetadataServer {
        MetadataServer::start(handler).unwrap()
    }

    /// `provider`'s fetch against `url`, with a root that has no DMI files.
    pub fn fetch(provider: Provider, url: &str) -> Result<Metadata, Error> {
        let client = Client::new(Instant::now() + Duration::from_secs(10));
        let cx = Context {
            root: Path::new("/nonexistent-kiln-root"),
            base_url: Some(url),
            client: &client,
            rpctool: "/nonexistent/vmware-rpctool",
            api_server: "https://127.0.0.1:6443",
            ip_family: None,
            secrets: &crate::redact::Collected::default(),
        };
        source(provider).fetch(&cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_sources() {
        for p in Provider::ALL {
            assert_eq!(source(p).provider(), p);
            let n = p.name();
            assert_eq!(Provider::from_name(n).map(|p| source(p).name()), Some(n));
        }
        assert!(Provider::from_name("auto").is_none());
        assert!(Provider::from_name("AWS").is_none());
    }

    #[test]
    fn tokens() {
        assert!(check_token("ip-10-0-0-1.ec2.internal", "h", "s").is_ok());
        for bad in ["a b", "a\"b", "a$b", "tab\t", "ünï"] {
            assert!(check_token(bad, "h", "s").is_err(), "{bad}");
        }
    }

    #[test]
    fn route_to_loopback() {
        let ip = |u: &str| route_ip(u).unwrap().to_string();
        assert_eq!(ip("https://127.0.0.1:6443"), "127.0.0.1");
        assert_eq!(ip("https://127.0.0.1"), "127.0.0.1");
        assert_eq!(ip("https://[::1]:6443"), "::1");
    }

    #[test]
    fn every_endpoint_name_the_contract_accepts_has_a_url() {
        for name in crate::contract::node_env::METADATA_URL_NAMES {
            let url = named_endpoint(name).unwrap();
            assert!(crate::http::Url::parse(url).is_ok(), "{url}");
        }
        assert_eq!(named_endpoint("http://127.0.0.1:1"), None);
    }

    #[test]
    fn segments() {
        assert_eq!(
            last_segment("projects/1/machineTypes/n2-standard-4"),
            "n2-standard-4"
        );
        assert_eq!(last_segment("plain"), "plain");
    }
}
