"""topk against the reference model (multiplicities, ties, nulls, ranks), with 1 and 2 workers."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import dbsp
from dbsp.testing import reference as ref
from dbsp.testing import strategies as S
from dbsp.testing.harness import check_steps

T = pa.schema([pa.field("k", pa.string()), pa.field("x", pa.int64()), pa.field("s", pa.string())])


def _run(workers, schema, steps, k, order_by, descending=False, rank=None, key=("k",)):
    names = schema.names
    kidx = [names.index(c) for c in key]
    vnames = [n for n in names if n not in key]
    oidx = [vnames.index(c) for c in order_by]
    check_steps(workers, {"t": schema},
                lambda t: t.index_by(list(key)).topk(k, order_by, descending, rank),
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
