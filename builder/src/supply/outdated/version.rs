//! Release version numbers as upstream tags spell them (`v1.36.1`, `2.3.4`, `v2.4.0-rc.1`):
//! parsed into numbers so `1.36.10` sorts after `1.36.9`, with pre-releases told apart.

use std::cmp::Ordering;
use std::fmt;

/// A `[v]MAJOR.MINOR.PATCH[-PRE][+BUILD]` version. Ordered by numbers first; a pre-release
/// sorts before its release (`2.4.0-rc.1` < `2.4.0`), as in SemVer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// Major number.
    pub major: u64,
    /// Minor number.
    pub minor: u64,
    /// Patch number.
    pub patch: u64,
    /// The pre-release part after `-` (`rc.1`, `beta.0`); empty for a release.
    pub pre: String,
    /// The text as upstream wrote it (kept for messages and rewritten URLs).
    pub text: String,
}

impl Version {
    /// Parses a tag or lock version; `None` when it is not `[v]N.N.N[-PRE][+BUILD]`.
    pub fn parse(s: &str) -> Option<Version> {
        let t = s.trim();
        let body = t.strip_prefix('v').unwrap_or(t);
        let body = body.split_once('+').map_or(body, |(b, _)| b);
        let (core, pre) = match body.split_once('-') {
            Some((c, p)) if !p.is_empty() => (c, p),
            Some(_) => return None,
            None => (body, ""),
        };
        let mut nums = core.split('.');
        let mut num = || -> Option<u64> {
            let n = nums.next()?;
            if n.is_empty()
                || !n.bytes().all(|b| b.is_ascii_digit())
                || n.len() > 1 && n.starts_with('0')
            {
                return None;
            }
            n.parse().ok()
        };
        let (major, minor, patch) = (num()?, num()?, num()?);
        if nums.next().is_some() {
            return None;
        }
        Some(Version {
            major,
            minor,
            patch,
            pre: pre.to_string(),
            text: t.to_string(),
        })
    }

    /// True for a pre-release (`-rc.1`, `-beta.0`, `-alpha.2`).
    pub fn is_prerelease(&self) -> bool {
        !self.pre.is_empty()
    }

    /// `(major, minor)`: the release line a patch belongs to.
    pub fn line(&self) -> (u64, u64) {
        (self.major, self.minor)
    }

    /// `MAJOR.MINOR.PATCH` without `v` or suffixes: the form used inside download file names.
    pub fn core(&self) -> String {
        format!("{}.{}.{}", self.major, self.minor, self.patch)
    }

    /// This version spelled like `like` (`v` prefix or not), for writing it into a lock.
    pub fn spelled_like(&self, like: &Version) -> String {
        let v = if like.text.starts_with('v') { "v" } else { "" };
        let pre = if self.pre.is_empty() {
            String::new()
        } else {
            format!("-{}", self.pre)
        };
        format!("{v}{}{pre}", self.core())
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => compare_pre(&self.pre, &other.pre),
            })
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// SemVer pre-release order: dot-separated fields, numeric ones compared as numbers.
fn compare_pre(a: &str, b: &str) -> Ordering {
    let mut x = a.split('.');
    let mut y = b.split('.');
    loop {
        return match (x.next(), y.next()) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (Some(p), Some(q)) => {
                let o = match (p.parse::<u64>(), q.parse::<u64>()) {
                    (Ok(m), Ok(n)) => m.cmp(&n),
                    (Ok(_), Err(_)) => Ordering::Less,
                    (Err(_), Ok(_)) => Ordering::Greater,
                    (Err(_), Err(_)) => p.cmp(q),
                };
                if o == Ordering::Equal {
                    continue;
                }
                o
            }
        };
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap_or_else(|| panic!("{s} should parse"))
    }

    #[test]
    fn parses_tags_and_refuses_others() {
        type Case<'a> = (&'a str, Option<(u64, u64, u64, &'a str)>);
        let cases: &[Case<'_>] = &[
            ("v1.36.1", Some((1, 36, 1, ""))),
            ("2.3.4", Some((2, 3, 4, ""))),
            (" v1.36.4\n", Some((1, 36, 4, ""))),
            ("v2.4.0-rc.1", Some((2, 4, 0, "rc.1"))),
            ("1.5.0-rc.3", Some((1, 5, 0, "rc.3"))),
            ("v1.37.0-beta.0+abc", Some((1, 37, 0, "beta.0"))),
            ("1.36", None),
            ("1.36.1.2", None),
            ("v1.036.1", None),
            ("1.36.x", None),
            ("1.36.1-", None),
            ("", None),
            ("latest", None),
        ];
        for (s, want) in cases {
            let got = Version::parse(s).map(|x| (x.major, x.minor, x.patch, x.pre.clone()));
            let want = want.map(|(a, b, c, p)| (a, b, c, p.to_string()));
            assert_eq!(got, want, "{s:?}");
        }
    }

    #[test]
    fn orders_numerically_with_prereleases_first() {
        let mut list: Vec<Version> = [
            "2.3.10",
            "2.3.9",
            "v2.4.0",
            "2.4.0-rc.1",
            "2.4.0-rc.10",
            "2.4.0-rc.2",
            "2.4.0-beta.1",
        ]
        .iter()
        .map(|s| v(s))
        .collect();
        list.sort();
        let got: Vec<&str> = list.iter().map(|x| x.text.as_str()).collect();
        assert_eq!(
            got,
            [
                "2.3.9",
                "2.3.10",
                "2.4.0-beta.1",
                "2.4.0-rc.1",
                "2.4.0-rc.2",
                "2.4.0-rc.10",
                "v2.4.0"
            ]
        );
        assert_eq!(v("v1.36.1").cmp(&v("1.36.1")), Ordering::Equal);
    }

    #[test]
    fn spells_like_the_lock() {
        assert_eq!(v("1.36.4").spelled_like(&v("v1.36.1")), "v1.36.4");
        assert_eq!(v("v2.3.6").spelled_like(&v("2.3.4")), "2.3.6");
        assert_eq!(v("v2.3.6").core(), "2.3.6");
    }
}
