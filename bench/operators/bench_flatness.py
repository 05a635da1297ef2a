# Compare: pytest bench/operators/bench_flatness.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
# Quick:   DBSP_BENCH_HISTORY=100000 pytest bench/operators/bench_flatness.py --benchmark-only
"""History flatness of every stateful operator: the step time at 10x the history, against 1x.

For each operator two circuits hold ``H`` (``DBSP_BENCH_HISTORY``, 1M) and ``10 H`` rows of
history ``(k, x, t)`` over 1,000 keys, so the groups grow with the history (1K rows a key, then
10K). Then both are fed the same kind of small step (1K rows: inserts, among them new maxima of
their key, and the retraction of the previous step's inserts, which takes those maxima back) and
stepped alternately, so the ratio compares steps moments apart (as ``bench_history.py``). Timed
by the benchmark: the large circuit's ``step()``; the small one's is timed in the setup.
``extra_info``: ``median_ms_small``, ``median_ms_large`` and ``ratio_large_vs_small`` (target:
within 1.5).

Joins keep a dimension input ``(k, y)`` of one row per key beside the history.
"""
from __future__ import annotations

import os
import statistics

import numpy as np
import pyarrow as pa
import pytest
from pytest_benchmark.utils import load_timer

import dbsp
from dbsp.operators.window import hopping, session, tumbling, window_aggregate
from dbsp.operators.rolling import rolling_aggregate

from _workload import wait_for_merges

FACTS = pa.schema([pa.field("k", pa.int64(), False), pa.field("x", pa.int64(), False),
                   pa.field("t", pa.int64(), False)])
DIM = pa.schema([pa.field("k", pa.int64(), False), pa.field("y", pa.int64(), False)])
KEYS, STEP, ROUNDS = 1_000, 1_000, 30
HISTORY = int(os.environ.get("DBSP_BENCH_HISTORY", "1000000"))
LOAD = 500_000  # rows per loading step

EXTREMES = {"lo": ("min", "x"), "hi": ("max", "x")}


def _agg(f, d):
    return f.index_by(["k"]).aggregate(EXTREMES)


QUERIES = {
    "min_max": _agg,
    "count_distinct": lambda f, d: f.index_by(["k"]).aggregate({"cd": ("count_distinct", "x")}),
    "topk": lambda f, d: f.index_by(["k"]).topk(5, ["x"], descending=True),
    "rank": lambda f, d: f.index_by(["k"]).topk(5, ["x"], descending=True, rank="r"),
    "distinct": lambda f, d: f.map(lambda b: b.select(["k", "x"]),
                                   pa.schema(list(FACTS)[:2])).distinct(),
    "join": lambda f, d: f.index_by(["k"]).join(d.index_by(["k"])),
    "semijoin": lambda f, d: f.index_by(["k"]).semijoin(d.index_by(["k"])),
    "antijoin": lambda f, d: f.index_by(["k"]).antijoin(d.index_by(["k"])),
    "left_join": lambda f, d: f.index_by(["k"]).left_join(d.index_by(["k"])),
    "tumbling": lambda f, d: window_aggregate(f, "t", tumbling(1_000_000), ["k"], EXTREMES),
    "hopping": lambda f, d: window_aggregate(f, "t", hopping(1_000_000, 250_000), ["k"],
                                             EXTREMES),
    "session": lambda f, d: window_aggregate(f, "t", session(50), ["k"], EXTREMES),
    "rolling": lambda f, d: rolling_aggregate(f, "t", ["k"], {"hi": ("max", "x")},
                                              range_=1_000),
}


class _Feed:
    """History rows, then small steps: 1K inserts (a tenth of them new maxima of their key, all
    at the newest times) and the retraction of the previous step's inserts."""

    def __init__(self, rows: int, seed: int):
        self.rng = np.random.default_rng(seed)
        self.t = 0
        self.top = 1_000_000
        self.prev = None
        self.rows = rows

    def _rows(self, n: int, new_max: float = 0.0) -> pa.RecordBatch:
        k = self.rng.integers(0, KEYS, n, dtype=np.int64)
        x = self.rng.integers(0, 1_000_000, n, dtype=np.int64)
        hot = self.rng.random(n) < new_max
        x[hot] = self.top + np.arange(hot.sum())
        self.top += int(hot.sum())
        t = self.t + np.sort(self.rng.integers(0, n, n, dtype=np.int64))
        self.t += n
        return pa.record_batch([k, x, t], schema=FACTS)

    def history(self):
        for lo in range(0, self.rows, LOAD):
            yield self._rows(min(LOAD, self.rows - lo))

    def step(self):
        b = self._rows(STEP, new_max=0.1)
        out = [(b, None)]
        if self.prev is not None:
            out.append((self.prev, -np.ones(self.prev.num_rows, np.int64)))
        self.prev = b
        return out


def _prepare(name: str, rows: int):
    c = dbsp.Circuit()
    f = c.add_input("facts", FACTS)
    d = c.add_input("dim", DIM)
    out = QUERIES[name](f, d).output(view=False)
    d.push(pa.record_batch([np.arange(0, KEYS, 2, dtype=np.int64),
                            np.arange(0, KEYS, 2, dtype=np.int64)], schema=DIM))
    feed = _Feed(rows, seed=7)
    for b in feed.history():
        f.push(b)
        c.step()
        out.delta()
    wait_for_merges()

    def push():
        for b, w in feed.step():
            f.push(b, weights=w)
        out.delta()  # the previous step's output (untimed)
        return (), {}
    return c, push


@pytest.mark.slow
@pytest.mark.parametrize("name", list(QUERIES))
def test_step_time_flat_in_history(benchmark, request, name):
    small, push_s = _prepare(name, HISTORY)
    large, push_l = _prepare(name, 10 * HISTORY)
    ts: list = []
    # The small history's step is timed by the clock pytest-benchmark times the large one with
    # (``--benchmark-timer``; the regression gate passes time.thread_time, so a loaded machine's
    # preemption does not enter the ratio).
    clock = load_timer(request.config.getoption("benchmark_timer")).target

    def setup():
        push_s()
        t = clock()
        small.step()
        ts.append(clock() - t)
        return push_l()

    try:
        benchmark.group = f"flatness-{name}"
        benchmark.pedantic(large.step, setup=setup, rounds=ROUNDS, iterations=1, warmup_rounds=2)
    finally:
        small.close()
        large.close()
    ts = ts[2:]
    s = benchmark.stats.stats
    info = dict(history_small=HISTORY, history_large=10 * HISTORY,
                median_ms_small=statistics.median(ts) * 1e3, median_ms_large=s.median * 1e3,
                ratio_large_vs_small=s.median / statistics.median(ts))
    benchmark.extra_info.update(info)
    print(name, {k: round(v, 2) for k, v in info.items()})
