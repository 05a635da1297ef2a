# Compare: pytest bench/operators/bench_join.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""One incremental join step: 10K bids + 100 auctions against 1M bids and 100K auctions of
history (``Δa ⋈ I(b) + z^-1(I(a)) ⋈ Δb``: probes of every spine batch, pair expansion, Arrow
gathers). Timed: ``circuit.step()`` only; each round pushes the next delta first (untimed).

``extra_info``: ``rows_per_s`` (delta rows in), ``out_rows`` (join rows produced per step).
"""
from __future__ import annotations

import pytest

import dbsp

from _workload import AUCTIONS, BIDS, wait_for_merges, workload_steps

HISTORY_STEPS, ROUNDS = 10, 20


@pytest.mark.parametrize("workers", [1, 2])
def test_join_step(benchmark, workers):
    data = workload_steps(1_000_000 + ROUNDS * 10_000 * 10, 100_000 + ROUNDS * 1_000 * 10,
                          HISTORY_STEPS + ROUNDS * 10, seed=3)
    hist, deltas = data[:HISTORY_STEPS], data[HISTORY_STEPS:]
    with dbsp.Circuit(workers=workers) as c:
        a = c.add_input("auctions", AUCTIONS)
        b = c.add_input("bids", BIDS)
        out = b.index_by(["auction"]).join(a.index_by(["id"])).output(view=False)
        for x, y in hist:
            a.push(x)
            b.push(y)
            c.step()
        wait_for_merges()
        it = iter(deltas)

        def push():
            x, y = next(it)
            a.push(x.slice(0, 100))
            b.push(y.slice(0, 10_000))
            return (), {}

        benchmark.group = "join-step"
        benchmark.pedantic(c.step, setup=push, rounds=ROUNDS, iterations=1, warmup_rounds=1)
        benchmark.extra_info.update(
            workers=workers, rows_per_s=10_100 / benchmark.stats.stats.median,
            out_rows=len(out.delta_loose()))
