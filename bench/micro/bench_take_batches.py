# Compare: pytest bench/micro/bench_take_batches.py --benchmark-only -s
"""``take_batches``: rows ``idx`` of the concatenation of a few record batches (a merge's output
gathered from its inputs, a join's output from the batches it met), its two paths timed
interleaved at each size: the column gather without a concatenated copy (``schema._gather``)
against ``take(concat_batches(...))``. ``take_batches`` concatenates below
``schema.CONCAT_TAKE_ROWS`` input rows (``CONCAT_TAKE_FIXED_ROWS`` without a string column),
where the gather's per-part, per-column Python set-up costs more than the copy it saves; this
benchmark is where those thresholds come from.

Shapes: ``k`` parts of ``n`` rows each, columns int64, float64 and a ~10-byte string (``ifs``)
or int64 and float64 alone (``if``); ``idx`` a merge's row index (every row, the sorted runs
interleaved) or one row in ten of it (``sparse``: a join taking a few rows of the batches it
met). Fixed seed. ``extra_info``: ``gather_us``, ``concat_take_us``, ``ratio_gather_to_concat``
(above 1: concatenating is faster) and ``path`` (the one ``take_batches`` takes)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from _timing import interleaved
from dbsp.algebra import schema as S

ROUNDS = 15


def _parts(kinds: str, k: int, n: int, rng) -> list:
    out = []
    for _ in range(k):
        cols = {}
        for i, c in enumerate(kinds):
            if c == "i":
                cols[f"c{i}"] = pa.array(rng.integers(0, 1 << 40, n))
            elif c == "f":
                cols[f"c{i}"] = pa.array(rng.random(n))
            else:
                cols[f"c{i}"] = pa.array([f"name-{x}" for x in rng.integers(0, 10 ** 6, n)])
        out.append(pa.record_batch(cols))
    return out


@pytest.mark.parametrize("kinds", ["ifs", "if"])
@pytest.mark.parametrize("sparse", [False, True], ids=["merge", "sparse"])
@pytest.mark.parametrize("k,n", [(2, 50), (2, 1000), (2, 5000), (4, 5000), (2, 10_000),
                                 (2, 20_000), (4, 20_000), (2, 50_000)])
def test_take_batches(benchmark, kinds, sparse, k, n):
    benchmark.group = f"take-batches-{kinds}-{'sparse' if sparse else 'merge'}"
    rng = np.random.default_rng(5)
    parts = _parts(kinds, k, n, rng)
    schema = parts[0].schema
    keys = np.concatenate([np.sort(rng.integers(0, 1 << 40, n)) for _ in range(k)])
    idx = np.argsort(keys, kind="stable").astype(np.int64)
    if sparse:
        idx = idx[::10]
    reps = max(1, 20_000 // (k * n))

    def gather():
        for _ in range(reps):
            S._gather(schema, parts, idx)

    def concat_take():
        for _ in range(reps):
            S.take(S.concat_batches(schema, parts), idx)

    assert S._gather(schema, parts, idx).equals(S.take(S.concat_batches(schema, parts), idx))
    benchmark.pedantic(lambda: S.take_batches(schema, parts, idx), rounds=ROUNDS, iterations=reps,
                       warmup_rounds=1)
    tg, tc = interleaved(gather, concat_take, ROUNDS)
    benchmark.extra_info.update(
        rows=k * n, gather_us=tg / reps * 1e6, concat_take_us=tc / reps * 1e6,
        ratio_gather_to_concat=tg / tc,
        path="concat" if S.concat_takes(schema, k * n) else "gather")
    print(benchmark.group, k, n, {key: round(v, 2) if isinstance(v, float) else v
                                  for key, v in benchmark.extra_info.items()})
