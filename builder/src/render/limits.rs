//! User-data size limits of the platforms kiln targets, and the size report `kiln render`
//! prints so an oversized payload is caught before an instance fails to launch.

/// How a platform counts user-data bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// The bytes as rendered (before any base64 the API wants).
    Raw,
    /// The base64 text sent to the API.
    Base64,
}

/// One platform's user-data limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Short name used in reports.
    pub platform: &'static str,
    /// What the limit applies to.
    pub field: &'static str,
    /// The limit in bytes.
    pub bytes: usize,
    /// How the platform counts.
    pub counted: Counted,
}

/// The limits `kiln render` reports against (sources in `docs/render.md`).
pub const LIMITS: &[Limit] = &[
    Limit {
        platform: "aws",
        field: "EC2 user data",
        bytes: 16 * 1024,
        counted: Counted::Raw,
    },
    Limit {
        platform: "azure",
        field: "customData",
        bytes: 65_535,
        counted: Counted::Raw,
    },
    Limit {
        platform: "gcp",
        field: "user-data metadata value",
        bytes: 256 * 1024,
        counted: Counted::Raw,
    },
    Limit {
        platform: "openstack",
        field: "Nova user_data",
        bytes: 65_535,
        counted: Counted::Base64,
    },
];

/// The size `limit` sees for a payload of `raw_len` bytes.
pub fn counted_size(limit: &Limit, raw_len: usize) -> usize {
    match limit.counted {
        Counted::Raw => raw_len,
        Counted::Base64 => raw_len.div_ceil(3) * 4,
    }
}

/// One line of the size report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeLine {
    /// The limit checked.
    pub limit: Limit,
    /// The size the platform counts.
    pub size: usize,
    /// Whether it fits.
    pub fits: bool,
}

/// Checks a payload of `raw_len` bytes against every platform limit.
pub fn report(raw_len: usize) -> Vec<SizeLine> {
    LIMITS
        .iter()
        .map(|limit| {
            let size = counted_size(limit, raw_len);
            SizeLine {
                limit: *limit,
                size,
                fits: size <= limit.bytes,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries() {
        let at = |len| {
            report(len)
                .into_iter()
                .map(|l| (l.limit.platform, l.fits))
                .collect::<Vec<_>>()
        };
        assert_eq!(at(16_384)[0], ("aws", true));
        assert_eq!(at(16_385)[0], ("aws", false));
        // 49_149 raw bytes are 65_532 of base64; 49_152 are 65_536.
        assert_eq!(at(49_149)[3], ("openstack", true));
        assert_eq!(at(49_152)[3], ("openstack", false));
        assert_eq!(at(65_535)[1], ("azure", true));
        assert_eq!(at(65_536)[1], ("azure", false));
    }
}
