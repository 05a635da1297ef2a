"""dbsp._native.state against kernels_ref: live_versions on random spines of versioned rows
(built the way the aggregate's state is: each put retracts a key's live version and adds a
larger one), and on batches that break the invariant (the kernel must say so: None)."""
from __future__ import annotations

import numpy as np
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


def test_live_versions_refuses_what_is_not_versioned_rows():
    two = [_batch({(1, 0): 2})]
    assert native.live_versions(*[[b[i] for b in two] for i in range(4)],
                                np.asarray([1], np.uint64)) is None
    twice = [_batch({(1, 0): 1}), _batch({(1, 1): 1})]  # two live versions: weights sum to 2
    assert native.live_versions(*[[b[i] for b in twice] for i in range(4)],
                                np.asarray([1], np.uint64)) is None
    assert ref.live_versions(*[[b[i] for b in twice] for i in range(4)],
                             np.asarray([1], np.uint64)) is None
