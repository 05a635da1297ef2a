"""Bloom filters over the keys of large in-memory batches (dbsp.trace.key_filter): never a false
negative, a low false-positive rate, probes through a filter equal to plain intersections, and
spines and distinct answering exactly with filters on every batch."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbsp.algebra import kernels as K
from dbsp.algebra.codes import VarCodes
from dbsp.testing import reference as ref
from dbsp.testing import strategies as S
from dbsp.testing.harness import check_steps
from dbsp.trace import key_filter as KF
from dbsp.trace.batch import OrdZSet
from dbsp.trace.spine import Spine

u64_sets = st.lists(st.integers(0, 2**64 - 1), unique=True, max_size=300).map(sorted)
var_sets = st.lists(st.binary(max_size=12), unique=True, max_size=300).map(sorted)


def _u64(xs):
    return np.asarray(xs, dtype=np.uint64)


@settings(max_examples=60, deadline=None)
@given(keys=u64_sets, others=u64_sets)
def test_u64_members_always_pass(keys, others):
    f = KF.KeyFilter.build(_u64(keys))
    assert f.may_contain(_u64(keys)).all()
    old = KF.SPARSE
    KF.SPARSE = 0  # consult the filter however dense the probes (else small sets bypass it)
    try:
        ai, bi = KF.filtered_intersect(_u64(others), _u64(keys), f)
    finally:
        KF.SPARSE = old
    ei, ej = K.intersect(_u64(others), _u64(keys))
    assert ai.tolist() == ei.tolist() and bi.tolist() == ej.tolist()


@settings(max_examples=60, deadline=None)
@given(keys=var_sets, others=var_sets)
def test_var_members_always_pass(keys, others):
    kc, oc = VarCodes.from_list(keys), VarCodes.from_list(others)
    f = KF.KeyFilter.build(kc)
    assert f.may_contain(kc).all()
    old = KF.SPARSE
    KF.SPARSE = 0  # consult the filter however dense the probes
    try:
        ai, bi = KF.filtered_intersect(oc, kc, f)
    finally:
        KF.SPARSE = old
    ei, ej = K.intersect(oc, kc)
    assert ai.tolist() == ei.tolist() and bi.tolist() == ej.tolist()


def test_false_positive_rate_is_low():
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(0, 2**63, 200_000, dtype=np.int64).astype(np.uint64))
    f = KF.KeyFilter.build(keys)
    others = rng.integers(2**63, 2**64 - 1, 200_000, dtype=np.uint64)
    rate = f.may_contain(others).mean()
    assert rate < 0.03, rate
    assert f.nbytes < 2 * len(keys)  # about 10 bits a key


def test_sparse_probe_of_a_large_batch_uses_the_filter():
    xs = np.arange(0, 2 * KF.MIN_KEYS, 2, dtype=np.int64)
    schema = pa.schema([pa.field("x", pa.int64(), False)])
    b = OrdZSet.from_arrow(pa.record_batch([pa.array(xs)], schema=schema))
    assert b.codec.u64
    KF.attach_filter(b)
    assert b.key_filter is not None and b.key_filter.keys == len(xs)
    probe = np.asarray([1, 2, 5, 8, 2 * KF.MIN_KEYS + 1], dtype=np.int64)
    codes = b.codec.encode([pa.array(probe)], len(probe))
    calls = []
    real = KF.KeyFilter.may_contain

    class Spy(KF.KeyFilter):
        def may_contain(self, c):
            calls.append(len(c))
            return real(self, c)
    b.key_filter = Spy(b.key_filter.words, b.key_filter.k, b.key_filter.keys)
    pi, ki = b.probe_keys(codes)
    assert pi.tolist() == [1, 3] and ki.tolist() == [1, 4]
    assert calls == [5]
    small = b.slice(0, 10)
    assert small.key_filter is None
    KF.attach_filter(small)
    assert small.key_filter is None  # small batches are searched directly


@pytest.fixture
def filters_everywhere(monkeypatch):
    """Every batch of at least one key gets a filter, and every probe consults it."""
    monkeypatch.setattr(KF, "MIN_KEYS", 1)
    monkeypatch.setattr(KF, "SPARSE", 0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.lists(st.tuples(st.integers(-20, 20), st.integers(-2, 2)),
                               max_size=12), min_size=1, max_size=12),
       probe=st.lists(st.integers(-25, 25), max_size=10))
def test_spine_weights_of_with_filters(filters_everywhere, steps, probe):
    schema = pa.schema([pa.field("x", pa.int64(), False)])
    sp = Spine(fanout=2, name="z", max_loose=3)
    sp.weights_of(np.zeros(0, np.uint64))  # a probed trace: its batches get filters from now on
    model: dict = {}
    for rows in steps:
        rows = [(x, w) for x, w in rows if w]
        if not rows:
            continue
        z = OrdZSet.from_arrow(pa.record_batch([pa.array([x for x, _ in rows], pa.int64())],
                                               schema=schema),
                               np.asarray([w for _, w in rows], np.int64))
        sp.insert(z)
        for x, w in rows:
            model[x] = model.get(x, 0) + w
        codec = z.codec
        xs = sorted(set(probe) | {x for x, _ in rows})
        codes = codec.encode([pa.array(xs, pa.int64())], len(xs))
        order = np.argsort(np.asarray(codes))
        codes = K.take(codes, order)
        xs = [xs[i] for i in order]
        assert sp.weights_of(codes).tolist() == [model.get(x, 0) for x in xs]
    sp.wait_merges()
    assert all(b.key_filter is not None for b in sp.batches() if len(b))
    sp.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=S.schemas(), data=st.data())
def test_distinct_with_filters_matches_reference(filters_everywhere, schema, data):
    steps = [{"t": d} for d in data.draw(S.deltas(schema, steps=5))]
    check_steps(1, {"t": schema}, lambda t: t.distinct(), ref.distinct, steps)


def test_a_trace_never_probed_builds_no_filter(filters_everywhere):
    schema = pa.schema([pa.field("x", pa.int64(), False)])
    sp = Spine(fanout=2, name="view", max_loose=2)
    for i in range(6):
        sp.insert(OrdZSet.from_arrow(pa.record_batch([pa.array([i, i + 10])], schema=schema)))
    sp.wait_merges()
    assert sp.batches() and all(b.key_filter is None for b in sp.batches())
    sp.weights_of(np.zeros(0, np.uint64))
    sp.insert(OrdZSet.from_arrow(pa.record_batch([pa.array([100])], schema=schema)))
    sp.wait_merges()
    assert any(b.key_filter is not None for b in sp.batches())
    sp.close()
