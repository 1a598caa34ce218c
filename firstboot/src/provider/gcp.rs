//! Google Compute Engine through `computeMetadata/v1` with `Metadata-Flavor: Google`.
//! Every answer must carry the same header back, as Google's own clients check, so a
//! stray server on the address is not mistaken for the metadata service.
//! `v1` is the only version the server has (since 2015, replacing `v1beta1`). Older or
//! partial answers lack leaves: `instance/name` falls back to the hostname's first label,
//! `network-interfaces/0/ip` and `ipv6s` to the route to the API server.

use crate::netaddr::Candidate;
use crate::provider::common::{body_text, check_token};
use std::time::Duration;

use crate::contract::Provider;
use crate::error::Error;
use crate::http::Client;
use crate::provider::common::{
    http_error, last_segment, parallel, Context, Metadata, MetadataSource,
};
use crate::provider::common::{unexpected_status, ChannelError, ReportTarget, LINK_LOCAL};
use crate::redact::Redacted;
use crate::Reason;

/// The guest attribute the final status is PUT to, under the metadata server.
pub const STATUS_ATTRIBUTE_PATH: &str = "/computeMetadata/v1/instance/guest-attributes/kiln/status";

#[derive(Debug)]
pub struct Gcp;

/// The list of the primary interface's IPv6 addresses, one per line.
const IPV6S: &str = "instance/network-interfaces/0/ipv6s";

/// GETs one leaf. `optional`: a 404 is the empty value. A list leaf (`ipv6s`) keeps its
/// newlines and is not token-checked: its items are addresses, which are parsed.
fn get(cx: &Context<'_>, path: &str, optional: bool) -> Result<String, Error> {
    let url = format!("{}/computeMetadata/v1/{path}", cx.base());
    let resp = cx
        .client
        .send("GET", &url, &[("Metadata-Flavor", "Google")])
        .map_err(http_error)?;
    if resp.status == 404 && optional {
        return Ok(String::new());
    }
    if resp.status != 200 {
        return Err(unexpected_status(&url, resp.status));
    }
    if resp.header("metadata-flavor") != Some("Google") {
        return Err(Error::metadata(
            Reason::MetadataInvalid,
            format!("GET {url}: expected the response header Metadata-Flavor: Google, found none"),
        ));
    }
    let v = body_text(&url, resp.body)?.trim().to_string();
    if path != IPV6S {
        check_token(&v, path, &url)?;
    }
    Ok(v)
}

impl MetadataSource for Gcp {
    fn provider(&self) -> Provider {
        Provider::Gcp
    }

    fn report_back(&self, to: &ReportTarget, status_json: &Redacted) -> Result<(), ChannelError> {
        put_status(to.base_url.as_deref().unwrap_or(LINK_LOCAL), status_json)
    }

    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error> {
        let v = parallel(
            &[
                ("instance/id", false),
                ("instance/name", true),
                ("instance/machine-type", false),
                ("instance/zone", false),
                ("project/project-id", false),
                ("instance/network-interfaces/0/ip", true),
                (IPV6S, true),
                ("instance/hostname", true),
            ],
            &|path, optional| get(cx, path, optional),
        )?;
        let [id, name, machine_type, zone_path, project, ip, ipv6s, fqdn] =
            <[String; 8]>::try_from(v).unwrap_or_default();
        // The FQDN's first label is the short hostname GCE gives the guest: the instance
        // name unless the instance was created with a custom hostname.
        let short = fqdn.split('.').next().unwrap_or("").to_string();
        let name = match (name.is_empty(), short.is_empty()) {
            (false, _) => name,
            (true, false) => short.clone(),
            (true, true) => {
                return Err(Error::metadata(
                    Reason::MetadataInvalid,
                    format!(
                        "{}/computeMetadata/v1/instance/: expected name or hostname, found neither",
                        cx.base()
                    ),
                ))
            }
        };
        let zone = last_segment(&zone_path).to_string();
        // A zone is `<region>-<letter>`.
        let region = zone
            .rsplit_once('-')
            .map(|(r, _)| r)
            .unwrap_or("")
            .to_string();
        let mut addresses = vec![Candidate::new("network-interfaces/0/ip", ip)];
        addresses.extend(
            ipv6s
                .lines()
                .map(|v| Candidate::new("network-interfaces/0/ipv6s", v.trim())),
        );
        Ok(Metadata {
            hostname: if short.is_empty() {
                name.clone()
            } else {
                short
            },
            addresses,
            provider_id: format!("gce://{project}/{zone}/{name}"),
            instance_id: id,
            instance_type: last_segment(&machine_type).to_string(),
            zone,
            region,
            lifecycle_state: None,
        })
    }
}

/// PUTs `value` to the GCP guest attribute `kiln/status` (readable with
/// `gcloud compute instances get-guest-attributes --query-path=kiln/`).
pub fn put_status(base_url: &str, value: &Redacted) -> Result<(), ChannelError> {
    let base = base_url.trim_end_matches('/');
    let base = base.strip_suffix("/computeMetadata/v1").unwrap_or(base);
    let url = format!("{base}{STATUS_ATTRIBUTE_PATH}");
    let err = |what: String| ChannelError {
        channel: "gcp",
        target: url.clone(),
        what,
    };
    let resp = Client::once(Duration::from_secs(2))
        .send_body(
            "PUT",
            &url,
            &[("Metadata-Flavor", "Google")],
            value.as_str().as_bytes(),
        )
        .map_err(|e| err(e.to_string()))?;
    let code = resp.status;
    if code == 200 {
        Ok(())
    } else {
        let text = String::from_utf8_lossy(&resp.body);
        Err(err(format!(
            "answered {code} {:?}, expected 200 (are guest attributes enabled: enable-guest-attributes=TRUE?)",
            text.trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fetch, serve};
    use super::super::{Metadata, Provider};
    use crate::Reason;

    #[test]
    fn reads_compute_metadata_with_the_flavor_header() {
        let srv = serve("gcp", &[("Metadata-Flavor", "Google")]);
        let md = fetch(Provider::Gcp, &srv.url).unwrap();
        assert_eq!(
            md,
            Metadata {
                hostname: "kiln-worker-0".into(),
                addresses: md.addresses.clone(),
                instance_id: "4520031799277581759".into(),
                instance_type: "n2-standard-4".into(),
                zone: "us-central1-a".into(),
                region: "us-central1".into(),
                provider_id: "gce://kiln-test-project/us-central1-a/kiln-worker-0".into(),
                lifecycle_state: None,
            }
        );
        assert_eq!(
            md.addresses.first().map(|c| c.value.as_str()),
            Some("10.128.0.5")
        );
        assert!(srv
            .requests()
            .iter()
            .all(|r| r.header("metadata-flavor") == Some("Google")));
    }

    #[test]
    fn an_answer_without_the_flavor_header_is_refused() {
        let srv = serve("gcp", &[]);
        let e = fetch(Provider::Gcp, &srv.url).unwrap_err();
        assert_eq!(e.reason(), Reason::MetadataInvalid, "{e}");
        assert!(e.to_string().contains("Metadata-Flavor"), "{e}");
    }
}
