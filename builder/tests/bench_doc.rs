//! Every figure in `docs/benchmarks.md` traces to a `make bench` run (issue 18): each table
//! row names its metric as `` `area/metric` ``, and its value is the one recorded in
//! `docs/bench-results.jsonl`, the committed results file of the run the page describes
//! (`bench/run.sh` writes it as `target/bench/results.jsonl`; `bench/report.py` prints
//! the tables). A table row with no metric, or a value that differs from the run's, fails.

use std::collections::BTreeMap;
use std::path::Path;

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `area/metric` -> value, from the committed results file.
fn results() -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string(repo().join("docs/bench-results.jsonl")).unwrap();
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("docs/bench-results.jsonl:{}: {e}", i + 1));
        if v.get("run").is_some() {
            continue;
        }
        let key = format!(
            "{}/{}",
            v["area"].as_str().unwrap(),
            v["metric"].as_str().unwrap()
        );
        out.insert(key, v["value"].as_f64().unwrap());
    }
    out
}

/// The number in a table cell (`1 086 833`, `0.25`, `12.3`), if the cell is one.
fn number(cell: &str) -> Option<(f64, u32)> {
    let t: String = cell
        .trim()
        .trim_matches('*')
        .chars()
        .filter(|c| *c != ' ')
        .collect();
    let v: f64 = t.parse().ok()?;
    let decimals = t.split_once('.').map_or(0, |(_, d)| d.len() as u32);
    Some((v, decimals))
}

/// Whether `shown` (with `decimals` digits after the point) is `recorded` rounded to those
/// digits.
fn matches(shown: f64, decimals: u32, recorded: f64) -> bool {
    let step = 10f64.powi(-(decimals as i32));
    (shown - recorded).abs() <= step / 2.0 + 1e-9
}

#[test]
fn every_table_row_of_the_benchmarks_page_is_a_recorded_figure() {
    let page = std::fs::read_to_string(repo().join("docs/benchmarks.md")).unwrap();
    let results = results();
    let mut problems = Vec::new();
    let mut quoted = 0;
    for (i, line) in page.lines().enumerate() {
        let n = i + 1;
        let t = line.trim();
        if !t.starts_with('|') || t.starts_with("|---") || t.starts_with("| metric ") {
            continue;
        }
        let cells: Vec<&str> = t.trim_matches('|').split('|').collect();
        let Some(metric) = cells[0]
            .trim()
            .strip_prefix('`')
            .and_then(|c| c.strip_suffix('`'))
        else {
            problems.push(format!(
                "docs/benchmarks.md:{n}: a table row without a `area/metric` in its first cell: {t}"
            ));
            continue;
        };
        let Some(&recorded) = results.get(metric) else {
            problems.push(format!(
                "docs/benchmarks.md:{n}: `{metric}` is not in docs/bench-results.jsonl"
            ));
            continue;
        };
        let Some((shown, decimals)) = cells.get(1).and_then(|c| number(c)) else {
            problems.push(format!(
                "docs/benchmarks.md:{n}: `{metric}`: the second cell is not a number: {t}"
            ));
            continue;
        };
        quoted += 1;
        if !matches(shown, decimals, recorded) {
            problems.push(format!(
                "docs/benchmarks.md:{n}: `{metric}` shows {shown}, the run recorded {recorded}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        quoted >= 20,
        "only {quoted} figures quoted: the page should show the run"
    );
}

#[test]
fn the_checker_refuses_a_figure_that_differs_from_the_run() {
    assert!(matches(0.25, 2, 0.2512));
    assert!(!matches(0.27, 2, 0.2512));
    assert!(matches(1087.0, 0, 1086.8));
    assert!(!matches(1090.0, 0, 1086.8));
    assert_eq!(number(" **1.29** "), Some((1.29, 2)));
    assert_eq!(number("1 086 833"), Some((1086833.0, 0)));
    assert_eq!(number("met"), None);
}
