#!/usr/bin/env bash
# Runs weir (modes none and aligned) and the timely peer on the same jobs,
# interleaved round by round, and prints one table of medians. See README.md.
#
#   bench/peers/timely/compare.sh [--rounds N] [--events N] [--stateless-events N]
#                                 [--rate R] [--open-seconds S] [--cases LIST]
#                                 [--timely-args "ARGS"] [--weir PATH] [--out DIR] [--smoke]
#
#   cases: keyed-closed,stateless-closed,keyed-open-1w,keyed-open-2w (default: all)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)

rounds=3
events=100000000            # keyed closed loop, per run, both engines
stateless_events=1000000000 # stateless closed loop, per run, both engines
rate=200000                 # open loop, records/s in total
open_seconds=10             # open loop, length of each run
cases=keyed-closed,stateless-closed,keyed-open-1w,keyed-open-2w
timely_args=""              # extra options for every timely run (--input, --time, ...)
weir_bin="$ROOT/target/release/weir"
out=""

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --events) events=$2; shift 2 ;;
    --stateless-events) stateless_events=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --open-seconds) open_seconds=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    --timely-args) timely_args=$2; shift 2 ;;
    --weir) weir_bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    # A check that everything runs and the table prints, not a measurement.
    --smoke) rounds=1; events=1000000; stateless_events=2000000; open_seconds=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "unknown argument: $1" >&2; usage 2 ;;
  esac
done
open_events=$(python3 -c "print(int($rate * $open_seconds))")
out=${out:-$HERE/results/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"

# Both engines from release builds with this machine's compiler.
if [ ! -x "$weir_bin" ]; then
  (cd "$ROOT" && cargo build --release -p weir-bench)
fi
(cd "$HERE" && cargo build --release)
timely_bin="$HERE/target/release/weir-timely-peer"

{
  echo "weir: $weir_bin ($(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo "timely peer: $timely_bin; $(rustc --version)"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
  echo "rounds $rounds; closed loop: keyed $events, stateless $stateless_events events; open loop: $rate/s for ${open_seconds} s"
} | tee "$out/setup.txt"

# One case's three runs: weir none, weir aligned (mapped state, 10 ms
# checkpoints), timely. $1: case; $2: round.
run_case() {
  local case=$1 round=$2 common timely
  case "$case" in
    keyed-closed)
      common=(--pipeline keyed --events "$events")
      timely=(--pipeline keyed --events "$events" --workers 2) ;;
    stateless-closed)
      common=(--pipeline stateless --events "$stateless_events")
      timely=(--pipeline stateless --events "$stateless_events" --workers 2) ;;
    keyed-open-1w)
      # One worker, the other core spare (weir's helpers go there); weir's
      # parallelism stays one per core, as in `weir compare`'s latency rows.
      common=(--pipeline keyed --rate "$rate" --events "$open_events" --workers 1)
      timely=(--pipeline keyed --rate "$rate" --events "$open_events" --workers 1) ;;
    keyed-open-2w)
      common=(--pipeline keyed --rate "$rate" --events "$open_events" --workers 2)
      timely=(--pipeline keyed --rate "$rate" --events "$open_events" --workers 2) ;;
    *) echo "unknown case: $case" >&2; exit 2 ;;
  esac
  # Nothing preempts either engine's workers while measured: no platform
  # probe beside weir; the same 10,000 keys and seed 1 for both.
  for mode in none aligned; do
    local extra=()
    [ "$mode" = aligned ] && extra=(--state mapped --checkpoint-interval-ms 10)
    echo "round $round, $case: weir $mode"
    "$weir_bin" bench "${common[@]}" --keys 10000 --seed 1 --mode "$mode" "${extra[@]}" \
      --platform-probe off --json "$out/weir-$case.jsonl" >>"$out/weir.log"
  done
  echo "round $round, $case: timely"
  # shellcheck disable=SC2086  # timely_args is a list of options
  "$timely_bin" "${timely[@]}" --keys 10000 --seed 1 $timely_args --json "$out/timely-$case.jsonl" >/dev/null
}

IFS=, read -r -a case_list <<<"$cases"
for round in $(seq 1 "$rounds"); do
  for case in "${case_list[@]}"; do
    run_case "$case" "$round"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/setup.txt"
echo
python3 "$HERE/table.py" "$out" "${case_list[@]}" | tee "$out/table.txt"
