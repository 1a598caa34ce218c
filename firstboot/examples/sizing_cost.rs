//! What the sizing decision costs inside one kiln-firstboot run: reading the CPU count,
//! MemTotal and the AWS table under a root, the lookup and the formulas, repeated and timed.
//!
//!   cargo run --profile firstboot -p kiln-firstboot --example sizing_cost -- ROOT INSTANCE_TYPE [RUNS]
//!
//! ROOT holds `sys/devices/system/cpu/online`, `proc/meminfo` and `usr/lib/kiln/aws-eni.tsv`
//! (bench/sizing.sh builds one). Prints the median and the 99th percentile in microseconds.

use std::path::Path;
use std::time::Instant;

use kiln_firstboot::contract::paths;
use kiln_firstboot::contract::sizing::{CniMode, Formula};
use kiln_firstboot::sizing::{self, Inputs, Reserved, Settings};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (root, ty) = match (args.get(1), args.get(2)) {
        (Some(r), Some(t)) => (Path::new(r), t.as_str()),
        _ => {
            eprintln!("usage: sizing_cost ROOT INSTANCE_TYPE [RUNS]");
            std::process::exit(2);
        }
    };
    let runs: usize = args.get(3).and_then(|n| n.parse().ok()).unwrap_or(1000);
    let settings = Settings {
        mode: Some(CniMode::AwsVpcCni),
        formula: Formula::Eks,
        fixed: Reserved::default(),
        overrides: Reserved::default(),
    };
    let table_path = paths::under(root, paths::AWS_ENI_TABLE);
    let mut times = Vec::with_capacity(runs);
    let mut last = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let machine = sizing::read_machine(root);
        let table = sizing::read_table(&table_path, settings.mode);
        let s = sizing::decide(
            &settings,
            Inputs {
                max_pods_override: None,
                map_entry: None,
                default_max_pods: 110,
                instance_type: ty,
                machine: machine.as_ref().map(|m| *m).map_err(String::as_str),
                table: table.as_deref(),
            },
        );
        times.push(t.elapsed().as_nanos());
        last = s.max_pods.value;
    }
    times.sort_unstable();
    let us = |ns: u128| ns as f64 / 1000.0;
    println!(
        "sizing decision for {ty} (max pods {last}): median {:.1} µs, p99 {:.1} µs over {runs} runs",
        us(times[runs / 2]),
        us(times[runs * 99 / 100])
    );
}
