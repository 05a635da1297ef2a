"""The driver's split of an input that ``index_by`` reads (W > 1): its rows sorted and
consolidated once by (key code, value code) and dealt in that order (:class:`KeyedZSet`), each
worker's ``index_by`` then neither sorting nor gathering them again. Output identical to one
worker's, with duplicate rows, zero sums, several key columns, and the general path (nulls,
strings: the rows dealt as they are)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dbsp
from dbsp.circuit.exchange import as_shard_map
from dbsp.trace.batch import KeyedZSet, OrdIndexedZSet, ZSet

FIXED = pa.schema([pa.field("k", pa.int32(), nullable=False),
                   pa.field("j", pa.int16(), nullable=False),
                   pa.field("v", pa.int32(), nullable=False)])
WIDE = pa.schema([pa.field("k", pa.int32(), nullable=False),
                  pa.field("j", pa.int16(), nullable=False),
                  pa.field("v", pa.int64(), nullable=False)])  # (by k: values past 64 bits)
NULLS = pa.schema([pa.field("k", pa.int32(), nullable=False),
                   pa.field("j", pa.int16(), nullable=False),
                   pa.field("v", pa.int64())])  # (a null now and then: the general path)
STRINGS = pa.schema([pa.field("k", pa.int32(), nullable=False),
                     pa.field("j", pa.int16(), nullable=False),
                     pa.field("v", pa.string(), nullable=False)])
DIMS = pa.schema([pa.field("k", pa.int32(), nullable=False),
                  pa.field("j", pa.int16(), nullable=False),
                  pa.field("d", pa.int64(), nullable=False)])


def _circuit(workers: int, schema: pa.Schema, key: list, runtime: str = "threads",
             dims_schema: pa.Schema = DIMS):
    c = dbsp.Circuit(workers=workers, runtime=runtime)
    rows, dims = c.add_input("rows", schema), c.add_input("dims", dims_schema)
    joined = rows.index_by(key).join(dims.index_by(key))
    outs = {"join": joined.output("join", view=False),
            "count": rows.index_by(key).aggregate({"n": ("count", None)}).output("count",
                                                                                 view=False)}
    return c, outs


def _run(workers: int, schema: pa.Schema, key: list, steps: list,
         runtime: str = "threads", dims_schema: pa.Schema = DIMS) -> list:
    c, outs = _circuit(workers, schema, key, runtime, dims_schema)
    got = []
    try:
        for rows, w, dims in steps:
            c.inputs["rows"].push(pa.Table.from_pylist(rows, schema=schema), np.array(w, np.int64))
            c.inputs["dims"].push(pa.Table.from_pylist(dims, schema=dims_schema))
            c.step()
            got.append({n: o.delta().to_dict() for n, o in outs.items()})
    finally:
        c.close()
    return got


def _steps(schema: pa.Schema):
    def value(i):
        if schema is STRINGS:
            return f"s{i}"
        return None if schema is NULLS and i == 0 else i
    row = st.builds(lambda k, j, v: {"k": k, "j": j, "v": value(v)},
                    st.integers(-3, 3), st.integers(0, 1), st.integers(0, 3))
    dim = st.builds(lambda k, j, d: {"k": k, "j": j, "d": d},
                    st.integers(-3, 3), st.integers(0, 1), st.integers(0, 2))
    step = st.integers(0, 30).flatmap(lambda n: st.tuples(
        st.lists(row, min_size=n, max_size=n),
        st.lists(st.integers(-2, 2), min_size=n, max_size=n),
        st.lists(dim, max_size=6)))
    return st.lists(step, min_size=1, max_size=3)


@pytest.mark.parametrize("schema", [FIXED, WIDE, NULLS, STRINGS],
                         ids=["fixed", "wide", "nulls", "strings"])
@pytest.mark.parametrize("key", [["k"], ["k", "j"]], ids=["k", "kj"])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_split_sorted_for_index_by_matches_one_worker(schema, key, data):
    steps = data.draw(_steps(schema))
    # the other side of the join with key columns of the same or the other nullability (the
    # join then recodes one side's keys, and its exchange hashes the recoded codes)
    dims = DIMS if data.draw(st.booleans()) else \
        pa.schema([f.with_nullable(f.name in key) for f in DIMS])
    want = _run(1, schema, key, steps, dims_schema=dims)
    assert _run(2, schema, key, steps, dims_schema=dims) == want
    assert _run(3, schema, key, steps, dims_schema=dims) == want


@pytest.mark.parametrize("nullable", ["rows", "dims"])
def test_a_join_of_keys_of_other_nullability_deals_both_sides_alike(nullable):
    """A join recodes one side's keys to the other's nullability, and its exchange hashes
    the recoded codes: the side whose own codes differ is not dealt sorted by them (it was:
    a row went to a worker its partner was not on, and the join lost it)."""
    def loosen(schema):
        return pa.schema([f.with_nullable(True) if f.name == "k" else f for f in schema])
    rows_schema = loosen(FIXED) if nullable == "rows" else FIXED
    dims_schema = loosen(DIMS) if nullable == "dims" else DIMS
    steps = [([{"k": k, "j": 0, "v": k % 3} for k in range(40)], [1] * 40,
              [{"k": k, "j": 0, "d": k} for k in range(40)]),
             ([{"k": k, "j": 0, "v": k % 3} for k in range(0, 40, 3)], [-1] * 14, [])]
    want = _run(1, rows_schema, ["k"], steps, dims_schema=dims_schema)
    assert len(want[0]["join"]) == 40
    for w in (2, 3):
        assert _run(w, rows_schema, ["k"], steps, dims_schema=dims_schema) == want


def test_split_hands_index_by_sorted_rows():
    """Two workers, fixed-width columns: each worker's part is a KeyedZSet of its rows sorted
    and consolidated; index_by builds from it what it builds from the same rows loose."""
    c, _ = _circuit(2, FIXED, ["k"])
    try:
        rows = [{"k": k % 5, "j": 0, "v": k % 3} for k in range(40)]
        w = np.array([1 if i % 7 else -1 for i in range(40)], np.int64)
        inp = c.inputs["rows"]
        inp.push(pa.Table.from_pylist(rows, schema=FIXED), w)
        c.step()  # (the placement is worked out at the first step)
        inp.push(pa.Table.from_pylist(rows, schema=FIXED), w)
        key = c._placement.input_keys[inp.node]
        parts = inp._split(as_shard_map(c.layout), key)
        assert all(type(p) is KeyedZSet for p in parts if p is not None)
        sums: dict = {}
        for r, x in zip(rows, w):
            sums[(r["k"], r["v"])] = sums.get((r["k"], r["v"]), 0) + int(x)
        assert sum(len(p) for p in parts if p is not None) == sum(1 for x in sums.values() if x)
        for p in parts:
            if p is None:
                continue
            assert p.key == ("k",)
            got = OrdIndexedZSet.from_keyed(p, ["j", "v"], *_codecs())
            loose = OrdIndexedZSet.from_loose(ZSet(p.data, p.weights), ["k"])
            assert got.flatten().to_dict() == loose.flatten().to_dict()
            np.testing.assert_array_equal(got.kcodes, loose.kcodes)
            np.testing.assert_array_equal(got.offsets, loose.offsets)
            np.testing.assert_array_equal(got.vcodes, loose.vcodes)
            np.testing.assert_array_equal(got.weights, loose.weights)
            assert got.keys.equals(loose.keys) and got.vals.equals(loose.vals)
    finally:
        c.close()


def test_keyed_zset_crosses_processes():
    """A worker process gets its part as it was dealt (its codes encoded again on arrival),
    and the output is one worker's."""
    from dbsp.runtime import wire_types  # noqa: F401  (the makers registered)
    from dbsp.storage import wire
    rows = pa.Table.from_pylist([{"k": k % 7, "j": k % 2, "v": k % 3} for k in range(50)],
                                schema=FIXED).to_batches()[0]
    c, _ = _circuit(2, FIXED, ["k"])
    try:
        inp = c.inputs["rows"]
        inp.push(rows)
        c.step()
        inp.push(rows)
        parts = inp._split(as_shard_map(c.layout), c._placement.input_keys[inp.node])
    finally:
        c.close()
    for p in parts:
        frames = wire.dumps(p)
        back = wire.loads(b"".join(bytes(memoryview(f).cast("B")) for f in frames))
        assert type(back) is KeyedZSet and back.key == p.key
        assert back.data.equals(p.data)
        for a, b in ((back.weights, p.weights), (back.kcodes, p.kcodes), (back.vcodes, p.vcodes)):
            np.testing.assert_array_equal(a, b)
    steps = [([{"k": k % 7, "j": k % 2, "v": k % 3} for k in range(50)], [1] * 50,
              [{"k": k, "j": 0, "d": k} for k in range(7)])] * 2
    want = _run(1, FIXED, ["k"], steps)
    assert _run(2, FIXED, ["k"], steps, runtime="processes") == want


def test_split_sorts_only_small_steps_the_runtime_lets_it():
    """A step of SORTED_DEAL_ROWS rows a worker or more, or a runtime that says no (worker
    processes), is dealt as it is: the workers sort their own parts in parallel."""
    from dbsp.circuit.exchange import SORTED_DEAL_ROWS
    c, _ = _circuit(2, FIXED, ["k"])
    try:
        inp = c.inputs["rows"]
        small = pa.Table.from_pylist([{"k": k % 5, "j": 0, "v": 1} for k in range(40)],
                                     schema=FIXED)
        inp.push(small)
        c.step()
        key = c._placement.input_keys[inp.node]
        shards = as_shard_map(c.layout)
        inp.push(small)
        assert {type(p) for p in inp._split(shards, key, sort=False)} == {ZSet}
        n = 2 * SORTED_DEAL_ROWS
        big = pa.record_batch([pa.array(np.arange(n) % 97, pa.int32()),
                               pa.array(np.zeros(n), pa.int16()),
                               pa.array(np.arange(n), pa.int32())], schema=FIXED)
        inp.push(big)
        assert {type(p) for p in inp._split(shards, key)} == {ZSet}
        inp.push(big.slice(0, n - 1))
        assert {type(p) for p in inp._split(shards, key)} == {KeyedZSet}
    finally:
        c.close()


def _codecs():
    from dbsp.algebra.codes import codec_for
    return codec_for(FIXED, ["k"]), codec_for(FIXED, ["j", "v"])
