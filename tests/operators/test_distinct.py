"""distinct against the reference model, with 1 and 2 workers."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dbsp
from dbsp.testing import reference as ref
from dbsp.testing import strategies as S
from dbsp.testing.harness import check_steps

T = pa.schema([pa.field("x", pa.int64()), pa.field("s", pa.string())])


def test_distinct_literal(workers):
    steps = [
        {"t": {(1, "a"): 3, (2, "b"): -1, (None, None): 1}},
        {"t": {(1, "a"): -2, (2, "b"): 2}},      # 1 stays, 2 appears
        {"t": {(1, "a"): -1, (None, None): 1}},  # 1 goes, null row unchanged
        {"t": {(2, "b"): -1, (1, "a"): 1}},
        {},
    ]
    check_steps(workers, {"t": T}, lambda t: t.distinct(), ref.distinct, steps)


def test_distinct_of_distinct_and_after_join(workers):
    steps = [{"t": {(1, "a"): 2, (1, "b"): 1}}, {"t": {(1, "a"): -2}}]
    check_steps(workers, {"t": T}, lambda t: t.distinct().distinct(), ref.distinct, steps)
    check_steps(workers, {"t": T},
                lambda t: t.index_by(["x"]).join(t.index_by(["x"])).distinct(),
                lambda z: ref.distinct(ref.join(z, z, [0], [0])), steps)


def test_distinct_needs_a_zset_stream():
    c = dbsp.Circuit()
    t = c.add_input("t", T)
    with pytest.raises(TypeError, match="flatten"):
        from dbsp.operators.distinct import distinct
        distinct(t.index_by(["x"]))


@settings(max_examples=100)
@given(schema=S.schemas(), data=st.data())
def test_distinct_random(workers, schema, data):
    steps = [{"t": d} for d in data.draw(S.deltas(schema, steps=5))]
    check_steps(workers, {"t": schema}, lambda t: t.distinct(), ref.distinct, steps)
