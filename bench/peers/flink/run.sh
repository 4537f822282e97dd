#!/usr/bin/env bash
# Runs weir's two benchmark jobs on Apache Flink's local MiniCluster and then
# on weir, and prints both tables and the ratios weir/Flink. See README.md.
#
#   bench/peers/flink/run.sh [--events N] [--open-loop] [--rate R] [--open-seconds S]
#                            [--open-buffer-timeout-ms MS] [--pipelines stateless,keyed]
#                            [--modes none,aligned,unaligned,at-least-once] [--json PATH] [--out DIR]
#                            [--no-weir] [--build-weir] [--weir PATH] [--weir-events N]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
FLINK_VERSION=${FLINK_VERSION:-2.3.0}

events=20000000        # closed loop, per run
open_loop=0            # also an open-loop (fixed-rate) run per mode for latency
rate=200000            # events/s in total, open loop
open_seconds=10        # length of each open-loop run
open_buffer_ms=0       # Flink buffer timeout in the open loop (0: flush every record)
pipelines=stateless,keyed
modes=none,aligned,unaligned,at-least-once
keys=10000
parallelism=2
interval_ms=1000
json=""
out=""
run_weir=1
build_weir=0
weir_bin="$ROOT/target/release/weir"
weir_events=""         # closed-loop events for weir [default: --events]

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --events) events=$2; shift 2 ;;
    --open-loop) open_loop=1; shift ;;
    --rate) rate=$2; open_loop=1; shift 2 ;;
    --open-seconds) open_seconds=$2; shift 2 ;;
    --open-buffer-timeout-ms) open_buffer_ms=$2; shift 2 ;;
    --weir-events) weir_events=$2; shift 2 ;;
    --pipelines) pipelines=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-weir) run_weir=0; shift ;;
    --build-weir) build_weir=1; shift ;;
    --weir) weir_bin=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "unknown argument: $1" >&2; usage 2 ;;
  esac
done
weir_events=${weir_events:-$events}
open_events=$(python3 -c "print(int($rate * $open_seconds))")
out=${out:-$HERE/results/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
ckpt_dir=$(mktemp -d "${TMPDIR:-/tmp}/weir-peer-flink.XXXXXX")
trap 'rm -rf "$ckpt_dir"' EXIT

# 1. Flink from PyPI into a local virtual environment (the wheel ships the jars).
if [ ! -x "$HERE/.venv/bin/python" ]; then
  echo "creating $HERE/.venv"
  python3 -m venv "$HERE/.venv"
fi
if ! "$HERE/.venv/bin/python" -c "import pyflink" 2>/dev/null; then
  echo "installing apache-flink==$FLINK_VERSION (about 400 MB with its dependencies)"
  "$HERE/.venv/bin/pip" install --quiet "apache-flink==$FLINK_VERSION"
fi
pyflink=$("$HERE/.venv/bin/python" -c "import os, pyflink; print(os.path.dirname(pyflink.__file__))")
jars="$pyflink/lib"
ls "$jars"/flink-dist-*.jar >/dev/null 2>&1 || { echo "no flink-dist jar in $jars" >&2; exit 1; }

# 2. Compile the job against those jars (no Maven).
build="$HERE/.build"
if [ ! -e "$build/WeirPeer.class" ] || [ "$HERE/WeirPeer.java" -nt "$build/WeirPeer.class" ]; then
  mkdir -p "$build"
  javac -nowarn -d "$build" -cp "$jars/*" "$HERE/WeirPeer.java" 2>&1 | grep -v '^Note:' || true
  [ -e "$build/WeirPeer.class" ] || { echo "javac failed" >&2; exit 1; }
fi
java_cmd=(java -Dlog4j2.configurationFile="$HERE/log4j2.properties" -cp "$jars/*:$build" WeirPeer
          --pipelines "$pipelines" --modes "$modes" --keys "$keys" --parallelism "$parallelism"
          --checkpoint-interval-ms "$interval_ms" --checkpoint-dir "$ckpt_dir")

echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $(java -version 2>&1 | head -1); results in $out"
echo
echo "== Flink, closed loop: $events events per run"
"${java_cmd[@]}" --events "$events" --json "$out/flink.jsonl" 2> >(grep -vE "^[[:space:]]+(at |\.\.\. [0-9]+ more)" >&2)
if [ "$open_loop" = 1 ]; then
  echo
  echo "== Flink, open loop: $rate events/s for $open_seconds s per run (buffer timeout $open_buffer_ms ms)"
  "${java_cmd[@]}" --events "$open_events" --rate "$rate" --buffer-timeout-ms "$open_buffer_ms" --json "$out/flink.jsonl" 2> >(grep -vE "^[[:space:]]+(at |\.\.\. [0-9]+ more)" >&2)
fi
[ -n "$json" ] && cat "$out/flink.jsonl" >> "$json"

# 3. weir on the same settings.
if [ "$run_weir" = 1 ]; then
  if [ "$build_weir" = 1 ] || [ ! -x "$weir_bin" ]; then
    echo
    echo "== building weir: cargo build --release -p weir-bench"
    if ! (cd "$ROOT" && cargo build --release -p weir-bench); then
      echo "weir did not build; skipping the weir side" >&2
      run_weir=0
    fi
  fi
fi
if [ "$run_weir" = 1 ]; then
  echo
  echo "== weir: $weir_bin (built $(date -u -r "$weir_bin" '+%Y-%m-%d %H:%M UTC'), repository at $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
  header=1
  loops=("closed")
  [ "$open_loop" = 1 ] && loops+=("open")
  for loop in "${loops[@]}"; do
    if [ "$loop" = closed ]; then load=(--events "$weir_events"); else load=(--events "$open_events" --rate "$rate"); fi
    for p in ${pipelines//,/ }; do
      for m in ${modes//,/ }; do
        "$weir_bin" bench --pipeline "$p" --mode "$m" --checkpoint-interval-ms "$interval_ms" "${load[@]}" \
          --keys "$keys" --parallelism "$parallelism" --json "$out/weir.jsonl" | tail -n +$((2 - header))
        header=0
      done
    done
  done
  echo
  python3 "$HERE/side_by_side.py" "$out/flink.jsonl" "$out/weir.jsonl" | tee "$out/side-by-side.txt"
fi
