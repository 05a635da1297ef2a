#!/usr/bin/env bash
# The regression gate: a quick subset of bench/ (a few minutes), then ci/bench_gate.py compares
# the ratios each benchmark measured in this run (against numpy, or the step at 10x the history
# against the step at 1x) with bench/baseline.json. Absolute times are recorded in the JSON
# (--benchmark-json), never gated. Run by ci/test.sh after the test suite (DBSP_BENCH_GATE=0
# skips it).
#
#   bash ci/bench_quick.sh [python]      # default: .venv/bin/python
#   python ci/bench_gate.py results/bench-quick.json --update    # re-baseline, on purpose
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
OUT="${DBSP_BENCH_JSON:-results/bench-quick.json}"
mkdir -p "$(dirname "$OUT")"
F="bench/operators/bench_flatness.py::test_step_time_flat_in_history"
# Flatness at a small history (20K vs 200K rows) so it takes seconds: it still catches a step
# that re-reads its history (a scan of the offsets of every probed batch made distinct 13x slower
# at 10x the history).
# Parallel efficiency, one row (the processes runtime on the keyed count at 10K events a step:
# the driver's placement and the messages between processes), 20 steps a run: only a gross
# regression is caught, the ratio's rounds spread by 15-25% on this shared machine.
E="bench/workloads/bench_efficiency.py::test_parallel_efficiency"
DBSP_BENCH_EFF_STEPS="${DBSP_BENCH_EFF_STEPS:-20}" \
DBSP_BENCH_HISTORY="${DBSP_BENCH_HISTORY:-20000}" "$PY" -m pytest -q -p no:cacheprovider \
    --benchmark-only --benchmark-json="$OUT" --benchmark-timer=time.thread_time \
    "bench/micro/bench_search.py::test_lower_bound[sorted]" \
    bench/micro/bench_search.py::test_intersect bench/micro/bench_search.py::test_group_bounds \
    bench/micro/bench_hashing.py::test_hash_u64 \
    "bench/micro/bench_consolidate.py::test_sort_consolidate[narrow]" \
    "$F[min_max]" "$F[count_distinct]" "$F[topk]" "$F[distinct]" "$F[join]" "$F[left_join]" \
    "$E[processes-keyed_count-10000]"
"$PY" ci/bench_gate.py "$OUT"
