# Compare: pytest bench/micro/bench_merge.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""Merge two sorted, consolidated 10M-row u64 runs (20M rows in) with ``dbsp._native.merge``,
against numpy in the same run.

Baseline: ``np.sort(np.concatenate([a, b]), kind="stable")`` (timsort finds the two runs). It
returns sorted keys only; ``merge_consolidate`` returns an int64 row index *and* an int64 weight
per output row and consolidates, so it writes twice the bytes.

Shapes: ``interleaved`` (both runs random in ``[0, 2^62)``) and ``disjoint`` (every key of b above
every key of a: found by galloping, copied in bulk). Also a 4-way merge (4 x 5M rows, loser tree)
with the same numpy baseline on its concatenation. Fixed seeds; native and numpy calls are timed
interleaved (the machine is shared) and the rates and the ratio in ``extra_info`` come from those
interleaved medians (the benchmark's own timings are the native call alone).
Target: >= 250M rows/s per core for two runs (rows = input rows).

Two runs take the AVX-512 kernel where the CPU has it (``merge.simd_enabled()``); the scalar loop
(``merge.set_simd(False)``) is timed interleaved with it in the same run for the speed-up.

``extra_info``: ``rows_per_s``, ``numpy_rows_per_s``, ``ratio_to_numpy``, ``peak_alloc_MB``;
for two runs also ``simd``, ``scalar_rows_per_s`` and ``ratio_to_scalar``.
"""
from __future__ import annotations

import numpy as np
import pytest
from _timing import interleaved, peak_mb
from dbsp._native import merge

N = 10_000_000
ROUNDS = 7


def sorted_distinct(rng, n, lo, hi):
    k = np.sort(rng.integers(lo, hi, n, dtype=np.uint64))
    return k[np.r_[True, k[1:] != k[:-1]]]    # np.unique is ~1.7 us/row on numpy 2.4 here


@pytest.fixture(scope="module", params=["interleaved", "disjoint", "4-way"])
def runs(request):
    rng = np.random.default_rng(7)
    if request.param == "interleaved":
        ks = [sorted_distinct(rng, N, 0, 2 ** 62), sorted_distinct(rng, N, 0, 2 ** 62)]
    elif request.param == "disjoint":
        ks = [sorted_distinct(rng, N, 0, 2 ** 62), sorted_distinct(rng, N, 2 ** 62, 2 ** 63)]
    else:
        ks = [sorted_distinct(rng, N // 2, 0, 2 ** 62) for _ in range(4)]
    return request.param, [(k, None, np.ones(len(k), np.int64)) for k in ks]


def test_merge(benchmark, runs):
    name, rs = runs
    benchmark.group = f"merge-{name}"
    rows = sum(len(r[0]) for r in rs)
    keys = [r[0].view(np.int64) for r in rs]
    fast = lambda: merge.merge_consolidate(rs)
    base = lambda: np.sort(np.concatenate(keys), kind="stable")
    gidx, w = fast()
    out = np.concatenate([r[0] for r in rs])[gidx]
    assert np.all(out[1:] > out[:-1]) and w.sum() == sum(int(r[2].sum()) for r in rs)
    benchmark.pedantic(fast, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    tf, tb = interleaved(fast, base, ROUNDS)
    benchmark.extra_info.update(
        rows_per_s=rows / tf, numpy_rows_per_s=rows / tb,
        ratio_to_numpy=tb / tf, target_rows_per_s=250e6 if len(rs) == 2 else None,
        peak_alloc_MB=peak_mb(fast), numpy_peak_alloc_MB=peak_mb(base))
    if len(rs) == 2:
        def scalar():
            prev = merge.set_simd(False)
            try:
                return merge.merge_consolidate(rs)
            finally:
                merge.set_simd(prev)
        g2, w2 = scalar()
        assert np.array_equal(g2, gidx) and np.array_equal(w2, w)
        tf2, ts = interleaved(fast, scalar, ROUNDS)
        benchmark.extra_info.update(simd=merge.simd_enabled(), scalar_rows_per_s=rows / ts,
                                    ratio_to_scalar=ts / tf2)
