#!/usr/bin/env bash
# Run the whole test suite on a fresh machine (this is what .ci/run runs).
#
#   bash ci/test.sh                 # set-up + full suite (slow tests included)
#   bash ci/test.sh -m "not slow"   # extra pytest arguments are passed on
#   DBSP_BENCH_GATE=0 bash ci/test.sh   # without the regression gate (ci/bench_quick.sh)
#
# Then, in CI (CI=true) or with DBSP_DEBUG_RUN=1, the native and trace tests run once more
# against a debug build with Cython bounds checking switched on.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash ci/setup.sh test,spark | tail -n 1)   # spark: the Spark tests run, never skip

# The layers of DESIGN.md: imports only go down (import-linter's layers contract in
# pyproject.toml, checked against the installed package).
echo "== import layers (lint-imports) =="
"$(dirname "$PY")/lint-imports" --no-cache pyproject.toml

# Run from a directory that is not the source tree, so `import dbsp` is the installed wheel.
status=0
(cd tests && ../"$PY" -m pytest -p no:cacheprovider --hypothesis-profile=ci "$@" .) || status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
    exit 1
fi
[ "$status" -eq 0 ] || exit "$status"

# The regression gate: a quick subset of bench/, its same-run ratios against bench/baseline.json
# (ci/bench_quick.sh; DBSP_BENCH_GATE=0 skips it).
if [ "${DBSP_BENCH_GATE:-1}" != "0" ]; then
    echo "== regression gate (ci/bench_quick.sh) =="
    bash ci/bench_quick.sh "$PY"
fi

if [ "${CI:-}" = "true" ] || [ "${DBSP_DEBUG_RUN:-}" = "1" ]; then
    echo "== debug build (bounds checks on): native and trace tests =="
    DBG=.venv-debug
    [ -x "$DBG/bin/python" ] || python3 -m venv "$DBG"
    "$DBG/bin/python" -m pip install --quiet --upgrade pip
    rm -rf build
    DBSP_DEBUG=1 "$DBG/bin/python" -m pip install --quiet --no-cache-dir ".[test]"
    (cd tests && ../"$DBG/bin/python" -m pytest -p no:cacheprovider --hypothesis-profile=ci \
        -q native trace)
fi
