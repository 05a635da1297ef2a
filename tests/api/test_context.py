"""StreamContext: sources of every kind, batching modes, execute/step, reports, input errors."""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import dbsp
from dbsp.api import AdaptiveBatching, FixedBatching, StreamContext, col, count, no_batching, \
    sum_
from dbsp.algebra.schema import InputError
from dbsp.api.source import ReplaySource

T = pa.table({"k": [1, 2, 1, 3, 2, 1, 4], "x": [10, 20, 30, 40, 50, 60, 70]})


def _sizes(ctx, stream):
    sizes = []
    stream.for_each(lambda d: sizes.append(sum(d.column("__weight").to_pylist())),
                    skip_empty=False)
    return sizes


def _total(c):
    return sorted(c.rows())


@pytest.mark.parametrize("kind", ["table", "batches", "iterator", "pandas", "record_batch"])
def test_sources_of_every_kind(workers, kind):
    data = {"table": T, "batches": T.to_batches(max_chunksize=3),
            "iterator": iter(T.to_batches(max_chunksize=2)), "pandas": T.to_pandas(),
            "record_batch": T.to_batches()[0]}[kind]
    with StreamContext(workers=workers) as ctx:
        s = ctx.stream(data, name="t")
        out = s.group_by("k").agg(s=sum_("x")).collect()
        ctx.execute()
        assert out.rows() == [(1, 100), (2, 70), (3, 40), (4, 70)]
        assert ctx.report()["inputs"]["t"]["rows"] == 7


def test_fixed_batching_rows_per_step(workers):
    with StreamContext(workers=workers, batching=FixedBatching(3)) as ctx:
        s = ctx.stream(T.to_batches(max_chunksize=2))
        sizes = _sizes(ctx, s)
        c = s.collect()
        ctx.execute()
        assert sizes == [3, 3, 1]
        assert ctx.steps == 3
        assert len(c) == 7


def test_no_batching_is_one_row_per_step():
    with StreamContext(batching=no_batching()) as ctx:
        s = ctx.stream(T)
        sizes = _sizes(ctx, s)
        ctx.execute()
        assert sizes == [1] * 7


def test_adaptive_batching_in_memory_takes_max_rows(monkeypatch):
    def wait(self, want, deadline):
        raise AssertionError("a source in memory waited for rows")
    # the only place a source waits for its delay is the queue of a background reader
    monkeypatch.setattr(ReplaySource, "_take_queue", wait)
    with StreamContext(batching=AdaptiveBatching(max_rows=4, max_delay=10)) as ctx:
        s = ctx.stream(T, name="t")
        sizes = _sizes(ctx, s)
        ctx.execute()
        assert sizes == [4, 3]
        src = ctx.sources["t"]
        assert src._q is None and src._thread is None  # rows in memory: no reader, no wait


def test_adaptive_batching_over_a_slow_iterator_bounds_the_delay():
    def slow():
        for i in range(6):
            time.sleep(0.03)
            yield pa.record_batch({"x": [i, i]})
    with StreamContext(batching=AdaptiveBatching(max_rows=1000, max_delay=0.001)) as ctx:
        s = ctx.stream(slow(), schema=pa.schema([("x", pa.int64())]))
        sizes = _sizes(ctx, s)
        c = s.collect()
        ctx.execute()
        assert sum(sizes) == 12 and len(c) == 12
        assert len(sizes) > 1  # the delay cut steps short: not everything in one step
        assert max(sizes) < 12


def test_adaptive_batching_max_rows_over_an_iterator():
    batches = [pa.record_batch({"x": list(range(i * 5, i * 5 + 5))}) for i in range(4)]
    with StreamContext(batching=AdaptiveBatching(max_rows=7, max_delay=5)) as ctx:
        s = ctx.stream(iter(batches))
        sizes = _sizes(ctx, s)
        ctx.execute()
        assert sizes == [7, 7, 6]


def test_per_stream_batching_and_two_sources_step_together(workers):
    with StreamContext(workers=workers) as ctx:
        a = ctx.stream(T, name="a", batching=2)
        b = ctx.stream(T, name="b", batching=FixedBatching(5))
        sa, sb = _sizes(ctx, a), _sizes(ctx, b)
        ctx.execute()
        assert sa == [2, 2, 2, 1] and sb == [5, 2, 0, 0]


def test_push_source_and_execute_runs_once():
    with StreamContext() as ctx:
        s = ctx.stream(pa.schema([("k", pa.int64()), ("x", pa.int64())]), name="push")
        out = s.group_by("k").agg(n=count()).collect()
        assert s.insert([(1, 5), (1, 6)]) == 2
        ctx.execute()
        assert ctx.steps == 1 and out.rows() == [(1, 2)]
        s.push([(1, 5)], weights=[-1])
        ctx.step()
        assert out.rows() == [(1, 1)]
        assert ctx.report()["inputs"]["push"]["rows"] == 3


def test_upsert_by_key(workers):
    with StreamContext(workers=workers) as ctx:
        s = ctx.stream(pa.schema([("id", pa.int64()), ("v", pa.string())]), name="kv", key="id")
        c = s.collect()
        s.upsert([(1, "a"), (2, "b")])
        ctx.step()
        s.upsert([(1, "z")])
        ctx.step()
        assert c.rows() == [(1, "z"), (2, "b")]
        assert c.delta_dict() == {(1, "a"): -1, (1, "z"): 1}


def test_schema_forms():
    with StreamContext() as ctx:
        a = ctx.stream({"x": pa.int64()})
        b = ctx.stream([("x", pa.int64()), ("y", pa.string())])
        c = ctx.stream(schema=pa.schema([("z", pa.float64())]))
        assert a.columns == ["x"] and b.columns == ["x", "y"] and c.columns == ["z"]


def test_bad_input_names_the_input_column_and_row():
    bad = pa.table({"k": ["1", "2", "x"]})
    with StreamContext() as ctx:
        s = ctx.stream(pa.schema([("k", pa.int64())]), name="nums")
        with pytest.raises(InputError) as ei:
            s.insert([(1,), ("two",)])
        assert "nums" in str(ei.value) and "'k'" in str(ei.value) and "row 1" in str(ei.value)
        r = ctx.stream(bad, name="replayed", schema=pa.schema([("k", pa.int64())]))
        with pytest.raises(InputError, match="replayed.*row 2"):
            ctx.execute()
        _ = r


def test_pipeline_cannot_grow_while_running():
    with StreamContext() as ctx:
        s = ctx.stream(T)
        s.collect()
        ctx.step()
        with pytest.raises(RuntimeError):
            ctx.stream(T, name="late")
        with pytest.raises(RuntimeError):
            s.select("k").collect()


def test_duplicate_names_and_bad_sources():
    with StreamContext() as ctx:
        ctx.stream(T, name="t")
        with pytest.raises(ValueError, match="exists"):
            ctx.stream(T, name="t")
        with pytest.raises(TypeError):
            ctx.stream(42)
        with pytest.raises(TypeError, match="schema="):
            ctx.stream(iter([]))
        with pytest.raises(TypeError, match="time="):
            ctx.stream(T, name="u", lateness=3)


def test_storage_directory_is_created(tmp_path):
    d = tmp_path / "state"
    with StreamContext(storage=d) as ctx:
        assert ctx.storage == str(d) and d.is_dir()


def test_report_and_state_rows(workers):
    with StreamContext(workers=workers) as ctx:
        s = ctx.stream(T, name="t")
        s.group_by("k").agg(n=count()).collect()
        ctx.execute()
        rep = ctx.report()
        assert rep["steps"] == 1 and rep["workers"] == workers
        assert rep["inputs"]["t"] == {"rows": 7, "late_rows": 0, "watermark": None, "bad_rows": 0}
        assert rep["state_rows"] == ctx.state_rows() > 0


def test_processes_runtime():
    with StreamContext(workers=2, runtime="processes") as ctx:
        s = ctx.stream(pa.schema([("ts", pa.int64()), ("k", pa.int64())]), name="e", time="ts",
                       lateness=0)
        out = s.group_by("k").agg(n=count()).collect()
        s.insert([(10, 1), (11, 2), (12, 1)])
        ctx.step()
        s.insert([(5, 1), (13, 2)])
        ctx.step()
        assert out.rows() == [(1, 2), (2, 2)]
        assert s.late_rows == 1 and s.watermark == 13


def test_public_names():
    for n in ("StreamContext", "col", "lit", "when"):
        assert hasattr(dbsp, n)
    _ = (np, pd, col)
