//! Measures what reporting adds per phase: `Reporter::begin` + `success` (two atomic
//! status.json writes and one console line) for the six phases of a boot, plus `finish`.
//! Used by `bench/firstboot-report.sh`; not a test.
//!
//!   report_cost ROOT CONSOLE RUNS

use std::path::PathBuf;
use std::time::Instant;

use kiln_firstboot::console::Console;
use kiln_firstboot::contract::paths::NodePaths;
use kiln_firstboot::reporter::{Phase, Reporter};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 3 {
        eprintln!("usage: report_cost ROOT CONSOLE RUNS");
        std::process::exit(2);
    }
    let paths = NodePaths::under(&PathBuf::from(&args[0]));
    let console = PathBuf::from(&args[1]);
    let runs: usize = args[2].parse().expect("RUNS is a number");
    let mut per_phase = Vec::with_capacity(runs * Phase::ALL.len());
    let mut finish = Vec::with_capacity(runs);
    for _ in 0..runs {
        let mut rep = Reporter::with_console(&paths, Console::open(Some(&console)));
        rep.identity(
            "aws",
            "ip-10-0-3-7.eu-west-1.compute.internal",
            "sha256:3f0c1b2a",
        );
        for phase in Phase::ALL {
            let t = Instant::now();
            rep.begin(phase);
            rep.success(phase, "provider=aws");
            per_phase.push(t.elapsed().as_nanos() as u64);
        }
        let t = Instant::now();
        rep.finish();
        finish.push(t.elapsed().as_nanos() as u64);
    }
    let mean = per_phase.iter().sum::<u64>() as f64 / per_phase.len() as f64 / 1000.0;
    per_phase.sort_unstable();
    finish.sort_unstable();
    let q = |v: &[u64], p: f64| v[((v.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    println!(
        "kiln per-phase us: mean {mean:.1} median {:.1} p99 {:.1} max {:.1}; finish median {:.1} us ({} phases)",
        q(&per_phase, 0.5),
        q(&per_phase, 0.99),
        q(&per_phase, 1.0),
        q(&finish, 0.5),
        per_phase.len()
    );
}
