# Compare: pytest bench/operators/bench_expressions.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""Column expressions (:mod:`dbsp.api.expr`) over a 1M-row Nexmark-like bid batch.

Each group times one compiled expression on the whole batch, against the same computation
written by hand with ``pyarrow.compute`` (the cost of the expression layer: binding is done once,
so the ratio should stay near 1) and, on a 20k-row slice, against per-row Python (the
``map_rows`` slow path the expressions replace, including its conversions from and to Arrow;
scaled to rows/s). The last group runs a whole
fluent pipeline step (filter + select + group_by/agg) through a StreamContext.

Fixed seed (17). ``extra_info``: ``rows_per_s``, ``hand_rows_per_s`` and ``ratio_to_hand``,
``python_rows_per_s`` and ``speedup_vs_python``, and ``arrow_peak_mb`` (the Arrow memory pool's
peak during the group, beside the time).
"""
from __future__ import annotations

import datetime as dt
import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dbsp.api import StreamContext, col, count, sum_, when

N = 1_000_000
PY_N = 20_000
ROUNDS = 7


@pytest.fixture(scope="module")
def bids() -> pa.RecordBatch:
    rng = np.random.default_rng(17)
    channels = np.array(["Google", "Facebook", "Baidu", "Apple", "channel-42"])
    price = rng.integers(100, 10_000_000, N)
    return pa.record_batch({
        "auction": rng.integers(1000, 2000, N),
        "bidder": rng.integers(1000, 5000, N),
        "price": pa.array(np.where(rng.random(N) < 0.01, 0, price)).cast(pa.int64()),
        "channel": pa.array(channels[rng.integers(0, len(channels), N)]),
        "date_time": pa.array(1_700_000_000_000 + np.arange(N) // 10, pa.timestamp("ms")),
    })


def _median(f, rounds=ROUNDS) -> float:
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


CASES = {
    # name: (expression, hand-written pyarrow, per-row python over a row dict)
    "q1-euro": (col("price") * 0.908,
                lambda b: pc.multiply(b["price"], 0.908),
                lambda r: r["price"] * 0.908),
    "arith-floordiv-mod": ((col("price") // 7) + (col("bidder") % 10),
                           lambda b: pc.add(pc.divide(pc.subtract(b["price"],
                                                                  pc.modulo(b["price"], 7)), 7),
                                            pc.modulo(b["bidder"], 10)),
                           lambda r: r["price"] // 7 + r["bidder"] % 10),
    "predicate": ((col("price") > 1_000_000) & col("auction").is_in([1007, 1020, 2001, 1500]),
                  lambda b: pc.and_kleene(pc.greater(b["price"], 1_000_000),
                                          pc.is_in(b["auction"], value_set=pa.array(
                                              [1007, 1020, 2001, 1500]))),
                  lambda r: r["price"] > 1_000_000 and r["auction"] in (1007, 1020, 2001, 1500)),
    "string": (col("channel").str.lower().str.starts_with("chan"),
               lambda b: pc.starts_with(pc.utf8_lower(b["channel"]), "chan"),
               lambda r: r["channel"].lower().startswith("chan")),
    "case-when": (when(col("price") > 5_000_000, "high").when(col("price") > 1_000, "mid")
                  .otherwise("low"),
                  lambda b: pc.case_when(pc.make_struct(pc.greater(b["price"], 5_000_000),
                                                        pc.greater(b["price"], 1_000)),
                                         pa.repeat(pa.scalar("high"), len(b)),
                                         pa.repeat(pa.scalar("mid"), len(b)),
                                         pa.repeat(pa.scalar("low"), len(b))),
                  lambda r: "high" if r["price"] > 5_000_000 else
                  ("mid" if r["price"] > 1_000 else "low")),
    "safe-division": (col("bidder") / col("price"),
                      lambda b: pc.divide(pc.cast(b["bidder"], pa.float64()),
                                          pc.if_else(pc.equal(b["price"], 0), None,
                                                     pc.cast(b["price"], pa.float64()))),
                      lambda r: r["bidder"] / r["price"] if r["price"] else None),
    "window-floor": (col("date_time").dt.floor(dt.timedelta(seconds=10)),
                     lambda b: pc.floor_temporal(b["date_time"], 10, "second"),
                     lambda r: r["date_time"].replace(second=r["date_time"].second // 10 * 10,
                                                      microsecond=0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_expression(benchmark, bids, case):
    expr, hand, py = CASES[case]
    benchmark.group = f"expr-1M-{case}"
    compiled = expr.compile(bids.schema)
    got = compiled(bids)
    want = hand(bids)
    assert got.equals(want.cast(got.type)) or got.to_pylist()[:1000] == \
        want.cast(got.type).to_pylist()[:1000]
    pool = pa.default_memory_pool()
    base_peak = pool.max_memory()
    benchmark.pedantic(lambda: compiled(bids), rounds=ROUNDS, iterations=1, warmup_rounds=1)
    t_hand = _median(lambda: hand(bids))
    part = bids.slice(0, PY_N)
    t_py = _median(lambda: pa.array([py(r) for r in part.to_pylist()]), rounds=3)
    med = benchmark.stats.stats.median
    benchmark.extra_info.update(
        rows_per_s=N / med, hand_rows_per_s=N / t_hand, ratio_to_hand=t_hand / med,
        python_rows_per_s=PY_N / t_py, speedup_vs_python=(N / med) / (PY_N / t_py),
        arrow_peak_mb=max(pool.max_memory() - base_peak, 0) / 2**20)


def test_compile(benchmark, bids):
    """Binding (type inference and checks) happens once per pipeline: it should be cheap."""
    benchmark.group = "expr-compile"
    e = (when(col("price") > 5_000_000, "high").otherwise("low").str.concat(col("channel"))
         .str.len() + (col("bidder") // 3) * 2)
    benchmark(lambda: e.compile(bids.schema))


def test_pipeline_step(benchmark, bids):
    """One step of filter -> select -> group_by/agg over 1M new rows, through a StreamContext."""
    benchmark.group = "expr-pipeline-step-1M"
    table = pa.Table.from_batches([bids])

    def run():
        with StreamContext() as ctx:
            s = ctx.stream(table, batching=N)
            out = (s.filter(col("price") > 1_000)
                    .select("auction", euro=col("price") * 0.908)
                    .group_by("auction").agg(n=count(), total=sum_("euro"))
                    .collect(view=False))
            ctx.execute()
            return out
    out = run()
    assert len(out.delta()) == 1000
    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=0)
    benchmark.extra_info.update(rows_per_s=N / benchmark.stats.stats.median)
