"""lookup_join (``Δa ⋈ I(b)``): literal steps, and random deltas against the reference model
recomputed from scratch each step (``Σ_t ref.join(Δa_t, I(b)_t)``)."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import dbsp
from dbsp.nexmark.queries import q13
from dbsp.operators.lookup_join import lookup_join_rows
from dbsp.testing import reference as ref
from dbsp.testing import strategies as S
from dbsp.testing.harness import push_dict

L = pa.schema([pa.field("k", pa.int64()), pa.field("a", pa.string())])
R = pa.schema([pa.field("k", pa.int64()), pa.field("b", pa.int64())])


@st.composite
def join_case(draw):
    """Two schemas keyed on ``k`` (of a drawn type, nullable or not) and a few steps of deltas."""
    kt = draw(st.sampled_from(["int64", "string", "date32"]))
    key = pa.field("k", S.TYPES[kt][0], nullable=draw(st.booleans()))
    ls = pa.schema([key] + list(draw(S.schemas(0, 2, prefix="a"))))
    rs = pa.schema([key] + list(draw(S.schemas(0, 2, prefix="b"))))
    n = draw(st.integers(1, 4))
    dl, dr = draw(S.deltas(ls, n)), draw(S.deltas(rs, n))
    return ls, rs, [{"l": a, "r": b} for a, b in zip(dl, dr)]


def _run(workers, ls, rs, steps, build):
    """Push ``steps`` and return, per step, (output delta, expected delta)."""
    out = []
    with dbsp.Circuit(workers=workers) as c:
        a, b = c.add_input("l", ls), c.add_input("r", rs)
        o = build(a.index_by(["k"]), b.index_by(["k"])).output()
        ib: dict = {}
        for step in steps:
            push_dict(a, step.get("l", {}))
            push_dict(b, step.get("r", {}))
            c.step()
            ib = ref.add(ib, step.get("r", {}))
            out.append((o.to_dict(), ref.join(step.get("l", {}), ib, [0], [0])))
        state = c.state_rows()
    return out, state


def test_lookup_join_literal(workers):
    steps = [
        {"l": {(1, "x"): 1, (2, "y"): 2, (None, "n"): 1}, "r": {(1, 10): 1, (None, 0): 1}},
        {"r": {(2, 20): 1, (1, 10): -1}},          # past left rows keep their matches
        {"l": {(1, "x"): -1, (2, "z"): 1}, "r": {(1, 11): 1}},
    ]
    (d0, _), (d1, _), (d2, _) = _run(workers, L, R, steps, lambda a, b: a.lookup_join(b))[0]
    assert d0 == {(1, "x", 10): 1}
    assert d1 == {}
    assert d2 == {(1, "x", 11): -1, (2, "z", 20): 1}


def test_lookup_join_stores_only_the_right_side():
    steps = [{"r": {(1, 10): 1, (2, 20): 1}}] + [{"l": {(i % 3, f"v{i}"): 1}} for i in range(50)]
    out, state = _run(1, L, R, steps, lambda a, b: a.lookup_join(b))
    assert state == 2  # the two right rows; none of the 50 left rows
    assert sum(len(d) for d, _ in out) == 33  # the rows of keys 1 and 2 (i % 3 != 0)


@settings(max_examples=60)
@given(case=join_case())
@example(case=(L, R, [{"l": {(1, "a"): 1}, "r": {(1, 2): -1}}, {"r": {(1, 2): 2}},
                      {"l": {(1, "a"): 1}}]))
def test_lookup_join_random(workers, case):
    ls, rs, steps = case
    out, _ = _run(workers, ls, rs, steps, lambda a, b: a.lookup_join(b))
    for t, (got, want) in enumerate(out):
        assert got == want, f"step {t}, {workers} worker(s)"


# -- lookup_join_rows: plain left rows, a broadcast right side --------------------------------

def _rows_join(a, b):
    return lookup_join_rows(a, ["k"], b.index_by(["k"]))


def _run_rows(workers, ls, rs, steps):
    out = []
    with dbsp.Circuit(workers=workers) as c:
        a, b = c.add_input("l", ls), c.add_input("r", rs)
        o = _rows_join(a, b).output()
        ib: dict = {}
        for step in steps:
            push_dict(a, step.get("l", {}))
            push_dict(b, step.get("r", {}))
            c.step()
            ib = ref.add(ib, step.get("r", {}))
            out.append((o.to_dict(), ref.join(step.get("l", {}), ib, [0], [0])))
        state = c.state_rows()
    return out, state


def test_lookup_join_rows_literal(workers):
    steps = [
        {"l": {(1, "x"): 1, (2, "y"): 2, (None, "n"): 1}, "r": {(1, 10): 1, (None, 0): 1}},
        {"r": {(2, 20): 1, (1, 10): -1}},          # past left rows keep their matches
        {"l": {(1, "x"): -1, (2, "z"): 1, (1, "w"): 3}, "r": {(1, 11): 1, (1, 12): 2}},
    ]
    (d0, _), (d1, _), (d2, _) = _run_rows(workers, L, R, steps)[0]
    assert d0 == {(1, "x", 10): 1}
    assert d1 == {}
    assert d2 == {(1, "x", 11): -1, (1, "x", 12): -2, (2, "z", 20): 1, (1, "w", 11): 3,
                  (1, "w", 12): 6}


def test_lookup_join_rows_broadcasts_the_right_side(workers):
    """Every worker keeps the whole right side; no left row is stored."""
    steps = [{"r": {(1, 10): 1, (2, 20): 1}}] + [{"l": {(i % 3, f"v{i}"): 1}} for i in range(50)]
    out, state = _run_rows(workers, L, R, steps)
    assert state == 2 * workers
    assert sum(len(d) for d, _ in out) == 33


@settings(max_examples=60)
@given(case=join_case())
@example(case=(L, R, [{"l": {(1, "a"): 1}, "r": {(1, 2): -1}}, {"r": {(1, 2): 2}},
                      {"l": {(1, "a"): 1}}]))
def test_lookup_join_rows_random(workers, case):
    ls, rs, steps = case
    out, _ = _run_rows(workers, ls, rs, steps)
    for t, (got, want) in enumerate(out):
        assert got == want, f"step {t}, {workers} worker(s)"


def test_lookup_join_rows_checks_keys():
    c = dbsp.Circuit()
    a, b = c.add_input("l", L), c.add_input("r", R)
    with pytest.raises(KeyError, match="nope"):
        lookup_join_rows(a, ["nope"], b.index_by(["k"]))
    with pytest.raises(TypeError, match="key schemas differ"):
        lookup_join_rows(a, ["a"], b.index_by(["k"]))
    with pytest.raises(TypeError, match="indexed"):
        lookup_join_rows(a, ["k"], b)


def test_api_join_how_lookup(workers):
    ctx = dbsp.StreamContext(workers=workers)
    bids = ctx.stream(pa.schema([("auction", pa.int64()), ("price", pa.int64())]), name="bid")
    side = ctx.stream(pa.schema([("key", pa.int64()), ("value", pa.string())]), name="side")
    out = bids.join(side, left_on="auction", right_on="key", how="lookup").collect("o")
    with ctx.circuit:
        side.push(pa.table({"key": [1, 2], "value": ["a", "b"]}))
        bids.push(pa.table({"auction": [1, 1, 3], "price": [5, 6, 7]}))
        ctx.step()
        side.push(pa.table({"key": [3], "value": ["c"]}))
        ctx.step()
        view = out.handle.view().to_arrow().sort_by("price").to_pydict()
    assert view["auction"] == [1, 1] and view["value"] == ["a", "a"]
    with pytest.raises(ValueError, match="lookup"):
        bids.join(side, left_on="auction", right_on="key", how="outer")


def test_q13_is_a_lookup_join():
    """q13 keeps the side input in state, never the bids."""
    from dbsp.nexmark.generator import (AUCTION_SCHEMA, BID_SCHEMA, PERSON_SCHEMA,
                                        SIDE_INPUT_SCHEMA, NexmarkGenerator, side_input)
    ctx = dbsp.StreamContext()
    schemas = {"person": PERSON_SCHEMA, "auction": AUCTION_SCHEMA, "bid": BID_SCHEMA,
               "side_input": SIDE_INPUT_SCHEMA}
    s = {k: ctx.stream(v, name=k) for k, v in schemas.items()}
    q13(s).collect("q13", view=False)
    with ctx.circuit:
        s["side_input"].push(side_input())
        for b in NexmarkGenerator(seed=1).iter_batches(20_000, 5_000):
            s["bid"].push(b.bid)
            ctx.step()
        assert ctx.circuit.state_rows() == 10_000
