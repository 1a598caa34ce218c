//! kubelet's stderr log lines in klog's header format, and its fatal exit.

use std::io::Write;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

/// Days since 1970-01-01 → (month, day), the civil calendar (Howard Hinnant's algorithm).
pub fn month_day(days: i64) -> (u32, u32) {
    let (_, m, d) = civil(days);
    (m, d)
}

/// Days since 1970-01-01 → (year, month, day).
pub fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Prints one line in klog's header format, as kubelet does on stderr.
pub fn klog(severity: char, file_line: &str, msg: &str) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (mon, day) = month_day(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let line = format!(
        "{severity}{mon:02}{day:02} {:02}:{:02}:{:02}.{:06} {:>7} {file_line}] {msg}\n",
        sod / 3600,
        sod / 60 % 60,
        sod % 60,
        now.subsec_micros(),
        std::process::id(),
    );
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Go's `%q`-ish escaping of a structured log value.
pub fn quote(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// What `k8s.io/component-base/cli` `run.go` prints when the command returns an error
/// (`klog.ErrorS(err, "command failed")`), then exit status 1.
pub fn command_failed(err: &str) -> ExitCode {
    klog(
        'E',
        "run.go:72",
        &format!("\"command failed\" err=\"{}\"", quote(err)),
    );
    ExitCode::from(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(month_day(0), (1, 1));
        assert_eq!(month_day(19_723), (1, 1)); // 2024-01-01
        assert_eq!(month_day(19_782), (2, 29)); // 2024-02-29
        assert_eq!(civil(19_782), (2024, 2, 29));
        assert_eq!(civil(-1), (1969, 12, 31));
    }
}
