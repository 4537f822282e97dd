#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS (default 60) each, on nightly,
# from the committed seeds; new inputs go to a scratch corpus under
# ${FUZZ_WORK:-/tmp/weir-fuzz-corpus}, never into fuzz/corpus. Crashes are
# saved under fuzz/artifacts/<target>/. Exits non-zero if any target failed.
# Usage: fuzz/run-all.sh [SECONDS] [TARGET...]
set -uo pipefail
cd "$(dirname "$0")"
seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
work=${FUZZ_WORK:-/tmp/weir-fuzz-corpus}
cargo +nightly fuzz build || exit 1
failed=()
for t in "${targets[@]}"; do
    mkdir -p "$work/$t"
    echo "=== $t (${seconds}s)"
    if ! cargo +nightly fuzz run "$t" "$work/$t" "corpus/$t" -- \
        -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -malloc_limit_mb=64 \
        -print_final_stats=1 >"$work/$t.log" 2>&1; then
        failed+=("$t")
        tail -40 "$work/$t.log"
    fi
    grep -E "^stat::number_of_executed_units|^#[0-9]+ *DONE" "$work/$t.log" | tail -2
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
echo "all ${#targets[@]} targets ran ${seconds}s without a crash"
