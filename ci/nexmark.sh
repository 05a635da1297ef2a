#!/usr/bin/env bash
# The main job on a fresh machine: set up, then run Nexmark q0–q8 on the embedded runtime with
# two workers and verify every query's result against DuckDB computing it from scratch.
#
#   bash ci/nexmark.sh                       # 1M events, about a minute
#   bash ci/nexmark.sh --events 10000000     # other arguments are passed to `dbsp nexmark`
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash ci/setup.sh test | tail -n 1)
BIN="$(dirname "$PY")/dbsp"
exec "$BIN" nexmark --events 1000000 --queries q0,q1,q2,q3,q4,q5,q6,q7,q8 --workers 2 --verify "$@"
