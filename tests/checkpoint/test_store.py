"""The checkpoint store (dbsp.checkpoint.store): save / restore of every kind of operator state,
the catalog, clean-up at open, gc, fingerprint, corruption and fsync failure."""
from __future__ import annotations

import glob
import os

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from dbsp.checkpoint import CheckpointCorrupt, CheckpointError, CheckpointStore, CircuitMismatch
from dbsp.runtime.circuit import Circuit
from dbsp.storage import faults
from dbsp.testing import reference as ref

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
AGGS = {"n": ("count", None), "s": ("sum", "v"), "lo": ("min", "v"), "hi": ("max", "v")}


def build(d, workers=1, runtime="threads", extra=False):
    """A circuit with state in most operator kinds: integrate, a linear and a general aggregate,
    distinct, a join, differentiate (a delay), top-k and a keyed input."""
    c = Circuit(workers=workers, storage=d, runtime=runtime)
    t = c.add_input("t", SCHEMA)
    u = c.add_input("u", SCHEMA, key=["k"])
    outs = {
        "integ": t.integrate().output(name="integ"),
        "agg": t.index_by(["k"]).aggregate(AGGS).output(name="agg"),
        "distinct": t.map(lambda b: b.select(["k"]), pa.schema([("k", pa.int64())]))
                     .distinct().output(name="distinct"),
        "join": t.index_by(["k"]).join(u.index_by(["k"])).output(name="join"),
        "diff": t.integrate().differentiate().output(name="diff"),
        "topk": t.index_by(["k"]).topk(2, ["v"], descending=True).output(name="topk"),
    }
    if extra:
        outs["neg"] = t.neg().output(name="neg")
    return c, t, u, outs


def push(t, u, rows, urows):
    if rows:
        t.push(pa.table({"k": [r[0] for r in rows], "v": [r[1] for r in rows]}),
               [r[2] for r in rows])
    if urows:
        u.upsert(pa.table({"k": [r[0] for r in urows], "v": [r[1] for r in urows]}))


def views(outs):
    return {n: h.view_dict() for n, h in outs.items()}


def run(d, steps, workers=1, cut=None, runtime="threads"):
    """Run ``steps``; with ``cut``, checkpoint after step ``cut``, close, reopen, restore and go
    on in a fresh circuit. Returns the per-step deltas and the final views."""
    c, t, u, outs = build(d, workers, runtime)
    deltas = []
    store = None
    for i, (rows, urows) in enumerate(steps):
        if cut is not None and i == cut:
            store = store or CheckpointStore(d, c.fingerprint())
            store.checkpoint(c, c.steps)
            c.close()
            c, t, u, outs = build(d, workers, runtime)
            store = CheckpointStore(d, c.fingerprint())
            assert store.restore(c).step == cut
        push(t, u, rows, urows)
        c.step()
        deltas.append({n: h.to_dict() for n, h in outs.items()})
    v = views(outs)
    c.close()
    return deltas, v


rows_st = st.lists(st.tuples(st.integers(0, 6), st.integers(-5, 5), st.sampled_from([1, 1, -1])),
                   max_size=6)
urows_st = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3)), max_size=3,
                    unique_by=lambda r: r[0])
steps_st = st.lists(st.tuples(rows_st, urows_st), min_size=1, max_size=6)


@settings(max_examples=12, deadline=None)
@given(steps=steps_st, data=st.data())
def test_restore_continues_exactly(tmp_path_factory, steps, data):
    """A circuit checkpointed after any step, closed and restored in a fresh process-like
    circuit, produces the same deltas and views as one that never stopped; the integrated
    view also matches the reference model."""
    cut = data.draw(st.integers(0, len(steps)))
    workers = data.draw(st.sampled_from([1, 2]))
    a = str(tmp_path_factory.mktemp("a"))
    b = str(tmp_path_factory.mktemp("b"))
    d0, v0 = run(a, steps, workers)
    d1, v1 = run(b, steps, workers, cut=cut)
    assert d0 == d1
    assert v0 == v1
    want = ref.integrate([_zset(rows) for rows, _ in steps])
    assert d1[-1]["integ"] == want  # the integral's output is the integral itself


def _zset(rows):
    z: dict = {}
    for k, v, w in rows:
        z[(k, v)] = z.get((k, v), 0) + w
    return {r: w for r, w in z.items() if w}


def test_literal_restore(tmp_path):
    steps = [([(1, 5, 1), (1, 7, 1), (2, 3, 1)], [(1, 0)]),
             ([(1, 5, -1)], [(1, 1)]),
             ([(3, 9, 1)], [])]
    _, v = run(str(tmp_path), steps, cut=2)
    assert v["agg"] == {(1, 1, 7, 7, 7): 1, (2, 1, 3, 3, 3): 1, (3, 1, 9, 9, 9): 1}
    assert v["join"] == {(1, 7, 1): 1}
    assert v["topk"] == {(1, 7): 1, (2, 3): 1, (3, 9): 1}


def test_processes_runtime_restores(tmp_path):
    steps = [([(i, i, 1) for i in range(20)], [(1, 1)]), ([(3, 4, 1)], [(2, 2)]),
             ([(3, 4, -1)], [])]
    d0, v0 = run(str(tmp_path / "a"), steps, workers=2)
    d1, v1 = run(str(tmp_path / "b"), steps, workers=2, cut=2, runtime="processes")
    assert d0 == d1 and v0 == v1


def _steps(c, t, u, n, start=0):
    for i in range(start, start + n):
        push(t, u, [(i % 5, i, 1)], [(i % 3, i)])
        c.step()


def _checkpointed(d, n):
    """Build the circuit in ``d``, run ``n`` steps, take one checkpoint, close: its info."""
    c, t, u, _ = build(d)
    store = CheckpointStore(d, c.fingerprint())
    _steps(c, t, u, n)
    info = store.checkpoint(c, c.steps)
    c.close()
    return info


def test_gc_keeps_last_n_and_removes_unreferenced_files(tmp_path):
    d = str(tmp_path)
    c, t, u, outs = build(d)
    store = CheckpointStore(d, c.fingerprint(), keep=2)
    names = []
    for k in range(4):
        _steps(c, t, u, 3, 3 * k)
        names.append(store.checkpoint(c, c.steps).name)
    assert [x.name for x in store.checkpoints] == names[-2:]
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "ckpt-*"))) == \
        sorted(names[-2:])
    c.close()
    on_disk = {os.path.relpath(p, d) for p in glob.glob(os.path.join(d, "worker-*", "*.dbsp"))}
    # an orphan batch file, a temporary and an unnamed checkpoint directory, as a crash leaves
    open(os.path.join(d, "worker-0", "b-orphan.dbsp"), "wb").close()
    open(os.path.join(d, "worker-0", "b-x.dbsp.mut"), "wb").close()
    open(os.path.join(d, "checkpoints.json.mut"), "wb").close()
    os.makedirs(os.path.join(d, "ckpt-unpublished"))
    c2, *_ = build(d)
    store2 = CheckpointStore(d, c2.fingerprint())
    assert store2.removed_at_open >= 3  # (the worker storage removed the batch .mut)
    left = {os.path.relpath(p, d) for p in glob.glob(os.path.join(d, "worker-*", "*"))}
    assert left == store2.referenced() and left <= on_disk
    assert not glob.glob(os.path.join(d, "**", "*.mut"), recursive=True)
    assert store2.restore(c2, names[-2]).step == 9  # a named, older checkpoint
    c2.close()
    with pytest.raises(ValueError, match="keep"):
        CheckpointStore(d, "x", keep=1)


def test_fingerprint_mismatch_is_refused(tmp_path):
    d = str(tmp_path)
    _checkpointed(d, 2)
    c2, *_ = build(d, extra=True)
    with pytest.raises(CircuitMismatch, match="different circuit"):
        CheckpointStore(d, c2.fingerprint())
    c2.close()


def test_corrupted_state_file_is_detected(tmp_path):
    d = str(tmp_path)
    info = _checkpointed(d, 2)
    p = os.path.join(d, info.name, "worker-0.state")
    data = bytearray(open(p, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(p, "wb").write(bytes(data))
    c2, *_ = build(d)
    with pytest.raises(CheckpointCorrupt, match="checksum"):
        CheckpointStore(d, c2.fingerprint()).restore(c2)
    c2.close()


def test_missing_catalog_with_checkpoints_refuses_to_start(tmp_path):
    d = str(tmp_path)
    _checkpointed(d, 1)
    os.unlink(os.path.join(d, "checkpoints.json"))
    with pytest.raises(CheckpointCorrupt, match="catalog"):
        CheckpointStore(d, "anything")


@pytest.mark.parametrize("nth", range(1, 6))
def test_failed_fsync_fails_the_checkpoint_and_is_not_retried(tmp_path, nth):
    """The n-th fsync of a checkpoint fails: that checkpoint raises, the previous one stands and
    restores exactly, and the store takes no further checkpoint."""
    d = str(tmp_path)
    c, t, u, outs = build(d)
    store = CheckpointStore(d, c.fingerprint())
    _steps(c, t, u, 2)
    good = store.checkpoint(c, c.steps)
    want = views(outs)
    _steps(c, t, u, 2, 2)
    faults.fail_fsync_at(nth)
    try:
        with pytest.raises(CheckpointError):
            store.checkpoint(c, c.steps)
        with pytest.raises(CheckpointError, match="earlier checkpoint failed"):
            store.checkpoint(c, c.steps)
    finally:
        faults.fail_fsync_at(None)
    assert store.latest.name == good.name
    c.close()
    c2, t2, u2, outs2 = build(d)
    store2 = CheckpointStore(d, c2.fingerprint())
    assert store2.restore(c2).name == good.name
    assert views(outs2) == want
    c2.close()


def test_reopening_in_the_same_process_keeps_named_files(tmp_path):
    """A directory restored twice in one process: the second circuit's batch objects are
    pinned too, so when they are merged away and collected the files a checkpoint names stay."""
    import gc
    d = str(tmp_path)
    _checkpointed(d, 6)
    for _ in range(2):
        c, t, u, outs = build(d)
        store = CheckpointStore(d, c.fingerprint())
        store.restore(c)
        _steps(c, t, u, 8, 100)  # merges retire the restored batches
        c.close()
        del c, t, u, outs
        gc.collect()
        for f in store.referenced():
            assert os.path.exists(os.path.join(d, f)), f


def test_large_in_memory_batches_are_written_by_the_merge_helper(tmp_path):
    """A checkpoint writes an in-memory batch of at least merge_process_rows rows in the
    worker's merge helper process (off this process's GIL); the files restore exactly."""
    import numpy as np

    from dbsp.storage.config import StorageConfig
    from dbsp.trace.merge_helper import helpers_stats
    d = str(tmp_path)
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])

    def make():
        c = Circuit(storage=StorageConfig(d, merge_process_rows=1000))
        t = c.add_input("t", schema)
        out = t.index_by(["k"]).join(t.index_by(["k"])).output(name="j")
        return c, t, out
    c, t, out = make()
    k = np.arange(5000, dtype=np.int64)
    t.push(pa.record_batch([pa.array(k), pa.array(k * 3)], schema=schema))
    c.step()
    before = sum(h["jobs"] for h in helpers_stats())
    store = CheckpointStore(d, c.fingerprint())
    info = store.checkpoint(c, c.steps)
    assert sum(h["jobs"] for h in helpers_stats()) > before  # the helper wrote the batch
    assert info.bytes > 0
    c.close()
    c2, t2, _ = make()
    CheckpointStore(d, c2.fingerprint()).restore(c2)
    t2.push(pa.record_batch([pa.array([7]), pa.array([1])], schema=schema))
    c2.step()
    # the new row (7, 1) meets the restored (7, 21) on both sides, and itself: 3 rows
    got = {tuple(r.values()) for r in c2.outputs[0].delta().to_arrow().to_pylist()}
    assert len(got) == 3
    c2.close()


def test_a_store_opened_while_another_publishes_keeps_that_checkpoint(tmp_path):
    """A durable job's next generation opens a store on the root (whose clean-up removes
    unpublished checkpoints and unnamed batch files) while the last generation's writer
    publishes: the clean-up waits for the catalog write, then keeps what it names; a restore
    of the checkpoint finds every file."""
    import threading
    d = str(tmp_path)
    c, t, u, outs = build(d)
    _steps(c, t, u, 4)
    armed, other = threading.Event(), {}

    def opening_meanwhile():
        if not armed.is_set():
            return
        armed.clear()
        th = threading.Thread(target=lambda: other.setdefault(
            "store", CheckpointStore(d, c.fingerprint())))
        th.start()
        other["thread"] = th
        th.join(0.5)  # (with the clean-up between the check and the rename, it runs now)

    store = CheckpointStore(d, c.fingerprint(), before_publish=opening_meanwhile)
    armed.set()
    info = store.checkpoint(c, c.steps)
    other["thread"].join()
    assert other["store"].latest.name == info.name
    want = views(outs)
    c.close()
    c2, _, _, outs2 = build(d)
    assert CheckpointStore(d, c2.fingerprint()).restore(c2).step == 4
    assert views(outs2) == want
    c2.close()


def test_a_checkpoint_missing_a_workers_state_is_not_published(tmp_path):
    """Fewer state results than workers (a runtime whose workers were stopped while they
    wrote) is a failed checkpoint, never a published one."""
    d = str(tmp_path)
    c, t, u, _ = build(d, workers=2)
    store = CheckpointStore(d, c.fingerprint())
    _steps(c, t, u, 2)
    pc = store.begin(c, c.steps)
    full = pc.writes.result()

    class Short:
        def result(self):
            return list(full)[:1]
    pc.writes = Short()
    with pytest.raises(CheckpointError, match="1 of the 2 workers"):
        pc.finish()
    assert store.latest is None and not glob.glob(os.path.join(d, "ckpt-*"))
    c.close()
