# Compare: pytest bench/operators/bench_count_max.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""Per-key count + max over bids: ``group_by(auction).agg(cnt=count(), max_price=max(price))``.

1M bids (``DBSP_BENCH_BIDS``) in steps of 10K over auctions that grow from 100K to 1M
(each step's bids spread over the auctions announced so far, as in Nexmark), each step's change
read as Arrow (``to_arrow``). Two circuits side by side, stepped alternately (so both see the
same machine moments apart): ``flat`` is the aggregate the engine builds (running count and max per
key, the value trace sought only when a maximum is retracted), ``regroup`` the whole-group
recompute the engine used before (every touched group re-read from the input trace).
``extra_info``: events/s of each, and each one's median step time over the last tenth of the run
against the first tenth (``late_vs_early``: flat step time is 1.0); ``*_cpu_*`` the same of the
stepping thread's CPU time (``time.thread_time``: what the step itself computed, without the
time other processes took the core, which on a shared machine swings the wall time several-fold;
background merges are not in it).
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np
import pyarrow as pa
import pytest

import dbsp
from dbsp.circuit.types import ZSetType
from dbsp.operators.aggregate import GroupAggregateOperator, output_schema, parse_aggs
from dbsp.operators.join import sharded

BIDS = pa.schema([pa.field("auction", pa.int64(), False), pa.field("price", pa.int64(), False)])
AGGS = {"cnt": ("count", None), "max_price": ("max", "price")}
N_BIDS = int(os.environ.get("DBSP_BENCH_BIDS", "1000000"))
STEP = 10_000


def _steps(seed: int = 3) -> list:
    rng = np.random.default_rng(seed)
    n = N_BIDS // STEP
    out = []
    for s in range(n):
        auctions = 100_000 + (900_000 * s) // max(n - 1, 1)  # 100K -> 1M keys
        out.append(pa.record_batch([rng.integers(0, auctions, STEP, dtype=np.int64),
                                    rng.integers(1, 100_000, STEP, dtype=np.int64)],
                                   schema=BIDS))
    return out


def _circuit(regroup: bool):
    c = dbsp.Circuit()
    bids = c.add_input("bids", BIDS)
    ix = bids.index_by(["auction"])
    if regroup:
        specs = parse_aggs(AGGS, ix.key_schema, ix.val_schema)
        out_s = output_schema(ix.key_schema, specs)
        agg = c.add_node("aggregate(regroup)",
                         lambda ctx: GroupAggregateOperator(ctx, specs, out_s), [sharded(ix)],
                         ZSetType(out_s))
    else:
        agg = ix.aggregate(AGGS)
    return c, bids, agg.output(view=False)


def _run(c, bids, out, batch) -> tuple[float, float]:
    t, cpu = time.perf_counter(), time.thread_time()
    bids.push(batch)
    c.step()
    out.to_arrow()
    return time.perf_counter() - t, time.thread_time() - cpu


@pytest.mark.slow
def test_count_max_over_bids(benchmark):
    data = _steps()
    flat, regroup = _circuit(False), _circuit(True)
    tf: list = []
    tr: list = []
    it = iter(data)

    def one_pair():
        b = next(it)
        tr.append(_run(*regroup, b))
        tf.append(_run(*flat, b))

    try:
        benchmark.group = "count-max-bids"
        benchmark.pedantic(one_pair, rounds=len(data), iterations=1)
    finally:
        flat[0].close()
        regroup[0].close()
    tenth = max(len(data) // 10, 1)
    info = {}
    for name, both in (("flat", tf), ("regroup", tr)):
        for kind, t in (("", [w for w, _ in both]), ("cpu_", [c for _, c in both])):
            info[f"{name}_{kind}events_per_s"] = N_BIDS / sum(t)
            info[f"{name}_{kind}early_ms"] = statistics.median(t[:tenth]) * 1e3
            info[f"{name}_{kind}late_ms"] = statistics.median(t[-tenth:]) * 1e3
            info[f"{name}_{kind}late_vs_early"] = \
                statistics.median(t[-tenth:]) / statistics.median(t[:tenth])
    info["regroup_over_flat"] = sum(w for w, _ in tr) / sum(w for w, _ in tf)
    benchmark.extra_info.update(info)
    print(info)
