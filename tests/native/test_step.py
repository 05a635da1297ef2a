"""dbsp._native.step against kernels_ref: is_identity and mul_checked (the small-step path)."""
from __future__ import annotations

import numpy as np
import pytest
from dbsp._native import step as native
from hypothesis import example, given
from hypothesis import strategies as st

from dbsp.algebra import kernels_ref as ref

I64 = st.integers(-2 ** 63, 2 ** 63 - 1) | st.sampled_from(
    [0, 1, -1, 2 ** 31, -2 ** 31, 2 ** 32 + 1, 3037000499, 3037000500, -2 ** 63, 2 ** 63 - 1])


@given(st.lists(st.integers(0, 6), max_size=8))
@example([])
@example([0, 1, 2])
@example([1, 0])
def test_is_identity(idx):
    a = np.asarray(idx, dtype=np.int64)
    assert native.is_identity(a) == ref.is_identity(a)
    assert native.is_identity(a.astype(np.uint64)) == ref.is_identity(a)


@given(st.lists(st.tuples(I64, I64), max_size=40))
def test_mul_checked(pairs):
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    w, over = native.mul_checked(a, b)
    rw, rover = ref.mul_checked(a, b)
    np.testing.assert_array_equal(w, rw)  # wrapped products agree, overflowing ones included
    if rover is None:
        assert over is None
    else:
        np.testing.assert_array_equal(over, rover)
    exact = [x * y for x, y in pairs]
    want = [not -2 ** 63 <= e < 2 ** 63 for e in exact]
    assert (over is not None and over.tolist() == want) or (over is None and not any(want))


def test_mul_checked_lengths():
    with pytest.raises(ValueError, match="weights"):
        native.mul_checked(np.ones(2, np.int64), np.ones(3, np.int64))


@st.composite
def matched_batches(draw):
    """Offsets and weights of two indexed batches and a matching of some of their keys."""
    def batch():
        sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=5))
        offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        w = np.array(draw(st.lists(I64, min_size=int(offs[-1]), max_size=int(offs[-1]))),
                     dtype=np.int64)
        return offs, w
    (xo, xw), (yo, yw) = batch(), batch()
    n = min(len(xo), len(yo)) - 1
    ai = sorted(draw(st.sets(st.integers(0, len(xo) - 2), max_size=n)))
    bi = sorted(draw(st.sets(st.integers(0, len(yo) - 2), min_size=len(ai), max_size=len(ai))))
    return xo, np.array(ai, np.int64), yo, np.array(bi, np.int64), xw, yw


@given(matched_batches())
def test_join_matched_pairs(case):
    got = native.join_matched_pairs(*case)
    want = ref.join_matched_pairs(*case)
    for a, b in zip(got[:4], want[:4]):
        np.testing.assert_array_equal(a, b)
    assert (got[4] is None) == (want[4] is None)
    if want[4] is not None:
        np.testing.assert_array_equal(got[4], want[4])


@st.composite
def unit_matched_batches(draw):
    """:func:`matched_batches` where a side may hold one value of weight 1 per key, and the
    flags that say so."""
    xo, ai, yo, bi, xw, yw = draw(matched_batches())
    flags = []
    sides = []
    for o, w in ((xo, xw), (yo, yw)):
        unit = draw(st.booleans())
        if unit:
            o = np.arange(len(o), dtype=np.int64)
            w = np.ones(len(o) - 1, np.int64)
        flags.append(unit)
        sides.append((o, w))
    (xo, xw), (yo, yw) = sides
    return (xo, ai, yo, bi, xw, yw), flags


@given(unit_matched_batches())
def test_join_matched_pairs_unit_sides(case):
    """A side said to hold one value of weight 1 per key is not read: the same pairs."""
    args, (xu, yu) = case
    got = native.join_matched_pairs(*args, x_unit=xu, y_unit=yu)
    want = ref.join_matched_pairs(*args, x_unit=xu, y_unit=yu)
    for a, b in zip(got[:4], want[:4]):
        assert a.dtype == b.dtype == np.int64
        np.testing.assert_array_equal(a, b)
    assert (got[4] is None) == (want[4] is None)
    if want[4] is not None:
        np.testing.assert_array_equal(got[4], want[4])
    if xu or yu:
        assert got[4] is None  # a product with a weight of 1 never overflows


def test_join_matched_pairs_unit_needs_one_value_per_key():
    o = np.array([0, 2], np.int64)
    w = np.ones(2, np.int64)
    for impl in (native, ref):
        with pytest.raises(ValueError, match="one value"):
            impl.join_matched_pairs(o, np.array([0]), o, np.array([0]), w, w, y_unit=True)


def test_join_matched_pairs_checks_its_indices():
    o = np.array([0, 1], np.int64)
    with pytest.raises(IndexError):
        native.join_matched_pairs(o, np.array([1]), o, np.array([0]), np.ones(1, np.int64),
                                  np.ones(1, np.int64))
