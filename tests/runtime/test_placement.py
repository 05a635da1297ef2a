"""Input placement: inputs dealt by the key of the exchange they feed, those exchanges local,
and the results the same as with contiguous slices and with one worker."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dbsp
from dbsp.circuit.exchange import as_shard_map, deal
from dbsp.runtime.placement import plan
from dbsp.trace.batch import OrdIndexedZSet

A = pa.schema([pa.field("id", pa.int64(), False), pa.field("cat", pa.string())])
B = pa.schema([pa.field("auction", pa.int64()), pa.field("price", pa.int64())])


def _query(c):
    a = c.add_input("a", A)
    b = c.add_input("b", B)
    j = b.index_by(["auction"]).join(a.index_by(["id"]))
    out = j.index_by(["cat"]).aggregate({"n": ("count", None), "s": ("sum", "price")})
    return a, b, out.output()


def _names(c, ids):
    return sorted(c.nodes[i].name for i in ids)


def test_plan_makes_the_join_exchanges_local():
    c = dbsp.Circuit(workers=2)
    a, b, _ = _query(c)
    p = plan(c.nodes, 2)
    assert {n: k[0] for n, k in p.input_keys.items()} == {a.node: ("id",),
                                                           b.node: ("auction",)}
    # the keys differ in nullability: the join recodes both to nullable, and so does the deal
    assert all(f.nullable for _, k in p.input_keys.items() for f in k[1])
    assert len(p.local_exchanges) == 2
    # the join's two exchanges (after recode_keys); not the aggregate's, which is keyed by cat
    assert _names(c, p.local_exchanges) == ["exchange", "exchange"]
    join = next(n for n in c.nodes if n.name.startswith("join"))
    assert set(join.inputs) == set(p.local_exchanges)
    assert plan(c.nodes, 1).input_keys == {}


def test_plan_picks_the_key_most_exchanges_use_and_skips_derived_streams():
    c = dbsp.Circuit(workers=3)
    t = c.add_input("t", B)
    t.index_by(["price"]).shard()
    t.index_by(["auction"]).shard()
    t.index_by(["auction"]).shard()
    t.map(lambda x: x, B).index_by(["price"]).shard()  # not straight from the input
    t.index_by(["price"]).flatten()                      # no exchange
    p = plan(c.nodes, 3)
    assert {n: k[0] for n, k in p.input_keys.items()} == {t.node: ("auction",)}
    assert len(p.local_exchanges) == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(-50, 50)),
                          st.text(max_size=3)), max_size=60),
       st.integers(2, 4))
def test_deal_sends_each_row_where_the_exchange_would(rows, workers):
    schema = pa.schema([pa.field("k", pa.int64()), pa.field("s", pa.string())])
    data = pa.RecordBatch.from_pylist([{"k": k, "s": s} for k, s in rows], schema=schema)
    for key in (["k"], ["s"], ["s", "k"]):
        vals = [n for n in schema.names if n not in key]
        parts = deal(data, (tuple(key), data.select(key).schema), workers)
        assert sorted(np.concatenate(parts).tolist()) == list(range(len(rows)))
        for w, idx in enumerate(parts):
            if len(idx) == 0:
                continue
            part = data.take(pa.array(idx, pa.int64()))
            # what the exchange after index_by(key) computes on the worker that got the part
            ix = OrdIndexedZSet.from_parts(part.select(key), part.select(vals),
                                           np.ones(len(idx), np.int64))
            assert (as_shard_map(workers).worker_of(ix.kcodes) == w).all()


def _run(workers, runtime, steps):
    with dbsp.Circuit(workers=workers, runtime=runtime) as c:
        a, b, out = _query(c)
        for (auc, aw), (bids, bw) in steps:
            a.push(auc, aw)
            b.push(bids, bw)
            c.step()
        return out.view_dict()


def _weighted(schema, rows):
    """``(batch, weights)`` of ``[(row, weight)]``."""
    return (pa.RecordBatch.from_pylist([dict(zip(schema.names, r)) for r, _ in rows], schema),
            np.array([w for _, w in rows], np.int64))


@pytest.mark.parametrize("runtime", ["threads", "processes"])
def test_placed_join_and_aggregate_match_one_worker(runtime):
    rng = np.random.default_rng(7)
    steps, first_bids = [], []
    for s in range(6):
        ids = list(range(s * 20, (s + 1) * 20))
        auc = [((i, None if i % 7 == 0 else f"c{i % 5}"), 1) for i in ids]
        bids = [((None if j % 11 == 0 else int(rng.integers(0, (s + 1) * 20)),
                  int(rng.integers(1, 100))), 1) for j in range(50)]
        if s == 0:
            first_bids = bids
        if s == 4:  # retract ten of the first step's bids and auction 3
            auc.append(((3, "c3"), -1))
            bids += [(r, -1) for r, _ in first_bids[:10]]
        steps.append((_weighted(A, auc), _weighted(B, bids)))
    want = _run(1, "threads", steps)
    assert want
    assert _run(2, runtime, steps) == want
    assert _run(3, runtime, steps) == want


def _counts(c):
    b = c.add_input("b", B)
    out = b.index_by(["auction"]).aggregate({"n": ("count", None), "s": ("sum", "price")})
    return b, out.output()


class _Counting:
    """An in-process transport that counts its exchanges."""

    def __init__(self, workers):
        from dbsp.runtime.threads import InProcTransport
        self.inner = InProcTransport(workers)
        self.workers = workers
        self.calls = 0

    def exchange(self, worker, parts):
        self.calls += 1
        return self.inner.exchange(worker, parts)

    def all_gather(self, worker, value):
        return self.inner.all_gather(worker, value)

    def abort(self):
        self.inner.abort()

    def reset(self):
        self.inner.reset()


def test_plan_deals_an_input_by_the_key_of_a_linear_aggregate_on_it():
    c = dbsp.Circuit(workers=2)
    b, _ = _counts(c)
    p = plan(c.nodes, 2)
    assert {n: k[0] for n, k in p.input_keys.items()} == {b.node: ("auction",)}
    assert _names(c, p.local_exchanges) == ["aggregate(linear)"]


@pytest.mark.parametrize("workers", [2, 3])
def test_a_placed_linear_aggregate_swaps_no_partials_and_matches_one_worker(workers):
    rng = np.random.default_rng(3)
    steps = []
    for s in range(5):
        rows = [((None if j % 13 == 0 else int(rng.integers(0, 40)), int(rng.integers(1, 9))),
                 1 if j % 7 else -1) for j in range(80)]
        steps.append(_weighted(B, rows))
    views = []
    for W in (1, workers):
        t = _Counting(W)
        with dbsp.Circuit(workers=W, transport=t) as c:
            b, out = _counts(c)
            for batch, w in steps:
                b.push(batch, w)
                c.step()
            views.append(out.view_dict())
        assert t.calls == 0  # the input arrived dealt by key: no partials crossed
    assert views[0] and views[1] == views[0]
