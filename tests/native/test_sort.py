"""dbsp._native.sort against kernels_ref: argsort and sort_consolidate on u64, var and (k, v)."""
from __future__ import annotations

import numpy as np
import pytest
from dbsp._native import sort as native
from hypothesis import example, given
from hypothesis import strategies as st

from dbsp.algebra import kernels_ref as ref
from dbsp.algebra.codes import VarCodes

from ._strategies import codes_of, u64_codes, var_codes


def same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype == np.int64
    np.testing.assert_array_equal(a, b)


@st.composite
def rows_kv(draw, kinds=("u64", "var")):
    """(k, v) code arrays of equal length, each u64 or var, from small domains (ties in k)."""
    n = draw(st.integers(0, 80))
    kk, vk = draw(st.sampled_from(kinds)), draw(st.sampled_from(kinds))
    hk = draw(st.sampled_from([2, 10, 2 ** 64 - 1]))
    hv = draw(st.sampled_from([2, 10, 2 ** 64 - 1]))
    k = draw(st.lists(st.integers(0, hk), min_size=n, max_size=n))
    v = draw(st.lists(st.integers(0, hv), min_size=n, max_size=n))
    return codes_of(kk, k), codes_of(vk, v)


weights_for = lambda n: st.lists(st.integers(-3, 3), min_size=n, max_size=n).map(
    lambda w: np.asarray(w, dtype=np.int64))


@given(u64_codes())
@example(np.zeros(0, np.uint64))
@example(np.array([3, 1, 3, 0, 1], np.uint64))
@example(np.array([2 ** 64 - 1, 0, 2 ** 63], np.uint64))
def test_argsort_u64(k):
    same(native.argsort(k), ref.argsort(k))


@given(var_codes())
@example(VarCodes.from_list([b"ab", b"ab\x00", b"a", b"", b"ab"]))
@example(VarCodes.from_list([b"abcdefgh", b"abcdefgh\x00", b"abcdefg", b"abcdefgh"]))
def test_argsort_var(k):
    same(native.argsort(k), ref.argsort(k))


@given(rows_kv())
def test_argsort_pairs(kv):
    k, v = kv
    same(native.argsort(k, v), ref.argsort(k, v))


@given(st.data())
def test_sort_consolidate_u64(data):
    k = data.draw(u64_codes())
    w = data.draw(weights_for(len(k)))
    for a, b in zip(native.sort_consolidate(k, None, w), ref.sort_consolidate(k, None, w)):
        same(a, b)


@given(st.data())
def test_sort_consolidate_wide_weights(data):
    """Weights beyond int32 take the path that gathers weights by row."""
    k = data.draw(u64_codes(high=20))
    w = data.draw(st.lists(st.integers(-2 ** 40, 2 ** 40) | st.just(0), min_size=len(k),
                           max_size=len(k)))
    w = np.asarray(w, dtype=np.int64)
    for a, b in zip(native.sort_consolidate(k, None, w), ref.sort_consolidate(k, None, w)):
        same(a, b)


@given(st.data())
def test_sort_consolidate_var(data):
    k = data.draw(var_codes())
    w = data.draw(weights_for(len(k)))
    for a, b in zip(native.sort_consolidate(k, None, w), ref.sort_consolidate(k, None, w)):
        same(a, b)


@given(st.data())
def test_sort_consolidate_pairs(data):
    k, v = data.draw(rows_kv())
    w = data.draw(weights_for(len(k)))
    for a, b in zip(native.sort_consolidate(k, v, w), ref.sort_consolidate(k, v, w)):
        same(a, b)


# --- large inputs: the streaming first pass, big buckets, the in-cache passes -------------------

def np_consolidate(k: np.ndarray, w: np.ndarray):
    """The numpy baseline: stable argsort, neighbour mask, reduceat."""
    perm = np.argsort(k, kind="stable")
    s = k[perm]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    sums = np.add.reduceat(w[perm], starts)
    keep = sums != 0
    return perm[starts][keep], sums[keep]


@pytest.mark.parametrize("dist", ["wide", "narrow", "skewed", "equal", "two_values"])
@pytest.mark.parametrize("weights", ["small", "wide"])
def test_large_u64(dist, weights):
    rng = np.random.default_rng(7)
    n = 300_000
    k = {
        "wide": lambda: rng.integers(0, 2 ** 64 - 1, n, dtype=np.uint64, endpoint=True),
        "narrow": lambda: rng.integers(0, 1000, n, dtype=np.uint64),
        "skewed": lambda: np.where(rng.random(n) < 0.9, np.uint64(12345),
                                   rng.integers(0, 2 ** 40, n, dtype=np.uint64)),
        "equal": lambda: np.full(n, 7, np.uint64),
        "two_values": lambda: np.where(rng.random(n) < 0.5, np.uint64(0), np.uint64(2 ** 63)),
    }[dist]()
    w = rng.integers(-2, 3, n) if weights == "small" else rng.integers(-2 ** 40, 2 ** 40, n)
    same(native.argsort(k), np.argsort(k, kind="stable"))
    for a, b in zip(native.sort_consolidate(k, None, w), np_consolidate(k, w)):
        same(a, b)


def test_large_var_and_pairs():
    rng = np.random.default_rng(8)
    n = 20_000
    prefixes = [b"", b"https://example.com/", b"\x00" * 8, b"abcdefgh"]
    rows = [prefixes[rng.integers(0, 4)]
            + bytes(rng.integers(0, 3, rng.integers(0, 12)).astype(np.uint8)) for _ in range(n)]
    k = VarCodes.from_list(rows)
    expect = np.asarray(sorted(range(n), key=rows.__getitem__), dtype=np.int64)
    same(native.argsort(k), expect)
    v = rng.integers(0, 5, n, dtype=np.uint64)
    expect = np.asarray(sorted(range(n), key=lambda i: (rows[i], int(v[i]))), dtype=np.int64)
    same(native.argsort(k, v), expect)


def test_accepts_other_integer_arrays_and_checks_lengths():
    k = np.array([3, 1, 2], dtype=np.int64)
    same(native.argsort(k), np.array([1, 2, 0]))
    with pytest.raises(ValueError):
        native.sort_consolidate(k.astype(np.uint64), None, np.ones(2, np.int64))
    with pytest.raises(ValueError):
        native.argsort(k.astype(np.uint64), np.zeros(4, np.uint64))


@pytest.mark.parametrize("shape", ["packed", "wide", "wide_values_dup_keys"])
def test_large_u64_pairs(shape):
    """(k, v) u64 pairs: packed into one u64 when their varying bits fit, else a 128-bit key."""
    rng = np.random.default_rng(9)
    n = 200_000
    hk, hv = {"packed": (1000, 1000), "wide": (2 ** 64 - 1, 2 ** 64 - 1),
              "wide_values_dup_keys": (50, 2 ** 63)}[shape]
    k = rng.integers(0, hk, n, dtype=np.uint64, endpoint=True)
    v = rng.integers(0, hv, n, dtype=np.uint64, endpoint=True)
    v[::7] = v[0]                                   # equal pairs where keys collide
    w = rng.integers(-1, 2, n)
    perm = np.lexsort((v, k))                       # stable: ties keep row order
    same(native.argsort(k, v), perm)
    ks, vs = k[perm], v[perm]
    starts = np.flatnonzero(np.r_[True, (ks[1:] != ks[:-1]) | (vs[1:] != vs[:-1])])
    sums = np.add.reduceat(w[perm], starts)
    keep = sums != 0
    for a, b in zip(native.sort_consolidate(k, v, w), (perm[starts][keep], sums[keep])):
        same(a, b)
