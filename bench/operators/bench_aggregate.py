# Compare: pytest bench/operators/bench_aggregate.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""One aggregate step: 10K rows into 10K groups holding 1M rows of history.

* ``linear`` (count, sum, avg): running partials per key, the history is never read;
* ``general`` (min, max, count_distinct): the touched groups are looked up in the input trace and
  recomputed (about 100 rows per group here).

Timed: ``circuit.step()`` only (the next delta is pushed, untimed, before each round).
``extra_info``: ``rows_per_s``.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import dbsp

from _workload import wait_for_merges

S = pa.schema([pa.field("g", pa.int64(), False), pa.field("x", pa.int64(), False),
               pa.field("y", pa.float64(), False)])
AGGS = {
    "linear": {"n": ("count", None), "s": ("sum", "x"), "a": ("avg", "y")},
    "general": {"lo": ("min", "x"), "hi": ("max", "y"), "d": ("count_distinct", "x")},
}
GROUPS, HISTORY, DELTA, ROUNDS = 10_000, 1_000_000, 10_000, 20


def _batch(rng, n):
    return pa.record_batch([rng.integers(0, GROUPS, n, dtype=np.int64),
                            rng.integers(0, 1000, n, dtype=np.int64), rng.random(n)], schema=S)


@pytest.mark.parametrize("kind", ["linear", "general"])
@pytest.mark.parametrize("workers", [1, 2])
def test_aggregate_step(benchmark, kind, workers):
    rng = np.random.default_rng(5)
    with dbsp.Circuit(workers=workers) as c:
        t = c.add_input("t", S)
        t.index_by(["g"]).aggregate(AGGS[kind]).output(view=False)
        for _ in range(HISTORY // 100_000):
            t.push(_batch(rng, 100_000))
            c.step()
        wait_for_merges()
        deltas = iter([_batch(rng, DELTA) for _ in range(ROUNDS + 1)])

        def push():
            t.push(next(deltas))
            return (), {}

        benchmark.group = f"aggregate-step-{kind}"
        benchmark.pedantic(c.step, setup=push, rounds=ROUNDS, iterations=1, warmup_rounds=1)
        benchmark.extra_info.update(workers=workers, rows_per_s=DELTA / benchmark.stats.stats.median)
