"""The linear operators (map, filter, flat_map and their per-row forms, plus, minus, neg,
index_by / flatten, consolidate, shard) and the temporal ones (delay, integrate, differentiate),
against the reference model with 1 and 2 workers.

Linear operators are checked three ways each step: the delta against ``ref(Δ)`` and against
``ref(I_t) - ref(I_{t-1})``, and the integrated output against ``ref(I_t)``.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from dbsp.testing import reference as ref
from dbsp.testing import strategies as S
from dbsp.testing.harness import check_steps, run_steps

T = pa.schema([pa.field("x", pa.int64()), pa.field("s", pa.string())])
STEPS = [
    {"t": {(1, "a"): 1, (2, "b"): 2, (None, "c"): 1}},
    {"t": {(1, "a"): -1, (3, None): 1}},
    {},
    {"t": {(2, "b"): -2, (5, "é"): 3}},
]


def _one(schema, build, reference, steps, workers, linear=True):
    check_steps(workers, {"t": schema}, build, reference, steps, linear=linear)


# -- map ---------------------------------------------------------------------------------------

def _swap(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([b.column(b.num_columns - 1), b.column(0)],
                                      names=["last", "first"])


def test_map_literal(workers):
    _one(T, lambda t: t.map(lambda b: {"y": pc.multiply(b["x"], 10)}),
         lambda z: ref.map_rows(z, lambda r: (None if r[0] is None else r[0] * 10,)),
         STEPS, workers)


def test_map_rows_literal(workers):
    _one(T, lambda t: t.map_rows(lambda r: (r[1], r[0] is None), [("s", pa.string()),
                                                                   ("n", pa.bool_())]),
         lambda z: ref.map_rows(z, lambda r: (r[1], r[0] is None)), STEPS, workers)


@settings(max_examples=40)
@given(schema=S.schemas(), data=st.data())
def test_map_random(workers, schema, data):
    steps = [{"t": d} for d in data.draw(S.deltas(schema))]
    _one(schema, lambda t: t.map(_swap), lambda z: ref.map_rows(z, lambda r: (r[-1], r[0])),
         steps, workers)


@settings(max_examples=40)
@given(schema=S.schemas(), data=st.data())
def test_map_rows_random(workers, schema, data):
    steps = [{"t": d} for d in data.draw(S.deltas(schema))]
    out = pa.schema([schema.field(0).with_nullable(True), pa.field("n", pa.bool_())])
    _one(schema, lambda t: t.map_rows(lambda r: (r[0], r[0] is None), out),
         lambda z: ref.map_rows(z, lambda r: (r[0], r[0] is None)), steps, workers)


# -- filter ------------------------------------------------------------------------------------

def test_filter_literal(workers):
    _one(T, lambda t: t.filter(lambda b: pc.greater(b["x"], 1)),
         lambda z: ref.filter_rows(z, lambda r: r[0] is not None and r[0] > 1), STEPS, workers)


def test_filter_rows_literal(workers):
    _one(T, lambda t: t.filter_rows(lambda r: r[1] == "a" or r[0] == 5),
         lambda z: ref.filter_rows(z, lambda r: r[1] == "a" or r[0] == 5), STEPS, workers)


@settings(max_examples=40)
@given(schema=S.schemas(), data=st.data())
def test_filter_random(workers, schema, data):
    v = data.draw(S.value_strategy(schema.field(0).with_nullable(False)))
    steps = [{"t": d} for d in data.draw(S.deltas(schema))]
    scalar = pa.scalar(v, schema.field(0).type)
    _one(schema, lambda t: t.filter(lambda b: pc.not_equal(b.column(0), scalar)),
         lambda z: ref.filter_rows(z, lambda r: r[0] is not None and r[0] != v), steps, workers)


@settings(max_examples=40)
@given(schema=S.schemas(), data=st.data())
def test_filter_rows_random(workers, schema, data):
    v = data.draw(S.value_strategy(schema.field(0).with_nullable(False)))
    steps = [{"t": d} for d in data.draw(S.deltas(schema))]
    pred = (lambda r: r[0] is not None and r[0] != v)
    _one(schema, lambda t: t.filter_rows(pred), lambda z: ref.filter_rows(z, pred), steps,
         workers)


# -- flat_map ----------------------------------------------------------------------------------

def _twice_if_valid(b: pa.RecordBatch):
    valid = np.asarray(b.column(0).is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    parent = np.repeat(np.flatnonzero(valid), 2)
    return b.take(pa.array(parent, pa.int64())), parent


def _twice_ref(r):
    return [r, r] if r[0] is not None else []


def test_flat_map_literal(workers):
    _one(T, lambda t: t.flat_map(_twice_if_valid, T), lambda z: ref.flat_map_rows(z, _twice_ref),
         STEPS, workers)


def test_flat_map_rows_literal(workers):
    f = (lambda r: [(r[1],)] * (r[0] or 0) if r[0] is not None and r[0] > 0 else [])
    _one(T, lambda t: t.flat_map_rows(f, [("s", pa.string())]), lambda z: ref.flat_map_rows(z, f),
         STEPS, workers)


@settings(max_examples=40)
@given(schema=S.schemas(), data=st.data())
def test_flat_map_random(workers, schema, data):
    steps = [{"t": d} for d in data.draw(S.deltas(schema))]
    _one(schema, lambda t: t.flat_map(_twice_if_valid, schema),
         lambda z: ref.flat_map_rows(z, _twice_ref), steps, workers)


@settings(max_examples=40)
@given(schema=S.schemas(), data=st.data())
def test_flat_map_rows_random(workers, schema, data):
    steps = [{"t": d} for d in data.draw(S.deltas(schema))]
    out = pa.schema([schema.field(len(schema) - 1).with_nullable(True)])
    f = (lambda r: [(r[-1],)] * (1 if r[0] is None else 2))
    _one(schema, lambda t: t.flat_map_rows(f, out), lambda z: ref.flat_map_rows(z, f), steps,
         workers)


# -- plus, minus, neg --------------------------------------------------------------------------

def test_plus_minus_neg_literal(workers):
    steps = [{"a": {(1, "a"): 1}, "b": {(1, "a"): 2, (2, "x"): -1}, "c": {(9, None): 1}},
             {"a": {(2, "x"): 1}, "b": {(1, "a"): -2}}]
    sch = {"a": T, "b": T, "c": T}
    check_steps(workers, sch, lambda a, b, c: a.plus(b, c), ref.add, steps, linear=True)
    check_steps(workers, sch, lambda a, b, c: a.minus(b), lambda a, b, c: ref.sub(a, b), steps,
                linear=True)
    check_steps(workers, sch, lambda a, b, c: c.neg(), lambda a, b, c: ref.neg(c), steps,
                linear=True)


@settings(max_examples=40)
@given(schema=S.schemas(), data=st.data(), op=st.sampled_from(["plus", "minus", "neg"]))
def test_plus_minus_neg_random(workers, schema, data, op):
    da, db = data.draw(S.deltas(schema)), data.draw(S.deltas(schema))
    steps = [{"a": x, "b": y} for x, y in zip(da, db)]
    build = {"plus": lambda a, b: a.plus(b), "minus": lambda a, b: a.minus(b),
             "neg": lambda a, b: a.neg()}[op]
    refs = {"plus": ref.add, "minus": ref.sub, "neg": lambda a, b: ref.neg(a)}[op]
    check_steps(workers, {"a": schema, "b": schema}, build, refs, steps, linear=True)


# -- index_by / flatten, consolidate, shard ------------------------------------------------------

def test_index_flatten_consolidate_shard_literal(workers):
    _one(T, lambda t: t.index_by(["s"]).flatten(), lambda z: ref.reorder(z, [1]), STEPS, workers)
    _one(T, lambda t: t.index_by(["s", "x"]).shard().flatten(), lambda z: ref.reorder(z, [1, 0]),
         STEPS, workers)
    _one(T, lambda t: t.consolidate(), lambda z: z, STEPS, workers)
    _one(T, lambda t: t.shard(), lambda z: z, STEPS, workers)


@settings(max_examples=40)
@given(schema=S.schemas(), data=st.data(),
       op=st.sampled_from(["index", "index_shard", "consolidate", "shard", "int_diff"]))
def test_index_consolidate_shard_random(workers, schema, data, op):
    n = len(schema)
    key = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    names = [schema.names[i] for i in key]
    steps = [{"t": d} for d in data.draw(S.deltas(schema))]
    build = {
        "index": lambda t: t.index_by(names).flatten(),
        "index_shard": lambda t: t.index_by(names).shard().flatten(),
        "consolidate": lambda t: t.consolidate(),
        "shard": lambda t: t.shard(),
        "int_diff": lambda t: t.integrate().differentiate(),
    }[op]
    reference = (lambda z: ref.reorder(z, key)) if op.startswith("index") else (lambda z: z)
    _one(schema, build, reference, steps, workers)


# -- delay, integrate, differentiate ------------------------------------------------------------

def _temporal(schema, deltas, workers):
    steps = [{"t": d} for d in deltas] + [{}]
    outs = {op: run_steps(workers, {"t": schema}, build, steps) for op, build in {
        "delay": lambda t: t.delay(),
        "integrate": lambda t: t.integrate(),
        "differentiate": lambda t: t.differentiate(),
        "integrate_delay": lambda t: t.integrate().delay(),
    }.items()}
    inputs = [s.get("t", {}) for s in steps]
    for i, d in enumerate(inputs):
        prev = inputs[i - 1] if i else {}
        integ = ref.integrate(inputs[:i + 1])
        assert outs["delay"][i] == prev, f"delay, step {i}"
        assert outs["integrate"][i] == integ, f"integrate, step {i}"
        assert outs["differentiate"][i] == ref.sub(d, prev), f"differentiate, step {i}"
        assert outs["integrate_delay"][i] == ref.integrate(inputs[:i]), f"I then z^-1, step {i}"


def test_delay_integrate_differentiate_literal(workers):
    _temporal(T, [s.get("t", {}) for s in STEPS], workers)


@settings(max_examples=30)
@given(schema=S.schemas(), data=st.data())
def test_delay_integrate_differentiate_random(workers, schema, data):
    _temporal(schema, data.draw(S.deltas(schema)), workers)
