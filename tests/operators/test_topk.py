"""topk against the reference model (multiplicities, ties, nulls, ranks), with 1 and 2 workers."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import dbsp
from dbsp.testing import reference as ref
from dbsp.testing import strategies as S
from dbsp.testing.harness import check_steps

T = pa.schema([pa.field("k", pa.string()), pa.field("x", pa.int64()), pa.field("s", pa.string())])


def _run(workers, schema, steps, k, order_by, descending=False, rank=None, key=("k",),
         append_only=False):
    names = schema.names
    kidx = [names.index(c) for c in key]
    vnames = [n for n in names if n not in key]
    oidx = [vnames.index(c) for c in order_by]
    return check_steps(
        workers, {"t": schema},
        lambda t: t.index_by(list(key)).topk(k, order_by, descending, rank, append_only),
        lambda z: ref.topk(z, kidx, k, oidx, descending, rank is not None),
        [{"t": s} for s in steps])


LIT = [
    {("a", 5, "p"): 1, ("a", 1, "q"): 2, ("a", 1, "b"): 1, ("a", None, "n"): 1, ("b", 9, "z"): 1},
    {("a", 1, "q"): -1, ("a", 0, "new"): 1},      # a tie moves, a new minimum
    {("b", 9, "z"): -1, ("a", 7, "x"): 3},        # a key disappears
    {("a", None, "n"): -1, ("a", 0, "new"): -1},
]


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("rank", [None, "r"])
def test_topk_literal(workers, descending, rank):
    _run(workers, T, LIT, 3, ["x"], descending, rank)


def test_topk_multiplicity_is_cut_at_k(workers):
    steps = [{("a", 1, "x"): 5}, {("a", 0, "y"): 1}, {("a", 0, "y"): -1, ("a", 1, "x"): -4}]
    _run(workers, T, steps, 2, ["x"])
    _run(workers, T, steps, 2, ["x"], rank="r")


def test_topk_rank_column_and_output_schema():
    with dbsp.Circuit() as c:
        t = c.add_input("t", T)
        s = t.index_by(["k"]).topk(1, ["x", "s"], rank="pos")
        assert s.schema.names == ["k", "x", "s", "pos"]
        out = s.output()
        t.insert([("a", 2, "b"), ("a", 2, "a")])
        c.step()
        assert out.to_dict() == {("a", 2, "a", 1): 1}


def test_topk_bad_arguments():
    c = dbsp.Circuit()
    ix = c.add_input("t", T).index_by(["k"])
    with pytest.raises(ValueError, match="positive integer"):
        ix.topk(0, ["x"])
    with pytest.raises(KeyError, match="no value column 'k'"):
        ix.topk(1, ["k"])
    with pytest.raises(ValueError, match="clashes"):
        ix.topk(1, ["x"], rank="s")


@st.composite
def topk_case(draw):
    key = draw(S.fields("k"))
    vals = draw(S.schemas(1, 3, prefix="v"))
    schema = pa.schema([key] + list(vals))
    order_by = draw(st.lists(st.sampled_from(vals.names), min_size=1, max_size=2, unique=True))
    steps = draw(S.deltas(schema, steps=4, valid=draw(st.booleans())))
    return schema, steps, draw(st.integers(1, 3)), order_by, draw(st.booleans()), \
        draw(st.sampled_from([None, "rank"]))


@settings(max_examples=100)
@given(case=topk_case())
@example(case=(T, [{("a", 1, "x"): 2}, {("a", 1, "x"): -3}], 1, ["x"], False, "r"))
def test_topk_random(workers, case):
    schema, steps, k, order_by, desc, rank = case
    _run(workers, schema, steps, k, order_by, desc, rank)


# -- large groups: the top k is read from windows at the front (back) of the values ------------

U = pa.schema([pa.field("k", pa.int64()), pa.field("s", pa.string()), pa.field("x", pa.int64())])


def test_topk_large_groups_with_retracted_heads(workers):
    # 60 values a key (more than a window), ties on x (descending ties run against the value
    # order), the head retracted step after step so the windows must grow past cancelled values
    base = {(k, f"s{i % 7}", i // 3): 1 for k in range(2) for i in range(60)}
    steps = [base, {(0, "zz", 19): 2, (1, "a", 100): 1}]
    for i in range(6):
        steps.append({(0, f"s{(59 - i) % 7}", (59 - i) // 3): -1,
                      (1, f"s{i % 7}", i // 3): -1, (0, "zz", 19): -1 if i < 2 else 0})
    steps = [{r: w for r, w in s.items() if w} for s in steps]
    for desc in (False, True):
        _run(workers, U, steps, 3, ["x"], desc)
        _run(workers, U, steps, 2, ["x"], desc, rank="r")


@st.composite
def _big_steps(draw):
    rows = st.tuples(st.integers(0, 1), st.sampled_from(["a", "b", "c"]), st.integers(0, 6))
    out = [{(k, s, x): 1 for k in range(2) for s in "abc" for x in range(7)}]
    for _ in range(draw(st.integers(1, 4))):
        d = draw(st.dictionaries(rows, st.integers(-2, 2), max_size=10))
        out.append({r: w for r, w in d.items() if w})
    return out


@settings(max_examples=40, deadline=None)
@given(steps=_big_steps(), k=st.integers(1, 4), desc=st.booleans(), rank=st.booleans())
def test_topk_large_groups_random(workers, steps, k, desc, rank):
    _run(workers, U, steps, k, ["x"], desc, "r" if rank else None)


# --- a direction per order_by column (ORDER BY b ASC, c DESC) -----------------------------------

def test_topk_per_column_direction_literal(workers):
    steps = [{("a", 1, "a"): 1, ("a", 1, "z"): 1, ("a", 0, "m"): 1, ("a", 2, "q"): 1,
              ("b", 5, None): 1, ("b", 5, "x"): 1},
             {("a", 0, "m"): -1, ("a", 1, "zz"): 2}]
    for flags in ([False, True], [True, False]):
        _run(workers, T, steps, 3, ["x", "s"], flags, "r")
        _run(workers, T, steps, 2, ["x", "s"], flags)


def test_topk_per_column_direction_in_the_fluent_api():
    from dbsp.api import StreamContext
    with StreamContext() as ctx:
        s = ctx.stream(T)
        out = s.group_by("k").topk(2, by=["x", "s"], descending=[False, True], rank="r").collect()
        s.insert([("a", 1, "a"), ("a", 1, "z"), ("a", 0, "m")])
        ctx.step()
        assert out.rows() == [("a", 0, "m", 1), ("a", 1, "z", 2)]


def test_topk_descending_flags_must_match_order_by():
    ix = dbsp.Circuit().add_input("t", T).index_by(["k"])
    with pytest.raises(ValueError, match="one bool per order_by column"):
        ix.topk(1, ["x", "s"], [True])
    with pytest.raises(TypeError, match="bool or a list of bools"):
        ix.topk(1, ["x"], "desc")


@settings(max_examples=80)
@given(case=topk_case(), data=st.data())
def test_topk_per_column_direction_random(workers, case, data):
    schema, steps, k, order_by, _, rank = case
    flags = data.draw(st.lists(st.booleans(), min_size=len(order_by), max_size=len(order_by)))
    _run(workers, schema, steps, k, order_by, flags, rank)


@settings(max_examples=40, deadline=None)
# s ASC, x DESC, read from the front: the tie group at the window's end (b) continues past it,
# not the one at its start (a); reading from the wrong end took (0, 'b', 4) for (0, 'b', 6)
@example(steps=[{(k, s, x): 1 for k in range(2) for s in "abc" for x in range(7)},
                {(0, "a", 0): -1, (0, "a", 1): -1, (0, "b", 0): 1}],
         k=6, flags=[False, True], rank=False)
@given(steps=_big_steps(), k=st.integers(1, 9), flags=st.sampled_from(
    [[False, True], [True, False], [True, True], [False, False]]), rank=st.booleans())
@example(  # x ASC, s DESC read from the front: the edge tie group is the window's last x
    steps=[{(k, s, x): 1 for k in range(2) for s in "abc" for x in range(7)},
           {(0, "a", 0): -1, (0, "a", 1): -1, (0, "b", 0): -1}],
    k=4, flags=[False, True], rank=False)
def test_topk_large_groups_per_column_direction(workers, steps, k, flags, rank):
    """Groups larger than the first window: the edge tie group on the leading columns of the
    first column's direction must be read past the window."""
    _run(workers, U, steps, k, ["x", "s"], flags, "r" if rank else None)
    _run(workers, U, steps, k, ["s", "x"], flags, "r" if rank else None)


def test_topk_mixed_directions_with_ties_wider_than_a_window(workers):
    """``x ASC, s DESC`` where one x holds more values than a window: the places come from the
    far end of the tie group, which the window must be grown to reach."""
    base = {(k, f"s{i:02d}", x): 1 for k in range(2) for i in range(20) for x in range(2)}
    steps = [base, {(0, "zz", 5): 1, (1, "s19", 0): -1}, {(0, "s18", 0): -1}]
    for flags in ([False, True], [True, False]):
        for k in (1, 3, 25):
            _run(workers, U, steps, k, ["x", "s"], flags)
            _run(workers, U, steps, k, ["x", "s"], flags, rank="r")


# --- append-only input: the state keeps each key's top k only -----------------------------------

def _inserts(steps):
    return [{r: abs(w) for r, w in st_.items()} for st_ in steps]


@settings(max_examples=80)
@given(case=topk_case(), data=st.data())
@example(case=(T, [{("a", 1, "x"): 2, ("a", 0, "y"): 1}, {("a", 0, "z"): 3}], 2, ["x"], False,
               "r"), data=None)
def test_topk_append_only_random(workers, case, data):
    """Insert-only steps: the same result as the full top-k (the reference), with or without a
    rank column, one direction or one per column."""
    schema, steps, k, order_by, desc, rank = case
    if data is not None and data.draw(st.booleans()):
        desc = data.draw(st.lists(st.booleans(), min_size=len(order_by),
                                  max_size=len(order_by)))
    _run(workers, schema, _inserts(steps), k, order_by, desc, rank, append_only=True)


def test_topk_append_only_keeps_the_tops_only(workers):
    steps = [{(k, f"s{i}", (i * 7) % 23): 1 for k in range(3) for i in range(j * 20, j * 20 + 20)}
             for j in range(6)]
    full = _run(workers, U, steps, 2, ["x"], True)
    tops = _run(workers, U, steps, 2, ["x"], True, append_only=True)
    assert full.state_rows() == 3 * 120
    assert tops.state_rows() <= 3 * 2 * 6 * 2  # the tops and their changes, before merges


def test_topk_append_only_rejects_a_deletion():
    with dbsp.Circuit() as c:
        t = c.add_input("t", T)
        t.index_by(["k"]).topk(1, ["x"], append_only=True).output()
        t.insert([("a", 1, "x")])
        c.step()
        t.push([("a", 1, "x")], weights=[-1])
        with pytest.raises(dbsp.RowError, match="append-only"):
            c.step()


_ROW = st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(-3, 3)),
                 st.floats(allow_nan=False, width=32), st.sampled_from(["", "a", "ab", "b"]),
                 st.integers(-2, 3))


@settings(max_examples=100)
@given(rows=st.lists(_ROW, max_size=40), k=st.integers(1, 5),
       order_by=st.sampled_from([["x"], ["x", "f"], ["s"], ["f", "s", "x"], ["s", "x"]]))
def test_select_sorted_matches_select_topk(rows, k, order_by):
    """The ascending fast path (places from the storage order) picks the same rows, counts and
    first ranks as the general ranking, ties and multiplicities included."""
    from dbsp.algebra.codes import KeyCodec
    from dbsp.operators.topk import select_sorted, select_topk
    from dbsp.trace.batch import OrdIndexedZSet
    vorder = order_by + [c for c in ("x", "f", "s") if c not in order_by]
    types = {"x": pa.int64(), "f": pa.float64(), "s": pa.string()}
    cols = {"k": [r[0] for r in rows], "x": [r[1] for r in rows], "f": [r[2] for r in rows],
            "s": [r[3] for r in rows]}
    keys = pa.RecordBatch.from_arrays([pa.array(cols["k"], pa.int64())], names=["k"])
    vals = pa.RecordBatch.from_arrays([pa.array(cols[c], types[c]) for c in vorder],
                                      names=vorder)
    g = OrdIndexedZSet.from_parts(keys, vals, np.array([r[4] for r in rows], np.int64))
    codec = KeyCodec([g.vals.schema.field(c) for c in order_by])
    want = select_topk(g, k, codec, order_by, False)
    got = select_sorted(g, k)
    for a, b in zip(want, got):
        assert a.tolist() == b.tolist()


_BIG = st.sampled_from([-2 ** 63, 2 ** 63 - 1, -1, 0, 1, 2 ** 40])
_PRE = st.tuples(st.integers(0, 3) | _BIG, st.integers(-2, 2), st.integers(-4, 4) | _BIG,
                 st.sampled_from(["a", "b"]), st.integers(1, 3))


@settings(max_examples=150)
@given(rows=st.lists(_PRE, max_size=40), k=st.integers(1, 4), two_keys=st.booleans())
@example(rows=[(0, 0, 1, "a", 1), (0, 0, 1, "b", 1), (0, 0, 0, "a", 2)], k=2, two_keys=False)
@example(rows=[(2 ** 63 - 1, 0, -2 ** 63, "a", 1), (-2 ** 63, 0, 2 ** 63 - 1, "a", 1),
               (-2 ** 63, 0, 0, "a", 1)], k=1, two_keys=True)
def test_topk_prefilter_drops_exactly_the_pushed_out_rows(rows, k, two_keys):
    """A row is dropped iff the rows of its key with a smaller first order value fill ``k``
    places (weights are places), whether the key and value fit one packed u64 or not."""
    from dbsp.operators.topk import TopKPrefilterOperator
    from dbsp.trace.batch import ZSet
    key = ["a", "b"] if two_keys else ["a"]
    data = pa.RecordBatch.from_arrays(
        [pa.array([r[i] for r in rows], pa.int64()) for i in range(3)]
        + [pa.array([r[3] for r in rows], pa.string())], names=["a", "b", "x", "s"])
    w = np.array([r[4] for r in rows], np.int64)
    out = TopKPrefilterOperator(None, key, "x", k).eval(ZSet(data, w))
    got = sorted(zip([tuple(d.values()) for d in out.data.to_pylist()], out.weights.tolist()))
    kk = (lambda r: (r[0], r[1])) if two_keys else (lambda r: (r[0],))
    want = sorted((r[:4], r[4]) for r in rows
                  if sum(q[4] for q in rows if kk(q) == kk(r) and q[2] < r[2]) < k)
    assert got == want


def test_topk_prefilter_passes_a_deletion_to_the_topk():
    from dbsp.operators.topk import TopKPrefilterOperator
    from dbsp.trace.batch import ZSet
    data = pa.RecordBatch.from_arrays([pa.array([1, 1, 1]), pa.array([1, 2, 3])],
                                      names=["a", "x"])
    z = ZSet(data, np.array([1, 1, -1], np.int64))
    assert TopKPrefilterOperator(None, ["a"], "x", 1).eval(z) is z
