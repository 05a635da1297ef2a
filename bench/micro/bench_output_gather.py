# Compare (old vs new, interleaved, on a shared machine):
#   for i in 1 2 3 4 5; do PYTHONPATH=/work/main/src python bench/micro/bench_output_gather.py;
#                          python bench/micro/bench_output_gather.py; done
"""The output handle's per-step work on an aggregate's delta: each worker's output operator
(``OutputOperator.eval`` on its indexed part) plus the driver's gather and ``delta()``.

Shape: keyed count at ``--events`` events a step over 1M keys: every touched key retracts its old
``(n, s)`` row and inserts the new one (two rows a key, weights -1 / +1), the keys hash-sharded
over W workers (disjoint parts). Fixed seed. Prints the median microseconds over ``--reps`` of
the worker side (summed over the W parts: CPU, whichever process runs it) and of the driver
side, for W = 1 and W = 2, for whichever ``dbsp`` is on the path.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pyarrow as pa

import dbsp
from dbsp.operators.output import OutputHandle, OutputOperator
from dbsp.trace.batch import OrdIndexedZSet, ZSet

SCHEMA = pa.schema([("k", pa.int64()), ("n", pa.int64()), ("s", pa.int64())])


def indexed_parts(events: int, workers: int, seed: int = 1) -> list[OrdIndexedZSet]:
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 1_000_000, events))
    n = rng.integers(2, 50, len(keys))
    s = rng.integers(0, 10_000, len(keys))
    k2 = np.repeat(keys, 2)
    n2 = np.stack([n - 1, n], 1).ravel()
    s2 = np.stack([s - 7, s], 1).ravel()
    w2 = np.tile(np.array([-1, 1], np.int64), len(keys))
    out = []
    for i in range(workers):
        m = (k2 % workers) == i
        z = ZSet(pa.record_batch([k2[m], n2[m], s2[m]], schema=SCHEMA), w2[m])
        out.append(OrdIndexedZSet.from_loose(z, ["k"]))
    return out


def one(parts: list[OrdIndexedZSet]) -> tuple[float, float]:
    t0 = time.perf_counter()
    outs = []
    for p in parts:
        op = OutputOperator(None)
        op.eval(p)
        outs.append(op.last)
    t1 = time.perf_counter()
    h = OutputHandle(0, SCHEMA, "counts", keep_view=False)
    h._gather(outs)
    d = h.delta()
    t2 = time.perf_counter()
    assert len(d) == sum(len(p) for p in parts)
    return t1 - t0, t2 - t1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    res = []
    for w in (1, 2):
        parts = indexed_parts(a.events, w)
        for _ in range(3):
            one(parts)
        ts = [one(parts) for _ in range(a.reps)]
        wk = statistics.median(t[0] for t in ts) * 1e6
        dr = statistics.median(t[1] for t in ts) * 1e6
        res.append(f"W={w} worker {wk:7.0f} us driver {dr:7.0f} us total {wk + dr:7.0f} us")
    print(dbsp.__file__.split("/src/")[0], " | ".join(res))


if __name__ == "__main__":
    main()
