"""Exactly-once stepping through the API: StreamContext(storage=..., checkpoint_every=...),
resume on open, ctx.checkpoint(), ctx.report(), recorded positions, replayed sources, and a
hypothesis stateful test (push, step, checkpoint, crash, restart, corrupt) against the reference
model."""
from __future__ import annotations

import glob
import os

import pyarrow as pa
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from dbsp.api import StreamContext
from dbsp.api import col
from dbsp.api.expr.aggregates import count, max_, sum_
from dbsp.checkpoint import CheckpointCorrupt
from dbsp.ft import read_outputs
from dbsp.testing import reference as ref

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])


def make(d, **kw):
    kw.setdefault("checkpoint_every", 2)
    ctx = StreamContext(storage=d, **kw)
    s = ctx.stream(SCHEMA, name="s")
    agg = s.group_by("k").agg(n=count(), t=sum_("v"), hi=max_("v")).collect(name="agg")
    raw = s.collect(name="raw")
    return ctx, s, agg, raw


def test_resume_report_and_positions(tmp_path):
    d = str(tmp_path)
    ctx, s, agg, raw = make(d)
    for i in range(5):
        assert s.push([(i % 2, i)], position=i + 1) == 1
        ctx.step()
    assert s.push([(9, 9)], position=5) == 0  # already recorded: a duplicate delivery
    rep = ctx.report()
    assert rep["last_checkpoint"]["step"] in (2, 4) and rep["last_checkpoint"]["bytes"] > 0
    view = agg.view_dict()
    # a crash: the process vanishes without close (the lock is dropped as by the kernel)
    ctx.durable.wait_checkpoint()
    ctx.circuit._lock.release()
    ctx2, s2, agg2, raw2 = make(d)
    ctx2.open()
    assert ctx2.steps == 5 and ctx2.recorded_position("s") == 5
    assert ctx2.report()["fault_tolerance"]["replayed_steps"] == 5 - ctx2.durable.last_checkpoint.step
    assert agg2.view_dict() == view
    s2.push([(0, 100)], position=6)
    ctx2.step()
    ctx2.close()  # graceful: a last checkpoint, nothing left to replay
    ctx3, s3, agg3, _ = make(d)
    ctx3.open()
    assert ctx3.durable.replayed == 0 and ctx3.steps == 6
    assert agg3.view_dict()[(0, 4, 106, 100)] == 1
    ctx3.close()
    assert not glob.glob(os.path.join(d, "**", "*.mut"), recursive=True)


def test_replayed_source_skips_rows_fed_before(tmp_path):
    d = str(tmp_path)
    data = pa.table({"k": list(range(10)), "v": list(range(10))})
    ctx = StreamContext(storage=d, checkpoint_every=1, batching=3)
    ctx.stream(data, name="s").collect(name="raw")
    ctx.step()
    ctx.step()
    ctx.close()
    ctx = StreamContext(storage=d, checkpoint_every=1, batching=3)
    raw = ctx.stream(data, name="s").collect(name="raw")
    ctx.execute()
    assert raw.view_dict() == {(i, i): 1 for i in range(10)}
    ctx.close()
    got = {}
    for _, tables in read_outputs(os.path.join(d, "ft", "output")):
        for r in tables["raw"].to_pylist():
            got[(r["k"], r["v"])] = got.get((r["k"], r["v"]), 0) + r["__weight"]
    assert got == {(i, i): 1 for i in range(10)}


def test_checkpoint_needs_a_durable_pipeline(tmp_path):
    ctx = StreamContext()
    with pytest.raises(RuntimeError, match="not durable"):
        ctx.checkpoint()
    with pytest.raises(ValueError, match="storage"):
        StreamContext(checkpoint_every=3)


class Pipeline(RuleBasedStateMachine):
    """Push, step, checkpoint, crash (drop the process's state without closing), restart,
    corrupt the latest checkpoint: the outputs logged always integrate to the reference model
    of the input steps run, every step logged exactly once."""

    @initialize()
    def setup(self):
        import tempfile
        self.dir = tempfile.mkdtemp()
        self.steps: list[dict] = []   # reference: every step's input Z-set
        self.pending: dict = {}
        self.open()

    def open(self):
        self.ctx, self.s, self.agg, self.raw = make(self.dir, checkpoint_every=None,
                                                    durable=True)
        self.ctx.open()

    @rule(rows=st.lists(st.tuples(st.integers(0, 3), st.integers(-3, 3)), max_size=4),
          delete=st.booleans())
    def push(self, rows, delete):
        w = -1 if delete else 1
        if delete:  # only rows held: a delete of a row never inserted is a RowError (issue 11)
            held = dict(self.pending)
            for st_ in self.steps:
                for r, x in st_.items():
                    held[r] = held.get(r, 0) + x
            keep = []
            for r in rows:
                if held.get(r, 0) > 0:
                    held[r] -= 1
                    keep.append(r)
            rows = keep
        if not rows:
            return
        self.s.push(pa.table({"k": [r[0] for r in rows], "v": [r[1] for r in rows]}),
                    [w] * len(rows))
        for r in rows:
            self.pending[r] = self.pending.get(r, 0) + w

    @rule()
    def step(self):
        self.ctx.step()
        self.steps.append({r: w for r, w in self.pending.items() if w})
        self.pending = {}

    @rule()
    def checkpoint(self):
        self.ctx.checkpoint()

    @rule()
    def crash(self):
        self.ctx.durable.wait_checkpoint()
        self.ctx.circuit._lock.release()  # what the kernel does when the process dies
        self.pending = {}  # pushed, not stepped: never recorded, gone with the process
        self.open()

    @rule()
    def corrupt_latest_and_restart(self):
        self.ctx.close()  # a last checkpoint; then damage it: the previous one must not be used
        self.pending = {}
        if len(self.ctx.durable.store.checkpoints) < 2:  # none to fall back to: just restart
            self.open()
            return
        cps = sorted(glob.glob(os.path.join(self.dir, "ckpt-*", "worker-0.state")),
                     key=os.path.getmtime)
        p = cps[-1]
        data = bytearray(open(p, "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(p, "wb").write(bytes(data))
        bad = make(self.dir, checkpoint_every=None, durable=True)[0]
        with pytest.raises(CheckpointCorrupt):
            bad.open()
        bad.circuit.close()
        # the operator repairs by hand: the damaged checkpoint is dropped from the disk and the
        # catalog; the earlier one (and the input log kept since it) still recovers exactly
        import json
        import shutil
        import zlib
        cat_path = os.path.join(self.dir, "checkpoints.json")
        doc = json.loads(open(cat_path).read())
        name = os.path.basename(os.path.dirname(p))
        doc["catalog"]["checkpoints"] = [c for c in doc["catalog"]["checkpoints"]
                                         if c["name"] != name]
        body = json.dumps(doc["catalog"], sort_keys=True).encode()
        doc["crc32"] = zlib.crc32(body)
        open(cat_path, "w").write(json.dumps(doc))
        shutil.rmtree(os.path.dirname(p))
        self.open()

    @invariant()
    def output_log_matches_reference(self):
        want_raw = ref.integrate(self.steps)
        assert self.ctx.steps == len(self.steps)
        got: dict = {}
        recs = read_outputs(os.path.join(self.dir, "ft", "output"))
        assert [s for s, _ in recs] == list(range(len(recs)))
        for _, tables in recs:
            t = tables.get("raw")
            if t is not None:
                for r in t.to_pylist():
                    k = (r["k"], r["v"])
                    got[k] = got.get(k, 0) + r["__weight"]
        assert {k: w for k, w in got.items() if w} == want_raw
        assert self.raw.view_dict() == want_raw
        want_agg = ref.aggregate(want_raw, [0], [("count", None), ("sum", 0), ("max", 0)])
        assert self.agg.view_dict() == want_agg

    def teardown(self):
        import shutil
        try:
            self.ctx.close()
        except Exception:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


TestPipeline = Pipeline.TestCase
TestPipeline.settings = settings(max_examples=15, stateful_step_count=15, deadline=None)


def test_graceful_close_leaves_no_orphan_file(tmp_path):
    """Merges into files run while the pipeline steps; close waits for them, takes a last
    checkpoint and removes every file no checkpoint names (and every temporary)."""
    import json

    from dbsp.storage.config import StorageConfig
    d = str(tmp_path)
    cfg = StorageConfig(d, min_file_rows=32, merge_process_rows=None)
    ctx = StreamContext(storage=cfg, checkpoint_every=3)
    s = ctx.stream(SCHEMA, name="s")
    s.group_by("k").agg(n=count(), hi=max_("v")).collect(name="agg")
    s.join(s, on="k").collect(name="self_join")
    for i in range(40):
        s.push([(j % 5, i * 100 + j) for j in range(20)])
        ctx.step()
    ctx.close()
    cat = json.loads(open(os.path.join(d, "checkpoints.json")).read())["catalog"]
    named = {f for c in cat["checkpoints"] for f in c["files"]}
    on_disk = {os.path.relpath(p, d) for p in glob.glob(os.path.join(d, "worker-*", "*"))}
    assert on_disk == named and named
    assert not glob.glob(os.path.join(d, "**", "*.mut"), recursive=True)
    dirs = {os.path.basename(p) for p in glob.glob(os.path.join(d, "ckpt-*"))}
    assert dirs == {c["name"] for c in cat["checkpoints"]}


def test_a_rolled_back_step_is_not_logged(tmp_path):
    """A step that fails on bad data is rolled back by the circuit: its input-log record is
    retracted, so a restart does not replay it, and the next step takes its number."""
    d = str(tmp_path)
    ctx = StreamContext(storage=d, durable=True)
    s = ctx.stream(SCHEMA, name="s")
    s.select("k", q=col("v") * 2**62).collect(name="q")
    s.push([(1, 1)], position=1)
    ctx.step()
    s.push([(2, 5)], position=2)  # overflows in the map: the step fails and is rolled back
    with pytest.raises(Exception):
        ctx.step()
    assert ctx.durable.input_log.end == 1 and ctx.recorded_position("s") == 1
    s.push([(3, 1)], position=3)
    ctx.step()
    ctx.close()
    steps = [s_ for s_, _ in read_outputs(os.path.join(d, "ft", "output"))]
    assert steps == [0, 1]


def test_unchanged_integrate_is_not_rewritten_by_the_next_checkpoint(tmp_path):
    """integrate keeps its integral as one batch: a checkpoint writes it once; a checkpoint
    after steps that did not change it references the same file (only the state file is new)."""
    ctx = StreamContext(storage=str(tmp_path), durable=True)
    s = ctx.stream(pa.schema([("k", pa.int64())]), name="s")
    s.integrate().collect(name="i", view=False)
    s.push([(i,) for i in range(50_000)])
    ctx.step()
    first = ctx.checkpoint()
    assert first.bytes > 400_000  # 50K keys and weights
    ctx.step()
    again = ctx.checkpoint()
    assert again.bytes < 10_000 and set(again.files) == set(first.files)
    s.push([(-1,)])
    ctx.step()
    assert ctx.checkpoint().bytes > 400_000  # changed: the new integral is written
    ctx.close()


def test_pause_does_not_pickle_large_values(tmp_path):
    """The pause only references the operators' state: a large non-spine value (differentiate's
    previous value) is pickled by the writer, not at the step boundary."""
    from dbsp.checkpoint import state as cs
    ctx = StreamContext(storage=str(tmp_path), durable=True)
    s = ctx.stream(pa.schema([("k", pa.int64())]), name="s")
    s.integrate().differentiate().collect(name="d", view=False)
    s.push([(i,) for i in range(200_000)])
    ctx.step()
    calls = []
    dump = cs._Pickler.dump

    def spy(self, obj):
        calls.append(obj)
        return dump(self, obj)
    cs._Pickler.dump = spy
    try:
        d = ctx.durable
        pc = d.store.begin(ctx.circuit, d.step_no)  # the pause
        assert calls == []  # nothing serialised at the step boundary
        pc.finish()  # the writer
        assert calls
    finally:
        cs._Pickler.dump = dump
    ctx.close()


def _crash(ctx):
    """The process vanishes without close (its lock dropped as by the kernel), after the
    checkpoint being written is published."""
    ctx.durable.wait_checkpoint()
    ctx.circuit._lock.release()


def test_checkpoint_cadence_counts_from_the_last_checkpoint_across_recoveries(tmp_path):
    """A pipeline that crashes every two steps with ``checkpoint_every=3``: each recovery
    counts the steps it replays as steps since the restored checkpoint, so the next one comes
    at the cadence and no replay is longer than 3 steps (when the count restarted at each
    open, the checkpoint never came and the replays grew 2, 4, 6, ...)."""
    d = str(tmp_path)
    ctx, s, agg, _ = make(d, checkpoint_every=3)
    for i in range(5):
        s.push([(i % 2, i)])
        ctx.step()
    ctx.durable.wait_checkpoint()
    assert ctx.durable.last_checkpoint.step == 3
    _crash(ctx)
    replays = []
    i = 5
    for _ in range(4):
        ctx, s, agg, _ = make(d, checkpoint_every=3)
        ctx.open()
        rec = ctx.durable.recovery
        replays.append(rec["replayed_steps"])
        assert rec.get("checkpointed") is None  # fewer than 3 steps replayed
        for _ in range(2):
            s.push([(i % 2, i)])
            ctx.step()
            i += 1
        ctx.durable.wait_checkpoint()
        cp = ctx.durable.last_checkpoint.step
        assert ctx.steps - cp < 3, (ctx.steps, cp)  # a checkpoint at the cadence came
        assert cp % 3 == 0  # counted from the step of the first one, 3
        _crash(ctx)
    assert replays == [2, 1, 0, 2]  # from checkpoints 3, 6, 9, 9
    ctx, s, agg, _ = make(d, checkpoint_every=3)
    ctx.open()
    assert agg.view_dict() == {(k, len(vs), sum(vs), max(vs)): 1
                               for k, vs in ((k, range(k, i, 2)) for k in (0, 1))}
    ctx.close()


def test_checkpointing_is_said_before_the_step_count_reaches_a_checkpoint(tmp_path,
                                                                           monkeypatch):
    """``DurableCircuit.checkpointing`` is True from before the step count reaches a step that is
    checkpointed until that checkpoint is published or has failed: whoever sees a step count
    past ``last_checkpoint`` while it is False knows a crash now replays steps (the crash
    tests kill replicas only then)."""
    from dbsp.ft.durable import DurableCircuit
    seen = []

    class StepNo:  # records (step count, checkpointing) at every change of the count
        def __get__(self, d, owner=None):
            return d.__dict__["step_no"]

        def __set__(self, d, v):
            d.__dict__["step_no"] = v
            seen.append((v, d.__dict__.get("checkpointing")))

    monkeypatch.setattr(DurableCircuit, "step_no", StepNo(), raising=False)
    ctx, s, _, _ = make(str(tmp_path), checkpoint_every=3)
    for i in range(7):
        s.push([(i % 2, i)])
        ctx.step()
        ctx.durable.wait_checkpoint()
        assert not ctx.durable.checkpointing
    assert [n for n, busy in seen if busy] == [3, 6], seen
    assert ctx.durable.last_checkpoint.step == 6

    def fail(*a, **k):
        raise OSError(5, "injected")
    monkeypatch.setattr(ctx.durable.output_log, "sync", fail)
    with pytest.raises(OSError):
        ctx.checkpoint()
    assert not ctx.durable.checkpointing  # a failed checkpoint is not being written any more
    monkeypatch.undo()
    ctx.close()


def test_a_long_replay_commits_a_checkpoint_before_new_input(tmp_path):
    """A recovery that replays ``checkpoint_every`` steps or more commits a checkpoint at its
    end, before any new input: a crash right after it replays nothing."""
    d = str(tmp_path)
    ctx, s, _, _ = make(d, checkpoint_every=100)
    for i in range(9):
        s.push([(i % 2, i)])
        ctx.step()
        if i == 1:
            ctx.checkpoint()
    assert ctx.durable.last_checkpoint.step == 2
    _crash(ctx)
    ctx, s, agg, _ = make(d, checkpoint_every=3)
    ctx.open()
    rec = ctx.durable.recovery
    assert (rec["checkpoint_step"], rec["replayed_steps"], rec["checkpointed"]) == (2, 7, 9)
    assert ctx.durable.last_checkpoint.step == 9
    view = agg.view_dict()
    _crash(ctx)
    ctx, s, agg, _ = make(d, checkpoint_every=3)
    ctx.open()
    rec = ctx.durable.recovery
    assert (rec["checkpoint_step"], rec["replayed_steps"], rec["checkpointed"]) == (9, 0, None)
    assert agg.view_dict() == view
    ctx.close()


class _Clock:
    """A wall clock the test moves by hand (starting at the real time: the input log's file
    times are real)."""

    def __init__(self):
        import time
        self.now = time.time()

    def __call__(self):
        return self.now


def _make_timed(d, clock, **kw):
    ctx, s, agg, raw = make(d, checkpoint_every=None, checkpoint_seconds=100, **kw)
    ctx.durable.clock = clock
    return ctx, s, agg, raw


def test_time_cadence_counts_from_the_last_checkpoint_across_recoveries(tmp_path):
    """``checkpoint_seconds=100``, 30 s a step by the clock, a crash every two steps (60 s, less
    than the cadence): each recovery counts the time since the restored checkpoint was taken
    (its wall time is in the catalog; before the first, since the first logged step), so
    checkpoints still come and replays stay short. When the time restarted at each open, no
    checkpoint ever came and the replays grew 2, 4, 6, 8."""
    d = str(tmp_path)
    clock = _Clock()
    replays, checkpoints = [], []
    i = 0
    for _ in range(5):
        ctx, s, agg, _ = _make_timed(d, clock)
        ctx.open()
        replays.append(ctx.durable.recovery["replayed_steps"])
        for _ in range(2):
            clock.now += 30
            s.push([(i % 2, i)])
            ctx.step()
            i += 1
        ctx.durable.wait_checkpoint()
        cp = ctx.durable.last_checkpoint
        checkpoints.append(None if cp is None else cp.step)
        _crash(ctx)
    # steps 0-3 at +30..+120 from the first logged step: a checkpoint at step 4 (age 120);
    # then steps 4-7 at +30..+120 from it: one at step 8
    assert checkpoints == [None, 4, 4, 8, 8], checkpoints
    assert replays == [0, 2, 0, 2, 0], replays
    ctx, s, agg, _ = _make_timed(d, clock)
    ctx.open()
    assert agg.view_dict() == {(k, len(vs), sum(vs), max(vs)): 1
                               for k, vs in ((k, range(k, i, 2)) for k in (0, 1))}
    ctx.close()


def test_a_recovery_past_the_time_cadence_commits_a_checkpoint_before_new_input(tmp_path):
    """A pipeline down longer than ``checkpoint_seconds`` since its last checkpoint was taken
    commits one at the end of its replay, before any new input; a checkpoint taken "in the
    future" (a clock set back) counts from now."""
    d = str(tmp_path)
    clock = _Clock()
    ctx, s, _, _ = _make_timed(d, clock)
    for i in range(3):
        clock.now += 10
        s.push([(i % 2, i)])
        ctx.step()
        if i == 0:
            ctx.checkpoint()
    taken = ctx.durable.last_checkpoint.time
    assert (ctx.durable.last_checkpoint.step, taken) == (1, clock.now - 20)
    _crash(ctx)
    clock.now += 85  # 105 s since step 1's checkpoint was taken
    ctx, s, agg, _ = _make_timed(d, clock)
    ctx.open()
    rec = ctx.durable.recovery
    assert (rec["checkpoint_step"], rec["replayed_steps"], rec["checkpointed"]) == (1, 2, 3)
    assert rec["checkpoint_age"] == 105
    assert ctx.durable.last_checkpoint.time == clock.now
    view = agg.view_dict()
    _crash(ctx)
    clock.now -= 1000  # the clock set back: the last checkpoint's time is ahead of it
    ctx, s, agg, _ = _make_timed(d, clock)
    ctx.open()
    rec = ctx.durable.recovery
    assert (rec["checkpoint_step"], rec["replayed_steps"], rec["checkpointed"],
            rec["checkpoint_age"]) == (3, 0, None, 0)
    assert agg.view_dict() == view
    clock.now += 99
    s.push([(0, 50)])
    ctx.step()
    ctx.durable.wait_checkpoint()
    assert ctx.durable.last_checkpoint.step == 3  # 99 s: not due yet
    clock.now += 1
    s.push([(0, 51)])
    ctx.step()
    ctx.durable.wait_checkpoint()
    assert ctx.durable.last_checkpoint.step == 5
    ctx.close()
