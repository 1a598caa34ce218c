//! No metadata service (bare metal, or a platform kiln does not know): the node's name is
//! its hostname and its IP is the source address of the route to the API server (the
//! caller's fallback for every source without an address).

use crate::contract::paths;
use crate::contract::Provider;
use crate::error::Error;
use crate::fsutil;
use crate::provider::common::{check_token, Context, Metadata, MetadataSource};

#[derive(Debug)]
pub struct NoMetadata;

impl MetadataSource for NoMetadata {
    fn provider(&self) -> Provider {
        Provider::None
    }

    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error> {
        let mut hostname = String::new();
        for f in ["/proc/sys/kernel/hostname", "/etc/hostname"] {
            let p = paths::under(cx.root, f);
            if let Ok(Some(s)) = fsutil::read_capped(&p, 256) {
                hostname = s.trim().to_ascii_lowercase();
                if !hostname.is_empty() {
                    check_token(&hostname, "hostname", &p.display().to_string())?;
                    break;
                }
            }
        }
        Ok(Metadata {
            hostname,
            ..Metadata::default()
        })
    }
}
