"""Side-by-side table of Flink and weir rows (JSON lines), with ratios weir/Flink.

    python3 side_by_side.py flink.jsonl weir.jsonl

Rows are matched on (pipeline, mode, rate); the last row of each wins.
"""
import json
import sys


def load(path):
    rows = {}
    try:
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    rows[(r["pipeline"], r["mode"], r.get("rate"))] = r
    except FileNotFoundError:
        pass
    return rows


def si(v):
    for div, unit in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if v >= div:
            return f"{v / div:.2f}{unit}"
    return f"{v:.0f}"


def us(v):
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def ratio(a, b):
    return f"{a / b:.2f}" if b else "-"


def ckpts(r):
    c = r.get("checkpoints")
    if not c:
        return "-"
    # Flink: * when every failure was the bounded job starting or finishing.
    star = "*" if c["failed"] and c["failed"] == c.get("failed_while_starting_or_finishing") else ""
    return f"{c['completed']}/{c['failed']}{star} {c['duration_ms']['p50']:.0f}ms"


def main():
    flink, weir = load(sys.argv[1]), load(sys.argv[2])
    print("Side by side, ratio = weir / Flink (events/s: above 1 means weir is faster; "
          "latency: below 1 means weir is lower)")
    head = (f"{'pipeline':<10} {'mode':<13} {'load':<11} {'Flink ev/s':>10} {'weir ev/s':>10} {'ratio':>7}"
            f" {'Flink p50':>9} {'weir p50':>9} {'ratio':>7} {'Flink p99':>9} {'weir p99':>9} {'ratio':>7}"
            f"  {'Flink ckpts':>12} {'weir ckpts':>12}")
    print(head)
    for key, f in flink.items():
        w = weir.get(key)
        if w is None:
            continue
        pipeline, mode, rate = key
        load_ = "closed loop" if rate is None else f"{si(rate)}/s"
        fl, wl = f["latency_us"], w["latency_us"]
        print(f"{pipeline:<10} {mode:<13} {load_:<11} {si(f['events_per_sec']):>10} {si(w['events_per_sec']):>10}"
              f" {ratio(w['events_per_sec'], f['events_per_sec']):>7}"
              f" {us(fl['p50']):>9} {us(wl['p50']):>9} {ratio(wl['p50'], fl['p50']):>7}"
              f" {us(fl['p99']):>9} {us(wl['p99']):>9} {ratio(wl['p99'], fl['p99']):>7}"
              f"  {ckpts(f):>12} {ckpts(w):>12}")
    print("(latency in µs from emission to sink; ckpts = completed/failed and duration p50;"
          " * = Flink failures only while the bounded job was starting or finishing)")
    parts = [(k, w) for k, w in weir.items() if w.get("parts")]
    if parts:
        print()
        print("weir against the ceiling of its parts, measured in the same run just before each job"
              " (ring and map microbenchmarks; bench/src/lab/parts_probe.rs):")
        for (pipeline, mode, _), w in parts:
            p = w["parts"]
            limit = p["limit_events_per_sec"]
            share = f"{100 * w['events_per_sec'] / limit:.0f}%" if limit else "-"
            print(f"  {pipeline}/{mode}: {si(w['events_per_sec'])} ev/s = {share} of {si(limit)} ev/s on {p['threads']} cores"
                  f" (ring {si(p['ring_items_per_sec'])}/s, FxHashMap {si(p['map_updates_per_sec'])}/s,"
                  f" weir's mapped store {si(p['mapped_updates_per_sec'])}/s, {p['keys']} keys"
                  + (f"; one-way handoff between the cores {p['handoff_ns']:.0f} ns" if p.get("handoff_ns") else "")
                  + ")")


if __name__ == "__main__":
    main()
