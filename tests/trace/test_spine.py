"""The spine against a dict model while merges run in the background: insert sequences with
retractions, lookup, weights_of, consolidated, cursors, key truncation and retain_values, the
merge policy's level invariant, backpressure (blocks and releases), close, clear, merge failures
and fork."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_cursor import walk
from trace_model import (
    add_into,
    code,
    examples,
    indexed,
    indexed_rows,
    rows,
    schemas,
    state_of,
    values,
    zset,
)

from dbsp.trace import spine as spine_mod
from dbsp.trace.batch import OrdIndexedZSet, OrdZSet
from dbsp.trace.journal import StepJournal, use_journal
from dbsp.trace.spine import Merger, Spine, SpineMergeError, _level

SETTINGS = settings(max_examples=examples(30), deadline=None)
pytestmark = pytest.mark.timeout(120)  # a merger that stops merging hangs flush(): fail instead
KS = pa.schema([pa.field("k", pa.int64(), nullable=False)])
VS = pa.schema([pa.field("v", pa.string())])


def ikv(pairs) -> OrdIndexedZSet:
    """An indexed batch from ``(k, v, w)`` triples over (int64 key, string value)."""
    return indexed(KS, VS, [((k,), (v,), w) for k, v, w in pairs])


def model_of_ikv(pairs) -> dict:
    return add_into({}, ((((k,), (v,)), w) for k, v, w in pairs))


def probe_codes(batch_like, keys: list):
    """Sorted distinct codes of ``keys`` in the codec of ``batch_like``."""
    cs = sorted({code(batch_like.kcodec, k) for k in keys})
    if batch_like.kcodec.u64:
        return np.asarray(cs, dtype=np.uint64)
    from dbsp.algebra.codes import VarCodes
    return VarCodes.from_list(cs)


def check_levels(sp: Spine) -> None:
    """At rest, every level holds fewer than ``fanout`` batches, each at the level of its size."""
    for lvl, sizes in sp.level_sizes().items():
        assert len(sizes) < sp.fanout, sp.level_sizes()
        assert all(sp.level_of(n) == lvl for n in sizes)


# --- model-based insert sequences ---------------------------------------------------------------

@SETTINGS
@given(st.data(), st.sampled_from([2, 3, 4]), st.booleans(), st.sampled_from([0, 1, 6, 10_000]))
def test_indexed_spine_matches_model(data, fanout, background, inline_rows):
    """``inline_rows``: merges of fewer rows run in the inserting thread, the rest on the merger
    (0: all on the merger, 10,000: all inline here)."""
    ks, vs = data.draw(schemas(1, 2, "k")), data.draw(schemas(0, 1, "v"))
    sp = Spine(fanout=fanout, name="t", max_loose=4, background=background,
               inline_rows=inline_rows)
    model: dict = {}
    steps = data.draw(st.lists(indexed_rows(ks, vs, 8), min_size=1, max_size=12))
    history = []
    for step in steps:
        rws = step
        if history and data.draw(st.booleans()):  # retract an earlier batch: it cancels
            rws = [(k, v, -w) for k, v, w in data.draw(st.sampled_from(history))]
        history.append(rws)
        b = indexed(ks, vs, rws)
        sp.insert(b)
        add_into(model, (((k, v), w) for k, v, w in rws))
        assert state_of(sp.batches()) == model  # merges may be running right now
        probe = data.draw(st.lists(values(ks), max_size=4))
        if probe:
            got = sp.lookup(probe_codes(b, probe))
            want = {kv: w for kv, w in model.items() if kv[0] in set(probe)}
            assert (state_of([got]) if got is not None else {}) == want
    sp.flush()
    check_levels(sp)
    assert state_of(sp.batches()) == model
    c = sp.cursor()
    assert {(k, v): w for k, v, w in walk(c)} == model
    whole = sp.consolidated()
    assert (state_of([whole]) if whole is not None else {}) == model
    assert sp.num_batches <= 1
    sp.close()


@SETTINGS
@given(st.data())
def test_zset_spine_weights_of(data):
    s = data.draw(schemas(1, 2))
    sp = Spine(fanout=2, name="z", max_loose=3)
    model: dict = {}
    for rws in data.draw(st.lists(rows(s, 8), min_size=1, max_size=10)):
        z = zset(s, rws)
        sp.insert(z)
        add_into(model, rws)
        assert state_of(sp.batches()) == model
        probe = sorted({r for r, _ in rws} | set(data.draw(st.lists(values(s), max_size=3))),
                       key=lambda r: code(z.codec, r))
        probe = list({code(z.codec, r): r for r in probe}.values())  # -0.0 == 0.0
        cs = [code(z.codec, r) for r in probe]
        arr = (np.asarray(cs, np.uint64) if z.codec.u64 else
               __import__("dbsp.algebra.codes", fromlist=["VarCodes"]).VarCodes.from_list(cs))
        assert sp.weights_of(arr).tolist() == [model.get(r, 0) for r in probe]
    sp.wait_merges()
    check_levels(sp)


def test_readers_always_see_a_consistent_state():
    """A reader thread snapshotting all the time only ever sees states the model went through."""
    sp = Spine(fanout=2, name="consistent", max_loose=8)
    rng = np.random.default_rng(7)
    states = [frozenset()]
    model: dict = {}
    seen = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            seen.append(frozenset(state_of(sp.batches()).items()))

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(60):
        pairs = [(int(k), "x" if k % 2 else "y", int(w))
                 for k, w in zip(rng.integers(0, 30, 12), rng.choice([-1, 1], 12))]
        sp.insert(ikv(pairs))
        add_into(model, model_of_ikv(pairs).items())
        states.append(frozenset(model.items()))
    stop.set()
    t.join()
    sp.flush()
    assert sp.stats.merges > 0 and len(seen) > 0
    valid = set(states)
    assert all(s in valid for s in seen)
    assert state_of(sp.batches()) == model


# --- merge policy --------------------------------------------------------------------------------

def test_levels_and_batch_count_stay_logarithmic():
    sp = Spine(fanout=4, name="levels")
    for i in range(200):
        sp.insert(ikv([(i * 10 + j, "v", 1) for j in range(10)]))
    sp.flush()
    check_levels(sp)
    # 2000 rows, 10-row inserts: levels 1..5, fewer than 4 batches each
    assert sp.num_batches <= 3 * 5
    assert len(sp) == 2000
    st_ = sp.stats
    assert st_.inserts == 200 and st_.rows_inserted == 2000
    assert st_.merges > 0 and st_.rows_in >= st_.rows_out > 0 and st_.merge_seconds > 0
    assert set(st_.as_dict()) >= {"merges", "rows_in", "rows_out", "merge_seconds"}


def test_level_function():
    assert [_level(n, 4) for n in (0, 1, 3, 4, 15, 16, 63, 64)] == [0, 0, 0, 1, 1, 2, 2, 3]
    assert _level(10_000, 10) == 4
    # with a base, every batch under base * fanout rows shares level 0
    assert [_level(n, 4, 256) for n in (0, 255, 1023, 1024, 4095, 4096)] == [0, 0, 0, 1, 1, 2]
    assert Spine(fanout=4, base_rows=256).level_of(5000) == 2
    with pytest.raises(ValueError, match="base_rows"):
        Spine(base_rows=0)


@pytest.mark.parametrize("background", [False, True])
def test_small_state_stays_in_few_batches(background):
    """Small deltas of varied sizes (3 to 150 rows, as an aggregate's changed keys are). Below
    ``base_rows * fanout`` rows all batches share level 0, so at rest fewer than ``fanout``
    batches remain (a probe pays a fixed cost per batch); without the floor the same deltas
    spread over the tiny levels 0..3, up to three batches each."""
    def run(base_rows: int) -> Spine:
        sp = Spine(fanout=4, name="small", base_rows=base_rows, background=background)
        for step in range(12):  # 609 rows: all under base_rows * fanout
            n = (3, 10, 40, 150)[step % 4]
            sp.insert(ikv([(step * 1000 + k, "v", 1) for k in range(n)]))
        sp.flush()
        check_levels(sp)
        return sp
    floor, plain = run(256), run(1)
    assert floor.num_batches < 4
    assert state_of(floor.batches()) == state_of(plain.batches())
    assert plain.num_batches == 12  # three at each of the levels 0..3


def test_retractions_cancel_to_an_empty_spine():
    sp = Spine(fanout=2, name="cancel")
    pairs = [(k, "a", 1) for k in range(20)]
    for _ in range(3):
        sp.insert(ikv(pairs))
    for _ in range(3):
        sp.insert(ikv([(k, v, -w) for k, v, w in pairs]))
    sp.flush()
    assert state_of(sp.batches()) == {}
    assert sp.consolidated() is None
    assert sp.lookup(np.arange(20, dtype=np.uint64)) is None


def test_foreground_spine_merges_in_insert():
    sp = Spine(fanout=2, name="fg", background=False)
    for i in range(16):
        sp.insert(ikv([(i, "a", 1)]))
        check_levels(sp)  # no merge is ever owed after insert returns
    assert sp.stats.merges == 15 and sp.num_batches == 1


# --- GC hooks ------------------------------------------------------------------------------------

@SETTINGS
@example(keys=[0, 5, 9], bound=5, later=[1, 7])
@given(st.lists(st.integers(0, 20), max_size=30), st.integers(0, 21),
       st.lists(st.integers(0, 20), max_size=10))
def test_truncate_keys_below(keys, bound, later):
    sp = Spine(fanout=2, name="trunc", max_loose=2)
    model: dict = {}
    for k in keys:
        sp.insert(ikv([(k, "v", 1)]))
        add_into(model, [(((k,), ("v",)), 1)])
    sp.truncate_keys_below(int(code(ikv([(0, "v", 1)]).kcodec, (bound,))))
    cut = {kv: w for kv, w in model.items() if kv[0][0] >= bound}
    assert state_of(sp.batches()) == cut  # readers see the cut at once
    for k in later:  # rows inserted below the bound stay invisible
        sp.insert(ikv([(k, "v", 1)]))
        if k >= bound:
            add_into(cut, [(((k,), ("v",)), 1)])
        assert state_of(sp.batches()) == cut
    sp.truncate_keys_below(0)  # the bound never goes down
    assert state_of(sp.batches()) == cut
    sp.flush()
    out = sp.compact()
    assert (state_of([out]) if out is not None else {}) == cut
    # the rows are gone from memory, not just hidden
    assert state_of([b for bs in sp._levels.values() for b in bs]) == cut


def test_truncate_frees_batches_wholly_below_the_bound_at_once():
    """A batch whose every key is below the bound leaves the spine when the bound is committed,
    without waiting for a merge (a large batch behind a watermark may never be merged again);
    a batch that straddles the bound stays until its merge. Inside a step that may be rolled
    back, nothing is freed until the step commits."""
    def raw(sp):
        return [b for bs in sp._levels.values() for b in bs]

    for journaled in (False, True):
        sp = Spine(fanout=64, name="free", background=False)
        old = ikv([(k, "v", 1) for k in range(0, 40)])      # wholly below 50
        mid = ikv([(k, "v", 1) for k in range(45, 55)])     # straddles 50
        new = ikv([(k, "v", 1) for k in range(60, 63)])     # above
        for b in (old, mid, new):
            sp.insert(b)
        bound = int(code(old.kcodec, (50,)))
        if journaled:
            j = StepJournal()
            with use_journal(j):
                sp.truncate_keys_below(bound)
            assert len(raw(sp)) == 3  # hidden from readers, not freed
            assert state_of(sp.batches()) == model_of_ikv(
                [(k, "v", 1) for k in list(range(50, 55)) + list(range(60, 63))])
            j.commit()
        else:
            sp.truncate_keys_below(bound)
        kept = raw(sp)
        assert len(kept) == 2 and all(b is not old for b in kept)
        assert state_of(sp.batches()) == model_of_ikv(
            [(k, "v", 1) for k in list(range(50, 55)) + list(range(60, 63))])


def test_truncate_var_codes_and_zsets():
    s = pa.schema([("name", pa.string())])
    sp = Spine(fanout=2, name="trunc-var")
    for n in ["apple", "banana", "cherry", "apricot"]:
        sp.insert(zset(s, [((n,), 1)]))
    sp.truncate_keys_below(code(sp.batches()[0].codec, ("b",)))
    assert state_of(sp.batches()) == {("banana",): 1, ("cherry",): 1}
    c = sp.cursor()
    assert [k for k, _, _ in walk(c)] == [("banana",), ("cherry",)]


def test_retain_values_applies_lazily_during_merges():
    sp = Spine(fanout=2, name="retain", background=False)
    sp.insert(ikv([(1, "keep", 1), (1, "drop", 1), (2, "drop", 1)]))
    sp.retain_values(lambda b: np.asarray(b.vals.column(0).to_pylist()) != "drop")
    # not merged yet: still visible
    assert state_of(sp.batches()) == model_of_ikv([(1, "keep", 1), (1, "drop", 1), (2, "drop", 1)])
    # same level (3 rows each, fanout 2): this insert merges both batches, dropping rows
    sp.insert(ikv([(3, "drop", 1), (3, "keep", 1), (4, "drop", 1)]))
    assert state_of(sp.batches()) == model_of_ikv([(1, "keep", 1), (3, "keep", 1)])
    sp.retain_values(None)
    sp.insert(ikv([(4, "drop", 1), (5, "drop", 1)]))
    assert state_of(sp.batches()) == model_of_ikv([(1, "keep", 1), (3, "keep", 1),
                                                   (4, "drop", 1), (5, "drop", 1)])


IV = pa.schema([pa.field("v", pa.int64())])


@SETTINGS
@given(st.lists(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 30) | st.none(),
                                   st.integers(1, 2)), min_size=1, max_size=6),
                min_size=1, max_size=8),
       st.integers(0, 32))
def test_retain_values_drops_whole_dead_batches_at_once(batches, bound):
    """A filter with ``dead`` forgets, when set, every stored batch whose rows it would all drop
    (values below the bound or null), and no other: the state is the model's without those
    batches, and after a full merge it is the model filtered row by row (nothing kept that a
    merge would have dropped, nothing dropped that it would have kept)."""
    sp = Spine(fanout=100, name="dead", background=False)  # no merge until compact()
    model: dict = {}
    for b in batches:
        sp.insert(indexed(KS, IV, [((k,), (v,), w) for k, v, w in b]))

    def ok(v):
        return v is not None and v >= bound

    for b in batches:
        if any(ok(v) for _, v, _ in b):  # a live batch: all its rows stay until merged
            add_into(model, ((((k,), (v,)), w) for k, v, w in b))
    seen = []

    def keep(batch):
        return np.asarray([ok(v) for v in batch.vals.column(0).to_pylist()], dtype=bool)

    def dead(batch):
        seen.append(batch)
        return not keep(batch).any()
    sp.retain_values(keep, dead)
    assert len(seen) == len(batches)  # asked once per stored batch, at once
    assert state_of(sp.batches()) == model
    sp.compact()
    assert state_of(sp.batches()) == {r: w for r, w in model.items() if ok(r[1][0])}


# --- backpressure, threads, lifecycle ----------------------------------------------------------

def test_backpressure_blocks_and_releases():
    m = Merger(1, name="paused")
    m.pause()
    sp = Spine(fanout=2, name="bp", max_loose=3, merger=m)
    for i in range(3):  # levels 0: 3 waiting batches, at the bound
        sp.insert(ikv([(i, "a", 1)]))
    assert sp.num_waiting == 3
    done = threading.Event()

    def writer():
        sp.insert(ikv([(99, "a", 1)]))  # 4 waiting > 3: blocks
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    assert not done.wait(0.3), "insert should block while the merger is paused"
    assert t.is_alive()
    # readers are not blocked meanwhile, and already see the blocked batch
    assert state_of(sp.batches()) == model_of_ikv([(i, "a", 1) for i in (0, 1, 2, 99)])
    m.resume()
    assert done.wait(5), "insert should resume once the merger catches up"
    t.join()
    sp.flush()
    assert sp.stats.blocked_inserts == 1 and sp.stats.blocked_seconds >= 0.25
    assert sp.stats.max_waiting == 4
    assert state_of(sp.batches()) == model_of_ikv([(i, "a", 1) for i in (0, 1, 2, 99)])
    sp.close()
    m.shutdown()


def test_large_spine_is_not_throttled():
    # many settled levels do not count as waiting: only batches a merge is owed for do
    sp = Spine(fanout=2, name="big", max_loose=2)
    for i in range(300):
        sp.insert(ikv([(i, "a", 1)]))
        assert sp.num_waiting <= 3
    sp.flush()
    assert sp.num_waiting == 0


def test_close_stops_own_thread_and_keeps_working():
    sp = Spine.with_own_thread(fanout=2, name="own")
    for i in range(8):
        sp.insert(ikv([(i, "a", 1)]))
    sp.flush()
    threads = list(sp._merger._workers)
    assert threads and all(t.is_alive() for t in threads)
    sp.close()
    for t in threads:
        t.join(5)
        assert not t.is_alive()
    for i in range(8, 16):  # merges now run in insert
        sp.insert(ikv([(i, "a", 1)]))
    check_levels(sp)
    assert state_of(sp.batches()) == model_of_ikv([(i, "a", 1) for i in range(16)])


def test_shared_merger_serves_many_spines():
    m = Merger(2, name="shared")
    spines = [Spine(fanout=2, name=f"s{i}", merger=m) for i in range(5)]
    for r in range(20):
        for j, sp in enumerate(spines):
            sp.insert(ikv([(r, str(j), 1)]))
    for j, sp in enumerate(spines):
        sp.flush()
        check_levels(sp)
        assert state_of(sp.batches()) == model_of_ikv([(r, str(j), 1) for r in range(20)])
    assert len(m._workers) == 2
    m.shutdown()


def test_clear_during_merges():
    sp = Spine(fanout=2, name="clear")
    for i in range(50):
        sp.insert(ikv([(i, "a", 1)]))
        if i == 25:
            sp.clear()
    sp.flush()
    assert state_of(sp.batches()) == model_of_ikv([(i, "a", 1) for i in range(26, 50)])


def test_merge_failure_is_reported_and_state_kept(monkeypatch):
    def boom(batches):
        raise MemoryError("no room")

    monkeypatch.setattr(spine_mod, "merge_batches", boom)
    m = Merger(1, name="failing")
    sp = Spine(fanout=2, name="fail", merger=m)
    sp.insert(ikv([(1, "a", 1)]))
    sp.insert(ikv([(2, "a", 1)]))  # owes a merge, which fails in the background
    with pytest.raises(SpineMergeError) as e:
        sp.flush()
    assert isinstance(e.value.__cause__, MemoryError)
    assert state_of(sp.batches()) == model_of_ikv([(1, "a", 1), (2, "a", 1)])
    with pytest.raises(SpineMergeError):
        sp.insert(ikv([(3, "a", 1)]))
    m.shutdown()


def test_consolidated_compacts_and_caches():
    sp = Spine(fanout=4, name="integrate-like")
    for i in range(10):
        sp.insert(ikv([(i, "a", 1)]))
        v = sp.consolidated()
        assert state_of([v]) == model_of_ikv([(j, "a", 1) for j in range(i + 1)])
    sp.wait_merges()
    assert sp.consolidated() is sp.consolidated()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_while_merging(monkeypatch):
    """A child forked while a merge runs gets the claimed batches back and merges them itself."""
    gate = threading.Event()
    real = spine_mod.merge_batches

    def slow(batches):
        gate.wait(5)
        return real(batches)

    monkeypatch.setattr(spine_mod, "merge_batches", slow)
    m = Merger(1, name="forky")
    sp = Spine(fanout=2, name="fork", merger=m)
    sp.insert(ikv([(1, "a", 1)]))
    sp.insert(ikv([(2, "a", 1)]))
    deadline = time.monotonic() + 5
    while sp.num_merging == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sp.num_merging == 1
    pid = os.fork()
    if pid == 0:  # child
        ok = False
        try:
            gate.set()
            sp.insert(ikv([(3, "a", 1)]))
            ok = (sp.wait_merges(5) and sp.num_merging == 0 and state_of(sp.batches())
                  == model_of_ikv([(1, "a", 1), (2, "a", 1), (3, "a", 1)]))
        finally:
            os._exit(0 if ok else 1)
    gate.set()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    sp.flush()
    assert state_of(sp.batches()) == model_of_ikv([(1, "a", 1), (2, "a", 1)])
    m.shutdown()


def test_ord_zset_spine_rejects_lookup():
    sp = Spine(name="z")
    sp.insert(OrdZSet.from_arrow(pa.record_batch({"a": [1, 2]})))
    with pytest.raises(TypeError):
        sp.lookup(np.asarray([1], np.uint64))


def test_one_thread_stays_free_for_small_merges(monkeypatch):
    """With 2 threads, a second big merge waits while one runs; small merges still go through."""
    gate = threading.Event()
    started: list = []
    real = spine_mod.merge_batches

    def gated(batches):
        rows = sum(len(b) for b in batches)
        started.append(rows)
        if rows >= 40:  # the big merges hold until the gate opens
            gate.wait(10)
        return real(batches)

    monkeypatch.setattr(spine_mod, "merge_batches", gated)
    m = Merger(2, name="reserve", big_rows=40)
    big_a, big_b, small = (Spine(fanout=2, name=n, merger=m) for n in ("a", "b", "small"))
    for sp, base in ((big_a, 0), (big_b, 100)):
        for i in range(2):  # two 20-row batches: one 40-row (big) merge
            sp.insert(ikv([(base + 20 * i + j, "x", 1) for j in range(20)]))
    deadline = time.monotonic() + 5
    while m._big < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert m._big == 1, "only one big merge may run while another thread is free"
    small.insert(ikv([(1, "s", 1)]))
    small.insert(ikv([(2, "s", 1)]))
    assert small.wait_merges(5), "the small merge must not wait for the big ones"
    gate.set()
    for sp in (big_a, big_b):
        sp.flush()
        assert len(sp) == 40 and sp.num_batches == 1
    assert started.count(40) == 2
    m.shutdown()


def test_defaults_from_environment(monkeypatch):
    monkeypatch.setenv("DBSP_MERGER_THREADS", "3")
    assert spine_mod.default_threads() == 3
    monkeypatch.delenv("DBSP_MERGER_THREADS")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert spine_mod.default_threads() == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    assert spine_mod.default_threads() == 4
    monkeypatch.setenv("DBSP_SPINE_BACKGROUND", "0")
    assert Spine().background is False
    assert Spine(merger=Merger(1)).background is True  # an explicit merger means background
    monkeypatch.setenv("DBSP_SPINE_BACKGROUND", "1")
    assert Spine().background is True


# --- hooks for storage: the batch-probe interface, spilling, observers -------------------------

class FakeFileBatch:
    """A batch that answers only the batch-probe interface (like a layer-file batch)."""

    is_file = True

    def __init__(self, inner):
        self.inner = inner
        self.indexed = isinstance(inner, OrdIndexedZSet)
        self.kcodec = inner.kcodec if self.indexed else inner.codec
        self.prefetched = 0

    def __len__(self):
        return len(self.inner)

    def to_memory(self):
        return self.inner

    def cut_below(self, bound):
        from dbsp.trace.spine import _cut_below
        cut = _cut_below(self.inner, bound)
        return self if cut is self.inner else FakeFileBatch(cut)

    def prefetch_keys(self, codes):
        self.prefetched += 1

    def match(self, codes):
        from dbsp.algebra import kernels as K
        pi, ki = K.intersect(codes, self.inner.kcodes)
        return None if len(pi) == 0 else (self.inner, pi, ki)

    def row_weights(self, codes):
        from dbsp.algebra import kernels as K
        out = np.zeros(len(codes), np.int64)
        pi, ki = K.intersect(codes, self.inner.codes)
        out[pi] = self.inner.weights[ki]
        return out

    def cursor(self):
        from dbsp.trace.cursor import cursor_for
        return cursor_for(self.inner)


def test_spilled_batches_are_read_through_the_probe_interface():
    changes = []
    sp = Spine(fanout=2, name="spill", background=False, on_change=lambda s: changes.append(1))
    sp.insert(ikv([(1, "a", 1), (2, "b", 1), (3, "c", 1)]))
    (b,) = sp.loose_batches()
    f = FakeFileBatch(b)
    assert sp.replace_batch(b, f) and not sp.replace_batch(b, f)  # b is gone now
    assert sp.batches() == (f,)
    got = sp.lookup(probe_codes(b, [(2,), (3,), (9,)]))
    assert f.prefetched == 1 and state_of([got]) == model_of_ikv([(2, "b", 1), (3, "c", 1)])
    assert {(k, v): w for k, v, w in walk(sp.cursor())} == model_of_ikv(
        [(1, "a", 1), (2, "b", 1), (3, "c", 1)])
    sp.truncate_keys_below(code(b.kcodec, (2,)))
    assert state_of([x.to_memory() for x in sp.batches()]) == model_of_ikv(
        [(2, "b", 1), (3, "c", 1)])
    sp.insert(ikv([(4, "d", 1), (5, "e", 1), (6, "f", 1)]))  # merges the file batch (in memory)
    assert sp.num_batches == 1 and not getattr(sp.batches()[0], "is_file", False)
    assert state_of(sp.batches()) == model_of_ikv([(k, v, 1) for k, v in
                                                    [(2, "b"), (3, "c"), (4, "d"), (5, "e"),
                                                     (6, "f")]])
    assert len(changes) >= 4  # insert, replace, insert, merge

    z = Spine(name="zspill", background=False)
    zb = zset(KS, [((1,), 2), ((5,), 1)])
    z.insert(zb)
    assert z.replace_batch(zb, FakeFileBatch(zb))
    assert z.weights_of(np.asarray([code(zb.codec, (1,)), code(zb.codec, (2,))],
                                   np.uint64)).tolist() == [2, 0]


def test_merge_fn_and_observer_in_background():
    calls, changes = [], []

    def merge_fn(batches):
        calls.append(len(batches))
        return spine_mod.merge_batches(batches)

    m = Merger(1, name="hooks")
    sp = Spine(fanout=2, name="hooks", merger=m, merge_fn=merge_fn,
               on_change=lambda s: changes.append(threading.current_thread().name))
    for i in range(4):
        sp.insert(ikv([(i, "a", 1)]))
    sp.flush()
    assert calls and all(c >= 2 for c in calls)
    assert any(n.startswith("hooks") for n in changes)  # merges report from the merger thread
    m.shutdown()


def test_failing_observer_does_not_kill_the_merger():
    m = Merger(1, name="obs")

    def bad(s):
        if threading.current_thread().name.startswith("obs"):
            raise RuntimeError("observer bug")

    sp = Spine(fanout=2, name="obs", merger=m, on_change=bad)
    for r in range(2):  # the second round needs the thread the first observer failure hit
        for i in range(4):
            sp.insert(ikv([(10 * r + i, "a", 1)]))
        sp.flush()
    assert sp.stats.merges >= 2 and all(t.is_alive() for t in m._workers)
    assert len(sp) == 8
    m.shutdown()


def test_only_merges_that_may_set_a_new_peak_trim(monkeypatch):
    """Before a merge of >= TRIM_BYTES of input that is at least half the largest merge so far
    the allocators give their free pages back (the merge is where memory peaks); smaller merges,
    and merges far below an earlier one, do not (the trimmed pages are faulted in again)."""
    calls = []
    monkeypatch.setattr(spine_mod, "_largest_merge", 0)
    monkeypatch.setattr(spine_mod, "TRIM_BYTES", 100)
    monkeypatch.setattr(spine_mod, "release_free_memory", lambda: calls.append(1))
    assert [spine_mod._trims_before(n) for n in (99, 100, 400, 199, 200, 1000, 450, 500)] == \
        [False, True, True, False, True, True, False, True]
    spine_mod._largest_merge = 0
    sp = Spine(fanout=2, base_rows=1, background=False)
    for i in range(4):  # 4 batches of 100 rows (> 100 B each): merges of 2 and of 4 batches
        sp.insert(OrdZSet.from_arrow(pa.record_batch(
            [pa.array(np.arange(i * 100, (i + 1) * 100))], names=["x"])))
    assert len(calls) == 3 and sp.num_batches == 1 and len(sp) == 400


def test_release_free_memory_runs():
    from dbsp.storage.memory import release_free_memory
    release_free_memory()
    release_free_memory()


def test_small_merges_run_inline_and_large_ones_on_the_merger():
    """A background spine merges fewer than ``inline_rows`` rows in ``insert`` (a thread handoff
    costs more than such a merge); larger merges go to the merger; a paused merger pauses both."""
    m = Merger(1, name="inline")
    sp = Spine(fanout=2, base_rows=1, name="inl", inline_rows=5, merger=m)
    assert sp.background and sp.inline_rows == 5
    sp.insert(ikv([(1, "a", 1)]))
    sp.insert(ikv([(2, "a", 1)]))  # owes a merge of 2 rows: done here
    assert sp.stats.merges == 1 and not m._workers
    sp.insert(ikv([(3, "a", 1), (4, "a", 1), (5, "a", 1)]))  # level 1: 2 + 3 rows
    sp.flush()
    assert sp.stats.merges == 2 and m._workers and sp.num_batches == 1  # on the merger
    sp.insert(ikv([(6, "a", 1)]))
    m.pause()
    sp.insert(ikv([(7, "a", 1)]))
    sp.insert(ikv([(8, "a", 1)]))
    assert sp.num_waiting == 3  # not merged inline while the merger is paused
    m.resume()
    sp.flush()
    assert state_of(sp.batches()) == model_of_ikv([(i, "a", 1) for i in range(1, 9)])
    sp.close()
    m.shutdown()
    assert Spine().inline_rows == spine_mod.INLINE_ROWS
    with pytest.raises(ValueError, match="inline_rows"):
        Spine(inline_rows=-1)


def test_fixed_row_bytes_bounds_every_fixed_width_batch():
    """The spine's per-schema bound on a row's bytes (which lets a small merge skip the trim
    check) is at least what fixed-width rows take, with multi-column (var) codes too, and None
    when a column is variable-width."""
    rng = np.random.default_rng(3)
    n = 500
    cols = {"a": pa.array(rng.integers(0, 9, n)), "b": pa.array(rng.random(n)),
            "c": pa.array(rng.integers(0, 9, n).astype(np.int8)),
            "d": pa.array(rng.integers(0, 2, n).astype(bool)),
            "t": pa.array(rng.integers(0, 9, n).astype("datetime64[us]"))}
    for names in (["a"], ["a", "b"], ["c", "d", "t"], ["a", "b", "c", "d", "t"]):
        z = OrdZSet.from_arrow(pa.record_batch([cols[x] for x in names], names=names))
        batches = [z] + ([z.index_by(names[:1]), z.index_by(names[:2])] if len(names) > 2 else
                         [z.index_by(names[:1])])
        for b in batches:
            bound = spine_mod._fixed_row_bytes(b)
            assert bound is not None and bound * len(b) >= b.nbytes_in_memory, (names, b)
    s = OrdZSet.from_arrow(pa.record_batch([pa.array(["x"] * 3)], names=["s"]))
    assert spine_mod._fixed_row_bytes(s) is None


def test_merges_reading_layer_files_stay_on_the_merger():
    """A small merge whose inputs include a batch in a layer file is not run inline: its block
    reads would wait in the step."""

    class FileLike(OrdIndexedZSet):  # stands for a file batch (merges read it into memory)
        is_file = True

    def filelike(pairs):
        b = ikv(pairs)
        return FileLike(b.keys, b.kcodes, b.offsets, b.vals, b.vcodes, b.weights, b.kcodec,
                        b.vcodec)

    m = Merger(1, name="files")
    sp = Spine(fanout=2, base_rows=1, name="f", inline_rows=100, merger=m)
    sp.insert(ikv([(1, "a", 1)]))
    sp.insert(filelike([(2, "a", 1)]))
    sp.flush()
    assert sp.stats.merges == 1 and m._workers  # on the merger
    sp.close()
    m.shutdown()
