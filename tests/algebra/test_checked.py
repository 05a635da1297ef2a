"""Checked int64 arithmetic against Python integers (dbsp.algebra.checked)."""
from __future__ import annotations

import operator

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dbsp.algebra import kernels as K
from dbsp.algebra.checked import (I64_MAX, I64_MIN, WeightOverflowError, add_overflows,
                                  group_sums, mul_overflows, weighted_group_sums)

I64 = st.integers(I64_MIN, I64_MAX)
BIGISH = st.one_of(st.integers(-5, 5), I64, st.sampled_from([I64_MIN, I64_MAX, 2 ** 62, -2 ** 62]))


def _groups(sizes):
    starts = np.cumsum([0] + sizes[:-1]).astype(np.int64)
    return starts, [(int(s), int(s) + n) for s, n in zip(starts, sizes)]


@given(st.lists(st.tuples(BIGISH, BIGISH), min_size=1, max_size=30), st.data())
@example([(2 ** 62, 1), (2 ** 62, 1)], None)
def test_weighted_group_sums_flag_exactly_the_overflows(rows, data):
    n = len(rows)
    if data is None:
        sizes = [n]
    else:
        cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=4)))) if n > 1 else []
        bounds = [0] + cuts + [n]
        sizes = [b - a for a, b in zip(bounds, bounds[1:])]
    x = np.array([r[0] for r in rows], dtype=np.int64)
    w = np.array([r[1] for r in rows], dtype=np.int64)
    starts, spans = _groups(sizes)
    sums, bad = weighted_group_sums(x, w, starts)
    for g, (lo, hi) in enumerate(spans):
        exact = sum(int(a) * int(b) for a, b in zip(x[lo:hi], w[lo:hi]))
        fits = I64_MIN <= exact <= I64_MAX
        assert bad[g] == (not fits)
        if fits:
            assert int(sums[g]) == exact


@given(st.lists(BIGISH, min_size=1, max_size=30))
def test_group_sums_one_group(ws):
    w = np.array(ws, dtype=np.int64)
    sums, bad = group_sums(w, np.array([0], np.int64))
    exact = sum(ws)
    assert bool(bad[0]) == (not I64_MIN <= exact <= I64_MAX)
    if not bad[0]:
        assert int(sums[0]) == exact


def _check_elementwise(fn, op, pairs):
    """``fn(a, b)`` gives ``(result, overflowed)``: every row either overflowed exactly when the
    Python integer result leaves int64, or equals it (``overflowed`` None: no row did)."""
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    r, over = fn(a, b)
    for i, (x, y) in enumerate(pairs):
        fits = I64_MIN <= op(x, y) <= I64_MAX
        assert (over is not None and bool(over[i])) == (not fits)
        if fits:
            assert int(r[i]) == op(x, y)


@given(st.lists(st.tuples(I64, I64), max_size=30))
def test_add_overflows(pairs):
    _check_elementwise(add_overflows, operator.add, pairs)


@given(st.lists(st.tuples(BIGISH, BIGISH), max_size=30))
def test_mul_overflows(pairs):
    _check_elementwise(mul_overflows, operator.mul, pairs)


# -- weight sums inside the native kernels (merge, merge_pairs, sort: _native/checked_add.h) -------

BIG = st.sampled_from([2 ** 62, 2 ** 63 - 1, -2 ** 63, -2 ** 62, 3 * 2 ** 60, 1, -1, 5])
RUN = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 2), BIG), max_size=8)


def _exact(rows):
    sums, first = {}, {}
    for g, (k, v, w) in enumerate(rows):
        sums[(k, v)] = sums.get((k, v), 0) + w
        first.setdefault((k, v), g)
    return sums, first


def _as_run(rows, with_v):
    rows = sorted({(k, v): w for k, v, w in rows}.items())
    k = np.array([kv[0] for kv, _ in rows], np.uint64)
    v = np.array([kv[1] for kv, _ in rows], np.uint64) if with_v else None
    w = np.array([x for _, x in rows], np.int64)
    return k, v, w, [(kv[0], kv[1] if with_v else 0, x) for kv, x in rows]


@given(runs=st.lists(RUN, min_size=1, max_size=5), with_v=st.booleans())
def test_merge_weight_sums_are_right_or_an_error(runs, with_v):
    """Every consolidated weight is the exact sum, or WeightOverflowError names a group whose
    exact sum leaves int64 (partial sums that wrap and come back are no error)."""
    built = [_as_run(r, with_v) for r in runs]
    flat = [row for b in built for row in b[3]]
    sums, first = _exact(flat)
    bad = {first[kv] for kv, s in sums.items() if not I64_MIN <= s <= I64_MAX}
    try:
        gidx, w = K.merge_consolidate([(k, v, w) for k, v, w, _ in built])
    except WeightOverflowError as e:
        assert bad and set(e.rows) == bad
        return
    assert not bad
    got = {(flat[g][0], flat[g][1]): int(x) for g, x in zip(gidx.tolist(), w.tolist())}
    assert got == {kv: s for kv, s in sums.items() if s}


@given(rows=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 2), BIG), max_size=30),
       with_v=st.booleans())
def test_sort_consolidate_weight_sums_are_right_or_an_error(rows, with_v):
    k = np.array([r[0] for r in rows], np.uint64)
    v = np.array([r[1] for r in rows], np.uint64) if with_v else None
    w = np.array([r[2] for r in rows], np.int64)
    keyed = [(a, b if with_v else 0, x) for a, b, x in rows]
    sums, first = _exact(keyed)
    bad = {first[kv] for kv, s in sums.items() if not I64_MIN <= s <= I64_MAX}
    try:
        perm, ws = K.sort_consolidate(k, v, w)
    except WeightOverflowError as e:
        assert bad and set(e.rows) == bad
        return
    assert not bad
    got = {(keyed[p][0], keyed[p][1]): int(x) for p, x in zip(perm.tolist(), ws.tolist())}
    assert got == {kv: s for kv, s in sums.items() if s}


@given(runs=st.lists(RUN, min_size=2, max_size=4))
def test_merge_indexed_weight_sums_are_right_or_an_error(runs):
    built = [_as_run(r, True) for r in runs]
    flat = [row for b in built for row in b[3]]
    sums, first = _exact(flat)
    bad = {first[kv] for kv, s in sums.items() if not I64_MIN <= s <= I64_MAX}
    ind = []
    for k, v, w, _ in built:
        keys, counts = np.unique(k, return_counts=True)
        ind.append((keys, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), v, w))
    # the same runs with their key and value columns (the one-call merge of whole batches)
    whole = [r + (pa.record_batch([pa.array(r[0].astype(np.int64))], names=["k"]),
                  pa.record_batch([pa.array(r[2].astype(np.int64))], names=["v"]))
             for r in ind]
    try:
        merged = K.merge_indexed_batches(whole, whole[0][4].schema, whole[0][5].schema)
    except WeightOverflowError as e:
        assert bad and set(e.rows) == bad
    else:
        assert not bad
        flat_kv = merged[0].column(0).to_numpy()[np.repeat(np.arange(len(merged[1])),
                                                            np.diff(merged[2]))]
        got = {(int(k), int(v)): int(x) for k, v, x in
               zip(flat_kv, merged[3].column(0).to_numpy(), merged[5])}
        assert got == {kv: s for kv, s in sums.items() if s}
    try:
        gidx, w, *_ = K.merge_indexed(ind)
    except WeightOverflowError as e:
        assert bad and set(e.rows) == bad
        return
    assert not bad
    got = {(flat[g][0], flat[g][1]): int(x) for g, x in zip(gidx.tolist(), w.tolist())}
    assert got == {kv: s for kv, s in sums.items() if s}


def test_long_runs_take_the_branchless_and_galloping_merges():
    """Two long u64 runs (the spine's common case: bulk copies and the branchless loop, and the
    AVX-512 kernel where the CPU has it) flag one overflowing key among many."""
    n = 5000
    a = np.arange(0, 2 * n, 2, dtype=np.uint64)
    b = np.arange(0, 2 * n, 1, dtype=np.uint64)
    wa = np.ones(n, np.int64)
    wb = np.ones(2 * n, np.int64)
    wa[1234] = wb[2468] = 2 ** 62 + 7   # key 2468 sums to 2**63 + 14
    with pytest.raises(WeightOverflowError) as e:
        K.merge_consolidate([(a, None, wa), (b, None, wb)])
    assert e.value.rows == [1234]
    wb[2468] = -(2 ** 62)                # sums to 7: fine
    gidx, w = K.merge_consolidate([(a, None, wa), (b, None, wb)])
    assert int(w[np.flatnonzero(gidx == 1234)[0]]) == 7
