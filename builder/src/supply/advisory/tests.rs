use super::*;

const LOCK: &str = r#"
version = 1

[[artifact]]
name = "containerd"
version = "2.3.6"
os = "linux"
arch = "amd64"
format = "binary"
url = "https://example.test/containerd"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
verified = "test"
members = [{ from = "containerd", to = "bin/containerd" }]

[[artifact]]
name = "containerd"
version = "2.3.4"
os = "windows"
arch = "amd64"
format = "binary"
url = "https://example.test/containerd.exe"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
verified = "test"
members = [{ from = "containerd.exe", to = "bin/containerd.exe" }]

[[artifact]]
name = "runc"
version = "1.5.3"
os = "linux"
arch = "amd64"
format = "binary"
url = "https://example.test/runc.amd64"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
verified = "test"
members = [{ from = "runc.amd64", to = "bin/runc" }]
"#;

const ADVISORIES: &str = r#"
version = 1

[[advisory]]
id = "CVE-2026-0001"
aliases = ["GHSA-aaaa-bbbb-cccc"]
artifacts = ["containerd"]
affected = [{ introduced = "2.3.0", fixed = "2.3.7" }, { introduced = "2.2.0", fixed = "2.2.9" }]
severity = "high"
summary = "crafted image crashes the daemon"
published = ["https://www.cve.org/CVERecord?id=CVE-2026-0001"]

[[advisory]]
id = "CVE-2026-0002"
artifacts = ["containerd"]
os = ["linux"]
affected = [{ introduced = "2.3.0", fixed = "2.3.5" }]
severity = "moderate"
summary = "linux-only leak"
published = ["https://www.cve.org/CVERecord?id=CVE-2026-0002"]

[[advisory]]
id = "CVE-2026-0003"
artifacts = ["runc"]
affected = [{ introduced = "1.5.0", fixed = "1.5.3" }]
severity = "high"
summary = "fixed in the pinned runc"
published = ["https://www.cve.org/CVERecord?id=CVE-2026-0003"]
"#;

fn day(s: &str) -> Day {
    Day::parse(s).unwrap()
}

fn lock(waivers: &str) -> Lock {
    Lock::parse(&format!("{LOCK}{waivers}"), Path::new("t.lock")).unwrap()
}

fn advisories() -> Advisories {
    Advisories::parse(ADVISORIES, Path::new("adv.toml")).unwrap()
}

fn verdicts(a: &Audit) -> Vec<(String, String, Verdict)> {
    a.findings
        .iter()
        .map(|f| (f.artifact.clone(), f.advisory.clone(), f.verdict.clone()))
        .collect()
}

#[test]
fn ranges_os_limits_and_fixed_versions() {
    let a = audit(&lock(""), &advisories(), day("2026-11-27"));
    assert_eq!(
        verdicts(&a),
        vec![
            (
                "containerd@2.3.6/linux/amd64".into(),
                "CVE-2026-0001".into(),
                Verdict::Open
            ),
            (
                "containerd@2.3.4/windows/amd64".into(),
                "CVE-2026-0001".into(),
                Verdict::Open
            ),
        ],
        "2.3.6 is past 0002's fix, 0002 is Linux-only, runc 1.5.3 is the fix itself"
    );
    assert_eq!(a.findings[0].fixed_in.as_deref(), Some("2.3.7"));
    assert_eq!(a.failing().count(), 2);
}

const WAIVER: &str = r#"
[[waiver]]
advisory = "GHSA-aaaa-bbbb-cccc"
artifact = "containerd"
os = "linux"
reason = "no record of 2.3.7"
mitigation = "pulls only from the site registry"
expires = "2026-12-31"
"#;

#[test]
fn a_waiver_holds_through_its_last_day_and_fails_after() {
    let l = lock(WAIVER);
    let on = audit(&l, &advisories(), day("2026-12-31"));
    assert_eq!(
        on.findings[0].verdict,
        Verdict::Waived {
            expires: "2026-12-31".into()
        }
    );
    // The waiver names the Linux pin only: the Windows one stays open.
    assert_eq!(on.findings[1].verdict, Verdict::Open);
    assert!(on.unused_waivers.is_empty());
    let after = audit(&l, &advisories(), day("2027-01-01"));
    assert_eq!(
        after.findings[0].verdict,
        Verdict::WaiverExpired {
            expires: "2026-12-31".into()
        }
    );
    assert!(after.findings[0].fails());
}

#[test]
fn a_waiver_for_nothing_is_reported_unused() {
    let l = lock(
        &WAIVER
            .replace("GHSA-aaaa-bbbb-cccc", "CVE-2026-0003")
            .replace("containerd", "runc"),
    );
    let a = audit(&l, &advisories(), day("2026-11-27"));
    assert_eq!(
        a.unused_waivers,
        vec!["CVE-2026-0003 runc/linux".to_string()]
    );
}

#[test]
fn an_unparsable_pin_version_fails_rather_than_passes() {
    let l = lock("").artifacts.clone();
    let mut lk = lock("");
    lk.artifacts = l;
    lk.artifacts[0].version = "nightly".into();
    let a = audit(&lk, &advisories(), day("2026-11-27"));
    assert_eq!(a.findings[0].verdict, Verdict::Unknown);
    assert!(a.findings[0].fails());
}

#[test]
fn bad_waivers_are_refused_by_the_lock_naming_the_field() {
    for (from, to, want) in [
        (
            "expires = \"2026-12-31\"",
            "expires = \"2026-02-30\"",
            "`expires`",
        ),
        (
            "artifact = \"containerd\"",
            "artifact = \"kubelet\"",
            "`artifact`",
        ),
        (
            "reason = \"no record of 2.3.7\"",
            "reason = \" \"",
            "`reason`",
        ),
        (
            "advisory = \"GHSA-aaaa-bbbb-cccc\"",
            "advisory = \"x y\"",
            "`advisory`",
        ),
        (
            "expires = \"2026-12-31\"",
            "expires = \"2026-12-31\"\nowner = \"x\"",
            "unknown field `owner`",
        ),
    ] {
        let w = WAIVER.replace(from, to);
        assert_ne!(w, WAIVER, "{from}");
        let err = Lock::parse(&format!("{LOCK}{w}"), Path::new("t.lock"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(want) && err.contains("t.lock"), "{to}: {err}");
    }
    let twice = format!("{LOCK}{WAIVER}{WAIVER}");
    let err = Lock::parse(&twice, Path::new("t.lock"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("one waiver per advisory"), "{err}");
}

#[test]
fn bad_advisory_files_name_the_field() {
    for (from, to, want) in [
        ("fixed = \"2.3.7\"", "fixed = \"2.2.0\"", "`affected.fixed`"),
        (
            "introduced = \"2.3.0\", fixed = \"2.3.7\"",
            "introduced = \"two\", fixed = \"2.3.7\"",
            "`affected.introduced`",
        ),
        (
            "severity = \"high\"",
            "severity = \"dire\"",
            "unknown variant `dire`",
        ),
        (
            "published = [\"https://www.cve.org/CVERecord?id=CVE-2026-0001\"]",
            "published = [\"http://x\"]",
            "`published`",
        ),
        (
            "aliases = [\"GHSA-aaaa-bbbb-cccc\"]",
            "aliases = [\"CVE-2026-0002\"]",
            "each id and alias once",
        ),
        ("artifacts = [\"runc\"]", "artifacts = []", "`artifacts`"),
        ("version = 1\n", "version = 2\n", "`version`"),
    ] {
        let text = ADVISORIES.replacen(from, to, 1);
        assert_ne!(text, ADVISORIES, "{from}");
        let err = Advisories::parse(&text, Path::new("adv.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(want) && err.contains("adv.toml"),
            "{to}: {err}"
        );
    }
}

#[test]
fn a_range_without_a_fix_affects_every_later_version() {
    let text = ADVISORIES.replace(
        "affected = [{ introduced = \"1.5.0\", fixed = \"1.5.3\" }]",
        "affected = [{ introduced = \"1.5.0\" }]",
    );
    let a = audit(
        &lock(""),
        &Advisories::parse(&text, Path::new("a")).unwrap(),
        day("2026-11-27"),
    );
    let runc = a
        .findings
        .iter()
        .find(|f| f.artifact.starts_with("runc"))
        .unwrap();
    assert_eq!(
        (runc.fixed_in.as_deref(), &runc.verdict),
        (None, &Verdict::Open)
    );
}
