#!/usr/bin/env bash
# Set up everything dbsp needs on a fresh machine, idempotently, then print the python to use.
#
#   bash ci/setup.sh [extras]      # default extras: test
#
# 1. system packages (ci/install-system.sh: liburing-dev for the io_uring backend, fio);
# 2. a virtual environment in .venv (reused when present);
# 3. the binary wheel users get (ci/build-wheel.sh: `pip wheel .` compiles the Cython core, then
#    `auditwheel repair` gives it a manylinux tag), installed with `[extras]`: the tests run
#    against the artifact that ships, and tests/packaging checks it installs with no compiler.
# The last line printed is the path of the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-test}"

bash ci/install-system.sh >&2

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv >&2
fi
PY=.venv/bin/python
"$PY" -m pip install --quiet --upgrade pip >&2
# A clean build every time: stale .so files from an in-place build must not shadow the wheel.
rm -rf build
WHEEL=$(bash ci/build-wheel.sh "$PY" | tail -n 1)
"$PY" -m pip uninstall --quiet --yes dbsp >/dev/null 2>&1 || true
"$PY" -m pip install --quiet "${WHEEL}[${EXTRAS}]" >&2
echo "$PY"
