# Compare: pytest bench/operators/bench_fixed_cost.py --benchmark-only -s
#          (before/after a change: run it once per checkout, e.g. PYTHONPATH=<other>/src)
"""The fixed cost of a step: an empty step and a 100-row step of the join + per-category average
circuit (:mod:`_workload`), 1 worker, after 20 steps of the workload (200K bids, 20K auctions of
history). Targets: <= 100 us (empty) and <= 300 us (100 bids) a step.

Timed per step: ``c.step()`` and reading the change (``out.delta()``); the 100 bids are pushed
untimed before each round. ``extra_info``: ``median_us`` (wall), ``cpu_us`` (median CPU time of
the stepping thread: on a loaded machine the wall clock also counts the time other processes
held the core), ``process_cpu_us`` (the whole process's CPU time over the timed rounds divided by
the rounds, ``getrusage(RUSAGE_SELF)`` user + sys: it counts the background merge thread, so the
merges a step owes are in it and not in ``cpu_us``), and ``calls_per_step``: the Python and C function calls of one step
(``sys.setprofile``), the figure that explains where a fixed cost comes from.
"""
from __future__ import annotations

import resource
import statistics
import sys
import time

import numpy as np
import pyarrow as pa
import pytest

import dbsp
from _workload import BIDS, with_history

WARM_STEPS, ROUNDS = 20, 1000


def process_cpu() -> float:
    """User + system CPU seconds of this process so far (every thread)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _bids(rng, n: int, auctions: int) -> pa.RecordBatch:
    return pa.record_batch([rng.integers(0, auctions, n).astype(np.int64),
                            rng.integers(1, 10_000, n).astype(np.int64)], schema=BIDS)


def calls_per_step(c, out, feed, steps: int = 50) -> float:
    """Function calls (Python and C) of one step, averaged over ``steps``."""
    n = [0]

    def prof(frame, event, arg):
        if event == "call" or event == "c_call":
            n[0] += 1

    for i in range(steps):
        feed(i)
        sys.setprofile(prof)
        c.step()
        out.delta()
        sys.setprofile(None)
    return n[0] / steps


@pytest.mark.parametrize("rows", [0, 100])
def test_fixed_cost(benchmark, rows):
    benchmark.group = "fixed-cost-join-avg"
    rng = np.random.default_rng(7)
    batches = [_bids(rng, rows, 20_000) for _ in range(64)] if rows else []
    with dbsp.Circuit(workers=1) as c:
        auctions, bids, out = with_history(c, steps=WARM_STEPS)

        def feed(i: int) -> None:
            if rows:
                bids.push(batches[i % len(batches)])

        for i in range(100):  # warm: caches, spine merges of the history settle
            feed(i)
            c.step()
            out.delta()
        calls = calls_per_step(c, out, feed)
        cpu: list = []
        k = [0]

        def setup():
            feed(k[0])
            k[0] += 1
            return (), {}

        def one_step():
            t0 = time.thread_time()
            c.step()
            out.delta()
            cpu.append(time.thread_time() - t0)

        p0 = process_cpu()
        benchmark.pedantic(one_step, setup=setup, rounds=ROUNDS, iterations=1, warmup_rounds=0)
        # over the rounds: the merges the timed steps owe run beside them (or in them)
        proc_us = (process_cpu() - p0) / ROUNDS * 1e6
    benchmark.extra_info.update({
        "rows": rows, "calls_per_step": calls,
        "median_us": benchmark.stats.stats.median * 1e6,
        "cpu_us": statistics.median(cpu) * 1e6,
        "process_cpu_us": proc_us,
        "target_us": 100 if rows == 0 else 300})
    print(f"\nfixed cost, {rows}-row step: median {benchmark.stats.stats.median * 1e6:.0f} us "
          f"wall, {statistics.median(cpu) * 1e6:.0f} us CPU (stepping thread), {proc_us:.0f} us "
          f"CPU a step (whole process), {calls:.0f} calls a step")
