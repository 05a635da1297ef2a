# Compare: pytest bench/micro/bench_search.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""``lower_bound`` of 1M probes into 10M sorted u64 codes with ``dbsp._native.search``, against
``np.searchsorted`` in the same run: sorted probes (galloping from the previous answer) and
unsorted probes (branchless binary search). Also ``intersect`` of 1M distinct codes with 10M
(galloping through the long side) against ``np.intersect1d(assume_unique=True,
return_indices=True)``, and ``group_bounds`` of 10M sorted codes with ten rows per code against
a numpy neighbour mask.

Fixed seeds; native and numpy calls are timed interleaved (the machine is shared) and the ratio
and the rates in ``extra_info`` are of their medians (the benchmark's own timings are the
native call alone). ``extra_info``: ``probes_per_s`` / ``rows_per_s``, the numpy figure and
``ratio_to_numpy``.
"""
from __future__ import annotations

import numpy as np
import pytest
from _timing import interleaved
from dbsp._native import search

N = 10_000_000
M = 1_000_000
ROUNDS = 7




@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1234)
    s = np.sort(rng.integers(0, 2 ** 62, N, dtype=np.uint64))
    p = rng.integers(0, 2 ** 62, M, dtype=np.uint64)
    return s, p


@pytest.mark.parametrize("order", ["sorted", "random"])
def test_lower_bound(benchmark, data, order):
    s, p = data
    if order == "sorted":
        p = np.sort(p)
    benchmark.group = f"lower_bound-1M-into-10M-{order}"
    fast = lambda: search.lower_bound(s, p)
    base = lambda: np.searchsorted(s, p, side="left")
    np.testing.assert_array_equal(fast(), base())
    benchmark.pedantic(fast, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    tf, tb = interleaved(fast, base, ROUNDS)
    benchmark.extra_info.update(probes_per_s=M / tf,
                                numpy_probes_per_s=M / tb, ratio_to_numpy=tb / tf)


def test_intersect(benchmark, data):
    s, p = data
    a = s[np.r_[True, s[1:] != s[:-1]]]
    b = np.sort(np.concatenate([a[::20], p[: M // 2]]))
    b = b[np.r_[True, b[1:] != b[:-1]]]
    benchmark.group = "intersect-1M-with-10M"
    fast = lambda: search.intersect(a, b)
    base = lambda: np.intersect1d(a, b, assume_unique=True, return_indices=True)[1:]
    got, expect = fast(), base()
    assert all(np.array_equal(x, y) for x, y in zip(got, expect))
    benchmark.pedantic(fast, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    tf, tb = interleaved(fast, base, rounds=3)
    benchmark.extra_info.update(rows_per_s=(len(a) + len(b)) / tf,
                                numpy_rows_per_s=(len(a) + len(b)) / tb, ratio_to_numpy=tb / tf)


def test_group_bounds(benchmark):
    rng = np.random.default_rng(4321)
    k = np.sort(rng.integers(0, N // 10, N, dtype=np.uint64))
    benchmark.group = "group_bounds-10M"
    fast = lambda: search.group_bounds(k)
    base = lambda: np.r_[np.flatnonzero(np.r_[True, k[1:] != k[:-1]]), len(k)]
    np.testing.assert_array_equal(fast(), base())
    benchmark.pedantic(fast, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    tf, tb = interleaved(fast, base, ROUNDS)
    benchmark.extra_info.update(rows_per_s=N / tf, numpy_rows_per_s=N / tb, ratio_to_numpy=tb / tf)
