//! AWS EC2 through IMDSv2 only: a session token from `PUT /latest/api/token`, then GETs
//! carrying it. IMDSv1 is never tried, so a node never depends on the weaker protocol.
//! Paths are under `latest/`. The required fields are in every API version since 2008;
//! `placement/region` and `ipv6` are newer and optional: the region falls back to the zone
//! minus its letter, the address to the primary interface's `local-ipv4s` and `ipv6s`
//! (tested against captures of API versions 2016-09-02 and 2018-09-24).

use std::time::Instant;

use crate::contract::Provider;
use crate::error::Error;
use crate::http::Client;
use crate::netaddr::Candidate;
use crate::netaddr::{IpFamily, Offered};
use crate::provider::common::MetadataSource;
use crate::provider::common::{each, get_optional, get_text, http_error, parallel};
use crate::provider::common::{Context, Metadata};
use crate::Reason;

/// How long the session token lives; firstboot needs it for well under a second.
const TOKEN_TTL: &str = "300";
/// How long the boot waits for the warm-pool state before it goes on without it.
const LIFECYCLE_BOUND: std::time::Duration = std::time::Duration::from_secs(5);
/// The longest a token may live (IMDSv2: 21600 s), for a node that waits in a warm pool.
const LONG_TOKEN_TTL: &str = "21600";

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
        let token = token(cx)?;
        let token = token.as_str();
        let headers = [("X-aws-ec2-metadata-token", token)];
        // The warm-pool state, beside the rest with the same token, on a client of its own
        // bounded at 5 s: an IMDS that fails this key is retried until the client's deadline,
        // which must not become the whole metadata phase's.
        let bounded = Client::new(cx.client.deadline().min(Instant::now() + LIFECYCLE_BOUND));
        let lcx = Context {
            client: &bounded,
            ..*cx
        };
        let get = |key: &str, optional: bool| -> Result<String, Error> {
            let cx = if key == TARGET_LIFECYCLE_STATE {
                &lcx
            } else {
                cx
            };
            let url = format!("{base}/latest/meta-data/{key}");
            Ok(get_text(cx, &url, &headers, optional)?.unwrap_or_default())
        };
        let mut v = each(
            &[
                (TARGET_LIFECYCLE_STATE, true),
                ("instance-id", false),
                ("instance-type", false),
                ("placement/availability-zone", false),
                ("placement/region", true),
                ("local-ipv4", true),
                ("local-hostname", true),
                ("ipv6", true),
                ("mac", true),
            ],
            &get,
        );
        let lifecycle = v.remove(0).map_err(|e| e.message().to_string());
        let v = v.into_iter().collect::<Result<Vec<_>, _>>()?;
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
            let (v4_url, v6_url) = (
                format!("{base}/latest/meta-data/{v4s}"),
                format!("{base}/latest/meta-data/{v6s}"),
            );
            let lists = parallel(&[(&v4_url, false), (&v6_url, false)], &|url, _| {
                get_optional(cx, url, &headers)
            })?;
            // Items are not token-checked: they are addresses, which netaddr parses.
            for (field, list) in [v4s, v6s].into_iter().zip(lists) {
                let field = format!("meta-data/{field}");
                let items = list.lines().map(str::trim).filter(|l| !l.is_empty());
                addresses.extend(items.map(|v| Candidate::new(&field, v)));
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
            lifecycle_state: Some(lifecycle),
        })
    }
}

/// An IMDSv2 session token (`PUT /latest/api/token`), noted as a secret for the redactor.
fn token(cx: &Context<'_>) -> Result<String, Error> {
    token_for(cx, TOKEN_TTL)
}

/// [`token`] with a lifetime of `ttl` seconds.
fn token_for(cx: &Context<'_>, ttl: &str) -> Result<String, Error> {
    let base = cx.base();
    let token_url = format!("{base}/latest/api/token");
    let resp = cx
        .client
        .send(
            "PUT",
            &token_url,
            &[("X-aws-ec2-metadata-token-ttl-seconds", ttl)],
        )
        .map_err(|e| {
            // A hop limit of 1 drops the PUT's answer on its way into a container: say so.
            let e = http_error(e);
            Error::metadata(
                e.reason(),
                format!(
                    "{}; if firstboot runs in a container, the IMDS hop limit may be too low",
                    e.message()
                ),
            )
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
    let token = token.trim().to_string();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::metadata(
            Reason::MetadataInvalid,
            format!(
                "PUT {token_url}: expected a printable token, found {} unusable bytes",
                token.len()
            ),
        ));
    }
    cx.secrets.note(&token);
    Ok(token)
}

/// Where IMDS keeps an Auto Scaling group instance's target lifecycle state (EC2 instance
/// metadata categories, `autoscaling/target-lifecycle-state`): `InService`, `Warmed:Stopped`,
/// `Warmed:Running`, `Warmed:Hibernated`, `Terminated`. Not there (404) outside a group.
pub const TARGET_LIFECYCLE_STATE: &str = "autoscaling/target-lifecycle-state";

/// The instance's target lifecycle state; empty when IMDS has none (the instance is not in an
/// Auto Scaling group). `token` is kept by the caller between calls: asked for with the longest
/// lifetime IMDS allows and dropped after any failure (an expired token is refused), so a node
/// that waits in a warm pool for weeks holds a few tokens, not one per question.
pub fn target_lifecycle_state(
    cx: &Context<'_>,
    token: &mut Option<String>,
) -> Result<String, Error> {
    let t = match token.take() {
        Some(t) => t,
        None => token_for(cx, LONG_TOKEN_TTL)?,
    };
    let url = format!("{}/latest/meta-data/{TARGET_LIFECYCLE_STATE}", cx.base());
    let state = get_text(cx, &url, &[("X-aws-ec2-metadata-token", &t)], true)?.unwrap_or_default();
    *token = Some(t);
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fetch, fixtures, serve_with};
    use super::super::{Metadata, Provider};
    use crate::standin::{aws_imdsv2, fixture_reply};
    use crate::Reason;

    fn imdsv2() -> crate::standin::MetadataServer {
        let base = fixtures("aws");
        let token = std::fs::read_to_string(base.join("latest/api/token")).unwrap();
        serve_with(aws_imdsv2(token, move |r| fixture_reply(&base, &[], r)))
    }

    #[test]
    fn reads_the_instance_through_an_imdsv2_token() {
        let srv = imdsv2();
        let md = fetch(Provider::Aws, &srv.url).unwrap();
        assert_eq!(
            md,
            Metadata {
                hostname: "ip-10-0-3-7.eu-west-1.compute.internal".into(),
                addresses: md.addresses.clone(),
                instance_id: "i-0abc123def4567890".into(),
                instance_type: "m5.large".into(),
                zone: "eu-west-1a".into(),
                region: "eu-west-1".into(),
                provider_id: "aws:///eu-west-1a/i-0abc123def4567890".into(),
                lifecycle_state: Some(Ok(String::new())),
            }
        );
        assert_eq!(
            md.addresses.first().map(|c| c.value.as_str()),
            Some("10.0.3.7")
        );
        let reqs = srv.requests();
        assert_eq!(
            (reqs[0].method.as_str(), reqs[0].route()),
            ("PUT", "/latest/api/token")
        );
        assert!(reqs[1..]
            .iter()
            .all(|r| r.method == "GET" && r.header("x-aws-ec2-metadata-token").is_some()));
    }

    #[test]
    fn a_refused_token_is_the_hop_limit() {
        let srv = serve_with(|_| crate::standin::Reply::status(401));
        let e = fetch(Provider::Aws, &srv.url).unwrap_err();
        assert_eq!(e.reason(), Reason::MetadataHopLimit, "{e}");
    }
}
