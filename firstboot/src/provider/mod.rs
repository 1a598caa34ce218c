//! Metadata sources: one small trait, one implementation per platform, one `match` from a
//! [`Provider`] to an implementation ([`source`]), and DMI-based detection for
//! `PROVIDER=auto`. A platform that has a report-back channel (VMware guestinfo, GCP guest
//! attributes, Azure KVP) overrides [`MetadataSource::report_back`] in its own file.

pub use crate::contract::Provider;
pub use crate::netaddr::Candidate;

pub mod aws;
pub mod azure;
pub mod common;
pub mod detect;
pub mod gcp;
pub mod none;
pub mod platforms;
pub mod qemu;
/// Windows' SMBIOS sources for detection; built for tests on every host.
#[cfg(any(windows, test))]
pub mod smbios;
pub mod table;
pub mod vmware;
pub mod volume;

pub use common::{
    api_family, route_ip, ChannelError, Context, Metadata, MetadataSource, ReportTarget, LINK_LOCAL,
};

/// The URL a metadata endpoint name stands for (`METADATA_URL`, `--metadata-url`), or
/// `None` when `name` is no such name (then it is a URL itself).
pub fn named_endpoint(name: &str) -> Option<&'static str> {
    match name {
        "aws-ipv6" => Some(aws::IPV6_ENDPOINT),
        _ => None,
    }
}

/// The metadata service a provider reads, when it has one at a fixed address (doctor's
/// clock check asks it); `None` for the local sources and the volumes.
pub fn service_url(provider: Provider) -> Option<&'static str> {
    match provider {
        Provider::Aws | Provider::Azure | Provider::Gcp => Some(LINK_LOCAL),
        Provider::Openstack => Some(platforms::OPENSTACK.base),
        Provider::Hetzner => Some(platforms::HETZNER.base),
        Provider::Digitalocean => Some(platforms::DIGITALOCEAN.base),
        Provider::Oraclecloud => Some(platforms::ORACLECLOUD.base),
        Provider::Akamai => Some(platforms::AKAMAI.base),
        Provider::Ibmcloud => Some(platforms::IBMCLOUD.base),
        Provider::Scaleway => Some(platforms::SCALEWAY.base),
        _ => None,
    }
}

/// The one `match` from a provider to its source.
pub fn source(provider: Provider) -> &'static dyn MetadataSource {
    match provider {
        Provider::Aws => &aws::Aws,
        Provider::Azure => &azure::Azure,
        Provider::Gcp => &gcp::Gcp,
        Provider::Openstack => &platforms::OPENSTACK,
        Provider::Vmware => &vmware::Vmware,
        Provider::Qemu => &qemu::Qemu,
        Provider::None => &none::NoMetadata,
        Provider::Configdrive => &volume::CONFIG_DRIVE,
        Provider::Nocloud => &volume::NOCLOUD_SEED,
        Provider::Hetzner => &platforms::HETZNER,
        Provider::Digitalocean => &platforms::DIGITALOCEAN,
        Provider::Oraclecloud => &platforms::ORACLECLOUD,
        Provider::Akamai => &platforms::AKAMAI,
        Provider::Ibmcloud => &platforms::IBMCLOUD,
        Provider::Scaleway => &platforms::SCALEWAY,
    }
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
            cluster: "kiln-test",
            ip_family: None,
            secrets: &crate::redact::Collected::default(),
        };
        source(provider).fetch(&cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::common::*;

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
