//! Node sizing at boot: max pods from the image's CNI mode (and, on AWS, the baked ENI table),
//! and kubelet's kube-reserved, system-reserved and hard-eviction thresholds from the image's
//! named formula, the machine's real CPU count and memory, and the max pods just decided.
//! Formulas and sources: `docs/contract.md#sizing`. Everything here is a pure function of its
//! arguments except [`read_machine`], which reads `/sys` and `/proc` under a root.

use std::fmt::Write as _;
use std::path::Path;

use crate::contract::envfile::EnvFile;
use crate::contract::sizing::{
    self as key, parse_pairs, CniMode, Formula, CNI_MODE_EXPECTED, FORMULA_EXPECTED,
};
use crate::contract::{image_env, node_env, paths};
use crate::fsutil;

// ---------------------------------------------------------------------------------------------
// The AWS table.

/// One row of `/usr/lib/kiln/aws-eni.tsv`: what the VPC CNI can hand out on an instance type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EniLimits {
    /// ENIs on the default network card (`defaultMaxENIs`).
    pub enis: u32,
    /// IPv4 addresses per ENI (`ipv4AddressesPerInterface`).
    pub ipv4_per_eni: u32,
    /// The type runs on the Nitro hypervisor (prefix delegation needs it).
    pub nitro: bool,
}

/// Parses one data line `type<TAB>enis<TAB>ipv4_per_eni<TAB>hypervisor`.
fn parse_row(line: &str) -> Option<(&str, EniLimits)> {
    let mut f = line.split('\t');
    let (ty, enis, ips, hv) = (f.next()?, f.next()?, f.next()?, f.next()?);
    if f.next().is_some() || ty.is_empty() {
        return None;
    }
    let enis: u32 = enis.parse().ok().filter(|n| *n > 0)?;
    let ipv4_per_eni: u32 = ips.parse().ok().filter(|n| *n > 0)?;
    let nitro = match hv {
        "nitro" => true,
        "xen" | "unknown" => false,
        _ => return None,
    };
    Some((
        ty,
        EniLimits {
            enis,
            ipv4_per_eni,
            nitro,
        },
    ))
}

/// Parses the whole table (the builder checks it with this before baking it); `#` lines are
/// comments. Errors name the 1-based line.
pub fn parse_table(text: &str) -> Result<Vec<(&str, EniLimits)>, String> {
    let mut out: Vec<(&str, EniLimits)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let row = parse_row(line).ok_or_else(|| {
            format!(
                "line {}: expected `type<TAB>enis<TAB>ipv4_per_eni<TAB>nitro|xen|unknown` with positive counts, found {line:?}",
                i + 1
            )
        })?;
        if out.iter().any(|(t, _)| *t == row.0) {
            return Err(format!("line {}: {} is listed twice", i + 1, row.0));
        }
        out.push(row);
    }
    Ok(out)
}

/// The row for `instance_type` (exact match): a substring search for the type at the start of
/// a line and followed by a tab, then that one line parsed. For the table's last row this is
/// 11 µs against 27 µs for a line-by-line scan in the size-optimised build (docs/benchmarks.md).
/// A line that does not parse is no match (the builder refused such tables at bake time).
pub fn lookup(table: &str, instance_type: &str) -> Option<EniLimits> {
    if instance_type.is_empty() {
        return None;
    }
    let bytes = table.as_bytes();
    let mut from = 0;
    while let Some(i) = table[from..].find(instance_type) {
        let at = from + i;
        let end = at + instance_type.len();
        if (at == 0 || bytes[at - 1] == b'\n') && bytes.get(end) == Some(&b'\t') {
            let line_end = table[at..].find('\n').map_or(table.len(), |n| at + n);
            let line = table[at..line_end]
                .strip_suffix('\r')
                .unwrap_or(&table[at..line_end]);
            return parse_row(line).map(|(_, l)| l);
        }
        from = at + 1;
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Max pods.

/// Pods the VPC CNI can address with secondary IPs: the first IP of each ENI is the ENI's own,
/// plus 2 host-network pods (aws-node, kube-proxy). nodeadm `calculateStandardMaxPods`.
pub fn aws_secondary_ips(l: EniLimits) -> u32 {
    l.enis
        .saturating_mul(l.ipv4_per_eni.saturating_sub(1))
        .saturating_add(2)
}

/// IPv4 addresses in one delegated /28 prefix.
pub const IPS_PER_PREFIX: u32 = 16;

/// Pods the VPC CNI can address with prefix delegation (each secondary slot holds a /28);
/// only on Nitro, else the secondary-IP number. max-pods-calculator.sh.
pub fn aws_prefix_delegation(l: EniLimits) -> u32 {
    if !l.nitro {
        return aws_secondary_ips(l);
    }
    l.enis
        .saturating_mul(
            l.ipv4_per_eni
                .saturating_sub(1)
                .saturating_mul(IPS_PER_PREFIX),
        )
        .saturating_add(2)
}

/// The EKS ceiling: 110 pods up to 30 vCPUs, 250 above (max-pods-calculator.sh
/// `MAX_POD_CEILING_FOR_LOW_CPU` / `_HIGH_CPU`).
pub fn eks_ceiling(cpus: u32) -> u32 {
    if cpus > 30 {
        250
    } else {
        110
    }
}

/// AKS's default max pods with Azure CNI (node subnet).
pub const AKS_AZURE_CNI_PODS: u32 = 30;
/// AKS's default max pods with Azure CNI Overlay.
pub const AKS_AZURE_CNI_OVERLAY_PODS: u32 = 250;
/// GKE Standard's default max pods per node.
pub const GKE_PODS: u32 = 110;

/// Max pods as decided, where it came from, and a warning when a default had to stand in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaxPods {
    /// The value kubelet gets.
    pub value: u32,
    /// How it was decided, for status.json (`aws-vpc-cni: 3 ENIs x (10-1) + 2 = 29`).
    pub source: String,
    /// Set when the mode could not be applied and `DEFAULT_MAX_PODS` stood in.
    pub warning: Option<String>,
}

/// Max pods by `mode` for `instance_type`. `table` is the AWS table's text (`None` when the
/// image has none), `cpus` the online CPU count (for the EKS ceiling), `default` is
/// `DEFAULT_MAX_PODS`.
pub fn max_pods(
    mode: CniMode,
    instance_type: &str,
    cpus: Option<u32>,
    table: Option<&str>,
    default: u32,
) -> MaxPods {
    let fixed = |value: u32, source: &str| MaxPods {
        value,
        source: source.to_string(),
        warning: None,
    };
    let name = mode.name().unwrap_or("fixed");
    match mode {
        CniMode::Fixed(n) => return fixed(n, "MAX_PODS_MODE"),
        CniMode::Overlay => return fixed(default, "overlay: DEFAULT_MAX_PODS"),
        CniMode::AzureCni => return fixed(AKS_AZURE_CNI_PODS, "azure-cni: AKS default"),
        CniMode::AzureCniOverlay => {
            return fixed(AKS_AZURE_CNI_OVERLAY_PODS, "azure-cni-overlay: AKS default")
        }
        CniMode::Gke => return fixed(GKE_PODS, "gke: GKE Standard default"),
        CniMode::AwsVpcCni | CniMode::AwsVpcCniPrefixDelegation => {}
    }
    let fallback = |why: String| {
        MaxPods {
        value: default,
        source: format!("{name}: DEFAULT_MAX_PODS"),
        warning: Some(format!(
            "{why}: max pods is DEFAULT_MAX_PODS={default}, which may exceed the IP addresses the VPC CNI can give this node; set MAX_PODS in {} or refresh the table (scripts/aws-eni-table.sh)",
            paths::NODE_ENV
        )),
    }
    };
    let Some(table) = table else {
        return fallback(format!(
            "MAX_PODS_MODE={name} but {} is missing",
            paths::AWS_ENI_TABLE
        ));
    };
    if instance_type.is_empty() {
        return fallback(format!(
            "MAX_PODS_MODE={name} but the metadata gave no instance type"
        ));
    }
    let Some(l) = lookup(table, instance_type) else {
        return fallback(format!(
            "instance type {instance_type:?} is not in {}",
            paths::AWS_ENI_TABLE
        ));
    };
    let mut source = String::with_capacity(96);
    let uncapped = if mode == CniMode::AwsVpcCniPrefixDelegation && l.nitro {
        let _ = write!(
            source,
            "{name}: {} ENIs x ({}-1) x {IPS_PER_PREFIX} + 2",
            l.enis, l.ipv4_per_eni
        );
        aws_prefix_delegation(l)
    } else {
        let _ = write!(
            source,
            "{name}: {} ENIs x ({}-1) + 2",
            l.enis, l.ipv4_per_eni
        );
        if mode == CniMode::AwsVpcCniPrefixDelegation {
            source.push_str(" (not Nitro: no prefix delegation)");
        }
        aws_secondary_ips(l)
    };
    let _ = write!(source, " = {uncapped}");
    let mut warning = None;
    let ceiling = match cpus {
        Some(c) => eks_ceiling(c),
        None => {
            warning = Some(
                "the CPU count is unknown: max pods is capped at 110, the EKS ceiling for up to 30 vCPUs"
                    .to_string(),
            );
            eks_ceiling(0)
        }
    };
    if uncapped > ceiling {
        let _ = write!(source, ", capped at {ceiling}");
    }
    MaxPods {
        value: uncapped.min(ceiling),
        source,
        warning,
    }
}

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

// ---------------------------------------------------------------------------------------------
// Reservations.

/// Reservation pairs in order (`cpu=70m`, `memory.available<100Mi`): per-name merge keeps the
/// position of a name and replaces its value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pairs(pub Vec<(String, String)>);

impl Pairs {
    fn of(items: &[(&str, String)]) -> Pairs {
        Pairs(
            items
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
    }

    /// Sets each of `other`'s names, in place or appended.
    pub fn merge(&mut self, other: &Pairs) {
        for (k, v) in &other.0 {
            match self.0.iter_mut().find(|(n, _)| n == k) {
                Some((_, old)) => old.clone_from(v),
                None => self.0.push((k.clone(), v.clone())),
            }
        }
    }

    /// The flag value, `a=1,b=2` (or `a<1,b<2` with `sep` `'<'`); empty when there is none.
    pub fn render(&self, sep: char) -> String {
        let mut s = String::with_capacity(64);
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(k);
            s.push(sep);
            s.push_str(v);
        }
        s
    }
}

/// kube-reserved, system-reserved and the hard-eviction thresholds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reserved {
    /// `--kube-reserved`.
    pub kube: Pairs,
    /// `--system-reserved`.
    pub system: Pairs,
    /// `--eviction-hard`.
    pub eviction: Pairs,
}

impl Reserved {
    /// Applies an override per value.
    pub fn merge(&mut self, o: &Reserved) {
        self.kube.merge(&o.kube);
        self.system.merge(&o.system);
        self.eviction.merge(&o.eviction);
    }

    /// True when no flag would be written.
    pub fn is_empty(&self) -> bool {
        self.kube.0.is_empty() && self.system.0.is_empty() && self.eviction.0.is_empty()
    }

    /// Reads the three keys from an env file (image.env for `fixed`, node.env for overrides).
    pub fn from_env(env: &EnvFile) -> Result<Reserved, (&'static str, &'static str)> {
        let get = |k: &'static str, sep: char| {
            parse_pairs(env.get(k).unwrap_or(""), sep)
                .map(Pairs)
                .map_err(|e| (k, e))
        };
        Ok(Reserved {
            kube: get(key::KUBE_RESERVED, '=')?,
            system: get(key::SYSTEM_RESERVED, '=')?,
            eviction: get(key::EVICTION_HARD, '<')?,
        })
    }
}

/// CPU to reserve in millicores by tiers: 6 % of the first core, 1 % of the second, 0.5 % of
/// cores 3–4, 0.25 % of every core above 4; integer per tier, as nodeadm
/// `getCPUMillicoresToReserve` computes it (GKE publishes the same tiers).
pub fn tiered_cpu_millicores(cpus: u32) -> u64 {
    let total = u64::from(cpus) * 1000;
    let ranges = [0, 1000, 2000, 4000, total.max(4000)];
    let rates = [600, 100, 50, 25]; // hundredths of a percent
    let mut reserved = 0;
    for (i, rate) in rates.into_iter().enumerate() {
        let (start, end) = (ranges[i], ranges[i + 1]);
        if total > start {
            reserved += (total.min(end) - start) * rate / 10000;
        }
    }
    reserved
}

/// EKS kube-reserved memory: `11 MiB × max pods + 255 MiB` (nodeadm `getMemoryMebibytesToReserve`).
pub fn eks_memory_mib(max_pods: u32) -> u64 {
    11 * u64::from(max_pods) + 255
}

/// GKE kube-reserved memory in MiB for a machine of `mem_mib`: 255 MiB below 1 GiB, else 25 % of
/// the first 4 GiB, 20 % of the next 4, 10 % of the next 8, 6 % of the next 112 and 2 % above
/// 128 GiB (rounded down to whole MiB).
pub fn gke_memory_mib(mem_mib: u64) -> u64 {
    if mem_mib < 1024 {
        return 255;
    }
    // (tier end in MiB, percent)
    let tiers = [
        (4 * 1024, 25),
        (8 * 1024, 20),
        (16 * 1024, 10),
        (128 * 1024, 6),
        (u64::MAX, 2),
    ];
    let mut start = 0;
    let mut hundredths = 0; // MiB × percent
    for (end, pct) in tiers {
        if mem_mib > start {
            hundredths += (mem_mib.min(end) - start) * pct;
        }
        start = end;
    }
    hundredths / 100
}

/// GKE's extra CPU reservation for nodes that allow more than 110 pods.
pub const GKE_HIGH_DENSITY_EXTRA_MILLICORES: u64 = 400;

/// AKS kube-reserved CPU in millicores by host cores, the published table (1 → 60, 2 → 100,
/// 4 → 140, 8 → 180, 16 → 260, 32 → 420, 64 → 740); a core count between two rows takes the
/// lower row's value.
pub fn aks_cpu_millicores(cpus: u32) -> u64 {
    const TABLE: [(u32, u64); 7] = [
        (1, 60),
        (2, 100),
        (4, 140),
        (8, 180),
        (16, 260),
        (32, 420),
        (64, 740),
    ];
    TABLE
        .iter()
        .rev()
        .find(|(c, _)| cpus >= *c)
        .map_or(60, |(_, m)| *m)
}

/// AKS (≥ 1.29) kube-reserved memory in MiB: the smaller of `20 MiB × max pods + 50 MiB` and
/// 25 % of the machine's memory.
pub fn aks_memory_mib(max_pods: u32, mem_mib: u64) -> u64 {
    (20 * u64::from(max_pods) + 50).min(mem_mib / 4)
}

/// kubelet's Linux default hard-eviction thresholds (kubernetes pkg/kubelet/eviction
/// `DefaultEvictionHard`); written out in full because a given `--eviction-hard` replaces the
/// default map rather than merging into it.
pub const KUBELET_DEFAULT_EVICTION: [(&str, &str); 4] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
];

/// The reservations `formula` gives a machine of `cpus` CPUs and `mem_mib` MiB with `max_pods`.
/// `fixed` is image.env's values (used by [`Formula::Fixed`] only).
pub fn reserve(
    formula: Formula,
    cpus: u32,
    mem_mib: u64,
    max_pods: u32,
    fixed: &Reserved,
) -> Reserved {
    let eviction = || {
        Pairs::of(
            &KUBELET_DEFAULT_EVICTION
                .iter()
                .map(|(k, v)| (*k, v.to_string()))
                .collect::<Vec<_>>(),
        )
    };
    match formula {
        Formula::None => Reserved::default(),
        Formula::Fixed => fixed.clone(),
        Formula::Eks => Reserved {
            kube: Pairs::of(&[
                ("cpu", format!("{}m", tiered_cpu_millicores(cpus))),
                ("memory", format!("{}Mi", eks_memory_mib(max_pods))),
                ("ephemeral-storage", "1Gi".to_string()),
            ]),
            system: Pairs::default(),
            eviction: eviction(),
        },
        Formula::Gke => {
            let extra = if max_pods > 110 {
                GKE_HIGH_DENSITY_EXTRA_MILLICORES
            } else {
                0
            };
            Reserved {
                kube: Pairs::of(&[
                    ("cpu", format!("{}m", tiered_cpu_millicores(cpus) + extra)),
                    ("memory", format!("{}Mi", gke_memory_mib(mem_mib))),
                ]),
                system: Pairs::default(),
                eviction: eviction(),
            }
        }
        Formula::Aks => Reserved {
            kube: Pairs::of(&[
                ("cpu", format!("{}m", aks_cpu_millicores(cpus))),
                ("memory", format!("{}Mi", aks_memory_mib(max_pods, mem_mib))),
            ]),
            system: Pairs::default(),
            eviction: eviction(),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// The image's and the operator's settings, and the decision.

/// The sizing settings of image.env and node.env, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `MAX_PODS_MODE`; `None` when image.env does not set it (an image baked before sizing):
    /// `max-pods.map`, then `DEFAULT_MAX_PODS`, as before.
    pub mode: Option<CniMode>,
    /// `RESERVATION` (default `none` for such an image).
    pub formula: Formula,
    /// image.env's `KUBE_RESERVED`, `SYSTEM_RESERVED`, `EVICTION_HARD` (for `fixed`).
    pub fixed: Reserved,
    /// node.env's values of the same keys, each overriding one value.
    pub overrides: Reserved,
}

/// A sizing value that is not acceptable: the key and what it must look like.
pub type Invalid = (&'static str, &'static str);

impl Settings {
    /// Reads the settings from image.env and node.env.
    pub fn from_env(image: &EnvFile, node: &EnvFile) -> Result<Settings, (bool, Invalid)> {
        let img = |e| (true, e);
        let mode = match image.non_empty(key::MAX_PODS_MODE) {
            None => None,
            Some(v) => Some(CniMode::parse(v).ok_or(img((key::MAX_PODS_MODE, CNI_MODE_EXPECTED)))?),
        };
        let formula = match image.non_empty(key::RESERVATION) {
            None => Formula::None,
            Some(v) => Formula::parse(v).ok_or(img((key::RESERVATION, FORMULA_EXPECTED)))?,
        };
        Ok(Settings {
            mode,
            formula,
            fixed: Reserved::from_env(image).map_err(img)?,
            overrides: Reserved::from_env(node).map_err(|e| (false, e))?,
        })
    }
}

/// What was decided for this node: max pods, the machine, the reservations, and warnings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizing {
    /// Max pods and how it was decided.
    pub max_pods: MaxPods,
    /// The machine, when it could be read.
    pub machine: Option<Machine>,
    /// The formula applied.
    pub formula: Formula,
    /// The reservations after node.env's overrides.
    pub reserved: Reserved,
    /// Everything a default had to stand in for, one sentence each.
    pub warnings: Vec<String>,
}

/// The inputs of one decision besides the settings.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// node.env's `MAX_PODS`.
    pub max_pods_override: Option<u32>,
    /// `max-pods.map`'s entry for the instance type.
    pub map_entry: Option<u32>,
    /// `DEFAULT_MAX_PODS`.
    pub default_max_pods: u32,
    /// The instance type from metadata.
    pub instance_type: &'a str,
    /// The machine, or why it could not be read.
    pub machine: Result<Machine, &'a str>,
    /// The AWS table's text, when the image has one.
    pub table: Option<&'a str>,
}

/// Decides max pods (node.env `MAX_PODS`, else `max-pods.map`, else the image's mode, else
/// `DEFAULT_MAX_PODS`) and then the reservations from it.
pub fn decide(s: &Settings, i: Inputs<'_>) -> Sizing {
    let mut warnings = Vec::new();
    let machine = match i.machine {
        Ok(m) => Some(m),
        Err(why) => {
            if s.formula != Formula::None && s.formula != Formula::Fixed {
                warnings.push(format!(
                    "{why}: RESERVATION={} needs the CPU count and MemTotal, so no reservation is computed (only node.env's values apply)",
                    s.formula.name()
                ));
            }
            None
        }
    };
    let fixed = |value: u32, source: &str| MaxPods {
        value,
        source: source.to_string(),
        warning: None,
    };
    let max_pods = match (i.max_pods_override, i.map_entry, s.mode) {
        (Some(n), _, _) => fixed(n, node_env::MAX_PODS),
        (None, Some(n), _) => fixed(n, paths::MAX_PODS_MAP),
        (None, None, Some(mode)) => max_pods(
            mode,
            i.instance_type,
            machine.map(|m| m.cpus),
            i.table,
            i.default_max_pods,
        ),
        (None, None, None) => fixed(i.default_max_pods, image_env::DEFAULT_MAX_PODS),
    };
    warnings.extend(max_pods.warning.clone());
    let mut reserved = match machine {
        Some(m) => reserve(
            s.formula,
            m.cpus,
            m.mem_kib / 1024,
            max_pods.value,
            &s.fixed,
        ),
        None if s.formula == Formula::Fixed => s.fixed.clone(),
        None => Reserved::default(),
    };
    reserved.merge(&s.overrides);
    Sizing {
        max_pods,
        machine,
        formula: s.formula,
        reserved,
        warnings,
    }
}

impl Sizing {
    /// The `"sizing"` object of status.json (keys in the contract's order).
    pub fn render_json(&self, out: &mut String) {
        out.push_str("{\"max_pods\":");
        let _ = write!(out, "{}", self.max_pods.value);
        out.push_str(",\"max_pods_source\":");
        crate::json::write_str(out, &self.max_pods.source);
        if let Some(m) = self.machine {
            let _ = write!(out, ",\"cpus\":{},\"mem_total_kib\":{}", m.cpus, m.mem_kib);
        }
        out.push_str(",\"reservation\":\"");
        out.push_str(self.formula.name());
        out.push('"');
        for (k, v) in [
            ("kube_reserved", self.reserved.kube.render('=')),
            ("system_reserved", self.reserved.system.render('=')),
            ("eviction_hard", self.reserved.eviction.render('<')),
        ] {
            out.push_str(",\"");
            out.push_str(k);
            out.push_str("\":");
            crate::json::write_str(out, &v);
        }
        out.push('}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        for (text, want) in [
            ("0\n", Some(1)),
            ("0-3\n", Some(4)),
            ("0-3,6,8-9\n", Some(7)),
            ("0-95", Some(96)),
            ("", None),
            ("3-1", None),
            ("a", None),
        ] {
            assert_eq!(parse_cpu_list(text), want, "{text:?}");
        }
        assert_eq!(
            parse_cpuinfo("processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\n"),
            Some(2)
        );
        assert_eq!(parse_cpuinfo("model name: x\n"), None);
        assert_eq!(
            parse_meminfo("MemTotal:        8039868 kB\nMemFree: 1 kB\n"),
            Some(8_039_868)
        );
        assert_eq!(parse_meminfo("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo("MemTotal: 12 MB\n"), None);
    }

    #[test]
    fn table_rows() {
        let t = "# c\nm5.large\t3\t10\tnitro\nm4.large\t2\t10\txen\nm5.metal\t15\t50\tunknown\n";
        assert_eq!(
            lookup(t, "m5.large"),
            Some(EniLimits {
                enis: 3,
                ipv4_per_eni: 10,
                nitro: true
            })
        );
        assert_eq!(lookup(t, "m5.larg"), None);
        assert_eq!(lookup(t, "5.large"), None);
        assert_eq!(lookup(t, ""), None);
        assert_eq!(lookup("x\tm5.large\t3\t10\tnitro\n", "m5.large"), None);
        assert_eq!(
            lookup("# m5.large\t1\t2\tnitro\nm5.large\t3\t10\txen", "m5.large"),
            Some(EniLimits {
                enis: 3,
                ipv4_per_eni: 10,
                nitro: false
            })
        );
        assert_eq!(lookup(t, "m5"), None);
        assert_eq!(lookup(t, "M5.LARGE"), None);
        assert_eq!(parse_table(t).unwrap().len(), 3);
        for (bad, needle) in [
            ("a\t1\t2\n", "line 1"),
            ("a\t0\t2\tnitro\n", "positive"),
            ("a\t1\t2\tkvm\n", "nitro|xen|unknown"),
            ("a\t1\t2\tnitro\na\t1\t2\tnitro\n", "listed twice"),
            ("a 1 2 nitro\n", "line 1"),
        ] {
            let e = parse_table(bad).unwrap_err();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
    }

    #[test]
    fn tiered_cpu_matches_nodeadm() {
        // (vCPUs, millicores): the tiers applied by hand, 6 % + 1 % + 2 × 0.5 % + n × 0.25 %.
        for (cpus, want) in [
            (1, 60),
            (2, 70),
            (3, 75),
            (4, 80),
            (8, 90),
            (16, 110),
            (48, 190),
            (96, 310),
        ] {
            assert_eq!(tiered_cpu_millicores(cpus), want, "{cpus} vCPUs");
        }
    }
}
