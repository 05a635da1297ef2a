"""output: the handle's gather of the workers' parts (src/dbsp/operators/output.py).

Indexed parts become sorted parts (:class:`SortedPart`, row codes built when read) in the worker
and are summed by a merge of their key codes when their keys are disjoint, else with a k-way
merge by row code; the result must be what concatenating the flattened parts and consolidating
them from scratch gives (the path used before, and still used for loose parts), with rows shared
by several parts and retractions that cancel, whether the parts crossed a process boundary or
not."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dbsp.operators.output import _CODES, OutputHandle, OutputOperator, SortedPart
from dbsp.storage import wire
from dbsp.testing import strategies as S
from dbsp.trace.batch import OrdIndexedZSet, OrdZSet, ZSet


def _zset(schema: pa.Schema, z: dict) -> ZSet:
    rows = list(z)
    cols = list(zip(*rows)) if rows else [[] for _ in schema]
    data = pa.record_batch([pa.array(list(c), f.type) for f, c in zip(schema, cols)],
                           schema=schema)
    return ZSet(data, np.array([z[r] for r in rows], np.int64))


def _part(z: ZSet, nkey: int):
    """What a worker's output operator keeps of an aggregate-like indexed part."""
    op = OutputOperator(None)
    op.eval(OrdIndexedZSet.from_loose(z, z.schema.names[:nkey]))
    return op.last


def _old(schema: pa.Schema, parts: list) -> OrdZSet:
    """The gather before: the flattened parts concatenated, encoded and sorted from scratch."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return OrdZSet.empty(schema)
    data = pa.Table.from_batches([p.data for p in parts], schema=schema).combine_chunks()
    data = data.to_batches()[0] if data.num_rows else data.schema.empty_table().to_batches()
    return OrdZSet.from_loose(ZSet(data, np.concatenate([p.weights for p in parts])))


def _same_codes(a, b) -> None:
    if isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert a.to_list() == b.to_list()


def _same(a: OrdZSet, b: OrdZSet) -> None:
    assert a.to_arrow().equals(b.to_arrow())
    assert np.array_equal(np.asarray(a.weights), np.asarray(b.weights))


@settings(max_examples=150)
@given(schema=S.schemas(min_cols=2), data=st.data())
def test_gather_of_sorted_parts_is_the_full_consolidation(schema, data):
    nkey = data.draw(st.integers(1, len(schema) - 1))
    w = data.draw(st.integers(1, 4))
    # rows drawn from one small pool, so parts overlap and may cancel
    pool = data.draw(st.lists(S.rows(schema), min_size=1, max_size=6, unique=True))
    dicts = [data.draw(st.dictionaries(st.sampled_from(pool), st.sampled_from([-2, -1, 1, 3]),
                                       max_size=6)) for _ in range(w)]
    zs = [_zset(schema, d) for d in dicts]
    parts = [_part(z, nkey) for z in zs]
    for p, z in zip(parts, zs):
        if len(p):   # each worker's part: its codes are the row codes, strictly increasing
            assert type(p) is SortedPart
            full = OrdZSet.from_loose(z)
            _same(p, full)
            _same_codes(p.codes, full.codes)
    h = OutputHandle(0, schema, "o", keep_view=True)
    h._gather(parts)
    old = _old(schema, parts)
    _same(h.delta(), old)
    _same_codes(h.delta().codes, old.codes)
    h._gather(parts)
    assert h.view().to_dict() == _old(schema, parts + parts).to_dict()


def test_gather_sums_shared_rows_and_drops_cancelled_ones():
    schema = pa.schema([("k", pa.int64()), ("s", pa.string())])
    a = _part(_zset(schema, {(1, "x"): 1, (2, "y"): 2, (5, None): 1}), 1)
    b = _part(_zset(schema, {(1, "x"): -1, (2, "y"): 1, (3, "z"): 4}), 1)
    h = OutputHandle(0, schema, "o", keep_view=False)
    h._gather([a, b])
    assert h.delta().to_dict() == {(2, "y"): 3, (3, "z"): 4, (5, None): 1}
    assert h.delta().to_arrow().column("k").to_pylist() == [2, 3, 5]


def test_row_codes_put_together_from_key_and_value_codes():
    """Fixed-width rows: the part's codes come from the indexed batch's key and value codes
    (one uint64 a row up to 8 bytes, else fixed-length byte strings), equal to encoding them."""
    i32 = pa.schema([pa.field("k", pa.int32(), False), pa.field("v", pa.int16(), False)])
    mixed = pa.schema([pa.field("k", pa.int8(), False), pa.field("b", pa.bool_()),
                       pa.field("v", pa.int64())])
    i64 = pa.schema([("k", pa.int64()), ("n", pa.int64()), ("s", pa.int64())])
    for schema, z in ((i32, {(3, 2): 1, (-1, 5): 2, (3, -4): -1, (7, 0): 1}),
                      (mixed, {(3, True, 2): 1, (-1, None, 5): 2, (3, False, None): -1}),
                      (i64, {(3, 1, 2): 1, (None, 0, 5): 2, (3, 0, 4): -1, (7, 1, None): 1})):
        z = _zset(schema, z)
        p = _part(z, 1)
        _same_codes(p.codes, p.codec.encode_batch(p.data))
        _same(p, OrdZSet.from_loose(z))


def _wire(part):
    """``part`` as another process receives it."""
    return wire.loads(b"".join(bytes(memoryview(f).cast("B")) for f in wire.dumps(part)))


@settings(max_examples=150)
@given(schema=S.schemas(min_cols=2), data=st.data())
@example(schema=pa.schema([pa.field("k", pa.int64(), False), ("n", pa.int64()),
                           ("s", pa.int64())]), data=None)
def test_gather_of_key_disjoint_parts_is_the_full_consolidation(schema, data):
    """Parts of a stream sharded by key (every key on one worker): merged by key code, equal to
    the full consolidation, codes included; the same after the parts crossed the wire."""
    if data is None:   # pinned: an aggregate's -old/+new rows of int64 keys on two workers
        nkey, w, crossed = 1, 2, True
        z = {(1, 2, 3): -1, (1, 3, 5): 1, (4, 1, 1): 1, (2, 7, 0): 1, (2, 8, 9): -1}
        owner = {1: 0, 4: 0, 2: 1}
        dicts = [{r: x for r, x in z.items() if owner[r[0]] == i} for i in range(w)]
    else:
        nkey = data.draw(st.integers(1, len(schema) - 1))
        w = data.draw(st.integers(2, 4))
        crossed = data.draw(st.booleans())
        z = data.draw(st.dictionaries(S.rows(schema), st.sampled_from([-2, -1, 1, 3]),
                                      max_size=12))
        owners: dict = {}
        dicts = [{} for _ in range(w)]
        for r, x in z.items():   # a key's rows all go to one worker
            dicts[owners.setdefault(r[:nkey], data.draw(st.integers(0, w - 1)))][r] = x
    parts = [_part(_zset(schema, d), nkey) for d in dicts]
    if crossed:
        parts = [_wire(p) if len(p) else p for p in parts]
    h = OutputHandle(0, schema, "o", keep_view=True)
    h._gather(parts)
    old = _old(schema, parts)
    got = h.delta()
    _same(got, old)
    _same_codes(got.codes, old.codes)
    h._gather(parts)
    assert h.view().to_dict() == _old(schema, parts + parts).to_dict()


@settings(max_examples=100)
@given(data=st.data())
def test_parts_of_key_ranges_apart_are_concatenated_in_key_order(data):
    """Parts whose key ranges do not overlap (a stream split by key range), listed in any
    order: concatenated in the order of their first keys, equal to the full consolidation."""
    schema = pa.schema([pa.field("k", pa.int64(), False), ("v", pa.int64()), ("s", pa.string())])
    z = data.draw(st.dictionaries(st.tuples(st.integers(-2**63, 2**63 - 1) | st.integers(-5, 5),
                                            st.none() | st.integers(-3, 3),
                                            st.none() | st.sampled_from(["", "a", "b"])),
                                  st.sampled_from([-2, -1, 1, 3]), min_size=1, max_size=16))
    keys = sorted({r[0] for r in z})
    w = data.draw(st.integers(1, min(4, len(keys))))
    cuts = sorted(data.draw(st.sets(st.integers(1, len(keys) - 1), min_size=w - 1,
                                    max_size=w - 1)) if w > 1 else [])
    bounds = [keys[0]] + [keys[c] for c in cuts]
    dicts = [{} for _ in range(w)]
    for r, x in z.items():   # part i: the keys from bounds[i] on
        dicts[sum(r[0] >= b for b in bounds) - 1][r] = x
    order = data.draw(st.permutations(range(w)))
    parts = [_part(_zset(schema, dicts[i]), 1) for i in order]
    h = OutputHandle(0, schema, "o", keep_view=False)
    h._gather(parts)
    got = h.delta()
    old = _old(schema, parts)
    _same(got, old)
    _same_codes(got.codes, old.codes)
    if w > 1:
        assert type(got) is SortedPart   # merged by key codes, not by row code


def test_disjoint_parts_merge_by_key_and_codes_stay_unbuilt_until_read():
    schema = pa.schema([pa.field("k", pa.int64(), False), ("s", pa.string())])
    a = _part(_zset(schema, {(1, "x"): 1, (5, None): 1, (5, "a"): -1}), 1)
    b = _part(_zset(schema, {(2, "y"): 1, (3, "z"): 4}), 1)
    for crossed in (False, True):
        pa_, pb = (_wire(a), _wire(b)) if crossed else (a, b)
        h = OutputHandle(0, schema, "o", keep_view=False)
        h._gather([pa_, pb])
        d = h.delta()
        assert type(d) is SortedPart and _CODES.__get__(d) is None   # merged by key codes
        assert d.to_arrow().column("k").to_pylist() == [1, 2, 3, 5, 5]
        assert _CODES.__get__(d) is None   # reading Arrow builds no codes
        _same_codes(d.codes, d.codec.encode_batch(d.data))


def test_parts_sharing_a_key_are_merged_by_row_code():
    """A key on two workers (a stream not sharded by it): the key merge gives up, the row merge
    sums the rows."""
    schema = pa.schema([pa.field("k", pa.int64(), False), ("v", pa.int64())])
    a = _part(_zset(schema, {(1, 1): 1, (2, 5): 2}), 1)
    b = _part(_zset(schema, {(1, 1): 2, (1, 0): 1, (3, 3): 1}), 1)
    h = OutputHandle(0, schema, "o", keep_view=False)
    h._gather([a, b])
    assert h.delta().to_dict() == {(1, 1): 3, (1, 0): 1, (2, 5): 2, (3, 3): 1}
    assert h.delta().to_arrow().column("v").to_pylist() == [0, 1, 5, 3]



@settings(max_examples=100)
@given(schema=S.schemas(min_cols=2), data=st.data())
def test_view_folds_many_steps_of_sorted_parts_to_the_full_consolidation(schema, data):
    """A view folding several steps' sorted parts at once (they share keys: sorted from scratch
    past two parts, no key merge tried) holds the full consolidation of all of them."""
    nkey = data.draw(st.integers(1, len(schema) - 1))
    w = data.draw(st.integers(1, 3))
    steps = data.draw(st.integers(1, 5))
    crossed = data.draw(st.booleans())
    pool = data.draw(st.lists(S.rows(schema), min_size=1, max_size=6, unique=True))
    h = OutputHandle(0, schema, "o", keep_view=True)
    every = []
    for _ in range(steps):
        dicts = [data.draw(st.dictionaries(st.sampled_from(pool),
                                           st.sampled_from([-2, -1, 1, 3]), max_size=6))
                 for _ in range(w)]
        parts = [_part(_zset(schema, d), nkey) for d in dicts]
        if crossed:
            parts = [_wire(p) if len(p) else p for p in parts]
        every += parts
        h._gather(parts)
    got = h.view()
    old = _old(schema, every)
    _same(got, old)
    _same_codes(got.codes, old.codes)
