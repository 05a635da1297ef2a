"""The step journal: a rolled-back step leaves a spine's state (the sum of its batches) as it was,
whatever merges ran in between (dbsp.trace.journal)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from dbsp.trace.batch import OrdZSet, ZSet
from dbsp.trace.journal import StepJournal, current_journal, use_journal
from dbsp.trace.spine import Spine

SCHEMA = pa.schema([("x", pa.int64())])
DELTA = st.lists(st.tuples(st.integers(0, 20), st.integers(-3, 3)), max_size=15)


def _batch(rows) -> OrdZSet:
    data = pa.RecordBatch.from_arrays([pa.array([r[0] for r in rows], pa.int64())], schema=SCHEMA)
    return ZSet(data, np.array([r[1] for r in rows], dtype=np.int64)).consolidate()


def _state(sp: Spine) -> dict:
    out: dict = {}
    for b in sp.batches():
        for x, w in zip(b.data.column(0).to_pylist(), b.weights.tolist()):
            out[x] = out.get(x, 0) + w
    return {k: v for k, v in out.items() if v}


@given(before=st.lists(DELTA, max_size=4), step=st.lists(DELTA, min_size=1, max_size=4),
       clear_at=st.one_of(st.none(), st.integers(0, 3)), background=st.booleans())
def test_rollback_restores_the_sum(before, step, clear_at, background):
    sp = Spine(name="t", background=background)
    for d in before:
        sp.insert(_batch(d))
    expected = _state(sp)
    j = StepJournal()
    with use_journal(j):
        assert current_journal() is j
        for i, d in enumerate(step):
            if clear_at == i:
                sp.clear()
            sp.insert(_batch(d))
    assert current_journal() is None
    j.rollback()
    sp.wait_merges()
    assert _state(sp) == expected
    assert len(j) == 0
    sp.insert(_batch([(1, 1)]))   # inserts after a rollback are not journalled anywhere
    assert len(j) == 0


def test_outside_a_step_nothing_is_recorded():
    sp = Spine(name="t")
    j = StepJournal()
    sp.insert(_batch([(1, 1)]))
    assert len(j) == 0 and current_journal() is None


@given(before=st.lists(DELTA, min_size=1, max_size=6), step=st.lists(DELTA, max_size=3),
       cut=st.integers(0, 21), commit=st.booleans(), background=st.booleans())
def test_watermark_gc_in_a_step_is_undone_by_a_rollback(before, step, cut, commit, background):
    """truncate_keys_below inside a step: readers stop seeing the rows at once, merges free them
    only once the step commits, and a rollback brings them back."""
    sp = Spine(name="t", fanout=2, background=background)
    for d in before:
        sp.insert(_batch(d))
    expected = _state(sp)
    bound = _batch([(cut, 1)]).codes        # a one-row code array
    j = StepJournal()
    with use_journal(j):
        sp.truncate_keys_below(bound)
        assert all(x >= cut for x in _state(sp))
        for d in step:
            sp.insert(_batch(d))
        sp.wait_merges()
        sp.compact()              # merges while the step is open cut nothing
    if commit:
        j.commit()
        sp.wait_merges()
        after = _state(sp)
        sp.compact()
        assert _state(sp) == after and all(x >= cut for x in after)
        assert sum(len(b) for b in sp.batches()) == len(after)   # freed by the merge
    else:
        j.rollback()
        sp.wait_merges()
        assert sp.key_bound is None
        assert _state(sp) == expected
