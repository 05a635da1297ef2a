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


@pytest.mark.parametrize("runtime,workers", [("threads", 1), ("threads", 2), ("processes", 2)])
def test_a_view_folds_on_a_thread_of_its_own_and_loses_nothing(monkeypatch, runtime, workers):
    """Past the bound the unread deltas are folded beside the next steps (the step that reached
    it does not wait for the sort); the view, read now and then, is the reference's at every
    read, and a checkpoint of the handle waits for the fold."""
    monkeypatch.setattr(OutputHandle, "MAX_PENDING_STEPS", 3)
    ctx = StreamContext(workers=workers, runtime=runtime)
    s = ctx.stream(KV)
    out = s.group_by("k").agg(n=count(), t=sum_("v")).collect()
    h = out.handle
    rng = np.random.default_rng(11)
    ref: dict = {}
    folds = set()
    for step in range(20):
        k = rng.integers(0, 500, 300)
        v = rng.integers(-9, 9, 300)
        s.insert(pa.table({"k": k, "v": v}))
        for kk, vv in zip(k.tolist(), v.tolist()):
            n, t = ref.get(kk, (0, 0))
            ref[kk] = (n + 1, t + vv)
        ctx.step()
        f = h._folding
        if f is not None:
            folds.add(id(f))
            assert f.thread.name.startswith("dbsp-fold-") and f.parts
        # a fold started at the bound took the deltas with it: under 3 steps' parts wait
        assert len(h._view_pending) < 3 * workers
        if step % 7 == 6:
            assert out.view_dict() == {(kk, n, t): 1 for kk, (n, t) in ref.items()}
            assert h._folding is None
    assert len(folds) >= 4  # distinct folds (a read in between joins the one in flight)
    state = h.checkpoint_state()  # folds (and waits for) everything unread
    assert h._folding is None and h._view_pending == []
    assert sum(len(b) for b in state["_view"].batches) >= len(ref)
    assert out.view_dict() == {(kk, n, t): 1 for kk, (n, t) in ref.items()}
    ctx.close()


def test_a_failed_background_fold_hands_its_deltas_back(monkeypatch):
    """A fold that fails on its thread loses nothing: its deltas go back to the unread ones
    and the next reader folds them in its own thread (where an error would be raised)."""
    from dbsp.operators import output as O
    monkeypatch.setattr(OutputHandle, "MAX_PENDING_STEPS", 2)
    real = O._consolidate_parts
    failed = []

    def flaky(*a, **k):  # the first call on a fold's thread fails
        if not failed and O.threading.current_thread().name.startswith("dbsp-fold-"):
            failed.append(True)
            raise MemoryError("the fold's thread ran out of memory")
        return real(*a, **k)

    monkeypatch.setattr(O, "_consolidate_parts", flaky)
    ctx = StreamContext()
    s = ctx.stream(KV)
    out = s.filter(col("v") >= 0).collect()
    for i in range(2):
        s.insert([(i, i)])
        ctx.step()
    h = out.handle
    assert h._folding is not None
    h._folding.thread.join()
    assert isinstance(h._folding.error, MemoryError)
    assert out.view_dict() == {(0, 0): 1, (1, 1): 1}
    assert h._folding is None and h._view_pending == []
    ctx.close()
