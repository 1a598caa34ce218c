//! Progress display: indicatif bars on a terminal, one line per artifact otherwise, JSON lines
//! with `--json`.

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::sync::{Arc, Mutex};

use crate::cli::common::failed_at;
use crate::cli::common::Global;
use crate::supply::fetch::{Event, Reporter};
use crate::supply::lock::Artifact;

pub(crate) enum Mode {
    Json,
    Lines,
    Bar(
        indicatif::ProgressBar,
        Mutex<HashMap<String, u64>>,
        HashMap<String, u64>,
    ),
    Quiet,
}

/// The display, and each artifact's failed sources not yet shown: a source that failed is
/// told when a later one delivers (a fallback worth knowing), and otherwise once, in the
/// command's final error, rather than once as it happens and again at the end.
pub(crate) struct Display(Mode, Mutex<HashMap<String, Vec<String>>>);

impl Display {
    /// Keeps `id`'s failed source for later.
    fn failed(&self, id: &str, line: String) {
        let mut held = self.1.lock().unwrap_or_else(|p| p.into_inner());
        held.entry(id.to_string()).or_default().push(line);
    }

    /// `id`'s failed sources, now that another delivered it: `; after A failed: …`.
    fn fell_back(&self, id: &str) -> String {
        let mut held = self.1.lock().unwrap_or_else(|p| p.into_inner());
        held.remove(id)
            .map(|f| format!(" (after {})", f.join("; ")))
            .unwrap_or_default()
    }
}

impl Reporter for Display {
    fn event(&self, e: &Event) {
        match &self.0 {
            Mode::Quiet => {}
            Mode::Json => {
                let level = match e {
                    Event::Progress { .. } => return,
                    Event::Retry { .. } | Event::SourceFailed { .. } => {
                        crate::cli::json::Level::Warning
                    }
                    _ => crate::cli::json::Level::Info,
                };
                crate::cli::json::emit_serialized(level, e);
            }
            Mode::Lines => match e {
                Event::Done {
                    id,
                    source,
                    transferred,
                    resumed,
                } => {
                    let after = self.fell_back(id);
                    println!(
                        "{id}: ok from {source} ({transferred} bytes, {resumed} resumed){after}"
                    )
                }
                Event::Retry {
                    id,
                    url,
                    attempt,
                    error,
                    wait_ms,
                } => {
                    eprintln!(
                        "{id}: attempt {attempt}: {}; retrying in {wait_ms} ms",
                        failed_at(url, error)
                    )
                }
                Event::SourceFailed { id, source, error } => {
                    self.failed(id, failed_at(source, error));
                }
                _ => {}
            },
            Mode::Bar(bar, seen, sizes) => match e {
                Event::Progress { id, bytes } => {
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    let last = seen.insert(id.clone(), *bytes).unwrap_or(0);
                    if *bytes >= last {
                        bar.inc(bytes - last);
                    }
                }
                Event::Done { id, source, .. } => {
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    let last = seen.remove(id).unwrap_or(0);
                    if source == "cache" {
                        bar.inc(sizes.get(id).copied().unwrap_or(0));
                    } else if let Some(size) = sizes.get(id) {
                        bar.inc(size.saturating_sub(last));
                    }
                    bar.println(format!("{id}: ok from {source}{}", self.fell_back(id)));
                }
                Event::Retry {
                    id, error, wait_ms, ..
                } => bar.println(format!("{id}: retrying in {wait_ms} ms: {error}")),
                Event::SourceFailed { id, source, error } => {
                    self.failed(id, failed_at(source, error));
                }
                Event::Start { .. } => {}
            },
        }
    }
}

pub(crate) fn reporter(global: &Global, artifacts: &[Artifact]) -> Arc<Display> {
    let mode = if global.json {
        Mode::Json
    } else if global.quiet {
        Mode::Quiet
    } else if std::io::stderr().is_terminal() {
        let total: u64 = artifacts.iter().map(|a| a.size).sum();
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Mode::Bar(
            bar,
            Mutex::new(HashMap::new()),
            artifacts.iter().map(|a| (a.id(), a.size)).collect(),
        )
    } else {
        Mode::Lines
    };
    Arc::new(Display(mode, Mutex::new(HashMap::new())))
}

pub(crate) fn finish(d: &Display) {
    if let Mode::Bar(bar, _, _) = &d.0 {
        bar.finish_and_clear();
    }
}
