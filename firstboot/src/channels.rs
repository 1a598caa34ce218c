//! Cloud reporting channels that need no inbound connectivity: VMware guestinfo, GCP guest
//! attributes and Azure's Hyper-V KVP pool file. Each publishes the final status JSON; AWS has
//! no such channel and relies on the serial console.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::http::Client;

/// The guestinfo key set on VMware.
pub const VMWARE_KEY: &str = "guestinfo.kiln.status";
/// The guest attribute path under the GCP metadata server.
pub const GCP_ATTRIBUTE_PATH: &str = "/computeMetadata/v1/instance/guest-attributes/kiln/status";
/// The GCP metadata server's default base URL.
pub const GCP_DEFAULT_BASE: &str = "http://169.254.169.254";
/// The KVP pool the guest writes and the Hyper-V host reads (pool 1, "guest" records).
pub const KVP_POOL: &str = "var/lib/hyperv/.kvp_pool_1";
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

/// The channels a run publishes through; all off by default.
#[derive(Debug, Clone, Default)]
pub struct Channels {
    /// `vmware-rpctool`, on VMware.
    pub vmware_rpctool: Option<PathBuf>,
    /// The metadata server's base URL (`http://169.254.169.254`), on GCP.
    pub gcp_base_url: Option<String>,
    /// The KVP pool file, on Azure.
    pub azure_kvp_pool: Option<PathBuf>,
}

impl Channels {
    /// The channel of `provider`: `vmware` → `rpctool`, `gcp` → guest attributes at
    /// `metadata_url` (or the default), `azure` → the KVP pool under `root`.
    pub fn for_provider(
        provider: &str,
        root: &Path,
        metadata_url: Option<&str>,
        rpctool: &str,
    ) -> Channels {
        let mut c = Channels::default();
        match provider {
            "vmware" => c.vmware_rpctool = Some(PathBuf::from(rpctool)),
            "gcp" => c.gcp_base_url = Some(metadata_url.unwrap_or(GCP_DEFAULT_BASE).to_string()),
            "azure" => c.azure_kvp_pool = Some(root.join(KVP_POOL)),
            _ => {}
        }
        c
    }

    /// Publishes `json` on every configured channel; returns the failures (never fatal).
    pub fn publish(&self, json: &str) -> Vec<ChannelError> {
        let mut errs = Vec::new();
        if let Some(tool) = &self.vmware_rpctool {
            if let Err(e) = vmware_info_set(tool, VMWARE_KEY, json) {
                errs.push(e);
            }
        }
        if let Some(base) = &self.gcp_base_url {
            if let Err(e) = gcp_put_status(base, json) {
                errs.push(e);
            }
        }
        if let Some(pool) = &self.azure_kvp_pool {
            if let Err(e) = kvp_publish(pool, KVP_KEY, json) {
                errs.push(e);
            }
        }
        errs
    }
}

/// A channel that did not take the status.
#[derive(Debug)]
pub struct ChannelError {
    pub channel: &'static str,
    pub target: String,
    pub what: String,
}

impl std::fmt::Display for ChannelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} channel {}: {}", self.channel, self.target, self.what)
    }
}

impl std::error::Error for ChannelError {}

/// `vmware-rpctool "info-set guestinfo.kiln.status <json>"`: one argument, as open-vm-tools
/// expects; readable from vSphere as the VM's `guestinfo.kiln.status` variable.
pub fn vmware_info_set(rpctool: &Path, key: &str, value: &str) -> Result<(), ChannelError> {
    let err = |what: String| ChannelError {
        channel: "vmware",
        target: rpctool.display().to_string(),
        what,
    };
    let arg = format!("info-set {key} {value}");
    let out = crate::service::output(rpctool, &[&arg], Instant::now() + Duration::from_secs(5))
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

/// PUTs `value` to the GCP guest attribute `kiln/status` (readable with
/// `gcloud compute instances get-guest-attributes --query-path=kiln/`).
pub fn gcp_put_status(base_url: &str, value: &str) -> Result<(), ChannelError> {
    let base = base_url.trim_end_matches('/');
    let base = base.strip_suffix("/computeMetadata/v1").unwrap_or(base);
    let url = format!("{base}{GCP_ATTRIBUTE_PATH}");
    let err = |what: String| ChannelError {
        channel: "gcp",
        target: url.clone(),
        what,
    };
    let resp = Client::once(Duration::from_secs(2))
        .send_body(
            "PUT",
            &url,
            &[("Metadata-Flavor", "Google")],
            value.as_bytes(),
        )
        .map_err(|e| err(e.to_string()))?;
    let code = resp.status;
    if code == 200 {
        Ok(())
    } else {
        let text = String::from_utf8_lossy(&resp.body);
        Err(err(format!(
            "answered {code} {:?}, expected 200 (are guest attributes enabled: enable-guest-attributes=TRUE?)",
            text.trim()
        )))
    }
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
pub fn kvp_publish(pool: &Path, key: &str, value: &str) -> Result<(), ChannelError> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let err = |what: String| ChannelError {
        channel: "azure-kvp",
        target: pool.display().to_string(),
        what,
    };
    if let Some(dir) = pool.parent() {
        std::fs::create_dir_all(dir).map_err(|e| err(format!("creating the directory: {e}")))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(pool)
        .map_err(|e| err(format!("opening: {e}")))?;
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
    let head = kvp_record(key, &count).ok_or_else(|| err(format!("key {key:?} too long")))?;
    out.extend_from_slice(&head);
    for (i, c) in chunks.iter().enumerate() {
        let k = format!("{chunk_prefix}{i}");
        let rec = kvp_record(&k, c).ok_or_else(|| err(format!("key {k:?} too long")))?;
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
