"""``deal_sorted`` (dbsp._native.hashing, kernels_ref) against a naive model: the driver's split
of an input that ``index_by`` reads, its rows sorted and consolidated by (key code, value code)
once, then dealt by the hash of the key code."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from dbsp._native import hashing as native
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dbsp.algebra import kernels as K
from dbsp.algebra import kernels_ref as ref
from dbsp.algebra.codes import codec_for
from dbsp.circuit.exchange import ShardMap, deal, deal_sorted, sorted_plan

_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64(),
          pa.date32(), pa.timestamp("us"), pa.duration("s")]


@st.composite
def inputs(draw):
    """(batch, weights, key names, owners, bits, workers): 0..40 rows of a key of one or two
    fixed-width columns and one or two value columns (few distinct values: duplicate rows and
    zero sums), now and then a null or a string column (which the kernel refuses)."""
    nk = draw(st.integers(1, 2))
    nv = draw(st.integers(1, 2))
    types = [draw(st.sampled_from(_TYPES)) for _ in range(nk + nv)]
    n = draw(st.integers(0, 40))
    fields, cols = [], []
    for i, t in enumerate(types):
        nullable = draw(st.booleans())
        vals = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        if nullable and n and draw(st.integers(0, 9)) == 0:
            vals = [None] + vals[1:]
        if pa.types.is_date32(t):
            arr = pa.array(vals, pa.int32()).view(t)
        else:
            arr = pa.array(vals, pa.int64()).cast(t)
        cols.append(arr)
        fields.append(pa.field(f"c{i}", t, nullable=nullable))
    if n and draw(st.integers(0, 9)) == 0:
        cols.append(pa.array(["s"] * n))
        fields.append(pa.field("s", pa.string()))
    order = draw(st.permutations(range(len(fields))))
    schema = pa.schema([fields[i] for i in order])
    batch = pa.record_batch([cols[i] for i in order], schema=schema)
    weights = np.array(draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)), np.int64)
    bits = draw(st.integers(0, 4))
    workers = draw(st.integers(1, 4))
    owners = np.array(draw(st.lists(st.integers(0, workers - 1), min_size=1 << bits,
                                    max_size=1 << bits)), np.int32)
    return batch, weights, [f"c{i}" for i in range(nk)], owners, bits, workers


def model(batch, weights, names, owners, bits, workers):
    """Per worker (row indices, summed weights, key codes, value codes), or None: each distinct
    row's first row, sorted by (key code, value code), zero sums dropped, the worker that
    ``owner_rows`` gives its key code."""
    vnames = [n for n in batch.schema.names if n not in names]
    kc = np.asarray(codec_for(batch.schema, names).encode_batch(batch.select(names)))
    vc = np.asarray(codec_for(batch.schema, vnames).encode_batch(batch.select(vnames)))
    acc: dict = {}
    for i in range(batch.num_rows):
        r = acc.setdefault((int(kc[i]), int(vc[i])), [i, 0])
        r[1] += int(weights[i])
    rows = sorted((k, v, i, s) for (k, v), (i, s) in acc.items() if s)
    ks = np.array([r[0] for r in rows], np.uint64)
    dest = ref.owner_rows(ks, owners, bits, workers)
    out = []
    order, bounds = dest
    for w in range(workers):
        idx = order[bounds[w]:bounds[w + 1]]
        out.append(None if not len(idx) else
                   ([rows[j][2] for j in idx], np.array([rows[j][3] for j in idx], np.int64),
                    np.array([rows[j][0] for j in idx], np.uint64),
                    np.array([rows[j][1] for j in idx], np.uint64)))
    return out


def _dealable(batch, names) -> bool:
    """Whether the kernel deals ``batch`` (else None): fixed-width columns without nulls, the
    codes of the key and of the value within 64 bits."""
    vnames = [n for n in batch.schema.names if n not in names]
    return batch.num_rows > 0 and all(
        not pa.types.is_string(f.type) and not c.null_count
        for f, c in zip(batch.schema, batch.columns)) and all(
        type(codec_for(batch.schema, ns).encode_batch(batch.select(ns))) is np.ndarray
        for ns in (names, vnames))


@settings(max_examples=300, deadline=None)
@given(inputs())
@example((pa.record_batch([pa.array([1, 1, 2, 2]), pa.array([5, 5, 6, 7])],
                          schema=pa.schema([pa.field("c0", pa.int64(), nullable=False),
                                            pa.field("c1", pa.int64(), nullable=False)])),
           np.array([1, 1, 2, 0], np.int64), ["c0"], np.array([0, 1], np.int32), 1, 2))
def test_deal_sorted(case):
    """Native and reference against the model: the same rows (each distinct row's first),
    summed weights and codes to the same workers in (key code, value code) order; None (no
    deal) where a column has a null or is not fixed-width."""
    batch, weights, names, owners, bits, workers = case
    plan = sorted_plan(batch.schema, names)
    ok = _dealable(batch, names)
    want = model(batch, weights, names, owners, bits, workers) if ok else None
    for kern in (native.deal_sorted, ref.deal_sorted):
        if plan is None:  # (a string value: no u64 codes)
            continue
        got = kern(batch, weights, plan[0], plan[1], plan[2], plan[3], owners, bits, workers,
                   K.sort_consolidate, plan[4])
        if not ok:
            assert got is None
            continue
        assert got is not None and len(got) == workers
        for g, m in zip(got, want):
            assert (g is None) == (m is None)
            if g is None:
                continue
            assert g[0].schema == batch.schema
            assert g[0].equals(batch.take(pa.array(m[0], pa.int64())))
            for a, b in zip(g[1:], m[1:]):
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(a, b)


@settings(max_examples=200, deadline=None)
@given(inputs())
@example((pa.record_batch([pa.array([1, 1, 2, 2, 2]), pa.array([5, 6, 6, 7, 7])],
                          schema=pa.schema([pa.field("c0", pa.int64(), nullable=False),
                                            pa.field("c1", pa.int64(), nullable=False)])),
           np.array([1, 1, 2, 1, -1], np.int64), ["c0"], np.array([0, 1], np.int32), 1, 2))
def test_deal_sorted_key_layer(case):
    """Each worker's item ends with the key layer of its rows, native and reference alike:
    its distinct key codes, the offsets of each key's rows, and each key's columns taken at
    its first row (what ``index_by`` would otherwise find and take), against the groups of
    the item's own key codes."""
    batch, weights, names, owners, bits, workers = case
    plan = sorted_plan(batch.schema, names)
    if plan is None or not _dealable(batch, names):
        return
    kschema = pa.schema([batch.schema.field(n) for n in names])
    assert plan[4] == kschema
    for kern in (native.deal_sorted, ref.deal_sorted):
        for g in kern(batch, weights, *plan[:4], owners, bits, workers, K.sort_consolidate,
                      plan[4]):
            if g is None:
                continue
            assert len(g) == 7
            rows, kc, keys, kd, offs = g[0], g[2], g[4], g[5], g[6]
            bounds = ref.group_bounds(kc)
            np.testing.assert_array_equal(offs, bounds)
            np.testing.assert_array_equal(kd, kc[bounds[:-1]])
            assert kd.dtype == np.uint64 and offs.dtype == np.int64
            assert keys.schema == kschema
            assert keys.equals(rows.select(names).take(pa.array(bounds[:-1], pa.int64())))


@given(inputs())
@settings(max_examples=100, deadline=None)
def test_deal_sorted_places_rows_as_deal(case):
    """The shard hash and placement do not change: every row dealt sorted goes to the worker
    that :func:`deal` (the unsorted split) gives it."""
    batch, weights, names, owners, bits, workers = case
    plan = sorted_plan(batch.schema, names)
    if plan is None or not _dealable(batch, names):
        return
    shards = ShardMap(owners, workers)
    key = (tuple(names), pa.schema([batch.schema.field(n) for n in names]))
    where = np.empty(batch.num_rows, np.int64)
    for w, rows in enumerate(deal(batch, key, shards)):
        where[rows] = w
    kc = np.asarray(codec_for(batch.schema, names).encode_batch(batch.select(names)))
    got = deal_sorted(batch, weights, plan, shards)
    for w, part in enumerate(got):
        if part is not None:
            for code in part[2]:
                assert set(where[kc == code]) == {w}


@pytest.mark.parametrize("distinct", [False, True])
@pytest.mark.parametrize("workers", [2, 3, 300])
def test_deal_sorted_long_inputs(workers, distinct):
    """Past NOGIL_MIN rows (the GIL released), two workers (the branch-free placement) and
    more, every column width: native as the reference. ``distinct``: every row kept (no
    duplicate, no zero weight: the pass that skips the recount), else many dropped."""
    rng = np.random.default_rng(workers)
    n = 40_003
    schema = pa.schema([pa.field(c, pa.from_numpy_dtype(t), nullable=False)
                        for c, t in zip("abcd", (np.int8, np.int16, np.int32, np.int64))])
    cols = [rng.integers(-9, 9, n + 1).astype(t) for t in (np.int8, np.int16, np.int32, np.int64)]
    if distinct:
        cols[3] = rng.permutation(n + 1).astype(np.int64)
    batch = pa.record_batch(cols, schema=schema).slice(1)
    weights = rng.integers(1, 5, n) if distinct else rng.integers(-5, 5, n)
    owners = rng.integers(0, workers, 1 << 10).astype(np.int32)
    plan = sorted_plan(batch.schema, ["d"])
    args = (batch, weights, plan[0], plan[1], plan[2], plan[3], owners, 10, workers,
            K.sort_consolidate, plan[4])
    got, want = native.deal_sorted(*args), ref.deal_sorted(*args)
    assert (sum(len(r[1]) for r in want if r is not None) == n) == distinct
    for g, r in zip(got, want):
        assert (g is None) == (r is None)
        if g is not None:
            assert g[0].equals(r[0]) and g[4].equals(r[4])   # the rows, the key layer's keys
            for a, b in zip(g[1:4] + g[5:], r[1:4] + r[5:]):
                np.testing.assert_array_equal(a, b)


def test_deal_sorted_refuses_bad_input():
    b = pa.record_batch([pa.array([1, 2, 3]), pa.array([4, 5, 6])],
                        schema=pa.schema([pa.field("a", pa.int64(), nullable=False),
                                          pa.field("b", pa.int64(), nullable=False)]))
    plan = sorted_plan(b.schema, ["a"])
    for kern in (native.deal_sorted, ref.deal_sorted):
        with pytest.raises(ValueError):  # 2 weights, 3 rows
            kern(b, np.ones(2, np.int64), *plan[:4], np.zeros(2, np.int32), 1, 1,
                 K.sort_consolidate, plan[4])
        with pytest.raises(ValueError):  # owner 5
            kern(b, np.ones(3, np.int64), *plan[:4], np.array([0, 5], np.int32), 1, 2,
                 K.sort_consolidate, plan[4])
        with pytest.raises(ValueError):  # no column 7
            kern(b, np.ones(3, np.int64), [7], plan[1], plan[2], plan[3],
                 np.zeros(2, np.int32), 1, 1, K.sort_consolidate, plan[4])


@pytest.mark.parametrize("bad_row", [-1, 3, 1 << 40])
def test_deal_sorted_refuses_a_sort_that_gives_a_row_out_of_range(bad_row):
    """The sort is a callback: a permutation entry outside the batch is named, not stored."""
    b = pa.record_batch([pa.array([1, 2, 3]), pa.array([4, 5, 6])],
                        schema=pa.schema([pa.field("a", pa.int64(), nullable=False),
                                          pa.field("b", pa.int64(), nullable=False)]))
    plan = sorted_plan(b.schema, ["a"])

    def bad_sort(kc, vc, w):
        return np.array([0, bad_row, 2], np.int64), np.ones(3, np.int64)

    with pytest.raises(ValueError, match=f"row {bad_row} of 3"):
        native.deal_sorted(b, np.ones(3, np.int64), *plan[:4], np.array([0, 1], np.int32), 1, 2,
                           bad_sort, plan[4])


def test_deal_sorted_refuses_a_sort_that_repeats_a_row():
    """A permutation that repeats a row (a broken callback) is refused before the row is stored
    twice: with no row dropped the runs are sized by the hashing pass's counts, which a
    repeated row would overflow."""
    n = 5_000
    b = pa.record_batch([pa.array(np.arange(n)), pa.array(np.arange(n))],
                        schema=pa.schema([pa.field("a", pa.int64(), nullable=False),
                                          pa.field("b", pa.int64(), nullable=False)]))
    plan = sorted_plan(b.schema, ["a"])
    for m, row in ((n, 7), (n - 1, 7), (n, n - 1)):
        def repeating_sort(kc, vc, w, m=m, row=row):
            perm = np.arange(m, dtype=np.int64)
            perm[-1] = row  # (row m - 1 gone, row `row` twice; or m - 1 == row: none twice)
            return perm, np.ones(m, np.int64)

        if row == m - 1:
            got = native.deal_sorted(b, np.ones(n, np.int64), *plan[:4],
                                     np.array([0, 1], np.int32), 1, 2, repeating_sort, plan[4])
            assert sum(len(p[1]) for p in got if p is not None) == m
            continue
        with pytest.raises(ValueError, match=f"row {row} twice"):
            native.deal_sorted(b, np.ones(n, np.int64), *plan[:4], np.array([0, 1], np.int32), 1,
                               2, repeating_sort, plan[4])
        with pytest.raises(ValueError, match=f"row {row} twice"):  # three workers: the other loop
            native.deal_sorted(b, np.ones(n, np.int64), *plan[:4],
                               np.array([0, 1, 2, 2], np.int32), 2, 3, repeating_sort, plan[4])
