//! Progress and outcome reporting: `/run/kiln/status.json`, console lines, sentinels.
//!
//! The run loop talks to one [`Reporter`]: `begin` a phase, then end it with `success` or
//! `failure`, and `finish` once. The reporting issue (#4) fills in the outputs behind this API;
//! the API itself is what `run` relies on.

use std::path::{Path, PathBuf};

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

/// One phase as recorded in status.json.
#[derive(Debug, Clone)]
pub struct PhaseRecord {
    pub phase: Phase,
    pub start_ms: u64,
    pub end_ms: Option<u64>,
    pub result: PhaseResult,
    pub reason: Option<Reason>,
}

/// Collects the phases of one run and publishes them.
#[derive(Debug)]
pub struct Reporter {
    root: PathBuf,
    console: Option<PathBuf>,
    provider: String,
    node_name: String,
    image_id: String,
    phases: Vec<PhaseRecord>,
}

impl Reporter {
    /// A reporter writing under `root` (the `--root` prefix) and to `console` if given.
    pub fn new(root: &Path, console: Option<PathBuf>) -> Reporter {
        Reporter {
            root: root.to_path_buf(),
            console,
            provider: String::new(),
            node_name: String::new(),
            image_id: String::new(),
            phases: Vec::new(),
        }
    }

    /// Records who this node is, as soon as it is known.
    pub fn identity(&mut self, provider: &str, node_name: &str, image_id: &str) {
        self.provider = provider.to_string();
        self.node_name = node_name.to_string();
        self.image_id = image_id.to_string();
    }

    /// Starts a phase.
    pub fn begin(&mut self, phase: Phase) {
        self.phases.push(PhaseRecord {
            phase,
            start_ms: 0,
            end_ms: None,
            result: PhaseResult::Running,
            reason: None,
        });
    }

    /// Ends the current phase successfully; `detail` is a short `key=value` note for the console.
    pub fn success(&mut self, phase: Phase, detail: &str) {
        let _ = detail;
        self.end(phase, PhaseResult::Success, None);
    }

    /// Ends the current phase with a failure. `message` names the file, key or URL involved.
    pub fn failure(&mut self, phase: Phase, reason: Reason, message: &str) {
        let _ = message;
        self.end(phase, PhaseResult::Failure, Some(reason));
    }

    /// Publishes the final outcome (success sentinel or failure files, final console line).
    pub fn finish(&mut self) {
        let _ = (
            &self.root,
            &self.console,
            &self.provider,
            &self.node_name,
            &self.image_id,
        );
    }

    /// The phases recorded so far.
    pub fn phases(&self) -> &[PhaseRecord] {
        &self.phases
    }

    fn end(&mut self, phase: Phase, result: PhaseResult, reason: Option<Reason>) {
        if let Some(rec) = self.phases.iter_mut().rev().find(|r| r.phase == phase) {
            rec.end_ms = Some(rec.start_ms);
            rec.result = result;
            rec.reason = reason;
        }
    }
}
