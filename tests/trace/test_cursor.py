"""Cursors against nested-dict models: full walks, seeks to present and absent keys and values,
rewinds, ``keys_between``, and the merging cursor over several batches (values consolidated
across batches, zero weights and fully cancelled keys skipped)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trace_model import (
    code,
    examples,
    indexed,
    indexed_model,
    indexed_rows,
    rows,
    schemas,
    state_of,
    values,
    zset,
)

from dbsp.trace.batch import OrdIndexedZSet
from dbsp.trace.cursor import cursor_for
from dbsp.trace.spine_cursor import SpineCursor

SETTINGS = settings(max_examples=examples(50), deadline=None)
I64 = pa.schema([("k", pa.int64())])


def walk(c) -> list:
    """Every (key, val, weight) of a cursor, in cursor order."""
    out = []
    while c.key_valid():
        assert c.val_valid(), "a key without values"
        while c.val_valid():
            out.append((c.key(), c.val(), c.weight()))
            c.step_val()
        c.step_key()
    return out


def sorted_model(model: dict, kcodec, vcodec=None) -> list:
    """The model as (key, val, weight) in code order."""
    def sk(kv):
        k, v = kv[0]
        return (code(kcodec, k), code(vcodec, v) if vcodec is not None else b"")
    return [(k, v, w) for (k, v), w in sorted(model.items(), key=sk)]


def check_walk(c, want: list) -> None:
    got = walk(c)
    assert [(k, v) for k, v, _ in got] == [(k, v) for k, v, _ in want]  # order too
    assert state_of_triples(got) == state_of_triples(want)


def state_of_triples(t):
    return {(k, v): w for k, v, w in t}


@SETTINGS
@given(st.data())
def test_batch_cursor_walk_seek_rewind(data):
    ks, vs = data.draw(schemas(1, 2, "k")), data.draw(schemas(0, 2, "v"))
    b = indexed(ks, vs, data.draw(indexed_rows(ks, vs, 16)))
    model = state_of([b])
    want = sorted_model(model, b.kcodec, b.vcodec)
    c = cursor_for(b)
    check_walk(c, want)
    c.rewind_keys()
    check_walk(c, want)

    # seeks, ascending targets: each lands on the first key >= target (present or absent)
    targets = sorted(data.draw(st.lists(values(ks), max_size=4)), key=lambda t: code(b.kcodec, t))
    c.rewind_keys()
    keys = sorted({k for k, _, _ in want}, key=lambda k: code(b.kcodec, k))
    for t in targets:
        c.seek_key(t)
        tc = code(b.kcodec, t)
        nxt = [k for k in keys if code(b.kcodec, k) >= tc]
        if not nxt:
            assert not c.key_valid()
            break
        assert c.key_valid() and c.key_code() == code(b.kcodec, nxt[0])
        vals = [(v, w) for k, v, w in want if k == nxt[0]]
        got = []
        while c.val_valid():
            got.append((c.val(), c.weight()))
            c.step_val()
        assert got == vals
        c.rewind_vals()
        if len(vs):  # seek a value of this key (present or absent)
            vt = data.draw(values(vs))
            vc = code(b.vcodec, vt)
            c.seek_val(vt)
            rest = [(v, w) for v, w in vals if code(b.vcodec, v) >= vc]
            if rest:
                assert c.val_valid() and (c.val(), c.weight()) == rest[0]
            else:
                assert not c.val_valid()
            c.rewind_vals()
            assert c.val_valid() and (c.val(), c.weight()) == vals[0]


@SETTINGS
@given(st.data())
def test_zset_cursor(data):
    s = data.draw(schemas(1, 3))
    z = zset(s, data.draw(rows(s, 16)))
    want = sorted(((r, (), w) for r, w in z.to_dict().items()), key=lambda t: code(z.codec, t[0]))
    c = cursor_for(z)
    check_walk(c, want)
    t = data.draw(values(s))
    c.rewind_keys()
    c.seek_key(t)
    rest = [r for r, _, _ in want if code(z.codec, r) >= code(z.codec, t)]
    assert c.key_valid() == bool(rest)
    if rest:
        assert c.key() == rest[0] or code(z.codec, c.key()) == code(z.codec, rest[0])
        c.step_val()
        assert not c.val_valid()
        c.rewind_vals()
        assert c.val_valid() and c.val() == ()


@SETTINGS
@given(st.data())
def test_spine_cursor_matches_model(data):
    ks, vs = data.draw(schemas(1, 2, "k")), data.draw(schemas(0, 1, "v"))
    k = data.draw(st.integers(1, 6))
    parts = [data.draw(indexed_rows(ks, vs, 10)) for _ in range(k)]
    if data.draw(st.booleans()) and parts[0]:  # a batch and its retraction cancel
        parts.append([(kk, v, -w) for kk, v, w in parts[0]])
    batches = [indexed(ks, vs, p) for p in parts]
    model = indexed_model([r for p in parts for r in p])
    b0 = batches[0]
    want = sorted_model(model, b0.kcodec, b0.vcodec)
    c = SpineCursor(batches)
    check_walk(c, want)
    c.rewind_keys()
    check_walk(c, want)
    # seek absent/present keys across batches, forward only
    keys = sorted({kk for kk, _, _ in want}, key=lambda x: code(b0.kcodec, x))
    c.rewind_keys()
    for t in sorted(data.draw(st.lists(values(ks), max_size=3)), key=lambda x: code(b0.kcodec, x)):
        c.seek_key(t)
        nxt = [x for x in keys if code(b0.kcodec, x) >= code(b0.kcodec, t)]
        assert c.key_valid() == bool(nxt)
        if nxt:
            assert c.key_code() == code(b0.kcodec, nxt[0])
            got = []
            while c.val_valid():
                got.append((c.val(), c.weight()))
                c.step_val()
            assert got == [(v, w) for kk, v, w in want if kk == nxt[0]]
            c.rewind_vals()  # the next target may be this key again
    # keys_between == the model restricted to the code range
    lo, hi = sorted([data.draw(values(ks)), data.draw(values(ks))],
                    key=lambda x: code(b0.kcodec, x))
    r = c.keys_between(lo, hi)
    sub = {kv: w for kv, w in model.items()
           if code(b0.kcodec, lo) <= code(b0.kcodec, kv[0]) < code(b0.kcodec, hi)}
    assert (state_of([r]) if r is not None else {}) == sub


def test_spine_cursor_literal():
    ks, vs = I64, pa.schema([("v", pa.string())])
    a = indexed(ks, vs, [((1,), ("x",), 1), ((1,), ("y",), 2), ((3,), ("z",), 1)])
    b = indexed(ks, vs, [((1,), ("y",), -2), ((2,), ("q",), 5), ((3,), ("z",), -1)])
    c = SpineCursor([a, b])
    assert walk(c) == [((1,), ("x",), 1), ((2,), ("q",), 5)]  # key 3 cancels entirely
    c.rewind_keys()
    c.seek_key((2,))
    assert c.key() == (2,)
    c.seek_key((1,))  # seeking backwards is a no-op
    assert c.key() == (2,)
    c.seek_key((3,))
    assert not c.key_valid()
    c.rewind_keys()
    c.seek_val(("y",))  # y's weights cancel: absent
    assert not c.val_valid()


def test_spine_cursor_zsets_sum_weights():
    a = zset(I64, [((1,), 1), ((2,), 1)])
    b = zset(I64, [((1,), -1), ((2,), 3), ((4,), 1)])
    assert walk(SpineCursor([a, b])) == [((2,), (), 4), ((4,), (), 1)]


def test_spine_cursor_many_values_vectorised():
    # a key with more values than the Python consolidation threshold (256)
    vs = pa.schema([("v", pa.int64())])
    n = 400
    a = indexed(I64, vs, [((7,), (i,), 1) for i in range(n)])
    b = indexed(I64, vs, [((7,), (i,), -1) for i in range(0, n, 2)] + [((8,), (0,), 1)])
    c = SpineCursor([a, b])
    got = walk(c)
    assert got == [((7,), (i,), 1) for i in range(1, n, 2)] + [((8,), (0,), 1)]
    c.rewind_keys()
    c.seek_val((101,))
    assert c.val() == (101,)
    c.seek_val((102,))
    assert c.val() == (103,)


@pytest.mark.parametrize("nullable", [False, True], ids=["u64", "var"])
def test_seek_gallops_over_long_runs(nullable):
    ks = pa.schema([pa.field("k", pa.int64(), nullable=nullable)])
    vs = pa.schema([("v", pa.int64())])
    b = indexed(ks, vs, [((i,), (0,), 1) for i in range(0, 3000, 3)])
    assert isinstance(b.kcodes, np.ndarray) != nullable
    c = cursor_for(b)
    for t in [0, 1, 2, 3, 301, 1500, 2998, 2999]:
        c.seek_key((t,))
        want = ((t + 2) // 3) * 3
        if want < 3000:
            assert c.key() == (want,)
        else:
            assert not c.key_valid()
    c.rewind_keys()
    c.seek_key_code(code(b.kcodec, (1500,)))
    assert c.key() == (1500,)


def test_keys_between_batch_cursor_is_a_slice():
    vs = pa.schema([("v", pa.int64())])
    b = indexed(I64, vs, [((i,), (i,), 1) for i in range(10)])
    s = cursor_for(b).keys_between((3,), (6,))
    assert isinstance(s, OrdIndexedZSet)
    assert state_of([s]) == {((i,), (i,)): 1 for i in (3, 4, 5)}
    assert np.shares_memory(s.weights, b.weights)
    z = zset(I64, [((i,), 1) for i in range(10)])
    assert cursor_for(z).keys_between(None, (2,)).to_dict() == {(0,): 1, (1,): 1}


def test_seek_to_the_current_key_keeps_the_value_position():
    """Shrunk counterexample (of the test's own model): seeking the key the cursor is on is a
    no-op, so values already stepped over stay consumed until ``rewind_vals``."""
    ks = pa.schema([pa.field("k0", pa.binary(), nullable=False),
                    pa.field("k1", pa.binary(), nullable=False)])
    b = indexed(ks, pa.schema([]), [((b"", b""), (), -2)])
    c = SpineCursor([b, indexed(ks, pa.schema([]), [((b"x", b""), (), 1)])])
    c.seek_key((b"", b""))
    assert c.val_valid() and c.weight() == -2
    c.step_val()
    c.seek_key((b"", b""))
    assert c.key_valid() and not c.val_valid()
    c.rewind_vals()
    assert c.val_valid() and c.weight() == -2
