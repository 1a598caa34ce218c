//! The machine as kiln-firstboot sees it: CPUs and memory read from `/sys` and `/proc` under a root.

use crate::contract::paths;
use crate::contract::sizing::CniMode;
use crate::fsutil;
use std::path::Path;

// ---------------------------------------------------------------------------------------------
// The machine.

/// What the node has, as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    /// Online CPUs.
    pub cpus: u32,
    /// `MemTotal`, in KiB.
    pub mem_kib: u64,
}

/// Counts the CPUs in a cpu list (`0-3,6,8-9`, `/sys/devices/system/cpu/online`).
pub fn parse_cpu_list(text: &str) -> Option<u32> {
    let mut n: u32 = 0;
    for part in text.trim().split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let a = part.parse::<u32>().ok()?;
                (a, a)
            }
        };
        n = n.checked_add(b.checked_sub(a)?.checked_add(1)?)?;
    }
    Some(n).filter(|n| *n > 0)
}

/// Counts the `processor` lines of `/proc/cpuinfo`.
pub fn parse_cpuinfo(text: &str) -> Option<u32> {
    let n = text
        .lines()
        .filter(|l| {
            l.strip_prefix("processor")
                .is_some_and(|r| r.trim_start().starts_with(':'))
        })
        .count();
    u32::try_from(n).ok().filter(|n| *n > 0)
}

/// `MemTotal` in KiB from `/proc/meminfo`.
pub fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    (words.next() == Some("kB") && n > 0).then_some(n)
}

/// The CPU count under `root` (`/sys/devices/system/cpu/online`, else `/proc/cpuinfo`).
pub fn read_cpus(root: &Path) -> Result<u32, String> {
    let read = |p: &str| fsutil::read_capped(&paths::under(root, p), 1024 * 1024);
    let online = "/sys/devices/system/cpu/online";
    let cpuinfo = "/proc/cpuinfo";
    if let Ok(Some(t)) = read(online) {
        if let Some(n) = parse_cpu_list(&t) {
            return Ok(n);
        }
    }
    match read(cpuinfo) {
        Ok(Some(t)) => parse_cpuinfo(&t),
        _ => None,
    }
    .ok_or_else(|| format!("cannot count CPUs: neither {online} nor {cpuinfo} under the root says"))
}

/// `MemTotal` under `root`, in KiB.
pub fn read_mem_kib(root: &Path) -> Result<u64, String> {
    let p = "/proc/meminfo";
    match fsutil::read_capped(&paths::under(root, p), 1024 * 1024) {
        Ok(Some(t)) => parse_meminfo(&t).ok_or_else(|| format!("{p}: no `MemTotal: N kB` line")),
        Ok(None) => Err(format!("{p}: not found")),
        Err(e) => Err(e),
    }
}

/// The machine under `root`: CPU count and `MemTotal`.
pub fn read_machine(root: &Path) -> Result<Machine, String> {
    Ok(Machine {
        cpus: read_cpus(root)?,
        mem_kib: read_mem_kib(root)?,
    })
}

/// The AWS table's text at `path` ([`paths::NodePaths::aws_eni_table`]) when `mode` needs it;
/// `None` when it is absent or unreadable (the decision then warns that it is missing).
pub fn read_table(path: &Path, mode: Option<CniMode>) -> Option<String> {
    if !mode.is_some_and(CniMode::is_aws) {
        return None;
    }
    fsutil::read_capped(path, 1024 * 1024).ok().flatten()
}
