#!/usr/bin/env bash
# The soak (issue 17 part 5; not part of CI): `weir run` is killed with
# SIGKILL at random instants, 5-15 times per run, then run to completion,
# over every checkpoint mode and sink (files, and Kafka through a broker the test starts), for SECONDS (default 1800); each
# run's committed output is checked exactly (exactly-once modes: every
# key's counts 1..n once each, sums consistent; at-least-once and none: no
# count missing). Prints a table of runs, kills, checkpoints and duplicate
# lines per mode and sink; the first failure stops it, naming the seed that
# replays it (WEIR_SOAK_SEED=<seed> bench/soak.sh 0).
# Usage: bench/soak.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
export WEIR_SOAK_SECONDS=${1:-1800}
exec cargo test --release --test crash soak -- --ignored --nocapture
