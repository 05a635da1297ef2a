# Compare runs:  pytest bench/workloads/bench_nexmark.py --benchmark-only --benchmark-autosave
#                pytest-benchmark compare 0001 0002 --group-by=name
# Size: DBSP_BENCH_EVENTS (default 200,000: small, so the whole suite q0-q22 runs in the bench
# suite), workers: DBSP_BENCH_WORKERS (default 1). For the published-size figures use
# `dbsp nexmark --events 10000000 --workers 1,2 --json FILE`.
"""Nexmark q0–q22 (and q14_rows, q14's user function called per row) on the embedded runtime,
one benchmark per query.

Each query runs through the same code path as ``dbsp nexmark`` (a process of its own from the
fork server, the generator on its own thread). The benchmark's time is the end-to-end run;
``extra_info`` holds both rates (end to end, push + step), peak RSS and, for q0–q4, the ratio of
the per-core end-to-end rate to the published Rust DBSP per-core figure.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import pytest

from dbsp.nexmark.cli import RUST_DBSP_PER_CORE, add_arguments, run_one
from dbsp.nexmark.queries import QUERIES as _QUERIES
from dbsp.nexmark.queries import VARIANTS

EVENTS = int(os.environ.get("DBSP_BENCH_EVENTS", 200_000))
WORKERS = int(os.environ.get("DBSP_BENCH_WORKERS", 1))
QUERIES = list(_QUERIES) + list(VARIANTS)


def _run_one(query: str) -> dict:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--events", str(EVENTS), "--queries", query, "--no-progress",
                         "--chunk", str(min(100_000, EVENTS))])
    with tempfile.TemporaryDirectory(prefix="dbsp-bench-nexmark-") as d:
        res = run_one(query, WORKERS, args, d)
    if "error" in res:
        raise RuntimeError(res["error"] + "\n" + res.get("traceback", ""))
    return res


@pytest.mark.parametrize("query", QUERIES)
def test_nexmark(benchmark, query):
    results: list[dict] = []

    def run():
        results.append(_run_one(query))

    benchmark.pedantic(run, rounds=1, iterations=1)
    r = results[-1]
    benchmark.extra_info.update({
        "events": r["events"], "workers": WORKERS,
        "e2e_seconds": r["e2e_seconds"], "e2e_events_per_s": r["e2e_events_per_s"],
        "push_step_seconds": r["push_step_seconds"],
        "push_step_events_per_s": r["push_step_events_per_s"],
        "peak_rss_mb": r["peak_rss_mb"],
    })
    if query in RUST_DBSP_PER_CORE:
        benchmark.extra_info["ratio_to_rust_dbsp_per_core"] = (
            r["e2e_events_per_s"] / WORKERS / RUST_DBSP_PER_CORE[query])
