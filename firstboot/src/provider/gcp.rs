//! Google Compute Engine through `computeMetadata/v1` with `Metadata-Flavor: Google`.
//! Every answer must carry the same header back, as Google's own clients check, so a
//! stray server on the address is not mistaken for the metadata service.

use super::{body_text, check_token};
use super::{http_error, last_segment, parallel, valid_ip, Context, Metadata, MetadataSource};
use crate::error::Error;
use crate::Reason;

#[derive(Debug)]
pub struct Gcp;

fn get(cx: &Context<'_>, path: &str) -> Result<String, Error> {
    let url = format!("{}/computeMetadata/v1/{path}", cx.base());
    let resp = cx
        .client
        .send("GET", &url, &[("Metadata-Flavor", "Google")])
        .map_err(http_error)?;
    if resp.status != 200 {
        return Err(Error::metadata(
            Reason::MetadataInvalid,
            format!("GET {url}: expected HTTP 200, found HTTP {}", resp.status),
        ));
    }
    if resp.header("metadata-flavor") != Some("Google") {
        return Err(Error::metadata(
            Reason::MetadataInvalid,
            format!("GET {url}: expected the response header Metadata-Flavor: Google, found none"),
        ));
    }
    let v = body_text(&url, resp.body)?.trim().to_string();
    check_token(&v, path, &url)?;
    Ok(v)
}

impl MetadataSource for Gcp {
    fn name(&self) -> &'static str {
        "gcp"
    }

    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error> {
        let v = parallel(&[
            &|| get(cx, "instance/id"),
            &|| get(cx, "instance/name"),
            &|| get(cx, "instance/machine-type"),
            &|| get(cx, "instance/zone"),
            &|| get(cx, "project/project-id"),
            &|| get(cx, "instance/network-interfaces/0/ip"),
            &|| get(cx, "instance/hostname"),
        ])?;
        let [id, name, machine_type, zone_path, project, ip, hostname] =
            <[String; 7]>::try_from(v).unwrap_or_default();
        let zone = last_segment(&zone_path).to_string();
        // A zone is `<region>-<letter>`.
        let region = zone
            .rsplit_once('-')
            .map(|(r, _)| r)
            .unwrap_or("")
            .to_string();
        Ok(Metadata {
            // The FQDN's first label is the short hostname GCE gives the guest.
            hostname: hostname.split('.').next().unwrap_or("").to_string(),
            node_ip: valid_ip(ip, "network-interfaces/0/ip", cx.base())?,
            provider_id: format!("gce://{project}/{zone}/{name}"),
            instance_id: id,
            instance_type: last_segment(&machine_type).to_string(),
            zone,
            region,
        })
    }
}
