# Compare: pytest bench/operators/bench_delta_read.py --benchmark-only -s
"""What reading a step's change costs a consumer, per row: ``delta()`` (an Arrow table with
``__weight``: consolidation of the workers' parts included) and ``delta_dict()`` (``{row tuple:
weight}``), beside Arrow's own ``Table.to_pylist()`` of the same table. Target: ``delta_dict()``
no dearer than ``to_pylist`` (``dict_over_to_pylist`` <= 1.0).

The change: 100K rows ``(id int64, price float64, name string)`` pushed through an input straight
to an output, read after each step; each figure is the median of 5 rounds, measured interleaved
(each round times all three on the same fresh step).
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import pyarrow as pa

import dbsp

ROWS, ROUNDS = 100_000, 5
SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("price", pa.float64(), False),
                    pa.field("name", pa.string(), False)])


def _batch(rng, seed: int) -> pa.RecordBatch:
    ids = rng.permutation(ROWS).astype(np.int64) + seed * ROWS
    return pa.record_batch([ids, rng.random(ROWS) * 100,
                            pa.array([f"n{i % 5000}" for i in ids.tolist()])], schema=SCHEMA)


def test_delta_read_cost(benchmark):
    benchmark.group = "delta-read"
    rng = np.random.default_rng(11)
    batches = [_batch(rng, i) for i in range(ROUNDS + 1)]
    t_arrow, t_dict, t_pylist = [], [], []
    with dbsp.Circuit() as c:
        inp = c.add_input("t", SCHEMA)
        out = inp.output(view=False)
        k = [0]

        def one_round():
            inp.push(batches[k[0]])
            k[0] += 1
            c.step()
            t0 = time.perf_counter()
            table = out.to_arrow()  # consolidates the step's parts, once
            t1 = time.perf_counter()
            d = out.to_dict()
            t2 = time.perf_counter()
            rows = table.to_pylist()
            t3 = time.perf_counter()
            assert len(d) == len(rows) == ROWS
            t_arrow.append(t1 - t0)
            t_dict.append(t2 - t1)
            t_pylist.append(t3 - t2)

        benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    ns = {name: statistics.median(t) / ROWS * 1e9
          for name, t in (("delta", t_arrow), ("delta_dict", t_dict), ("to_pylist", t_pylist))}
    info = {f"{k}_ns_per_row": v for k, v in ns.items()}
    info["dict_over_to_pylist"] = ns["delta_dict"] / ns["to_pylist"]
    benchmark.extra_info.update(info)
    print("\n" + ", ".join(f"{k} {v:.0f} ns/row" for k, v in ns.items())
          + f"; delta_dict / to_pylist = {info['dict_over_to_pylist']:.2f}")
