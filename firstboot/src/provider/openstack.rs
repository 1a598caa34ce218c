//! OpenStack Nova: `openstack/latest/meta_data.json` for identity, and the EC2-compatible
//! leaves for what the OpenStack document lacks (the private IPv4, the flavor name).
//! Addresses: EC2's `local-ipv4`, then every fixed address in `network_data.json` (both
//! families). The oldest versions read: meta_data.json 2012-08-10 (`uuid`, `name`,
//! `availability_zone`), the EC2 leaves of 2009-04-04, network_data.json 2015-10-15
//! (optional: older clouds answer 404).

use crate::contract::Provider;
use crate::error::Error;
use crate::json::Value;
use crate::netaddr::Candidate;
use crate::provider::common::{doc_field, get_json, get_optional, get_text, parse_json};
use crate::provider::common::{parallel, Context};
use crate::provider::common::{Metadata, MetadataSource};

#[derive(Debug)]
pub struct OpenStack;

impl MetadataSource for OpenStack {
    fn provider(&self) -> Provider {
        Provider::Openstack
    }

    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error> {
        let base = cx.base();
        let url = format!("{base}/openstack/latest/meta_data.json");
        let doc = get_json(cx, &url, &[])?;
        let field = |key: &str, required: bool| doc_field(&doc, &url, key, required);
        let uuid = field("uuid", true)?;
        let name = field("name", false)?;
        let zone = field("availability_zone", false)?;
        let leaf = |key: &str| -> Result<String, Error> {
            let u = format!("{base}/latest/meta-data/{key}");
            Ok(get_text(cx, &u, &[], true)?.unwrap_or_default())
        };
        let network_url = format!("{base}/openstack/latest/network_data.json");
        let network = || get_optional(cx, &network_url, &[]);
        let v = parallel(&[&|| leaf("local-ipv4"), &|| leaf("instance-type"), &network])?;
        let [ip, instance_type, network] = <[String; 3]>::try_from(v).unwrap_or_default();
        let mut addresses = vec![Candidate::new("meta-data/local-ipv4", ip)];
        if !network.is_empty() {
            addresses.extend(network_addresses(&parse_json(&network_url, &network)?));
        }
        Ok(Metadata {
            // cloud-provider-openstack finds a node's server by its name.
            hostname: name.to_ascii_lowercase(),
            addresses,
            provider_id: format!("openstack:///{uuid}"),
            instance_id: uuid,
            instance_type,
            zone,
            region: String::new(),
            lifecycle_state: None,
        })
    }
}

/// The fixed addresses of `network_data.json`'s `networks` (types `ipv4` and `ipv6`; the
/// DHCP and SLAAC types carry none), in document order.
pub fn network_addresses(doc: &Value) -> Vec<Candidate> {
    let networks = doc.get("networks").and_then(Value::as_array).unwrap_or(&[]);
    let mut out = Vec::new();
    for (i, n) in networks.iter().enumerate() {
        if let Some(ip) = n.get("ip_address").and_then(Value::as_text) {
            out.push(Candidate::new(
                format!("network_data.json networks/{i}/ip_address"),
                ip,
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fetch, serve};
    use super::super::{Metadata, Provider};

    #[test]
    fn reads_meta_data_json_and_the_ec2_leaves() {
        let srv = serve("openstack", &[]);
        let md = fetch(Provider::Openstack, &srv.url).unwrap();
        assert_eq!(
            md,
            Metadata {
                hostname: "kiln-worker-0".into(),
                addresses: md.addresses.clone(),
                instance_id: "d8e02d56-2648-49a3-bf97-6be8f1204f38".into(),
                instance_type: "m1.small".into(),
                zone: "nova".into(),
                region: String::new(),
                provider_id: "openstack:///d8e02d56-2648-49a3-bf97-6be8f1204f38".into(),
                lifecycle_state: None,
            }
        );
        assert_eq!(
            md.addresses.first().map(|c| c.value.as_str()),
            Some("10.0.0.12")
        );
    }
}
