# Compare: pytest bench/operators/bench_join.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""One incremental join step: 10K bids (each for a known auction) + 100 new auctions, against
1M bids and 100K auctions of history (``Δa ⋈ I(b) + z^-1(I(a)) ⋈ Δb``: probes of every spine
batch, pair expansion, Arrow gathers). Timed: ``circuit.step()`` only; each round pushes the
next delta first (untimed).

``extra_info``: ``rows_per_s`` (delta rows in), ``out_rows`` (join rows of the last step).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import dbsp

from _workload import AUCTIONS, BIDS, CATEGORIES, wait_for_merges, workload_steps

N_AUCTIONS, DELTA_BIDS, DELTA_AUCTIONS, ROUNDS = 100_000, 10_000, 100, 20


def _deltas(rounds: int, seed: int = 3) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for r in range(rounds):
        ids = np.arange(DELTA_AUCTIONS, dtype=np.int64) + N_AUCTIONS + r * DELTA_AUCTIONS
        a = pa.record_batch([ids, rng.integers(0, CATEGORIES, len(ids), dtype=np.int64)],
                            schema=AUCTIONS)
        b = pa.record_batch([rng.integers(0, N_AUCTIONS, DELTA_BIDS, dtype=np.int64),
                             rng.integers(1, 10_000, DELTA_BIDS, dtype=np.int64)], schema=BIDS)
        out.append((a, b))
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_join_step(benchmark, workers):
    with dbsp.Circuit(workers=workers) as c:
        a = c.add_input("auctions", AUCTIONS)
        b = c.add_input("bids", BIDS)
        out = b.index_by(["auction"]).join(a.index_by(["id"])).output(view=False)
        for x, y in workload_steps(1_000_000, N_AUCTIONS, 10, seed=2):
            a.push(x)
            b.push(y)
            c.step()
        wait_for_merges()
        it = iter(_deltas(ROUNDS + 1))

        def push():
            x, y = next(it)
            a.push(x)
            b.push(y)
            return (), {}

        benchmark.group = "join-step"
        benchmark.pedantic(c.step, setup=push, rounds=ROUNDS, iterations=1, warmup_rounds=1)
        benchmark.extra_info.update(
            workers=workers, rows_per_s=(DELTA_BIDS + DELTA_AUCTIONS) / benchmark.stats.stats.median,
            out_rows=len(out.delta_loose()))
