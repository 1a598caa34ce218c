//! The sizing keys of the contract (`docs/contract.md#sizing`): which CNI mode decides max pods
//! and which formula decides kubelet's reservations (both in `image.env`), the reservation
//! values themselves (`image.env` for the `fixed` formula, `node.env` to override one value,
//! `kubelet.env` for what was decided), and the shapes those values must have.

/// image.env: how max pods is decided ([`CniMode`]).
pub const MAX_PODS_MODE: &str = "MAX_PODS_MODE";
/// image.env: how kube-reserved, system-reserved and eviction are decided ([`Formula`]).
pub const RESERVATION: &str = "RESERVATION";
/// kubelet's `--kube-reserved`: `resource=quantity` pairs.
pub const KUBE_RESERVED: &str = "KUBE_RESERVED";
/// kubelet's `--system-reserved`: `resource=quantity` pairs.
pub const SYSTEM_RESERVED: &str = "SYSTEM_RESERVED";
/// kubelet's `--eviction-hard`: `signal<quantity` pairs.
pub const EVICTION_HARD: &str = "EVICTION_HARD";

/// The three reservation keys, in the order kubelet.env writes them.
pub const RESERVED_KEYS: [&str; 3] = [KUBE_RESERVED, SYSTEM_RESERVED, EVICTION_HARD];

/// How max pods is decided (`MAX_PODS_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CniMode {
    /// Amazon VPC CNI, secondary IPs: `ENIs × (IPv4 per ENI − 1) + 2` from the AWS table.
    AwsVpcCni,
    /// Amazon VPC CNI with prefix delegation: `ENIs × ((IPv4 per ENI − 1) × 16) + 2` on Nitro.
    AwsVpcCniPrefixDelegation,
    /// AKS Azure CNI (node subnet): AKS's default of 30.
    AzureCni,
    /// AKS Azure CNI Overlay: AKS's default of 250.
    AzureCniOverlay,
    /// GKE Standard (VPC-native): GKE's default of 110.
    Gke,
    /// An overlay network that does not limit pods per node: `DEFAULT_MAX_PODS`.
    Overlay,
    /// A number the image fixes.
    Fixed(u32),
}

/// What `MAX_PODS_MODE` accepts, as a message says it.
pub const CNI_MODE_EXPECTED: &str =
    "aws-vpc-cni, aws-vpc-cni-prefix-delegation, azure-cni, azure-cni-overlay, gke, overlay or a positive integer";

impl CniMode {
    /// The named modes, in the contract's order.
    pub const NAMED: [CniMode; 6] = [
        CniMode::AwsVpcCni,
        CniMode::AwsVpcCniPrefixDelegation,
        CniMode::AzureCni,
        CniMode::AzureCniOverlay,
        CniMode::Gke,
        CniMode::Overlay,
    ];

    /// The name in image.env and status.json; `None` for a fixed number.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            CniMode::AwsVpcCni => "aws-vpc-cni",
            CniMode::AwsVpcCniPrefixDelegation => "aws-vpc-cni-prefix-delegation",
            CniMode::AzureCni => "azure-cni",
            CniMode::AzureCniOverlay => "azure-cni-overlay",
            CniMode::Gke => "gke",
            CniMode::Overlay => "overlay",
            CniMode::Fixed(_) => return None,
        })
    }

    /// A `MAX_PODS_MODE` value: a mode's name or a positive integer.
    pub fn parse(value: &str) -> Option<CniMode> {
        if let Some(m) = CniMode::NAMED.into_iter().find(|m| m.name() == Some(value)) {
            return Some(m);
        }
        value
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .map(CniMode::Fixed)
    }

    /// True for the modes that read the AWS table.
    pub fn is_aws(self) -> bool {
        matches!(
            self,
            CniMode::AwsVpcCni | CniMode::AwsVpcCniPrefixDelegation
        )
    }
}

/// How the reservations are decided (`RESERVATION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Formula {
    /// Amazon EKS (nodeadm).
    Eks,
    /// Google GKE.
    Gke,
    /// Azure AKS (Kubernetes ≥ 1.29).
    Aks,
    /// The values `KUBE_RESERVED`, `SYSTEM_RESERVED` and `EVICTION_HARD` in image.env.
    Fixed,
    /// No reservation flags: kubelet's own defaults.
    None,
}

/// What `RESERVATION` accepts, as a message says it.
pub const FORMULA_EXPECTED: &str = "eks, gke, aks, fixed or none";

impl Formula {
    /// Every formula.
    pub const ALL: [Formula; 5] = [
        Formula::Eks,
        Formula::Gke,
        Formula::Aks,
        Formula::Fixed,
        Formula::None,
    ];

    /// The name in image.env and status.json.
    pub fn name(self) -> &'static str {
        match self {
            Formula::Eks => "eks",
            Formula::Gke => "gke",
            Formula::Aks => "aks",
            Formula::Fixed => "fixed",
            Formula::None => "none",
        }
    }

    /// The formula called `name`.
    pub fn parse(name: &str) -> Option<Formula> {
        Formula::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// True for a Kubernetes quantity as kubelet's flags take it: digits, an optional fraction and
/// an optional suffix (`100m`, `1.5Gi`, `512Mi`, `2`), or a percentage when `percent` is allowed.
pub fn is_quantity(v: &str, percent: bool) -> bool {
    let v = match v.strip_suffix('%') {
        Some(n) if percent => return !n.is_empty() && is_decimal(n),
        Some(_) => return false,
        None => v,
    };
    let num_end = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (num, suffix) = v.split_at(num_end);
    is_decimal(num)
        && matches!(
            suffix,
            "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
        )
}

fn is_decimal(n: &str) -> bool {
    let mut parts = n.split('.');
    let int = parts.next().unwrap_or("");
    let frac = parts.next();
    parts.next().is_none()
        && !int.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
}

/// Splits a reservation value into `(name, quantity)` pairs: `cpu=100m,memory=1Gi` with `sep`
/// `'='`, `memory.available<100Mi,nodefs.available<10%` with `'<'`. Names are kubelet's
/// resource or signal names (`[a-z0-9./-]`); a name given twice is an error.
pub fn parse_pairs(value: &str, sep: char) -> Result<Vec<(String, String)>, &'static str> {
    let expected = if sep == '<' {
        "comma-separated signal<quantity pairs (memory.available<100Mi,nodefs.available<10%)"
    } else {
        "comma-separated resource=quantity pairs (cpu=100m,memory=1Gi)"
    };
    let mut out: Vec<(String, String)> = Vec::new();
    if value.is_empty() {
        return Ok(out);
    }
    for item in value.split(',') {
        let Some((name, qty)) = item.split_once(sep) else {
            return Err(expected);
        };
        // Resource names are lower case (`ephemeral-storage`); signals are camelCase
        // (`nodefs.inodesFree`), so upper case is allowed after the first byte.
        let name_ok = name.as_bytes().first().is_some_and(u8::is_ascii_lowercase)
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'/'));
        if !name_ok || !is_quantity(qty, sep == '<') || out.iter().any(|(n, _)| n == name) {
            return Err(expected);
        }
        out.push((name.to_string(), qty.to_string()));
    }
    Ok(out)
}

/// Checks one sizing value against the shape its key requires (the node.env and image.env
/// check); unknown keys are accepted.
pub fn check(key: &str, value: &str) -> Result<(), &'static str> {
    match key {
        MAX_PODS_MODE if CniMode::parse(value).is_none() => Err(CNI_MODE_EXPECTED),
        RESERVATION if Formula::parse(value).is_none() => Err(FORMULA_EXPECTED),
        KUBE_RESERVED | SYSTEM_RESERVED => parse_pairs(value, '=').map(drop),
        EVICTION_HARD => parse_pairs(value, '<').map(drop),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_their_names() {
        for m in CniMode::NAMED {
            let name = m.name().unwrap();
            assert_eq!(CniMode::parse(name), Some(m));
            assert!(CNI_MODE_EXPECTED.contains(name), "{name}");
        }
        assert_eq!(CniMode::parse("58"), Some(CniMode::Fixed(58)));
        for bad in ["0", "", "AWS-VPC-CNI", "-1", "calico"] {
            assert_eq!(CniMode::parse(bad), None, "{bad}");
        }
        for f in Formula::ALL {
            assert_eq!(Formula::parse(f.name()), Some(f));
            assert!(FORMULA_EXPECTED.contains(f.name()));
        }
    }

    #[test]
    fn quantities_and_pairs() {
        for ok in ["100m", "1Gi", "1.5Gi", "512Mi", "2", "0"] {
            assert!(is_quantity(ok, false), "{ok}");
        }
        for bad in ["", "m", "1.", ".5", "1Gb", "1 Gi", "10%", "-1"] {
            assert!(!is_quantity(bad, false), "{bad}");
        }
        assert!(is_quantity("10%", true) && is_quantity("7.5%", true));
        assert_eq!(
            parse_pairs("cpu=100m,memory=1Gi", '=').unwrap(),
            [
                ("cpu".into(), "100m".into()),
                ("memory".into(), "1Gi".into())
            ]
        );
        assert_eq!(
            parse_pairs("memory.available<200Mi,nodefs.inodesFree<5%", '<').unwrap(),
            [
                ("memory.available".into(), "200Mi".into()),
                ("nodefs.inodesFree".into(), "5%".into())
            ]
        );
        assert_eq!(parse_pairs("", '=').unwrap(), []);
        for bad in [
            "cpu",
            "cpu=",
            "cpu=1,cpu=2",
            "cpu=1 ",
            "CPU=1",
            "cpu=10%",
            "cpu=1,,memory=1Gi",
        ] {
            assert!(parse_pairs(bad, '=').is_err(), "{bad}");
        }
        assert!(parse_pairs("memory.available=100Mi", '<').is_err());
        assert!(check(EVICTION_HARD, "memory.available<1Gi;rm").is_err());
        assert!(check(MAX_PODS_MODE, "aws-vpc-cni").is_ok());
        assert!(check(RESERVATION, "gcp").is_err());
    }
}
