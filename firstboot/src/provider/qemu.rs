//! QEMU: fw_cfg entries the VM was started with (`-fw_cfg name=opt/kiln/<key>,string=…`),
//! read from sysfs, so boot tests have a metadata source without any network.

use crate::contract::paths;
use crate::contract::Provider;
use crate::error::Error;
use crate::fsutil;
use crate::provider::common::{check_token, named_values, Context, Metadata, MetadataSource};
use crate::Reason;

/// Where the kernel's `qemu_fw_cfg` driver shows the `opt/kiln/…` entries.
pub const FW_CFG_DIR: &str = "/sys/firmware/qemu_fw_cfg/by_name/opt/kiln";

#[derive(Debug)]
pub struct Qemu;

fn entry(cx: &Context<'_>, key: &str) -> Result<String, Error> {
    let p = paths::under(cx.root, FW_CFG_DIR).join(key).join("raw");
    let v = fsutil::read_capped(&p, 4096)
        .map_err(|m| Error::metadata(Reason::MetadataInvalid, m))?
        .unwrap_or_default();
    let v = v.trim().to_string();
    check_token(&v, key, &p.display().to_string())?;
    Ok(v)
}

impl MetadataSource for Qemu {
    fn provider(&self) -> Provider {
        Provider::Qemu
    }

    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error> {
        let instance_id = entry(cx, "instance-id")?;
        if instance_id.is_empty() {
            return Err(Error::metadata(
                Reason::MetadataInvalid,
                format!(
                    "{}/instance-id/raw: expected an instance id (start QEMU with -fw_cfg name=opt/kiln/instance-id,string=…), found none",
                    paths::under(cx.root, FW_CFG_DIR).display()
                ),
            ));
        }
        let provider_id = format!("kiln://qemu/{instance_id}");
        named_values(
            "fw_cfg opt/kiln/",
            &|key| entry(cx, key),
            instance_id,
            provider_id,
        )
    }
}
