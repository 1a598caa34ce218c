//! The baked AWS ENI table (`/usr/lib/kiln/aws-eni.tsv`): its rows parsed and looked up.

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
pub(crate) fn parse_row(line: &str) -> Option<(&str, EniLimits)> {
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
