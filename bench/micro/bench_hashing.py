# Compare: pytest bench/micro/bench_hashing.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""Hash 10M u64 codes (``hash64``) and shard them (``shard``, 7 and 8 shards) with
``dbsp._native.hashing``, against the same splitmix64 written in numpy, in the same run; and
hash 1M var codes (FNV-1a, ~24 bytes each; no numpy baseline); and deal 100K u64 codes to the
workers of a shard map (``owner_rows``: the rows of each of 2 and 3 workers, what the exchange
and the driver's input split ask ``ShardMap.rows`` for), against the numpy path it replaced
(hash, top bits, owner, one ``flatnonzero`` per worker or a stable sort).

Fixed seeds; native and numpy calls are timed interleaved (the machine is shared) and the ratio
and the rates in ``extra_info`` are of their medians (the benchmark's own timings are the
native call alone). ``extra_info``: ``rows_per_s``, ``numpy_rows_per_s``, ``ratio_to_numpy``.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from _timing import interleaved
from dbsp._native import hashing

from dbsp.algebra import kernels_ref
from dbsp.algebra.codes import VarCodes

N = 10_000_000
ROUNDS = 7
M1, M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def numpy_hash64(k: np.ndarray, seed: int = 0) -> np.ndarray:
    x = k ^ np.uint64(seed)
    x = (x ^ (x >> np.uint64(30))) * M1
    x = (x ^ (x >> np.uint64(27))) * M2
    return x ^ (x >> np.uint64(31))




@pytest.fixture(scope="module")
def codes():
    return np.random.default_rng(99).integers(0, 2 ** 64 - 1, N, dtype=np.uint64, endpoint=True)


@pytest.mark.parametrize("op", ["hash64", "shard7", "shard8"])
def test_hash_u64(benchmark, codes, op):
    benchmark.group = f"hash-10M-u64-{op}"
    if op == "hash64":
        fast = lambda: hashing.hash64(codes)
        base = lambda: numpy_hash64(codes)
    else:
        ns = int(op[5:])
        fast = lambda: hashing.shard(codes, ns)
        base = lambda: (numpy_hash64(codes) % np.uint64(ns)).astype(np.int64)
    np.testing.assert_array_equal(fast(), base())
    benchmark.pedantic(fast, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    tf, tb = interleaved(fast, base, ROUNDS)
    benchmark.extra_info.update(rows_per_s=N / tf, numpy_rows_per_s=N / tb, ratio_to_numpy=tb / tf)


def test_hash_var(benchmark):
    benchmark.group = "hash-1M-var"
    rng = np.random.default_rng(98)
    n = 1_000_000
    lens = rng.integers(8, 40, n)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    codes = VarCodes(offsets, rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8))
    np.testing.assert_array_equal(hashing.hash64(codes)[:1000],
                                  kernels_ref.hash64(VarCodes(offsets[:1001], codes.data)))
    benchmark.pedantic(lambda: hashing.hash64(codes), rounds=ROUNDS, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(rows_per_s=n / benchmark.stats.stats.median,
                                bytes_per_s=int(offsets[-1]) / benchmark.stats.stats.median)


def numpy_owner_rows(k: np.ndarray, owners: np.ndarray, bits: int, workers: int) -> list:
    dest = owners[(hashing.hash64(k) >> np.uint64(64 - bits)).astype(np.int64)]
    if workers == 2:
        return [np.flatnonzero(dest == 0), np.flatnonzero(dest)]
    order = np.argsort(dest, kind="stable")
    return np.split(order, np.searchsorted(dest[order], np.arange(1, workers)))


@pytest.mark.parametrize("workers", [2, 3])
def test_owner_rows(benchmark, codes, workers):
    benchmark.group = f"owner-rows-100K-u64-W{workers}"
    from dbsp.circuit.exchange import ShardMap
    m = ShardMap.dynamic(workers)
    k = codes[:100_000]

    def fast():
        order, b = hashing.owner_rows(k, m.owners, m.bits, workers)
        return [order[b[w]:b[w + 1]] for w in range(workers)]

    base = lambda: numpy_owner_rows(k, m.owners, m.bits, workers)
    for x, y in zip(fast(), base()):
        np.testing.assert_array_equal(x, y)
    benchmark.pedantic(fast, rounds=50, iterations=1, warmup_rounds=2)
    tf, tb = interleaved(fast, base, 50)
    benchmark.extra_info.update(rows_per_s=len(k) / tf, numpy_rows_per_s=len(k) / tb,
                                ratio_to_numpy=tb / tf)


@pytest.mark.parametrize("rows", [1_000, 10_000])
@pytest.mark.parametrize("workers", [2, 3])
def test_deal_batch(benchmark, workers, rows):
    """The driver's split of an input by key (``exchange.deal_batch``: one native pass hashing
    the key and copying each row to its worker's run) against the path it replaced
    (``deal_order``'s permutation, a take through it, a numpy gather of the weights, a slice
    per worker), on a batch of two int64 columns keyed by the first (join_avg's bids).
    Measured (2 vCPUs, shared; ratio of medians): 1K / 10K rows, 2 workers 1.49x / 1.46x,
    3 workers 1.30x / 1.11x."""
    benchmark.group = f"deal-batch-{rows // 1000}K-W{workers}"
    from dbsp.algebra.schema import take
    from dbsp.circuit.exchange import ShardMap, deal_batch, deal_order
    rng = np.random.default_rng(7)
    batch = pa.record_batch({"k": rng.integers(0, rows // 10, rows),
                             "v": rng.integers(1, 10_000, rows)})
    key = (("k",), pa.schema([pa.field("k", pa.int64(), nullable=False)]))
    w = np.ones(rows, np.int64)
    m = ShardMap.dynamic(workers)
    fast = lambda: deal_batch(batch, w, key, m)

    def base():
        order, b = deal_order(batch, key, m)
        data, ws = take(batch, order), w[order]
        return [(data.slice(b[i], b[i + 1] - b[i]), ws[b[i]:b[i + 1]]) for i in range(workers)]
    for x, y in zip(fast(), base()):
        assert x[0].equals(y[0]) and (x[1] == y[1]).all()
    benchmark.pedantic(fast, rounds=200, iterations=1, warmup_rounds=5)
    tf, tb = interleaved(fast, base, 200)
    benchmark.extra_info.update(rows_per_s=rows / tf, gather_rows_per_s=rows / tb,
                                ratio_to_gather=tb / tf)
