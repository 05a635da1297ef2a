"""dbsp._native.state against kernels_ref: live_versions on random spines of versioned rows
(built the way the aggregate's state is: each put retracts a key's live version and adds a
larger one), and on batches that break the invariant (the kernel must say so: None)."""
from __future__ import annotations

import numpy as np
import pytest
from dbsp._native import state as native
from hypothesis import given, settings
from hypothesis import strategies as st

from dbsp.algebra import kernels_ref as ref


def _batch(entries: dict) -> tuple:
    """(kcodes, offsets, vcodes, weights) of ``{(key, version): weight}`` (non-zero)."""
    items = sorted((k, v, w) for (k, v), w in entries.items() if w)
    keys = sorted({k for k, _, _ in items})
    off = np.zeros(len(keys) + 1, np.int64)
    for k, _, _ in items:
        off[keys.index(k) + 1] += 1
    return (np.asarray(keys, np.uint64), np.cumsum(off),
            np.asarray([v for _, v, _ in items], np.uint64),
            np.asarray([w for _, _, w in items], np.int64))


@st.composite
def _spine(draw):
    nkeys = draw(st.integers(1, 40))
    live: dict = {}
    nxt = 0
    batches = []
    for _ in range(draw(st.integers(1, 6))):
        entries: dict = {}
        for k in draw(st.lists(st.integers(0, nkeys - 1), max_size=30, unique=True)):
            if k in live and draw(st.booleans()):  # delete or replace
                entries[(k, live[k])] = entries.get((k, live[k]), 0) - 1
                del live[k]
            if k not in live and draw(st.booleans()):
                live[k] = nxt
                entries[(k, nxt)] = 1
                nxt += 1
        batches.append(entries)
    if draw(st.booleans()) and len(batches) > 1:  # a merge of two adjacent batches
        a = draw(st.integers(0, len(batches) - 2))
        m = dict(batches[a])
        for kv, w in batches[a + 1].items():
            m[kv] = m.get(kv, 0) + w
        batches[a:a + 2] = [m]
    probes = draw(st.lists(st.integers(0, nkeys + 3), max_size=50, unique=True))
    return [_batch(b) for b in batches], np.asarray(sorted(probes), np.uint64), live


def _run(fn, batches, probes):
    return fn([b[0] for b in batches], [b[1] for b in batches], [b[2] for b in batches],
              [b[3] for b in batches], probes)


@settings(max_examples=200, deadline=None)
@given(_spine())
def test_live_versions_matches_ref_and_truth(spine):
    batches, probes, live = spine
    got, want = _run(native.live_versions, batches, probes), _run(ref.live_versions, batches,
                                                                    probes)
    assert got is not None and want is not None
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)
    pos, ver, bno, row, _ = got
    assert {int(probes[p]): int(v) for p, v in zip(pos, ver)} == \
        {int(k): live[int(k)] for k in probes if int(k) in live}
    for p, v, b, r in zip(pos, ver, bno, row):  # the row named holds that version
        assert batches[b][2][r] == v and batches[b][3][r] == 1


@pytest.mark.parametrize("probes", [6000, 2000, 300, 40, 3])  # walk, skip blocks, gallop
def test_live_versions_over_a_long_batch(probes):
    """One batch of 2,000 keys probed by few or many keys: every search strategy agrees with the
    reference (keys every 3rd code, so about a third of the probes hit)."""
    rng = np.random.default_rng(probes)
    keys = np.arange(0, 6000, 3, dtype=np.uint64)
    b = (keys, np.arange(len(keys) + 1, dtype=np.int64), np.arange(len(keys), dtype=np.uint64),
         np.ones(len(keys), np.int64))
    q = np.unique(rng.integers(0, 6100, probes)).astype(np.uint64)
    got, want = _run(native.live_versions, [b], q), _run(ref.live_versions, [b], q)
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)
    assert len(got[0]) == int(((q % 3 == 0) & (q < 6000)).sum())


def test_live_versions_refuses_what_is_not_versioned_rows():
    two = [_batch({(1, 0): 2})]
    assert native.live_versions(*[[b[i] for b in two] for i in range(4)],
                                np.asarray([1], np.uint64)) is None
    twice = [_batch({(1, 0): 1}), _batch({(1, 1): 1})]  # two live versions: weights sum to 2
    assert native.live_versions(*[[b[i] for b in twice] for i in range(4)],
                                np.asarray([1], np.uint64)) is None
    assert ref.live_versions(*[[b[i] for b in twice] for i in range(4)],
                             np.asarray([1], np.uint64)) is None


_DTYPES = [np.int64, np.float64, np.int32, np.bool_, np.uint64]


@st.composite
def _gather(draw):
    """Sources of one dtype (some None: all ``fill``) and the (pos, batch, row) of live rows."""
    dt = draw(st.sampled_from(_DTYPES))
    nb = draw(st.integers(1, 5))
    sources = []
    for _ in range(nb):
        n = draw(st.integers(0, 12))
        sources.append(None if draw(st.booleans()) and dt == np.bool_ else
                       np.asarray(draw(st.lists(st.integers(-50, 50), min_size=n, max_size=n)))
                       .astype(dt))
    G = draw(st.integers(0, 20))
    pos = sorted(draw(st.lists(st.integers(0, max(G - 1, 0)), unique=True, max_size=G))) \
        if G else []
    picks = []
    for _ in pos:
        ok = [b for b, s in enumerate(sources) if s is None or len(s)]
        if not ok:
            break
        b = draw(st.sampled_from(ok))
        picks.append((b, 0 if sources[b] is None else draw(st.integers(0, len(sources[b]) - 1))))
    pos = pos[:len(picks)]
    return dt, sources, G, np.asarray(pos, np.int64), \
        np.asarray([b for b, _ in picks], np.int64), np.asarray([r for _, r in picks], np.int64)


@settings(max_examples=200, deadline=None)
@given(_gather())
def test_gather_rows_matches_ref_and_truth(case):
    dt, sources, G, pos, bno, row = case
    got = native.gather_rows(pos, bno, row, sources, np.zeros(G, dt), True)
    want = ref.gather_rows(pos, bno, row, sources, np.zeros(G, dt), True)
    np.testing.assert_array_equal(got, want)
    truth = np.zeros(G, dt)
    for p, b, r in zip(pos, bno, row):
        truth[p] = True if sources[b] is None else sources[b][r]
    np.testing.assert_array_equal(got, truth)


def test_gather_rows_checks_bounds():
    src = [np.arange(3, dtype=np.int64)]
    for pos, bno, row in (([0], [0], [3]), ([5], [0], [0]), ([0], [1], [0]), ([0], [0], [-1])):
        with pytest.raises(IndexError):
            native.gather_rows(np.asarray(pos), np.asarray(bno), np.asarray(row), src,
                               np.zeros(2, np.int64))
    with pytest.raises(ValueError):  # a source of another item size
        native.gather_rows(np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64),
                           [np.arange(3, dtype=np.int32)], np.zeros(2, np.int64))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=30), st.integers(0, 1000),
       st.sampled_from(_DTYPES))
def test_versioned_pairs_and_pick_rows_match_ref_and_truth(flags, start, dt):
    rm = np.asarray([a for a, _ in flags], dtype=bool)
    add = np.asarray([b for _, b in flags], dtype=bool)
    old_ver = np.arange(len(flags), dtype=np.uint64) * 3
    got = native.versioned_pairs(rm, add, old_ver, start)
    want = ref.versioned_pairs(rm, add, old_ver, start)
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)
    keys, off, g, is_old, ver, w = got
    rows, nxt = [], start
    for i, (a, b) in enumerate(flags):  # the old row first, new versions in key order
        if a:
            rows.append((i, True, int(old_ver[i]), -1))
        if b:
            rows.append((i, False, nxt, 1))
            nxt += 1
    assert list(zip(g.tolist(), is_old.tolist(), ver.tolist(), w.tolist())) == rows
    assert keys.tolist() == sorted({r[0] for r in rows})
    assert np.diff(off).tolist() == [sum(r[0] == k for r in rows) for k in keys.tolist()]
    old = (np.arange(len(flags)) * 7 % 5).astype(dt)
    new = (np.arange(len(flags)) * 3 % 4).astype(dt)
    picked = native.pick_rows(g, is_old, old, new)
    np.testing.assert_array_equal(picked, ref.pick_rows(g, is_old, old, new))
    np.testing.assert_array_equal(picked, np.where(is_old, old[g], new[g]))


def test_pick_rows_checks_bounds():
    with pytest.raises(IndexError):
        native.pick_rows(np.asarray([2]), np.asarray([True]), np.zeros(2), np.zeros(3))


# -- LiveTable: the flat table of live rows ---------------------------------------------------

_TABLE_DTYPES = [np.int64, np.float64, np.int32, np.bool_, np.int16]


@st.composite
def _table_ops(draw):
    """Column dtypes and steps of ``(sorted distinct keys, rm, add, versions, cols, valids)``
    over a small key range (so keys come back after deletion and probe runs collide), with
    enough keys to grow the table past its first size."""
    dts = draw(st.lists(st.sampled_from(_TABLE_DTYPES), min_size=0, max_size=3))
    span = draw(st.sampled_from([20, 3000]))
    hi_bits = draw(st.sampled_from([0, 1 << 63, 1 << 40]))  # codes of signed ints are high
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(0, 1500 if span > 20 else 20))
        rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
        keys = np.unique(rng.integers(0, span, n)).astype(np.uint64) + np.uint64(hi_bits)
        G = len(keys)
        cols = [(rng.integers(-99, 99, G)).astype(dt) for dt in dts]
        valids = [None if rng.random() < 0.3 else rng.random(G) < 0.8 for _ in dts]
        steps.append((keys, rng.random(G) < 0.4, rng.random(G) < 0.6,
                      rng.integers(0, 2 ** 62, G).astype(np.uint64), cols, valids))
    return dts, steps


def _read(t, keys, dts):
    G = len(keys)
    has, ver = np.zeros(G, bool), np.zeros(G, np.uint64)
    cols, oks = [np.zeros(G, dt) for dt in dts], [np.zeros(G, bool) for _ in dts]
    n = t.get(keys, has, ver, cols, oks)
    return n, has, ver, cols, oks


@settings(max_examples=60, deadline=None)
@given(_table_ops())
def test_live_table_matches_ref_and_a_dict(case):
    """Native table, reference table and a plain dict agree after every step of upserts and
    deletes (reads of present and absent keys, nulls read back as 0 and invalid)."""
    dts, steps = case
    nat, rf = native.LiveTable([np.dtype(d).itemsize for d in dts]), \
        ref.LiveTable([np.dtype(d).itemsize for d in dts])
    model: dict = {}
    for keys, rm, add, ver, cols, valids in steps:
        for t in (nat, rf):
            t.put(keys, rm, add, ver, cols, valids)
        for i, k in enumerate(keys.tolist()):
            if add[i]:
                model[k] = (int(ver[i]), [
                    (c[i].item(), True) if v is None or v[i] else (0, False)
                    for c, v in zip(cols, valids)])
            elif rm[i]:
                model.pop(k, None)
        assert len(nat) == len(rf) == len(model)
        probe = np.unique(np.concatenate([keys, np.asarray(list(model), np.uint64),
                                          keys + np.uint64(1)]))
        got, want = _read(nat, probe, dts), _read(rf, probe, dts)
        assert got[0] == want[0] == sum(int(k) in model for k in probe.tolist())
        for x, y in zip(got[1:3], want[1:3]):
            np.testing.assert_array_equal(x, y)
        for x, y in zip(got[3] + got[4], want[3] + want[4]):
            np.testing.assert_array_equal(x, y)
        for i, k in enumerate(probe.tolist()):
            m = model.get(k)
            assert bool(got[1][i]) == (m is not None)
            if m is not None:
                assert int(got[2][i]) == m[0]
                assert [(c[i].item(), bool(o[i])) for c, o in zip(got[3], got[4])] == m[1]
        # read(): the same into fresh arrays of the dtypes
        for t in (nat, rf):
            has, cols, ver = t.read(probe, dts)
            np.testing.assert_array_equal(has, got[1])
            np.testing.assert_array_equal(ver, got[2])
            assert [c.dtype for c in cols] == [np.dtype(d) for d in dts]
            for x, y in zip(cols, got[3]):
                np.testing.assert_array_equal(x, y)
        # without validity arrays the same columns are read (the validity is not written)
        for t in (nat, rf):
            cols_only = [np.zeros(len(probe), dtype=d) for d in dts]
            assert t.get(probe, np.zeros(len(probe), bool), np.zeros(len(probe), np.uint64),
                         cols_only, [None] * len(dts)) == got[0]
            for x, y in zip(cols_only, got[3]):
                np.testing.assert_array_equal(x, y)


def test_live_table_refuses_bad_arrays():
    t = native.LiveTable([8])
    k = np.arange(3, dtype=np.uint64)
    with pytest.raises(ValueError, match="column 0 must be"):
        t.put(k, np.zeros(3, bool), np.ones(3, bool), k, [np.zeros(3, np.int32)], [None])
    with pytest.raises(ValueError, match="1 columns and 0 validity"):
        t.put(k, np.zeros(3, bool), np.ones(3, bool), k, [np.zeros(3, np.int64)], [])
    with pytest.raises(ValueError, match="has must be"):
        t.get(k, np.zeros(2, bool), np.zeros(3, np.uint64), [np.zeros(3, np.int64)],
              [np.zeros(3, bool)])
    with pytest.raises(ValueError, match="items of 3 bytes"):
        native.LiveTable([3])
    with pytest.raises(ValueError, match="not 4"):
        t.read(k, [np.int32])
    with pytest.raises(ValueError, match="2 dtypes"):
        t.read(k, [np.int64, np.int64])


@settings(max_examples=30, deadline=None)
@given(_table_ops(), st.integers(0, 2 ** 62))
def test_live_table_put_with_a_first_version(case, start):
    """``put(..., versions=start)`` stores the versions ``start, start + 1, ...`` of the added
    keys in order: the same table as ``put`` with those versions as an array, native and ref."""
    dts, steps = case
    sizes = [np.dtype(d).itemsize for d in dts]
    for mod in (native, ref):
        a, b = mod.LiveTable(sizes), mod.LiveTable(sizes)
        for keys, rm, add, _, cols, valids in steps:
            ver = (start + np.cumsum(add, dtype=np.int64) - 1).astype(np.uint64)
            a.put(keys, rm, add, ver, cols, valids)
            b.put(keys, rm, add, start, cols, valids)
            probe = np.unique(np.concatenate([keys, keys + np.uint64(1)]))
            x, y = _read(a, probe, dts), _read(b, probe, dts)
            assert x[0] == y[0]
            for u, v in zip(list(x[1:3]) + x[3] + x[4], list(y[1:3]) + y[3] + y[4]):
                np.testing.assert_array_equal(u, v)
    with pytest.raises(OverflowError):
        native.LiveTable([8]).put(np.zeros(1, np.uint64), np.zeros(1, bool), np.ones(1, bool),
                                  -1, [np.zeros(1, np.int64)], [None])
