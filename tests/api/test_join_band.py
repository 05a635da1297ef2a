"""Band GC of joins keyed on something other than time (:mod:`dbsp.operators.join`, *Band GC*;
Nexmark q9): with ``band=(left_col, right_col)`` each side drops the rows whose column is below
the other side's watermark, and the pairs inside the band (``right time <= left_col`` and
``left time <= right_col``) equal the reference join of the on-time rows, and the same join
without GC, at every step, with 1 and 2 workers; the state stays bounded over a long run."""
from __future__ import annotations

import os
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _api_ref as R
from _api_harness import fmt, late_steps, push, steps_of
from dbsp import RowError
from dbsp.api import StreamContext, col
from dbsp.testing import reference as ref

# left: key k, event time t; right: key k, event time o (opened), e (expires)
L = pa.schema([("k", pa.int64()), ("t", pa.int64()), ("x", pa.int64())])
RS = pa.schema([("k", pa.int64()), ("o", pa.int64()), ("e", pa.int64()), ("y", pa.int64())])
LROW = st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 3))
RROW = st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 50), st.integers(0, 2))


def _in_band(z: dict) -> dict:
    """Pairs ``(k, t, x, o, e, y)`` with ``o <= t <= e``."""
    return {r: w for r, w in z.items() if r[3] <= r[1] <= r[4]}


def _band_join(ls, rs, band):
    return ls.join(rs, on="k", band=band).filter(col("t").between(col("o"), col("e")))


def _run(workers: int, lat_l: int, lat_r: int, left_steps, right_steps, band):
    # foreground merges: the band filter runs at the merges inside each step, every 4 batches
    with mock.patch.dict(os.environ, {"DBSP_SPINE_BACKGROUND": "0"}), \
            StreamContext(workers=workers) as ctx:
        ls = ctx.stream(L, name="l", time="t", lateness=lat_l)
        rs = ctx.stream(RS, name="r", time="o", lateness=lat_r)
        gc = _band_join(ls, rs, band).collect()
        plain = _band_join(ls, rs, None).collect()
        kl, kr = R.Lateness(1, lat_l), R.Lateness(1, lat_r)
        for i, a, b in late_steps(ctx, ls, rs, kl, kr, left_steps, right_steps):
            want = _in_band(ref.join(a, b, [0], [0]))
            got = gc.view_dict()
            assert got == want, f"step {i}: view\n{fmt(got)}\nexpected\n{fmt(want)}"
            assert plain.view_dict() == want


@settings(max_examples=30, deadline=None)
@given(lat_l=st.integers(0, 12), lat_r=st.integers(0, 12),
       left=steps_of(LROW, n_steps=12), right=steps_of(RROW, n_steps=12),
       band=st.sampled_from([("t", "e"), ("t", None), (None, "e")]))
def test_band_gc_keeps_the_band_exact(workers, lat_l, lat_r, left, right, band):
    _run(workers, lat_l, lat_r, left, right, band)


def test_band_gc_literal(workers):
    # step 1: the right watermark rises to 20 (lateness 0), so the left row at t=5 can meet no
    # new right row in the band; a right row at o=4 is late. Step 2: the left watermark rises
    # to 30, past the expiry 25 of auction (1, 20, 25).
    _run(workers, 0, 0,
         [{(1, 5, 0): 1, (2, 21, 0): 1}, {(1, 30, 1): 1}, {(1, 31, 2): 1}],
         [{(1, 0, 9, 0): 1, (2, 20, 30, 0): 1}, {(1, 20, 25, 1): 1, (1, 4, 40, 0): 1},
          {(1, 30, 40, 2): 1}], ("t", "e"))


def test_band_gc_keeps_rows_at_the_watermark(workers):
    # the left row (1, 20) sits at the right watermark 20 from step 0 on, through the merge of
    # the 4 batches of steps 0-3; the right row that meets it in the band comes at step 4
    fill = [{(0, 20 + i, 0): 1} for i in range(1, 4)]
    _run(workers, 0, 0, [{(1, 20, 0): 1}, *fill, {}],
         [{(2, 20, 50, 0): 1}, *[{(2, 20, 50, i): 1} for i in range(1, 4)], {(1, 20, 50, 0): 1}],
         ("t", "e"))
    # the same for the right side: (1, 10, 20) expires at the left watermark 20
    _run(workers, 0, 0, [{(2, 20, 0): 1}, *[{(2, 20, i): 1} for i in range(1, 4)], {(1, 20, 0): 1}],
         [{(1, 10, 20, 0): 1}, *[{(0, 10, 20 + i, 0): 1} for i in range(1, 4)], {}],
         ("t", "e"))


def _long_run(workers: int, band, steps: int = 60, rows: int = 40):
    """Both sides advance 10 time units a step, 40 rows each, over 5 keys; each right row
    expires 15 units after it opens. State rows per step."""
    with StreamContext(workers=workers) as ctx:
        ls = ctx.stream(L, name="l", time="t", lateness=20)
        rs = ctx.stream(RS, name="r", time="o", lateness=20)
        _band_join(ls, rs, band).collect(view=False)
        rng = np.random.default_rng(3)
        sizes = []
        for s in range(steps):
            t = s * 10 + rng.integers(0, 10, rows)
            ls.insert(pa.table({"k": rng.integers(0, 5, rows), "t": t,
                                "x": rng.integers(0, 9, rows)}))
            o = s * 10 + rng.integers(0, 10, rows)
            rs.insert(pa.table({"k": rng.integers(0, 5, rows), "o": o, "e": o + 15,
                                "y": rng.integers(0, 9, rows)}))
            ctx.step()
            sizes.append(ctx.state_rows())
        return sizes


@pytest.mark.parametrize("workers", [1, 2])
def test_band_gc_keeps_the_state_bounded(workers):
    bounded = _long_run(workers, ("t", "e"))
    unbounded = _long_run(workers, None)
    # rows leave at merges (a level-0 merge every few steps): bounded by the open window plus
    # the batches not merged yet, not by the history
    assert max(bounded[40:]) <= 2 * max(bounded[10:20]) + 200, bounded
    assert unbounded[-1] > 4 * bounded[-1], (bounded[-1], unbounded[-1])


def test_band_errors_at_plan_time():
    with StreamContext() as ctx:
        ls = ctx.stream(L, name="l", time="t", lateness=0)
        rs = ctx.stream(RS, name="r", time="o", lateness=0)
        plain = ctx.stream(RS, name="p")
        with pytest.raises(ValueError, match="has no watermark"):
            ls.join(plain, on="k", band=("t", None))
        with pytest.raises(KeyError, match="no left value column 'nope'"):
            ls.join(rs, on="k", band=("nope", None))
        with pytest.raises(ValueError, match="is a join key"):
            ls.join(rs, on="k", band=("k", None))
        with pytest.raises(ValueError, match="how='inner'"):
            ls.join(rs, on="k", how="left", band=("t", "e"))
        with pytest.raises(ValueError, match="how=.inner."):
            ls.join(rs, on="k", how="lookup", band=("t", "e"))
        with pytest.raises(TypeError, match="compared with"):
            ls.with_columns(x=col("x").cast(pa.int32())).join(rs, on="k", band=("x", None))
        with pytest.raises(ValueError, match="band must be"):
            ls.join(rs, on="k", band="t")


def test_band_gc_after_a_rolled_back_step(workers):
    """A failed step that raised the watermarks is undone: rows on time by the restored
    watermark still meet every row of their band (the filters do not keep the rolled-back
    watermark), exactly as in a run without the failed step."""
    runs = []
    for fail in (False, True):
        with mock.patch.dict(os.environ, {"DBSP_SPINE_BACKGROUND": "0"}), \
                StreamContext(workers=workers) as ctx:
            ls = ctx.stream(L, name="l", time="t", lateness=0)
            rs = ctx.stream(RS, name="r", time="o", lateness=0)
            out = _band_join(ls, rs, ("t", "e")).collect()
            ls.select(y=col("x") * 2 ** 62).collect()  # x = 2 overflows: the step fails
            steps = [({(1, 10, 0): 1}, {(2, 10, 100, 0): 1})]
            if fail:
                steps.append(({(3, 50, 2): 1}, {(2, 50, 100, 0): 1}))
            # (1, 20) is on time by the restored watermark 10; the steps after it merge the
            # left trace (with the rolled-back watermark 50 as bound, (1, 20) would go) before
            # (1, 15, 100) meets it in the band
            steps += [({(1, 20, 0): 1}, {}), ({(0, 20, 0): 1}, {(0, 10, 100, 0): 1}),
                      ({(0, 21, 1): 1}, {}), ({(0, 22, 1): 1}, {}), ({}, {(1, 15, 100, 0): 1})]
            for dl, dr in steps:
                push(ls, dl)
                push(rs, dr)
                if 2 in {r[2] for r in dl}:
                    with pytest.raises(RowError, match="overflow"):
                        ctx.step()
                else:
                    ctx.step()
            runs.append(out.view_dict())
    assert runs[0] == runs[1]
    assert (1, 20, 0, 15, 100, 0) in runs[1]


# -- a batch behind the band goes at once; the filter's watermark survives a checkpoint ---------

_STEPS = [({(1, 5, 0): 1}, {(1, 0, 25, 0): 1}),  # one right batch, every row expiring at 25
          ({(2, 30, 0): 1}, {}),                 # the left watermark passes it: 30
          ({(2, 31, 1): 1}, {(2, 30, 40, 0): 1}),
          ({(2, 32, 2): 1}, {(2, 31, 41, 0): 1})]


def _stepped(workers, band, steps, storage=None):
    """A band join (both lateness 0) run over ``steps`` from the start, or, with ``storage``,
    reopened from its last checkpoint and run over ``steps`` after it; per step the state rows
    and the view's change."""
    out = []
    with mock.patch.dict(os.environ, {"DBSP_SPINE_BACKGROUND": "0"}), \
            StreamContext(workers=workers, storage=storage, durable=storage is not None) as ctx:
        ls = ctx.stream(L, name="l", time="t", lateness=0)
        rs = ctx.stream(RS, name="r", time="o", lateness=0)
        gc = _band_join(ls, rs, band).collect()
        if storage is not None:
            ctx.open()
        for dl, dr in steps:
            push(ls, dl)
            push(rs, dr)
            ctx.step()
            out.append((ctx.state_rows(), gc.delta_dict()))
    return out


def test_a_batch_behind_the_band_is_dropped_when_the_watermark_passes_it(workers):
    """Merges run every 4 batches and the right trace holds fewer: the batch of (1, 0, 25) is
    dropped when the filter rises past 25 (a step after the left watermark, see
    :class:`ValueBound`), not at a merge that may never come, and the band's pairs stay."""
    gc = _stepped(workers, ("t", "e"), _STEPS)
    plain = _stepped(workers, None, _STEPS)
    assert [v for _, v in gc] == [v for _, v in plain]
    assert [n for n, _ in gc[:2]] == [n for n, _ in plain[:2]]
    # step 2: the right trace lost its (1, 0, 25) row; the left trace's (1, 5) goes at the
    # right watermark's rise, at its next merge (a left batch holds rows on both sides of 30)
    assert gc[2][0] == plain[2][0] - 1 and gc[3][0] == plain[3][0] - 1, (gc, plain)


@pytest.mark.parametrize("stop", [1, 2])
def test_band_filter_watermark_survives_a_checkpoint(workers, tmp_path, stop):
    """Stopped (a checkpoint on close) after step ``stop`` and reopened, the band join keeps
    no more state than the run that never stopped, from its first step on (the filter's last
    watermark is in the checkpoint: without it the reopened filter would start a step late),
    and its changes are the same."""
    whole = _stepped(workers, ("t", "e"), _STEPS)
    store = str(tmp_path / "store")
    first = _stepped(workers, ("t", "e"), _STEPS[:stop + 1], store)
    after = _stepped(workers, ("t", "e"), _STEPS[stop + 1:], store)
    assert first + after == whole


@settings(max_examples=12, deadline=None)
@given(left=steps_of(LROW, n_steps=8, deletes=False), right=steps_of(RROW, n_steps=8,
                                                                     deletes=False),
       stop=st.integers(0, 7), data=st.data())
def test_band_join_reopened_at_any_step_equals_the_reference(workers, tmp_path_factory, left,
                                                             right, stop, data):
    """Stopped after any step and reopened from its checkpoint, the band join's changes and
    state equal the run that never stopped, and their sum is the reference join of the on-time
    rows inside the band."""
    n = max(len(left), len(right))
    steps = [(left[i] if i < len(left) else {}, right[i] if i < len(right) else {})
             for i in range(n)]
    stop = min(stop, n - 1)
    whole = _stepped(workers, ("t", "e"), steps)
    store = str(tmp_path_factory.mktemp("store"))
    got = _stepped(workers, ("t", "e"), steps[:stop + 1], store) + \
        _stepped(workers, ("t", "e"), steps[stop + 1:], store)
    assert got == whole
    kl, kr = R.Lateness(1, 0), R.Lateness(1, 0)
    a: dict = {}
    b: dict = {}
    for dl, dr in steps:
        a, b = R.add(a, kl.step(dl)), R.add(b, kr.step(dr))
    view: dict = {}
    for _, d in got:
        view = R.add(view, d)
    assert view == _in_band(ref.join(a, b, [0], [0]))
