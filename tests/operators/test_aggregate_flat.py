"""min / max / count_distinct maintained from per-(key, value) weights
(:class:`~dbsp.operators.aggregate.GeneralAggregateOperator`) and the trace probes they use
(:mod:`dbsp.trace.probe`), against the reference model and brute force, with retractions of the
extremes (which make the operator seek the value trace), 1 and 2 workers."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import dbsp
from dbsp import StreamContext, count, max_
from dbsp.algebra.codes import KeyCodec
from dbsp.operators.aggregate import VersionedRows
from dbsp.testing import reference as ref
from dbsp.testing.harness import check_steps
from dbsp.trace.batch import OrdIndexedZSet
from dbsp.trace.journal import StepJournal, use_journal
from dbsp.trace.probe import first_positive, pair_weights

S = pa.schema([pa.field("k", pa.int64()), pa.field("x", pa.int64()), pa.field("s", pa.string())])
AGGS = {"lo": ("min", "x"), "hi": ("max", "x"), "cd": ("count_distinct", "x"),
        "slo": ("min", "s"), "shi": ("max", "s"), "scd": ("count_distinct", "s"),
        "n": ("count", None)}
REF = [("min", 0), ("max", 0), ("count_distinct", 0), ("min", 1), ("max", 1),
       ("count_distinct", 1), ("count", None)]


def _run(workers, steps, aggs=AGGS, spec=REF):
    check_steps(workers, {"t": S}, lambda t: t.index_by(["k"]).aggregate(aggs),
                lambda z: ref.aggregate(z, [0], spec), [{"t": s} for s in steps])


def test_extremes_retracted_one_by_one(workers):
    # a group of 40 values; the maximum, then the minimum, are deleted step after step, so each
    # step seeks the next extreme in the value trace (several batches by then)
    base = {(1, x, f"v{x:03d}"): 1 for x in range(40)}
    steps = [base, {(2, 5, "a"): 2, (1, 7, None): 1}]
    for i in range(12):
        steps.append({(1, 39 - i, f"v{39 - i:03d}"): -1, (1, i, f"v{i:03d}"): -1})
    _run(workers, steps)


def test_extreme_comes_back_and_negative_weights(workers):
    steps = [{(1, 5, "e"): 1, (1, 3, "c"): -1},          # 3 has weight -1: min is 5
             {(1, 3, "c"): 1},                          # weight 0: still 5
             {(1, 3, "c"): 1, (1, 9, "z"): 1},           # 3 positive: min 3, max 9
             {(1, 9, "z"): -1, (1, 5, "e"): -1},        # max back to 3; 5 gone
             {(1, 3, "c"): -1},                         # nothing positive: null, no row
             {(1, 4, "d"): 2, (1, 4, None): 1}]
    _run(workers, steps)


def test_insert_only_then_retraction(workers):
    # the append-only fast path (no probes) until the first retraction, then the general path
    steps = [{(k, x, str(x)): 1 for k in range(3) for x in range(k, 20, 3)},
             {(0, 100, "zz"): 1, (1, -4, "0"): 1},
             {(0, 100, "zz"): -1, (1, -4, "0"): -1, (2, 2, "2"): -1}]
    _run(workers, steps)


@st.composite
def _steps(draw):
    # few keys and values so that groups grow, extremes repeat and get retracted
    rows = st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 9)),
                     st.sampled_from([None, "a", "b", "bb", "c"]))
    n = draw(st.integers(1, 6))
    out = []
    for _ in range(n):
        out.append({r: w for r, w in draw(st.dictionaries(rows, st.integers(-2, 3),
                                                          max_size=8)).items() if w})
    return out


@settings(max_examples=80, deadline=None)
@given(steps=_steps())
@example(steps=[{(0, 1, "a"): 1, (0, 2, "b"): 1}, {(0, 1, "a"): -1}, {(0, 2, "b"): -1}])
def test_extremes_random(workers, steps):
    _run(workers, steps)


# -- the numeric path: every state column fixed-width (integers, temporal, no strings) ----------

SN = pa.schema([pa.field("k", pa.int64()), pa.field("x", pa.int64()),
                pa.field("t", pa.timestamp("us")), pa.field("u", pa.uint64()),
                pa.field("d", pa.date32())])
AGGS_NUM = {"lo": ("min", "x"), "hi": ("max", "x"), "cd": ("count_distinct", "x"),
            "n": ("count", None), "nx": ("count", "x"), "s": ("sum", "x"), "a": ("avg", "x"),
            "tlo": ("min", "t"), "thi": ("max", "t"), "uhi": ("max", "u"), "dlo": ("min", "d")}
REF_NUM = [("min", 0), ("max", 0), ("count_distinct", 0), ("count", None), ("count", 0),
           ("sum", 0), ("avg", 0), ("min", 1), ("max", 1), ("max", 2), ("min", 3)]


def _run_num(workers, steps):
    check_steps(workers, {"t": SN}, lambda t: t.index_by(["k"]).aggregate(AGGS_NUM),
                lambda z: ref.aggregate(z, [0], REF_NUM), [{"t": s} for s in steps])


@st.composite
def _num_steps(draw):
    import datetime as dt
    t0 = dt.datetime(2020, 1, 1)
    rows = st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(-5, 9)),
                     st.one_of(st.none(), st.integers(0, 4).map(
                         lambda s: t0 + dt.timedelta(seconds=s))),
                     st.one_of(st.none(), st.sampled_from([0, 7, 2**63 + 5, 2**64 - 1])),
                     st.one_of(st.none(), st.integers(0, 3).map(
                         lambda n: dt.date(2021, 1, 1) + dt.timedelta(days=n))))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        out.append({r: w for r, w in draw(st.dictionaries(rows, st.integers(-2, 3),
                                                          max_size=8)).items() if w})
    return out


@settings(max_examples=80, deadline=None)
@given(steps=_num_steps())
def test_numeric_extremes_random(workers, steps):
    _run_num(workers, steps)


def test_numeric_insert_only_then_retraction(workers):
    import datetime as dt
    t = dt.datetime(2020, 1, 1)
    steps = [{(k, x, t, x, None): 1 for k in range(3) for x in range(k, 20, 3)},
             {(0, 100, None, 2**64 - 1, dt.date(2020, 1, 1)): 1, (1, -4, t, None, None): 1},
             {(0, 100, None, 2**64 - 1, dt.date(2020, 1, 1)): -1, (1, -4, t, None, None): -1,
              (2, 2, t, 2, None): -1},
             {(2, 5, t, 5, None): -1, (2, 8, t, 8, None): -1}]
    _run_num(workers, steps)


S1 = pa.schema([pa.field("k", pa.int64()), pa.field("x", pa.int64(), nullable=False)])


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.dictionaries(st.tuples(st.integers(0, 2), st.integers(-3, 6)),
                                      st.integers(-2, 3).filter(bool), max_size=8),
                      min_size=1, max_size=6))
def test_only_value_column_reuses_the_index_codes(workers, steps):
    # the aggregated column is the indexed stream's only value column: its (key, value) pairs
    # go to the value trace as the index sorted and encoded them
    check_steps(workers, {"t": S1}, lambda t: t.index_by(["k"]).aggregate(
                    {"lo": ("min", "x"), "hi": ("max", "x"), "cd": ("count_distinct", "x")}),
                lambda z: ref.aggregate(z, [0], [("min", 0), ("max", 0), ("count_distinct", 0)]),
                [{"t": s} for s in steps])


# -- the probes against brute force -------------------------------------------------------------

def _batches(rng, nb, strings):
    bs, tot = [], {}
    for _ in range(nb):
        n = int(rng.integers(1, 40))
        k, v, w = rng.integers(0, 5, n), rng.integers(0, 12, n), rng.integers(-2, 3, n)
        vals = pa.array([f"{x:02d}" for x in v]) if strings else pa.array(v)
        b = OrdIndexedZSet.from_parts(pa.record_batch([pa.array(k)], names=["k"]),
                                      pa.record_batch([vals], names=["v"]), w)
        if len(b):
            bs.append(b)
        for a, c, d in zip(k.tolist(), v.tolist(), w.tolist()):
            tot[(a, c)] = tot.get((a, c), 0) + d
    return bs, tot


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), nb=st.integers(1, 5), strings=st.booleans(),
       window=st.integers(1, 5))
def test_probes_match_brute_force(seed, nb, strings, window):
    rng = np.random.default_rng(seed)
    bs, tot = _batches(rng, nb, strings)
    if not bs:
        return
    keys = np.arange(6)
    kcodes = bs[0].kcodec.encode([pa.array(keys)])
    show = (lambda x: f"{x:02d}") if strings else (lambda x: x)
    for last in (False, True):
        found, srcs, rows = first_positive(bs, kcodes, last=last, window=window)
        got = {int(k): s.vals.column(0)[r].as_py()
               for k, s, r in zip(np.flatnonzero(found), srcs, rows.tolist())}
        want = {}
        for k in keys.tolist():
            pos = [c for (a, c), d in tot.items() if a == k and d > 0]
            if pos:
                want[k] = show(max(pos) if last else min(pos))
        assert got == want
    pk, pv = rng.integers(0, 6, 12), rng.integers(0, 12, 12)
    vcol = pa.array([f"{x:02d}" for x in pv]) if strings else pa.array(pv)
    w = pair_weights(bs, kcodes, pk, bs[0].vcodec.encode([vcol]))
    assert w.tolist() == [tot.get((a, c), 0) for a, c in zip(pk.tolist(), pv.tolist())]


def test_general_aggregate_state_does_not_hold_groups():
    # the state is one row per key plus the per-(key, value) counts of the aggregated column:
    # 10 keys with 1000 rows each over 50 distinct values -> 10 state rows + 500 value counts
    with dbsp.Circuit() as c:
        t = c.add_input("t", S)
        t.index_by(["k"]).aggregate({"hi": ("max", "x"), "n": ("count", None)}).output()
        rng = np.random.default_rng(1)
        for _ in range(10):
            k = rng.integers(0, 10, 1000)
            t.push(pa.record_batch([pa.array(k), pa.array(rng.integers(0, 50, 1000)),
                                    pa.nulls(1000, pa.string())], schema=S))
            c.step()
        op = next(o for o in c._replicas[0].ops if o.name == "aggregate(general)")
        op.state.trace.compact()
        op.values["x"].trace.compact()
        assert len(op.state.trace) == 10
        assert len(op.values["x"].trace) == 500


# -- the flat table of live rows (VersionedRows(flat=True)) -----------------------------------

_VS = pa.schema([pa.field("n", pa.int64()), pa.field("x", pa.int64())])
_VK = pa.schema([pa.field("k", pa.int64(), False)])


@st.composite
def _versioned_steps(draw):
    """Steps of ``{key: None (delete) | (n, x or None)}`` and what happens after each: kept,
    rolled back (the step journal), restored from a checkpoint image into a fresh state, or
    the state cleared."""
    out = []
    for _ in range(draw(st.integers(1, 8))):
        ch = draw(st.dictionaries(st.integers(-5, 30), st.none() | st.tuples(
            st.integers(-3, 3), st.none() | st.integers(-9, 9)), max_size=25))
        out.append((ch, draw(st.sampled_from(["keep", "keep", "rollback", "restore", "clear"]))))
    return out


def _versioned_get(vr, keys):
    kc = KeyCodec(list(_VK))
    kcodes = kc.encode([pa.array(keys, pa.int64())], len(keys))
    return kcodes, vr.get_numpy(kcodes, len(keys), [np.dtype(np.int64)] * 2, valid=True)


@settings(max_examples=80, deadline=None)
@given(_versioned_steps())
# a rolled-back replace re-inserts version 0 after retracting version 1: the live row is 0
@example(steps=[({0: (0, None)}, "keep"), ({0: (1, None)}, "rollback")])
def test_flat_versioned_rows_match_a_dict_through_rollback_and_restore(steps):
    """``VersionedRows(flat=True)`` reads (through its table) what a dict model and the spine
    itself (``flat=False`` over the same spine) hold, after puts, rolled-back puts, checkpoint
    restores into a fresh state, and clears; the table is used whenever it may be."""
    vr = VersionedRows("t", _VS, flat=True)
    model: dict = {}
    for ch, then in steps:
        keys = sorted(ch)
        G = len(keys)
        kcodes, (has, cols, ver, oks) = _versioned_get(vr, keys)
        assert [bool(h) for h in has] == [k in model for k in keys]
        newn = np.asarray([ch[k][0] if ch[k] else 0 for k in keys], np.int64)
        newx = np.asarray([(ch[k][1] or 0) if ch[k] else 0 for k in keys], np.int64)
        newok = np.asarray([bool(ch[k]) and ch[k][1] is not None for k in keys], bool)
        keep = np.asarray([ch[k] is not None for k in keys], bool)
        changed = np.ones(G, bool)
        journal = StepJournal()
        with use_journal(journal):
            vr.put(pa.record_batch([pa.array(keys, pa.int64())], schema=_VK), kcodes,
                   KeyCodec(list(_VK)), has, cols, ver, keep, [newn, newx], changed,
                   [None, oks[1]], [None, newok])
        if then == "rollback":
            journal.rollback()
        else:
            journal.commit()
            for k in keys:
                if ch[k] is None:
                    model.pop(k, None)
                else:
                    model[k] = (ch[k][0], ch[k][1])
        if then == "restore":
            saved = vr.checkpoint_state()
            vr = VersionedRows("t", _VS, flat=True)
            vr.restore_state(saved)
        elif then == "clear":
            vr.clear()
            model.clear()
        probe = sorted(set(model) | set(keys) | {31})
        _, (has, cols, ver, oks) = _versioned_get(vr, probe)
        assert vr._table is not None  # read through the table
        spine_only = VersionedRows("t", _VS)
        spine_only.trace = vr.trace
        _, (has2, cols2, ver2, oks2) = _versioned_get(spine_only, probe)
        np.testing.assert_array_equal(has, has2)
        np.testing.assert_array_equal(ver, ver2)
        for a, b in zip(cols + oks, cols2 + oks2):
            np.testing.assert_array_equal(a, b)
        got = {k: (int(cols[0][i]), int(cols[1][i]) if oks[1][i] else None)
               for i, k in enumerate(probe) if has[i]}
        assert got == model


def test_a_rolled_back_step_leaves_the_flat_table_right(workers):
    """count + max per key (the numeric state read through the flat table); a step that fails
    after the aggregate ran (an output view's weight out of int64) is rolled back, and the next
    steps' outputs are the reference's."""
    ctx = StreamContext(workers=workers)
    s = ctx.stream({"k": pa.int64(), "x": pa.int64()}, name="s")
    agg = s.group_by("k").agg(n=count(), hi=max_("x")).collect()
    raw = s.collect()
    seen: dict = {}

    def step(rows, weights=None, fails=False):
        s.push(rows, weights=weights)
        if fails:
            with pytest.raises(OverflowError):
                ctx.step()
            return
        ctx.step()
        for r, w in zip(rows, weights or [1] * len(rows)):
            seen[r] = seen.get(r, 0) + w
        want: dict = {}
        for (k, x), w in seen.items():
            n, hi = want.get(k, (0, None))
            want[k] = (n + w, x if w > 0 and (hi is None or x > hi) else hi)
        assert agg.view_dict() == {(k, n, hi): 1 for k, (n, hi) in want.items() if n}

    step([(1, 5), (2, 7), (9, 0)], [1, 1, 2 ** 62])
    step([(9, 1), (2, 3)], [-(2 ** 61), 1])
    # the aggregate puts new rows for keys 1, 3 and 9 (count of 9: 2**61 + 2**62), then the
    # view of the raw rows finds (9, 0) at 2**63: the step is rolled back
    step([(1, 9), (3, 1), (9, 0)], [1, 1, 2 ** 62], fails=True)
    step([(1, 6), (3, 2)])
    step([(1, 5), (2, 8), (9, 0), (9, 1)], [-1, 1, -(2 ** 62), 2 ** 61])
    step([(1, 9), (3, 1), (9, 4)])
    ctx.close()
    assert raw is not None


def test_flat_versioned_rows_merge_at_the_wider_fanout():
    """The spine of a state read through its flat table merges ``FLAT_FANOUT`` small batches at
    a time (a spine read by probes keeps fanout 4); over many steps of a few keys each, with
    merges and rolled-back steps among them, the table, the spine and a dict model agree."""
    from dbsp.operators.aggregate import FLAT_FANOUT
    assert VersionedRows("t", _VS).trace.fanout == 4
    vr = VersionedRows("t", _VS, flat=True)
    assert vr.trace.fanout == FLAT_FANOUT > 4
    vr.trace.background = False  # merges at insert, so the counts below are exact
    model: dict = {}
    rng = np.random.default_rng(7)
    for step in range(60):
        keys = sorted({int(k) for k in rng.integers(0, 40, 6)})
        kcodes, (has, cols, ver, oks) = _versioned_get(vr, keys)
        newn = rng.integers(-2, 3, len(keys)).astype(np.int64)
        newx = rng.integers(-9, 9, len(keys)).astype(np.int64)
        keep = newn != 0
        journal = StepJournal()
        with use_journal(journal):
            vr.put(pa.record_batch([pa.array(keys, pa.int64())], schema=_VK), kcodes,
                   KeyCodec(list(_VK)), has, cols, ver, keep, [newn, newx],
                   np.ones(len(keys), bool), [None, oks[1]], [None, None])
        if step % 7 == 3:
            journal.rollback()
            continue
        journal.commit()
        for k, n, x, kp in zip(keys, newn, newx, keep):
            if kp:
                model[k] = (int(n), int(x))
            else:
                model.pop(k, None)
        assert all(len(bs) < FLAT_FANOUT for bs in vr.trace.level_sizes().values())
    assert vr.trace.stats.merges > 0
    probe = list(range(40))
    _, (has, cols, ver, oks) = _versioned_get(vr, probe)
    spine_only = VersionedRows("t", _VS)
    spine_only.trace = vr.trace
    _, (has2, cols2, ver2, oks2) = _versioned_get(spine_only, probe)
    np.testing.assert_array_equal(has, has2)
    for a, b in zip(cols + [ver], cols2 + [ver2]):
        np.testing.assert_array_equal(a, b)
    assert {k: (int(cols[0][i]), int(cols[1][i])) for i, k in enumerate(probe) if has[i]} == model
