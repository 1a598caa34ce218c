//! AWS EC2 through IMDSv2 only: a session token from `PUT /latest/api/token`, then GETs
//! carrying it. IMDSv1 is never tried, so a node never depends on the weaker protocol.

use super::{get_text, http_error, parallel, valid_ip, Context, Metadata, MetadataSource};
use crate::contract::Provider;
use crate::error::Error;
use crate::Reason;

/// How long the session token lives; firstboot needs it for well under a second.
const TOKEN_TTL: &str = "300";

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
        ])?;
        let [instance_id, instance_type, zone, mut region, ip, hostname] =
            <[String; 6]>::try_from(v).unwrap_or_default();
        // Older IMDS versions lack placement/region; the zone minus its letter is the region.
        if region.is_empty() {
            region = zone
                .trim_end_matches(|c: char| c.is_ascii_lowercase())
                .to_string();
        }
        // IPv6-only instances have no local-ipv4: the caller falls back to the route.
        let node_ip = valid_ip(ip, "local-ipv4", base)?;
        Ok(Metadata {
            provider_id: format!("aws:///{zone}/{instance_id}"),
            hostname,
            node_ip,
            instance_id,
            instance_type,
            zone,
            region,
        })
    }
}
