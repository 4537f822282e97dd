#!/usr/bin/env bash
# What the metrics endpoint costs (issue 18): interleaved `weir bench` runs
# of the keyed job with the endpoint off and on, in ABBA order (off,on then
# on,off) so that a drift of the machine's speed does not favour either;
# the "on" runs are scraped every second (/metrics and /api/job), as a
# dashboard would. Prints each pair's ratio, their median, mean and
# standard error, and the endpoint threads' own CPU time (measured by the
# engine, `metrics_endpoint_cpu_s` in the JSON) as a share of the machine.
#
#   bench/metrics_onoff.sh [ROUNDS] [EVENTS]     (defaults 12, 150000000)
#   WEIR=path/to/weir bench/metrics_onoff.sh     (default: a release build)
#
# Superseded for the throughput ratio by `weir bench --metrics-ab` (on and
# off segments within one run; docs/benchmarks.md, "Metrics endpoint"),
# which resolves far smaller differences than separate processes can.
set -euo pipefail
rounds=${1:-12}
events=${2:-150000000}
root=$(cd "$(dirname "$0")/.." && pwd)
weir=${WEIR:-}
if [ -z "$weir" ]; then
  cargo build --release -q -p weir-bench --manifest-path "$root/Cargo.toml"
  weir="$root/target/release/weir"
fi
port=${PORT:-19464}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() { # off|on tag
  if [ "$1" = off ]; then
    "$weir" bench --pipeline keyed --events "$events" --json "$out/$2.json" >/dev/null 2>&1
    return
  fi
  "$weir" bench --pipeline keyed --events "$events" --metrics-addr "127.0.0.1:$port" \
    --json "$out/$2.json" >/dev/null 2>&1 &
  local p=$!
  sleep 0.3
  while kill -0 "$p" 2>/dev/null; do
    curl -s -m 2 "http://127.0.0.1:$port/metrics" >/dev/null || true
    curl -s -m 2 "http://127.0.0.1:$port/api/job" >/dev/null || true
    sleep 1
  done
  wait "$p"
}

for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then run off "off-$r"; run on "on-$r"; else run on "on-$r"; run off "off-$r"; fi
done

python3 - "$out" "$rounds" <<'PY'
import json, statistics as st, sys
out, rounds = sys.argv[1], int(sys.argv[2])
load = lambda f: json.load(open(f"{out}/{f}.json"))
ratios, cpu_share = [], []
print("pair  off ev/s   on ev/s    on/off  endpoint CPU (% of machine)")
for r in range(1, rounds + 1):
    off, on = load(f"off-{r}"), load(f"on-{r}")
    ratio = on["events_per_sec"] / off["events_per_sec"]
    share = 100 * on["metrics_endpoint_cpu_s"] / (on["seconds"] * on["machine"]["cores"])
    ratios.append(ratio); cpu_share.append(share)
    print(f"{r:>4}  {off['events_per_sec']/1e6:7.2f} M  {on['events_per_sec']/1e6:7.2f} M  {ratio:7.4f}  {share:.4f}%")
se = st.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
print(f"on/off: median {st.median(ratios):.4f}, mean {st.mean(ratios):.4f} ± {se:.4f} (standard error), {rounds} pairs")
print(f"endpoint threads' CPU: median {st.median(cpu_share):.4f}% of the machine, max {max(cpu_share):.4f}%")
PY
