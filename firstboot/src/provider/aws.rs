//! AWS EC2 through IMDSv2 only: a session token from `PUT /latest/api/token`, then GETs
//! carrying it. IMDSv1 is never tried, so a node never depends on the weaker protocol.
//! Paths are under `latest/`. The required fields are in every API version since 2008;
//! `placement/region` and `ipv6` are newer and optional: the region falls back to the zone
//! minus its letter, the address to the primary interface's `local-ipv4s` and `ipv6s`
//! (tested against captures of API versions 2016-09-02 and 2018-09-24).

use super::MetadataSource;
use super::{get_list, get_text, http_error, parallel, Candidate, Context, Metadata};
use crate::contract::Provider;
use crate::error::Error;
use crate::netaddr::{IpFamily, Offered};
use crate::Reason;

/// How long the session token lives; firstboot needs it for well under a second.
const TOKEN_TTL: &str = "300";

/// IMDS on its IPv6 address, for instances on IPv6-only subnets (Nitro; the endpoint must be
/// enabled on the instance). `--metadata-url aws-ipv6` or `METADATA_URL=aws-ipv6` picks it.
pub const IPV6_ENDPOINT: &str = "http://[fd00:ec2::254]";

#[derive(Debug)]
pub struct Aws;

impl MetadataSource for Aws {
    fn provider(&self) -> Provider {
        Provider::Aws
    }

    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error> {
        let base = cx.base();
        let token_url = format!("{base}/latest/api/token");
        let resp = cx
            .client
            .send(
                "PUT",
                &token_url,
                &[("X-aws-ec2-metadata-token-ttl-seconds", TOKEN_TTL)],
            )
            .map_err(|e| match http_error(e) {
                // A hop limit of 1 drops the PUT's answer on its way into a container: say so.
                Error::Metadata { reason, message } => Error::metadata(
                    reason,
                    format!("{message}; if firstboot runs in a container, the IMDS hop limit may be too low"),
                ),
                other => other,
            })?;
        match resp.status {
            200 => {}
            401 | 403 => {
                return Err(Error::metadata(
                    Reason::MetadataHopLimit,
                    format!(
                        "PUT {token_url}: expected HTTP 200 with an IMDSv2 token, found HTTP {}: the token request was refused (hop limit or IMDSv2 disabled)",
                        resp.status
                    ),
                ))
            }
            s => {
                return Err(Error::metadata(
                    Reason::MetadataInvalid,
                    format!("PUT {token_url}: expected HTTP 200 with an IMDSv2 token, found HTTP {s}"),
                ))
            }
        }
        let token = String::from_utf8(resp.body).unwrap_or_default();
        let token = token.trim();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Error::metadata(
                Reason::MetadataInvalid,
                format!(
                    "PUT {token_url}: expected a printable token, found {} unusable bytes",
                    token.len()
                ),
            ));
        }
        let headers = [("X-aws-ec2-metadata-token", token)];
        let get = |key: &str, optional: bool| -> Result<String, Error> {
            let url = format!("{base}/latest/meta-data/{key}");
            Ok(get_text(cx, &url, &headers, optional)?.unwrap_or_default())
        };
        let v = parallel(&[
            &|| get("instance-id", false),
            &|| get("instance-type", false),
            &|| get("placement/availability-zone", false),
            &|| get("placement/region", true),
            &|| get("local-ipv4", true),
            &|| get("local-hostname", true),
            &|| get("ipv6", true),
            &|| get("mac", true),
        ])?;
        let [instance_id, instance_type, zone, mut region, ip, hostname, ipv6, mac] =
            <[String; 8]>::try_from(v).unwrap_or_default();
        // Older IMDS versions lack placement/region; the zone minus its letter is the region.
        if region.is_empty() {
            region = zone
                .trim_end_matches(|c: char| c.is_ascii_lowercase())
                .to_string();
        }
        let mut addresses = vec![
            Candidate::new("meta-data/local-ipv4", ip),
            Candidate::new("meta-data/ipv6", ipv6),
        ];
        // The primary interface's lists: where API versions before 2021-01-03 keep the IPv6
        // address, and the next source when a top-level answer is missing or unusable.
        // Asked only when needed, so a usual boot makes no extra round trip.
        let offered = Offered::from_candidates(&addresses);
        let want_v6 = cx.wants(IpFamily::Ipv6);
        if !mac.is_empty() && (offered.v4.is_none() || (want_v6 && offered.v6.is_none())) {
            let nic = format!("network/interfaces/macs/{mac}");
            let (v4s, v6s) = (format!("{nic}/local-ipv4s"), format!("{nic}/ipv6s"));
            let lists = std::thread::scope(|s| {
                let a =
                    s.spawn(|| get_list(cx, &format!("{base}/latest/meta-data/{v4s}"), &headers));
                let b =
                    s.spawn(|| get_list(cx, &format!("{base}/latest/meta-data/{v6s}"), &headers));
                (a.join(), b.join())
            });
            let (Ok(v4_list), Ok(v6_list)) = lists else {
                return Err(Error::metadata(
                    Reason::Internal,
                    "a metadata lookup thread panicked".to_string(),
                ));
            };
            for (field, list) in [(v4s, v4_list?), (v6s, v6_list?)] {
                let field = format!("meta-data/{field}");
                addresses.extend(list.into_iter().map(|v| Candidate::new(&field, v)));
            }
        }
        Ok(Metadata {
            provider_id: format!("aws:///{zone}/{instance_id}"),
            hostname,
            addresses,
            instance_id,
            instance_type,
            zone,
            region,
        })
    }
}
