//! Milliseconds since boot, the time base of status.json and the console lines.
//!
//! `CLOCK_BOOTTIME` counts from the kernel's start (including suspend), so phase times line up
//! with `dmesg` and journald's monotonic timestamps. std has no boot clock, hence the one
//! `clock_gettime` declaration; other platforms fall back to time since this process started.

#[cfg(target_os = "linux")]
mod sys {
    /// `struct timespec` on every Linux target Rust supports with a 64-bit `time_t`.
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }

    /// `CLOCK_BOOTTIME` from `<linux/time.h>`; the same value on every architecture.
    const CLOCK_BOOTTIME: i32 = 7;
    /// `CLOCK_MONOTONIC` from `<linux/time.h>`: systemd's `…TimestampMonotonic` clock.
    const CLOCK_MONOTONIC: i32 = 1;

    extern "C" {
        fn clock_gettime(clk_id: i32, tp: *mut Timespec) -> i32;
    }

    pub fn boottime_ms() -> Option<u64> {
        read(CLOCK_BOOTTIME).map(|(s, ns)| s * 1000 + ns / 1_000_000)
    }

    pub fn monotonic_us() -> Option<u64> {
        read(CLOCK_MONOTONIC).map(|(s, ns)| s * 1_000_000 + ns / 1000)
    }

    fn read(clock: i32) -> Option<(u64, u64)> {
        // 32-bit targets have a 32-bit time_t in the classic ABI; the layout above would be
        // wrong there, so they take the portable fallback.
        if cfg!(not(target_pointer_width = "64")) {
            return None;
        }
        let mut ts = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
        // clock_gettime writes nothing else.
        let rc = unsafe { clock_gettime(clock, &mut ts) };
        if rc != 0 || ts.tv_sec < 0 || ts.tv_nsec < 0 {
            return None;
        }
        Some((ts.tv_sec as u64, ts.tv_nsec as u64))
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    pub fn boottime_ms() -> Option<u64> {
        None
    }

    pub fn monotonic_us() -> Option<u64> {
        None
    }
}

/// Milliseconds since boot, or since this process first asked when the platform has no boot
/// clock (the times then still order and subtract correctly within one run).
pub fn now_ms() -> u64 {
    if let Some(ms) = sys::boottime_ms() {
        return ms;
    }
    use std::sync::OnceLock;
    use std::time::Instant;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Microseconds of `CLOCK_MONOTONIC`, the clock of systemd's `…TimestampMonotonic`
/// properties; `None` where there is no such clock.
pub fn monotonic_us() -> Option<u64> {
    sys::monotonic_us()
}

/// Epoch seconds to a proleptic Gregorian UTC date and time: (year, month, day, hour,
/// minute, second), by Howard Hinnant's days-from-civil algorithm run backwards. Used for
/// certificate dates here and for SPDX and zip times by the builder.
pub fn civil(secs: i64) -> (i64, u32, u32, u32, u32, u32) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = if m <= 2 { y + 1 } else { y };
    (
        y,
        m,
        d,
        (rem / 3600) as u32,
        ((rem % 3600) / 60) as u32,
        (rem % 60) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_is_monotonic_and_after_boot() {
        let a = now_ms();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = now_ms();
        assert!(b >= a + 19, "clock went from {a} to {b} over a 20 ms sleep");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn agrees_with_proc_uptime() {
        // /proc/uptime is CLOCK_BOOTTIME in seconds with two decimals.
        let text = std::fs::read_to_string("/proc/uptime").expect("read /proc/uptime");
        let secs: f64 = text.split_whitespace().next().unwrap().parse().unwrap();
        let ms = now_ms() as f64;
        assert!(
            (ms - secs * 1000.0).abs() < 2000.0,
            "now_ms()={ms} but /proc/uptime says {secs} s"
        );
    }
}
