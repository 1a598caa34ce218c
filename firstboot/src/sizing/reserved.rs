//! kube-reserved, system-reserved and hard eviction: each cloud's published formula.

use crate::contract::envfile::EnvFile;
use crate::contract::sizing::{self as key, parse_pairs, Formula};

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
