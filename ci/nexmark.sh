#!/usr/bin/env bash
# The main job on a fresh machine: set up, then run the whole Nexmark suite q0–q22 on the embedded
# runtime with 1 and then 2 workers, timing each query end to end (generator in processes of its own)
# and push + step, and verify every query's result against DuckDB computing it from scratch.
#
#   bash ci/nexmark.sh                       # 200K events, 1 min 54 s measured on 2 busy vCPUs (load 8)
#   bash ci/nexmark.sh --events 1000000      # other arguments are passed to `dbsp nexmark`
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash ci/setup.sh test | tail -n 1)
BIN="$(dirname "$PY")/dbsp"
exec "$BIN" nexmark --events 200000 --queries q0,q1,q2,q3,q4,q5,q6,q7,q8,q9,q10,q11,q12,q13,q14,q15,q16,q17,q18,q19,q20,q21,q22 \
    --workers 1,2 --verify "$@"
