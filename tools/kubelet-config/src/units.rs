//! Go's `time.ParseDuration` and apimachinery's `resource.ParseQuantity`, as far as kubelet
//! needs them to accept or refuse a value.

/// `time.ParseDuration`: nanoseconds, or Go's error text.
pub fn parse_duration(s: &str) -> Result<i128, String> {
    let invalid = || format!("time: invalid duration {s:?}");
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num = &rest[..num_len];
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(invalid());
        }
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let scale: f64 = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(format!("time: missing unit in duration {s:?}")),
            u => return Err(format!("time: unknown unit {u:?} in duration {s:?}")),
        };
        total += num.parse::<f64>().map_err(|_| invalid())? * scale;
    }
    if total > i64::MAX as f64 {
        return Err(invalid());
    }
    Ok(if neg { -(total as i128) } else { total as i128 })
}

/// `resource.ParseQuantity`: the value as a float (enough to compare and check the sign),
/// or apimachinery's error for a string that is no quantity.
pub fn parse_quantity(s: &str) -> Result<f64, String> {
    // apimachinery/pkg/api/resource/quantity.go: ErrFormatWrong
    let wrong = || {
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            .to_string()
    };
    let num_len = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || (i == 0 && (c == '+' || c == '-'))))
        .map_or(s.len(), |(i, _)| i);
    let (num, suffix) = s.split_at(num_len);
    let digits = num.trim_start_matches(['+', '-']);
    if digits.is_empty() || digits == "." || digits.matches('.').count() > 1 {
        return Err(wrong());
    }
    let value: f64 = num.parse().map_err(|_| wrong())?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e => {
            let exp = e
                .strip_prefix(['e', 'E'])
                .and_then(|x| x.parse::<i32>().ok())
                .ok_or_else(|| "unable to parse quantity's suffix".to_string())?;
            10f64.powi(exp)
        }
    };
    Ok(value * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_go() {
        assert_eq!(parse_duration("2m0s"), Ok(120_000_000_000));
        assert_eq!(parse_duration("1.5h"), Ok(5_400_000_000_000));
        assert_eq!(parse_duration("-300ms"), Ok(-300_000_000));
        assert_eq!(parse_duration("0"), Ok(0));
        assert!(parse_duration("10").unwrap_err().contains("missing unit"));
        assert!(parse_duration("5d")
            .unwrap_err()
            .contains("unknown unit \"d\""));
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn quantities_as_apimachinery() {
        assert_eq!(parse_quantity("100Mi"), Ok(104_857_600.0));
        assert_eq!(parse_quantity("250m"), Ok(0.25));
        assert_eq!(parse_quantity("1e3"), Ok(1000.0));
        assert_eq!(parse_quantity("-1"), Ok(-1.0));
        assert!(parse_quantity("lots").is_err());
        assert!(parse_quantity("1Xi").is_err());
    }
}
