"""Joins whose leading key is both sides' event time drop state behind the watermarks
(:mod:`dbsp.operators.join`, *Watermark GC*): results equal the reference join of the on-time
rows at every step, for every join kind, with 1 and 2 workers; the state stays bounded over a
long run where the same join without watermarks keeps every row."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import _api_ref as R
from _api_harness import fmt, late_steps, steps_of
from dbsp.api import StreamContext
from dbsp.testing import reference as ref

L = pa.schema([("t", pa.int64()), ("k", pa.int64()), ("x", pa.int64())])
RS = pa.schema([("t", pa.int64()), ("k", pa.int64()), ("y", pa.int64())])
ROW = st.tuples(st.integers(0, 40), st.integers(0, 2), st.integers(0, 3))


def _reference(how: str, a: dict, b: dict) -> dict:
    if how == "inner":
        return ref.join(a, b, [0, 1], [0, 1])
    if how == "semi":
        return ref.semijoin(a, b, [0, 1], [0, 1])
    if how == "anti":
        return ref.antijoin(a, b, [0, 1], [0, 1])
    return ref.left_join(a, b, [0, 1], [0, 1], 1)


def _run(workers: int, how: str, lat_l: int, lat_r: int, left_steps, right_steps):
    with StreamContext(workers=workers) as ctx:
        ls = ctx.stream(L, name="l", time="t", lateness=lat_l)
        rs = ctx.stream(RS, name="r", time="t", lateness=lat_r)
        out = ls.join(rs, on=["t", "k"], how=how).collect()
        kl, kr = R.Lateness(0, lat_l), R.Lateness(0, lat_r)
        for i, a, b in late_steps(ctx, ls, rs, kl, kr, left_steps, right_steps):
            want, got = _reference(how, a, b), out.view_dict()
            assert got == want, f"{how}, step {i}: view\n{fmt(got)}\nexpected\n{fmt(want)}"
        assert ls.late_rows == kl.late and rs.late_rows == kr.late


@settings(max_examples=25, deadline=None)
@given(how=st.sampled_from(["inner", "semi", "anti", "left"]), lat_l=st.integers(0, 12),
       lat_r=st.integers(0, 12), left=steps_of(ROW, n_steps=6), right=steps_of(ROW, n_steps=6))
@example(how="semi", lat_l=0, lat_r=0,  # the right key set is cut below its own watermark
         left=[{(5, 1, 0): 1}, {}, {(9, 1, 0): 1}],
         right=[{(9, 1, 0): 1}, {(5, 1, 3): 1}, {(9, 1, 1): -1, (12, 0, 0): 1}])
def test_join_gc_keeps_results_exact(workers, how, lat_l, lat_r, left, right):
    _run(workers, how, lat_l, lat_r, left, right)


def _join_inputs(ctx) -> list[int]:
    """The input count of every join node built so far."""
    return [len(n.inputs) for n in ctx.circuit.nodes if n.name.startswith("join(")]


def test_join_gc_needs_time_as_the_leading_key_of_both_sides():
    """GC wires both watermarks into the join (and the semijoin's key set) only when each side's
    event time is its leading key: time second in the key, or a side without a watermark, gives
    the plain join."""
    with StreamContext() as ctx:
        ls = ctx.stream(L, name="l", time="t")
        rs = ctx.stream(RS, name="r", time="t")
        plain = ctx.stream(RS, name="p")
        ls.join(rs, on=["k", "t"])
        ls.join(plain, on=["t", "k"])
        ls.join(rs, on="k")
        assert _join_inputs(ctx) == [2, 2, 2]
        ls.join(rs, on=["t", "k"])
        ls.join(rs, on=["t", "k"], how="semi")
        assert _join_inputs(ctx) == [2, 2, 2, 4, 4]
        ks = [len(n.inputs) for n in ctx.circuit.nodes if n.name == "distinct_keys"]
        assert ks == [2]


def _long_run(workers: int, time_cols: bool, steps: int = 60, rows: int = 40):
    """Both sides advance 10 time units a step, 40 rows each; state rows per step."""
    with StreamContext(workers=workers) as ctx:
        kw = {"time": "t", "lateness": 20} if time_cols else {}
        ls = ctx.stream(L, name="l", **kw)
        rs = ctx.stream(RS, name="r", **kw)
        ls.join(rs, on=["t", "k"]).collect(view=False)
        ls.join(rs, on=["t", "k"], how="semi").collect(view=False)
        rng = np.random.default_rng(3)
        sizes = []
        for s in range(steps):
            for src in (ls, rs):
                t = s * 10 + rng.integers(0, 10, rows)
                src.insert(pa.table({"t": t, "k": rng.integers(0, 5, rows),
                                     src.schema.names[2]: rng.integers(0, 9, rows)}))
            ctx.step()
            sizes.append(ctx.state_rows())
        return sizes


@pytest.mark.parametrize("workers", [1, 2])
def test_join_state_stays_bounded_behind_the_watermarks(workers):
    bounded = _long_run(workers, True)
    unbounded = _long_run(workers, False)
    # each side keeps the rows within its lateness (2-3 steps) of the other's watermark
    assert max(bounded[20:]) <= 1.3 * max(bounded[5:15]) + 100, bounded
    assert unbounded[-1] > 10 * bounded[-1], (bounded[-1], unbounded[-1])
