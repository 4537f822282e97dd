#!/usr/bin/env bash
# Prints the Java class path of bench/peers/flink/KafkaPeer.java (Apache Flink's Kafka
# job beside weir's), building what it needs on first use: a Python venv with the
# apache-flink wheel (its jars are Flink's, as bench/peers/flink/run.sh uses them),
# flink-connector-kafka and its dependencies from Maven (kafka-pom.xml), and the
# compiled class (again when KafkaPeer.java is newer). Progress goes to stderr.
#
#   cp=$(bench/peers/flink/kafka_classpath.sh)
#   java -cp "$cp" KafkaPeer ...
set -euo pipefail
fl=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if ! "$fl/.venv/bin/python" -c "import pyflink" 2>/dev/null; then
  echo "kafka_classpath.sh: installing apache-flink ${FLINK_VERSION:-2.3.0} into $fl/.venv" >&2
  python3 -m venv "$fl/.venv"
  "$fl/.venv/bin/pip" install --quiet "apache-flink==${FLINK_VERSION:-2.3.0}" >&2
fi
flib=$("$fl/.venv/bin/python" -c "import os, pyflink; print(os.path.dirname(pyflink.__file__))")/lib
if [ ! -d "$fl/.kafka-jars" ]; then
  echo "kafka_classpath.sh: fetching flink-connector-kafka (kafka-pom.xml)" >&2
  mvn -q -B -f "$fl/kafka-pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$fl/.kafka-jars.tmp" >&2 && mv "$fl/.kafka-jars.tmp" "$fl/.kafka-jars"
fi
mkdir -p "$fl/.build"
if [ ! -e "$fl/.build/KafkaPeer.class" ] || [ "$fl/KafkaPeer.java" -nt "$fl/.build/KafkaPeer.class" ]; then
  javac -nowarn -d "$fl/.build" -cp "$flib/*:$fl/.kafka-jars/*" "$fl/KafkaPeer.java" 2>&1 | grep -v '^Note:' >&2 || true
  [ -e "$fl/.build/KafkaPeer.class" ] || { echo "kafka_classpath.sh: KafkaPeer.java did not compile" >&2; exit 1; }
fi
echo "$flib/*:$fl/.kafka-jars/*:$fl/.build"
