//! The values a boot report is made of: phases, their results, the outcome.

use crate::Reason;

/// The phases of one boot, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Config,
    Metadata,
    Write,
    StartKubelet,
    WaitHealthy,
    WaitJoined,
}

impl Phase {
    /// Every phase, in run order.
    pub const ALL: [Phase; 6] = [
        Phase::Config,
        Phase::Metadata,
        Phase::Write,
        Phase::StartKubelet,
        Phase::WaitHealthy,
        Phase::WaitJoined,
    ];

    /// The name used in status.json and on the console.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Config => "config",
            Phase::Metadata => "metadata",
            Phase::Write => "write",
            Phase::StartKubelet => "start-kubelet",
            Phase::WaitHealthy => "wait-healthy",
            Phase::WaitJoined => "wait-joined",
        }
    }
}

/// The outcome of one phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseResult {
    Running,
    Success,
    Failure,
    Skipped,
}

impl PhaseResult {
    /// The word used in status.json and on the console.
    pub fn name(self) -> &'static str {
        match self {
            PhaseResult::Running => "running",
            PhaseResult::Success => "success",
            PhaseResult::Failure => "failure",
            PhaseResult::Skipped => "skipped",
        }
    }
}

/// The overall result of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Running,
    Success,
    Failure,
}

impl Outcome {
    /// The word used in status.json.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Running => "running",
            Outcome::Success => "success",
            Outcome::Failure => "failure",
        }
    }
}

/// One phase as recorded in status.json.
#[derive(Debug, Clone)]
pub struct PhaseRecord {
    pub phase: Phase,
    pub start_ms: u64,
    pub end_ms: Option<u64>,
    pub result: PhaseResult,
    pub reason: Option<Reason>,
}

/// Most warnings status.json keeps.
pub(crate) const MAX_WARNINGS: usize = 8;
/// The most observations `report` adds after a kept failure (`later` in status.json).
pub(crate) const MAX_LATER: usize = 8;
