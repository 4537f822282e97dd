#!/usr/bin/env bash
# Kafka to Kafka in open loop (issue 51): weir's keyed count beside Apache Flink's
# (bench/peers/flink/KafkaPeer.java, flink-connector-kafka), the same load generator
# and the same read_committed reader for both, on one warm broker, in interleaved
# rounds; prints the medians beside the broker's own end-to-end floor.
#
#   bench/peers/kafka/open_loop.sh [--rate 20000] [--seconds 8] [--rounds 3] [--partitions 2]
#        [--weir-rows at-least-once:100,at-least-once:1000,aligned:10,aligned:100,aligned:1000]
#        [--flink-rows at-least-once:100,at-least-once:1000,aligned:100,aligned:1000]
#        [--brokers H:P] [--weir PATH] [--out DIR]
#
# - The broker: --brokers, or one of this script's own (kafka.sh, free ports,
#   KAFKA_JVM_OPTS=-XX:+UseG1GC), warmed by one unreported run of weir's.
# - weir's rows: `weir bench --source kafka --sink kafka --rate R`, --seconds of
#   records after its 1 s warm-up (its own job, its defaults: one worker, a core left
#   to the broker).
# - Flink's rows: KafkaPeer --open IN:OUT (parallelism 2, hashmap state, checkpoints
#   at the row's interval, its sink AT_LEAST_ONCE or EXACTLY_ONCE, the network
#   buffer timeout 0 instead of 100 ms: see bench/peers/flink/README.md), fed and read
#   by `weir bench --external-job IN:OUT`: a trickle until its first output, then the
#   same schedule, its first 5 s (the JIT's warm-up) not recorded.
# - Each round: the broker's floor (Kafka's EndToEndLatency, 3,000 records, acks=all),
#   then every row, weir's first in odd rounds and Flink's first in even ones. Results: DIR/round-N/{floor.txt,weir.jsonl,flink.jsonl},
#   DIR/table.txt.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
rate=20000
seconds=8
rounds=3
partitions=2
weir_rows=at-least-once:100,at-least-once:1000,aligned:10,aligned:100,aligned:1000
flink_rows=at-least-once:100,at-least-once:1000,aligned:100,aligned:1000
brokers=""
weir_bin=${CARGO_TARGET_DIR:-$ROOT/target}/release/weir
out=""

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --partitions) partitions=$2; shift 2 ;;
    --weir-rows) weir_rows=$2; shift 2 ;;
    --flink-rows) flink_rows=$2; shift 2 ;;
    --brokers) brokers=$2; shift 2 ;;
    --weir) weir_bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "unknown argument: $1" >&2; usage 2 ;;
  esac
done
out=${out:-$HERE/results/open-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
[ -x "$weir_bin" ] || { echo "no weir binary at $weir_bin: cargo build --release -p weir-bench (or --weir PATH)" >&2; exit 1; }
# weir's records: --seconds after its 1 s warm-up; Flink's: after its 5 s.
weir_events=$(python3 -c "print(int($rate * ($seconds + 1)))")
flink_events=$(python3 -c "print(int($rate * ($seconds + 5)))")

bash "$HERE/kafka.sh" tools
if [ -z "$brokers" ]; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  export KAFKA_DIR=$out/broker KAFKA_PORT=$port KAFKA_CONTROLLER_PORT=$((port + 1))
  export KAFKA_JVM_OPTS=${KAFKA_JVM_OPTS:--XX:+UseG1GC} KAFKA_HEAP=${KAFKA_HEAP:-1g} KAFKA_WATCH_PID=$$
  bash "$HERE/kafka.sh" start
  trap 'bash "$HERE/kafka.sh" stop; rm -rf "$KAFKA_DIR/data"' EXIT
  brokers=127.0.0.1:$port
fi
tools_cp=$(bash "$HERE/kafka.sh" tools-classpath)
fl=$ROOT/bench/peers/flink
fcp=$("$fl/kafka_classpath.sh")

echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== broker $brokers; weir $weir_bin; $rate records/s; results in $out"

weir_row() { # mode interval json
  "$weir_bin" bench --source kafka --sink kafka --brokers "$brokers" --partitions "$partitions" \
    --rate "$rate" --events "$weir_events" --mode "$1" --checkpoint-interval-ms "$2" --json "$3"
}

flink_row() { # mode interval json
  local tag in outt fck fpid status=0
  tag=$(date +%s%N)
  in=flink-in-$tag outt=flink-out-$tag
  fck=$(mktemp -d "${TMPDIR:-/tmp}/weir-flink-open.XXXXXX")
  java -Dlog4j2.configurationFile="$fl/log4j2.properties" -cp "$fcp" KafkaPeer --open "$in:$outt" \
    --brokers "$brokers" --partitions "$partitions" --modes "$1" --intervals "$2" --checkpoint-dir "$fck" \
    --stop-file "$fck/stop" >"$out/flink-$1-$2-$tag.log" 2>&1 &
  fpid=$!
  "$weir_bin" bench --source kafka --sink kafka --brokers "$brokers" --partitions "$partitions" \
    --external-job "$in:$outt" --rate "$rate" --events "$flink_events" --mode "$1" \
    --checkpoint-interval-ms "$2" --json "$3" || status=$?
  # Cancelled, not killed: its sink aborts its open transactions as it closes (a killed
  # one's would be aborted by the broker a minute later, during another row).
  touch "$fck/stop"
  for _ in $(seq 1 600); do kill -0 "$fpid" 2>/dev/null || break; sleep 0.1; done
  kill "$fpid" 2>/dev/null || true
  wait "$fpid" 2>/dev/null || true
  rm -rf "$fck"
  # Deleted at the end: a deletion's file removal comes a minute later.
  echo "$in|$outt" >>"$out/flink-topics"
  if [ "$status" != 0 ]; then
    echo "Flink's row $1 at $2 ms failed; its log: $out/flink-$1-$2-$tag.log" >&2
    return "$status"
  fi
}

floor() { # file
  local topic=e2e-$(date +%s%N)
  java -cp "$tools_cp" org.apache.kafka.tools.EndToEndLatency "$brokers" "$topic" 3000 all 30 >"$1" 2>&1
  java -cp "$tools_cp" org.apache.kafka.tools.TopicCommand --bootstrap-server "$brokers" --delete \
    --topic "$topic" >/dev/null 2>&1 || true
  grep '^Percentiles' "$1"
}

echo "== warm-up (not reported): weir at-least-once at 100 ms, then Flink's at-least-once at 100 ms"
weir_row at-least-once 100 "$out/warmup.jsonl" >/dev/null
flink_row at-least-once 100 "$out/warmup.jsonl" >/dev/null

weir_rows_of() { # round
  for row in ${weir_rows//,/ }; do
    echo "== round $1: weir ${row/:/ at } ms"
    weir_row "${row%%:*}" "${row##*:}" "$out/round-$1/weir.jsonl"
  done
}
flink_rows_of() { # round
  for row in ${flink_rows//,/ }; do
    echo "== round $1: Flink ${row/:/ at } ms"
    flink_row "${row%%:*}" "${row##*:}" "$out/round-$1/flink.jsonl"
  done
}
for r in $(seq 1 "$rounds"); do
  mkdir -p "$out/round-$r"
  echo "== round $r of $rounds: the broker's floor"
  floor "$out/round-$r/floor.txt"
  # The engines in turn first: neither always runs after the other's rows.
  if [ $((r % 2)) = 1 ]; then weir_rows_of "$r"; flink_rows_of "$r"; else flink_rows_of "$r"; weir_rows_of "$r"; fi
done
if [ -s "$out/flink-topics" ]; then
  java -cp "$tools_cp" org.apache.kafka.tools.TopicCommand --bootstrap-server "$brokers" --delete \
    --topic "$(paste -sd"|" "$out/flink-topics")" >/dev/null 2>&1 || true
fi

python3 - "$out" "$rounds" <<'EOF' | tee "$out/table.txt"
import json, statistics, sys, re
out, rounds = sys.argv[1], int(sys.argv[2])
floors, rows = [], {}
for r in range(1, rounds + 1):
    d = f"{out}/round-{r}"
    m = re.search(r"Percentiles: 50th = ([\d.]+), 99th = ([\d.]+), 99.9th = ([\d.]+)", open(f"{d}/floor.txt").read())
    floors.append(tuple(map(float, m.groups())))
    for engine in ("weir", "flink"):
        for line in open(f"{d}/{engine}.jsonl"):
            j = json.loads(line)
            rows.setdefault((engine, j["mode"], j["checkpoint_interval_ms"]), []).append(j["visible_latency_us"])
med = lambda xs: statistics.median(xs)
f50, f99, f999 = (med([f[i] for f in floors]) for i in range(3))
two = 2 * f99
print(f"broker floor (Kafka's EndToEndLatency, one crossing), medians of {rounds}: p50 {f50:.0f} ms, p99 {f99:.0f} ms, "
      f"p99.9 {f999:.0f} ms; two crossings at p99: {two:.0f} ms")
print(f"{'engine':<7}{'mode':<15}{'interval':>9}{'visible p50':>13}{'p99':>10}{'p99.9':>10}   {'p99 per round':<24}{'p99 target':<30}{'weir/Flink p99 (target <= 0.33)'}")
for (engine, mode, interval), v in sorted(rows.items(), key=lambda kv: (kv[0][0] != "weir", kv[0][1], kv[0][2])):
    p50, p99, p999 = (med([x[k] for x in v]) / 1e3 for k in ("p50", "p99", "p999"))
    per = " / ".join(f"{x['p99']/1e3:.1f}" for x in v)
    target, ratio = "", ""
    if engine == "weir":
        if mode == "at-least-once":
            target = f"<= {2 * two:.0f} ms (2x two crossings)"
        else:
            target = f"<= {interval + two:.0f} ms (interval + two)"
        peer = rows.get(("flink", mode, interval))
        if peer:
            fp99 = med([x["p99"] for x in peer]) / 1e3
            ratio = f"{p99 / fp99:.2f}"
    print(f"{engine:<7}{mode:<15}{interval:>7}ms{p50:>11.1f}ms{p99:>8.1f}ms{p999:>8.1f}ms   {per:<24}{target:<30}{ratio}")
EOF
