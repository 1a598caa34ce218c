//! VMware vSphere: guestinfo keys `guestinfo.kiln.<key>` read with `vmware-rpctool`
//! (its path is configurable), the VM's BIOS UUID from DMI for the provider ID.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::contract::Provider;
use crate::error::Error;
use crate::provider::common::{
    check_token, named_values, ChannelError, Context, Metadata, MetadataSource, ReportTarget,
};
use crate::provider::detect::dmi_field;
use crate::redact::Redacted;
use crate::service;
use crate::Reason;

/// The guestinfo key the final status is set in.
pub const STATUS_KEY: &str = "guestinfo.kiln.status";

#[derive(Debug)]
pub struct Vmware;

/// Reads one guestinfo key. `vmware-rpctool` exits non-zero with "No value found" when the
/// key is unset, which is "empty" here; failing to run the tool at all is an error.
fn info_get(cx: &Context<'_>, key: &str) -> Result<String, Error> {
    let arg = format!("info-get guestinfo.kiln.{key}");
    let out = service::output(cx.rpctool, &[&arg], cx.client.deadline())
        .map_err(|e| Error::metadata(Reason::MetadataUnreachable, e.message().to_string()))?;
    if !out.success {
        return Ok(String::new());
    }
    let v = String::from_utf8(out.stdout).map_err(|_| {
        Error::metadata(
            Reason::MetadataInvalid,
            format!(
                "{} \"{arg}\": expected UTF-8 text, found invalid bytes",
                cx.rpctool
            ),
        )
    })?;
    let v = v.trim().to_string();
    check_token(&v, key, cx.rpctool)?;
    Ok(v)
}

impl MetadataSource for Vmware {
    fn provider(&self) -> Provider {
        Provider::Vmware
    }

    fn report_back(&self, to: &ReportTarget, status_json: &Redacted) -> Result<(), ChannelError> {
        info_set(&to.rpctool, STATUS_KEY, status_json)
    }

    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error> {
        let uuid = dmi_field(cx.root, "product_uuid").to_ascii_lowercase();
        let mut instance_id = info_get(cx, "instance-id")?;
        if instance_id.is_empty() {
            instance_id = uuid.clone();
        }
        if instance_id.is_empty() {
            return Err(Error::metadata(
                Reason::MetadataInvalid,
                format!(
                    "expected guestinfo.kiln.instance-id or /sys/class/dmi/id/product_uuid, found neither (through {})",
                    cx.rpctool
                ),
            ));
        }
        check_token(&uuid, "product_uuid", "/sys/class/dmi/id/product_uuid")?;
        let provider_id = if uuid.is_empty() {
            String::new()
        } else {
            format!("vsphere://{uuid}")
        };
        named_values(
            "guestinfo.kiln.",
            &|key| info_get(cx, key),
            instance_id,
            provider_id,
        )
    }
}

/// `vmware-rpctool "info-set guestinfo.kiln.status <json>"`: one argument, as open-vm-tools
/// expects; readable from vSphere as the VM's `guestinfo.kiln.status` variable.
pub fn info_set(rpctool: &Path, key: &str, value: &Redacted) -> Result<(), ChannelError> {
    let err = |what: String| ChannelError {
        channel: "vmware",
        target: rpctool.display().to_string(),
        what,
    };
    let arg = format!("info-set {key} {}", value.as_str());
    let out = service::output(rpctool, &[&arg], Instant::now() + Duration::from_secs(5))
        .map_err(|e| err(e.message().to_string()))?;
    if out.success {
        Ok(())
    } else {
        Err(err(format!(
            "info-set {key} failed: {}",
            out.stderr_text()
                .trim()
                .lines()
                .next()
                .unwrap_or("no output")
        )))
    }
}
