#!/usr/bin/env bash
# Kafka in and out (issue 16): weir's keyed count from topic to topic beside the
# broker's own ceiling, on one broker in one run, and prints one table.
#
#   bench/peers/kafka/compare.sh [--events N] [--rate R] [--open-events N] [--partitions P]
#                                [--intervals 10,100] [--modes at-least-once,aligned]
#                                [--weir PATH] [--out DIR] [--no-flink]
#
# 1. Starts a broker of its own with kafka.sh (free ports, state in DIR/broker,
#    KAFKA_JVM_OPTS=-XX:+UseG1GC: the full JIT, unlike the test broker) and fetches
#    Kafka's tools (kafka.sh tools).
# 2. The broker's ceiling with Kafka's own perf tools (ProducerPerformance and
#    ConsumerPerformance, the classes behind kafka-producer-perf-test.sh and
#    kafka-consumer-perf-test.sh): N records of 16 bytes (weir's input records are
#    14-16 bytes) produced idempotently with acks=all into P partitions; the
#    input topic of weir's closed-loop runs consumed read_committed; then both at
#    once (a produce into a fresh topic while consuming the input topic again),
#    which is what a job moving records from topic to topic asks of the broker.
# 3. weir bench --source kafka --sink kafka per mode and interval: closed loop
#    over the same input topic (filled once by the first run), then open loop at
#    R records/s for visibility latency.
# 4. Apache Flink 2.3 (the PyPI wheel's jars, as bench/peers/flink/run.sh) with
#    flink-connector-kafka 5.0.0-2.2 (bench/peers/flink/kafka-pom.xml):
#    bench/peers/flink/KafkaPeer.java, KafkaSource -> keyBy -> count -> KafkaSink,
#    AT_LEAST_ONCE and EXACTLY_ONCE, closed loop over the same input topic (--no-flink
#    to leave it out).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
events=2000000
rate=20000
open_events=""
partitions=2
intervals=10,100
modes=at-least-once,aligned
weir_bin=${CARGO_TARGET_DIR:-$ROOT/target}/release/weir
out=""
flink=1

usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --events) events=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --open-events) open_events=$2; shift 2 ;;
    --partitions) partitions=$2; shift 2 ;;
    --intervals) intervals=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --weir) weir_bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-flink) flink=0; shift ;;
    -h|--help) usage 0 ;;
    *) echo "unknown argument: $1" >&2; usage 2 ;;
  esac
done
open_events=${open_events:-$(python3 -c "print(int($rate * 8))")}
out=${out:-$HERE/results/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
[ -x "$weir_bin" ] || { echo "no weir binary at $weir_bin: cargo build --release -p weir-bench (or --weir PATH)" >&2; exit 1; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export KAFKA_DIR=$out/broker KAFKA_PORT=$port KAFKA_CONTROLLER_PORT=$((port + 1))
export KAFKA_JVM_OPTS=${KAFKA_JVM_OPTS:--XX:+UseG1GC} KAFKA_HEAP=${KAFKA_HEAP:-1g} KAFKA_WATCH_PID=$$
bash "$HERE/kafka.sh" tools
bash "$HERE/kafka.sh" start
trap 'bash "$HERE/kafka.sh" stop; rm -rf "$KAFKA_DIR/data"' EXIT
brokers=127.0.0.1:$port
tools_jars=${KAFKA_TOOLS_JARS:-${XDG_CACHE_HOME:-$HOME/.cache}/weir/kafka-tools-${KAFKA_VERSION:-4.1.0}}
java_tool=(java -Xmx512m -Dlog4j2.configurationFile="$HERE/log4j2.properties" -cp "$tools_jars/*")
input=kbench-in-$partitions

echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== broker $brokers ($KAFKA_JVM_OPTS), $(java -version 2>&1 | head -1); weir $weir_bin; results in $out"

topic() { "${java_tool[@]}" org.apache.kafka.tools.TopicCommand --bootstrap-server "$brokers" --create \
            --topic "$1" --partitions "$partitions" --replication-factor 1 >/dev/null; }
# ProducerPerformance: its last line is "N records sent, X records/sec (...)".
produce() {
  "${java_tool[@]}" org.apache.kafka.tools.ProducerPerformance --topic "$1" --num-records "$events" \
    --record-size 16 --throughput -1 \
    --producer-props bootstrap.servers="$brokers" acks=all enable.idempotence=true linger.ms=5 batch.size=1048576 \
    | tail -n 1 | tee -a "$out/perf.txt" | sed -E 's/^[0-9]+ records sent, ([0-9.]+) records\/sec.*/\1/'
}
# ConsumerPerformance: a CSV line whose 10th field is records/s while fetching (the
# 6th, over the whole run, also counts the group join and metadata: seconds).
consume() {
  printf 'isolation.level=read_committed\nauto.offset.reset=earliest\n' >"$out/consumer.properties"
  "${java_tool[@]}" org.apache.kafka.tools.ConsumerPerformance --bootstrap-server "$brokers" --topic "$1" \
    --messages "$events" --group "perf-$RANDOM-$1" --consumer.config "$out/consumer.properties" --timeout 60000 \
    | tail -n 1 | tee -a "$out/perf.txt" | awk -F', *' '{print $10}'
}

echo
echo "== weir: the input topic $input ($events records), filled by the first closed-loop run"
json=$out/weir.jsonl
first=1
for m in ${modes//,/ }; do
  for i in ${intervals//,/ }; do
    "$weir_bin" bench --source kafka --sink kafka --brokers "$brokers" --partitions "$partitions" \
      --topic "$input" --events "$events" --mode "$m" --checkpoint-interval-ms "$i" --json "$json"
    if [ "$first" = 1 ]; then
      first=0
      echo
      echo "== the broker's ceiling (Kafka's perf tools), records/s"
      topic ceil-a; topic ceil-b
      p_alone=$(produce ceil-a)
      c_alone=$(consume "$input")
      # Both at once: consume the input topic while producing into ceil-b.
      consume "$input" >"$out/c_both" & cpid=$!
      p_both=$(produce ceil-b)
      wait "$cpid"; c_both=$(cat "$out/c_both")
      printf '{"produce_alone":%s,"consume_alone":%s,"produce_both":%s,"consume_both":%s}\n' \
        "$p_alone" "$c_alone" "$p_both" "$c_both" >"$out/ceiling.json"
      cat "$out/ceiling.json"
      echo
    fi
  done
done
if [ "$flink" = 1 ]; then
  echo
  echo "== Apache Flink with flink-connector-kafka, closed loop over $input"
  fl=$ROOT/bench/peers/flink
  fcp=$("$fl/kafka_classpath.sh")
  fck=$(mktemp -d "${TMPDIR:-/tmp}/weir-flink-kafka.XXXXXX")
  java -Dlog4j2.configurationFile="$fl/log4j2.properties" -cp "$fcp" KafkaPeer \
    --brokers "$brokers" --topic "$input" --partitions "$partitions" --events "$events" --modes "$modes" \
    --intervals "$intervals" --checkpoint-dir "$fck" --json "$out/flink.jsonl" \
    2> >(grep -vE "^[[:space:]]+(at |\.\.\. [0-9]+ more)" >&2)
  rm -rf "$fck"
fi

for m in ${modes//,/ }; do
  for i in ${intervals//,/ }; do
    "$weir_bin" bench --source kafka --sink kafka --brokers "$brokers" --partitions "$partitions" \
      --events "$open_events" --rate "$rate" --mode "$m" --checkpoint-interval-ms "$i" --json "$json"
  done
done

echo
touch "$out/flink.jsonl"
python3 - "$out/ceiling.json" "$json" "$out/flink.jsonl" <<'EOF' | tee "$out/table.txt"
import json, sys
ceil = json.load(open(sys.argv[1]))
rows = [json.loads(l) for l in open(sys.argv[2])]
flink = {(r["mode"], r["checkpoint_interval_ms"]): r for r in map(json.loads, open(sys.argv[3]))}
both = min(ceil["produce_both"], ceil["consume_both"])
print(f"broker ceiling, records/s: produce alone {ceil['produce_alone']:.0f}, consume alone {ceil['consume_alone']:.0f}, "
      f"produce+consume at once {ceil['produce_both']:.0f} / {ceil['consume_both']:.0f} (min {both:.0f})")
print(f"{'mode':<14}{'sink':<21}{'interval':>9}{'load':>14}{'events/s':>11}{'% ceiling':>10}"
      f"{'visible p50':>13}{'p99':>10}{'p99.9':>10}{'platform p99':>13}{'ckpts':>7}{'Flink ev/s':>12}{'weir/Flink':>11}")
for r in rows:
    load = "closed" if r["rate"] is None else f"{r['rate']:.0f}/s"
    pct = f"{100 * r['events_per_sec'] / both:.0f}%" if r["rate"] is None else ""
    v = r["visible_latency_us"]
    p = r.get("platform_us")
    plat = f"{p['p99']/1e3:>11.2f}ms" if p else f"{'':>13}"
    vis = (f"{v['p50']/1e3:>11.1f}ms{v['p99']/1e3:>8.1f}ms{v['p999']/1e3:>8.1f}ms{plat}" if r["rate"] is not None
           else f"{'(closed)':>13}{'':>10}{'':>10}{'':>13}")
    f = flink.get((r["mode"], r["checkpoint_interval_ms"])) if r["rate"] is None else None
    fl = f"{f['events_per_sec']:>12.0f}{r['events_per_sec'] / f['events_per_sec']:>10.1f}x" if f else ""
    print(f"{r['mode']:<14}{r['sink']:<21}{r['checkpoint_interval_ms']:>7}ms{load:>14}{r['events_per_sec']:>11.0f}{pct:>10}"
          f"{vis}{r['checkpoints']['completed']:>7}{fl}")
EOF
