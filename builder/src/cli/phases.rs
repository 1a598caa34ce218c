//! `kiln bake`'s phase display: an indicatif bar per phase on a terminal (stderr), one JSON
//! line per phase event on stdout with `--json`, one short line per finished phase on stderr
//! otherwise, nothing with `--quiet`. The same choice of mode as `kiln fetch`'s progress.

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::sync::Mutex;

use indicatif::{HumanBytes, MultiProgress, ProgressBar, ProgressStyle};

use crate::bake::progress::{Event, Phase, Reporter};
use crate::cli::common::Global;

enum Mode {
    Json,
    Lines,
    Bars(MultiProgress, Mutex<HashMap<Phase, ProgressBar>>),
    Quiet,
}

/// Shows a bake's phases; see the module docs.
pub(crate) struct PhaseDisplay(Mode);

impl PhaseDisplay {
    /// The display `global` asks for.
    pub(crate) fn new(global: &Global) -> PhaseDisplay {
        PhaseDisplay(if global.json {
            Mode::Json
        } else if global.quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            Mode::Bars(MultiProgress::new(), Mutex::new(HashMap::new()))
        } else {
            Mode::Lines
        })
    }

    /// Takes down the bars of phases that did not finish (the bake failed in them).
    pub(crate) fn finish(&self) {
        if let Mode::Bars(_, bars) = &self.0 {
            let bars = bars.lock().unwrap_or_else(|p| p.into_inner());
            for bar in bars.values().filter(|b| !b.is_finished()) {
                bar.finish_and_clear();
            }
        }
    }
}

fn took(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

impl Reporter for PhaseDisplay {
    fn event(&self, e: &Event) {
        match &self.0 {
            Mode::Quiet => {}
            Mode::Json => crate::cli::json::emit_serialized(crate::cli::json::Level::Info, e),
            Mode::Lines => {
                if let Event::PhaseDone {
                    phase,
                    bytes,
                    elapsed_ms,
                } = e
                {
                    eprintln!(
                        "kiln bake: {phase}: {} in {}",
                        HumanBytes(*bytes),
                        took(*elapsed_ms)
                    );
                }
            }
            Mode::Bars(multi, bars) => {
                let mut bars = bars.lock().unwrap_or_else(|p| p.into_inner());
                match e {
                    Event::PhaseStart { phase, total_bytes } => {
                        let bar = multi.add(ProgressBar::new(*total_bytes));
                        bar.set_style(
                            ProgressStyle::with_template(
                                "{prefix:>8} [{bar:30}] {bytes:>10}/{total_bytes:<10} {msg}",
                            )
                            .unwrap_or_else(|_| ProgressStyle::default_bar()),
                        );
                        bar.set_prefix(phase.name());
                        bars.insert(*phase, bar);
                    }
                    Event::PhaseProgress { phase, bytes, .. } => {
                        if let Some(bar) = bars.get(phase) {
                            bar.set_position(*bytes);
                        }
                    }
                    Event::PhaseDone {
                        phase,
                        bytes,
                        elapsed_ms,
                    } => {
                        if let Some(bar) = bars.get(phase) {
                            bar.set_position(*bytes);
                            bar.finish_with_message(format!("done in {}", took(*elapsed_ms)));
                        }
                    }
                }
            }
        }
    }
}
