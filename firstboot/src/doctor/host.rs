//! The node's own state: swap, cgroups, netfilter, the container runtime, disk space. Each
//! rule says where kubelet or kubeadm makes it.

use std::time::Duration;

use super::cri;
use super::model::{Check, Node};
use crate::contract::paths;

/// A `key: value` line of kubelet's YAML config, top level only (kiln writes it flat).
/// Swap: kubelet refuses to start with swap on unless `failSwapOn: false`
/// (cmd/kubelet/app/server.go: "running with swap on is not supported, please disable swap
/// or set --fail-swap-on flag to false"; KubeletConfiguration failSwapOn defaults to true).
pub fn swap(node: &Node) -> Check {
    const NAME: &str = "swap";
    let Some(text) = node.read("/proc/swaps") else {
        return Check::skip(NAME, "/proc/swaps is not readable");
    };
    let active: Vec<&str> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    if active.is_empty() {
        return Check::ok(NAME, "no swap in /proc/swaps");
    }
    let set = node.kubelet_value("failSwapOn");
    let cfg = set
        .as_ref()
        .map_or_else(|| node.kubelet_config(), |(_, f)| f.clone());
    let allows = set.is_some_and(|(v, _)| v == "false");
    let what = format!("swap is on ({})", active.join(", "));
    if allows {
        Check::warn(
            NAME,
            format!("{what}; {cfg} sets failSwapOn: false"),
            "make sure memorySwap.swapBehavior is what the cluster expects",
        )
    } else {
        Check::fail(
            NAME,
            format!("{what} and {cfg} does not set failSwapOn: false, so kubelet will not start"),
            "disable swap (swapoff -a, and drop it from /etc/fstab or the swap unit) or set failSwapOn: false",
        )
    }
}

/// cgroup v2: kubelet 1.35 and later refuse cgroup v1 unless `failCgroupV1: false`
/// (KEP-5573; the error is "kubelet is configured to not run on a host using cgroup v1").
pub fn cgroup_v2(node: &Node) -> Check {
    const NAME: &str = "cgroup-v2";
    if node.at("/sys/fs/cgroup/cgroup.controllers").is_file() {
        let controllers = node
            .read("/sys/fs/cgroup/cgroup.controllers")
            .unwrap_or_default();
        let missing: Vec<&str> = ["cpu", "memory", "pids"]
            .into_iter()
            .filter(|c| !controllers.split_whitespace().any(|x| x == *c))
            .collect();
        if missing.is_empty() {
            Check::ok(NAME, format!("unified hierarchy: {}", controllers.trim()))
        } else {
            Check::fail(
                NAME,
                format!("cgroup v2 without the {} controller(s)", missing.join(", ")),
                "enable them in the kernel and at the root cgroup (cgroup.subtree_control)",
            )
        }
    } else if node.at("/sys/fs/cgroup").is_dir() {
        Check::fail(
            NAME,
            "/sys/fs/cgroup is cgroup v1 (no cgroup.controllers): kubelet 1.35+ will not start",
            "boot with systemd.unified_cgroup_hierarchy=1 (or set failCgroupV1: false, deprecated)",
        )
    } else {
        Check::skip(NAME, "/sys/fs/cgroup is not there")
    }
}

/// The cgroup driver of kubelet (`cgroupDriver`, default cgroupfs) and of containerd's runc
/// runtime (`SystemdCgroup`, default false) must agree (kubelet: pkg/kubelet/cm; the
/// mismatch ends in "misconfiguration: kubelet cgroup driver ... is different from docker
/// cgroup driver" or sandbox creation failures, docs/troubleshooting.md).
pub fn cgroup_driver(node: &Node) -> Check {
    const NAME: &str = "cgroup-driver";
    let cfg = node.kubelet_config();
    if node.read(&cfg).is_none() {
        return Check::skip(NAME, format!("{cfg} is not readable"));
    }
    let Some(containerd) = node.read(paths::CONTAINERD_CONFIG) else {
        return Check::skip(
            NAME,
            format!("{} is not readable", paths::CONTAINERD_CONFIG),
        );
    };
    let (kubelet_driver, cfg) = node
        .kubelet_value("cgroupDriver")
        .unwrap_or_else(|| ("cgroupfs".into(), cfg));
    let systemd = containerd.lines().any(|l| {
        let l = l.split('#').next().unwrap_or("").replace(' ', "");
        l == "SystemdCgroup=true"
    });
    let runtime_driver = if systemd { "systemd" } else { "cgroupfs" };
    if kubelet_driver == runtime_driver {
        Check::ok(
            NAME,
            format!("kubelet and containerd both use {runtime_driver}"),
        )
    } else {
        Check::fail(
            NAME,
            format!(
                "{cfg} says cgroupDriver {kubelet_driver}, {} runs runc with {runtime_driver}",
                paths::CONTAINERD_CONFIG
            ),
            "use the systemd driver on both sides (SystemdCgroup = true, cgroupDriver: systemd)",
        )
    }
}

/// Bridged traffic through iptables and IP forwarding: kubeadm's preflight requires both
/// files to read `1` (cmd/kubeadm/app/preflight/checks.go, FileContentCheck on
/// /proc/sys/net/bridge/bridge-nf-call-iptables and /proc/sys/net/ipv4/ip_forward).
pub fn netfilter(node: &Node) -> Vec<Check> {
    let one = |name: &'static str, path: &str, remedy: &str| match node.read(path) {
        Some(v) if v.trim() == "1" => Check::ok(name, format!("{path} = 1")),
        Some(v) => Check::fail(name, format!("{path} = {}", v.trim()), remedy),
        None if path.contains("/bridge/") => Check::fail(
            name,
            format!("{path} does not exist: the br_netfilter module is not loaded"),
            format!(
                "load br_netfilter ({} lists it); then {remedy}",
                paths::MODULES_LOAD_CONF
            ),
        ),
        None => Check::skip(name, format!("{path} is not readable")),
    };
    vec![
        one(
            "br-netfilter",
            "/proc/sys/net/bridge/bridge-nf-call-iptables",
            "set net.bridge.bridge-nf-call-iptables = 1 (kiln's sysctl.d file does)",
        ),
        one(
            "ip-forward",
            "/proc/sys/net/ipv4/ip_forward",
            "set net.ipv4.ip_forward = 1 (kiln's sysctl.d file does)",
        ),
    ]
}

/// The CRI runtime answers `Status` with `RuntimeReady` and `NetworkReady` true: kubelet
/// reports the node NotReady otherwise (pkg/kubelet/kubelet.go updateRuntimeUp;
/// "container runtime network not ready: NetworkReady=false").
pub fn cri(node: &Node) -> Check {
    const NAME: &str = "cri";
    let sock = node.runtime_socket();
    let path = node.at(&sock);
    if !path.exists() {
        return Check::fail(
            NAME,
            format!("{sock} does not exist: containerd is not running"),
            "start containerd (systemctl status containerd; journalctl -u containerd)",
        );
    }
    match cri::status(&path, node.opts.timeout.min(Duration::from_secs(5))) {
        Err(e) => Check::fail(
            NAME,
            format!("{sock}: {e}"),
            "check containerd's log (journalctl -u containerd)",
        ),
        Ok(conds) => {
            let mut bad = Vec::new();
            for want in ["RuntimeReady", "NetworkReady"] {
                match conds.iter().find(|c| c.kind == want) {
                    Some(c) if c.status => {}
                    Some(c) => bad.push(format!("{want}=false ({}: {})", c.reason, c.message)),
                    None => bad.push(format!("{want} not reported")),
                }
            }
            if bad.is_empty() {
                Check::ok(NAME, format!("{sock}: RuntimeReady, NetworkReady"))
            } else {
                let network = bad.iter().all(|b| b.starts_with("NetworkReady"));
                Check::fail(
                    NAME,
                    format!("{sock}: {}", bad.join("; ")),
                    if network {
                        "install the cluster's CNI (a conflist in /etc/cni/net.d and its plugins); until then the node stays NotReady"
                    } else {
                        "check containerd's log (journalctl -u containerd)"
                    },
                )
            }
        }
    }
}

/// Free space under /var/lib: kubelet's default hard eviction is `nodefs.available<10%` and
/// `imagefs.available<15%` (pkg/kubelet/eviction/defaults_linux.go), so below 15% pods are
/// evicted or images cannot be pulled.
pub fn disk(node: &Node) -> Check {
    const NAME: &str = "disk";
    let dir = node.at("/var/lib");
    let Some((avail, total)) = free_space(&dir) else {
        return Check::skip(
            NAME,
            format!("{}: cannot read the file system's size", dir.display()),
        );
    };
    if total == 0 {
        return Check::skip(NAME, "/var/lib: the file system reports no size");
    }
    let pct = avail.saturating_mul(100) / total;
    let text = format!(
        "/var/lib: {} MiB free of {} MiB ({pct}%)",
        avail >> 20,
        total >> 20
    );
    if pct < 10 {
        Check::fail(NAME, text, "free space under /var/lib or grow the disk: below 10% kubelet evicts pods (nodefs.available<10%)")
    } else if pct < 15 {
        Check::warn(
            NAME,
            text,
            "below 15% kubelet evicts for image space (imagefs.available<15%)",
        )
    } else {
        Check::ok(NAME, text)
    }
}

/// Bytes available to unprivileged users and in all, of the file system holding `dir`.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn free_space(dir: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt as _;
    // `struct statvfs` on 64-bit Linux, glibc and musl alike: f_bsize, f_frsize, f_blocks,
    // f_bfree, f_bavail, then fields doctor does not read; the buffer is larger than either.
    #[repr(C)]
    struct Statvfs {
        f_bsize: u64,
        f_frsize: u64,
        f_blocks: u64,
        f_bfree: u64,
        f_bavail: u64,
        rest: [u64; 16],
    }
    extern "C" {
        fn statvfs(path: *const std::ffi::c_char, buf: *mut Statvfs) -> i32;
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut s = Statvfs {
        f_bsize: 0,
        f_frsize: 0,
        f_blocks: 0,
        f_bfree: 0,
        f_bavail: 0,
        rest: [0; 16],
    };
    // SAFETY: `c` is a NUL-terminated path and `s` a writable buffer at least as large as the
    // C library's struct statvfs; statvfs writes nothing else.
    if unsafe { statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    let unit = if s.f_frsize != 0 {
        s.f_frsize
    } else {
        s.f_bsize
    };
    Some((
        s.f_bavail.saturating_mul(unit),
        s.f_blocks.saturating_mul(unit),
    ))
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn free_space(_dir: &std::path::Path) -> Option<(u64, u64)> {
    None
}

#[cfg(test)]
mod tests {
    use crate::doctor::model::yaml_top_level;

    #[test]
    fn yaml_values_are_read_from_top_level_keys_only() {
        let t = "kind: KubeletConfiguration\ncgroupDriver: \"systemd\" # kiln\nauthentication:\n  failSwapOn: true\nfailSwapOn: false\n";
        assert_eq!(
            yaml_top_level(t, "cgroupDriver").as_deref(),
            Some("systemd")
        );
        assert_eq!(yaml_top_level(t, "failSwapOn").as_deref(), Some("false"));
        assert_eq!(yaml_top_level(t, "missing"), None);
    }
}
