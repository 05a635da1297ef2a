"""dbsp._native.merge_pairs against kernels_ref: the (u64 key, u64 value) loser tree behind
``merge_consolidate`` and the fused merge-and-regroup ``merge_indexed`` of indexed batches;
k = 1..6 runs, empty runs, all-equal rows, cancelling weights and codes at the u64 extremes
(an all-ones row must still beat an exhausted run)."""
from __future__ import annotations

import numpy as np
import pytest
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
