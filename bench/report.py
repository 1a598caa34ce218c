#!/usr/bin/env python3
"""Prints the figures of a `make bench` results file as markdown tables, one per area.

    bench/report.py target/bench/results.jsonl [AREA...]

Each row names its metric as `area/metric`; docs/benchmarks.md quotes rows from here, and
builder/tests/bench_doc.rs checks every quoted value against docs/bench-results.jsonl (the
committed copy of the run the page describes).
"""
import json
import sys


def fmt(v):
    if isinstance(v, int):
        return f"{v:,}".replace(",", " ") if abs(v) >= 10000 else str(v)
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if abs(v) >= 0.01 else f"{v:.2g}"


def verdict(v, budget):
    if not budget:
        return ""
    op, _, limit = budget.partition(" ")
    limit = float(limit)
    ok = v <= limit if op == "<=" else v >= limit
    return "met" if ok else "**not met**"


def main():
    path, *areas = sys.argv[1:]
    lines = [json.loads(l) for l in open(path) if l.strip()]
    run = next((l["run"] for l in lines if "run" in l), None)
    if run:
        print(f"Run: commit {run['rev']}, {run['started']}, {run['cpus']} CPUs ({run['cpu']}), "
              f"kernel {run['kernel']}, load average at the start {run['load']}.\n")
    by_area = {}
    for l in lines:
        if "area" in l:
            by_area.setdefault(l["area"], []).append(l)
    for area, rows in by_area.items():
        if areas and area not in areas:
            continue
        print(f"#### {area}\n")
        print("| metric | value | unit | budget | verdict | load |")
        print("|---|---:|---|---|---|---|")
        for r in rows:
            print(f"| `{area}/{r['metric']}` | {fmt(r['value'])} | {r['unit']} | "
                  f"{r.get('budget', '')} | {verdict(r['value'], r.get('budget'))} | {r['load']} |")
        print()


main()
