#!/usr/bin/env bash
# A single-node Apache Kafka broker (KRaft, broker and controller in one JVM) on
# 127.0.0.1, for weir's Kafka tests and for trying the Kafka source by hand.
# See README.md beside this script.
#
#   bench/peers/kafka/kafka.sh install | start | stop | status | clean | tools | tools-classpath
#
# tools: also fetch Kafka's command-line tools (ProducerPerformance,
# ConsumerPerformance: compare.sh's broker ceiling; EndToEndLatency: weir compare
# --kafka's broker floor) into $KAFKA_TOOLS_JARS. tools-classpath: the same, then
# prints the tools' Java class path.
#
# Environment (all optional):
#   KAFKA_DIR              state folder: config, data, broker.log, pid  [<repo>/target/kafka]
#   KAFKA_PORT             the client listener's port                    [9092]
#   KAFKA_CONTROLLER_PORT  the controller listener's port                [KAFKA_PORT + 1]
#   KAFKA_VERSION          org.apache.kafka:kafka_2.13 version           [4.1.0]
#   KAFKA_JARS             where install puts the jars (a cache kept across clones)
#                          [${XDG_CACHE_HOME:-~/.cache}/weir/kafka-$KAFKA_VERSION]
#   KAFKA_TOOLS_JARS       where tools puts the tools' jars  [${XDG_CACHE_HOME:-~/.cache}/weir/kafka-tools-$KAFKA_VERSION]
#   KAFKA_HEAP             the broker's -Xmx                              [512m]
#   KAFKA_START_TIMEOUT    seconds start waits for the broker             [120]
#   KAFKA_JVM_OPTS         the broker's JIT and GC flags  [-XX:+UseSerialGC -XX:TieredStopAtLevel=1]
#                          (a test broker; benchmarks give "-XX:+UseG1GC": the full JIT)
#   KAFKA_WATCH_PID        stop the broker when this process exits (a test run)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
KAFKA_VERSION=${KAFKA_VERSION:-4.1.0}
KAFKA_DIR=${KAFKA_DIR:-$ROOT/target/kafka}
KAFKA_PORT=${KAFKA_PORT:-9092}
KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}
KAFKA_JARS=${KAFKA_JARS:-${XDG_CACHE_HOME:-$HOME/.cache}/weir/kafka-$KAFKA_VERSION}
KAFKA_TOOLS_JARS=${KAFKA_TOOLS_JARS:-${XDG_CACHE_HOME:-$HOME/.cache}/weir/kafka-tools-$KAFKA_VERSION}
KAFKA_HEAP=${KAFKA_HEAP:-512m}
KAFKA_START_TIMEOUT=${KAFKA_START_TIMEOUT:-120}

PID_FILE=$KAFKA_DIR/broker.pid
LOG=$KAFKA_DIR/broker.log
CONFIG=$KAFKA_DIR/server.properties

say() { echo "kafka.sh: $*" >&2; }
die() { say "$*"; exit 1; }

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

# Java 17+ and Maven, from Debian's packages when missing and this user may
# install them (root, or password-less sudo); otherwise a message naming them.
prerequisites() {
    if command -v java >/dev/null && command -v mvn >/dev/null; then
        return 0
    fi
    local as_root=()
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
            as_root=(sudo -n)
        else
            die "java or mvn not found, and no root to install them: install a JDK 17+ and Maven"
        fi
    fi
    command -v apt-get >/dev/null || die "java or mvn not found, and no apt-get: install a JDK 17+ and Maven"
    say "installing Debian's default-jdk-headless and maven (once)"
    "${as_root[@]}" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq default-jdk-headless maven >&2
}

# The jars of kafka_2.13 and a logging backend, copied from Maven Central (through
# the local Maven repository, ~/.m2) into $KAFKA_JARS once; later calls find the
# stamp and return at once.
install() {
    if [ -f "$KAFKA_JARS/.installed" ]; then
        return 0
    fi
    prerequisites
    say "installing Kafka $KAFKA_VERSION jars into $KAFKA_JARS"
    local tmp="$KAFKA_JARS.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    if ! mvn -q -B -f "$HERE/pom.xml" -Dkafka.version="$KAFKA_VERSION" \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" >&2; then
        rm -rf "$tmp"
        die "mvn could not fetch org.apache.kafka:kafka_2.13:$KAFKA_VERSION; try another KAFKA_VERSION (4.0.0, 4.1.0)"
    fi
    ls "$tmp"/kafka_2.13-*.jar >/dev/null 2>&1 || die "no kafka_2.13 jar in $tmp after mvn"
    touch "$tmp/.installed"
    rm -rf "$KAFKA_JARS"
    mkdir -p "$(dirname "$KAFKA_JARS")"
    mv "$tmp" "$KAFKA_JARS"
    say "installed $(ls "$KAFKA_JARS" | wc -l) jars ($(du -sh "$KAFKA_JARS" | cut -f1))"
}

# The tools' jars (a folder of their own: the broker's folder is in use by running
# brokers and never rewritten), once.
tools() {
    if [ -f "$KAFKA_TOOLS_JARS/.installed" ]; then
        return 0
    fi
    prerequisites
    say "installing Kafka $KAFKA_VERSION tools jars into $KAFKA_TOOLS_JARS"
    local tmp="$KAFKA_TOOLS_JARS.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    if ! mvn -q -B -f "$HERE/tools-pom.xml" -Dkafka.version="$KAFKA_VERSION" \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" >&2; then
        rm -rf "$tmp"
        die "mvn could not fetch org.apache.kafka:kafka-tools:$KAFKA_VERSION"
    fi
    touch "$tmp/.installed"
    rm -rf "$KAFKA_TOOLS_JARS"
    mkdir -p "$(dirname "$KAFKA_TOOLS_JARS")"
    mv "$tmp" "$KAFKA_TOOLS_JARS"
}

# The broker's pid, if it runs.
running_pid() {
    [ -f "$PID_FILE" ] || return 1
    local pid
    pid=$(cat "$PID_FILE")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

# A small heap, the serial collector and the client compiler only: a test broker
# that starts fast and leaves the cores to the jobs under test.
read -r -a JVM_OPTS <<<"${KAFKA_JVM_OPTS:--XX:+UseSerialGC -XX:TieredStopAtLevel=1}"
JAVA_CMD=(java -Xms128m -Xmx"$KAFKA_HEAP" "${JVM_OPTS[@]}" -Djava.awt.headless=true
    -Dlog4j2.configurationFile="$HERE/log4j2.properties" -cp "$KAFKA_JARS/*")

write_config() {
    cat >"$CONFIG" <<EOF
# Written by kafka.sh start; regenerated at every start.
process.roles=broker,controller
node.id=1
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$KAFKA_DIR/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
# One node: every internal topic has one replica (and few partitions, so that the
# first consumer group or transaction does not wait for 50 partitions to appear).
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# Small segments, little retained data: a test broker. Retention by size only
# (256 MiB a partition): the tests write records stamped in 1970, which a time
# limit deletes at the next retention check (every 5 minutes), so that a test
# reading its topic later found it empty ("No offset to automatically reset to").
log.segment.bytes=16777216
log.retention.ms=-1
log.retention.bytes=268435456
auto.create.topics.enable=false
EOF
}

# Formats $KAFKA_DIR/data once: a random cluster id, this node as the only
# (standalone) controller. The controller's endpoint is part of the formatted
# data, so a later start on other ports is refused.
format() {
    local ports="$KAFKA_PORT $KAFKA_CONTROLLER_PORT"
    if [ -f "$KAFKA_DIR/data/meta.properties" ]; then
        local had
        had=$(cat "$KAFKA_DIR/ports" 2>/dev/null || echo "?")
        [ "$had" = "$ports" ] || die "$KAFKA_DIR was formatted for ports $had, not $ports: run 'kafka.sh clean' first, or use another KAFKA_DIR"
        return 0
    fi
    # A Kafka Uuid: 16 random bytes in URL-safe base64 without padding. It may
    # start with '-', so it is passed as --cluster-id=ID (as "-t ID" the
    # argument parser takes it for an option: one start in 64 failed so).
    local cluster_id
    cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    "${JAVA_CMD[@]}" kafka.tools.StorageTool format --standalone --cluster-id="$cluster_id" -c "$CONFIG" >>"$LOG" 2>&1 \
        || { tail -n 30 "$LOG" >&2; die "formatting $KAFKA_DIR/data failed (log: $LOG)"; }
    echo "$ports" >"$KAFKA_DIR/ports"
}

port_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

start() {
    install
    mkdir -p "$KAFKA_DIR"
    if pid=$(running_pid); then
        say "already running (pid $pid, port $(cut -d' ' -f1 "$KAFKA_DIR/ports"))"
        return 0
    fi
    port_free "$KAFKA_PORT" || die "port $KAFKA_PORT is in use: set KAFKA_PORT"
    port_free "$KAFKA_CONTROLLER_PORT" || die "port $KAFKA_CONTROLLER_PORT is in use: set KAFKA_CONTROLLER_PORT"
    local t0=$SECONDS
    : >"$LOG"
    write_config
    format
    # setsid and no inherited descriptors: the broker outlives this script
    # without holding its caller's pipes open.
    setsid "${JAVA_CMD[@]}" kafka.Kafka "$CONFIG" </dev/null >>"$LOG" 2>&1 &
    local pid=$!
    echo "$pid" >"$PID_FILE"
    local deadline=$((SECONDS + KAFKA_START_TIMEOUT))
    until grep -q "Kafka Server started" "$LOG"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 40 "$LOG" >&2
            rm -f "$PID_FILE"
            die "the broker exited while starting (log: $LOG)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 40 "$LOG" >&2
            stop
            die "the broker did not start within ${KAFKA_START_TIMEOUT}s (log: $LOG)"
        fi
        sleep 0.2
    done
    if [ -n "${KAFKA_WATCH_PID:-}" ]; then
        # Stops the broker when the watched process (a test binary) exits,
        # however it exits.
        setsid bash -c 'while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done
                        kill -TERM "$2" 2>/dev/null
                        for _ in $(seq 1 300); do kill -0 "$2" 2>/dev/null || exit 0; sleep 0.1; done
                        kill -KILL "$2" 2>/dev/null' watch "$KAFKA_WATCH_PID" "$pid" </dev/null >/dev/null 2>&1 &
    fi
    say "started on 127.0.0.1:$KAFKA_PORT in $((SECONDS - t0))s (pid $pid, log $LOG)"
}

stop() {
    local pid
    if ! pid=$(running_pid); then
        rm -f "$PID_FILE"
        say "not running"
        return 0
    fi
    kill -TERM "$pid"
    # A clean shutdown takes a few seconds; give it 30 before SIGKILL.
    for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "the broker did not stop within 30 s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PID_FILE"
    say "stopped (pid $pid)"
}

status() {
    local pid
    if pid=$(running_pid); then
        echo "running: pid $pid, 127.0.0.1:$(cut -d' ' -f1 "$KAFKA_DIR/ports"), $KAFKA_DIR"
    else
        echo "stopped ($KAFKA_DIR)"
        return 3
    fi
}

clean() {
    stop
    rm -rf "$KAFKA_DIR"
    say "removed $KAFKA_DIR"
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    clean) clean ;;
    tools) tools ;;
    tools-classpath) tools; echo "$KAFKA_TOOLS_JARS/*" ;;
    -h | --help | help) usage 0 ;;
    *) usage 2 ;;
esac
