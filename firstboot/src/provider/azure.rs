//! Azure through the Instance Metadata Service: one JSON document from
//! `/metadata/instance` (pinned api-version, `Metadata: true` header).
//! One request instead of one `format=text` call per field keeps the boot path short.

use super::{body_text, check_token, http_error, valid_ip, Context, Metadata, MetadataSource};
use crate::error::Error;
use crate::json::{self, Value};
use crate::Reason;

/// The api-version firstboot is written and tested against.
pub const API_VERSION: &str = "2021-02-01";

#[derive(Debug)]
pub struct Azure;

impl MetadataSource for Azure {
    fn name(&self) -> &'static str {
        "azure"
    }

    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error> {
        let url = format!("{}/metadata/instance?api-version={API_VERSION}", cx.base());
        let resp = cx
            .client
            .send("GET", &url, &[("Metadata", "true")])
            .map_err(http_error)?;
        if resp.status != 200 {
            return Err(Error::metadata(
                Reason::MetadataInvalid,
                format!("GET {url}: expected HTTP 200, found HTTP {}", resp.status),
            ));
        }
        let text = body_text(&url, resp.body)?;
        let doc = json::parse(&text)
            .map_err(|e| Error::metadata(Reason::MetadataInvalid, format!("GET {url}: {e}")))?;
        from_document(&doc, &url)
    }
}

/// Turns the instance document into metadata; `url` names the source in errors.
pub fn from_document(doc: &Value, url: &str) -> Result<Metadata, Error> {
    let field = |path: &str, required: bool| -> Result<String, Error> {
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
    };
    let vm_id = field("compute/vmId", true)?;
    let name = field("compute/name", true)?;
    let sub = field("compute/subscriptionId", true)?;
    let rg = field("compute/resourceGroupName", true)?;
    let location = field("compute/location", true)?;
    let zone = field("compute/zone", false)?;
    let scale_set = field("compute/vmScaleSetName", false)?;
    let computer = field("compute/osProfile/computerName", false)?;
    let ip = field(
        "network/interface/0/ipv4/ipAddress/0/privateIpAddress",
        false,
    )?;
    // The cloud provider names scale-set instances `<set>_<n>` and addresses them under the set.
    let provider_id = match name.strip_prefix(&scale_set).and_then(|r| r.strip_prefix('_')) {
        Some(index) if !scale_set.is_empty() => format!(
            "azure:///subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{scale_set}/virtualMachines/{index}"
        ),
        _ => format!(
            "azure:///subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}"
        ),
    };
    let host = if computer.is_empty() {
        &name
    } else {
        &computer
    };
    Ok(Metadata {
        hostname: host.to_ascii_lowercase(),
        node_ip: valid_ip(ip, "privateIpAddress", url)?,
        instance_id: vm_id,
        instance_type: field("compute/vmSize", true)?,
        // Kubernetes on Azure labels zones `<location>-<zone>`.
        zone: if zone.is_empty() {
            String::new()
        } else {
            format!("{location}-{zone}")
        },
        region: location,
        provider_id,
    })
}
