//! Deadline assertions shared by the test suites that include this file by path.
//!
//! Deadlines are the claim these tests make, not speed: a run that ignores its deadline
//! never ends, so an upper bound far past the deadline still catches it, and a loaded 2-core
//! machine (or Wine, or TCG) cannot make it flake. Speed lives in `make bench`.

#![allow(dead_code)]

use std::time::Duration;

/// How far past its deadline a run may end before the test calls it unbounded.
pub const SLACK: Duration = Duration::from_secs(60);

/// Asserts the run kept trying until near its `deadline_s` (the last wait is cut short so a
/// final attempt fits, so it stops within about 100 ms of the deadline; a quarter is the
/// bound), and did not run unboundedly past it.
pub fn ended_at_deadline(elapsed: Duration, deadline_s: u64) {
    assert!(
        elapsed >= Duration::from_millis(deadline_s * 750),
        "gave up long before its {deadline_s} s deadline: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(deadline_s) + SLACK,
        "still running {SLACK:?} past its {deadline_s} s deadline: {elapsed:?}"
    );
}

/// Asserts the run ended, and not unboundedly past its `deadline_s` (no lower bound: the
/// run may end earlier).
pub fn bounded(elapsed: Duration, deadline_s: u64) {
    assert!(
        elapsed < Duration::from_secs(deadline_s) + SLACK,
        "still running {SLACK:?} past its {deadline_s} s deadline: {elapsed:?}"
    );
}

/// Asserts the run ended without waiting for a deadline it was given (`deadline_s`, set far
/// above `SLACK` by the caller), so the early exit, not the deadline, ended it.
pub fn ended_early(elapsed: Duration, deadline_s: u64) {
    assert!(
        deadline_s > 2 * SLACK.as_secs(),
        "give the run a deadline far above SLACK"
    );
    assert!(
        elapsed < SLACK,
        "waited for its {deadline_s} s deadline instead of ending early: {elapsed:?}"
    );
}
