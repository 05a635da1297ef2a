"""dbsp._native.merge against kernels_ref: k-way merges (k = 1..6, empty runs included) of u64,
var and (k, v) runs; the two-run u64 merge with its AVX-512 kernel on and forced off, against
each other and a naive reference."""
from __future__ import annotations

import os
import subprocess
import sys

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
def test_large_u64(simd, shape):
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


# --- two u64 runs: the AVX-512 kernel against the scalar loop and a naive reference -------------

@pytest.fixture(params=[True, False], ids=["simd", "scalar"])
def simd(request):
    """Run the test with the AVX-512 two-run merge on (where the CPU has it) and forced off."""
    prev = native.set_simd(request.param)
    yield request.param
    native.set_simd(prev)


def naive_merge(rs):
    """Sort every (key, global row, weight) by (key, row), sum per key, drop zero sums."""
    rows, base = [], 0
    for k, _, w in rs:
        rows += [(int(k[i]), base + i, int(w[i])) for i in range(len(k))]
        base += len(k)
    rows.sort()
    g, s = [], []
    for i, (key, row, w) in enumerate(rows):
        if i and key == rows[i - 1][0]:
            s[-1] += w
        else:
            g.append(row)
            s.append(w)
    keep = [i for i in range(len(g)) if s[i] != 0]
    return (np.array([g[i] for i in keep], np.int64), np.array([s[i] for i in keep], np.int64))


EXTREMES = [0, 1, 2 ** 63 - 2, 2 ** 63 - 1, 2 ** 63, 2 ** 63 + 1, 2 ** 64 - 2, 2 ** 64 - 1]
KEYS = {
    "few": st.integers(0, 3),            # long groups, inside runs and across them
    "some": st.integers(0, 60),
    "wide": st.integers(0, 2 ** 64 - 1),  # interleaved, (almost) no ties
    "extremes": st.sampled_from(EXTREMES),  # INT64_MIN/MAX and UINT64_MAX as unsigned codes
    "equal": st.just(2 ** 63),           # every key equal
}


@st.composite
def u64_run(draw, keys, max_rows, consolidated):
    n = draw(st.integers(0, max_rows))
    k = sorted(draw(st.lists(keys, max_size=n, unique=True) if consolidated else
                    st.lists(keys, min_size=n, max_size=n)))
    w = draw(st.lists(st.integers(-2, 2).filter(bool) if consolidated else st.integers(-2, 2),
                      min_size=len(k), max_size=len(k)))
    return np.array(k, np.uint64), None, np.array(w, np.int64)


@st.composite
def two_u64_runs(draw, max_rows=40):
    """Two sorted u64 runs of 0..max_rows rows (every tail of the 8-row steps), consolidated or
    with duplicate keys inside a run, weights that cancel across runs."""
    pool = draw(st.sampled_from(sorted(KEYS)))
    consolidated = draw(st.booleans())
    return [draw(u64_run(KEYS[pool], max_rows, consolidated)) for _ in range(2)]


def check_two_runs(rs):
    got = native.merge_consolidate(rs)
    same_result(got, naive_merge(rs))
    prev = native.set_simd(not native.simd_enabled())
    try:
        same_result(got, native.merge_consolidate(rs))    # the other path, bit for bit
    finally:
        native.set_simd(prev)


@given(two_u64_runs())
@example([(np.array(EXTREMES, np.uint64), None, np.ones(8, np.int64)),
          (np.array(EXTREMES, np.uint64), None, -np.ones(8, np.int64))])
@example([(np.full(9, 2 ** 64 - 1, np.uint64), None, np.ones(9, np.int64)),
          (np.full(17, 2 ** 64 - 1, np.uint64), None, np.ones(17, np.int64))])
def test_two_runs_short(simd, rs):
    check_two_runs(rs)


@given(two_u64_runs(max_rows=600))
def test_two_runs_long(simd, rs):
    """Several 8-row steps and blocks, bulk stretches found by galloping between them."""
    check_two_runs(rs)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("high", [4, 300, 2 ** 62, 2 ** 64 - 1])
def test_two_runs_random(simd, seed, high):
    """Larger runs with many duplicates (inside runs too) and weights that cancel: the SIMD path,
    the scalar path and a numpy reference agree."""
    rng = np.random.default_rng(seed)
    rs = []
    for n in rng.integers(1000, 5000, 2):
        k = np.sort(rng.integers(0, high, n, dtype=np.uint64, endpoint=True))
        rs.append((k, None, rng.integers(-2, 3, n)))
    k = np.concatenate([r[0] for r in rs])
    w = np.concatenate([r[2] for r in rs])
    perm = np.argsort(k, kind="stable")
    s = k[perm]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    sums = np.add.reduceat(w[perm], starts)
    keep = sums != 0
    same_result(native.merge_consolidate(rs), (perm[starts][keep], sums[keep]))
    check_two_runs(rs)


def test_simd_switch():
    prev = native.set_simd(False)
    try:
        assert not native.simd_enabled()
        assert native.set_simd(True) is False
        assert native.simd_enabled() == native.simd_available()
    finally:
        native.set_simd(prev)


def test_simd_off_by_environment():
    code = "from dbsp._native import merge; print(merge.simd_enabled())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DBSP_MERGE_SIMD": "0"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
