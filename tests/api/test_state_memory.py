"""Bytes of state per operator (``ctx.memory()``, ``ctx.report()["memory"]``) and the bound on
the unread deltas an output keeps."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import dbsp
from dbsp.api import StreamContext, col, count, sum_
from dbsp.operators.output import OutputHandle
from dbsp.storage.config import StorageConfig

KV = {"k": pa.int64(), "v": pa.int64()}


@pytest.mark.parametrize("runtime", ["threads", "processes"])
def test_memory_per_operator_beside_arrow_size(runtime):
    ctx = StreamContext(workers=2, runtime=runtime)
    s = ctx.stream(KV)
    d = ctx.stream({"k": pa.int64(), "y": pa.int64()})
    s.join(d, on="k").collect(view=False)
    g = s.group_by("k").agg(n=count(), t=sum_("v")).collect()
    n = 20_000
    s.insert(pa.table({"k": np.arange(n) % 100, "v": np.arange(n)}))
    d.insert(pa.table({"k": np.arange(100), "y": np.arange(100)}))
    ctx.step()
    mem = ctx.memory()
    assert mem == ctx.report()["memory"]
    by = {m["name"]: m for m in mem}
    join = [m for m in mem if m["name"].startswith("join")]
    assert len(join) == 1
    jm = join[0]
    assert jm["rows"] == n + 100 and jm["memory_rows"] == n + 100  # both sides, all workers
    # the rows as a flat Arrow batch: 2 int64 columns on each side
    assert jm["arrow_bytes"] == 16 * (n + 100)
    assert jm["arrow_bytes_per_row"] == 16.0
    # codes and weights come on top of the Arrow size, and not much more
    assert 16 < jm["bytes_per_row"] < 64, jm
    assert jm["file_bytes"] == 0 and jm["resident_bytes"] == 0
    view = by["view:" + g.handle.name]
    assert view["rows"] == 100 and view["arrow_bytes"] == 100 * 24
    assert all(m["batches"] > 0 for m in mem)
    ctx.close()
    assert ctx.report()["memory"] == []


def test_memory_counts_spilled_state_on_disk(tmp_path):
    cfg = StorageConfig(str(tmp_path), memory_budget_bytes=256 << 10, backend="pread",
                        block_size=4096, min_file_rows=1, min_free_bytes=0)
    c = dbsp.Circuit(storage=cfg)
    t = c.add_input("t", [("x", pa.int64())])
    t.distinct().output(view=False)
    for i in range(4):
        t.push(pa.record_batch([pa.array(np.arange(i * 50_000, (i + 1) * 50_000))],
                               names=["x"]))
        c.step()
    m = [m for m in c.memory() if m["name"].startswith("distinct")][0]
    c.close()
    assert m["rows"] == 200_000
    assert m["file_bytes"] > 0 and m["memory_rows"] < m["rows"]
    assert m["resident_bytes"] > 0


def test_collect_folds_unread_deltas_into_the_view(monkeypatch):
    monkeypatch.setattr(OutputHandle, "MAX_PENDING_STEPS", 4)
    ctx = StreamContext()
    s = ctx.stream(KV)
    out = s.filter(col("v") >= 0).collect()
    h = out.handle
    for i in range(10):
        s.insert([(i, i)])
        if i:
            s.delete([(i - 1, i - 1)])
        ctx.step()
        assert len(h._view_pending) < 2 * 4  # at most 4 steps of (2) parts wait
    assert out.view_dict() == {(9, 9): 1}
    assert len(out.delta_dict()) == 2


def test_collect_folds_past_the_row_bound(monkeypatch):
    monkeypatch.setattr(OutputHandle, "MAX_PENDING_ROWS", 1_000)
    ctx = StreamContext()
    s = ctx.stream(KV)
    out = s.collect()
    s.insert(pa.table({"k": np.arange(1_500), "v": np.zeros(1_500, np.int64)}))
    ctx.step()
    assert out.handle._view_pending == []
    assert len(out.view()) == 1_500
