"""A pipeline that survives bad data (issue 11, part A): one test per item found, the error
policies, atomic steps, the lifecycle, and the hypothesis test of random bad rows mixed into
random valid streams, under both policies, with 1 and 2 workers."""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dbsp import ClosedError, InputError, RowError, StreamContext, col, count, sum_
from dbsp.api import FixedBatching
from dbsp.circuit.errors import row_json

KV = {"k": pa.int64(), "v": pa.int64()}


def _ctx(workers=1, errors="raise", **kw):
    return StreamContext(workers=workers, errors=errors, **kw)


# -- item 1: count() with no group-by -----------------------------------------------------------

def test_count_alone_without_group_by(workers):
    ctx = _ctx(workers)
    s = ctx.stream(KV)
    out = s.agg(n=count()).collect()
    s.insert([(1, 2), (3, 4), (5, 6)])
    ctx.step()
    assert out.rows() == [(3,)]
    s.delete([(1, 2)])
    ctx.step()
    assert out.rows() == [(2,)]


# -- item 2: weights never wrap ----------------------------------------------------------------

def test_weight_overflow_in_distinct_is_an_error_naming_the_row(workers):
    ctx = _ctx(workers)
    s = ctx.stream(KV)
    out = s.distinct().collect()
    s.push([(1, 1)], weights=[2 ** 62])
    ctx.step()
    s.push([(1, 1)], weights=[2 ** 62])
    with pytest.raises(RowError, match=r"distinct.*k=1, v=1.*out of the int64 range"):
        ctx.step()
    assert out.view_dict() == {(1, 1): 1}      # the row did not disappear
    s.insert([(2, 2)])
    ctx.step()                                 # and the circuit keeps stepping
    assert out.view_dict() == {(1, 1): 1, (2, 2): 1}


def test_weights_out_of_int64_are_refused():
    ctx = _ctx()
    s = ctx.stream(KV)
    with pytest.raises(InputError, match="out of the int64 range"):
        s.push([(1, 1)], weights=[2 ** 63])
    with pytest.raises(InputError, match="out of the int64 range"):
        s.push([(1, 1)], weights=np.array([2 ** 63], dtype=np.uint64))
    s.push([(1, 1)], weights=[2 ** 62])
    with pytest.raises(InputError, match="add up to"):  # would wrap when consolidated
        s.push([(1, 1)], weights=[2 ** 62])
    assert s.input.pending_rows == 1


# -- item 3: sums are checked ------------------------------------------------------------------

def test_sum_overflow_is_sql_out_of_range(workers):
    ctx = _ctx(workers)
    s = ctx.stream(KV)
    out = s.group_by("k").agg(t=sum_("v")).collect()
    s.insert([(3, 2 ** 62), (3, 2 ** 62)])
    with pytest.raises(RowError, match=r"k=3.*sum of 'v' is out of the int64 range"):
        ctx.step()
    s.insert([(3, 2 ** 62), (4, 1)])
    ctx.step()
    assert sorted(out.rows()) == [(3, 2 ** 62), (4, 1)]
    s.insert([(3, 2 ** 62 - 1)])       # 2**63 - 1 fits
    ctx.step()
    assert sorted(out.rows()) == [(3, 2 ** 63 - 1), (4, 1)]
    s.insert([(3, 1)])
    with pytest.raises(RowError, match="out of the int64 range"):
        ctx.step()


def test_sum_overflow_in_a_general_aggregate():
    from dbsp import max_
    ctx = _ctx()
    s = ctx.stream(KV)
    out = s.group_by("k").agg(t=sum_("v"), m=max_("v")).collect()
    s.insert([(1, -2 ** 62), (1, -2 ** 62), (1, -1)])
    with pytest.raises(RowError, match="out of the int64 range"):
        ctx.step()
    s.insert([(1, -2 ** 62), (1, -2 ** 62)])   # exactly INT64_MIN: fits
    ctx.step()
    assert out.rows() == [(1, -2 ** 63, -2 ** 62)]


@pytest.mark.parametrize("general", [False, True], ids=["linear", "general"])
def test_a_uint64_value_past_int64_is_out_of_range_not_a_wrapped_sum(workers, general):
    from dbsp import max_
    ctx = _ctx(workers)
    s = ctx.stream({"k": pa.int64(), "v": pa.uint64()})
    aggs = dict(t=sum_("v"), m=max_("v")) if general else dict(t=sum_("v"))
    out = s.group_by("k").agg(**aggs).collect()
    s.insert([(1, 2 ** 63 + 5), (2, 3)])     # one value alone: its int64 sum would be negative
    with pytest.raises(RowError, match=r"k=1.*sum of 'v' is out of the int64 range"):
        ctx.step()
    s.insert([(1, 2 ** 63 - 1), (2, 3)])     # the largest that fits
    ctx.step()
    assert sorted(r[:2] for r in out.rows()) == [(1, 2 ** 63 - 1), (2, 3)]
    ctx2 = _ctx(workers, errors="skip_and_report")
    s2 = ctx2.stream({"k": pa.int64(), "v": pa.uint64()})
    out2 = s2.group_by("k").agg(**aggs).collect()
    s2.insert([(1, 2 ** 64 - 1), (2, 3)])
    ctx2.step()
    assert [r[:2] for r in out2.rows()] == [(2, 3)]
    assert [r["row"]["k"] for r in ctx2.errors.records] == [1]


def test_a_decimal_sum_past_38_digits_is_out_of_range(workers):
    from decimal import Decimal
    big = Decimal(9 * 10 ** 37)
    for policy in ("raise", "skip_and_report"):
        ctx = _ctx(workers, errors=policy)
        s = ctx.stream({"k": pa.int64(), "v": pa.decimal128(38, 0)})
        out = s.group_by("k").agg(t=sum_("v")).collect()
        s.insert([(1, big), (2, Decimal(1))])
        ctx.step()
        s.insert([(1, big), (3, Decimal(1))])  # 18 * 10**37: 39 digits
        if policy == "raise":
            with pytest.raises(RowError, match=r"k=1.*sum of 'v' is out of the decimal128\(38\) "
                                               r"range"):
                ctx.step()
            assert sorted(out.rows()) == [(1, big), (2, 1)]
        else:
            ctx.step()
            assert sorted(out.rows()) == [(1, big), (2, 1), (3, 1)]
            [rec] = ctx.errors.records
            assert rec["row"]["k"] == 1 and "decimal128(38)" in rec["reason"]
        s.insert([(4, Decimal(-1))])          # the circuit keeps stepping
        ctx.step()
        assert (4, -1) in out.rows()
        ctx.close()


# -- item 5: pandas frames with mixed columns --------------------------------------------------

def test_pandas_mixed_column_names_input_column_and_row():
    ctx = _ctx()
    s = ctx.stream(KV, name="orders")
    with pytest.raises(InputError, match=r"input 'orders', column 'v', row 1: value 'x'"):
        s.push(pd.DataFrame({"k": [1, 2], "v": [1, "x"]}))
    assert s.input.pending_rows == 0


# -- item 6: a failed step rolls back and the circuit keeps going ------------------------------

@pytest.mark.parametrize("runtime", ["threads", "processes"])
def test_failed_step_rolls_back_and_names_operator_expression_row(workers, runtime):
    ctx = _ctx(workers, runtime=runtime)
    s = ctx.stream(KV)
    q = s.select("k", q=col("v") * 4)
    total = q.group_by("k").agg(t=sum_("q"), n=count()).collect()
    s.insert([(1, 1), (2, 3)])
    ctx.step()
    before = total.view_dict()
    s.insert([(1, 5), (2, 2 ** 62)])
    with pytest.raises(RowError) as ei:
        ctx.step()
    e = ei.value
    assert e.operator == "map" and e.row == {"k": 2, "v": 2 ** 62}
    assert 'col("v") * 4' in e.expression and e.step == 1
    assert e.rejected_input["input0"].num_rows == 2
    assert total.view_dict() == before
    s.insert([(1, 5)])
    ctx.step()
    assert sorted(total.rows()) == [(1, 24, 2), (2, 12, 1)]
    ctx.close()


def test_rollback_restores_every_kind_of_state(workers):
    """join traces, distinct, a general aggregate, a delay (integrate) and a watermark: a failed
    step leaves all of them as before, so the pipeline's results equal a run without it."""
    from dbsp import max_

    def build(ctx):
        a = ctx.stream({"k": pa.int64(), "t": pa.int64()}, name="a", time="t", lateness=5)
        b = ctx.stream(KV, name="b")
        j = a.join(b, on="k")
        bad = j.select("k", "v", x=col("v") * col("t") * 2 ** 55)   # overflows at t == 100
        outs = [j.distinct().collect(), bad.group_by("k").agg(m=max_("x"), n=count()).collect(),
                b.group_by("k").agg(s=sum_("v")).collect()]
        return a, b, outs

    runs = []
    for fail in (False, True):
        ctx = _ctx(workers)
        a, b, outs = build(ctx)
        a.insert([(1, 10), (2, 20)])
        b.insert([(1, 7), (2, 9)])
        ctx.step()
        if fail:
            a.insert([(1, 100), (3, 50)])
            b.insert([(3, 1), (1, 8)])
            with pytest.raises(RowError, match="overflow"):
                ctx.step()
            assert ctx.watermarks["a"] == 15
        a.insert([(3, 30)])
        b.insert([(3, 4), (2, 1)])
        ctx.step()
        # (state_rows may differ: the undo is stored as cancelling batches until merged)
        runs.append(([o.view_dict() for o in outs], [o.delta_dict() for o in outs],
                     ctx.watermarks))
    assert runs[0] == runs[1]


# -- item 7: lifecycle ------------------------------------------------------------------------

def test_close_before_first_step_is_final():
    ctx = _ctx()
    s = ctx.stream(KV)
    out = s.collect()
    s.insert([(1, 1)])
    ctx.close()
    ctx.close()                      # idempotent
    with pytest.raises(ClosedError):
        ctx.step()
    with pytest.raises(ClosedError):
        s.insert([(2, 2)])
    with pytest.raises(ClosedError):
        ctx.stream(KV, name="other")
    with pytest.raises(ClosedError):
        ctx.execute()
    assert out.rows() == []


def test_close_after_steps_and_context_manager(workers):
    with _ctx(workers) as ctx:
        s = ctx.stream(KV)
        s.insert([(1, 1)])
        ctx.step()
    assert ctx.closed
    with pytest.raises(ClosedError, match="closed"):
        s.insert([(2, 2)])
    with pytest.raises(ClosedError, match="closed"):
        ctx.step()


# -- item 8: a bad row in a replayed chunk keeps the good rows ---------------------------------

def _replay(errors):
    t = pa.table({"k": pa.array([1, 2, None, 4, 5], pa.int64())})
    ctx = _ctx(errors=errors, batching=FixedBatching(2))
    s = ctx.stream(t, name="src", schema=pa.schema([pa.field("k", pa.int64(), nullable=False)]))
    return ctx, s.collect()


def test_replay_chunk_with_a_bad_row_keeps_the_good_rows_raise():
    ctx, out = _replay("raise")
    ctx.step()
    with pytest.raises(InputError, match=r"input 'src', column 'k', row 2: null") as ei:
        ctx.step()
    assert ei.value.rejected_rows == [{"k": None}]
    while ctx.step():
        pass
    assert sorted(out.view_dict()) == [(1,), (2,), (4,), (5,)]


def test_replay_chunk_with_a_bad_row_keeps_the_good_rows_skip():
    ctx, out = _replay("skip_and_report")
    ctx.execute()
    assert sorted(out.view_dict()) == [(1,), (2,), (4,), (5,)]
    [rec] = ctx.errors.records
    assert rec["source"] == "src" and rec["row"] == {"k": None} and "row 2" in rec["reason"]
    assert ctx.report()["inputs"]["src"]["bad_rows"] == 1


# -- item 9: storage verify on a directory -----------------------------------------------------

def test_storage_verify_walks_a_directory(tmp_path):
    from dbsp.storage.config import StorageConfig
    d = tmp_path / "state"
    ctx = StreamContext(storage=StorageConfig(str(d), memory_budget_bytes=1))
    s = ctx.stream(KV)
    out = s.group_by("k").agg(n=count()).collect()
    for i in range(4):
        s.insert([(j, j) for j in range(i * 2000, (i + 1) * 2000)])
        ctx.step()
    assert len(out.view_dict()) == 8000
    (d / "notes.txt").write_text("not a layer file")
    cmd = [sys.executable, "-m", "dbsp.cli.main", "storage", "verify", str(d)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Is a directory" not in r.stderr
    n = int(r.stdout.split(": ")[1].split()[0])
    assert n >= 1 and r.stdout.count(": OK") == n and "1 other file(s) skipped" in r.stdout
    victim = sorted(p for p in d.rglob("*") if p.is_file() and p.name != "notes.txt"
                    and p.read_bytes()[:4] == b"DBSB")[0]
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 1 and str(victim) in r.stderr
    ctx.close()


# -- item 10: deleting a row never inserted ----------------------------------------------------

def test_delete_of_a_row_never_inserted(workers):
    ctx = _ctx(workers)
    s = ctx.stream(KV)
    out = s.group_by("k").agg(n=count()).collect()
    s.insert([(2, 1)])
    ctx.step()
    s.delete([(1, 1)])
    with pytest.raises(RowError, match="negative: a row was deleted that was never inserted"):
        ctx.step()
    assert out.view_dict() == {(2, 1): 1}
    ctx2 = _ctx(workers, errors="skip_and_report")
    s2 = ctx2.stream(KV)
    out2 = s2.group_by("k").agg(n=count()).collect()
    s2.insert([(2, 1)])
    s2.delete([(1, 1)])
    ctx2.step()
    assert out2.view_dict() == {(2, 1): 1}
    [rec] = ctx2.errors.records
    assert rec["row"]["k"] == 1 and rec["weight"] == -1 and "never inserted" in rec["reason"]
    assert rec["row"] == {"k": 1}  # the aggregate's input (count() needs the key only)


# -- skip_and_report ---------------------------------------------------------------------------

def test_skip_and_report_per_input_and_per_pipeline():
    ctx = _ctx(errors="raise")
    loose = ctx.stream(KV, name="loose", errors="skip_and_report")
    strict = ctx.stream(KV, name="strict")
    assert loose.insert([(1, 1), (2, "two"), (3, None)]) == 2
    with pytest.raises(InputError):
        strict.insert([(1, 1), (2, "two")])
    assert strict.input.pending_rows == 0
    assert [r["source"] for r in ctx.errors.records] == ["loose"]
    rep = ctx.report()
    assert rep["inputs"]["loose"]["bad_rows"] == 1 and rep["errors"]["rows"] == 1


def test_skip_and_report_runtime_errors(workers):
    ctx = _ctx(workers, errors="skip_and_report")
    s = ctx.stream(KV)

    def inv(row):
        return (row[0], 100 // row[1])
    q = s.map_rows(inv, [("k", pa.int64()), ("q", pa.int64())])
    out = q.filter(col("q") > 0).group_by("k").agg(t=sum_("q")).collect()
    s.insert([(1, 10), (1, 0), (2, 50), (3, 0), (2, -1)])
    ctx.step()
    assert sorted(out.rows()) == [(1, 10), (2, 2)]
    bad = sorted((r["row"]["k"], r["row"]["v"], r["source"], r["step"]) for r in ctx.errors.records)
    assert bad == [(1, 0, "map_rows", 0), (3, 0, "map_rows", 0)]
    assert all("ZeroDivisionError" in r["reason"] for r in ctx.errors.records)
    assert ctx.report()["errors"]["by_source"] == {"map_rows": 2}
    assert ctx.errors.to_arrow().num_rows == 2


def test_cast_failure_raises_with_expression_and_row():
    ctx = _ctx()
    s = ctx.stream({"k": pa.int64(), "s": pa.string()})
    out = s.select("k", n=col("s").cast(pa.int64())).collect()
    s.insert([(1, "12"), (2, "x1")])
    with pytest.raises(RowError, match=r"expression n = .*cast.*row \{k=2, s='x1'\}"):
        ctx.step()
    s.insert([(1, "12")])
    ctx.step()
    assert out.rows() == [(1, 12)]


# -- the hypothesis test -----------------------------------------------------------------------
#
# Random valid rows (k small, v small) mixed with bad ones of four kinds: a value of the wrong
# type and a null in a non-null column (refused at push time), a row whose expression overflows
# (v * 2**61 for |v| >= 4) and a row that makes a per-row Python function raise (v == 13).
# Pipeline: map_rows (raises on 13) -> select q = v * 2**61 -> group_by(k) count + sum(v).

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64())])
GOOD = st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(-3, 3)))
BAD = st.one_of(
    st.tuples(st.integers(0, 3), st.just("wrong type")).map(lambda r: (r, "push")),
    st.tuples(st.none(), st.integers(-3, 3)).map(lambda r: (r, "push")),
    st.tuples(st.integers(0, 3), st.sampled_from([4, -5, 100])).map(lambda r: (r, "map")),
    st.tuples(st.integers(0, 3), st.just(13)).map(lambda r: (r, "map_rows")),
)
STEP = st.lists(st.one_of(GOOD.map(lambda r: (r, None)), BAD), max_size=12)


# the reason recorded for each kind of bad row: (source, k is null) -> pattern
_REASONS = {
    ("in", False): r"^input 'in', column 'v', row \d+: value 'wrong type' does not fit type int64",
    ("in", True): r"^input 'in', column 'k', row \d+: null in a column that is not nullable",
    ("map", False): r"overflow",
    ("map_rows", False): r"^ValueError: unlucky value$",
}


def _pipeline(ctx):
    s = ctx.stream(SCHEMA, name="in")

    def check(row):
        if row[1] == 13:
            raise ValueError("unlucky value")
        return row
    q = s.map_rows(check, SCHEMA).select("k", "v", q=col("v") * 2 ** 61)
    out = q.group_by("k").agg(n=count(), t=sum_("v")).collect()
    return s, out


def _reference(rows):
    """count and sum(v) per k over the good rows alone (SQL: null sum when no value)."""
    groups: dict = {}
    for k, v in rows:
        n, t = groups.get(k, (0, None))
        groups[k] = (n + 1, t if v is None else (v if t is None else t + v))
    return {(k, n, t): 1 for k, (n, t) in groups.items()}


@settings(max_examples=25)
@given(steps=st.lists(STEP, min_size=1, max_size=4), policy=st.sampled_from(
    ["raise", "skip_and_report"]),
    deletes=st.lists(st.lists(st.integers(0, 40), max_size=3), max_size=4))
@example(steps=[[((1, 13), "map_rows"), ((1, 1), None)], [((2, 2), None)]], policy="raise",
         deletes=[])
@example(steps=[[((1, 1), None), ((1, 2), None)], [((1, 4), "map"), ((2, 2), None)]],
         policy="raise", deletes=[[], [0]])
def test_random_bad_rows_in_random_streams(workers, steps, policy, deletes):
    # each step may also delete some of the good rows accepted before (valid retractions)
    ctx = _ctx(workers, errors=policy)
    s, out = _pipeline(ctx)
    es = ctx.error_stream().collect()
    good_rows: list = []
    expected_bad: list = []
    for step_no, rows in enumerate(steps):
        step_rows = [r for r, _ in rows]
        picks = deletes[step_no] if step_no < len(deletes) and good_rows else []
        gone = [good_rows[i] for i in sorted({i % len(good_rows) for i in picks})]

        def applied(accepted):
            good_rows.extend(accepted)
            for r in gone:
                good_rows.remove(r)
        if policy == "skip_and_report":
            s.insert(step_rows)
            if gone:
                s.delete(gone)
            ctx.step()
            applied([r for r, why in rows if why is None])
            expected_bad += [(r, why, ctx.steps - 1) for r, why in rows if why is not None]
            assert out.view_dict() == _reference(good_rows)
            continue
        # raise: a bad push is refused whole; a bad row at run time rolls the step back
        try:
            s.insert(step_rows)
        except InputError:
            assert any(why == "push" for _, why in rows)
            step_rows = [r for r, why in rows if why != "push"]
            s.insert(step_rows)
        if gone:
            s.delete(gone)
        try:
            ctx.step()
            assert all(why is None for r, why in rows if r in step_rows)
            applied(step_rows)
        except RowError as e:
            assert any(why in ("map", "map_rows") for _, why in rows)
            assert e.operator in ("map", "map_rows") and e.step == ctx.steps
            assert tuple(e.row.values()) in [r for r, why in rows if why in ("map", "map_rows")]
            assert out.view_dict() == _reference(good_rows)   # rolled back: as before
            # the rejected input is handed back: push its good rows (and deletes) again
            good = [r for r, why in rows if why is None]
            s.insert(good)
            if gone:
                s.delete(gone)
            ctx.step()
            applied(good)
        assert out.view_dict() == _reference(good_rows)
    assert out.view_dict() == _reference(good_rows)
    if policy == "skip_and_report":
        got = sorted(((tuple(r["row"]) if isinstance(r["row"], tuple) else
                       (r["row"]["k"], r["row"]["v"]), r["source"], r["step"])
                      for r in ctx.errors.records), key=repr)
        want = sorted(((r, {"push": "in", "map": "map", "map_rows": "map_rows"}[why], st_)
                       for r, why, st_ in expected_bad), key=repr)
        assert got == want
        for r in ctx.errors.records:  # each with the reason of its kind
            row = r["row"] if isinstance(r["row"], tuple) else (r["row"]["k"], r["row"]["v"])
            assert re.search(_REASONS[r["source"], row[0] is None], r["reason"]), r
            if r["source"] == "map":
                assert r["expression"].startswith("q = ")
    else:
        assert len(ctx.errors) == 0
    s.insert([(0, 1)])                # the circuit keeps stepping
    ctx.step()
    assert out.view_dict() == _reference(good_rows + [(0, 1)])
    # the error stream holds every record of the log exactly once (run-time ones a step later)
    streamed = sorted((k[1], k[0], k[4]) for k, m in es.view_dict().items() for _ in range(m))
    logged = sorted((r["source"], r["step"], row_json(r["row"])) for r in ctx.errors.records)
    assert streamed == logged
    ctx.close()


def test_join_weight_overflow_names_the_key():
    ctx = _ctx()
    a = ctx.stream(KV, name="a")
    b = ctx.stream(KV, name="b")
    out = a.join(b, on="k").collect()
    a.push([(1, 1)], weights=[2 ** 40])
    b.push([(1, 2)], weights=[2 ** 30])
    with pytest.raises(RowError, match=r"join.*k=1.*out of the int64 range"):
        ctx.step()
    a.push([(1, 1)], weights=[3])
    b.push([(1, 2)], weights=[2])
    ctx.step()
    assert out.view_dict() == {(1, 1, 2): 6}


def test_rolled_back_upsert_is_forgotten_by_the_keyed_input(workers):
    ctx = _ctx(workers)
    s = ctx.stream(KV, key="k")
    out = s.select("k", w=col("v") * 2 ** 61).collect()
    s.upsert([(1, 1)])
    ctx.step()
    s.upsert([(1, 99)])          # 99 * 2**61 overflows: the step is rolled back
    with pytest.raises(RowError):
        ctx.step()
    s.upsert([(1, 2)])           # replaces (1, 1), the row the circuit really holds
    ctx.step()
    assert out.view_dict() == {(1, 2 ** 62): 1}


def test_skip_and_report_across_worker_processes():
    ctx = StreamContext(workers=2, runtime="processes", errors="skip_and_report")
    s = ctx.stream(KV)
    out = s.select("k", q=col("v") * 2 ** 62).group_by("k").agg(n=count()).collect()
    s.insert([(k, k % 3) for k in range(40)])     # v == 2 overflows
    ctx.step()
    assert sorted(out.rows()) == sorted((k, 1) for k in range(40) if k % 3 != 2)
    got = sorted(r["row"]["k"] for r in ctx.errors.records)
    assert got == [k for k in range(40) if k % 3 == 2]
    assert {r["source"] for r in ctx.errors.records} == {"map"}
    ctx.close()


def test_a_wider_sum_where_the_user_asks_for_one():
    """SQL's answer to 'out of range': sum in a wider type. Casting the input to a decimal
    makes the sum a decimal128(38, 0), which holds what int64 cannot."""
    from decimal import Decimal
    ctx = _ctx()
    s = ctx.stream(KV)
    out = s.group_by("k").agg(t=sum_(col("v").cast(pa.decimal128(38, 0)))).collect()
    s.insert([(3, 2 ** 62), (3, 2 ** 62), (3, 2 ** 62)])
    ctx.step()
    assert out.rows() == [(3, Decimal(3 * 2 ** 62))]


@pytest.mark.parametrize("errors", ["raise", "skip_and_report"])
def test_pushing_something_that_is_not_rows_names_the_input(errors):
    ctx = _ctx(errors=errors)
    s = ctx.stream(KV, name="orders")
    for bad in (42, 1.5, None):
        with pytest.raises(InputError, match=r"^input 'orders': cannot push a \w+: push a "):
            s.push(bad)
    s.insert([(1, 1)])
    ctx.step()
    ctx.close()


def test_a_keyed_input_refuses_to_delete_a_row_it_does_not_hold(workers):
    # item 10 where the engine knows the rows: an input with key= holds its current rows, so a
    # delete of a row never inserted is caught at push time even when the group stays non-empty
    ctx = _ctx(workers)
    s = ctx.stream(KV, name="prices", key="k")
    out = s.group_by("k").agg(n=count()).collect()
    view = s.collect()
    s.insert([(1, 1), (2, 2)])
    ctx.step()
    with pytest.raises(InputError, match=r"^input 'prices', row 1: a row was deleted that was "
                                         r"never inserted .*\{'k': 1, 'v': 2\}"):
        s.delete([(2, 2), (1, 2)])
    s.insert([(3, 3)])
    s.delete([(3, 3), (2, 2)])              # rows pushed earlier in the step are held
    s.upsert([(1, 5)])                      # upsert retracts what the key holds: accepted
    ctx.step()
    assert view.view_dict() == {(1, 5): 1}
    assert out.view_dict() == {(1, 1): 1}
    ctx2 = _ctx(workers, errors="skip_and_report")
    s2 = ctx2.stream(KV, name="prices", key="k")
    view2 = s2.collect()
    s2.insert([(1, 1)])
    ctx2.step()
    s2.delete([(1, 2), (1, 1), (1, 2)])
    ctx2.step()
    assert view2.view_dict() == {}
    recs = ctx2.errors.records
    assert [(r["source"], r["row"], r["weight"]) for r in recs] == [("prices", (1, 2), -1)] * 2
    assert all("never inserted" in r["reason"] for r in recs)
    ctx.close()
    ctx2.close()
