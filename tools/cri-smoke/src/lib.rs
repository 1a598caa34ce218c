//! cri-smoke: one real pod on a node's container runtime, spoken to over CRI as kubelet
//! speaks to it. The boot tests run it from the stand-in kubelet after its "bootstrap"
//! (docs/boot-tests.md, "A real pod"); [`pod::run`] is the sequence, and this module holds
//! the pure parts it decides with: the CNI configuration's subnets, kubelet's cgroup parent
//! for a pod, and what "ready" means in a runtime's `Status`.

pub mod pod;

use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// What went wrong, named by the CRI call or the check that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime socket could not be reached.
    #[error("connect to the CRI endpoint {endpoint}: {detail}")]
    Connect { endpoint: String, detail: String },
    /// A CRI call returned an error (the runtime's own message, in gRPC's Go wording).
    #[error("{call} failed: rpc error: code = {code} desc = {desc}")]
    Rpc {
        call: &'static str,
        code: String,
        desc: String,
    },
    /// A CRI call did not answer in time.
    #[error("{call} did not answer within {secs} s")]
    Timeout { call: &'static str, secs: u64 },
    /// A check on what the runtime answered failed.
    #[error("{check}: {detail}")]
    Check { check: &'static str, detail: String },
    /// The node's CNI configuration could not be read.
    #[error("CNI configuration {}: {detail}", path.display())]
    Cni { path: PathBuf, detail: String },
}

/// Which cgroup driver kubelet uses (`cgroupDriver` in its config; `cgroupfs` by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupDriver {
    /// Cgroups as systemd slices.
    Systemd,
    /// Cgroups as plain directories.
    Cgroupfs,
}

impl CgroupDriver {
    /// `systemd` or `cgroupfs`, as kubelet's config spells them.
    pub fn parse(s: &str) -> Option<CgroupDriver> {
        match s {
            "systemd" => Some(CgroupDriver::Systemd),
            "cgroupfs" => Some(CgroupDriver::Cgroupfs),
            _ => None,
        }
    }

    /// The cgroup parent kubelet hands the runtime for a best-effort pod: with the systemd
    /// driver a slice name (`kubepods-besteffort-pod<uid, - as _>.slice`, which systemd
    /// nests under `kubepods-besteffort.slice` and `kubepods.slice`), with cgroupfs a path
    /// (`/kubepods/besteffort/pod<uid>`); kubelet's `pkg/kubelet/cm` (cgroup_manager_linux.go,
    /// `CgroupName.ToSystemd` / `ToCgroupfs`). containerd passes a `.slice` parent to runc as
    /// `slice:cri-containerd:<id>` and anything else as a path, and runc refuses a path when
    /// `SystemdCgroup = true`: that is how a driver mismatch shows at the first pod.
    pub fn pod_cgroup_parent(self, uid: &str) -> String {
        match self {
            CgroupDriver::Systemd => {
                format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_"))
            }
            CgroupDriver::Cgroupfs => format!("/kubepods/besteffort/pod{uid}"),
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupDriver::Systemd => "systemd",
            CgroupDriver::Cgroupfs => "cgroupfs",
        })
    }
}

/// An IPv4 subnet, `a.b.c.d/len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    /// The network address as written.
    pub addr: Ipv4Addr,
    /// Prefix length, 0–32.
    pub len: u8,
}

impl Subnet {
    /// Parses `10.85.0.0/24`.
    pub fn parse(s: &str) -> Option<Subnet> {
        let (a, l) = s.split_once('/')?;
        let len: u8 = l.parse().ok().filter(|l| *l <= 32)?;
        Some(Subnet {
            addr: a.parse().ok()?,
            len,
        })
    }

    /// Whether `ip` lies inside.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
        u32::from(ip) & mask == u32::from(self.addr) & mask
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// A network configuration list as containerd's CNI library loads it: its name and the
/// IPv4 subnets its host-local IPAM hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniNetwork {
    /// The file it came from.
    pub file: PathBuf,
    /// `name`.
    pub name: String,
    /// Every IPv4 `subnet` of a `host-local` IPAM (`ranges` or the older `subnet`).
    pub subnets: Vec<Subnet>,
}

/// The extensions libcni's `ConfFiles` accepts, as containerd's CNI loader asks for them.
const CNI_EXTENSIONS: &[&str] = &["conf", "conflist", "json"];

/// The configuration containerd uses: the first file of `dir` in lexical order with a CNI
/// extension (libcni `ConfFiles` sorts the names; go-cni loads the first one).
pub fn first_cni_file(dir: &Path) -> Result<PathBuf, Error> {
    let cni = |detail: String| Error::Cni {
        path: dir.to_path_buf(),
        detail,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| cni(e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| CNI_EXTENSIONS.contains(&x))
        })
        .collect();
    files.sort();
    files.into_iter().next().ok_or_else(|| {
        cni("no .conf, .conflist or .json file: the pod network has no configuration".into())
    })
}

/// Reads a `.conflist` (or single-plugin `.conf`) and the host-local subnets in it.
pub fn parse_cni(file: &Path, text: &str) -> Result<CniNetwork, Error> {
    let cni = |detail: String| Error::Cni {
        path: file.to_path_buf(),
        detail,
    };
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| cni(format!("not JSON: {e}")))?;
    let name = v["name"]
        .as_str()
        .ok_or_else(|| cni("no \"name\"".into()))?
        .to_string();
    let plugins: Vec<&serde_json::Value> = match v["plugins"].as_array() {
        Some(list) => list.iter().collect(),
        None => vec![&v],
    };
    let mut subnets = Vec::new();
    for p in plugins {
        let ipam = &p["ipam"];
        if ipam["type"] != "host-local" {
            continue;
        }
        let mut words: Vec<&str> = ipam["subnet"].as_str().into_iter().collect();
        for set in ipam["ranges"].as_array().into_iter().flatten() {
            for r in set.as_array().into_iter().flatten() {
                words.extend(r["subnet"].as_str());
            }
        }
        for w in words {
            // IPv6 ranges are legal; this check is about the IPv4 pod address.
            if w.contains(':') {
                continue;
            }
            subnets.push(Subnet::parse(w).ok_or_else(|| cni(format!("bad subnet {w:?}")))?);
        }
    }
    if subnets.is_empty() {
        return Err(cni(
            "no host-local IPv4 subnet: cannot tell which addresses pods should get".into(),
        ));
    }
    Ok(CniNetwork {
        file: file.to_path_buf(),
        name,
        subnets,
    })
}

/// One condition of a runtime's `Status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `RuntimeReady`, `NetworkReady`, …
    pub kind: String,
    /// Whether it holds.
    pub status: bool,
    /// Why not, in the runtime's words.
    pub reason: String,
    /// More of the same.
    pub message: String,
}

/// The conditions kubelet requires before it runs pods (`RuntimeReady` and `NetworkReady`,
/// kubelet's `pkg/kubelet/kubelet.go` `updateRuntimeUp`), or the ones that do not hold.
pub fn not_ready(conditions: &[Condition]) -> Option<String> {
    let mut bad = Vec::new();
    for want in ["RuntimeReady", "NetworkReady"] {
        match conditions.iter().find(|c| c.kind == want) {
            Some(c) if c.status => {}
            Some(c) => bad.push(format!(
                "{want}=false reason:{} message:{}",
                c.reason, c.message
            )),
            None => bad.push(format!("{want} missing from the runtime's status")),
        }
    }
    (!bad.is_empty()).then(|| bad.join("; "))
}

/// The sandbox image in the `config` entry of a verbose `Status` (containerd 1.x calls it
/// `sandboxImage`; 2.x moved it to the image service's `pinnedImages.sandbox`, which 2.1's
/// Status no longer shows: see [`info_image`]).
pub fn sandbox_image(config_json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(config_json).ok()?;
    v["sandboxImage"]
        .as_str()
        .or_else(|| v["pinnedImages"]["sandbox"].as_str())
        .or_else(|| v["PinnedImages"]["sandbox"].as_str())
        .map(str::to_string)
}

/// The image a sandbox was made from, from the `info` entry of a verbose `PodSandboxStatus`
/// (containerd's `{"image": "registry.k8s.io/pause:3.10.2", …}`).
pub fn info_image(info_json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(info_json).ok()?;
    v["image"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// `name` (`REPO:TAG`) pinned by the digest of the image store's repo digest for the same
/// repository (`REPO@sha256:…`): `REPO:TAG@sha256:…`, the form a digest-pinned reference
/// takes. `None` when no repo digest names that repository.
pub fn with_repo_digest(name: &str, repo_digests: &[String]) -> Option<String> {
    // The repository is the name without its tag: a `:` after the last `/` (a registry's
    // port comes before it).
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    let repo = match name[slash..].rfind(':') {
        Some(i) => &name[..slash + i],
        None => name,
    };
    repo_digests.iter().find_map(|d| {
        let digest = d.strip_prefix(repo)?.strip_prefix('@')?;
        digest
            .starts_with("sha256:")
            .then(|| format!("{name}@{digest}"))
    })
}

/// The sandbox's process id from the `info` entry of a verbose `PodSandboxStatus`
/// (containerd's `{"pid": N, …}`).
pub fn sandbox_pid(info_json: &str) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_str(info_json).ok()?;
    v["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0)
}

/// Lines a container wrote, from a CRI log file (`<time> <stream> <F|P> <text>` per line).
pub fn cri_log_text(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(4, ' ');
            let (_time, _stream, _tag) = (parts.next()?, parts.next()?, parts.next()?);
            Some(parts.next().unwrap_or("").to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets() {
        for (net, ip, inside) in [
            ("10.85.0.0/24", "10.85.0.2", true),
            ("10.85.0.0/24", "10.85.1.2", false),
            ("10.85.0.0/16", "10.85.200.9", true),
            ("0.0.0.0/0", "1.2.3.4", true),
            ("10.85.0.7/32", "10.85.0.7", true),
            ("10.85.0.7/32", "10.85.0.8", false),
        ] {
            let s = Subnet::parse(net).unwrap();
            assert_eq!(s.contains(ip.parse().unwrap()), inside, "{net} {ip}");
        }
        for bad in ["10.85.0.0", "10.85.0.0/33", "x/24", "10.85.0.0/-1"] {
            assert_eq!(Subnet::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn conflist_subnets() {
        let f = Path::new("/etc/cni/net.d/10-x.conflist");
        let list = r#"{"cniVersion":"1.0.0","name":"kiln-test","plugins":[
            {"type":"bridge","bridge":"kiln0","ipam":{"type":"host-local",
             "ranges":[[{"subnet":"10.85.0.0/24"}],[{"subnet":"fd00:85::/64"}]]}},
            {"type":"portmap"}]}"#;
        let n = parse_cni(f, list).unwrap();
        assert_eq!(n.name, "kiln-test");
        assert_eq!(n.subnets, [Subnet::parse("10.85.0.0/24").unwrap()]);
        let old = r#"{"name":"old","type":"bridge","ipam":{"type":"host-local","subnet":"10.22.0.0/16"}}"#;
        assert_eq!(parse_cni(f, old).unwrap().subnets[0].len, 16);
        for (bad, says) in [
            ("{", "not JSON"),
            (r#"{"plugins":[]}"#, "no \"name\""),
            (
                r#"{"name":"d","plugins":[{"type":"bridge","ipam":{"type":"dhcp"}}]}"#,
                "no host-local IPv4 subnet",
            ),
            (
                r#"{"name":"d","plugins":[{"ipam":{"type":"host-local","subnet":"10.0.0.0/40"}}]}"#,
                "bad subnet",
            ),
        ] {
            let e = parse_cni(f, bad).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("10-x.conflist"), "{e}");
        }
    }

    #[test]
    fn first_cni_file_is_lexical_and_named() {
        let d = std::env::temp_dir().join(format!("cri-smoke-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let e = first_cni_file(&d).unwrap_err().to_string();
        assert!(e.contains("no .conf, .conflist or .json"), "{e}");
        for n in ["20-b.conflist", "README", "10-a.conf"] {
            std::fs::write(d.join(n), "{}").unwrap();
        }
        assert_eq!(first_cni_file(&d).unwrap(), d.join("10-a.conf"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn cgroup_parents_follow_the_driver() {
        let uid = "0b6f1d2e-aaaa-4bbb-8ccc-123456789abc";
        assert_eq!(
            CgroupDriver::Systemd.pod_cgroup_parent(uid),
            "kubepods-besteffort-pod0b6f1d2e_aaaa_4bbb_8ccc_123456789abc.slice"
        );
        assert_eq!(
            CgroupDriver::Cgroupfs.pod_cgroup_parent(uid),
            format!("/kubepods/besteffort/pod{uid}")
        );
        assert_eq!(CgroupDriver::parse("systemd"), Some(CgroupDriver::Systemd));
        assert_eq!(CgroupDriver::parse("Systemd"), None);
    }

    #[test]
    fn readiness_names_what_is_missing() {
        let c = |kind: &str, status: bool| Condition {
            kind: kind.into(),
            status,
            reason: if status { "" } else { "NetworkPluginNotReady" }.into(),
            message: if status {
                ""
            } else {
                "cni config uninitialized"
            }
            .into(),
        };
        assert_eq!(
            not_ready(&[c("RuntimeReady", true), c("NetworkReady", true)]),
            None
        );
        let why = not_ready(&[c("RuntimeReady", true), c("NetworkReady", false)]).unwrap();
        assert!(
            why.contains(
                "NetworkReady=false reason:NetworkPluginNotReady message:cni config uninitialized"
            ),
            "{why}"
        );
        let why = not_ready(&[c("NetworkReady", true)]).unwrap();
        assert!(why.contains("RuntimeReady missing"), "{why}");
    }

    #[test]
    fn sandbox_image_from_either_config_shape() {
        assert_eq!(
            sandbox_image(r#"{"sandboxImage":"registry.k8s.io/pause:3.10"}"#).as_deref(),
            Some("registry.k8s.io/pause:3.10")
        );
        assert_eq!(
            sandbox_image(r#"{"pinnedImages":{"sandbox":"registry.k8s.io/pause:3.10"}}"#)
                .as_deref(),
            Some("registry.k8s.io/pause:3.10")
        );
        assert_eq!(sandbox_image("{}"), None);
        assert_eq!(sandbox_image("not json"), None);
    }

    #[test]
    fn the_running_sandboxs_image_is_pinned_by_its_repo_digest() {
        assert_eq!(
            info_image(r#"{"pid":7,"image":"registry.k8s.io/pause:3.10.2"}"#).as_deref(),
            Some("registry.k8s.io/pause:3.10.2")
        );
        assert_eq!(info_image(r#"{"pid":7,"image":""}"#), None);
        assert_eq!(info_image("not json"), None);
        let d = format!("sha256:{}", "ab".repeat(32));
        let digests = vec![
            format!("registry.k8s.io/other@{d}"),
            format!("registry.k8s.io/pause@{d}"),
        ];
        assert_eq!(
            with_repo_digest("registry.k8s.io/pause:3.10.2", &digests),
            Some(format!("registry.k8s.io/pause:3.10.2@{d}"))
        );
        // A registry port is not a tag; a repository that only shares a prefix is not it.
        assert_eq!(
            with_repo_digest("reg:5000/pause:1", &[format!("reg:5000/pause@{d}")]),
            Some(format!("reg:5000/pause:1@{d}"))
        );
        assert_eq!(
            with_repo_digest(
                "registry.k8s.io/pause:3.10.2",
                &[format!("registry.k8s.io/pause2@{d}")]
            ),
            None
        );
        assert_eq!(with_repo_digest("registry.k8s.io/pause:3.10.2", &[]), None);
    }

    #[test]
    fn sandbox_pid_from_verbose_info() {
        assert_eq!(
            sandbox_pid(r#"{"pid":1234,"processStatus":"running"}"#),
            Some(1234)
        );
        assert_eq!(sandbox_pid(r#"{"pid":0}"#), None);
        assert_eq!(sandbox_pid("{}"), None);
    }

    #[test]
    fn cri_log_lines() {
        let log = "2026-11-23T23:40:01.1Z stdout F kiln-cri-smoke: hello\n2026-11-23T23:40:01.2Z stderr P part\n";
        assert_eq!(cri_log_text(log), ["kiln-cri-smoke: hello", "part"]);
    }
}
