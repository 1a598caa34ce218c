//! Waivers (`[[waiver]]` in the lock): a reviewed statement that a pin may still carry a known
//! advisory until a date, with the reason and the mitigation. They live in the lock so the
//! release signature covers them; `kiln lock audit` ([`crate::supply::advisory`]) reads them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::supply::names::Os;

/// One waiver: `advisory` may stay on the lock's `artifact` entries (on `os`, or every OS)
/// until `expires`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Waiver {
    /// The advisory's id (`CVE-…`, `GHSA-…`) as `advisories.toml` names it or lists an alias.
    pub advisory: String,
    /// The lock artifact name the waiver covers (`containerd`, `runc`).
    pub artifact: String,
    /// Only the entries for this OS; every OS when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<Os>,
    /// Why the pin cannot move yet (no verifiable record of the fixed release, say).
    pub reason: String,
    /// What keeps the node safe meanwhile, or what an operator must do.
    pub mitigation: String,
    /// The last day (UTC) the waiver holds, `YYYY-MM-DD`; from the next day the audit fails.
    pub expires: String,
}

/// A calendar day, `YYYY-MM-DD`, ordered by time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Day {
    /// Year.
    pub year: i64,
    /// Month, 1–12.
    pub month: u32,
    /// Day of the month, 1–31 as the month allows.
    pub day: u32,
}

impl Day {
    /// Parses `YYYY-MM-DD` (a real day of the proleptic Gregorian calendar); `None` otherwise.
    pub fn parse(s: &str) -> Option<Day> {
        let b = s.as_bytes();
        if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
            return None;
        }
        let num = |r: std::ops::Range<usize>| -> Option<u32> {
            let part = &s[r];
            part.bytes()
                .all(|c| c.is_ascii_digit())
                .then(|| part.parse().ok())
                .flatten()
        };
        let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
        let days_in_month = match month {
            1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
            4 | 6 | 9 | 11 => 30,
            2 if leap => 29,
            2 => 28,
            _ => return None,
        };
        (1..=days_in_month).contains(&day).then_some(Day {
            year: i64::from(year),
            month,
            day,
        })
    }

    /// Today in UTC, from the system clock.
    pub fn today_utc() -> Day {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let (year, month, day, ..) = kiln_firstboot::clock::civil(secs as i64);
        Day { year, month, day }
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

/// A waiver field that does not hold what the lock allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The field.
    pub field: &'static str,
    /// What was expected.
    pub expected: String,
    /// What was found.
    pub found: String,
}

/// True for an advisory id: `[A-Za-z0-9._:-]`, 1–64 characters (`CVE-2026-53495`, `GHSA-…`).
pub fn is_advisory_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

/// Checks one waiver's fields; `artifact_known` says whether the lock has entries by that name.
pub fn validate(w: &Waiver, artifact_known: bool) -> Result<(), Problem> {
    let bad = |field, expected: &str, found: &str| Problem {
        field,
        expected: expected.to_string(),
        found: found.to_string(),
    };
    if !is_advisory_id(&w.advisory) {
        return Err(bad(
            "advisory",
            "an advisory id of [A-Za-z0-9._:-] (CVE-…, GHSA-…)",
            &w.advisory,
        ));
    }
    if !artifact_known {
        return Err(bad(
            "artifact",
            "the name of an artifact this lock pins",
            &w.artifact,
        ));
    }
    for (field, text) in [("reason", &w.reason), ("mitigation", &w.mitigation)] {
        if text.trim().is_empty() {
            return Err(bad(
                field,
                "a non-empty sentence a reviewer signed off",
                text,
            ));
        }
    }
    if Day::parse(&w.expires).is_none() {
        return Err(bad("expires", "a date YYYY-MM-DD", &w.expires));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_parse_only_real_dates() {
        for (s, ok) in [
            ("2026-11-27", true),
            ("2028-02-29", true),
            ("2027-02-29", false),
            ("2100-02-29", false),
            ("2000-02-29", true),
            ("2026-13-01", false),
            ("2026-04-31", false),
            ("2026-00-10", false),
            ("2026-1-01", false),
            ("2026/11/27", false),
            ("+026-11-27", false),
            ("", false),
        ] {
            assert_eq!(Day::parse(s).is_some(), ok, "{s}");
        }
        let a = Day::parse("2026-12-31").unwrap();
        let b = Day::parse("2027-01-01").unwrap();
        assert!(a < b);
        assert_eq!(a.to_string(), "2026-12-31");
    }

    #[test]
    fn ids() {
        assert!(is_advisory_id("CVE-2026-53495"));
        assert!(is_advisory_id("GHSA-7jxh-36q5-gcqv"));
        assert!(!is_advisory_id(""));
        assert!(!is_advisory_id("CVE 1"));
        assert!(!is_advisory_id(&"A".repeat(65)));
    }
}
