# Compare: pytest bench/micro/bench_merge.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""Merge two sorted, consolidated 10M-row u64 runs (20M rows in) with ``dbsp._native.merge``,
against numpy in the same run.

Baseline: ``np.sort(np.concatenate([a, b]), kind="stable")`` (timsort finds the two runs). It
returns sorted keys only; ``merge_consolidate`` returns an int64 row index *and* an int64 weight
per output row and consolidates, so it writes twice the bytes.

Shapes: ``interleaved`` (both runs random in ``[0, 2^62)``) and ``disjoint`` (every key of b above
every key of a: found by galloping, copied in bulk). Also a 4-way merge (4 x 5M rows, loser tree)
with the same numpy baseline on its concatenation. Fixed seeds; native and numpy calls are timed
interleaved (the machine is shared) and the rates and the ratio in ``extra_info`` come from those
interleaved medians (the benchmark's own timings are the native call alone).
Target: >= 250M rows/s per core for two runs (rows = input rows).

Two runs take the AVX-512 kernel where the CPU has it (``merge.simd_enabled()``); the scalar loop
(``merge.set_simd(False)``) is timed interleaved with it in the same run for the speed-up.

``extra_info``: ``rows_per_s``, ``numpy_rows_per_s``, ``ratio_to_numpy``, ``peak_alloc_MB``;
for two runs also ``simd``, ``scalar_rows_per_s`` and ``ratio_to_scalar``.

``merge-indexed-gather``: the spine's top-level merge of the join's bid trace (4 indexed
batches of 2.5M rows, 1M u64 keys, one int64 value column): ``merge_pairs.merge_indexed_cols``
(the value column gathered in the kernel) against ``merge_indexed`` + concatenating the value
columns + a take at the row index (what ``OrdIndexedZSet.merge`` did before), interleaved, with
the peak memory of each beyond its inputs (``peak_alloc_MB`` / ``index_path_peak_alloc_MB``).

``merge-indexed-strings``: the same top-level merge with string values (var value codes):
``OrdIndexedZSet.merge`` gathering from its inputs against concatenating them and taking.
"""
from __future__ import annotations

import numpy as np
import pytest
from _timing import interleaved, peak_mb
from dbsp._native import merge, merge_pairs

N = 10_000_000
ROUNDS = 7


def sorted_distinct(rng, n, lo, hi):
    k = np.sort(rng.integers(lo, hi, n, dtype=np.uint64))
    return k[np.r_[True, k[1:] != k[:-1]]]    # np.unique is ~1.7 us/row on numpy 2.4 here


@pytest.fixture(scope="module", params=["interleaved", "disjoint", "4-way"])
def runs(request):
    rng = np.random.default_rng(7)
    if request.param == "interleaved":
        ks = [sorted_distinct(rng, N, 0, 2 ** 62), sorted_distinct(rng, N, 0, 2 ** 62)]
    elif request.param == "disjoint":
        ks = [sorted_distinct(rng, N, 0, 2 ** 62), sorted_distinct(rng, N, 2 ** 62, 2 ** 63)]
    else:
        ks = [sorted_distinct(rng, N // 2, 0, 2 ** 62) for _ in range(4)]
    return request.param, [(k, None, np.ones(len(k), np.int64)) for k in ks]


def test_merge(benchmark, runs):
    name, rs = runs
    benchmark.group = f"merge-{name}"
    rows = sum(len(r[0]) for r in rs)
    keys = [r[0].view(np.int64) for r in rs]
    fast = lambda: merge.merge_consolidate(rs)
    base = lambda: np.sort(np.concatenate(keys), kind="stable")
    gidx, w = fast()
    out = np.concatenate([r[0] for r in rs])[gidx]
    assert np.all(out[1:] > out[:-1]) and w.sum() == sum(int(r[2].sum()) for r in rs)
    benchmark.pedantic(fast, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    tf, tb = interleaved(fast, base, ROUNDS)
    benchmark.extra_info.update(
        rows_per_s=rows / tf, numpy_rows_per_s=rows / tb,
        ratio_to_numpy=tb / tf, target_rows_per_s=250e6 if len(rs) == 2 else None,
        peak_alloc_MB=peak_mb(fast), numpy_peak_alloc_MB=peak_mb(base))
    if len(rs) == 2:
        def scalar():
            prev = merge.set_simd(False)
            try:
                return merge.merge_consolidate(rs)
            finally:
                merge.set_simd(prev)
        g2, w2 = scalar()
        assert np.array_equal(g2, gidx) and np.array_equal(w2, w)
        tf2, ts = interleaved(fast, scalar, ROUNDS)
        benchmark.extra_info.update(simd=merge.simd_enabled(), scalar_rows_per_s=rows / ts,
                                    ratio_to_scalar=ts / tf2)


def test_merge_indexed_gather(benchmark):
    benchmark.group = "merge-indexed-gather"
    rng = np.random.default_rng(11)
    runs = []
    for _ in range(4):
        n = N // 4
        k = rng.integers(0, 1_000_000, n).astype(np.uint64)
        v = rng.integers(0, 10_000, n).astype(np.uint64)
        order = np.lexsort((v, k))
        k, v = k[order], v[order]
        keep = np.r_[True, (k[1:] != k[:-1]) | (v[1:] != v[:-1])]
        k, v = k[keep], v[keep]
        starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        off = np.r_[starts, len(k)].astype(np.int64)
        runs.append((k[starts], off, v, np.ones(len(k), np.int64), (v.view(np.int64).copy(),)))
    rows = sum(len(r[2]) for r in runs)

    def gather():
        return merge_pairs.merge_indexed_cols(runs)

    def index_path():
        gidx, w, vc, kc, off, ksrc = merge_pairs.merge_indexed([r[:4] for r in runs])
        col = np.concatenate([r[4][0] for r in runs])[gidx]
        return [col], w, vc, kc, off, ksrc

    got, want = gather(), index_path()
    assert np.array_equal(got[0][0], want[0][0]) and all(
        np.array_equal(a, b) for a, b in zip(got[1:], want[1:]))
    del got, want
    benchmark.pedantic(gather, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    tg, ti = interleaved(gather, index_path, ROUNDS)
    benchmark.extra_info.update(
        rows_per_s=rows / tg, index_path_rows_per_s=rows / ti, ratio_to_index_path=ti / tg,
        peak_alloc_MB=peak_mb(gather), index_path_peak_alloc_MB=peak_mb(index_path))
    print(benchmark.extra_info)


def test_merge_indexed_strings(benchmark):
    """``merge-indexed-strings``: the spine's top-level merge of a trace with string values (q20's
    bid trace, q19's top-k state: 4 indexed batches of 250K rows, 20K int64 keys, an int64 and
    two string value columns of ~50 and ~70 bytes, so var value codes): ``OrdIndexedZSet.merge``,
    which gathers the columns and codes straight from its inputs (``take_batches``,
    ``take_var_runs``), against the concatenate-then-take path it replaced, interleaved (the
    memory saved, a concatenated copy of the inputs, is in Arrow's pool, which tracemalloc does
    not see: the Nexmark runs' peak RSS shows it)."""
    import pyarrow as pa
    from dbsp.algebra import kernels as K
    from dbsp.algebra.schema import concat_batches, take
    from dbsp.trace.batch import OrdIndexedZSet

    benchmark.group = "merge-indexed-strings"
    rng = np.random.default_rng(12)
    n = 250_000
    batches = []
    for _ in range(4):
        ids = rng.integers(0, 10**9, n)
        keys = pa.record_batch({"auction": pa.array(rng.integers(0, 20_000, n))})
        vals = pa.record_batch({
            "price": pa.array(rng.integers(0, 10**6, n)),
            "url": pa.array([f"https://www.nexmark.com/item.htm?query=1&channel_id={i}" for i in ids]),
            "extra": pa.array([f"{i:x}" * 8 for i in ids])})
        batches.append(OrdIndexedZSet.from_parts(keys, vals, np.ones(n, np.int64)))
    rows = sum(len(b) for b in batches)

    def gather():
        return OrdIndexedZSet.merge(batches)

    def concat_path():  # OrdIndexedZSet.merge's var path before take_batches
        b0 = batches[0]
        kis = [b.key_index() for b in batches]
        krows = [K.take(b.kcodes, ki) for b, ki in zip(batches, kis)]
        gidx, w = K.merge_consolidate([(rk, b.vcodes, b.weights) for rk, b in zip(krows, batches)])
        kc, vc = K.concat(krows), K.concat([b.vcodes for b in batches])
        koff = np.cumsum([0] + [b.num_keys for b in batches[:-1]])
        kidx = np.concatenate([ki + o for ki, o in zip(kis, koff.tolist())])
        keys = concat_batches(b0.key_schema, [b.keys for b in batches])
        vals = concat_batches(b0.val_schema, [b.vals for b in batches])
        ks = K.take(kc, gidx)
        bounds = K.group_bounds(ks)
        first = bounds[:-1]
        return OrdIndexedZSet(take(keys, kidx[gidx[first]]), K.take(ks, first), bounds,
                              take(vals, gidx), K.take(vc, gidx), w, b0.kcodec, b0.vcodec)

    got, want = gather(), concat_path()
    assert got.vals.equals(want.vals) and got.keys.equals(want.keys)
    assert np.array_equal(got.weights, want.weights) and np.array_equal(got.offsets, want.offsets)
    del got, want
    benchmark.pedantic(gather, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    tg, tc = interleaved(gather, concat_path, ROUNDS)
    benchmark.extra_info.update(
        rows_per_s=rows / tg, concat_path_rows_per_s=rows / tc, ratio_to_concat_path=tc / tg)
    print(benchmark.extra_info)
