# Compare: pytest bench/micro/bench_consolidate.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""Sort + consolidate 10M unsorted (u64 code, int64 weight) rows: ``dbsp._native.sort``
against the numpy baseline, in the same run.

Baseline: ``np.argsort(codes, kind="stable")``, a neighbour mask, ``np.add.reduceat`` of the
weights and the zero-sum mask -- the same result as ``sort_consolidate``.

Keys: random in ``[0, 2^62)`` (all distinct in practice: every radix digit varies) and in
``[0, 1M)`` (ten rows per key, 20 significant bits). Weights: 1 or 2. Fixed seeds.
The machine's 2 cores are shared, so the native and numpy calls are timed *interleaved* and
the rates and the ratio in ``extra_info`` come from those
interleaved medians (the benchmark's own timings are the native call alone).
Target: >= 50M rows/s on one core.

``extra_info``: ``rows_per_s`` (native median), ``numpy_rows_per_s``, ``ratio_to_numpy``,
``peak_alloc_MB`` / ``numpy_peak_alloc_MB`` (numpy allocations traced by tracemalloc).
Also the u64 ``argsort`` alone against ``np.argsort(kind="stable")``.
"""
from __future__ import annotations

import numpy as np
import pytest
from _timing import interleaved, peak_mb
from dbsp._native import sort

N = 10_000_000
ROUNDS = 5


def numpy_consolidate(k: np.ndarray, w: np.ndarray):
    perm = np.argsort(k, kind="stable")
    s = k[perm]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    sums = np.add.reduceat(w[perm], starts)
    keep = sums != 0
    return perm[starts][keep], sums[keep]






@pytest.fixture(scope="module", params=["wide", "narrow"])
def rows(request):
    rng = np.random.default_rng(20240601)
    high = 2 ** 62 if request.param == "wide" else 1_000_000
    k = rng.integers(0, high, N, dtype=np.uint64)
    w = rng.integers(1, 3, N, dtype=np.int64)
    return request.param, k, w


def test_sort_consolidate(benchmark, rows):
    name, k, w = rows
    benchmark.group = f"consolidate-10M-{name}"
    fast = lambda: sort.sort_consolidate(k, None, w)
    base = lambda: numpy_consolidate(k, w)
    got, expect = fast(), base()
    assert all(np.array_equal(a, b) for a, b in zip(got, expect))
    benchmark.pedantic(fast, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    tf, tb = interleaved(fast, base, ROUNDS)
    benchmark.extra_info.update(
        rows_per_s=N / tf, numpy_rows_per_s=N / tb,
        ratio_to_numpy=tb / tf, target_rows_per_s=50e6,
        peak_alloc_MB=peak_mb(fast), numpy_peak_alloc_MB=peak_mb(base))


def test_argsort(benchmark, rows):
    name, k, _ = rows
    benchmark.group = f"argsort-10M-{name}"
    fast = lambda: sort.argsort(k)
    base = lambda: np.argsort(k, kind="stable")
    benchmark.pedantic(fast, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    tf, tb = interleaved(fast, base, ROUNDS)
    benchmark.extra_info.update(
        rows_per_s=N / tf, numpy_rows_per_s=N / tb,
        ratio_to_numpy=tb / tf, peak_alloc_MB=peak_mb(fast), numpy_peak_alloc_MB=peak_mb(base))
