"""One table of weir none, weir aligned and timely, median of the rounds.

    python3 table.py RESULTS_DIR [CASE ...]

Reads RESULTS_DIR/weir-CASE.jsonl (`weir bench --json`) and
RESULTS_DIR/timely-CASE.jsonl (the timely peer, same field names), as
compare.sh writes them. Closed-loop cases show events/s, open-loop cases
processing latency p50 / p99 / p99.9 (each the median over the rounds, taken
on its own); every cell also gives the range over the rounds and how many
runs it has.
"""
import json
import os
import statistics
import sys

CASES = ["keyed-closed", "stateless-closed", "keyed-open-1w", "keyed-open-2w"]
ENGINES = ["weir none", "weir aligned", "timely"]


def load(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def engine(row):
    if row.get("engine") == "timely":
        return "timely"
    return f"weir {row['mode']}"


def si(v):
    for div, unit in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if v >= div:
            return f"{v / div:.1f}{unit}"
    return f"{v:.0f}"


def us(v):
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def closed_cell(rows):
    v = [r["events_per_sec"] for r in rows]
    m = statistics.median(v)
    return m, f"{si(m)}/s ({si(min(v))}-{si(max(v))}, n={len(v)})"


def open_cell(rows):
    parts = []
    for q in ("p50", "p99", "p999"):
        v = [r["latency_us"][q] for r in rows]
        parts.append(us(statistics.median(v)))
    p99 = [r["latency_us"]["p99"] for r in rows]
    return None, f"{' / '.join(parts)} µs (p99 {us(min(p99))}-{us(max(p99))}, n={len(rows)})"


def label(case, rows):
    r = rows[0]
    workers = {x["workers"] for x in rows}
    w = "/".join(str(x) for x in sorted(workers))
    if r.get("rate"):
        return f"{case}: {r['pipeline']}, open loop {si(r['rate'])}/s, {w} worker(s), p50 / p99 / p99.9"
    return f"{case}: {r['pipeline']}, closed loop, {w} workers, events/s"


def main():
    out = sys.argv[1]
    cases = sys.argv[2:] or CASES
    lines, variants = [], set()
    header = ["case"] + ENGINES + ["weir none / timely"]
    for case in cases:
        rows = load(os.path.join(out, f"weir-{case}.jsonl")) + load(os.path.join(out, f"timely-{case}.jsonl"))
        if not rows:
            continue
        cells, medians = [], {}
        open_loop = bool(rows[0].get("rate"))
        for e in ENGINES:
            mine = [r for r in rows if engine(r) == e]
            if not mine:
                cells.append("-")
                continue
            m, text = (open_cell if open_loop else closed_cell)(mine)
            medians[e] = m
            cells.append(text)
        if open_loop:
            ratio = "-"
        elif medians.get("timely") and medians.get("weir none"):
            ratio = f"{medians['weir none'] / medians['timely']:.1f}x"
        else:
            ratio = "-"
        lines.append([label(case, rows)] + cells + [ratio])
        variants.update(
            f"input {r.get('input')}, time {r.get('time')}" + (f", lag {r['lag']}" if r.get("lag") is not None else "")
            for r in rows
            if engine(r) == "timely"
        )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for line in lines:
        print("| " + " | ".join(line) + " |")
    print()
    print("Medians over the rounds (range, runs). weir aligned: mapped state, 10 ms checkpoints.")
    print("Open loop: processing latency from the record's scheduled emission time, warm-up excluded.")
    print("timely ran: " + "; ".join(sorted(variants)))


if __name__ == "__main__":
    main()
