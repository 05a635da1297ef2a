# Compare: pytest bench/operators/bench_bounded_state.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""State that the watermark or an append-only input bounds, after a long history: one step of

* ``join-gc``: a join on ``(t, k)`` of two event streams (each 20K rows a step, 10 time units
  apart per step): with both sides' watermarks (the state keeps the rows within the lateness)
  and without (every row of the history);
* ``topk-append-only``: the top 3 per key (5K keys) of an event stream of 20K rows a step, with
  ``append_only=True`` (the state keeps each key's top 3) and without (every row).

Each is timed after 60 steps of history; ``extra_info`` carries ``state_rows`` beside the time
(the point of the bounded forms: the state, and with it the step, does not grow with history).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dbsp.api import StreamContext

ROWS, HISTORY, ROUNDS = 20_000, 60, 10
L = pa.schema([("t", pa.int64()), ("k", pa.int64()), ("x", pa.int64())])
R = pa.schema([("t", pa.int64()), ("k", pa.int64()), ("y", pa.int64())])


def _table(schema, step: int, rng) -> pa.Table:
    return pa.table({"t": step * 10 + rng.integers(0, 10, ROWS),
                     "k": rng.integers(0, 5_000, ROWS),
                     schema.names[2]: rng.integers(0, 1_000_000, ROWS)}, schema=schema)


@pytest.mark.parametrize("gc", [True, False])
def test_join_with_watermarks(benchmark, gc):
    rng = np.random.default_rng(4)
    with StreamContext() as ctx:
        kw = {"time": "t", "lateness": 20} if gc else {}
        ls, rs = ctx.stream(L, name="l", **kw), ctx.stream(R, name="r", **kw)
        ls.join(rs, on=["t", "k"]).collect(view=False)
        step = [0]

        def push():
            ls.push(_table(L, step[0], rng))
            rs.push(_table(R, step[0], rng))
            step[0] += 1
            return (), {}
        for _ in range(HISTORY):
            push()
            ctx.step()
        benchmark.group = "join-gc"
        benchmark.pedantic(ctx.step, setup=push, rounds=ROUNDS, iterations=1)
        benchmark.extra_info.update(gc=gc, state_rows=ctx.state_rows(),
                                    rows_per_s=2 * ROWS / benchmark.stats.stats.median)


@pytest.mark.parametrize("append_only", [True, False])
def test_topk_append_only(benchmark, append_only):
    rng = np.random.default_rng(5)
    with StreamContext() as ctx:
        s = ctx.stream(L, name="ev")
        s.group_by("k").topk(3, by="x", descending=True, append_only=append_only) \
            .collect(view=False)
        step = [0]

        def push():
            s.push(_table(L, step[0], rng))
            step[0] += 1
            return (), {}
        for _ in range(HISTORY):
            push()
            ctx.step()
        benchmark.group = "topk-append-only"
        benchmark.pedantic(ctx.step, setup=push, rounds=ROUNDS, iterations=1)
        benchmark.extra_info.update(append_only=append_only, state_rows=ctx.state_rows(),
                                    rows_per_s=ROWS / benchmark.stats.stats.median)
