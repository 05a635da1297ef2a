"""dbsp._native.merge against kernels_ref: k-way merges (k = 1..6, empty runs included) of u64,
var and (k, v) runs."""
from __future__ import annotations

import numpy as np
import pytest
from dbsp._native import merge as native
from hypothesis import example, given
from hypothesis import strategies as st

from dbsp.algebra import kernels_ref as ref

from ._strategies import codes_of


def same_result(a, b) -> None:
    for x, y in zip(a, b):
        assert x.dtype == y.dtype == np.int64
        np.testing.assert_array_equal(x, y)


@st.composite
def run(draw, kind, vkind, high, consolidated=True):
    """One run (kcodes, vcodes_or_None, weights): sorted, consolidated unless told otherwise."""
    n = draw(st.integers(0, 30) | st.just(0))
    k = draw(st.lists(st.integers(0, high), min_size=n, max_size=n))
    v = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)) if vkind else None
    w = np.asarray(draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)), dtype=np.int64)
    kc = codes_of(kind, k)
    vc = codes_of(vkind, v) if vkind else None
    if consolidated:
        perm, w = ref.sort_consolidate(kc, vc, w)
    else:
        perm = ref.argsort(kc, vc)
        w = w[perm]
    kc = ref.take(kc, perm)
    vc = ref.take(vc, perm) if vkind else None
    return kc, vc, w


@st.composite
def runs(draw, consolidated=True):
    kind = draw(st.sampled_from(["u64", "var"]))
    vkind = draw(st.sampled_from([None, None, "u64", "var"]))
    high = draw(st.sampled_from([3, 40, 2 ** 64 - 1]))
    k = draw(st.integers(1, 6))
    return [draw(run(kind, vkind, high, consolidated)) for _ in range(k)]


@given(runs())
@example([(np.array([1, 5], np.uint64), None, np.array([1, 1])),
          (np.array([1, 5], np.uint64), None, np.array([-1, 2]))])
@example([(np.zeros(0, np.uint64), None, np.zeros(0, np.int64)),
          (np.array([2], np.uint64), None, np.array([3]))])
def test_merge_matches_reference(rs):
    same_result(native.merge_consolidate(rs), ref.merge_consolidate(rs))


@given(runs(consolidated=False))
def test_sorted_but_not_consolidated_runs(rs):
    """Duplicate rows inside a run are summed too (the reference consolidates everything)."""
    same_result(native.merge_consolidate(rs), ref.merge_consolidate(rs))


def test_no_runs():
    same_result(native.merge_consolidate([]), ref.merge_consolidate([]))


def test_mixed_kinds_are_refused():
    a = (np.array([1], np.uint64), None, np.array([1]))
    b = (codes_of("var", [1]), None, np.array([1]))
    with pytest.raises(TypeError):
        native.merge_consolidate([a, b])
    with pytest.raises(ValueError):
        with_v = (np.array([1], np.uint64), np.array([1], np.uint64), np.array([1]))
        native.merge_consolidate([a, with_v])


def consolidated_u64(rng, n, lo, hi):
    k = np.unique(rng.integers(lo, hi, n, dtype=np.uint64))
    return k, None, rng.integers(1, 3, len(k))


@pytest.mark.parametrize("shape", ["interleaved", "disjoint", "reversed", "overlap", "cancel",
                                   "few_keys", "three", "six"])
def test_large_u64(shape):
    """Long runs: the branchless blocks, bulk copies found by galloping, the loser tree."""
    rng = np.random.default_rng(11)
    n = 50_000
    a = consolidated_u64(rng, n, 0, 2 ** 62)
    rs = {
        "interleaved": lambda: [a, consolidated_u64(rng, n, 0, 2 ** 62)],
        "disjoint": lambda: [a, consolidated_u64(rng, n, 2 ** 62, 2 ** 63)],
        "reversed": lambda: [consolidated_u64(rng, n, 2 ** 62, 2 ** 63), a],
        "overlap": lambda: [a, consolidated_u64(rng, n, 2 ** 61, 2 ** 63)],
        "cancel": lambda: [a, (a[0], None, -a[2])],
        "few_keys": lambda: [consolidated_u64(rng, n, 0, 100), consolidated_u64(rng, n, 50, 150)],
        "three": lambda: [consolidated_u64(rng, n, 0, 2 ** 20) for _ in range(3)],
        "six": lambda: [consolidated_u64(rng, n // 3, 0, 2 ** 62) if i % 2 else
                        consolidated_u64(rng, 10, 0, 2 ** 62) for i in range(6)],
    }[shape]()
    k = np.concatenate([r[0] for r in rs])
    w = np.concatenate([r[2] for r in rs])
    # the reference merge is sort_consolidate of the concatenation: use numpy for it here
    perm = np.argsort(k, kind="stable")
    s = k[perm]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    sums = np.add.reduceat(w[perm], starts)
    keep = sums != 0
    same_result(native.merge_consolidate(rs), (perm[starts][keep], sums[keep]))
