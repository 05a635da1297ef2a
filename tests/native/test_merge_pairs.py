"""dbsp._native.merge_pairs against kernels_ref: the (u64 key, u64 value) loser tree behind
``merge_consolidate`` and the fused merge-and-regroup ``merge_indexed`` of indexed batches;
k = 1..6 runs, empty runs, all-equal rows, cancelling weights and codes at the u64 extremes
(an all-ones row must still beat an exhausted run)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from dbsp._native import arrow_c
from dbsp._native import merge_pairs as native
from hypothesis import example, given
from hypothesis import strategies as st

from dbsp.algebra import kernels_ref as ref

TOP = 2 ** 64 - 1


@st.composite
def pair_run(draw, high):
    """Sorted, consolidated (kcodes, vcodes, weights), u64."""
    n = draw(st.integers(0, 30))
    pick = st.integers(0, high) | st.sampled_from([0, TOP])
    k = np.asarray(draw(st.lists(pick, min_size=n, max_size=n)), dtype=np.uint64)
    v = np.asarray(draw(st.lists(st.integers(0, 3) | st.just(TOP), min_size=n, max_size=n)),
                   dtype=np.uint64)
    w = np.asarray(draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)), dtype=np.int64)
    perm, w = ref.sort_consolidate(k, v, w)
    return k[perm], v[perm], w


@st.composite
def pair_runs(draw):
    high = draw(st.sampled_from([0, 3, 40, TOP]))
    return [draw(pair_run(high)) for _ in range(draw(st.integers(1, 6)))]


def as_indexed(run):
    """A (k, v, w) run as an indexed batch's (distinct kcodes, offsets, vcodes, weights)."""
    k, v, w = run
    b = ref.group_bounds(k) if len(k) else np.zeros(1, np.int64)
    return k[b[:-1]], b, v, w


def same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


@given(pair_runs())
@example([(np.array([TOP], np.uint64), np.array([TOP], np.uint64), np.array([1])),
          (np.array([3], np.uint64), np.array([0], np.uint64), np.array([2]))])
@example([(np.array([1, 1], np.uint64), np.array([0, 1], np.uint64), np.array([1, 1])),
          (np.array([1, 1], np.uint64), np.array([0, 1], np.uint64), np.array([-1, -1]))])
def test_pairs_match_reference(rs):
    same(native.merge_consolidate(rs), ref.merge_consolidate(rs))


@given(pair_runs())
@example([(np.array([5], np.uint64), np.array([1], np.uint64), np.array([1])),
          (np.array([5], np.uint64), np.array([1], np.uint64), np.array([-1])),
          (np.array([5], np.uint64), np.array([2], np.uint64), np.array([4]))])
def test_indexed_matches_reference(rs):
    ix = [as_indexed(r) for r in rs]
    same(native.merge_indexed(ix), ref.merge_indexed(ix))


def test_other_shapes_go_to_the_generic_merge():
    u = np.array([1, 2], np.uint64)
    w = np.array([1, 1])
    same(native.merge_consolidate([(u, None, w), (u, None, w)]),
         ref.merge_consolidate([(u, None, w), (u, None, w)]))
    same(native.merge_consolidate([]), ref.merge_consolidate([]))


def test_indexed_skips_keys_without_rows():
    # a key with an empty row range (not produced by the engine, but accepted)
    kc = np.array([1, 2, 3], np.uint64)
    off = np.array([0, 1, 1, 2], np.int64)
    v = np.array([7, 8], np.uint64)
    got = native.merge_indexed([(kc, off, v, np.array([1, 1])),
                                (np.array([2], np.uint64), np.array([0, 1]),
                                 np.array([7], np.uint64), np.array([1]))])
    gidx, w, vc, kcodes, offsets, ksrc = got
    assert kcodes.tolist() == [1, 2, 3] and offsets.tolist() == [0, 1, 2, 3]
    assert vc.tolist() == [7, 7, 8] and ksrc.tolist() == [0, 3, 2] and gidx.tolist() == [0, 2, 1]


def test_bad_indexed_runs_are_refused():
    k = np.array([1], np.uint64)
    with pytest.raises(ValueError, match="offsets"):
        native.merge_indexed([(k, np.array([0, 2]), np.array([1], np.uint64), np.array([1]))])
    with pytest.raises(ValueError, match="weights"):
        native.merge_indexed([(k, np.array([0, 1]), np.array([1], np.uint64), np.array([1, 1]))])
    with pytest.raises(TypeError, match="u64"):
        native.merge_indexed([(k, np.array([0, 1]), np.array([1], np.int64), np.array([1]))])


@pytest.mark.parametrize("k", [2, 4, 7])
def test_large_random(k):
    rng = np.random.default_rng(k)
    rs = []
    for _ in range(k):
        n = 20_000
        kk = rng.integers(0, 5_000, n).astype(np.uint64)
        vv = rng.integers(0, 50, n).astype(np.uint64)
        perm, w = ref.sort_consolidate(kk, vv, rng.integers(-1, 2, n))
        rs.append((kk[perm], vv[perm], w))
    flat_k = np.concatenate([r[0] for r in rs])
    flat_v = np.concatenate([r[1] for r in rs])
    flat_w = np.concatenate([r[2] for r in rs])
    # the sum by sort (numpy) against the merge
    order = np.lexsort((flat_v, flat_k))
    gidx, w = native.merge_consolidate(rs)
    key = (flat_k[order].astype(object) << 64) | flat_v[order].astype(object)
    sums: dict = {}
    for c, x in zip(key.tolist(), flat_w[order].tolist()):
        sums[c] = sums.get(c, 0) + x
    want = [(c, s) for c, s in sums.items() if s]
    got = [((int(flat_k[g]) << 64) | int(flat_v[g]), int(x)) for g, x in zip(gidx, w)]
    assert got == want
    ix = native.merge_indexed([as_indexed(r) for r in rs])
    np.testing.assert_array_equal(ix[0], gidx)
    np.testing.assert_array_equal(ix[1], w)


@st.composite
def indexed_runs_with_cols(draw):
    """Indexed runs plus value columns of mixed widths (int64, int32, uint8, float64)."""
    rs = [as_indexed(r) for r in draw(pair_runs())]
    out = []
    for r in rs:
        n = len(r[2])
        ints = st.lists(st.integers(-2**31, 2**31 - 1), min_size=n, max_size=n)
        out.append(r + ((np.asarray(draw(ints), np.int64), np.asarray(draw(ints), np.int32),
                         np.asarray(draw(ints), np.int64).astype(np.uint8),
                         np.asarray(draw(ints), np.float64) / 3),))
    return out


@given(indexed_runs_with_cols())
@example([(np.array([5], np.uint64), np.array([0, 1]), np.array([1], np.uint64), np.array([1]),
           (np.array([7]),)),
          (np.array([5], np.uint64), np.array([0, 1]), np.array([1], np.uint64), np.array([-1]),
           (np.array([8]),)),
          (np.array([5], np.uint64), np.array([0, 1]), np.array([2], np.uint64), np.array([4]),
           (np.array([9]),))])
def test_indexed_gathering_columns_matches_reference(rs):
    got, want = native.merge_indexed_cols(rs), ref.merge_indexed_cols(rs)
    same(got[1:], want[1:])
    same(got[0], want[0])
    # and the same rows merge_indexed names by index
    gidx = native.merge_indexed([r[:4] for r in rs])[0]
    for j, col in enumerate(got[0]):
        np.testing.assert_array_equal(col, np.concatenate([r[4][j] for r in rs])[gidx])


@given(st.data())
def test_indexed_gathering_one_8_byte_column(data):
    """One 8-byte value column (int64 or float64: the single load and store of the common
    shape) gathers the same rows as the reference."""
    rs = [as_indexed(r) for r in data.draw(pair_runs())]
    dt = data.draw(st.sampled_from([np.int64, np.float64, np.uint64]))
    rs = [r + ((np.asarray(data.draw(st.lists(st.integers(-2**40, 2**40), min_size=len(r[2]),
                                                max_size=len(r[2])))).astype(dt),),)
          for r in rs]
    got, want = native.merge_indexed_cols(rs), ref.merge_indexed_cols(rs)
    same(got[1:], want[1:])
    same(got[0], want[0])


def test_indexed_gathering_checks_its_columns():
    run = (np.array([1], np.uint64), np.array([0, 1]), np.array([0], np.uint64), np.array([1]))
    with pytest.raises(ValueError):
        native.merge_indexed_cols([run + ((np.array([1, 2]),),), run + ((np.array([1]),),)])
    with pytest.raises(ValueError):
        native.merge_indexed_cols([run + ((np.array([1]),),),
                                   run + ((np.array([1], np.int32),),)])
    with pytest.raises(ValueError):
        native.merge_indexed_cols([run])


@st.composite
def two_runs(draw):
    """Exactly two non-empty runs: the merge with two cursors and no tree."""
    high = draw(st.sampled_from([0, 3, 40, TOP]))
    one = (np.array([1], np.uint64), np.array([0], np.uint64), np.array([1], np.int64))
    runs = [draw(pair_run(high)) for _ in range(2)]
    return [r if len(r[0]) else one for r in runs]


@given(two_runs())
@example([(np.array([5, 6], np.uint64), np.array([1, 1], np.uint64), np.array([2, 1])),
          (np.array([5], np.uint64), np.array([1], np.uint64), np.array([-2]))])
@example([(np.array([TOP], np.uint64), np.array([TOP], np.uint64), np.array([2 ** 63 - 1])),
          (np.array([TOP], np.uint64), np.array([TOP], np.uint64), np.array([-1]))])
def test_two_indexed_runs_match_reference(rs):
    ix = [as_indexed(r) for r in rs]
    same(native.merge_indexed(ix), ref.merge_indexed(ix))
    same(native.merge_indexed(ix[::-1]), ref.merge_indexed(ix[::-1]))


def test_two_indexed_runs_wrap_and_skip_keys_without_rows():
    """A wrapping sum of two equal rows is refused; keys without rows (at the start, between
    keys, at the end) are skipped by both cursors."""
    top = np.iinfo(np.int64).max
    a = (np.array([1], np.uint64), np.array([0, 1]), np.array([0], np.uint64), np.array([top]))
    with pytest.raises(OverflowError):
        native.merge_indexed([a, a])
    b = (np.array([0, 1, 2, 3], np.uint64), np.array([0, 0, 2, 2, 3]),
         np.array([4, 5, 1], np.uint64), np.array([1, 1, 1]))
    c = (np.array([1, 3, 4], np.uint64), np.array([0, 1, 2, 2]),
         np.array([5, 0], np.uint64), np.array([-1, 7]))
    same(native.merge_indexed([b, c]), ref.merge_indexed([b, c]))
    same(native.merge_indexed([c, b]), ref.merge_indexed([c, b]))


# --- merge_indexed_batches: the whole merge of fixed-width batches in one call ----------------

_KEY_TYPES = [pa.int64(), pa.int32(), pa.uint16(), pa.timestamp("us"), pa.date32()]
_VAL_TYPES = [pa.int64(), pa.float64(), pa.int8(), pa.uint32(), pa.timestamp("ns")]


def _col(draw, t: pa.DataType, n: int) -> pa.Array:
    ints = draw(st.lists(st.integers(-100, 100), min_size=n, max_size=n))
    if pa.types.is_floating(t):
        return pa.array(np.asarray(ints, np.float64) / 3, t)
    if pa.types.is_unsigned_integer(t):
        return pa.array(np.abs(np.asarray(ints, np.int64)), t)
    if pa.types.is_date(t):
        return pa.array(np.asarray(ints, np.int32), pa.int32()).cast(t)
    return pa.array(np.asarray(ints, np.int64), pa.int64()).cast(t)


@st.composite
def indexed_runs_with_batches(draw):
    """Indexed runs with key and value record batches of random fixed-width types (2 key
    columns at most, 1-3 value columns), some of them slices (an offset into their buffers)."""
    ktypes = draw(st.lists(st.sampled_from(_KEY_TYPES), min_size=1, max_size=2))
    vtypes = draw(st.lists(st.sampled_from(_VAL_TYPES), min_size=1, max_size=3))
    ks = pa.schema([pa.field(f"k{i}", t) for i, t in enumerate(ktypes)])
    vs = pa.schema([pa.field(f"v{i}", t, nullable=False) for i, t in enumerate(vtypes)])
    out = []
    for r in (as_indexed(r) for r in draw(pair_runs())):
        nk, n = len(r[0]), len(r[2])
        pad = draw(st.integers(0, 3))  # sliced batches: columns start past their buffers' start
        kb = pa.record_batch([_col(draw, t, nk + pad) for t in ktypes], schema=ks).slice(pad)
        vb = pa.RecordBatch.from_arrays([_col(draw, t, n + pad) for t in vtypes],
                                        schema=vs).slice(pad)
        out.append(r + (kb, vb))
    return out, ks, vs


@given(indexed_runs_with_batches())
@example(([(np.array([5], np.uint64), np.array([0, 1]), np.array([1], np.uint64), np.array([1]),
            pa.record_batch([pa.array([50])], names=["k"]),
            pa.record_batch([pa.array([7])], names=["v"])),
           (np.array([5, 6], np.uint64), np.array([0, 1, 2]), np.array([1, 2], np.uint64),
            np.array([-1, 3]), pa.record_batch([pa.array([50, 60])], names=["k"]),
            pa.record_batch([pa.array([8, 9])], names=["v"]))],
          pa.schema([("k", pa.int64())]), pa.schema([("v", pa.int64())])))
def test_indexed_batches_match_reference(case):
    rs, ks, vs = case
    got, want = native.merge_indexed_batches(rs, ks, vs), ref.merge_indexed_batches(rs, ks, vs)
    assert got is not None and want is not None
    same(got[1:3] + got[4:], want[1:3] + want[4:])
    assert got[0].schema == ks and got[3].schema == vs
    assert got[0].equals(want[0]) and got[3].equals(want[3])
    assert got[0].num_rows == len(got[1]) and got[3].num_rows == len(got[5])


@given(indexed_runs_with_batches(), st.data())
def test_indexed_batches_read_and_hand_out_exports(case, data):
    """Inputs given as kept exports (``export_batch``, or the free exports ``views`` hands out
    of a merge's output, ``arrow_c.import_kept``) merge as the batches themselves; the
    exports handed out read as the batches they go with, after those are the only owners."""
    rs, ks, vs = case
    mixed = [r[:4] + tuple(arrow_c.export_batch(b) if data.draw(st.booleans()) else b
                           for b in r[4:]) for r in rs]
    views, rviews = [], []
    got = native.merge_indexed_batches(mixed, ks, vs, views=views)
    want = ref.merge_indexed_batches(rs, ks, vs, views=rviews)
    same(got[1:3] + got[4:], want[1:3] + want[4:])
    assert got[0].equals(want[0]) and got[3].equals(want[3])
    assert len(views) == 2 and views[0].batch is got[0] and views[1].batch is got[3]
    assert rviews[0] is want[0] and rviews[1] is want[3]
    del mixed
    # the output merged with itself through its views: every weight doubled
    out = got[1:3] + (got[4],) + (got[5],)
    twice = native.merge_indexed_batches([out + tuple(views), out + tuple(views)], ks, vs)
    again = ref.merge_indexed_batches([out + got[:1] + got[3:4]] * 2, ks, vs)
    same(twice[1:3] + twice[4:], again[1:3] + again[4:])
    assert twice[0].equals(again[0]) and twice[3].equals(again[3])


def test_indexed_batches_refuse_what_they_cannot_gather():
    """Nulls, strings, booleans or no value column: None (the caller's general path); bad
    runs: an error."""
    codes = (np.array([1], np.uint64), np.array([0, 1]), np.array([0], np.uint64), np.array([1]))
    k = pa.record_batch([pa.array([1])], names=["k"])
    for v in (pa.record_batch([pa.array([None], pa.int64())], names=["v"]),
              pa.record_batch([pa.array(["a"])], names=["v"]),
              pa.record_batch([pa.array([True])], names=["v"]),
              pa.RecordBatch.from_pylist([{}], schema=pa.schema([]))):
        rs = [codes + (k, v), codes + (k, v)]
        assert native.merge_indexed_batches(rs, k.schema, v.schema) is None
        assert ref.merge_indexed_batches(rs, k.schema, v.schema) is None
    v = pa.record_batch([pa.array([1])], names=["v"])
    with pytest.raises(ValueError, match="a run is"):
        native.merge_indexed_batches([codes + (k,)], k.schema, v.schema)
    with pytest.raises(ValueError, match="offsets"):
        native.merge_indexed_batches([(codes[0], np.array([0, 2]), codes[2], codes[3], k, v)],
                                     k.schema, v.schema)
    with pytest.raises(OverflowError):
        big = (codes[0], codes[1], codes[2], np.array([2**62]), k, v)
        native.merge_indexed_batches([big, big], k.schema, v.schema)
