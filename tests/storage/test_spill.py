"""Storage-aware spines (dbsp.trace.spill + dbsp.trace.merge_stream): operators with their
state in layer files give the reference's results; the memory accountant spills; merges wait
for disk space instead of failing; files go when their batches are merged away."""
from __future__ import annotations

import gc
import logging
import os
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbsp.algebra import kernels as K
from dbsp.storage import config as storage_config
from dbsp.storage.config import StorageConfig
from dbsp.trace.spill import SpineStorage, accountant_for
from dbsp.testing import reference as ref
from dbsp.testing import strategies as S
from dbsp.testing.harness import check_steps
from dbsp.trace.batch import OrdIndexedZSet, OrdZSet, ZSet
from dbsp.trace.spine import Spine
from storage_helpers import tiny

HC = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]


# where file merges run: the merger thread, or the merge helper process for every one of them
MERGES_IN = st.sampled_from([None, 3]).map(lambda rows: {"merge_process_rows": rows})


def _ix(s, key=("k",)):
    return s.index_by(list(key))


L = pa.schema([pa.field("k", pa.int64()), pa.field("a", pa.string())])
R = pa.schema([pa.field("k", pa.int64()), pa.field("b", pa.int64())])


# --- operators with storage vs the reference ------------------------------------------------------

def test_join_literal_with_storage_writes_files(tmp_path, workers):
    steps = [{"l": {(i % 7, f"x{i}"): 1 for i in range(40)}, "r": {(i, i): 1 for i in range(7)}},
             {"l": {(i % 7, f"y{i}"): 2 for i in range(30)}, "r": {(3, 3): -1, (3, 4): 1}},
             {"l": {(i % 7, f"x{i}"): -1 for i in range(0, 40, 3)}},
             {"r": {(i, 100 + i): 1 for i in range(7)}, "l": {(None, "n"): 1}}]
    c = check_steps(workers, {"l": L, "r": R}, lambda l, r: _ix(l).join(_ix(r)),
                    lambda l, r: ref.join(l, r, [0], [0]), steps, storage=tiny(tmp_path))
    assert c.storage is not None
    dirs = sorted(os.listdir(tmp_path))
    assert dirs == ["LOCK"] + [f"worker-{w}" for w in range(workers)]  # LOCK: one process only


@settings(max_examples=25, deadline=None, suppress_health_check=HC)
@given(data=st.data())
def test_joins_with_storage_random(tmp_path_factory, workers, data):
    ls = pa.schema([data.draw(S.fields("k")), data.draw(S.fields("a"))])
    rs = pa.schema([pa.field("k", ls.field("k").type), data.draw(S.fields("b"))])
    steps = [{"l": l, "r": r} for l, r in zip(data.draw(S.deltas(ls, steps=8, max_rows=8)),
                                              data.draw(S.deltas(rs, steps=8, max_rows=8)))]
    kind = data.draw(st.sampled_from(["join", "left_join", "antijoin"]))
    build = {"join": lambda l, r: _ix(l).join(_ix(r)),
             "left_join": lambda l, r: _ix(l).left_join(_ix(r)),
             "antijoin": lambda l, r: _ix(l).antijoin(_ix(r))}[kind]
    want = {"join": lambda l, r: ref.join(l, r, [0], [0]),
            "left_join": lambda l, r: ref.left_join(l, r, [0], [0], 1),
            "antijoin": lambda l, r: ref.antijoin(l, r, [0], [0])}[kind]
    check_steps(workers, {"l": ls, "r": rs}, build, want, steps,
                storage=tiny(tmp_path_factory.mktemp("j"), **data.draw(MERGES_IN)))


@settings(max_examples=25, deadline=None, suppress_health_check=HC)
@given(schema=S.schemas(1, 3), data=st.data())
def test_distinct_with_storage_random(tmp_path_factory, workers, schema, data):
    steps = [{"t": d} for d in data.draw(S.deltas(schema, steps=8, max_rows=8))]
    check_steps(workers, {"t": schema}, lambda t: t.distinct(), ref.distinct, steps,
                storage=tiny(tmp_path_factory.mktemp("d"), **data.draw(MERGES_IN)))


AGGS = [{"n": ("count", None), "s": ("sum", "x"), "a": ("avg", "x")},
        {"n": ("count", None), "lo": ("min", "x"), "hi": ("max", "y"), "d": ("count_distinct", "y")}]
A = pa.schema([pa.field("k", pa.int32()), pa.field("x", pa.int64()), pa.field("y", pa.string())])


@settings(max_examples=25, deadline=None, suppress_health_check=HC)
@given(aggs=st.sampled_from(AGGS), data=st.data())
def test_aggregates_with_storage_random(tmp_path_factory, workers, aggs, data):
    steps = [{"t": d} for d in data.draw(S.deltas(A, steps=8, max_rows=8, valid=True))]
    specs = [(k, A.names.index(c) - 1 if c else None) for k, c in aggs.values()]
    check_steps(workers, {"t": A}, lambda t: _ix(t).aggregate(aggs),
                lambda t: ref.aggregate(t, [0], specs), steps,
                storage=tiny(tmp_path_factory.mktemp("a"), **data.draw(MERGES_IN)))


@settings(max_examples=20, deadline=None, suppress_health_check=HC)
@given(k=st.integers(1, 3), desc=st.booleans(), data=st.data())
def test_topk_with_storage_random(tmp_path_factory, workers, k, desc, data):
    steps = [{"t": d} for d in data.draw(S.deltas(A, steps=8, max_rows=8, valid=True))]
    check_steps(workers, {"t": A}, lambda t: _ix(t).topk(k, ["x"], descending=desc),
                lambda t: ref.topk(t, [0], k, [0], desc), steps,
                storage=tiny(tmp_path_factory.mktemp("t"), **data.draw(MERGES_IN)))


def test_join_with_storage_on_worker_processes(tmp_path):
    steps = [{"l": {(i % 5, f"x{i}"): 1 for i in range(30)}, "r": {(i, i): 1 for i in range(5)}},
             {"l": {(i % 5, f"x{i}"): -1 for i in range(0, 30, 2)}, "r": {(2, 7): 1}}]
    check_steps(2, {"l": L, "r": R}, lambda l, r: _ix(l).join(_ix(r)),
                lambda l, r: ref.join(l, r, [0], [0]), steps,
                storage=tiny(tmp_path, merge_process_rows=3), runtime="processes")
    assert sorted(os.listdir(tmp_path)) == ["LOCK", "worker-0", "worker-1"]


def test_stream_context_takes_a_storage_config(tmp_path):
    from dbsp.api import StreamContext, col, sum_
    ctx = StreamContext(storage=tiny(tmp_path))
    bids = ctx.stream(pa.table({"auction": [i % 4 for i in range(50)], "price": list(range(50))}),
                      name="bids")
    out = bids.group_by("auction").agg(total=sum_(col("price"))).collect()
    ctx.execute()
    assert sorted(out.rows()) == [(a, sum(range(a, 50, 4))) for a in range(4)]
    assert ctx.storage == str(tmp_path) and sorted(os.listdir(tmp_path)) == ["LOCK", "worker-0"]


# --- spines: spilling, file lifetime, disk space -------------------------------------------------

def _batches(n: int, rows: int, seed: int = 0, keys: int = 500):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        t = pa.record_batch({"k": rng.integers(0, keys, rows), "v": rng.integers(0, 1000, rows)})
        out.append(OrdIndexedZSet.from_loose(ZSet(t, rng.integers(1, 3, rows).astype(np.int64)),
                                             ["k"]))
    return out


def test_accountant_spills_largest_batches_and_keeps_the_state(tmp_path):
    cfg = StorageConfig(str(tmp_path), memory_budget_bytes=512 << 10, backend="pread",
                        block_size=4096, cache_bytes=64 << 10, min_file_rows=1 << 30,
                        min_spill_bytes=0, min_free_bytes=0)
    st_ = SpineStorage(cfg, 0)
    acct = st_.accountant
    sp = Spine(name="acct", storage=st_)
    bs = _batches(60, 3000)
    biggest = max(b.nbytes_in_memory for b in bs)
    worst = 0
    for b in bs:
        sp.insert(b)
        # what a spill can free stays under the budget (inputs of running merges are freed by
        # the merge, which streams them into a file)
        worst = max(worst, acct.batch_bytes - acct.merging_bytes + acct.resident_bytes)
    sp.wait_merges()
    assert worst <= acct.budget + biggest, (worst, acct.budget, biggest)
    acct.relieve()
    assert acct.spills > 0 and acct.spilled_bytes > 0
    assert acct.batch_bytes <= acct.budget
    assert any(b.is_file for b in sp.batches())
    want = OrdIndexedZSet.merge(bs).to_dict()
    assert sp.compact().to_memory().to_dict() == want


def test_accountant_spills_never_probed_batches_before_probed_ones(tmp_path):
    """A batch that probes read (a join's hot side) stays in memory while batches nobody
    probed can go, even those a merge is about to take."""
    from dbsp.trace.spine import Merger
    cfg = StorageConfig(str(tmp_path), memory_budget_bytes=64 << 20, backend="pread",
                        block_size=4096, cache_bytes=64 << 10, min_file_rows=1 << 30,
                        min_spill_bytes=0, min_free_bytes=0)
    st_ = SpineStorage(cfg, 0)
    acct = st_.accountant
    m = Merger(name="paused")
    m.pause()  # merges are owed, none runs
    try:
        cold = Spine(name="cold", storage=st_, merger=m, fanout=4)
        hot = Spine(name="hot", storage=st_, merger=m, fanout=4)
        for b in _batches(4, 2000, seed=3):
            cold.insert(b)
        hot.insert(_batches(1, 8000, seed=4)[0])
        hb = hot.batches()[0]
        hb.hits = 10_000  # probed
        cold_bytes = sum(b.nbytes_in_memory for b in cold.batches())
        assert all(not b.is_file for b in cold.batches()) and acct.spills == 0
        # spilling half of the cold spine is enough to get under 80% of the budget
        acct.budget = int((hb.nbytes_in_memory + cold_bytes // 2) / 0.8)
        assert acct.over()
        acct.relieve()
        assert not hot.batches()[0].is_file
        assert any(b.is_file for b in cold.batches())
        assert acct.used <= acct.budget * 0.8
    finally:
        m.shutdown(wait=False)


def test_files_are_deleted_when_batches_are_merged_away(tmp_path):
    cfg = StorageConfig(str(tmp_path), backend="pread", block_size=4096, min_file_rows=1,
                        min_free_bytes=0, merge_chunk_rows=500)
    st_ = SpineStorage(cfg, 0)
    sp = Spine(name="files", storage=st_, background=False)  # merges as soon as owed
    bs = _batches(40, 400, seed=1)
    for b in bs:
        sp.insert(b)
    sp.wait_merges()
    gc.collect()
    on_disk = set(os.listdir(st_.dir))
    held = {os.path.basename(b.path) for b in sp.batches() if b.is_file}
    assert held and on_disk == held
    assert st_.files_written > len(held)  # merged-away files existed and are gone
    assert OrdIndexedZSet.merge([b.to_memory() for b in sp.batches()]).to_dict() == \
        OrdIndexedZSet.merge(bs).to_dict()
    sp.clear()
    gc.collect()
    assert os.listdir(st_.dir) == []


def test_merge_waits_for_disk_space_then_resumes(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="dbsp.storage")
    cfg = StorageConfig(str(tmp_path), backend="pread", block_size=4096, min_file_rows=1,
                        min_free_bytes=1 << 20)
    st_ = SpineStorage(cfg, 0)
    full = threading.Event()
    full.set()
    real = storage_config.free_space

    def fake_free_space(path):
        return 1000 if full.is_set() else real(path)

    monkeypatch.setattr(storage_config, "free_space", fake_free_space)
    sp = Spine(name="diskfull", storage=st_, background=True)
    bs = _batches(4, 2000, seed=2)
    for b in bs:  # four level-0 batches: one merge owed, which must write a file
        sp.insert(b)
    deadline = time.monotonic() + 10
    while st_.disk_waits < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert st_.disk_waits >= 3, "the merge should be waiting for disk space"
    assert sp.num_merging == 1 and sp._error is None
    assert not os.listdir(st_.dir)  # nothing written while the disk is full
    assert "waits for disk space" in caplog.text
    full.clear()  # space freed
    assert sp.wait_merges(timeout=30)
    assert "resumed after waiting" in caplog.text
    assert [b.is_file for b in sp.batches()] == [True]
    assert sp.batches()[0].to_memory().to_dict() == OrdIndexedZSet.merge(bs).to_dict()


def test_zset_trace_with_storage(tmp_path):
    """Z-set traces (distinct) probe file batches with row_weights."""
    cfg = tiny(tmp_path, backend="pread", min_file_rows=100, merge_chunk_rows=64)
    st_ = SpineStorage(cfg, 0)
    sp = Spine(name="z", storage=st_)
    rng = np.random.default_rng(5)
    parts = []
    for _ in range(30):
        t = pa.record_batch({"x": rng.integers(0, 300, 200), "s": pa.array(
            [f"s{i}" for i in rng.integers(0, 9, 200)])})
        z = OrdZSet.from_loose(ZSet(t, rng.integers(-1, 3, 200).astype(np.int64)))
        parts.append(z)
        sp.insert(z)
    sp.wait_merges()
    assert any(b.is_file for b in sp.batches())
    total = OrdZSet.merge(parts)
    idx = np.arange(0, len(total), 3)
    probe = K.take(total.codes, idx)
    assert sp.weights_of(probe).tolist() == total.weights[idx].tolist()


def test_processes_get_a_share_of_the_budget(tmp_path):
    cfg = StorageConfig(str(tmp_path), memory_budget_bytes=64 << 20, cache_bytes=8 << 20)
    half = cfg.share(2)
    assert half.memory_budget_bytes == 32 << 20 and half.cache == 4 << 20
    assert accountant_for(half) is not accountant_for(cfg)
    with pytest.raises(ValueError, match="block_size"):
        StorageConfig(str(tmp_path), block_size=1000)


# --- whole-state reads and key bounds over file batches ------------------------------------------

def test_integrate_with_storage_equals_memory(tmp_path):
    """``integrate`` reads the whole trace (Spine.consolidated): a trace left as one file batch
    is read back into memory for it."""
    from dbsp.testing.harness import run_steps
    s = pa.schema([("k", pa.int64()), ("v", pa.string())])
    steps = [{"t": {(i, f"x{i}"): 1 for i in range(n * 50, n * 50 + 50)}} for n in range(6)]
    steps.append({"t": {(i, f"x{i}"): -1 for i in range(0, 300, 7)}})
    want = run_steps(1, {"t": s}, lambda t: t.integrate(), steps)
    assert run_steps(1, {"t": s}, lambda t: t.integrate(), steps,
                     storage=tiny(tmp_path, backend="pread")) == want


@pytest.mark.parametrize("kind", ["tumbling", "session"])
def test_windows_with_storage_equal_memory(tmp_path, monkeypatch, kind):
    """Window state is cut by key bounds (``truncate_keys_below``: views of file batches) and
    swept by GC (``consolidated`` + re-insert); with state in files the results are the same."""
    from dbsp.api import StreamContext, count, session, sum_, tumbling
    from dbsp.operators.window import KeyedRecomputeOperator
    monkeypatch.setattr(KeyedRecomputeOperator, "MIN_GC_ROWS", 0)  # sweep at every watermark
    sch = pa.schema([("t", pa.int64()), ("k", pa.int64()), ("x", pa.int64())])
    rng = np.random.default_rng(11)
    batches = []
    for s in range(12):
        t = rng.integers(s * 10, s * 10 + 25, 40)  # out of order, some late
        batches.append(pa.record_batch([t, rng.integers(0, 5, 40), rng.integers(0, 9, 40)],
                                       schema=sch))

    def run(storage):
        with StreamContext(storage=storage) as ctx:
            src = ctx.stream(sch, name="ev", time="t", lateness=8)
            spec = tumbling(10) if kind == "tumbling" else session(3)
            out = src.group_by("k").window(spec).agg(n=count(), s=sum_("x")).collect()
            deltas = []
            for b in batches:
                src.push(b)
                ctx.step()
                deltas.append(out.delta_dict())
            stats = ctx.circuit.storage_stats()
            files = sum(w["files_written"] for w in stats.get("workers", []))
            return deltas, src.late_rows, files

    on_disk, late, files = run(tiny(tmp_path, backend="pread"))
    assert files > 0
    assert (on_disk, late) == run(None)[:2]


def test_a_finaliser_that_runs_inside_recount_does_not_deadlock():
    """A collection may start while ``recount`` holds the accountant's lock (any allocation in
    it can trigger one) and run a batch file's finaliser, which gives back its resident bytes
    through ``add`` on the same thread (a worker process hung on this in a launcher test).
    Here the spine's ``batches()`` plays that finaliser: the recount finishes, and both the
    batch bytes and the resident bytes come out right."""
    from dbsp.trace.spill import MemoryAccountant

    acct = MemoryAccountant(1 << 30)

    class _Batch:
        nbytes_in_memory = 1000

    class _Spine:
        def batches(self):
            acct.add(resident_delta=-64)  # the finaliser, on the recounting thread
            return [_Batch(), _Batch()]

        def loose_batches(self):
            return [_Batch()]

    sp = _Spine()
    acct.register(sp)
    acct.add(resident_delta=64)
    t = threading.Thread(target=acct.recount, args=(sp,), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "recount deadlocked on a re-entrant add"
    assert (acct.batch_bytes, acct.merging_bytes, acct.resident_bytes) == (2000, 1000, 0)
