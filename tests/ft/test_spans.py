"""Inputs logged by position (dbsp.ft.logs: Span, Rereadable, content_crc): a re-readable source's
rows are recorded in the input log as a range, a row count and a checksum, and recovery reads them
again - checked against a naive model of the views; a source that changed under the log is an
error naming the input; the checksum does not depend on chunking, slicing or what lies under
nulls."""
from __future__ import annotations

import glob
import os
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from dbsp.api import StreamContext
from dbsp.api.expr.aggregates import count, sum_
from dbsp.ft import RecoveryError, Span, content_crc
from dbsp.ft.logs import InputLog, rows_crc
from dbsp.testing import reference as ref

SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.int64())])


def rows_of(lo: int, hi: int) -> pa.Table:
    """The source: row ``i`` is a pure function of ``i`` (a deterministic generator)."""
    i = np.arange(lo, hi, dtype=np.int64)
    return pa.table({"k": i % 5, "s": pa.array([f"r{j}" * (j % 3) for j in range(lo, hi)]),
                     "v": (i * 37) % 101}, schema=SCHEMA)


def crash(ctx):
    """The process vanishes without close (the lock dropped as by the kernel)."""
    ctx.durable.wait_checkpoint()
    ctx.durable.input_log.wait()
    ctx.circuit._lock.release()


def make(d, reread=rows_of, every=3):
    ctx = StreamContext(storage=d, checkpoint_every=every)
    s = ctx.stream(SCHEMA, name="src", reread=reread)
    agg = s.group_by("k").agg(n=count(), t=sum_("v")).collect(name="agg")
    raw = s.collect(name="raw")
    return ctx, s, agg, raw


def model(n: int) -> tuple[dict, dict]:
    t = rows_of(0, n).to_pylist()
    raw = Counter((r["k"], r["s"], r["v"]) for r in t)
    agg: dict = {}
    for r in t:
        c, s = agg.get(r["k"], (0, 0))
        agg[r["k"]] = (c + 1, s + r["v"])
    return dict(raw), {(k, c, s): 1 for k, (c, s) in agg.items()}


def records(d):
    log = InputLog(os.path.join(d, "ft", "input"))
    return [log.read(s)[0] for s in range(log.first, log.end)]


def test_spans_are_logged_as_positions_and_recovered(tmp_path):
    d = str(tmp_path)
    ctx, s, agg, raw = make(d, every=4)
    bounds = [0, 7, 7, 30, 31, 60]  # an empty step too
    for lo, hi in zip(bounds, bounds[1:]):
        if hi > lo:
            s.push(rows_of(lo, hi), span=(lo, hi))
        ctx.step()
    recs = records(d)
    spans = [p["src"] for p in recs if "src" in p]
    assert spans and all(isinstance(p, Span) for p in spans)
    assert max(os.path.getsize(p) for p in glob.glob(os.path.join(d, "ft", "input", "*.log"))) \
        < 600  # positions, not rows
    crash(ctx)
    ctx2, s2, agg2, raw2 = make(d, every=4)
    ctx2.open()
    assert ctx2.durable.replayed >= 1  # steps after the checkpoint were read again
    want_raw, want_agg = model(60)
    assert raw2.view_dict() == want_raw and agg2.view_dict() == want_agg
    s2.push(rows_of(60, 70), span=(60, 70))
    ctx2.step()
    assert raw2.view_dict() == model(70)[0]
    ctx2.close()


def test_a_source_that_changed_under_the_log_is_an_error_naming_the_input(tmp_path):
    d = str(tmp_path)
    ctx, s, _, _ = make(d, every=100)
    s.push(rows_of(0, 10), span=(0, 10))
    ctx.step()
    crash(ctx)

    def changed(lo, hi):  # same row count, one value different
        t = rows_of(lo, hi)
        return t.set_column(2, "v", pa.array([x + (i == 3) for i, x in
                                              enumerate(t.column("v").to_pylist())]))

    ctx2, *_ = make(d, reread=changed, every=100)
    with pytest.raises(RecoveryError, match=r"input 'src', step 0: positions \[0, 10\).*changed"):
        ctx2.open()
    ctx2.circuit._lock.release()
    ctx3, *_ = make(d, reread=lambda lo, hi: rows_of(lo, hi - 1), every=100)
    with pytest.raises(RecoveryError, match=r"input 'src'.*9 rows, the input log recorded 10"):
        ctx3.open()
    ctx3.circuit._lock.release()
    ctx4 = StreamContext(storage=d, checkpoint_every=100)  # no source given at all
    raw = ctx4.stream(SCHEMA, name="src")
    raw.group_by("k").agg(n=count(), t=sum_("v")).collect(name="agg")
    raw.collect(name="raw")
    with pytest.raises(RecoveryError, match="input 'src'.*no re-readable source"):
        ctx4.open()


def test_rows_pushed_beside_a_span_are_logged_as_data(tmp_path):
    d = str(tmp_path)
    ctx, s, agg, raw = make(d, every=100)
    s.push(rows_of(0, 5), span=(0, 5))
    s.push(rows_of(5, 8), span=(5, 8))     # joins up: one span (0, 8)
    ctx.step()
    s.push(rows_of(8, 10), span=(8, 10))
    s.insert(rows_of(100, 102))           # not from the source
    ctx.step()
    s.push(rows_of(10, 12), span=(10, 12))
    s.push(rows_of(20, 22), span=(20, 22))  # a gap: not one span
    ctx.step()
    r0, r1, r2 = records(d)
    assert r0["src"] == Span(0, 8, 8, r0["src"].crc)
    assert isinstance(r1["src"], tuple) and isinstance(r2["src"], tuple)
    view = raw.view_dict()
    crash(ctx)
    ctx2, s2, agg2, raw2 = make(d, every=100)
    ctx2.open()
    assert ctx2.durable.replayed == 3 and raw2.view_dict() == view
    ctx2.close()


def test_a_replayed_table_is_logged_by_row_offset(tmp_path):
    d = str(tmp_path)
    data = rows_of(0, 50)

    def build():
        ctx = StreamContext(storage=d, checkpoint_every=100, batching=7)
        raw = ctx.stream(data, name="t").collect(name="raw")
        return ctx, raw
    ctx, raw = build()
    for _ in range(4):
        ctx.step()
    assert all(isinstance(p["t"], Span) for p in records(d))
    crash(ctx)
    ctx, raw = build()
    ctx.execute()
    assert raw.view_dict() == model(50)[0]
    ctx.close()


def test_push_span_needs_a_rereadable_stream(tmp_path):
    ctx = StreamContext(storage=str(tmp_path), checkpoint_every=2)
    s = ctx.stream(SCHEMA, name="src")
    with pytest.raises(ValueError, match="src.*reread="):
        s.push(rows_of(0, 2), span=(0, 2))
    with pytest.raises(TypeError, match="reread="):
        ctx.stream(SCHEMA, name="x", reread=42)
    ctx.close()


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=8), every=st.integers(1, 4),
       crash_at=st.integers(0, 8), extra=st.lists(st.booleans(), min_size=8, max_size=8))
def test_recovery_with_spans_matches_the_model(tmp_path_factory, sizes, every, crash_at, extra):
    """Steps of spans (some with hand-pushed rows beside them), a crash after ``crash_at``
    steps, recovery, the rest of the steps: the views equal the reference model's
    (:mod:`dbsp.testing.reference`) at every step."""
    d = str(tmp_path_factory.mktemp("spans"))
    ctx, s, agg, raw = make(d, every=every)
    lo = 0
    deltas = []
    for i, n in enumerate(sizes):
        if i == crash_at:
            crash(ctx)
            ctx, s, agg, raw = make(d, every=every)
            ctx.open()
        delta = Counter()
        if n:
            s.push(rows_of(lo, lo + n), span=(lo, lo + n))
            delta.update((r["k"], r["s"], r["v"]) for r in rows_of(lo, lo + n).to_pylist())
        if extra[i]:
            s.insert([(99, "x", i)])
            delta[(99, "x", i)] += 1
        deltas.append(ref.zset(delta))
        lo += n
        ctx.step()
        want = ref.integrate(deltas)
        assert raw.view_dict() == want
        assert agg.view_dict() == ref.aggregate(want, [0], [("count", None), ("sum", 1)])
    ctx.close()


def _split(t: pa.Table, cuts: list[int]) -> pa.Table:
    pts = sorted({0, t.num_rows, *[c % (t.num_rows + 1) for c in cuts]})
    return pa.Table.from_batches([b for a, z in zip(pts, pts[1:])
                                  for b in t.slice(a, z - a).to_batches()], schema=t.schema)


@settings(max_examples=60, deadline=None)
@given(vals=st.lists(st.tuples(st.one_of(st.none(), st.integers(-2**40, 2**40)),
                               st.one_of(st.none(), st.text(max_size=6)),
                               st.one_of(st.none(), st.booleans())), max_size=40),
       cuts=st.lists(st.integers(0, 60), max_size=5), off=st.integers(0, 5))
def test_content_crc_does_not_depend_on_chunks_or_slices(vals, cuts, off):
    pad = [(1, "pad", True)] * off
    rows = pad + vals
    t = pa.table({"a": pa.array([r[0] for r in rows], pa.int64()),
                  "s": pa.array([r[1] for r in rows], pa.string()),
                  "b": pa.array([r[2] for r in rows], pa.bool_())}).slice(off)
    base = content_crc(t.combine_chunks())
    assert content_crc(_split(t, cuts)) == base
    assert content_crc(pa.Table.from_pylist(t.to_pylist(), schema=t.schema)) == base
    if vals:
        other = [list(r) for r in vals]
        other[-1][0] = 7 if other[-1][0] != 7 else 8
        t2 = pa.table({"a": pa.array([r[0] for r in other], pa.int64()),
                       "s": pa.array([r[1] for r in other], pa.string()),
                       "b": pa.array([r[2] for r in other], pa.bool_())})
        assert content_crc(t2) != base


def test_content_crc_ignores_what_lies_under_nulls():
    validity = pa.py_buffer(np.packbits(np.array([1, 0, 1], np.uint8), bitorder="little"))
    a = pa.Array.from_buffers(pa.int64(), 3, [validity, pa.py_buffer(np.array([1, 5, 3]))])
    b = pa.Array.from_buffers(pa.int64(), 3, [validity, pa.py_buffer(np.array([1, 9, 3]))])
    assert a.to_pylist() == b.to_pylist()
    assert content_crc(pa.record_batch([a], ["x"])) == content_crc(pa.record_batch([b], ["x"]))
    c = pa.array([1, 0, 3], pa.int64())  # a zero where the null was: different content
    assert content_crc(pa.record_batch([a], ["x"])) != content_crc(pa.record_batch([c], ["x"]))
    w = np.ones(3, np.int64)
    assert rows_crc(pa.record_batch([a], ["x"]), w) != rows_crc(pa.record_batch([a], ["x"]), -w)
