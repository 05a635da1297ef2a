"""Layouts in checkpoints and cold layout changes (dbsp.checkpoint.reshard; seed 000, "Scale in
and out", "Layout changes"): a pipeline checkpointed with W workers resumes with W' and gives,
step for step, the output of a run that never changed scale; the layout is recorded with every
checkpoint and taken back on resume; only about 1/(W+1) of the state moves from W to W+1."""
from __future__ import annotations

import gc
import json
import os
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbsp.api import StreamContext
from dbsp.api.expr.aggregates import count, count_distinct, max_, min_, sum_
from dbsp.checkpoint.reshard import cut_batch
from dbsp.circuit.exchange import ShardMap, as_shard_map
from dbsp.trace.timed import OrdKeyBatch, OrdValBatch

@pytest.fixture(autouse=True)
def _collect():
    """Each test builds many circuits with storage; their batch files stay open until the
    cyclic garbage collector frees them, and a process runtime forked later inherits the
    descriptors. Collect now."""
    yield
    gc.collect()


A = pa.schema([("k", pa.int64()), ("v", pa.int64())])
B = pa.schema([("k", pa.int64()), ("w", pa.int64())])
E = pa.schema([("src", pa.int64()), ("dst", pa.int64())])


def build(ctx):
    a = ctx.stream(A, name="a")
    b = ctx.stream(B, name="b")
    e = ctx.stream(E, name="e")
    j = a.join(b, on="k")
    paths = e.iterate(lambda p, e: e.concat(
        p.join(e, left_on="dst", right_on="src").select("src", dst="dst_right")).distinct())
    outs = {
        "agg": a.group_by("k").agg(n=count(), t=sum_("v"), hi=max_("v"), lo=min_("v"),
                                   d=count_distinct("v")).collect(name="agg"),
        "join": j.collect(name="join"),
        "jagg": j.group_by("w").agg(n=count(), t=sum_("v")).collect(name="jagg"),
        "dist": a.select("v").distinct().collect(name="dist"),
        "topk": a.group_by("k").topk(2, by="v").collect(name="topk"),
        "paths": paths.collect(name="paths"),
    }
    return (a, b, e), outs


def make_steps(n, seed=1, keys=200, rows=200):
    r = random.Random(seed)
    live, steps = [], []
    for i in range(n):
        ins = [(r.randrange(keys), r.randrange(50)) for _ in range(rows)]
        dels = r.sample(live, min(len(live), rows // 8))
        for x in dels:
            live.remove(x)
        live += ins
        bins = [(r.randrange(keys), r.randrange(5)) for _ in range(rows // 10)]
        edges = [(r.randrange(30), r.randrange(30)) for _ in range(3)]
        steps.append((ins, dels, bins, edges))
    return steps


def run(ctx, ins, outs, steps):
    a, b, e = ins
    res = []
    for rows, dels, bins, edges in steps:
        a.insert(rows)
        if dels:
            a.delete(dels)
        b.insert(bins)
        e.insert(edges)
        ctx.step()
        res.append({n: o.delta_dict() for n, o in outs.items()})
    return res


def fixed_run(steps, workers=1):
    ctx = StreamContext(workers=workers)
    ins, outs = build(ctx)
    try:
        return run(ctx, ins, outs, steps)
    finally:
        ctx.close()


def scaled_run(d, steps, scales, runtime="threads", per=3):
    """Run ``steps`` in segments of ``per``, one segment per worker count of ``scales``,
    closing (a last checkpoint) and resuming between them; the outputs of every step, and the
    layout change of each resume."""
    got, changes = [], []
    for seg, W in enumerate(scales):
        ctx = StreamContext(workers=W, storage=d, durable=True, runtime=runtime)
        ins, outs = build(ctx)
        ctx.open()
        changes.append(ctx.report()["fault_tolerance"]["layout_change"])
        got += run(ctx, ins, outs, steps[seg * per:(seg + 1) * per])
        ctx.close()
    return got, changes


def catalog(d):
    with open(os.path.join(d, "checkpoints.json")) as f:
        return json.load(f)["catalog"]


def assert_same(ref, got):
    assert len(ref) == len(got)
    for i, (x, y) in enumerate(zip(ref, got)):
        for n in x:
            assert x[n] == y[n], f"step {i}, output {n}"


def test_scale_1_2_3_2_equals_a_fixed_scale_run(tmp_path):
    steps = make_steps(12)
    ref = fixed_run(steps)
    got, changes = scaled_run(str(tmp_path), steps, [1, 2, 3, 2])
    assert_same(ref, got)
    assert changes[0] is None  # nothing to resume
    for ch, (w0, w1) in zip(changes[1:], [(1, 2), (2, 3), (3, 2)]):
        assert (ch["from_workers"], ch["to_workers"]) == (w0, w1)
        assert ch["step"] == 3 * [1, 2, 3][[(1, 2), (2, 3), (3, 2)].index((w0, w1))]
        assert 0 < ch["moved_rows"] < ch["moved_rows"] + ch["kept_rows"]
        # the dynamic map moves about the minimum: the new worker's share 1/(W+1) on the way
        # out, the removed worker's share on the way in (hash % W would move W/(W+1))
        least = abs(w1 - w0) / max(w0, w1)
        print(f"{w0} -> {w1}: state moved {ch['moved_fraction']:.3f}, minimum {least:.3f}, "
              f"ratio {ch['moved_fraction'] / least:.2f}")
        assert ch["moved_fraction"] <= 1.2 * least, (ch, least)
    # the layout of the last checkpoint: the 1-worker map resized to 2, 3, then 2 workers
    last = catalog(str(tmp_path))["checkpoints"][-1]
    want = as_shard_map(1).resize(2).resize(3).resize(2)
    assert ShardMap.from_dict(last["layout"]["shards"]) == want
    assert len(last["layout"]["hosts"]) == 2


def test_resume_with_the_same_workers_takes_the_recorded_layout(tmp_path):
    d = str(tmp_path)
    steps = make_steps(6, seed=4, rows=100)
    ref = fixed_run(steps)
    got, changes = scaled_run(d, steps, [3, 2, 2], per=2)
    assert_same(ref, got)
    assert changes[2] is None  # same workers: no state moved
    # the resumed circuit shards by the recorded (resized) map, not the default one
    ctx = StreamContext(workers=2, storage=d, durable=True)
    build(ctx)
    ctx.open()
    assert ctx.circuit.layout == as_shard_map(3).resize(2) != as_shard_map(2)
    ctx.close()


def test_each_checkpoint_records_its_layout(tmp_path):
    d = str(tmp_path)
    steps = make_steps(4, seed=2)
    scaled_run(d, steps, [2, 3], per=2)
    cps = catalog(d)["checkpoints"]
    assert cps and all(c["layout"] is not None for c in cps)
    assert [c["layout"]["shards"]["workers"] for c in cps][-1] == 3
    # the layout change committed a checkpoint in the new layout at the step it resumed at,
    # before any input (the step-2 checkpoints: the 2-worker one closed, the 3-worker one)
    at2 = [c["layout"]["shards"]["workers"] for c in cps if c["step"] == 2]
    assert 3 in at2


@pytest.mark.parametrize("w0", [1, 2, 3, 5])
def test_scale_out_moves_about_one_share(tmp_path, w0):
    """W -> W+1 with the dynamic map moves at most 1.2x the minimum 1/(W+1) of the stored
    rows (uniform keys); hash % W would move W/(W+1)."""
    d = str(tmp_path)
    r = np.random.default_rng(w0)
    rows = [(int(k), int(v)) for k, v in zip(r.permutation(20000), r.integers(0, 9, 20000))]

    def once(W):
        ctx = StreamContext(workers=W, storage=d, durable=True)
        a = ctx.stream(A, name="a")
        a.group_by("k").agg(hi=max_("v")).collect(name="m")
        ctx.open()
        if W == w0:
            a.insert(rows)
            ctx.step()
        ch = ctx.report()["fault_tolerance"]["layout_change"]
        ctx.close()
        return ch

    once(w0)
    ch = once(w0 + 1)
    assert ch["moved_fraction"] <= 1.2 / (w0 + 1)
    assert ch["moved_fraction"] >= 0.8 / (w0 + 1)


@pytest.mark.slow
def test_processes_runtime_scales_too(tmp_path):
    steps = make_steps(6, seed=3)
    ref = fixed_run(steps)
    got, _ = scaled_run(str(tmp_path), steps, [2, 3, 1], runtime="processes", per=2)
    assert_same(ref, got)


# -- cutting timed batches (the state of nested circuits) -------------------------------------

@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 4), st.integers(0, 3),
                          st.integers(-2, 2).filter(bool)), max_size=40),
       st.integers(1, 4))
def test_cuts_of_timed_batches_partition_them(rows, workers):
    shards = as_shard_map(workers)
    keys = pa.record_batch({"k": pa.array([r[0] for r in rows], pa.int64())})
    vals = pa.record_batch({"v": pa.array([r[1] for r in rows], pa.int64())})
    times = np.array([r[2] for r in rows], np.int64)
    w = np.array([r[3] for r in rows], np.int64)
    for b in (OrdKeyBatch.from_parts(keys, times, w),
              OrdValBatch.from_parts(keys, vals, times, w)):
        owner = shards.worker_of(b.kcodes)
        total: dict = {}
        for x in range(workers):
            part = cut_batch(b, owner == x)
            for kv, wt in part.to_dict().items():
                assert kv not in total
                total[kv] = wt
            assert (shards.worker_of(part.kcodes) == x).all()
        assert total == b.to_dict()


def test_a_catalog_without_layouts_is_resharded_on_resume(tmp_path):
    """Checkpoints written before layouts were recorded (their state was sharded by
    ``hash % W``): a resume re-shards them by the current map, whatever the worker count."""
    import zlib
    d = str(tmp_path)
    steps = make_steps(4, seed=5, rows=100)
    ref = fixed_run(steps)
    got, _ = scaled_run(d, steps[:2], [2], per=2)
    path = os.path.join(d, "checkpoints.json")
    cat = catalog(d)
    for c in cat["checkpoints"]:
        del c["layout"]
    body = json.dumps(cat, sort_keys=True).encode()
    with open(path, "w") as f:
        json.dump({"catalog": cat, "crc32": zlib.crc32(body)}, f)
    more, changes = scaled_run(d, steps[2:], [2], per=2)
    assert changes[0]["from_workers"] == 2 and changes[0]["to_workers"] == 2
    assert_same(ref, got + more)


def test_a_delayed_input_dealt_sorted_to_index_by_is_resharded(tmp_path):
    """An input of columns without nulls read by a join reaches each worker as the split's
    sorted :class:`~dbsp.trace.batch.KeyedZSet`; one also held by a delay is state at the
    checkpoint, and a resume with another worker count cuts it as loose rows."""
    nn = pa.schema([pa.field("k", pa.int64(), nullable=False),
                    pa.field("v", pa.int64(), nullable=False)])

    def build_nn(ctx):
        a, b = ctx.stream(nn, name="a"), ctx.stream(nn, name="b")
        return (a, b), {"j": a.join(b, on="k").collect(name="j"),
                        "prev": b.delay().collect(name="prev")}

    def go(ctx, ins, outs, steps):
        res = []
        for s in steps:
            ins[0].insert([{"k": (i * 7 + s) % 13, "v": i + s} for i in range(20)])
            ins[1].insert([{"k": (i * 5 + s) % 13, "v": i * s} for i in range(30)])
            ctx.step()
            res.append({n: o.delta_dict() for n, o in outs.items()})
        return res

    ctx = StreamContext(workers=1)
    ins, outs = build_nn(ctx)
    ref = go(ctx, ins, outs, range(9))
    ctx.close()
    got = []
    for seg, W in enumerate([2, 3, 1]):
        ctx = StreamContext(workers=W, storage=str(tmp_path), durable=True)
        ins, outs = build_nn(ctx)
        ctx.open()
        got += go(ctx, ins, outs, range(3 * seg, 3 * seg + 3))
        ctx.close()
    assert_same(ref, got)
    assert any(r["prev"] for r in got)
