# Compare runs:  pytest bench/workloads/bench_nexmark.py --benchmark-only --benchmark-autosave
#                pytest-benchmark compare 0001 0002 --group-by=name
# Size: DBSP_BENCH_EVENTS (default 10,000,000), workers: DBSP_BENCH_WORKERS (default 2).
"""Nexmark q0–q8 on the embedded runtime, one benchmark per query.

Each query runs through the same code path as ``dbsp nexmark`` (a forked process per query,
generation outside the clock). ``extra_info`` holds events/s, peak RSS and, for q0–q4, the
ratio to the published Rust DBSP per-core figure.
"""
from __future__ import annotations

import argparse
import os

import pytest

from dbsp.nexmark.cli import RUST_DBSP_PER_CORE, add_arguments

EVENTS = int(os.environ.get("DBSP_BENCH_EVENTS", 10_000_000))
WORKERS = int(os.environ.get("DBSP_BENCH_WORKERS", 2))
QUERIES = ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8"]


def _run_one(query: str) -> dict:
    import multiprocessing as mp

    from dbsp.nexmark import cli
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--events", str(EVENTS), "--workers", str(WORKERS), "--queries", query,
                         "--no-progress"])
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=cli._run_query, args=(query, args, None, child))
    proc.start()
    child.close()
    res = parent.recv()
    proc.join()
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
    cores = min(WORKERS, os.cpu_count() or 1)
    benchmark.extra_info.update({
        "events": r["events"], "workers": WORKERS, "seconds_in_steps": r["seconds"],
        "events_per_s": r["events_per_s"], "peak_rss_mb": r["peak_rss_mb"],
    })
    if query in RUST_DBSP_PER_CORE:
        benchmark.extra_info["ratio_to_rust_dbsp_per_core"] = (
            r["events_per_s"] / cores / RUST_DBSP_PER_CORE[query])
