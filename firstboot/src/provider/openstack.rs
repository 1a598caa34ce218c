//! OpenStack Nova: `openstack/latest/meta_data.json` for identity, and the EC2-compatible
//! leaves for what the OpenStack document lacks (the private IPv4, the flavor name).

use super::{
    body_text, check_token, get_text, http_error, parallel, valid_ip, Context, Metadata,
    MetadataSource,
};
use crate::contract::Provider;
use crate::error::Error;
use crate::json::{self, Value};
use crate::Reason;

#[derive(Debug)]
pub struct OpenStack;

impl MetadataSource for OpenStack {
    fn provider(&self) -> Provider {
        Provider::Openstack
    }

    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error> {
        let base = cx.base();
        let url = format!("{base}/openstack/latest/meta_data.json");
        let resp = cx.client.send("GET", &url, &[]).map_err(http_error)?;
        if resp.status != 200 {
            return Err(Error::metadata(
                Reason::MetadataInvalid,
                format!("GET {url}: expected HTTP 200, found HTTP {}", resp.status),
            ));
        }
        let doc = json::parse(&body_text(&url, resp.body)?)
            .map_err(|e| Error::metadata(Reason::MetadataInvalid, format!("GET {url}: {e}")))?;
        let field = |key: &str, required: bool| -> Result<String, Error> {
            match doc.get(key).and_then(Value::as_text) {
                Some(v) => {
                    check_token(v, key, &url)?;
                    Ok(v.to_string())
                }
                None if required => Err(Error::metadata(
                    Reason::MetadataInvalid,
                    format!("GET {url}: expected the field {key}, found none"),
                )),
                None => Ok(String::new()),
            }
        };
        let uuid = field("uuid", true)?;
        let name = field("name", false)?;
        let zone = field("availability_zone", false)?;
        let leaf = |key: &str| -> Result<String, Error> {
            let u = format!("{base}/latest/meta-data/{key}");
            Ok(get_text(cx, &u, &[], true)?.unwrap_or_default())
        };
        let v = parallel(&[&|| leaf("local-ipv4"), &|| leaf("instance-type")])?;
        let [ip, instance_type] = <[String; 2]>::try_from(v).unwrap_or_default();
        let ip = valid_ip(ip, "local-ipv4", base)?;
        Ok(Metadata {
            // cloud-provider-openstack finds a node's server by its name.
            hostname: name.to_ascii_lowercase(),
            node_ip: ip,
            provider_id: format!("openstack:///{uuid}"),
            instance_id: uuid,
            instance_type,
            zone,
            region: String::new(),
        })
    }
}
