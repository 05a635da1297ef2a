"""Timed batches against dict models: build, k-way merge, advance_times (compaction to a
frontier), to_untimed (sum over times), and their cursors' times."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st
from trace_model import (
    DOMAINS,
    add_into,
    check_indexed,
    check_zset,
    code,
    examples,
    record_batch,
    schemas,
    state_of,
    values,
)

from dbsp.trace.cursor import cursor_for
from dbsp.trace.timed import OrdKeyBatch, OrdValBatch, pack_codes, time_codes

SETTINGS = settings(max_examples=examples(50), deadline=None)
TIMES = st.integers(-2, 4)


def key_rows(ks):
    return st.lists(st.tuples(values(ks), TIMES, st.sampled_from([-2, -1, 1, 2])), max_size=12)


def val_rows(ks, vs):
    return st.lists(st.tuples(values(ks), values(vs), TIMES, st.sampled_from([-2, -1, 1, 2])),
                    max_size=12)


def kb(ks, rws) -> OrdKeyBatch:
    return OrdKeyBatch.from_parts(record_batch(ks, [k for k, _, _ in rws]),
                                  [t for _, t, _ in rws], [w for _, _, w in rws])


def vb(ks, vs, rws) -> OrdValBatch:
    return OrdValBatch.from_parts(record_batch(ks, [k for k, _, _, _ in rws]),
                                  record_batch(vs, [v for _, v, _, _ in rws]),
                                  [t for _, _, t, _ in rws], [w for _, _, _, w in rws])


def check_key_batch(b: OrdKeyBatch) -> None:
    kc = b.kcodes.tolist() if hasattr(b.kcodes, "tolist") else b.kcodes.to_list()
    assert all(x < y for x, y in zip(kc, kc[1:]))
    off = b.offsets.tolist()
    assert off[0] == 0 and off[-1] == len(b) and len(off) == b.num_keys + 1
    for i in range(b.num_keys):
        t = b.times[off[i]:off[i + 1]].tolist()
        assert t and all(x < y for x, y in zip(t, t[1:])), "times not strictly ascending"
    assert not (b.weights == 0).any()


def check_val_batch(b: OrdValBatch) -> None:
    ko, vo = b.key_offsets.tolist(), b.val_offsets.tolist()
    assert ko[0] == 0 and ko[-1] == b.num_vals and vo[0] == 0 and vo[-1] == len(b)
    kc = b.kcodes.tolist() if hasattr(b.kcodes, "tolist") else b.kcodes.to_list()
    vc = b.vcodes.tolist() if hasattr(b.vcodes, "tolist") else b.vcodes.to_list()
    assert all(x < y for x, y in zip(kc, kc[1:]))
    for i in range(b.num_keys):
        assert ko[i] < ko[i + 1]
        v = vc[ko[i]:ko[i + 1]]
        assert all(x < y for x, y in zip(v, v[1:]))
    for j in range(b.num_vals):
        t = b.times[vo[j]:vo[j + 1]].tolist()
        assert t and all(x < y for x, y in zip(t, t[1:]))
    assert not (b.weights == 0).any()


def key_model(rws, frontier=None):
    adv = (lambda t: t) if frontier is None else (lambda t: max(t, frontier))
    return add_into({}, (((k, adv(t)), w) for k, t, w in rws))


def val_model(rws, frontier=None):
    adv = (lambda t: t) if frontier is None else (lambda t: max(t, frontier))
    return add_into({}, (((k, v, adv(t)), w) for k, v, t, w in rws))


@SETTINGS
@given(st.data())
@example(data=None)
def test_key_batch(data):
    if data is None:  # pinned: two times of one key meet at the frontier and cancel
        ks = pa.schema([("k", pa.int64())])
        parts = [[((1,), 0, 1), ((1,), 1, -1), ((2,), 3, 1)]]
        frontier = 2
    else:
        ks = data.draw(schemas(1, 2, "k"))
        parts = [data.draw(key_rows(ks)) for _ in range(data.draw(st.integers(1, 6)))]
        frontier = data.draw(TIMES)
    batches = [kb(ks, p) for p in parts]
    for b, p in zip(batches, parts):
        check_key_batch(b)
        assert b.to_dict() == key_model(p)
    allr = [r for p in parts for r in p]
    nonempty = [b for b in batches if len(b)]
    m = OrdKeyBatch.merge(nonempty) if nonempty else OrdKeyBatch.empty(ks)
    check_key_batch(m)
    assert m.to_dict() == key_model(allr)
    a = m.advance_times(frontier)
    check_key_batch(a)
    assert a.to_dict() == key_model(allr, frontier)
    assert set(a.times.tolist()) <= {t for t in range(frontier, 5)}
    u = m.to_untimed()
    check_zset(u)
    assert u.to_dict() == add_into({}, ((k, w) for k, _, w in allr))
    assert a.to_untimed().to_dict() == u.to_dict()  # compaction never changes the sum
    c = cursor_for(m)
    got = {}
    while c.key_valid():
        for t, w in c.times():
            got[(c.key(), t)] = w
        assert c.weight() == sum(w for _, w in c.times())
        c.step_key()
    assert got == m.to_dict()


@SETTINGS
@given(st.data())
@example(data=None)
def test_val_batch(data):
    if data is None:  # pinned: a value whose times all cancel after advancing disappears
        ks, vs = pa.schema([("k", pa.string())]), pa.schema([("v", pa.int64())])
        parts = [[(("a",), (1,), 0, 1), (("a",), (1,), 1, -1), (("a",), (2,), 0, 1)],
                 [(("b",), (1,), 4, 2)]]
        frontier = 3
    else:
        ks, vs = data.draw(schemas(1, 2, "k")), data.draw(schemas(0, 2, "v"))
        parts = [data.draw(val_rows(ks, vs)) for _ in range(data.draw(st.integers(1, 6)))]
        frontier = data.draw(TIMES)
    batches = [vb(ks, vs, p) for p in parts]
    for b, p in zip(batches, parts):
        check_val_batch(b)
        assert b.to_dict() == val_model(p)
    allr = [r for p in parts for r in p]
    nonempty = [b for b in batches if len(b)]
    m = OrdValBatch.merge(nonempty) if nonempty else OrdValBatch.empty(ks, vs)
    check_val_batch(m)
    assert m.to_dict() == val_model(allr)
    a = m.advance_times(frontier)
    check_val_batch(a)
    assert a.to_dict() == val_model(allr, frontier)
    u = m.to_untimed()
    check_indexed(u)
    assert state_of([u]) == add_into({}, (((k, v), w) for k, v, _, w in allr))
    assert state_of([a.to_untimed()]) == state_of([u])
    c = cursor_for(m)
    got = {}
    while c.key_valid():
        while c.val_valid():
            for t, w in c.times():
                got[(c.key(), c.val(), t)] = w
            c.step_val()
        c.step_key()
    assert got == m.to_dict()


def test_from_untimed_roundtrip():
    from dbsp.trace.batch import OrdIndexedZSet, OrdZSet
    z = OrdZSet.from_arrow(pa.record_batch({"a": [3, 1, 2, 1]}))
    k = OrdKeyBatch.from_zset(z, 5)
    assert k.to_dict() == {((1,), 5): 2, ((2,), 5): 1, ((3,), 5): 1}
    assert k.to_untimed().to_dict() == z.to_dict()
    iz = OrdIndexedZSet.from_loose(z.index_by(["a"]).flatten(), ["a"])
    v = OrdValBatch.from_indexed(iz, 2)
    check_val_batch(v)
    assert state_of([v.to_untimed()]) == state_of([iz])


def test_pack_codes_orders_like_tuples():
    import numpy as np
    s = pa.schema([("s", pa.string())])
    strs = ["", "a", "a\x00", "ab", "b"]
    from dbsp.algebra.codes import KeyCodec
    vc = KeyCodec(list(s)).encode(record_batch(s, [(x,) for x in strs]).columns)
    times = np.asarray([5, -1, 0, 3, -7], np.int64)
    packed = pack_codes(vc, time_codes(times)).to_list()
    pairs = list(zip(strs, times.tolist()))
    assert sorted(range(5), key=lambda i: packed[i]) == sorted(range(5), key=lambda i: pairs[i])
    assert DOMAINS and code  # shared helpers stay importable


# -- TimedTrace: the timed state of nested operators --------------------------------------------

def test_timed_trace_insert_probe_and_times():
    import numpy as np

    from dbsp.trace.batch import OrdIndexedZSet
    from dbsp.trace.timed import TimedTrace, at_times, times_of
    K_ = pa.schema([pa.field("k", pa.int64(), False)])
    V_ = pa.schema([pa.field("v", pa.string())])

    def ix(rows):
        return OrdIndexedZSet.from_parts(pa.record_batch([pa.array([r[0] for r in rows])], K_),
                                         pa.record_batch([pa.array([r[1] for r in rows])], V_),
                                         np.array([r[2] for r in rows], np.int64))

    tr = TimedTrace(K_, V_)
    assert tr.probe(np.array([1], np.uint64)) is None and tr.max_time == -1
    tr.insert([(0, ix([(1, "a", 1), (2, "b", 1)])), (2, ix([(1, "a", -1), (1, "c", 2)]))])
    tr.insert([(1, ix([(1, "a", 1)])), (3, ix([]))])       # a later outer step: times add up
    assert tr.max_time == 2
    model = {((1,), ("a",), 0): 1, ((2,), ("b",), 0): 1, ((1,), ("a",), 2): -1,
             ((1,), ("c",), 2): 2, ((1,), ("a",), 1): 1}
    assert tr.to_val_batch().to_dict() == model
    key1 = ix([(1, "x", 1)]).kcodes
    got = tr.probe(key1)
    t = times_of(got)
    assert sorted(zip(got.vals.column(0).to_pylist(), t.tolist(), got.weights.tolist())) == [
        ("a", 0, 1), ("a", 1, 1), ("a", 2, -1), ("c", 2, 2)]
    upto1 = at_times(got, t <= 1)
    assert upto1.vals.schema == V_ and upto1.num_keys == 1
    assert sorted(zip(upto1.vals.column(0).to_pylist(), upto1.weights.tolist())) == [("a", 1),
                                                                                      ("a", 1)]
    assert at_times(got, t > 5) is None
    saved = tr.checkpoint_state()
    other = TimedTrace(K_, V_)
    other.restore_state(saved)
    assert other.max_time == 2 and other.to_val_batch().to_dict() == model
    tr.clear()
    assert len(tr) == 0 and tr.max_time == -1
