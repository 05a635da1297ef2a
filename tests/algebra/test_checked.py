"""Checked int64 arithmetic against Python integers (dbsp.algebra.checked)."""
from __future__ import annotations

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from dbsp.algebra.checked import I64_MAX, I64_MIN, add_overflows, group_sums, weighted_group_sums

I64 = st.integers(I64_MIN, I64_MAX)
BIGISH = st.one_of(st.integers(-5, 5), I64, st.sampled_from([I64_MIN, I64_MAX, 2 ** 62, -2 ** 62]))


def _groups(sizes):
    starts = np.cumsum([0] + sizes[:-1]).astype(np.int64)
    return starts, [(int(s), int(s) + n) for s, n in zip(starts, sizes)]


@given(st.lists(st.tuples(BIGISH, BIGISH), min_size=1, max_size=30), st.data())
@example([(2 ** 62, 1), (2 ** 62, 1)], None)
def test_weighted_group_sums_flag_exactly_the_overflows(rows, data):
    n = len(rows)
    if data is None:
        sizes = [n]
    else:
        cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=4)))) if n > 1 else []
        bounds = [0] + cuts + [n]
        sizes = [b - a for a, b in zip(bounds, bounds[1:])]
    x = np.array([r[0] for r in rows], dtype=np.int64)
    w = np.array([r[1] for r in rows], dtype=np.int64)
    starts, spans = _groups(sizes)
    sums, bad = weighted_group_sums(x, w, starts)
    for g, (lo, hi) in enumerate(spans):
        exact = sum(int(a) * int(b) for a, b in zip(x[lo:hi], w[lo:hi]))
        fits = I64_MIN <= exact <= I64_MAX
        assert bad[g] == (not fits)
        if fits:
            assert int(sums[g]) == exact


@given(st.lists(BIGISH, min_size=1, max_size=30))
def test_group_sums_one_group(ws):
    w = np.array(ws, dtype=np.int64)
    sums, bad = group_sums(w, np.array([0], np.int64))
    exact = sum(ws)
    assert bool(bad[0]) == (not I64_MIN <= exact <= I64_MAX)
    if not bad[0]:
        assert int(sums[0]) == exact


@given(st.lists(st.tuples(I64, I64), max_size=30))
def test_add_overflows(pairs):
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    s, over = add_overflows(a, b)
    for i, (x, y) in enumerate(pairs):
        assert bool(over[i]) == (not I64_MIN <= x + y <= I64_MAX)
        if not over[i]:
            assert int(s[i]) == x + y


@given(st.lists(st.tuples(BIGISH, BIGISH), max_size=30))
def test_mul_overflows(pairs):
    from dbsp.algebra.checked import mul_overflows
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    p, over = mul_overflows(a, b)
    for i, (x, y) in enumerate(pairs):
        fits = I64_MIN <= x * y <= I64_MAX
        assert (over is not None and bool(over[i])) == (not fits)
        if fits:
            assert int(p[i]) == x * y
