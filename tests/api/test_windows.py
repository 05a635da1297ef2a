"""Windows (tumbling, hopping, session), rolling aggregates, lateness and watermark GC: literal
cases, random out-of-order steps against the naive reference (including with state GC running
every step), and bounded state over a long run, with 1 and 2 workers."""
from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _api_ref as R
from _api_harness import check_steps, fmt, push, steps_of
from dbsp.api import StreamContext, avg, col, count, hopping, max_, min_, session, sum_, \
    tumbling
from dbsp.operators.window import KeyedRecomputeOperator

MS = pa.timestamp("ms")
E = pa.schema([("ts", MS), ("k", pa.string()), ("x", pa.int64())])
INT = pa.schema([("t", pa.int64()), ("k", pa.int64()), ("x", pa.int64())])
SEC = dt.timedelta(seconds=1)


def ts(s: float) -> dt.datetime:
    return dt.datetime(2024, 1, 1) + dt.timedelta(seconds=s)


@pytest.fixture
def ctx(workers):
    with StreamContext(workers=workers) as c:
        yield c


@pytest.fixture
def eager_gc(monkeypatch):
    """Sweep state every time the watermark moves (small tests then exercise GC)."""
    monkeypatch.setattr(KeyedRecomputeOperator, "MIN_GC_ROWS", 0)


# -- literal cases -------------------------------------------------------------------------------

def test_tumbling_window_updates_until_final(ctx):
    s = ctx.stream(E, name="ev", time="ts", lateness=2 * SEC)
    w = s.group_by("k").window(tumbling(10 * SEC)).agg(n=count(), total=sum_("x")).collect()
    s.insert([(ts(1), "a", 5), (ts(3), "a", 1), (ts(12), "b", 2)])
    ctx.step()
    assert w.schema.names == ["k", "window_start", "window_end", "n", "total"]
    assert w.rows() == [("a", ts(0), ts(10), 2, 6), ("b", ts(10), ts(20), 1, 2)]
    s.insert([(ts(9), "a", 10)])  # wm = 12 - 2 = 10 before this step: 9 is late
    s.insert([(ts(11), "b", 1)])
    ctx.step()
    assert s.late_rows == 1
    assert w.delta_dict() == {("b", ts(10), ts(20), 1, 2): -1, ("b", ts(10), ts(20), 2, 3): 1}
    assert s.watermark == ts(10)
    s.delete([(ts(12), "b", 2)])
    ctx.step()
    assert w.rows() == [("a", ts(0), ts(10), 2, 6), ("b", ts(10), ts(20), 1, 1)]


def _op_state(ctx, prefix):
    return sum(n["state_rows"] for n in ctx.circuit.profile() if n["name"].startswith(prefix))


@pytest.mark.parametrize("keyed", [False, True])
def test_closed_windows_leave_the_state(ctx, keyed):
    s = ctx.stream(E, name="ev", time="ts", lateness=10 * SEC)
    g = s.group_by("k") if keyed else s
    w = g.window(tumbling(10 * SEC)).agg(n=count(), lo=min_("x")).collect()
    s.insert([(ts(1), "a", 5), (ts(3), "b", 1), (ts(12), "b", 2), (ts(15), "a", 2)])
    ctx.step()
    full = _op_state(ctx, "window_aggregate")
    assert full > 0
    s.insert([(ts(31), "a", 7)])  # watermark 21: [0, 10) and [10, 20) are final
    ctx.step()
    assert _op_state(ctx, "window_aggregate") < full
    s.insert([(ts(5), "a", 100), (ts(19), "b", 100)])  # late: dropped, results unchanged
    ctx.step()
    assert s.late_rows == 2
    want = ([("a", ts(0), ts(10), 1, 5), ("a", ts(10), ts(20), 1, 2), ("a", ts(30), ts(40), 1, 7),
             ("b", ts(0), ts(10), 1, 1), ("b", ts(10), ts(20), 1, 2)] if keyed else
            [(ts(0), ts(10), 2, 1), (ts(10), ts(20), 2, 2), (ts(30), ts(40), 1, 7)])
    assert w.rows() == want


def test_hopping_windows(ctx):
    s = ctx.stream(INT, name="ev")
    w = s.window(hopping(10, 5), time="t").agg(n=count(), hi=max_("x")).collect()
    s.insert([(1, 1, 5), (7, 1, 9), (12, 2, 1)])
    ctx.step()
    assert w.rows() == [(-5, 5, 1, 5), (0, 10, 2, 9), (5, 15, 2, 9), (10, 20, 1, 1)]


def test_hopping_rows_of_one_pane_are_counted_once_per_window(ctx):
    """Rows consolidated by (pane, key, value) before the copy into windows: rows of one pane
    agree on their windows, rows of neighbouring panes do not (hop 4, size 10: panes of 2)."""
    s = ctx.stream([("t", pa.int64()), ("k", pa.int64()), ("x", pa.int64())], name="ev")
    w = s.group_by("k").window(hopping(10, 4), time="t").agg(n=count(), s=sum_("x")).collect()
    s.insert([(8, 1, 2), (9, 1, 2), (9, 1, 2), (10, 1, 2), (11, 1, 5)])
    ctx.step()
    assert sorted(w.rows()) == [(1, 0, 10, 3, 6), (1, 4, 14, 5, 13), (1, 8, 18, 5, 13)]
    s.delete([(9, 1, 2)])
    ctx.step()
    assert sorted(w.rows()) == [(1, 0, 10, 2, 4), (1, 4, 14, 4, 11), (1, 8, 18, 4, 11)]


def test_hopping_with_offset_and_uneven_hop(ctx):
    s = ctx.stream(INT, name="ev")
    w = s.window(hopping(7, 3, offset=1), time="t").agg(n=count()).collect()
    s.insert([(5, 1, 1)])
    ctx.step()
    # windows [1 + 3i, 8 + 3i) that contain 5
    assert w.rows() == [(1, 8, 1), (4, 11, 1)]
    assert sorted(R.window_starts(5, 7, 3, 1)) == [1, 4]


def test_session_windows_merge_and_split(ctx):
    s = ctx.stream(INT, name="ev")
    w = s.group_by("k").window(session(5), time="t").agg(n=count(), s=sum_("x")).collect()
    s.insert([(1, 1, 1), (3, 1, 2), (11, 1, 4), (2, 2, 8), (16, 2, 1)])
    ctx.step()  # 16 - 11 = 5 is not closer than the gap: two sessions for key 2
    assert w.rows() == [(1, 1, 8, 2, 3), (1, 11, 16, 1, 4), (2, 2, 7, 1, 8),
                        (2, 16, 21, 1, 1)]
    s.insert([(7, 1, 10)])  # 7 - 3 < 5 and 11 - 7 < 5: one session
    ctx.step()
    assert w.rows() == [(1, 1, 16, 4, 17), (2, 2, 7, 1, 8), (2, 16, 21, 1, 1)]
    s.delete([(7, 1, 10)])
    ctx.step()
    assert w.rows() == [(1, 1, 8, 2, 3), (1, 11, 16, 1, 4), (2, 2, 7, 1, 8),
                        (2, 16, 21, 1, 1)]


def test_rolling_range_and_rows(ctx):
    s = ctx.stream(INT, name="ev")
    r = s.rolling("t", range=10, by="k").agg(rs=sum_("x"), n=count(), lo=min_("x")).collect()
    q = s.rolling("t", rows=2, by="k").agg(rs=sum_("x"), a=avg("x")).collect()
    s.insert([(1, 1, 1), (5, 1, 2), (20, 1, 4), (6, 2, 7)])
    ctx.step()
    assert r.schema.names == ["t", "k", "x", "rs", "n", "lo"]
    assert r.rows() == [(1, 1, 1, 1, 1, 1), (5, 1, 2, 3, 2, 1), (6, 2, 7, 7, 1, 7),
                        (20, 1, 4, 4, 1, 4)]
    assert q.rows() == [(1, 1, 1, 1, 1.0), (5, 1, 2, 3, 1.5), (6, 2, 7, 7, 7.0),
                        (20, 1, 4, 6, 3.0)]
    s.insert([(12, 1, 10)])
    ctx.step()
    assert r.delta_dict() == {(12, 1, 10, 12, 2, 2): 1, (20, 1, 4, 4, 1, 4): -1,
                              (20, 1, 4, 14, 2, 4): 1}


def test_rolling_with_expressions_keeps_the_input_columns(ctx):
    s = ctx.stream(E, name="ev", time="ts", lateness=SEC)
    r = s.rolling(range=5 * SEC).agg(double=sum_(col("x") * 2)).collect()
    s.insert([(ts(1), "a", 1), (ts(3), "b", 2)])
    ctx.step()
    assert r.schema.names == ["ts", "k", "x", "double"]
    assert r.rows() == [(ts(1), "a", 1, 2), (ts(3), "b", 2, 6)]


def test_window_build_errors(ctx):
    s = ctx.stream(E, name="ev")
    with pytest.raises(ValueError, match="time="):
        s.window(tumbling(SEC))
    with pytest.raises(TypeError, match="timedelta"):
        s.window(tumbling(10), time="ts").agg(n=count())
    with pytest.raises(TypeError, match="time column 'k'"):
        s.window(tumbling(10), time="k").agg(n=count())
    with pytest.raises(KeyError, match="nope"):
        s.window(tumbling(SEC), time="ts").agg(n=sum_("nope"))
    with pytest.raises(TypeError, match="needs a number"):
        s.window(tumbling(SEC), time="ts").agg(n=sum_("k"))
    with pytest.raises(ValueError, match="exactly one"):
        s.rolling("ts").agg(n=count())
    with pytest.raises(ValueError, match="positive"):
        ctx.stream(INT).window(tumbling(0), time="t").agg(n=count())


# -- lateness ------------------------------------------------------------------------------------

def test_late_rows_are_dropped_and_counted(ctx):
    s = ctx.stream(INT, name="ev", time="t", lateness=5)
    late = s.late().collect()
    all_rows = s.collect()
    s.insert([(100, 1, 1), (96, 1, 2)])
    ctx.step()
    assert s.watermark == 95 and s.late_rows == 0
    s.insert([(94, 1, 3), (95, 1, 4), (None, 1, 5), (200, 2, 6)])  # 94 late, null late
    ctx.step()
    assert s.late_rows == 2 and s.watermark == 195
    assert late.rows() == [(None, 1, 5), (94, 1, 3)]
    assert (94, 1, 3) not in all_rows.rows() and (95, 1, 4) in all_rows.rows()
    s.delete([(96, 1, 2)])  # a retraction behind the watermark is late too
    ctx.step()
    assert s.late_rows == 3 and (96, 1, 2) in all_rows.rows()
    rep = ctx.report()["inputs"]["ev"]
    assert rep["late_rows"] == 3 and rep["watermark"] == 195 and rep["rows"] == 7


def test_rows_of_one_step_do_not_make_each_other_late(ctx):
    s = ctx.stream(INT, name="ev", time="t", lateness=0)
    c = s.collect()
    s.insert([(10, 1, 1), (1, 1, 1)])
    ctx.step()
    assert len(c) == 2 and s.late_rows == 0 and s.watermark == 10


def test_with_watermark_on_a_derived_stream(ctx):
    s = ctx.stream(INT, name="ev")
    w = s.filter(col("x") > 0).with_watermark("t", 3)
    out = w.window(tumbling(10)).agg(n=count()).collect()
    s.insert([(20, 1, 1), (16, 1, 1), (25, 1, 0)])
    ctx.step()
    s.insert([(16, 1, 1), (17, 1, 1)])  # wm = 20 - 3 = 17: 16 late
    ctx.step()
    assert out.rows() == [(10, 20, 2), (20, 30, 1)]
    assert ctx.late_rows["ev.t"] == 1
    assert ctx.report()["inputs"]["ev.t"]["late_rows"] == 1


# -- random steps against the reference ----------------------------------------------------------

ROW = st.tuples(st.integers(0, 60), st.integers(0, 2), st.one_of(st.none(), st.integers(-5, 20)))


AGGS = [("count_all", None), ("sum", 2), ("min", 2), ("max", 2)]


def _window_build(spec, keyed):
    def build(ctx, ev):
        g = ev.group_by("k") if keyed else ev
        return g.window(spec, time="t").agg(n=count(), s=sum_("x"), lo=min_("x"),
                                            hi=max_("x")).collect()
    return build


@settings(max_examples=20)
@given(kind=st.sampled_from(["tumbling", "hopping", "uneven", "gaps", "session"]),
       keyed=st.booleans(), steps=steps_of(ROW, n_steps=5))
def test_windows_match_reference(workers, kind, keyed, steps):
    keys = [1] if keyed else []
    if kind == "tumbling":
        spec, ref = tumbling(10), lambda z: R.window_agg(z, 0, keys, 10, 10, AGGS)
    elif kind == "hopping":
        spec, ref = hopping(15, 5), lambda z: R.window_agg(z, 0, keys, 15, 5, AGGS)
    elif kind == "uneven":  # a hop that does not divide the size: panes of gcd(10, 4) = 2
        spec, ref = hopping(10, 4, offset=3), lambda z: R.window_agg(z, 0, keys, 10, 4, AGGS, 3)
    elif kind == "gaps":  # windows shorter than the hop: some rows fall in none
        spec, ref = hopping(5, 8, offset=2), lambda z: R.window_agg(z, 0, keys, 5, 8, AGGS, 2)
    else:
        spec, ref = session(4), lambda z: R.session_agg(z, 0, keys, 4, AGGS)
    check_steps(workers, {"ev": INT}, _window_build(spec, keyed), [{"ev": d} for d in steps], ref)


@settings(max_examples=20)
@given(frame=st.sampled_from([("range", 0), ("range", 7), ("rows", 1), ("rows", 3)]),
       keyed=st.booleans(), steps=steps_of(ROW, n_steps=5))
def test_rolling_matches_reference(workers, frame, keyed, steps):
    keys = [1] if keyed else []
    kw = {frame[0]: frame[1]}

    def build(ctx, ev):
        return ev.rolling("t", by=["k"] if keyed else [], **kw).agg(
            n=count(), s=sum_("x"), lo=min_("x"), hi=max_("x"), a=avg("x")).collect()

    def ref(z):
        return R.rolling(z, 0, keys, AGGS + [("avg", 2)],
                         range_=kw.get("range"), rows=kw.get("rows"))
    check_steps(workers, {"ev": INT}, build, [{"ev": d} for d in steps], ref, approx=True)


def _run_late(workers, steps, lateness, build, ref_of):
    """Steps through the lateness filter: the engine vs the reference over the on-time rows."""
    with StreamContext(workers=workers) as ctx:
        ev = ctx.stream(INT, name="ev", time="t", lateness=lateness)
        out = build(ev)
        lat = R.Lateness(0, lateness)
        kept: dict = {}
        for i, d in enumerate(steps):
            push(ev, d)
            kept = R.add(kept, lat.step(d))
            ctx.step()
            want = ref_of(kept)
            got = out.view_dict()
            assert R.close(got, want), f"step {i}: view\n{fmt(got)}\nexpected\n{fmt(want)}"
            assert ev.late_rows == lat.late
            assert ev.watermark == lat.watermark


@settings(max_examples=20)
@given(kind=st.sampled_from(["tumbling", "hopping", "session", "range", "rows"]),
       keyed=st.booleans(), lateness=st.integers(0, 15),
       steps=steps_of(ROW, n_steps=7, deletes=False))
def test_lateness_and_gc_keep_results_exact(workers, eager_gc, kind, keyed, lateness, steps):
    """Late rows are dropped and counted; dropping the state of what the watermark closed (GC,
    here after every step) never changes a result."""
    keys = [1] if keyed else []
    by = ["k"] if keyed else []
    if kind == "tumbling":
        spec, ref = tumbling(10), (lambda z: R.window_agg(z, 0, keys, 10, 10, AGGS))
    elif kind == "hopping":
        spec, ref = hopping(12, 4), (lambda z: R.window_agg(z, 0, keys, 12, 4, AGGS))
    elif kind == "session":
        spec, ref = session(3), (lambda z: R.session_agg(z, 0, keys, 3, AGGS))
    if kind in ("tumbling", "hopping", "session"):
        def build(ev):
            return ev.group_by(by).window(spec).agg(n=count(), s=sum_("x"), lo=min_("x"),
                                                    hi=max_("x")).collect()
    else:
        kw = {"range": 6} if kind == "range" else {"rows": 2}

        def build(ev):
            return ev.rolling(by=by, **kw).agg(n=count(), s=sum_("x"), lo=min_("x"),
                                               hi=max_("x")).collect()

        def ref(z):
            return R.rolling(z, 0, keys, AGGS, range_=kw.get("range"), rows=kw.get("rows"))
    _run_late(workers, steps, lateness, build, ref)


# -- bounded state ------------------------------------------------------------------------------

def _long_run(workers, lateness, steps=120, rows=25):
    """Every window kind over an unbounded, out-of-order stream; state rows per step."""
    with StreamContext(workers=workers) as ctx:
        kw = {} if lateness is None else {"time": "t", "lateness": lateness}
        ev = ctx.stream(INT, name="ev", **kw)
        ev.group_by("k").window(tumbling(50), time="t").agg(n=count(), s=sum_("x")).collect(
            view=False)
        ev.window(hopping(100, 25), time="t").agg(hi=max_("x")).collect(view=False)
        ev.group_by("k").window(session(3), time="t").agg(n=count()).collect(view=False)
        ev.rolling("t", range=40, by="k").agg(s=sum_("x")).collect(view=False)
        ev.rolling("t", rows=5, by="k").agg(lo=min_("x")).collect(view=False)
        rng = np.random.default_rng(7)
        sizes = []
        for step in range(steps):
            # 25 rows per step, 10 time units apart, out of order by up to 30 units; each key
            # gets a row every ~16 units, so sessions (gap 3) close
            t = step * 250 + np.arange(rows) * 10 - rng.integers(0, 30, rows)
            ev.insert(pa.table({"t": t, "k": (np.arange(rows) + step) % 16,
                                "x": rng.integers(0, 100, rows)}))
            if step % 10 == 5:  # three stragglers far behind the watermark
                ev.insert([(step * 250 - 500, k, 1) for k in range(3)])
            ctx.step()
            sizes.append(ctx.state_rows())
        return sizes, ev.late_rows


def test_state_stays_bounded_behind_the_watermark(workers, monkeypatch):
    # sessions and rolling sweep their state when it doubles, from 1024 rows per worker by
    # default; a lower threshold lets a short run show the bound
    monkeypatch.setattr(KeyedRecomputeOperator, "MIN_GC_ROWS", 128)
    sizes, late = _long_run(workers, lateness=40)
    total = 120 * 25
    # live state: a few windows / sessions / frames behind the watermark, whatever the run length
    assert max(sizes[40:]) < 0.3 * total, sizes
    assert max(sizes[80:]) <= 1.3 * max(sizes[30:60]) + 200, sizes
    assert late == 3 * 12  # the stragglers, dropped and counted
    # without a watermark the same queries keep everything
    unbounded, _ = _long_run(workers, lateness=None)
    assert unbounded[-1] > 3 * total
    assert max(sizes[80:]) < unbounded[-1] / 8
