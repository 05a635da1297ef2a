"""Timing helpers shared by the micro benchmarks."""
from __future__ import annotations

import statistics
import time
import tracemalloc


def interleaved(fast, base, rounds: int = 7) -> tuple[float, float]:
    """Medians of alternating calls (a shared machine drifts; alternating keeps them fair)."""
    tf, tb = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        fast()
        tf.append(time.perf_counter() - t)
        t = time.perf_counter()
        base()
        tb.append(time.perf_counter() - t)
    return statistics.median(tf), statistics.median(tb)


def peak_mb(fn) -> float:
    """Peak memory traced by tracemalloc (numpy allocations included) while ``fn`` runs."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2 ** 20
    finally:
        tracemalloc.stop()
