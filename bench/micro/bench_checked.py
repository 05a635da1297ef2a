# Compare: pytest bench/micro/bench_checked.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""What bad-data safety costs on the fast path: checked arithmetic and atomic steps.

* ``checked_sum``: ``Σ x·w`` per group over 100K rows in 1,000 groups
  (:func:`dbsp.algebra.checked.weighted_group_sums`) against the unchecked numpy
  ``np.add.reduceat(x * w, starts)``, interleaved.
* ``atomic_step``: one step of ``input -> index_by(k) -> sum, count`` with 100K rows into a
  state of 1M rows, the replica journalled (``atomic=True``: what every circuit runs) against the
  same replica not journalled, interleaved; the rollback itself is timed too.

``extra_info``: ``ratio`` (checked / unchecked, or atomic / plain), and the medians in us.
Fixed seeds; the machine's cores are shared, so only the interleaved ratios mean anything.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import pyarrow as pa
from _timing import interleaved

import dbsp
from dbsp.algebra.checked import weighted_group_sums

N = 100_000


def test_checked_sum(benchmark):
    rng = np.random.default_rng(1)
    x = rng.integers(-10 ** 6, 10 ** 6, N).astype(np.int64)
    w = rng.choice(np.array([-1, 1, 2], np.int64), N)
    starts = np.sort(rng.choice(np.arange(1, N), 999, replace=False))
    starts = np.concatenate([[0], starts]).astype(np.int64)

    def checked():
        return weighted_group_sums(x, w, starts)

    def plain():
        return np.add.reduceat(x * w, starts)

    assert np.array_equal(checked()[0], plain())
    benchmark.group = "checked_sum"
    benchmark(checked)
    tc, tp = interleaved(checked, plain, rounds=51)
    benchmark.extra_info.update(checked_us=tc * 1e6, unchecked_us=tp * 1e6, ratio=tc / tp)


def _circuit():
    c = dbsp.Circuit()
    t = c.add_input("t", pa.schema([("k", pa.int64()), ("v", pa.int64())]))
    t.index_by(["k"]).aggregate({"s": ("sum", "v"), "n": ("count", None)}).output(view=False)
    rng = np.random.default_rng(2)
    t.push(pa.table({"k": rng.integers(0, 1_000_000, 1_000_000), "v": rng.integers(0, 100,
                                                                               1_000_000)}))
    c.step()
    batch = pa.table({"k": rng.integers(0, 1_000_000, N), "v": rng.integers(0, 100, N)})
    return c, t, batch


def test_atomic_step(benchmark):
    c, t, batch = _circuit()
    replica = c._replicas[0]

    def step(atomic: bool, rollback: bool = False) -> float:
        replica.atomic = atomic
        t.push(batch)  # (validation is not timed)
        t0 = time.perf_counter()
        c.step()
        if rollback:
            replica.rollback()  # undo the step just run (as if another worker had failed)
        return time.perf_counter() - t0

    benchmark.group = "atomic_step"
    benchmark.pedantic(step, args=(True,), rounds=5, iterations=1)
    ta, tp, tr = [], [], []
    for i in range(16):  # ABBA: the state grows each step, so neither goes first always
        pair = [(True, ta), (False, tp)]
        for atomic, out in (pair if i % 2 else pair[::-1]):
            out.append(step(atomic))
        if i % 4 == 0:
            tr.append(step(True, rollback=True))
    a, p = statistics.median(ta), statistics.median(tp)
    benchmark.extra_info.update(atomic_ms=a * 1e3, plain_ms=p * 1e3, ratio=a / p,
                                step_and_rollback_ms=statistics.median(tr) * 1e3)
    c.close()
