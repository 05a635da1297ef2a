#!/usr/bin/env bash
# System packages the build and the storage benchmarks need (Debian/Ubuntu).
#
#   liburing-dev  headers + static liburing.a for the Cython io_uring backend
#                 (src/_native/uring.pyx; setup.py skips that extension without it)
#   fio           reference numbers beside bench/micro/bench_block_io.py
#   openjdk-17-jre-headless  only where no `java` is on PATH: pyspark's JVM (tests/spark)
#
# Idempotent and non-interactive: does nothing when every package is present, runs apt-get
# only as root (or through sudo when available), never prompts.
set -euo pipefail

PACKAGES=(liburing-dev fio)
# the Spark tests (tests/spark) need a Java runtime for pyspark's JVM: one where none is found
if ! command -v java >/dev/null 2>&1; then
    PACKAGES+=(openjdk-17-jre-headless)
fi

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-system: all present (${PACKAGES[*]})"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system: no apt-get; please install: ${missing[*]}" >&2
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "install-system: not root and no passwordless sudo; please install: ${missing[*]}" >&2
        exit 0
    fi
fi

export DEBIAN_FRONTEND=noninteractive
echo "install-system: installing ${missing[*]}"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
