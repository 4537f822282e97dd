#!/usr/bin/env bash
# Cost per event of the keyed job, by part of the pipeline (issue 19).
#
# Runs `weir bench --pipeline keyed` under callgrind (instruction counts,
# which repeat exactly from run to run, whatever else the machine does) on
# one worker thread, at two event counts, and prints the instructions per
# event of each part as the difference of the two runs divided by the
# difference of the event counts (start-up and first inserts cancel out).
# With `--perf`, also samples a native run with `perf record -e cpu-clock`
# (the guest has no hardware counters) and prints the top functions.
#
# Usage: bench/profile.sh [--weir PATH] [--state mapped|heap] [--parallelism P]
#                         [--events N] [--out DIR] [--perf]
# Needs valgrind (apt-get install valgrind) and python3; perf for --perf.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
weir="${CARGO_TARGET_DIR:-$here/../target}/release/weir"
state=mapped
parallelism=1
events=1000000
out="$(mktemp -d -t weir-profile-XXXXXX)"
perf=0
while [ $# -gt 0 ]; do
    case "$1" in
        --weir) weir="$2"; shift 2 ;;
        --state) state="$2"; shift 2 ;;
        --parallelism) parallelism="$2"; shift 2 ;;
        --events) events="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --perf) perf=1; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
[ -x "$weir" ] || { echo "no weir binary at $weir (cargo build --release -p weir-bench, or --weir PATH)" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)" >&2; exit 2; }
mkdir -p "$out"

small=$events
large=$((3 * events))
for n in "$small" "$large"; do
    # One worker: the source and keyed tasks take turns on one thread, so
    # no instruction is spent spinning on an empty ring (under valgrind,
    # which runs one thread at a time, spinning would be counted).
    valgrind --tool=callgrind --callgrind-out-file="$out/keyed.$state.p$parallelism.n$n.out" \
        "$weir" bench --pipeline keyed --state "$state" --parallelism "$parallelism" --workers 1 \
        --events "$n" >"$out/keyed.$state.p$parallelism.n$n.log" 2>&1
done
echo "keyed job, $state state, parallelism $parallelism, 1 worker; callgrind, ($large - $small events)"
python3 "$here/profile_breakdown.py" \
    "$out/keyed.$state.p$parallelism.n$small.out" "$small" \
    "$out/keyed.$state.p$parallelism.n$large.out" "$large"
echo "profiles in $out (callgrind_annotate FILE for functions and lines)"

if [ "$perf" = 1 ]; then
    command -v perf >/dev/null || { echo "perf is missing" >&2; exit 2; }
    perf record -e cpu-clock -F 2000 -g -o "$out/perf.$state.p$parallelism.data" -- \
        "$weir" bench --pipeline keyed --state "$state" --parallelism "$parallelism" \
        --events $((100 * events)) >"$out/perf.$state.p$parallelism.log" 2>&1
    perf report -i "$out/perf.$state.p$parallelism.data" --no-children --sort symbol --stdio 2>/dev/null \
        | grep -E '^ +[0-9]' | head -25
fi
