"""Batches against nested-dict models: build, k-way merge (k = 1..6), and the zero-copy slices
and row filters the spine and the cursors use (``OrdZSet.slice``/``filter_rows``,
``OrdIndexedZSet.slice_keys``/``filter_rows``)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st
from trace_model import (
    add_into,
    check_indexed,
    check_zset,
    examples,
    indexed,
    indexed_model,
    indexed_rows,
    rows,
    schemas,
    state_of,
    zset,
    zset_model,
)

from dbsp.trace.batch import OrdIndexedZSet, OrdZSet

SETTINGS = settings(max_examples=examples(60), deadline=None)


@SETTINGS
@given(st.data())
def test_zset_build_and_merge(data):
    s = data.draw(schemas(1, 3))
    k = data.draw(st.integers(1, 6))
    parts = [data.draw(rows(s)) for _ in range(k)]
    batches = [zset(s, p) for p in parts]
    for b, p in zip(batches, parts):
        check_zset(b)
        assert b.to_dict() == zset_model(p)
    nonempty = [b for b in batches if len(b)]
    model = zset_model([r for p in parts for r in p])
    if nonempty:
        m = OrdZSet.merge(nonempty)
        check_zset(m)
        assert m.to_dict() == model
    else:
        assert model == {}


@SETTINGS
@given(st.data())
def test_indexed_build_and_merge(data):
    ks, vs = data.draw(schemas(1, 2, "k")), data.draw(schemas(0, 2, "v"))
    k = data.draw(st.integers(1, 6))
    parts = [data.draw(indexed_rows(ks, vs)) for _ in range(k)]
    batches = [indexed(ks, vs, p) for p in parts]
    for b, p in zip(batches, parts):
        check_indexed(b)
        assert state_of([b]) == indexed_model(p)
    nonempty = [b for b in batches if len(b)]
    model = indexed_model([r for p in parts for r in p])
    if nonempty:
        m = OrdIndexedZSet.merge(nonempty)
        check_indexed(m)
        assert state_of([m]) == model


@SETTINGS
@given(st.data())
def test_slices_and_filters(data):
    ks, vs = data.draw(schemas(1, 2, "k")), data.draw(schemas(1, 1, "v"))
    b = indexed(ks, vs, data.draw(indexed_rows(ks, vs, 20)))
    lo = data.draw(st.integers(0, b.num_keys))
    hi = data.draw(st.integers(lo, b.num_keys))
    s = b.slice_keys(lo, hi)
    check_indexed(s)
    keys = b.keys.to_pylist()
    want = {kv: w for kv, w in state_of([b]).items()
            if kv[0] in {tuple(r.values()) for r in keys[lo:hi]}}
    assert state_of([s]) == want
    mask = np.asarray(data.draw(st.lists(st.booleans(), min_size=len(b), max_size=len(b))), bool)
    f = b.filter_rows(mask)
    check_indexed(f)
    flat = list(zip(b.key_rows().to_pylist(), b.vals.to_pylist(), b.weights.tolist()))
    want = add_into({}, (((tuple(k.values()), tuple(v.values())), w)
                         for (k, v, w), m in zip(flat, mask) if m))
    assert state_of([f]) == want

    z = zset(ks, data.draw(rows(ks, 20)))
    lo = data.draw(st.integers(0, len(z)))
    hi = data.draw(st.integers(lo, len(z)))
    zs = z.slice(lo, hi)
    check_zset(zs)
    assert zs.to_dict() == dict(list(z.to_dict().items())[lo:hi])
    mask = np.asarray(data.draw(st.lists(st.booleans(), min_size=len(z), max_size=len(z))), bool)
    zf = z.filter_rows(mask)
    check_zset(zf)
    assert zf.to_dict() == {r: w for (r, w), m in zip(z.to_dict().items(), mask) if m}


def test_var_code_slice_keeps_absolute_offsets():
    ks = pa.schema([("k", pa.string())])
    vs = pa.schema([("v", pa.string())])
    b = indexed(ks, vs, [(("a",), ("x",), 1), (("b",), ("y",), 2), (("c",), ("z",), 3)])
    s = b.slice_keys(1, 3)
    assert s.kcodes.offsets[0] > 0  # a view, not a copy
    assert state_of([s]) == {(("b",), ("y",)): 2, (("c",), ("z",)): 3}
    assert state_of([OrdIndexedZSet.merge([s, b.slice_keys(0, 1)])]) == state_of([b])


@example(rws=[((0,), 1), ((0,), -1)])
@given(rws=rows(pa.schema([("c0", pa.int64())])))
def test_full_cancellation_is_empty(rws):
    s = pa.schema([("c0", pa.int64())])
    z = zset(s, rws + [(r, -w) for r, w in rws])
    assert len(z) == 0


def test_no_value_columns():
    """Shrunk counterexample: a binary key and no value columns (one code per row still)."""
    ks = pa.schema([pa.field("k0", pa.binary(), nullable=False)])
    vs = pa.schema([])
    b = indexed(ks, vs, [((b"",), (), -2)])
    check_indexed(b)
    assert state_of([b]) == {((b"",), ()): -2}
    m = OrdIndexedZSet.merge([b, indexed(ks, vs, [((b"",), (), 2), ((b"x",), (), 1)])])
    assert state_of([m]) == {((b"x",), ()): 1}


def test_nbytes_upper_bounds_nbytes_in_memory():
    """``nbytes_upper`` (whole Arrow buffers, no walk: the spine's trim check) is never below a
    batch's bytes in memory, sliced or not, so a merge that would trim is never missed; once
    ``nbytes_in_memory`` is known it is that value."""
    z = OrdZSet.from_arrow(pa.record_batch([pa.array(np.arange(1000)),
                                            pa.array([str(i) for i in range(1000)])],
                                           names=["x", "s"]))
    ix = z.index_by(["x"])
    for b in (z, z.slice(10, 500), ix, ix.slice_keys(3, 700)):
        up = b.nbytes_upper
        assert up >= b.nbytes_in_memory > 0
        assert b.nbytes_upper == b.nbytes_in_memory  # cached once computed


def test_memo_counts_in_nbytes_in_memory():
    """What a reader memoizes on a stored batch (a rank directory, a sample of its key codes, a
    converted value column) is part of its bytes in memory, so the memory accountant and a spill
    see it; a memoized view of the batch's own buffers is not counted twice."""
    from dbsp.trace.batch import memoized
    sch = pa.schema([pa.field("k", pa.int64(), nullable=False),
                     pa.field("v", pa.int64(), nullable=False)])
    keys = np.arange(0, 70000, 7)  # u64 codes that do not fill their range: a rank directory
    z = OrdZSet.from_arrow(pa.record_batch([pa.array(keys), pa.array(keys * 3)], schema=sch))
    ix = z.index_by(["k"])
    base = ix.nbytes_in_memory
    rank = ix.code_rank()
    assert rank is not None and rank.flags.owndata
    own = rank.nbytes
    assert ix.nbytes_in_memory == base + own
    assert ix.nbytes_upper == ix.nbytes_in_memory
    memoized(ix, "view", lambda: ix.weights[:10])  # a view: no new bytes
    memoized(ix, "pair", lambda: (np.zeros(100, np.int64), ix.weights[:5]))
    assert ix.nbytes_in_memory == base + own + 800
    memoized(ix, "pair", lambda: np.zeros(10**6))  # already kept: not made, not counted again
    assert ix.nbytes_in_memory == base + own + 800
