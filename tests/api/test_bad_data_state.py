"""A pipeline that survives bad data (issue 11, part B): state the earlier part left out. Watermark
GC undone by a rollback, nested and dictionary columns in state that spills, weights that would
wrap inside spine merges, the error stream as a circuit stream, per-input policies at run time."""
from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pytest

from dbsp import RowError, StreamContext, col, count, sum_
from dbsp.algebra.checked import WeightOverflowError
from dbsp.circuit.errors import node_policies
from dbsp.circuit.graph import Node
from dbsp.api import tumbling
from dbsp.storage.config import StorageConfig
from dbsp.trace.batch import OrdZSet, ZSet
from dbsp.trace.spine import Spine

SEC = dt.timedelta(seconds=1)
E = pa.schema([("ts", pa.timestamp("ms")), ("k", pa.string()), ("x", pa.int64())])


def ts(s: float) -> dt.datetime:
    return dt.datetime(2024, 1, 1) + dt.timedelta(seconds=s)


# -- a rollback undoes watermark GC ---------------------------------------------------------------

@pytest.mark.parametrize("keyed", [False, True])
def test_rollback_brings_back_rows_dropped_behind_the_watermark(workers, keyed):
    """A failed step that moved the watermark (closing windows, whose state the window operator
    truncates) is undone: the closed windows' rows are there again, so a row on time by the
    restored watermark updates its window exactly as in a run without the failed step."""
    runs = []
    for fail in (False, True):
        ctx = StreamContext(workers=workers)
        s = ctx.stream(E, name="ev", time="ts", lateness=10 * SEC)
        g = s.group_by("k") if keyed else s
        w = g.window(tumbling(10 * SEC)).agg(n=count(), total=sum_("x")).collect()
        bad = s.select(y=col("x") * 2 ** 62).collect()   # built after the window: fails later
        s.insert([(ts(1), "a", 1), (ts(3), "a", 1), (ts(12), "b", 1)])
        ctx.step()
        if fail:
            s.insert([(ts(31), "a", 1), (ts(35), "b", 2)])  # watermark 25 closes [0, 10), [10, 20)
            with pytest.raises(RowError, match="overflow"):
                ctx.step()
            assert s.watermark == ts(2)
        s.insert([(ts(5), "a", 1)])          # on time by the watermark 2 the rollback restored
        ctx.step()
        s.insert([(ts(14), "b", 1)])
        ctx.step()
        runs.append((w.view_dict(), w.delta_dict(), bad.view_dict(), s.watermark))
        ctx.close()
    assert runs[0] == runs[1]
    view = runs[1][0]
    if keyed:
        assert view == {("a", ts(0), ts(10), 3, 3): 1, ("b", ts(10), ts(20), 2, 2): 1}
    else:
        assert view == {(ts(0), ts(10), 3, 3): 1, (ts(10), ts(20), 2, 2): 1}


# -- nested and dictionary columns in state that spills -------------------------------------------

NESTED = pa.schema([("k", pa.int64()), ("l", pa.list_(pa.int64())),
                    ("s", pa.struct([("a", pa.int32()), ("b", pa.string())])),
                    ("m", pa.map_(pa.string(), pa.int64())),
                    ("d", pa.dictionary(pa.int32(), pa.string()))])


def _nested_rows(lo: int, hi: int) -> list:
    return [(j, [j, None] if j % 3 else None, {"a": j, "b": str(j)} if j % 5 else None,
             [("x", j)] if j % 2 else None, str(j % 7) if j % 11 else None)
            for j in range(lo, hi)]


def _nested_pipeline(ctx):
    s = ctx.stream(NESTED, name="n")
    t = ctx.stream({"k": pa.int64(), "w": pa.int64()}, name="t")
    outs = [s.distinct().collect(),
            s.join(t, on="k").collect(),
            s.group_by("k").agg(n=count()).collect()]
    return s, t, outs


def _spilled_layer_files(root):
    """Layer files under root; a background merge may delete one between listing and reading it."""
    found = []
    for p in root.rglob("*"):
        try:
            with open(p, "rb") as f:
                if f.read(4) == b"DBSB":
                    found.append(p)
        except (FileNotFoundError, IsADirectoryError):
            continue
    return found


@pytest.mark.parametrize("workers_", [1, 2])
def test_state_with_nested_columns_spills_and_reads_back(tmp_path, workers_):
    results = []
    for storage in (None, StorageConfig(str(tmp_path / "st"), memory_budget_bytes=1,
                                        min_file_rows=500, merge_process_rows=None)):
        ctx = StreamContext(workers=workers_, storage=storage)
        s, t, outs = _nested_pipeline(ctx)
        for i in range(4):
            s.insert(_nested_rows(i * 1500, (i + 1) * 1500))
            t.insert([(j, j * 2) for j in range(i * 1500, (i + 1) * 1500, 3)])
            ctx.step()
        s.delete(_nested_rows(0, 700))
        ctx.step()
        results.append([o.view_dict() for o in outs])
        if storage is not None:
            assert _spilled_layer_files(tmp_path / "st"), "nothing spilled"
        ctx.close()
    assert results[0] == results[1]
    assert len(results[1][0]) == 6000 - 700


# -- weights summed in spine merges and in the output view never wrap ------------------------------

def test_an_output_view_weight_out_of_int64_rolls_the_step_back(workers):
    ctx = StreamContext(workers=workers)
    s = ctx.stream({"k": pa.int64(), "v": pa.int64()}, name="s")
    out = s.collect()
    s.push([(1, 1)], weights=[2 ** 62])
    ctx.step()
    s.push([(1, 1), (2, 2)], weights=[2 ** 62, 1])
    with pytest.raises(OverflowError, match=r"row {k=1, v=1} in the view of output .output0. is out of the int64"):
        ctx.step()
    assert out.view_dict() == {(1, 1): 2 ** 62}    # not -2**63: the step was rolled back
    s.push([(1, 1), (2, 2)], weights=[-(2 ** 62), 1])
    ctx.step()                                     # and the circuit keeps stepping
    assert out.view_dict() == {(2, 2): 1}
    ctx.close()


def test_a_trace_weight_out_of_int64_is_an_error_never_a_wrap():
    """An integral whose state sums past int64 over several steps: the merge that would wrap
    does not run (the state stays exact, in separate batches); a read of it in a step raises
    WeightOverflowError naming the row, and the step is rolled back."""
    sch = pa.schema([("k", pa.int64())])

    def b(k, w):
        data = pa.RecordBatch.from_arrays([pa.array([k], pa.int64())], schema=sch)
        return OrdZSet.from_loose(ZSet(data, np.array([w], np.int64)))

    for background in (False, True):
        sp = Spine(name="t", fanout=2, background=background)
        sp.insert(b(7, 2 ** 62))
        sp.insert(b(7, 2 ** 62))               # the merge of these two would wrap
        sp.wait_merges()                       # no SpineMergeError: the spine is not broken
        assert sp.num_batches == 2
        with pytest.raises(WeightOverflowError, match=r"row \{k=7\}"):
            sp.consolidated()
        sp.insert(b(7, -(2 ** 62)))            # what a rollback does: the merges run again
        sp.wait_merges()
        assert sp.consolidated().to_dict() == {(7,): 2 ** 62}
        sp.close()


# -- the error stream and the bounded log ----------------------------------------------------------

def test_errors_are_a_stream_of_the_circuit(workers):
    ctx = StreamContext(workers=workers, errors="skip_and_report")
    s = ctx.stream({"k": pa.int64(), "v": pa.int64()}, name="orders")
    good = s.select("k", q=col("v") * 2 ** 62).collect()
    es = ctx.error_stream()
    assert es.schema.names == ["step", "source", "reason", "expression", "row", "weight"]
    errs = es.collect()
    per_source = es.group_by("source").agg(n=count()).collect()
    seen = []
    es.for_each(lambda d: seen.append(d.num_rows))
    s.insert([(1, 1), (2, "x"), (3, 5)])   # "x" refused at push; 3 * 2**62 overflows at run time
    ctx.step()
    rows = errs.view().to_pylist()
    assert [(r["step"], r["source"]) for r in rows] == [(0, "orders")]   # push time: this step
    ctx.step()                                                          # run time: the next one
    rows = sorted(errs.view().to_pylist(), key=lambda r: r["source"])
    assert [(r["step"], r["source"]) for r in rows] == [(0, "map"), (0, "orders")]
    assert json.loads(rows[0]["row"]) == {"k": 3, "v": 5} and "overflow" in rows[0]["reason"]
    assert json.loads(rows[1]["row"]) == [2, "x"] and rows[0]["weight"] == 1
    assert per_source.view_dict() == {("map", 1): 1, ("orders", 1): 1}
    assert good.view_dict() == {(1, 2 ** 62): 1}
    assert len(ctx.errors) == 2 and ctx.report()["errors"]["stream_missed"] == 0
    assert seen == [1, 1]                   # sunk like any output: one row in each step
    ctx.close()


def test_the_error_log_is_bounded_and_counts_what_it_dropped():
    ctx = StreamContext(errors="skip_and_report", error_cap=10)
    s = ctx.stream({"k": pa.int64(), "v": pa.int64()}, name="s")
    es = ctx.error_stream().collect()
    for i in range(5):
        s.insert([(j, "bad") for j in range(i * 7, i * 7 + 7)] + [(i, i)])
        ctx.step()
    log = ctx.errors
    assert len(log) == 35 and len(log.records) <= 10 + 10 // 8
    rep = ctx.report()["errors"]
    assert rep["rows"] == 35 and rep["kept"] == len(log.records)
    assert rep["dropped"] == 35 - rep["kept"] and rep["by_source"] == {"s": 35}
    assert len(log.since(0)) == len(log.records) and log.missed(0) == rep["dropped"]
    assert [r["row"][0] for r in log.since(33)] == [33, 34]
    # each step's records were fed before the cap could drop them: the stream has them all
    assert sum(es.view_dict().values()) == 35 and rep["stream_missed"] == 0
    ctx.close()
    with pytest.raises(ValueError, match="cap"):
        StreamContext(error_cap=-1)


def test_the_error_stream_refeeds_after_a_rolled_back_step():
    """A step that fails (here a view weight out of int64) is rolled back with its input, the
    error rows fed to the error stream included: they enter again with the next step."""
    ctx = StreamContext(errors="skip_and_report")
    s = ctx.stream({"k": pa.int64(), "v": pa.int64()}, name="s")
    t = ctx.stream({"k": pa.int64()}, name="t")
    t.collect()
    es = ctx.error_stream().collect()
    s.insert([(1, "bad")])
    t.push([(1,)], weights=[2 ** 62])
    ctx.step()
    t.push([(1,)], weights=[2 ** 62])
    s.insert([(2, "bad")])
    with pytest.raises(WeightOverflowError):
        ctx.step()
    assert sum(es.view_dict().values()) == 1
    ctx.step()
    assert sorted(r["row"] for r in es.view().to_pylist()) == ['[1, "bad"]', '[2, "bad"]']
    ctx.close()


# -- run-time errors follow the policy of the input the rows came from ---------------------------

@pytest.mark.parametrize("pipeline", ["raise", "skip_and_report"])
def test_run_time_errors_follow_the_policy_of_their_input(workers, pipeline):
    ctx = StreamContext(workers=workers, errors=pipeline)
    a = ctx.stream({"k": pa.int64(), "v": pa.int64()}, name="a", errors="skip_and_report")
    b = ctx.stream({"k": pa.int64(), "w": pa.int64()}, name="b", errors="raise")
    qa = a.select("k", q=col("v") * 2 ** 62).collect()      # a's rows: skipped
    qb = b.select("k", q=col("w") * 2 ** 62).collect()      # b's rows: raise
    j = a.join(b, on="k").select("k", q=col("v") * col("w") * 2 ** 61).collect()  # stricter: raise
    a.insert([(1, 1), (2, 5)])
    ctx.step()
    assert qa.view_dict() == {(1, 2 ** 62): 1}
    [rec] = ctx.errors.records
    assert rec["source"] == "map" and rec["row"] == {"k": 2, "v": 5}
    b.insert([(3, 9)])
    with pytest.raises(RowError, match=r"row \{k=3, w=9\}"):
        ctx.step()
    assert qb.view_dict() == {}
    b.insert([(1, 1)])
    ctx.step()
    assert j.view_dict() == {(1, 2 ** 61): 1}
    b.insert([(2, 1)])                # joined with a's (2, 5): 5 * 2**61 overflows: raise
    with pytest.raises(RowError, match=r"row \{k=2, v=5, w=1\}"):
        ctx.step()
    assert j.view_dict() == {(1, 2 ** 61): 1} and len(ctx.errors) == 1
    ctx.close()


def test_node_policies_take_the_strictest_upstream_input():
    n = [Node(0, "a", None, [], None, kind="input"), Node(1, "b", None, [], None, kind="input"),
         Node(2, "map", None, [0], None), Node(3, "join", None, [2, 1], None),
         Node(4, "z", None, [5], None, strict=True), Node(5, "plus", None, [3, 4], None),
         Node(6, "const", None, [], None)]
    got = node_policies(n, {0: "skip_and_report", 1: "raise"}, "skip_and_report")
    assert got == {0: "skip_and_report", 1: "raise", 2: "skip_and_report", 3: "raise",
                   4: "raise", 5: "raise", 6: "skip_and_report"}
