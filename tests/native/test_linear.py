"""dbsp._native.linear against kernels_ref: the linear aggregate's per-step kernels."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from dbsp._native import linear as native
from hypothesis import example, given
from hypothesis import strategies as st

from dbsp.algebra import kernels_ref as ref
from dbsp.algebra.codes import KeyCodec

I64 = st.integers(-2 ** 63, 2 ** 63 - 1) | st.integers(-3, 3) | st.sampled_from(
    [2 ** 62, -2 ** 62, 2 ** 63 - 1, -2 ** 63])
F64 = st.floats(allow_nan=True, allow_infinity=False, width=64) | st.sampled_from(
    [0.0, -0.0, 1.5, -1.5])


@st.composite
def partials(draw):
    """(old, delta, has_old, is_int): a row count, then int64 or float64 columns."""
    g = draw(st.integers(0, 12))
    is_int = [True] + draw(st.lists(st.booleans(), max_size=3))
    old, delta = [], []
    for i in is_int:
        el, dt = (I64, np.int64) if i else (F64, np.float64)
        small = st.integers(-3, 3) if i else st.sampled_from([0.0, 1.0, -2.5])
        old.append(np.array(draw(st.lists(el | small, min_size=g, max_size=g)), dtype=dt))
        delta.append(np.array(draw(st.lists(small, min_size=g, max_size=g)), dtype=dt))
    has_old = np.array(draw(st.lists(st.booleans(), min_size=g, max_size=g)), dtype=bool)
    for col in old:  # a key without an old row has zero partials (as the state lookup gives)
        col[~has_old] = 0
    return old, delta, has_old, is_int


def _same(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@given(partials(), st.booleans())
@example(([np.array([2 ** 63 - 1], np.int64)], [np.array([1], np.int64)], np.array([True]),
          [True]), False)  # the row count leaves int64: refused
@example(([np.array([1], np.int64)], [np.array([-2], np.int64)], np.array([True]), [True]),
         True)  # a negative row count with positive: refused
@example(([np.array([0], np.int64), np.array([0.0])], [np.array([0], np.int64),
          np.array([-0.0])], np.array([True]), [True, False]), False)  # -0.0 is no change
def test_combine_partials(case, positive):
    old, delta, has_old, is_int = case
    got = native.combine_partials(old, delta, has_old, is_int, positive)
    want = ref.combine_partials(old, delta, has_old, is_int, positive)
    assert (got is None) == (want is None)
    if want is None:
        return
    for a, b in zip(got[0], want[0]):
        _same(a, b)
    for a, b in zip(got[1:], want[1:]):
        _same(a, b)


@st.composite
def grouped_delta(draw):
    sizes = draw(st.lists(st.integers(1, 4), max_size=6))
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n = int(bounds[-1])
    w = np.array(draw(st.lists(I64 | st.integers(-3, 3), min_size=n, max_size=n)), np.int64)
    xi = np.array(draw(st.lists(I64 | st.integers(-3, 3), min_size=n, max_size=n)), np.int64)
    xf = np.array(draw(st.lists(st.floats(-1e6, 1e6) | st.sampled_from([0.0, -0.0]),
                                min_size=n, max_size=n)), np.float64)
    valid = draw(st.none() | st.lists(st.booleans(), min_size=n, max_size=n))
    valids = [None if valid is None else np.array(valid, bool), None]
    kinds = [0] + draw(st.lists(st.sampled_from([1, 2, 3]), max_size=4))
    cols = [0] + [0 if k == 2 or (k == 1 and draw(st.booleans())) else 1 for k in kinds[1:]]
    return bounds, w, kinds, cols, [xi, xf], valids


@given(grouped_delta())
def test_delta_partials(case):
    bounds, w, kinds, cols, values, valids = case
    values = [values[0], values[1]]
    # kind 3 reads the float column (1), kind 2 the int column (0)
    cols = [1 if k == 3 else c for k, c in zip(kinds, cols)]
    got = native.delta_partials(bounds, w, kinds, cols, values, valids)
    want = ref.delta_partials(bounds, w, kinds, cols, values, valids)
    assert (got is None) == (want is None)
    if want is not None:
        for a, b in zip(got, want):
            _same(a, b)
            assert a.dtype == b.dtype


@st.composite
def finished(draw):
    """(old, new, eo, en, plan, is_int): partial columns of G keys (small values, so that old
    and new rows often finish equal), the emitted keys and an output plan over them."""
    g = draw(st.integers(0, 10))
    is_int = [True] + draw(st.lists(st.booleans(), max_size=3))
    small_i = st.integers(-2, 2)
    small_f = st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, 0.5, float("nan"), float("inf")])
    cols = []
    for _ in range(2):
        cols.append([np.array(draw(st.lists(small_i if i else small_f, min_size=g, max_size=g)),
                              dtype=np.int64 if i else np.float64) for i in is_int])
    keys = st.lists(st.booleans(), min_size=g, max_size=g)
    eo = np.flatnonzero(np.array(draw(keys), dtype=bool)).astype(np.int64)
    en = np.flatnonzero(np.array(draw(keys), dtype=bool)).astype(np.int64)
    ints = [j for j, i in enumerate(is_int) if i]
    entry = st.tuples(st.sampled_from([0, 1, 2]), st.sampled_from(ints),
                      st.integers(0, len(is_int) - 1))
    plan = draw(st.lists(entry, min_size=1, max_size=4))
    return cols[0], cols[1], eo, en, plan, is_int


@given(finished())
@example(([np.array([1], np.int64), np.array([-0.0])], [np.array([1], np.int64),
          np.array([0.0])], np.array([0]), np.array([0]), [(1, 0, 1)], [True, False]))
@example(([np.array([0, 2], np.int64)], [np.array([1, 2], np.int64)], np.array([0, 1]),
          np.array([0, 1]), [(2, 0, 0), (0, 0, 0)], [True]))  # a null avg sorts first
def test_finish_emit(case):
    old, new, eo, en, plan, is_int = case
    got = native.finish_emit(old, new, eo, en, plan, is_int)
    want = ref.finish_emit(old, new, eo, en, plan, is_int)
    _same(got[0], want[0])
    _same(got[1], want[1])
    assert got[0].dtype == np.int64 and got[1].dtype == np.int64
    for (gv, gm), (wv, wm) in zip(got[2], want[2]):
        assert gv.dtype == wv.dtype
        _same(gv, wv)
        assert (gm is None) == (wm is None)
        if wm is not None:
            _same(gm, wm)


def test_finish_emit_rejects_bad_plan():
    one = [np.array([1], np.int64)]
    with pytest.raises(ValueError, match="bad plan entry"):
        native.finish_emit(one, one, np.array([0]), np.array([0]), [(3, 0, 0)], [True])
    with pytest.raises(ValueError, match="ascending"):
        native.finish_emit(one, one, np.array([1]), np.array([0]), [(0, 0, 0)], [True])
    many = [np.array([1], np.int64)] * 65
    with pytest.raises(ValueError, match="at most 64 partial columns"):
        native.finish_emit(many, many, np.array([0]), np.array([0]), [(0, 0, 0)], [True] * 65)


_INT_TYPES = [(pa.int8(), 1, True), (pa.int16(), 2, True), (pa.int32(), 4, True),
              (pa.int64(), 8, True), (pa.uint8(), 1, False), (pa.uint16(), 2, False),
              (pa.uint32(), 4, False), (pa.uint64(), 8, False), (pa.date32(), 4, True),
              (pa.timestamp("us"), 8, True)]


@st.composite
def coded_keys(draw):
    """(record batch of integer / temporal key columns fitting a u64 code, its codec)."""
    n = draw(st.integers(0, 8))
    fields, cols, bits = [], [], 0
    for j in range(draw(st.integers(1, 4))):
        t, w, signed = draw(st.sampled_from(_INT_TYPES))
        nullable = draw(st.booleans())
        if bits + 8 * w + 8 * nullable > 64:
            break
        bits += 8 * w + 8 * nullable
        lo, hi = (-(1 << (8 * w - 1)), (1 << (8 * w - 1)) - 1) if signed else (0, (1 << (8 * w)) - 1)
        el = st.integers(lo, hi) | st.sampled_from([lo, hi, 0])
        vals = draw(st.lists(el | st.none() if nullable else el, min_size=n, max_size=n))
        st_t = pa.int64() if t == pa.timestamp("us") else (pa.int32() if t == pa.date32() else t)
        cols.append(pa.array(vals, st_t).cast(t) if st_t != t else pa.array(vals, t))
        fields.append(pa.field(f"k{j}", t, nullable))
    if not fields:
        fields, cols = [pa.field("k0", pa.int64(), False)], [pa.array([0] * n, pa.int64())]
    return pa.RecordBatch.from_arrays(cols, schema=pa.schema(fields)), KeyCodec(fields)


@given(coded_keys())
@example((pa.record_batch([pa.array([-2 ** 63, 2 ** 63 - 1], pa.int64())], names=["k"]),
          KeyCodec([pa.field("k", pa.int64(), False)])))
def test_decode_u64(case):
    batch, codec = case
    plan = codec._native_plan
    assert plan is not None
    codes = codec.encode(batch.columns, batch.num_rows)
    got = native.decode_u64(codes, plan)
    want = ref.decode_u64(codes, plan)
    assert len(got) == len(want) == batch.num_columns
    for (gv, gm), (wv, wm), col in zip(got, want, batch.columns):
        _same(gv, wv)
        assert gv.dtype == wv.dtype
        assert (gm is None) == (wm is None)
        if gm is not None:
            _same(gm, wm)
        # the naive model: the column's own values back (as integers), nulls where it has them
        ints = col.view(pa.from_numpy_dtype(gv.dtype)).to_pylist()
        back = [None if gm is not None and gm[i] else int(v) for i, v in enumerate(gv)]
        assert back == ints


def test_decode_u64_rejects_wide_plan():
    with pytest.raises(ValueError, match="decode_u64"):
        native.decode_u64(np.zeros(1, np.uint64), [(8, True, True)])
    with pytest.raises(ValueError, match="decode_u64"):
        ref.decode_u64(np.zeros(1, np.uint64), [(4, True, False), (3, False, False)])


@st.composite
def packed_parts(draw):
    """(W packed parts: key codes, then int64 / float64 partial bits; is_int)."""
    is_int = [True] + draw(st.lists(st.booleans(), max_size=3))
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        keys = sorted(draw(st.sets(st.integers(0, 12) | st.sampled_from([2 ** 64 - 1]),
                                   max_size=8)))
        m = np.empty((1 + len(is_int), len(keys)), np.uint64)
        m[0] = np.array(keys, np.uint64)
        for c, i in enumerate(is_int):
            el = I64 if i else st.floats(-1e6, 1e6) | st.sampled_from([0.0, -0.0, 0.25])
            vals = draw(st.lists(el, min_size=len(keys), max_size=len(keys)))
            m[1 + c] = np.array(vals, np.int64 if i else np.float64).view(np.uint64)
        parts.append(m)
    return parts, is_int


@given(packed_parts())
@example(([np.array([[5], [2 ** 63 - 1]], np.uint64), np.array([[5], [1]], np.uint64)], [True]))
def test_merge_sum_packed(case):
    parts, is_int = case
    got = native.merge_sum_packed(parts, is_int)
    want = ref.merge_sum_packed(parts, is_int)
    _same(got[0], want[0])
    assert (got[1] is None) == (want[1] is None)
    if want[1] is not None:
        _same(got[1], want[1])
    # the naive model: per key, the sum of its values over the parts
    sums: dict = {}
    for p in parts:
        for j, k in enumerate(p[0].tolist()):
            row = [int(p[1 + c].view(np.int64)[j]) if i else float(p[1 + c].view(np.float64)[j])
                   for c, i in enumerate(is_int)]
            sums[k] = row if k not in sums else [a + b for a, b in zip(sums[k], row)]
    assert got[0][0].tolist() == sorted(sums)
    over = [any(not -2 ** 63 <= sums[k][c] < 2 ** 63 for c, i in enumerate(is_int) if i)
            for k in sorted(sums)]
    assert (got[1].tolist() if got[1] is not None else [False] * len(over)) == over
    for c, i in enumerate(is_int):
        col = got[0][1 + c].view(np.int64 if i else np.float64).tolist()
        for g, k in enumerate(sorted(sums)):
            x = sums[k][c]
            if i:
                assert col[g] == (x + 2 ** 63) % 2 ** 64 - 2 ** 63
            else:
                assert col[g] == pytest.approx(x)


def test_merge_sum_packed_reads_a_part_that_is_not_c_contiguous():
    """A part in Fortran order (or a strided view) is read through a contiguous copy."""
    a = np.array([[1, 4, 9], [10, 20, 30]], np.uint64)
    b = np.asfortranarray(np.array([[4, 5], [1, 2]], np.uint64))
    for kernel in (native.merge_sum_packed, ref.merge_sum_packed):
        out, over = kernel([a, b], [True])
        assert over is None
        assert out.tolist() == [[1, 4, 5, 9], [10, 21, 2, 30]]
    kc, cols, _ = native.sum_unpack([a, b], [True], [(8, False, False)])
    assert kc.tolist() == [1, 4, 5, 9] and cols[0].tolist() == [10, 21, 2, 30]


def test_merge_sum_packed_rejects_bad_parts():
    with pytest.raises(ValueError, match="not ascending"):
        native.merge_sum_packed([np.array([[3, 3], [1, 1]], np.uint64)], [True])
    with pytest.raises(ValueError, match="rows"):
        native.merge_sum_packed([np.zeros((3, 2), np.uint64)], [True])


@st.composite
def sharded_partials(draw):
    """(distinct ascending key codes, 8-byte partial columns, a shard map's order and bounds)."""
    keys = sorted(draw(st.sets(st.integers(0, 2 ** 64 - 1), max_size=10)))
    n = len(keys)
    cols = [np.array(draw(st.lists(I64, min_size=n, max_size=n)), np.int64)]
    for _ in range(draw(st.integers(0, 2))):
        cols.append(np.array(draw(st.lists(st.floats(-1e6, 1e6), min_size=n, max_size=n)),
                             np.float64))
    W = draw(st.integers(1, 4))
    dest = draw(st.lists(st.integers(0, W - 1), min_size=n, max_size=n))
    order = np.array(sorted(range(n), key=lambda r: (dest[r], r)), np.int64)
    bounds = [sum(1 for x in dest if x < w) for w in range(W + 1)]
    return np.array(keys, np.uint64), cols, order, bounds


@given(sharded_partials())
@example((np.array([1, 7], np.uint64), [np.array([-1, 2 ** 63 - 1], np.int64)],
          np.array([1, 0], np.int64), [0, 1, 1, 2]))
@example((np.array([2 ** 64 - 1024, 2 ** 64 - 1023], np.uint64), [np.zeros(2, np.int64)],
          np.array([0, 1], np.int64), [0, 2]))  # codes float64 cannot tell apart
def test_pack_parts(case):
    kcodes, cols, order, bounds = case
    got = native.pack_parts(kcodes, cols, order, bounds)
    want = ref.pack_parts(kcodes, cols, order, bounds)
    assert len(got) == len(want) == len(bounds) - 1
    for w, (g, x) in enumerate(zip(got, want)):
        assert (g is None) == (x is None) == (bounds[w] == bounds[w + 1])
        if g is None:
            continue
        assert g.dtype == np.uint64 and g.flags.c_contiguous
        _same(g, x)
        # the naive model: worker w's rows, each code with its columns' bits
        rows = order[bounds[w]:bounds[w + 1]].tolist()
        assert g[0].tolist() == [int(kcodes[r]) for r in rows]
        for c, col in enumerate(cols):
            assert g[1 + c].view(col.dtype).tolist() == [col[r] for r in rows]
    # one worker's part is the run merge_sum_packed reads: codes ascending and distinct
    for g in got:
        if g is not None:
            codes = g[0].tolist()  # (as Python ints: float64 rounds codes near 2**64 together)
            assert all(a < b for a, b in zip(codes, codes[1:]))


def test_pack_parts_rejects_bad_input():
    k = np.array([1, 2], np.uint64)
    c = [np.zeros(2, np.int64)]
    for kernel in (native.pack_parts, ref.pack_parts):
        with pytest.raises(ValueError, match="bounds"):
            kernel(k, c, np.array([0, 1], np.int64), [0, 1])
        with pytest.raises(IndexError, match="order"):
            kernel(k, c, np.array([0, 2], np.int64), [0, 2])
        with pytest.raises(ValueError, match="column"):
            kernel(k, [np.zeros(2, np.int32)], np.array([0, 1], np.int64), [0, 2])


@given(packed_parts(), st.sampled_from([[(8, False, False)], [(4, True, False), (2, False, True)]]))
@example(([np.array([[5], [2 ** 63 - 1]], np.uint64), np.array([[5], [1]], np.uint64)], [True]),
         [(8, False, False)])
def test_sum_unpack(case, plan):
    parts, is_int = case
    if plan != [(8, False, False)]:  # codes of that plan: 56 bits, the flag byte set (the
        parts = [p.copy() for p in parts]  # masked codes keep their order: all but one <= 12)
        for p in parts:
            p[0] = (p[0] & np.uint64(0xFFFFFFFF)) | np.uint64(1 << 48)
    got = native.sum_unpack(parts, is_int, plan)
    want = ref.sum_unpack(parts, is_int, plan)
    merged, over = ref.merge_sum_packed(parts, is_int)
    if over is not None:
        assert got is None and want is None
        return
    for r in (got, want):
        kc, cols, kcols = r
        _same(kc, merged[0])
        for c, i in enumerate(is_int):
            assert cols[c].dtype == (np.int64 if i else np.float64)
            _same(cols[c].view(np.uint64), merged[1 + c])
        for (gv, gm), (wv, wm) in zip(kcols, ref.decode_u64(merged[0], plan)):
            _same(gv, wv)
            assert (gm is None) == (wm is None)
