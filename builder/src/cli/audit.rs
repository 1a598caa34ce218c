//! `kiln lock audit`: which pins carry a known advisory, and whether the lock's signed waivers
//! cover them; exits [`exit::ADVISORY`] for any advisory without an unexpired waiver.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::cli::common::{exit, load_lock, Global, TrustArgs, DEFAULT_LOCK};
use crate::supply::advisory::{self, Advisories, Finding, Verdict};
use crate::supply::waiver::Day;

/// The advisory file kiln reads when none is named.
pub const DEFAULT_ADVISORIES: &str = "images/advisories.toml";

/// `kiln lock audit`
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// The lock file (its signature is checked first: waivers count only when signed).
    #[arg(default_value = DEFAULT_LOCK)]
    pub lock: PathBuf,
    /// The known advisories (docs/lock-format.md, "Advisories and waivers").
    #[arg(long, value_name = "FILE", default_value = DEFAULT_ADVISORIES)]
    pub advisories: PathBuf,
    /// Audit as of this day (UTC, YYYY-MM-DD) instead of today: when do the waivers run out?
    #[arg(long, value_name = "YYYY-MM-DD", value_parser = parse_day)]
    pub on: Option<Day>,
    #[command(flatten)]
    pub trust: TrustArgs,
}

fn parse_day(s: &str) -> Result<Day, String> {
    Day::parse(s).ok_or_else(|| format!("expected a date YYYY-MM-DD, found {s:?}"))
}

/// Runs `kiln lock audit`.
pub fn run(a: AuditArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let (lock, _) = load_lock(&a.lock, &a.trust)?;
    let advisories = Advisories::load(&a.advisories)?;
    let today = a.on.unwrap_or_else(Day::today_utc);
    let report = advisory::audit(&lock, &advisories, today);
    let failing = report.failing().count();
    for f in &report.findings {
        if global.json {
            let v = serde_json::to_value(f).context("encoding a finding")?;
            let level = if f.fails() {
                crate::cli::json::Level::Error
            } else {
                crate::cli::json::Level::Warning
            };
            crate::cli::json::emit("advisory", level, v);
        } else if f.fails() || !global.quiet {
            println!("{}", line(f));
        }
    }
    for w in &report.unused_waivers {
        if global.json {
            crate::cli::json::emit(
                "unused_waiver",
                crate::cli::json::Level::Warning,
                serde_json::json!({"event": "unused_waiver", "level": "warning", "waiver": w}),
            );
        } else if !global.quiet {
            println!("note: waiver {w} covers nothing this lock pins; drop it at the next signing");
        }
    }
    if global.json {
        crate::cli::json::emit(
            "summary",
            crate::cli::json::Level::Info,
            serde_json::json!({
                "lock": a.lock, "advisories": a.advisories,
                "on": today.to_string(), "findings": report.findings.len(),
                "failing": failing, "ok": failing == 0,
            }),
        );
    } else if !global.quiet || failing > 0 {
        println!(
            "{}: {failing} advisories without an unexpired waiver, {} waived, as of {today} ({} known advisories in {})",
            a.lock.display(),
            report.findings.len() - failing,
            advisories.list.len(),
            a.advisories.display()
        );
    }
    Ok(if failing > 0 {
        ExitCode::from(exit::ADVISORY)
    } else {
        ExitCode::SUCCESS
    })
}

fn line(f: &Finding) -> String {
    let fix = match &f.fixed_in {
        Some(v) => format!("fixed in {v}"),
        None => "no fixed release yet".into(),
    };
    let sev = format!("{:?}", f.severity).to_lowercase();
    match &f.verdict {
        Verdict::Open => format!(
            "{}: {} ({sev}, {fix}): NOT WAIVED: {}; move the pin to {} or sign in a reviewed waiver",
            f.artifact,
            f.advisory,
            f.summary,
            f.fixed_in.as_deref().unwrap_or("a fixed release")
        ),
        Verdict::WaiverExpired { expires } => format!(
            "{}: {} ({sev}, {fix}): WAIVER EXPIRED on {expires}: {}; move the pin or review and re-sign the waiver",
            f.artifact, f.advisory, f.summary
        ),
        Verdict::WaiverTooLong { expires, days, limit } => format!(
            "{}: {} ({sev}, {fix}): WAIVER TOO LONG: it runs to {expires}, {days} days ahead, and a {sev} advisory may be waived for {limit} days at most: {}; sign in a waiver that ends sooner, or move the pin",
            f.artifact, f.advisory, f.summary
        ),
        Verdict::Waived { expires } => format!(
            "{}: {} ({sev}, {fix}): waived until {expires}: {}",
            f.artifact, f.advisory, f.summary
        ),
        Verdict::Unknown => format!(
            "{}: {} ({sev}, {fix}): UNKNOWN: the pin's version does not compare with the advisory's ranges, so nothing shows it is unaffected",
            f.artifact, f.advisory
        ),
    }
}
