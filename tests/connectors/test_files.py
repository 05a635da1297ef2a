"""``dbsp.connectors.files.ParquetSink``: files written step by step read back as the Z-set
integrated from the changes (the reference: a dict of row -> summed weight)."""
from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dbsp
from dbsp.api import StreamContext, col
from dbsp.connectors.files import ParquetSink

SCHEMA = pa.schema([("k", pa.string()), ("x", pa.int64())])


def _change(rows):
    return pa.table({"k": [r[0] for r in rows], "x": [r[1] for r in rows],
                     dbsp.WEIGHT: pa.array([r[2] for r in rows], pa.int64())})


def _as_zset(table):
    return {(r["k"], r["x"]): r[dbsp.WEIGHT] for r in table.to_pylist()}


ROW = st.tuples(st.sampled_from(["a", "b", "c:d", "e f"]), st.integers(-3, 3),
                st.integers(-2, 2).filter(bool))


@settings(max_examples=30)
@given(steps=st.lists(st.lists(ROW, max_size=6), max_size=5), partitioned=st.booleans())
def test_read_back_is_the_integrated_changes(tmp_path_factory, steps, partitioned):
    d = tmp_path_factory.mktemp("pq")
    sink = ParquetSink(d, SCHEMA, ["k"] if partitioned else [])
    model: Counter = Counter()
    for rows in steps:
        sink.write(_change(rows))
        for k, x, w in rows:
            model[(k, x)] += w
    assert _as_zset(sink.read()) == {r: w for r, w in model.items() if w}
    raw = sink.read(consolidate=False)
    assert raw.num_rows == sum(len(r) for r in steps) == sink.rows_written
    assert sink.steps_written == len(steps)


def test_stream_write_parquet_partitions_and_keeps_retractions(tmp_path):
    ctx = StreamContext(workers=2)
    t = ctx.stream(SCHEMA, name="t")
    sink = t.filter(col("x") > 0).write_parquet(tmp_path / "out", partition_by=["k"])
    t.insert([("a", 1), ("b", 2), ("a", -1)])
    ctx.step()
    t.delete([("a", 1)])
    ctx.step()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["k=a", "k=b"]
    assert _as_zset(sink.read()) == {("b", 2): 1}
    raw = sorted((r["k"], r["x"], r[dbsp.WEIGHT]) for r in sink.read(consolidate=False).to_pylist())
    assert raw == [("a", 1, -1), ("a", 1, 1), ("b", 2, 1)]  # the retraction is a file of its own


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="partition columns"):
        ParquetSink(tmp_path / "a", SCHEMA, ["nope"])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "old.parquet").write_bytes(b"x")
    with pytest.raises(ValueError, match="not empty"):
        ParquetSink(tmp_path / "b", SCHEMA)
    sink = ParquetSink(tmp_path / "c", SCHEMA)
    with pytest.raises(ValueError, match="columns"):
        sink.write(pa.table({"k": ["a"], dbsp.WEIGHT: [1]}))
