"""dbsp._native.search against kernels_ref: group_bounds, lower/upper_bound, intersect,
expand_pairs, take and concat on u64 and var codes."""
from __future__ import annotations

import numpy as np
import pytest
from dbsp._native import search as native
from hypothesis import given
from hypothesis import strategies as st

from dbsp.algebra import kernels_ref as ref
from dbsp.algebra.codes import VarCodes

from ._strategies import codes_of, u64_codes, var_codes

KINDS = st.sampled_from(["u64", "var"])


def same(a, b) -> None:
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(b, VarCodes):
        assert isinstance(a, VarCodes)
        assert a.to_list() == b.to_list()
        assert a.offsets.dtype == np.int64 and a.data.dtype == np.uint8 and a.offsets[0] == 0
    else:
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


@st.composite
def sorted_codes(draw, kind=None, distinct=False, max_size=80, high=None):
    kind = kind or draw(KINDS)
    hi = high if high is not None else draw(st.sampled_from([3, 50, 2 ** 64 - 1]))
    vals = sorted(draw(st.lists(st.integers(0, hi), max_size=max_size)))
    if distinct:
        vals = sorted(set(vals))
    return codes_of(kind, vals)


@given(sorted_codes())
def test_group_bounds(k):
    same(native.group_bounds(k), ref.group_bounds(k))


@given(st.data())
def test_group_bounds_var_rows(data):
    rows = sorted(data.draw(var_codes()).to_list())
    k = VarCodes.from_list(rows)
    same(native.group_bounds(k), ref.group_bounds(k))


@given(st.data(), st.sampled_from(["lower_bound", "upper_bound"]), st.booleans())
def test_bounds(data, fn, sorted_probes):
    kind = data.draw(KINDS)
    s = data.draw(sorted_codes(kind))
    probes = data.draw(st.lists(st.integers(0, 2 ** 64 - 1) | st.integers(0, 60), max_size=40))
    if sorted_probes:
        probes.sort()
    p = codes_of(kind, probes)
    same(getattr(native, fn)(s, p), getattr(ref, fn)(s, p))


@given(st.data(), st.sampled_from(["lower_bound", "upper_bound"]))
def test_bounds_var_rows(data, fn):
    s = VarCodes.from_list(sorted(data.draw(var_codes()).to_list()))
    p = data.draw(var_codes(max_size=20))
    same(getattr(native, fn)(s, p), getattr(ref, fn)(s, p))
    p = VarCodes.from_list(sorted(p.to_list()))
    same(getattr(native, fn)(s, p), getattr(ref, fn)(s, p))


@given(st.data(), st.booleans())
def test_range_lower_bound(data, in_order):
    """Sorted runs side by side (a batch's value ranges), probed per run: in (run, value) order,
    which gallops from the previous answer inside a run, or shuffled, and with empty runs."""
    kind = data.draw(KINDS)
    hi = data.draw(st.sampled_from([3, 50, 2 ** 64 - 1]))
    runs = data.draw(st.lists(st.lists(st.integers(0, hi), max_size=12).map(sorted), min_size=1,
                              max_size=6))
    offsets = np.cumsum([0] + [len(r) for r in runs]).astype(np.int64)
    s = codes_of(kind, [x for r in runs for x in r])
    probes = data.draw(st.lists(st.tuples(st.integers(0, len(runs) - 1),
                                          st.integers(0, hi) | st.integers(0, 60)), max_size=40))
    probes = sorted(probes) if in_order else probes
    g = np.asarray([r for r, _ in probes], dtype=np.int64)
    lo, up = offsets[g], offsets[g + 1]
    p = codes_of(kind, [x for _, x in probes])
    same(native.range_lower_bound(s, lo, up, p), ref.range_lower_bound(s, lo, up, p))


def test_range_lower_bound_rejects_a_range_outside():
    s = np.arange(4, dtype=np.uint64)
    with pytest.raises(IndexError):
        native.range_lower_bound(s, np.array([0]), np.array([5]), np.array([1], np.uint64))


def test_bounds_refuse_u64_probes_of_var_codes_and_back():
    u, v = np.arange(4, dtype=np.uint64), VarCodes.from_list([b"a", b"b"])
    for a, b in ((u, v), (v, u)):
        for fn in (native.lower_bound, native.upper_bound,
                   lambda s, p: native.range_lower_bound(s, np.zeros(len(p), np.int64),
                                                         np.zeros(len(p), np.int64), p)):
            with pytest.raises(TypeError, match="both be u64 or both var codes"):
                fn(a, b)


@given(st.data())
def test_intersect(data):
    kind = data.draw(KINDS)
    a = data.draw(sorted_codes(kind, distinct=True, high=200))
    # a long side forces the galloping path (more than 16 times longer)
    b = data.draw(sorted_codes(kind, distinct=True, high=200,
                               max_size=data.draw(st.sampled_from([3, 80, 400]))))
    same(native.intersect(a, b), ref.intersect(a, b))
    same(native.intersect(b, a), ref.intersect(b, a))


@given(st.data())
def test_intersect_shifted_ranges(data):
    """Sides whose code ranges overlap only in part (or not at all) are cut to the overlap
    first: the same answers as the reference, whichever path the overlap's sizes choose."""
    kind = data.draw(KINDS)
    a = data.draw(st.lists(st.integers(0, 300), max_size=data.draw(st.sampled_from([5, 60, 300]))))
    lo = data.draw(st.integers(0, 400))
    b = data.draw(st.lists(st.integers(lo, lo + data.draw(st.sampled_from([0, 10, 300]))),
                           max_size=data.draw(st.sampled_from([2, 40, 300]))))
    a, b = codes_of(kind, sorted(set(a))), codes_of(kind, sorted(set(b)))
    same(native.intersect(a, b), ref.intersect(a, b))
    same(native.intersect(b, a), ref.intersect(b, a))


@given(st.data())
def test_intersect_through_a_code_sample(data):
    """A long side searched through its code sample (every 16th code) first: the same answers
    as the reference, windows at either end included; a sample that does not fit is refused."""
    n = data.draw(st.sampled_from([1, 15, 16, 17, 400, 1000]))
    step = data.draw(st.sampled_from([1, 3]))
    big = np.arange(0, n * step, step, dtype=np.uint64)
    small = np.unique(np.asarray(data.draw(st.lists(st.integers(0, n * step + 5), max_size=30)),
                                 dtype=np.uint64))
    sample = native.code_sample(big)
    same(sample, ref.code_sample(big))
    want = ref.intersect(small, big)
    same(native.intersect(small, big, sample), want)
    same(ref.intersect(small, big, sample), want)


def test_intersect_code_sample_checks():
    big = np.arange(100, dtype=np.uint64)
    with pytest.raises(ValueError, match="b_sample"):
        native.intersect(big[:3], big, big[::8].copy())
    v = VarCodes.from_list([b"a", b"b"])
    assert native.code_sample(v) is None and ref.code_sample(v) is None
    with pytest.raises(TypeError, match="sample"):
        native.intersect(v, v, np.zeros(1, np.uint64))


def test_intersect_galloping_edges():
    big = np.arange(0, 10_000, 3, dtype=np.uint64)
    for small in ([0], [9999], [3, 4, 5, 9996, 12000], [], [20_000]):
        s = np.asarray(small, dtype=np.uint64)
        same(native.intersect(big, s), ref.intersect(big, s))
        same(native.intersect(s, big), ref.intersect(s, big))


_SPARSE_N = (1 << 20) + 3   # at least SPARSE_ROWS rows, over 128 times the probes
_SPARSE_U64 = np.arange(0, 3 * _SPARSE_N, 3, dtype=np.uint64)
_SPARSE_VAR = VarCodes(np.arange(_SPARSE_N + 1, dtype=np.int64) * 8,
                       _SPARSE_U64.astype(">u8").view(np.uint8))


@given(st.data())
def test_intersect_sparse_probes(data):
    """A side over 128 times longer and of at least 2**20 rows is binary-searched whole for
    each code of the other (the sparse path): same answers as the reference, u64 and var
    codes, either side first."""
    kind = data.draw(KINDS)
    hi = 3 * _SPARSE_N + 5
    small = np.unique(np.asarray(data.draw(st.lists(
        st.one_of(st.integers(0, 40), st.integers(0, hi), st.integers(hi - 40, hi)),
        max_size=20)), dtype=np.uint64))
    hit = (small % 3 == 0) & (small < 3 * _SPARSE_N)
    want = (np.flatnonzero(hit).astype(np.int64), (small[hit] // 3).astype(np.int64))
    big = _SPARSE_U64
    if kind == "var":
        big = _SPARSE_VAR
        small = VarCodes.from_list([int(v).to_bytes(8, "big") for v in small])
    same(native.intersect(small, big), want)
    same(native.intersect(big, small), (want[1], want[0]))


@st.composite
def offsets(draw, keys):
    lens = draw(st.lists(st.integers(0, 3), min_size=keys, max_size=keys))
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)


@given(st.data())
def test_expand_pairs(data):
    na, nb = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 8))
    ao, bo = data.draw(offsets(na)), data.draw(offsets(nb))
    m = data.draw(st.integers(0, 10))
    ai = np.asarray(data.draw(st.lists(st.integers(0, na - 1), min_size=m, max_size=m)), np.int64)
    bi = np.asarray(data.draw(st.lists(st.integers(0, nb - 1), min_size=m, max_size=m)), np.int64)
    same(native.expand_pairs(ao, ai, bo, bi), ref.expand_pairs(ao, ai, bo, bi))


def test_expand_pairs_checks_indices():
    o = np.array([0, 1, 2], np.int64)
    with pytest.raises(IndexError):
        native.expand_pairs(o, np.array([2]), o, np.array([0]))


@given(st.data())
def test_take(data):
    k = data.draw(u64_codes() | var_codes())
    n = len(k)
    idx = data.draw(st.lists(st.integers(-n, n - 1), max_size=50)) if n else []
    idx = np.asarray(idx, dtype=np.int64)
    same(native.take(k, idx), ref.take(k, idx))


def test_take_out_of_range():
    for k in (np.arange(3, dtype=np.uint64), codes_of("var", [1, 2, 3])):
        with pytest.raises(IndexError):
            native.take(k, np.array([3]))
        with pytest.raises(IndexError):
            native.take(k, np.array([-4]))


@given(st.data())
def test_concat(data):
    if data.draw(st.booleans()):
        parts = data.draw(st.lists(u64_codes(max_size=20), min_size=1, max_size=4))
    else:
        parts = data.draw(st.lists(var_codes(max_size=10), min_size=1, max_size=4))
        # slices of a VarCodes share its data and start at offsets[0] > 0
        parts = [VarCodes(p.offsets[i:], p.data) if len(p) and (i := data.draw(
            st.integers(0, len(p)))) else p for p in parts]
    same(native.concat(parts), ref.concat(parts))


def test_concat_errors():
    with pytest.raises(ValueError):
        native.concat([])
    with pytest.raises(TypeError):
        native.concat([np.zeros(1, np.uint64), codes_of("var", [1])])


@pytest.mark.parametrize("kind", ["u64", "var"])
def test_large_sorted_probes_gallop(kind):
    rng = np.random.default_rng(3)
    s = np.sort(rng.integers(0, 2 ** 40, 100_000, dtype=np.uint64))
    p = np.sort(rng.integers(0, 2 ** 40, 5_000, dtype=np.uint64))
    for fn, side in (("lower_bound", "left"), ("upper_bound", "right")):
        expect = np.searchsorted(s, p, side=side).astype(np.int64)
        same(getattr(native, fn)(codes_of(kind, s.tolist()), codes_of(kind, p.tolist())), expect)
        same(getattr(native, fn)(codes_of(kind, s.tolist()), codes_of(kind, p[::-1].tolist())),
             expect[::-1])


@given(st.lists(st.lists(st.integers(-2**63, 2**63 - 1), max_size=12), min_size=1, max_size=12),
       st.sampled_from([np.int64, np.uint64, np.int32, np.uint8, np.float64]), st.data())
def test_take_runs_matches_reference(parts, dtype, data):
    arrs = [np.asarray(p, dtype=np.int64).astype(dtype) for p in parts]
    total = sum(len(a) for a in arrs)
    idx = np.asarray(data.draw(st.lists(st.integers(0, max(total - 1, 0)),
                                        max_size=30 if total else 0)), np.int64)
    got = native.take_runs(arrs, idx)
    want = ref.take_runs(arrs, idx)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_take_runs_refuses_bad_input():
    a, b = np.arange(3, dtype=np.uint64), np.arange(2, dtype=np.uint64)
    for bad in ([5], [-1]):
        with pytest.raises(IndexError):
            native.take_runs([a, b], np.asarray(bad))
        with pytest.raises(IndexError):
            ref.take_runs([a, b], np.asarray(bad))
    with pytest.raises(TypeError):
        native.take_runs([a, b.astype(np.int64)], np.asarray([0]))


@st.composite
def _var_runs(draw, wide: bool):
    """``(offsets, data)`` runs in Arrow layout, some of them slices (offsets from above 0)."""
    runs = []
    for rows in draw(st.lists(st.lists(st.binary(max_size=5), max_size=8), min_size=1,
                              max_size=5)):
        skip = draw(st.integers(0, min(2, len(rows))))
        o = np.zeros(len(rows) + 1, np.int64)
        np.cumsum([len(r) for r in rows], out=o[1:])
        o = o.astype(np.int64 if wide else np.int32)
        runs.append((o[skip:], np.frombuffer(b"".join(rows) + b"pad", np.uint8)))
    return runs


@given(st.booleans(), st.data())
def test_take_var_runs_matches_reference(wide, data):
    runs = data.draw(_var_runs(wide))
    total = sum(len(o) - 1 for o, _ in runs)
    idx = np.asarray(data.draw(st.lists(st.integers(0, max(total - 1, 0)),
                                        max_size=30 if total else 0)), np.int64)
    got_o, got_d = native.take_var_runs(runs, idx)
    want_o, want_d = ref.take_var_runs(runs, idx)
    assert got_o.dtype == want_o.dtype == runs[0][0].dtype
    np.testing.assert_array_equal(got_o, want_o)
    assert got_d.tobytes() == want_d.tobytes()


@given(st.lists(var_codes(max_size=8), min_size=1, max_size=5), st.data())
def test_take_runs_of_var_codes_matches_take_of_concat(parts, data):
    total = sum(len(p) for p in parts)
    idx = np.asarray(data.draw(st.lists(st.integers(0, max(total - 1, 0)),
                                        max_size=30 if total else 0)), np.int64)
    want = ref.take(ref.concat(parts), idx)
    same(native.take_runs(parts, idx), want)
    same(ref.take_runs(parts, idx), want)


def test_take_var_runs_refuses_bad_input():
    o = np.array([0, 1, 3], np.int32)
    d = np.frombuffer(b"abc", np.uint8)
    for k in (native, ref):
        for bad in ([2], [-1]):
            with pytest.raises(IndexError):
                k.take_var_runs([(o, d)], np.asarray(bad))
        with pytest.raises(TypeError):
            k.take_var_runs([(o, d), (o.astype(np.int64), d)], np.asarray([0]))
        with pytest.raises(TypeError):
            k.take_var_runs([(o.astype(np.float64), d)], np.asarray([0]))
        with pytest.raises(TypeError):
            k.take_runs([VarCodes(o.astype(np.int64), d), np.zeros(2, np.uint64)], [0])
    with pytest.raises(IndexError):  # offsets past the data
        native.take_var_runs([(np.array([0, 9], np.int32), d)], np.asarray([0]))


@given(st.data())
def test_intersect_seeks_through_a_few_times_longer_side(data):
    """A side 2 to 128 times longer than the other (u64 codes) is sought through in blocks of 8
    codes for each code of the shorter one: the same answers as the reference for either side
    first, with matches at block edges, at both ends, and codes 0 and 2**64 - 1."""
    ratio = data.draw(st.sampled_from([2, 3, 7, 8, 9, 16, 17, 60, 127, 128]))
    nb = data.draw(st.integers(0, 6)) + data.draw(st.sampled_from([0, 8, 16]))
    top = (nb + 1) * ratio * 2 + 2
    short = sorted(set(data.draw(st.lists(st.integers(0, top), min_size=nb, max_size=nb))))
    long_ = sorted(set(data.draw(st.lists(st.integers(0, top), min_size=len(short) * ratio,
                                          max_size=len(short) * ratio + 8)))
                   | set(data.draw(st.lists(st.sampled_from(short or [0]), max_size=4))))
    a, b = np.asarray(short, dtype=np.uint64), np.asarray(long_, dtype=np.uint64)
    if data.draw(st.booleans()):  # the ends of the code range
        a, b = np.unique(np.r_[np.uint64(0), a, np.uint64(2**64 - 1)]), \
            np.unique(np.r_[np.uint64(0), b, np.uint64(2**64 - 1)])
    same(native.intersect(a, b), ref.intersect(a, b))
    same(native.intersect(b, a), ref.intersect(b, a))


@given(st.data())
def test_intersect_sample_pipeline(data):
    """Probes near each other (seeking through the sample) and far apart (galloping through
    it), more of them than the pipeline's depth of 16: the same answers as the reference."""
    n = data.draw(st.sampled_from([200, 4_000, 20_000]))
    big = np.arange(0, 3 * n, 3, dtype=np.uint64)
    m = data.draw(st.sampled_from([1, 15, 16, 17, 40, 300]))
    small = np.unique(np.asarray(data.draw(st.lists(st.integers(0, 3 * n + 4), min_size=1,
                                                    max_size=m)), dtype=np.uint64))
    sample = native.code_sample(big)
    same(native.intersect(small, big, sample), ref.intersect(small, big))


@given(st.data())
def test_intersect_dense_side(data):
    """A side whose part in the overlap holds every code of its range (dense ids) matches each
    code of the other side in the range at its distance from the first code: the same answers
    as the reference, either side dense, either side first, with and without a code sample,
    at the ends of the u64 range, and next to a side that is dense only outside the overlap."""
    lo = data.draw(st.sampled_from([0, 5, 2**64 - 40]))
    n = data.draw(st.integers(1, 30))
    dense = np.arange(n, dtype=np.uint64) + np.uint64(lo)
    if data.draw(st.booleans()):  # dense only inside the other side's range: a gap outside
        dense = np.unique(np.r_[dense, np.uint64(lo + n + 3 if lo < 2**63 else lo - 3)])
    other = np.unique(np.asarray(data.draw(st.lists(
        st.integers(max(lo - 5, 0), min(lo + n + 5, 2**64 - 1)), max_size=40)), dtype=np.uint64))
    same(native.intersect(other, dense), ref.intersect(other, dense))
    same(native.intersect(dense, other), ref.intersect(dense, other))
    if len(dense) >= 16:
        same(native.intersect(other, dense, native.code_sample(dense)),
             ref.intersect(other, dense))


@given(st.data())
def test_code_runs_and_intersect_through_them(data):
    """``code_runs`` equals the reference (runs of consecutive codes, at the ends of the u64
    range too), and an intersection through the runs gives the reference's answers: codes in
    the gaps between runs, before the first and after the last, either side longer."""
    lo = data.draw(st.sampled_from([0, 7, 2**64 - 300]))
    runs = data.draw(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 20)), min_size=1,
                              max_size=8))
    codes, at = [], lo
    for gap, length in runs:
        at += gap
        codes.extend(range(at, min(at + length, 2**64)))
        at += length
    b = np.unique(np.asarray([c for c in codes if c < 2**64], dtype=np.uint64))
    same(native.code_runs(b), ref.code_runs(b))
    top = int(b[-1]) + 5 if int(b[-1]) + 5 < 2**64 else 2**64 - 1
    a = np.unique(np.asarray(data.draw(st.lists(st.integers(max(lo - 3, 0), top),
                                                max_size=data.draw(st.sampled_from([3, 40])))),
                             dtype=np.uint64))
    r = native.code_runs(b)
    same(native.intersect(a, b, None, r), ref.intersect(a, b))
    same(ref.intersect(a, b, None, r), ref.intersect(a, b))
    if len(b) >= 16:
        same(native.intersect(a, b, native.code_sample(b), r), ref.intersect(a, b))


def test_code_runs_checks():
    b = np.arange(10, dtype=np.uint64)
    assert native.code_runs(np.zeros(0, np.uint64)) is None
    assert native.code_runs(VarCodes.from_list([b"a"])) is None
    with pytest.raises(ValueError, match="b_runs"):
        native.intersect(b, b, None, np.array([0, 5], np.int64))
    with pytest.raises(ValueError, match="b_runs"):
        ref.intersect(b, b, None, np.array([0, 5], np.int64))


@given(st.lists(st.integers(0, 60), unique=True, min_size=1), st.integers(-1, 8))
def test_code_runs_stops_past_max_runs(xs, cap):
    """More runs than ``max_runs`` (when not negative): None, as the reference says."""
    b = np.asarray(sorted(xs), dtype=np.uint64)
    got, want = native.code_runs(b, cap), ref.code_runs(b, cap)
    assert (got is None) == (want is None)
    if want is not None:
        same(got, want)


@given(st.data())
def test_code_rank_and_intersect_through_it(data):
    """``code_rank`` equals the reference (a bitmap of the codes' range and the counts below
    each word; None past the spread), and an intersection through it gives the reference's
    answers: a shard of ids (every code kept at random, as a hash shard keeps every W-th id),
    probes before, inside and after the range, word boundaries, the top of the u64 range,
    either side longer."""
    lo = data.draw(st.sampled_from([0, 63, 64, 2**64 - 700]))
    n = data.draw(st.integers(1, 600))
    keep = data.draw(st.sampled_from([1.0, 0.5, 0.2]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    span = np.arange(n, dtype=np.uint64) + np.uint64(lo)
    b = span[rng.random(n) < keep]
    if len(b) == 0:
        b = span[:1]
    spread = data.draw(st.sampled_from([8, 2, 1 << 40]))
    want = ref.code_rank(b, spread)
    got = native.code_rank(b, spread)
    assert (got is None) == (want is None)
    if got is None:
        return
    same(got, want)
    top = min(lo + n + 70, 2**64 - 1)
    a = np.unique(np.asarray(data.draw(st.lists(st.integers(max(lo - 70, 0), top),
                                                max_size=data.draw(st.sampled_from([5, 300])))),
                             dtype=np.uint64))
    for hw in (True, False):  # the rank loop with the popcnt instruction and without
        native.set_popcnt(hw)
        try:
            same(native.intersect(a, b, None, None, got), ref.intersect(a, b))
        finally:
            native.set_popcnt(True)
    same(ref.intersect(a, b, None, None, got), ref.intersect(a, b))
    if len(b) >= 16:
        same(native.intersect(a, b, native.code_sample(b), native.code_runs(b), got),
             ref.intersect(a, b))


def test_code_rank_checks():
    b = np.arange(0, 100, 3, dtype=np.uint64)
    assert native.code_rank(np.zeros(0, np.uint64)) is None
    assert native.code_rank(VarCodes.from_list([b"a"])) is None
    assert native.code_rank(np.arange(0, 1000, 100, dtype=np.uint64)) is None  # too sparse
    other = native.code_rank(b + np.uint64(1))
    with pytest.raises(ValueError, match="b_rank"):
        native.intersect(b, b, None, None, other)
    with pytest.raises(ValueError, match="b_rank"):
        ref.intersect(b, b, None, None, other)
    with pytest.raises(ValueError, match="b_rank"):
        native.intersect(b, b, None, None, np.zeros(1, np.uint64))


@given(st.data())
def test_intersect_batches(data):
    """``intersect_batches`` (one call over a spine's batches) gives, for every part with
    matches, what ``intersect`` gives for it alone, and leaves out the parts without: batches of
    growing key ranges (an id trace: most miss the probe's range), shards of ids probed through
    their rank directory, code samples and runs, u64 and var codes, an empty part."""
    kind = data.draw(KINDS)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    parts, keys = [], []
    lo = 0
    for _ in range(data.draw(st.integers(0, 6))):
        n = data.draw(st.integers(0, 300))
        keep = data.draw(st.sampled_from([1.0, 0.5]))
        span = np.arange(lo, lo + n, dtype=np.uint64)
        lo += n if data.draw(st.booleans()) else n // 2  # ranges apart or overlapping
        b = span[rng.random(n) < keep]
        keys.append(b)
        if kind == "var":
            parts.append((codes_of("var", b.tolist()), None, None, None))
            continue
        rank = native.code_rank(b) if len(b) and data.draw(st.booleans()) else None
        sample = native.code_sample(b) if len(b) and data.draw(st.booleans()) else None
        runs = native.code_runs(b) if len(b) and data.draw(st.booleans()) else None
        parts.append((b, sample, runs, rank))
    a = np.unique(rng.integers(0, max(lo, 1) + 20, data.draw(st.integers(0, 200)))
                  .astype(np.uint64))
    if kind == "var":
        a = codes_of("var", a.tolist())
    got = native.intersect_batches(a, parts)
    want = ref.intersect_batches(a, parts)
    assert [k for k, _, _ in got] == [k for k, _, _ in want]
    for (k, ai, bi), (_, wa, wb) in zip(got, want):
        same((ai, bi), (wa, wb))
        same((ai, bi), native.intersect(a, *parts[k]))
    with pytest.raises(TypeError):
        native.intersect_batches(np.arange(3, dtype=np.uint64),
                                 [(VarCodes.from_list([b"a"]), None, None, None)])
