//! Azure through the Instance Metadata Service: one JSON document from
//! `/metadata/instance` (pinned api-version, `Metadata: true` header).
//! One request instead of one `format=text` call per field keeps the boot path short.
//! It asks for api-version 2021-02-01 and reads nothing newer: the oldest version it
//! reads is the one it pins (`zone`, `vmScaleSetName`, `osProfile.computerName` and the
//! IPv6 list are optional within it).

use std::path::Path;

#[cfg(not(windows))]
use crate::contract::paths;
use crate::contract::Provider;
use crate::error::Error;
use crate::json::Value;
use crate::netaddr::Candidate;
use crate::provider::common::{doc_field, get_json, Context, Metadata, MetadataSource};
use crate::provider::common::{ChannelError, ReportTarget};
use crate::redact::Redacted;

/// The api-version firstboot is written and tested against.
pub const API_VERSION: &str = "2021-02-01";

/// The KVP pool the guest writes and the Hyper-V host reads (pool 1, "guest" records).
pub const KVP_POOL: &str = "/var/lib/hyperv/.kvp_pool_1";
/// `HV_KVP_EXCHANGE_MAX_KEY_SIZE`: a record's key field, NUL-padded.
pub const KVP_KEY_SIZE: usize = 512;
/// `HV_KVP_EXCHANGE_MAX_VALUE_SIZE`: a record's value field, NUL-padded.
pub const KVP_VALUE_SIZE: usize = 2048;
/// One record: key then value.
pub const KVP_RECORD_SIZE: usize = KVP_KEY_SIZE + KVP_VALUE_SIZE;
/// The most of a value the Azure host reads back: cloud-init's `HV_KVP_AZURE_MAX_VALUE_SIZE`
/// is 1024, azure-init's 1022 (511 UTF-16 units and a NUL); kiln keeps to the smaller.
/// Longer values are split into `KEY|0`, `KEY|1`, … records.
pub const KVP_AZURE_VALUE_SIZE: usize = 1022;
/// The KVP key kiln writes (and the prefix of its chunk keys).
pub const KVP_KEY: &str = "KILN_STATUS";

#[derive(Debug)]
pub struct Azure;

impl MetadataSource for Azure {
    fn provider(&self) -> Provider {
        Provider::Azure
    }

    fn report_back(&self, to: &ReportTarget, status_json: &Redacted) -> Result<(), ChannelError> {
        #[cfg(windows)]
        {
            // Windows has no pool file: the guest pool is a registry key (windows::kvp).
            let _ = to;
            crate::windows::kvp::publish(KVP_KEY, &kvp_chunks(status_json.as_str())).map_err(
                |what| ChannelError {
                    channel: "azure-kvp",
                    target: format!("HKLM\\{}", crate::windows::kvp::GUEST_KEY),
                    what,
                },
            )
        }
        #[cfg(not(windows))]
        kvp_publish(&paths::under(&to.root, KVP_POOL), KVP_KEY, status_json)
    }

    fn fetch(&self, cx: &Context<'_>) -> Result<Metadata, Error> {
        let url = format!("{}/metadata/instance?api-version={API_VERSION}", cx.base());
        let doc = get_json(cx, &url, &[("Metadata", "true")])?;
        from_document(&doc, &url)
    }
}

/// Turns the instance document into metadata; `url` names the source in errors.
pub fn from_document(doc: &Value, url: &str) -> Result<Metadata, Error> {
    let field = |path: &str, required: bool| doc_field(doc, url, path, required);
    let vm_id = field("compute/vmId", true)?;
    let name = field("compute/name", true)?;
    let sub = field("compute/subscriptionId", true)?;
    let rg = field("compute/resourceGroupName", true)?;
    let location = field("compute/location", true)?;
    let zone = field("compute/zone", false)?;
    let scale_set = field("compute/vmScaleSetName", false)?;
    let computer = field("compute/osProfile/computerName", false)?;
    let addresses = addresses(doc);
    // cloud-provider-azure writes regions and zones in lower case (`makeZone`); IMDS
    // answers the location as the VM was created (`SwedenCentral` happens).
    let location = location.to_ascii_lowercase();
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
        addresses,
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
        lifecycle_state: None,
    })
}

/// Every private address of every interface, interface by interface, IPv4 before IPv6.
fn addresses(doc: &Value) -> Vec<Candidate> {
    let mut out = Vec::new();
    let interfaces = doc
        .pointer("network/interface")
        .and_then(Value::as_array)
        .unwrap_or(&[]);
    for (i, nic) in interfaces.iter().enumerate() {
        for family in ["ipv4", "ipv6"] {
            let list = nic
                .pointer(&format!("{family}/ipAddress"))
                .and_then(Value::as_array)
                .unwrap_or(&[]);
            for (j, a) in list.iter().enumerate() {
                if let Some(v) = a.get("privateIpAddress").and_then(Value::as_text) {
                    out.push(Candidate::new(
                        format!("network/interface/{i}/{family}/ipAddress/{j}/privateIpAddress"),
                        v,
                    ));
                }
            }
        }
    }
    out
}

/// Encodes one KVP record: the key and value, each NUL-padded to its fixed field size.
/// Returns `None` when either does not fit (a terminating NUL included).
pub fn kvp_record(key: &str, value: &str) -> Option<[u8; KVP_RECORD_SIZE]> {
    if key.len() >= KVP_KEY_SIZE || value.len() >= KVP_VALUE_SIZE {
        return None;
    }
    let mut rec = [0u8; KVP_RECORD_SIZE];
    rec[..key.len()].copy_from_slice(key.as_bytes());
    rec[KVP_KEY_SIZE..KVP_KEY_SIZE + value.len()].copy_from_slice(value.as_bytes());
    Some(rec)
}

/// Decodes a pool file into `(key, value)` records; a trailing partial record is ignored.
pub fn kvp_parse(bytes: &[u8]) -> Vec<(String, String)> {
    let field = |b: &[u8]| {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    };
    bytes
        .chunks_exact(KVP_RECORD_SIZE)
        .map(|r| (field(&r[..KVP_KEY_SIZE]), field(&r[KVP_KEY_SIZE..])))
        .collect()
}

/// Splits `value` into pieces of at most [`KVP_AZURE_VALUE_SIZE`] bytes on char boundaries.
pub fn kvp_chunks(value: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = value;
    while !rest.is_empty() {
        let mut end = rest.len().min(KVP_AZURE_VALUE_SIZE);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out
}

/// Replaces kiln's records in the KVP pool: `KEY|0`, `KEY|1`, … hold the JSON in host-readable
/// pieces and `KEY` holds the piece count. Other writers' records are kept, in place and in
/// order. The file is updated in place under an exclusive `flock` (what cloud-init and the
/// Hyper-V KVP daemon's other clients do), not renamed: the daemon reads it by name.
pub fn kvp_publish(pool: &Path, key: &str, value: &Redacted) -> Result<(), ChannelError> {
    let value = value.as_str();
    use std::io::{Read, Seek, SeekFrom, Write};
    let err = |what: String| ChannelError {
        channel: "azure-kvp",
        target: pool.display().to_string(),
        what,
    };
    // Updated in place, so never through a link: a planted one would aim the rewrite at
    // another file.
    let mut f = crate::fsutil::open_in_place(pool).map_err(|e| err(format!("opening: {e}")))?;
    let _lock = lock::Exclusive::new(&f).map_err(|e| err(format!("locking: {e}")))?;
    let mut old = Vec::new();
    f.read_to_end(&mut old)
        .map_err(|e| err(format!("reading: {e}")))?;
    let mut out = Vec::with_capacity(old.len() + 4 * KVP_RECORD_SIZE);
    let chunk_prefix = format!("{key}|");
    for rec in old.chunks_exact(KVP_RECORD_SIZE) {
        let k = &rec[..KVP_KEY_SIZE];
        let k = &k[..k.iter().position(|&c| c == 0).unwrap_or(k.len())];
        if k == key.as_bytes() || k.starts_with(chunk_prefix.as_bytes()) {
            continue;
        }
        out.extend_from_slice(rec);
    }
    let chunks = kvp_chunks(value);
    let count = chunks.len().to_string();
    // `KEY` and the count first, then `KEY|0`, `KEY|1`, … and the pieces.
    for (i, v) in std::iter::once(count.as_str()).chain(chunks).enumerate() {
        let k = match i {
            0 => key.to_string(),
            _ => format!("{chunk_prefix}{}", i - 1),
        };
        let rec = kvp_record(&k, v).ok_or_else(|| err(format!("key {k:?} too long")))?;
        out.extend_from_slice(&rec);
    }
    f.seek(SeekFrom::Start(0))
        .and_then(|_| f.write_all(&out))
        .and_then(|()| f.set_len(out.len() as u64))
        .and_then(|()| f.sync_all())
        .map_err(|e| err(format!("writing: {e}")))
}

/// Reads kiln's status back from a KVP pool (for tests and `status` on Azure).
pub fn kvp_read_status(pool: &Path, key: &str) -> Option<String> {
    let bytes = std::fs::read(pool).ok()?;
    let recs = kvp_parse(&bytes);
    let n: usize = recs.iter().find(|(k, _)| k == key)?.1.parse().ok()?;
    let mut s = String::new();
    for i in 0..n {
        let k = format!("{key}|{i}");
        s.push_str(&recs.iter().find(|(kk, _)| *kk == k)?.1);
    }
    Some(s)
}

#[cfg(unix)]
mod lock {
    use std::os::unix::io::AsRawFd;

    extern "C" {
        fn flock(fd: i32, operation: i32) -> i32;
    }
    const LOCK_EX: i32 = 2;
    const LOCK_UN: i32 = 8;

    /// Holds an exclusive `flock` until dropped.
    pub struct Exclusive(i32);

    impl Exclusive {
        pub fn new(f: &std::fs::File) -> std::io::Result<Exclusive> {
            let fd = f.as_raw_fd();
            // SAFETY: fd is an open descriptor owned by `f`, which outlives the guard.
            if unsafe { flock(fd, LOCK_EX) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Exclusive(fd))
        }
    }

    impl Drop for Exclusive {
        fn drop(&mut self) {
            // SAFETY: as above; unlocking a descriptor we locked.
            unsafe {
                flock(self.0, LOCK_UN);
            }
        }
    }
}

#[cfg(not(unix))]
mod lock {
    /// No KVP daemon outside Linux: nothing to lock against.
    pub struct Exclusive;

    impl Exclusive {
        pub fn new(_f: &std::fs::File) -> std::io::Result<Exclusive> {
            Ok(Exclusive)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{fetch, serve};
    use super::super::{Metadata, Provider};
    use super::*;

    #[test]
    fn reads_one_json_document() {
        let srv = serve(
            "azure",
            &[("Content-Type", "application/json; charset=utf-8")],
        );
        let md = fetch(Provider::Azure, &srv.url).unwrap();
        assert_eq!(
            md,
            Metadata {
                hostname: "kiln-worker-0".into(),
                addresses: md.addresses.clone(),
                instance_id: "13f56399-bd52-4150-9748-7190aae1ff21".into(),
                instance_type: "Standard_D4s_v5".into(),
                zone: "westeurope-2".into(),
                region: "westeurope".into(),
                provider_id: "azure:///subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/kiln-rg/providers/Microsoft.Compute/virtualMachines/kiln-worker-0".into(),
                lifecycle_state: None,
            }
        );
        assert_eq!(
            md.addresses.first().map(|c| c.value.as_str()),
            Some("10.1.0.4")
        );
        let reqs = srv.requests();
        assert_eq!(reqs.len(), 1);
        assert_eq!(
            reqs[0].path,
            format!("/metadata/instance?api-version={API_VERSION}")
        );
        assert_eq!(reqs[0].header("metadata"), Some("true"));
    }

    #[test]
    fn kvp_records_round_trip() {
        let rec = kvp_record("K", "v").unwrap();
        assert_eq!(rec.len(), KVP_RECORD_SIZE);
        assert_eq!(kvp_parse(&rec), [("K".to_string(), "v".to_string())]);
        assert!(kvp_record(&"k".repeat(KVP_KEY_SIZE), "v").is_none());
        let long = "é".repeat(600);
        let chunks = kvp_chunks(&long);
        assert!(chunks.iter().all(|c| c.len() <= KVP_AZURE_VALUE_SIZE));
        assert_eq!(chunks.concat(), long);
    }
}
