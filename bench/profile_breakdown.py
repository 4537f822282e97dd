#!/usr/bin/env python3
"""Cost per event of the keyed job by part, from callgrind output files.

Usage: profile_breakdown.py SMALL.out N_SMALL LARGE.out N_LARGE

Reads two callgrind profiles of the same job with different event counts
and prints the instructions per event of each part of the pipeline, as the
difference of the two runs divided by the difference of the event counts:
start-up, thread creation and per-key first inserts cancel out.

Each function (with the source file of inlined code) is put into one part
by name (`classify`); a function in no part counts towards the part of the
part-assigned function that calls it (libc's memcpy under the ring push,
hdrhistogram under the sink), unless it calls part-assigned functions
itself (then only its own instructions go to "other").
"""

import re
import sys
from collections import defaultdict

PARTS = [
    "generator",
    "partitioning (key hash, key group, staging)",
    "ring push (chunked copy into the ring)",
    "ring pop (input task reads the ring)",
    "state update (keyed function and its state)",
    "sink (count, latency histogram)",
    "scheduling (worker loop, task turns, clock)",
    "metrics publish (time-driven)",
]


# Functions, other than the source task's poll, with code from the
# generator's source file; filled by `breakdown` for each profile.
GENERATOR_FNS = set()


def classify(fn, fl):
    """The part of function `fn` for instructions from source file `fl`."""
    if "LatencyRecorder::publish" in fn or "maybe_publish" in fn:
        return 7
    if fn in GENERATOR_FNS:
        # The generator's record loop compiled as its own function (an
        # iterator's `fold` under `Vec::extend`): all of it, whatever file
        # its inlined parts come from.
        return 0
    if "SourceTask" in fn and "poll" in fn:
        if fl.endswith("core/src/task.rs") or "clock.rs" in fl or "context.rs" in fl or "time.rs" in fl:
            return 6
        return 0
    if "Generator" in fn and "poll" in fn:
        return 0
    if "HashOutput" in fn or "RebalanceOutput" in fn:
        return 1
    if "flush_all" in fn or "Outbox" in fn:
        return 2
    if "InputTask" in fn and "poll" in fn:
        if "clock.rs" in fl or "time.rs" in fl:
            return 6
        return 3
    if "KeyedProcess" in fn or "ValueStore" in fn or "arena::Arena" in fn:
        return 4
    if "SinkTail" in fn or "CountSink" in fn or "record_latency" in fn or "LatencyRecorder::record" in fn:
        return 5
    if (
        "common_phase" in fn
        or "poll_notices" in fn
        or "end_turn" in fn
        or "worker_main" in fn
        or "Idler" in fn
        or "Parker" in fn
        or "clock::now_ns" in fn
        or ("__rust_begin_short_backtrace" in fn and fl.endswith("core/src/job.rs"))
    ):
        return 6
    return None


def parse(path):
    names = {"fl": {}, "fn": {}}
    self_cost = defaultdict(int)  # (fn, file) -> Ir
    edges = defaultdict(int)  # (caller fn, caller file, callee fn) -> inclusive Ir
    total = 0
    fl = fi = fn = None
    cfn = None
    pending_call = False
    ref = re.compile(r"\((\d+)\)(?: (.*))?")

    def name(kind, rest):
        m = ref.match(rest)
        if not m:
            return rest
        key, val = m.group(1), m.group(2)
        if val is not None:
            names[kind][key] = val
        return names[kind].get(key, key)

    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                parts = line.split()
                if len(parts) < 2:
                    continue
                cost = int(parts[1])
                if pending_call:
                    edges[(fn, fi or fl, cfn)] += cost
                    pending_call = False
                else:
                    self_cost[(fn, fi or fl)] += cost
                    total += cost
                continue
            key, _, rest = line.partition("=")
            if key == "fl":
                fl = name("fl", rest)
                fi = None
            elif key in ("fi", "fe"):
                fi = name("fl", rest)
                if fi == fl:
                    fi = None
            elif key == "fn":
                fn = name("fn", rest)
                fi = None
            elif key in ("cfi", "cfl"):
                name("fl", rest)
            elif key == "cfn":
                cfn = name("fn", rest)
            elif key == "calls":
                pending_call = True
    return self_cost, edges, total


def breakdown(path):
    self_cost, edges, total = parse(path)
    GENERATOR_FNS.clear()
    GENERATOR_FNS.update(
        fn for (fn, fl) in self_cost if fl and fl.endswith("io/src/generator.rs") and "SourceTask" not in fn
    )
    parts = [0] * len(PARTS)
    fn_part = {}
    for (fn, fl), ir in self_cost.items():
        p = classify(fn, fl)
        if p is not None:
            parts[p] += ir
            fn_part.setdefault(fn, p)
    # Functions in no part that (transitively) call a part's function.
    callees = defaultdict(set)
    for (caller, _, callee) in edges:
        callees[caller].add(callee)
    classified = {fn for (fn, fl) in self_cost if classify(fn, fl) is not None}
    reaches = {}

    def reaches_part(fn, seen):
        if fn in reaches:
            return reaches[fn]
        if fn in seen:
            return False
        seen.add(fn)
        r = any(c in classified or reaches_part(c, seen) for c in callees.get(fn, ()))
        reaches[fn] = r
        return r

    for (caller, fl, callee), ir in edges.items():
        p = classify(caller, fl)
        if p is None or callee in classified or caller == callee:
            continue
        if reaches_part(callee, set()):
            continue
        parts[p] += ir
    return parts, total


def main():
    small, n_small, large, n_large = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    a, ta = breakdown(small)
    b, tb = breakdown(large)
    n = n_large - n_small
    per = [(y - x) / n for x, y in zip(a, b)]
    total = (tb - ta) / n
    other = total - sum(per)
    steady = total - per[7]
    print(f"{'part':<46} {'instr/event':>11} {'share':>7}")
    for name, v in zip(PARTS, per):
        print(f"{name:<46} {v:>11.1f} {100 * v / total:>6.1f}%")
    print(f"{'other':<46} {other:>11.1f} {100 * other / total:>6.1f}%")
    print(f"{'total':<46} {total:>11.1f} {100.0:>6.1f}%")
    print(f"{'total without the time-driven publish':<46} {steady:>11.1f}")


if __name__ == "__main__":
    main()
