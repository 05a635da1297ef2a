"""``dbsp._native.arrow_c.take_batch`` against its reference twin ``kernels_ref.take_batch``:
the same batch for fixed-width columns without nulls (any slice, time zones), the same None
for any other column, the same IndexError past the end; the result owns its memory."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from dbsp._native import arrow_c
from hypothesis import given
from hypothesis import strategies as st

from dbsp.algebra import kernels as K
from dbsp.algebra import kernels_ref as R
from dbsp.testing.strategies import FIXED_WIDTH_TYPES, fixed_width_column

FIXED = FIXED_WIDTH_TYPES
_column = fixed_width_column


def test_native_kernel_is_native():
    assert K.using_native()["take_batch"]


@given(st.lists(st.sampled_from(FIXED + [pa.string(), pa.bool_()]), min_size=1, max_size=5),
       st.integers(1, 40), st.integers(0, 5), st.booleans(), st.data())
def test_take_batch_equals_reference(types, n, skip, nulls, data):
    """The native ``take_batch`` against its reference twin: same batch (or the same None for a
    column it does not gather: strings, booleans, nulls), same IndexError past the end."""
    rng = np.random.default_rng(n + skip)
    cols = [_column(t, n + skip, rng) if t in FIXED else pa.array(
        [str(x) for x in range(n + skip)] if t == pa.string() else [True] * (n + skip), t)
        for t in types]
    if nulls:
        cols[0] = pa.array(cols[0].to_pylist()[:-1] + [None], cols[0].type)
    b = pa.RecordBatch.from_arrays(cols, names=[f"c{i}" for i in range(len(types))]).slice(skip)
    idx = np.asarray(data.draw(st.lists(st.integers(0, n + 1), max_size=60)), dtype=np.int64)
    try:
        want = R.take_batch(b, idx)
    except IndexError:
        with pytest.raises(IndexError):
            K.take_batch(b, idx)
        return
    got = K.take_batch(b, idx)
    if want is None:
        assert got is None
        return
    assert got.schema == b.schema
    assert got.equals(want)
    assert got.validate(full=pa.date64() not in got.schema.types) is None  # (test data: ms)


def test_take_batch_outlives_its_source():
    """The gathered batch owns its values: it stays right after the source batch is gone."""
    b = pa.RecordBatch.from_arrays([pa.array(np.arange(1000, dtype=np.int64)),
                                    pa.array(np.arange(1000, dtype=np.int32))], names=["a", "b"])
    got = K.take_batch(b, np.array([999, 3, 3, 0]))
    del b
    assert got.column(0).to_pylist() == [999, 3, 3, 0]
    assert got.column(1).to_pylist() == [999, 3, 3, 0]
    assert got.slice(1).column(0).to_pylist() == [3, 3, 0]


EXTRA = [(pa.int64(), np.int64), (pa.float64(), np.float64), (pa.int32(), np.int32),
         (pa.uint8(), np.uint8), (pa.timestamp("us"), np.int64), (pa.date32(), np.int32)]


@given(st.lists(st.sampled_from(FIXED), max_size=3), st.lists(st.sampled_from(range(len(EXTRA))),
       min_size=1, max_size=4), st.integers(1, 30), st.integers(0, 3), st.data())
def test_take_batch_with_extra_columns_equals_reference(types, extra_kinds, n, skip, data):
    """Gathered columns followed by numpy columns (with null masks) in one batch, against the
    reference; ``batch=None`` builds the numpy columns alone."""
    rng = np.random.default_rng(n * 7 + skip)
    b = None
    if types:
        b = pa.RecordBatch.from_arrays([_column(t, n + skip, rng) for t in types],
                                       names=[f"c{i}" for i in range(len(types))]).slice(skip)
    m = data.draw(st.integers(0, 50))
    idx = rng.integers(0, n, m) if b is not None else None
    extra, fields = [], list(b.schema) if b is not None else []
    for j, e in enumerate(extra_kinds):
        t, dt = EXTRA[e]
        v = rng.integers(0, 100, m).astype(dt)
        mask = rng.random(m) < 0.3 if data.draw(st.booleans()) else None
        extra.append((v, mask))
        fields.append(pa.field(f"x{j}", t))
    schema = pa.schema(fields)
    want = R.take_batch(b, idx, extra, schema)
    got = K.take_batch(b, idx, extra, schema)
    assert got.schema == schema
    assert got.equals(want)
    if b is not None:  # read through a kept export: the same batch
        assert K.take_batch(K.export_batch(b), idx, extra, schema).equals(want)
    assert got.validate(full=pa.date64() not in got.schema.types) is None  # (test data: ms)


@given(st.lists(st.sampled_from(FIXED), max_size=3), st.integers(0, 30), st.booleans(),
       st.data())
def test_take_batch_views_hand_out_the_built_batch_export(types, n, extra, data):
    """With ``views``, the export of the batch built is handed out (``import_kept``): it reads
    back as that batch (through a gather and as the source of another take_batch), after the
    source batch is gone; the reference hands out an export of its batch alike."""
    rng = np.random.default_rng(n)
    b = pa.RecordBatch.from_arrays([_column(t, n + 1, rng) for t in types],
                                   names=[f"c{i}" for i in range(len(types))]) if types else None
    idx = np.asarray(data.draw(st.lists(st.integers(0, n), max_size=40)), dtype=np.int64)
    m = len(idx)
    cols = [(np.arange(m, dtype=np.int64) * 3, None)] if extra or b is None else None
    schema = None if cols is None else pa.schema(
        (list(b.schema) if b is not None else []) + [pa.field("x", pa.int64())])
    rviews: list = []
    want = R.take_batch(b, idx, cols, schema, rviews)
    assert len(rviews) == 1 and want.equals(R.take_batch(b, idx, cols, schema))
    views: list = []
    got = K.take_batch(b, idx, cols, schema, views)
    assert got.equals(want)
    assert len(views) == 1 and views[0].batch is got and views[0].num_rows == m
    del b  # the export reads the built batch's own buffers
    again = arrow_c.take_batch_runs(got.schema, [[(views[0], np.arange(m))]])
    assert again is None or again.equals(got)
    tail = [(np.ones(m, np.int32), None)]
    sch = pa.schema(list(got.schema) + [pa.field("y", pa.int32())])
    both = K.take_batch(views[0], np.arange(m), tail, sch)
    assert both.select(range(got.num_columns)).equals(got)


def test_take_batch_extra_refuses_wrong_widths_and_objects():
    schema = pa.schema([pa.field("x", pa.int64())])
    with pytest.raises(ValueError):
        K.take_batch(None, None, [(np.arange(3, dtype=np.int32), None)], schema)
    with pytest.raises(TypeError):
        K.take_batch(None, None, [(np.array([1, 2], dtype=object), None)], schema)
    # a column Arrow stores as bits (bool) is not gathered: the caller falls back
    assert K.take_batch(None, None, [(np.zeros(2, np.uint8), None)],
                        pa.schema([pa.field("b", pa.bool_())])) is None


@given(st.lists(st.lists(st.sampled_from(FIXED), min_size=1, max_size=2), min_size=1,
                max_size=3), st.integers(1, 20), st.data())
def test_take_batch_runs_equals_reference(groups_types, n, data):
    """Column groups of runs over several batches (the same batch repeated, slices) side by
    side, against the reference."""
    rng = np.random.default_rng(n)
    m = data.draw(st.integers(0, 40))
    groups, fields = [], []
    for g, types in enumerate(groups_types):
        names = [f"g{g}c{i}" for i in range(len(types))]
        pool = [pa.RecordBatch.from_arrays([_column(t, n + 2, rng) for t in types],
                                           names=names).slice(data.draw(st.integers(0, 2)))
                for _ in range(data.draw(st.integers(1, 3)))]
        cuts = sorted(data.draw(st.lists(st.integers(0, m), max_size=3)))
        runs, lo = [], 0
        for hi in cuts + [m]:
            b = pool[data.draw(st.integers(0, len(pool) - 1))]
            runs.append((b, rng.integers(0, b.num_rows, hi - lo)))
            lo = hi
        groups.append(runs)
        fields += [pa.field(nm, t) for nm, t in zip(names, types)]
    schema = pa.schema(fields)
    want = R.take_batch_runs(schema, groups)
    got = K.take_batch_runs(schema, groups)
    assert got.schema == schema
    assert got.equals(want)
    # the same runs with some batches exported once (as a join passes its stored batches),
    # an export shared by several runs, and the schema's widths from the cache (second call)
    exports: dict = {}
    mixed = [[(exports.setdefault(id(b), K.export_batch(b)) if data.draw(st.booleans()) else b,
               idx) for b, idx in runs] for runs in groups]
    for _ in range(2):
        again = K.take_batch_runs(schema, mixed)
        assert again.schema == schema
        assert again.equals(want)
    assert R.take_batch_runs(schema, [[(R.export_batch(b), i) for b, i in runs]
                                      for runs in groups]).equals(want)


def test_export_batch_outlives_its_batch_and_pickles():
    """An exported batch keeps its buffers (the batch object may go), pickles as a new export
    of its batch, and names what it refuses."""
    import pickle
    b = pa.RecordBatch.from_arrays([pa.array(np.arange(5) * 3)], names=["k"])
    e = K.export_batch(b)
    assert e.num_rows == 5
    del b
    s = pa.schema([pa.field("k", pa.int64())])
    assert K.take_batch_runs(s, [[(e, np.array([4, 0]))]]).column(0).to_pylist() == [12, 0]
    e2 = pickle.loads(pickle.dumps(e))
    assert K.take_batch_runs(s, [[(e2, np.array([1]))]]).column(0).to_pylist() == [3]
    with pytest.raises(TypeError, match="export_batch"):
        K.export_batch(pa.array([1, 2]))
    with pytest.raises(IndexError):
        K.take_batch_runs(s, [[(e, np.array([5]))]])


def test_take_batch_runs_refuses_nulls_and_bad_indices():
    b = pa.RecordBatch.from_arrays([pa.array([1, None, 3])], names=["k"])
    s = pa.schema([pa.field("k", pa.int64())])
    assert K.take_batch_runs(s, [[(b, np.array([0]))]]) is None
    c = pa.RecordBatch.from_arrays([pa.array([1, 2, 3])], names=["k"])
    with pytest.raises(IndexError):
        K.take_batch_runs(s, [[(c, np.array([0])), (c, np.array([3]))]])
    with pytest.raises(ValueError):
        K.take_batch_runs(pa.schema([pa.field("k", pa.int64()), pa.field("v", pa.int64())]),
                    [[(c, np.array([0, 1]))], [(c, np.array([0]))]])


INT_KEYS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
            pa.uint64(), pa.date32(), pa.timestamp("ms"), pa.time32("s")]


@given(st.lists(st.tuples(st.sampled_from(INT_KEYS), st.booleans()), min_size=1, max_size=4),
       st.integers(1, 40), st.integers(0, 3), st.booleans(), st.data())
def test_encode_u64_equals_reference(cols, n, skip, nulls, data):
    """``KeyCodec.encode_batch`` (native ``encode_u64`` for integer / temporal keys without
    nulls) gives the codes of the reference ``_encode_u64``: signs flipped, validity bytes,
    packing order, slices; a batch with a null (or a codec that is not u64) takes the
    general path and still agrees."""
    from dbsp.algebra.codes import KeyCodec
    rng = np.random.default_rng(n + skip)
    arrays, fields = [], []
    for i, (t, nullable) in enumerate(cols):
        w = t.bit_width // 8
        lo, hi = (-(1 << (8 * w - 1)), (1 << (8 * w - 1)) - 1) if (
            pa.types.is_signed_integer(t) or not pa.types.is_integer(t)) else (0, (1 << 8 * w) - 1)
        raw = [int(x) for x in rng.integers(lo, hi, n + skip, dtype=np.int64 if hi < 2**63
                                            else np.uint64, endpoint=True)]
        storage = pa.int64() if w == 8 and t != pa.uint64() else t
        a = pa.array(raw, t if pa.types.is_integer(t) else pa.from_numpy_dtype(
            np.dtype(f"i{w}"))).cast(t) if not nulls or i else pa.array(raw[:-1] + [None], storage).cast(t)
        arrays.append(a)
        fields.append(pa.field(f"c{i}", t, nullable or (nulls and i == 0)))
    b = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields)).slice(skip)
    codec = KeyCodec(fields)
    got = codec.encode_batch(b)
    if not codec.u64:
        return  # (encode_batch is encode for var codes)
    want = codec._encode_u64(b.columns)
    assert got.dtype == np.uint64
    assert np.array_equal(got, want)
    native = arrow_c.encode_u64(b, codec._native_plan) if codec._native_plan else None
    if codec._native_plan and not any(c.null_count for c in b.columns):
        assert native is not None and np.array_equal(native, want)
    else:
        assert native is None


def test_encode_u64_is_used_for_integer_keys():
    from dbsp.algebra.codes import KeyCodec
    f = [pa.field("a", pa.int32(), False), pa.field("b", pa.int16(), True)]
    b = pa.RecordBatch.from_arrays([pa.array([-5, 7, 0], pa.int32()),
                                    pa.array([3, -1, 2], pa.int16())], schema=pa.schema(f))
    codec = KeyCodec(f)
    assert codec.u64 and codec._native_plan == [(4, True, False), (2, True, True)]
    got = arrow_c.encode_u64(b, codec._native_plan)
    assert np.array_equal(got, codec._encode_u64(b.columns))
    assert np.array_equal(codec.encode_batch(b), got)


def test_encode_u64_refuses_a_batch_of_other_widths():
    """A column narrower than the plan says is never read past its end: None (general path)."""
    b = pa.RecordBatch.from_arrays([pa.array([1, 2, 3], pa.int32())], names=["a"])
    assert arrow_c.encode_u64(b, [(8, True, False)]) is None
    assert arrow_c.encode_u64(b, [(4, True, False), (4, True, False)]) is None


_INT_KEYS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32()]


@st.composite
def grouped_batch(draw):
    """A batch of integer key columns (few distinct values: groups) and value columns, a
    u64 key plan for some of its integer columns, and weights."""
    n = draw(st.integers(1, 70))
    kts = draw(st.lists(st.sampled_from(_INT_KEYS), min_size=1, max_size=2))
    cols, fields = [], []
    for i, t in enumerate(kts):
        lo, hi = (0, 3) if pa.types.is_unsigned_integer(t) else (-2, 2)
        cols.append(pa.array(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)), t))
        fields.append(pa.field(f"k{i}", t, t.bit_width < 64 and draw(st.booleans())))
    cols.append(pa.array(np.arange(n, dtype=np.int64) * 10))
    fields.append(pa.field("v", pa.int64()))
    cols.append(pa.array(np.linspace(0, 1, n)))
    fields.append(pa.field("f", pa.float64()))
    if draw(st.booleans()):  # a value column with a null: the general path
        cols.append(pa.array([None] + [1] * (n - 1), pa.int32()))
        fields.append(pa.field("z", pa.int32()))
    batch = pa.RecordBatch.from_arrays(cols, schema=pa.schema(fields))
    key_cols = list(range(len(kts)))
    plan = [(t.bit_width // 8, pa.types.is_signed_integer(t), fields[i].nullable)
            for i, t in enumerate(kts)]
    if sum(w + nl for w, _, nl in plan) > 8:
        plan, key_cols = plan[:1], key_cols[:1]
    val_cols = draw(st.lists(st.sampled_from(range(len(kts), len(cols))), min_size=1,
                             max_size=3, unique=True))
    w = np.array(draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n)), np.int64)
    return batch, key_cols, plan, val_cols, w


def _key_val_schemas(batch: pa.RecordBatch, key_cols, val_cols) -> tuple:
    """The schemas of ``batch``'s key columns and of its value columns."""
    return (pa.schema([batch.schema.field(c) for c in key_cols]),
            pa.schema([batch.schema.field(c) for c in val_cols]))


def _same_groups(got, want) -> bool:
    """Asserts that ``group_rows`` / ``index_rows`` gave the reference's answer ``want``
    (``(keys, key codes, bounds, vals, ...)``: batches equal, arrays equal and of one dtype);
    whether there was one (not None)."""
    assert (got is None) == (want is None)
    if want is None:
        return False
    assert got[0].equals(want[0]) and got[3].equals(want[3])
    for a, b in zip(got[1:3] + got[4:], want[1:3] + want[4:]):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    return True


@given(grouped_batch())
def test_group_rows_matches_reference(case):
    batch, key_cols, plan, val_cols, w = case
    ks, vs = _key_val_schemas(batch, key_cols, val_cols)
    got = arrow_c.group_rows(batch, key_cols, plan, val_cols, w, ks, vs)
    want = R.group_rows(batch, key_cols, plan, val_cols, w, ks, vs)
    if not _same_groups(got, want):
        return
    # with numpy dtypes: the value columns again, as numpy arrays (bit for bit)
    dts = [np.dtype(f"i{batch.schema.field(c).type.bit_width // 8}") for c in val_cols]
    g2 = arrow_c.group_rows(batch, key_cols, plan, val_cols, w, ks, vs, dts)
    w2 = R.group_rows(batch, key_cols, plan, val_cols, w, ks, vs, dts)
    assert g2[3].equals(got[3]) and len(g2[5]) == len(w2[5]) == len(val_cols)
    for a, b, c in zip(g2[5], w2[5], val_cols):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a.view(batch.column(c).to_numpy().dtype),
                                      g2[3].column(val_cols.index(c)).to_numpy())
    # the codes are the key codec's
    from dbsp.algebra.codes import KeyCodec
    np.testing.assert_array_equal(got[1], KeyCodec(list(ks)).encode_batch(got[0]))


def test_group_rows_numpy_columns_are_views_that_keep_the_block_alive():
    """The numpy value columns are read-only views of the value batch's buffers (gathered once)
    and keep them alive after the batch is dropped; a dtype of another width names it."""
    import gc
    k = pa.array([3, 1, 3, 2, 1], pa.int64())
    v = pa.array([10, 20, 30, 40, 50], pa.int32())
    f = pa.array([0.5, 1.5, 2.5, 3.5, 4.5])
    batch = pa.RecordBatch.from_arrays([k, v, f], names=["k", "v", "f"])
    ks, vs = pa.schema([batch.schema.field(0)]), pa.schema(list(batch.schema)[1:])
    got = arrow_c.group_rows(batch, [0], [(8, True, False)], [1, 2], np.ones(5, np.int64), ks,
                             vs, [np.int32, np.dtype(np.float64)])
    vals, nps = got[3], got[5]
    assert [a.dtype for a in nps] == [np.int32, np.float64]
    for i, a in enumerate(nps):
        assert not a.flags.writeable
        assert a.ctypes.data == vals.column(i).buffers()[1].address
    del got, vals, batch
    gc.collect()
    np.testing.assert_array_equal(nps[0], [20, 50, 40, 10, 30])
    np.testing.assert_array_equal(nps[1], [1.5, 4.5, 3.5, 0.5, 2.5])
    with pytest.raises(ValueError, match="numpy dtype int64 for a column of 4 bytes"):
        arrow_c.group_rows(pa.RecordBatch.from_arrays([k, v, f], names=["k", "v", "f"]), [0],
                           [(8, True, False)], [1, 2], np.ones(5, np.int64), ks, vs,
                           [np.int64, np.float64])


def test_group_rows_sorts_large_and_refuses_beyond_its_limit():
    rng = np.random.default_rng(3)
    n = arrow_c.GROUP_ROWS_MAX
    k = rng.integers(-50, 50, n)
    batch = pa.RecordBatch.from_arrays([pa.array(k), pa.array(np.arange(n))], names=["k", "v"])
    ks, vs = pa.schema([batch.schema.field(0)]), pa.schema([batch.schema.field(1)])
    plan = [(8, True, False)]
    got = arrow_c.group_rows(batch, [0], plan, [1], np.ones(n, np.int64), ks, vs)
    perm = np.argsort(k, kind="stable")
    np.testing.assert_array_equal(got[3].column(0).to_numpy(), perm)
    assert arrow_c.group_rows(batch, [0], [(8, True, True)], [1], np.ones(n, np.int64), ks,
                              vs) is None  # 9 bytes: not a u64 code
    big = pa.concat_batches([batch, batch.slice(0, 1)])
    assert arrow_c.group_rows(big, [0], plan, [1], np.ones(n + 1, np.int64), ks, vs) is None
    with pytest.raises(IndexError, match="no column 5"):
        arrow_c.group_rows(batch, [5], plan, [1], np.ones(n, np.int64), ks, vs)


@st.composite
def indexed_batch(draw):
    """A batch of integer key and value columns (few distinct values: equal rows meet), its
    codecs' u64 plans, and weights (sometimes cancelling, sometimes near the int64 edge)."""
    n = draw(st.integers(1, 70))
    types = draw(st.lists(st.sampled_from(_INT_KEYS + [pa.int64(), pa.date32()]), min_size=2,
                          max_size=4))
    cols, fields = [], []
    for i, t in enumerate(types):
        lo, hi = (0, 3) if pa.types.is_unsigned_integer(t) or t == pa.date32() else (-2, 2)
        vals = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
        if draw(st.integers(0, 9)) == 0:  # a null: the general path
            vals[0] = None
        cols.append(pa.array(vals, t))
        fields.append(pa.field(f"c{i}", t, draw(st.booleans())))
    batch = pa.RecordBatch.from_arrays(cols, schema=pa.schema(fields))
    nk = draw(st.integers(1, len(types) - 1))
    big = draw(st.integers(0, 9)) == 0
    w = np.array(draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)), np.int64)
    if big:
        w[: n // 2] = np.iinfo(np.int64).max
    return batch, list(range(nk)), list(range(nk, len(types))), w


@given(indexed_batch())
def test_index_rows_matches_reference_and_from_parts(case):
    """``index_rows`` against its reference twin (same batches, codes, offsets, weights, or the
    same None), and what it returns is ``OrdIndexedZSet.from_parts`` of the same rows."""
    from dbsp.algebra.codes import KeyCodec
    from dbsp.trace.batch import OrdIndexedZSet
    batch, kcols, vcols, w = case
    ks, vs = _key_val_schemas(batch, kcols, vcols)
    kc, vc = KeyCodec(list(ks)), KeyCodec(list(vs))
    if kc._native_plan is None or vc._native_plan is None:
        return
    args = (batch, kcols, kc._native_plan, vcols, vc._native_plan, w, ks, vs)
    views: list = []
    got, want = arrow_c.index_rows(*args, views=views), R.index_rows(*args)
    if not _same_groups(got, want) or not len(got[5]):
        return
    # the exports handed out (import_kept) read as the batches they go with, alone
    assert [v.batch for v in views] == [got[0], got[3]]
    for v, part in zip(views, (got[0], got[3])):
        assert v.num_rows == part.num_rows
        again = arrow_c.take_batch_runs(part.schema, [[(v, np.arange(part.num_rows))]])
        assert again.equals(part)
    o = OrdIndexedZSet.from_parts(batch.select(kcols), batch.select(vcols), w, kc, vc)
    assert got[0].equals(o.keys) and got[3].equals(o.vals)
    for a, b in ((got[1], o.kcodes), (got[2], o.offsets), (got[4], o.vcodes),
                 (got[5], o.weights)):
        np.testing.assert_array_equal(a, b)


@given(indexed_batch(), st.integers(2, 40))
def test_index_rows_sorts_a_large_batch_with_the_sort_given(case, copies):
    """Past :data:`INDEX_ROWS_MAX` rows ``index_rows`` sorts with the ``sort`` it is given
    (the radix sort): the same answer as its reference and as ``OrdIndexedZSet.from_parts``,
    or the same None (a null, a wrapping weight sum)."""
    from dbsp.algebra.codes import KeyCodec
    from dbsp.trace.batch import OrdIndexedZSet
    batch, kcols, vcols, w = case
    reps = max(copies, arrow_c.INDEX_ROWS_MAX // batch.num_rows + 1)
    batch = pa.concat_batches([batch] * reps)  # (equal rows meet across the copies)
    w = np.tile(w, reps)
    assert batch.num_rows > arrow_c.INDEX_ROWS_MAX
    ks, vs = _key_val_schemas(batch, kcols, vcols)
    kc, vc = KeyCodec(list(ks)), KeyCodec(list(vs))
    if kc._native_plan is None or vc._native_plan is None:
        return
    args = (batch, kcols, kc._native_plan, vcols, vc._native_plan, w, ks, vs)
    assert arrow_c.index_rows(*args) is None  # no sort given: the caller's general path
    got = arrow_c.index_rows(*args, sort=K.sort_consolidate)
    want = R.index_rows(*args, sort=K.sort_consolidate)
    if not _same_groups(got, want) or not len(got[5]):
        return
    o = OrdIndexedZSet.from_parts(batch.select(kcols), batch.select(vcols), w, kc, vc)
    assert got[0].equals(o.keys) and got[3].equals(o.vals)
    for a, b in ((got[1], o.kcodes), (got[2], o.offsets), (got[4], o.vcodes),
                 (got[5], o.weights)):
        np.testing.assert_array_equal(a, b)


def test_index_rows_checks_what_its_sort_gives():
    """A large batch whose weight sums wrap is left to the general path (None); a ``sort``
    that hands back rows out of range or weights of another length is an error."""
    n = arrow_c.INDEX_ROWS_MAX + 100
    k = pa.array(np.arange(n) % 7)
    b = pa.RecordBatch.from_arrays([k, k], schema=pa.schema([pa.field("k", pa.int64(), False),
                                                             pa.field("v", pa.int64(), False)]))
    ks, vs = pa.schema([b.schema.field(0)]), pa.schema([b.schema.field(1)])
    p = [(8, True, False)]
    top = np.full(n, np.iinfo(np.int64).max, np.int64)
    assert arrow_c.index_rows(b, [0], p, [1], p, top, ks, vs, sort=K.sort_consolidate) is None
    one = np.ones(n, np.int64)
    got = arrow_c.index_rows(b, [0], p, [1], p, one, ks, vs, sort=K.sort_consolidate)
    assert len(got[1]) == 7 and int(got[5].sum()) == n
    with pytest.raises(ValueError, match="out of range"):
        arrow_c.index_rows(b, [0], p, [1], p, one, ks, vs,
                           sort=lambda kc, vc, w: (np.array([0, n]), np.ones(2, np.int64)))
    with pytest.raises(ValueError, match="weights"):
        arrow_c.index_rows(b, [0], p, [1], p, one, ks, vs,
                           sort=lambda kc, vc, w: (np.array([0, 1]), np.ones(3, np.int64)))


@pytest.mark.parametrize("n", [1, 100, 160, 161, 300, 512, 513])
def test_index_rows_hands_batches_past_its_merge_bound_to_the_sort(n):
    """Given a ``sort``, a batch of more than :data:`INDEX_MERGE_ROWS` rows is sorted by it,
    a smaller one by the merge sort inside; without one, up to :data:`INDEX_ROWS_MAX` rows are
    merge-sorted. Every way gives the same answer."""
    rng = np.random.default_rng(n)
    k, v = pa.array(rng.integers(0, 40, n)), pa.array(rng.integers(0, 3, n))
    b = pa.RecordBatch.from_arrays([k, v], schema=pa.schema([pa.field("k", pa.int64(), False),
                                                             pa.field("v", pa.int64(), False)]))
    ks, vs = pa.schema([b.schema.field(0)]), pa.schema([b.schema.field(1)])
    p = [(8, True, False)]
    w = rng.integers(-2, 3, n).astype(np.int64)
    calls = []

    def counted(*a):
        calls.append(len(a[0]))
        return K.sort_consolidate(*a)
    got = arrow_c.index_rows(b, [0], p, [1], p, w, ks, vs, sort=counted)
    assert calls == ([n] if n > arrow_c.INDEX_MERGE_ROWS else [])
    plain = arrow_c.index_rows(b, [0], p, [1], p, w, ks, vs)
    assert (plain is None) == (n > arrow_c.INDEX_ROWS_MAX)
    want = R.index_rows(b, [0], p, [1], p, w, ks, vs, sort=K.sort_consolidate)
    assert _same_groups(got, want)
    if plain is not None:
        assert _same_groups(plain, want)


def test_index_rows_refuses_what_it_does_not_index():
    """None for a large batch, wide codes, a null, or a wrapping weight sum; IndexError for a
    column that is not there."""
    n = arrow_c.INDEX_ROWS_MAX
    k = pa.array(np.arange(n + 1) % 7)
    b = pa.RecordBatch.from_arrays([k, k], schema=pa.schema([pa.field("k", pa.int64(), False),
                                                             pa.field("v", pa.int64(), False)]))
    ks, vs = pa.schema([b.schema.field(0)]), pa.schema([b.schema.field(1)])
    p = [(8, True, False)]
    one = np.ones(n + 1, np.int64)
    assert arrow_c.index_rows(b, [0], p, [1], p, one, ks, vs) is None  # past the limit
    s = b.slice(0, n)
    got = arrow_c.index_rows(s, [0], p, [1], p, one[:n], ks, vs)
    assert got is not None and len(got[1]) == 7 and int(got[5].sum()) == n
    assert arrow_c.index_rows(s, [0], [(8, True, True)], [1], p, one[:n], ks, vs) is None
    top = np.full(n, np.iinfo(np.int64).max, np.int64)
    assert arrow_c.index_rows(s, [0], p, [1], p, top, ks, vs) is None  # sums wrap
    with pytest.raises(IndexError, match="no column 5"):
        arrow_c.index_rows(s, [5], p, [1], p, one[:n], ks, vs)


@given(st.lists(st.sampled_from([pa.int64(), pa.float64(), pa.int32(), pa.timestamp("us")]),
                min_size=1, max_size=4), st.integers(0, 30), st.integers(1, 20), st.data())
def test_pick_batch_matches_reference_and_pick_rows(types, m, G, data):
    """``pick_batch`` against its reference twin and ``pick_rows`` column by column: row ``r``
    from the old arrays where ``is_old[r]``, else from the new ones, bit for bit."""
    rng = np.random.default_rng(m * 31 + G)
    dts = [np.dtype(f"i{t.bit_width // 8}") if t != pa.float64() else np.dtype("f8")
           for t in types]
    olds = [rng.integers(-9, 9, G).astype(d) for d in dts]
    news = [rng.integers(-9, 9, G).astype(d) for d in dts]
    g = np.asarray(data.draw(st.lists(st.integers(0, G - 1), min_size=m, max_size=m)), np.int64)
    is_old = rng.random(m) < 0.5
    schema = pa.schema([pa.field(f"c{i}", t) for i, t in enumerate(types)])
    got = arrow_c.pick_batch(g, is_old, olds, news, schema)
    want = R.pick_batch(g, is_old, olds, news, schema)
    assert got.equals(want) and got.schema == schema
    for c, (o, n) in enumerate(zip(olds, news)):
        np.testing.assert_array_equal(
            np.asarray(got.column(c).view(pa.from_numpy_dtype(np.dtype(f"i{o.itemsize}")))
                       .to_numpy()).view(o.dtype),
            R.pick_rows(g, is_old, o, n))


def test_pick_batch_refuses_bad_arrays():
    """None for a column that is not fixed-width; IndexError past an array's end; ValueError for
    arrays that do not match the schema."""
    s = pa.schema([pa.field("x", pa.int64())])
    a = np.arange(3, dtype=np.int64)
    g, old = np.array([0, 2], np.int64), np.array([True, False])
    for mod in (arrow_c, R):
        assert mod.pick_batch(g, old, [a], [a], pa.schema([pa.field("s", pa.string())])) is None
        with pytest.raises(IndexError):
            mod.pick_batch(np.array([0, 3], np.int64), old, [a], [a], s)
        with pytest.raises(ValueError):
            mod.pick_batch(g, old, [a.astype(np.int32)], [a], s)
        with pytest.raises(ValueError):
            mod.pick_batch(g, old[:1], [a], [a], s)


@given(st.lists(st.integers(-2 ** 63, 2 ** 63 - 1) | st.integers(-3, 3) |
                st.sampled_from([0, 16, 32, 2 ** 60, -2 ** 60]), min_size=1, max_size=300))
def test_group_rows_hash_grouping_is_a_stable_sort(keys):
    """Groups found through the hash table (collisions, many or few distinct codes): the
    distinct codes ascending and each group's rows in input order, as a stable sort gives."""
    n = len(keys)
    k = np.array(keys, np.int64)
    batch = pa.RecordBatch.from_arrays([pa.array(k), pa.array(np.arange(n))], names=["k", "v"])
    ks, vs = pa.schema([batch.schema.field(0)]), pa.schema([batch.schema.field(1)])
    got = arrow_c.group_rows(batch, [0], [(8, True, False)], [1], np.arange(n, dtype=np.int64),
                             ks, vs)
    perm = np.argsort(k, kind="stable")
    np.testing.assert_array_equal(got[3].column(0).to_numpy(), perm)
    np.testing.assert_array_equal(got[4], perm)
    uniq, first = np.unique(k, return_index=True)
    np.testing.assert_array_equal(got[0].column(0).to_numpy(), uniq)
    np.testing.assert_array_equal(got[2], np.append(np.searchsorted(k[perm], uniq), n))
