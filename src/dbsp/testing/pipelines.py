"""Sample pipelines (``build(circuit) -> {name: output}``) that the launcher and Spark tests and
benchmarks run on every runtime, and a deterministic input generator for them.

They live in the package (not the tests) so that any worker process that has dbsp installed,
a spawned ``dbsp worker`` or a Spark executor, can import them by name.

* :func:`join_agg_closure`: a join (bids with auctions on the auction id), an aggregate (count and
  sum of prices per category of that join) and a recursive query (transitive closure of edges);
* :func:`keyed_count`: one aggregate over a keyed stream, and :func:`join_avg`: bids joined with
  auctions and the average price per category, the parallel-efficiency workloads (inputs from
  :func:`keyed_events` and :func:`join_avg_steps`);
* (the Nexmark pipeline of the same tests is :mod:`dbsp.nexmark.pipelines`, beside its queries);
* :func:`crash_views`: the views of the crash harness (:mod:`dbsp.testing.crash`), for the
  kill tests of replicas on the launcher and on Spark;
* :func:`bids_files`, :func:`views_pushed`, :func:`views_sliced`: the bids of
  :func:`sample_steps` as files the workers read themselves (:mod:`dbsp.runtime.slices`), and
  the views step by step with the bids pushed through the driver or read by the workers.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..api import StreamContext, col, count, sum_


BIDS = pa.schema([pa.field("auction", pa.int64(), nullable=False),
                  pa.field("price", pa.int64(), nullable=False)])
AUCTIONS = pa.schema([pa.field("id", pa.int64(), nullable=False),
                      pa.field("category", pa.int64(), nullable=False)])
EDGES = pa.schema([pa.field("src", pa.int64(), nullable=False),
                   pa.field("dst", pa.int64(), nullable=False)])
EVENTS = pa.schema([pa.field("k", pa.int64(), nullable=False),
                    pa.field("v", pa.int64(), nullable=False)])


def _closure(paths, edges):
    step = paths.index_by(["dst"]).join(
        edges.index_by(["src"]), lambda k, l, r: {"src": l["src"], "dst": r["dst"]}, EDGES)
    return edges.plus(step).distinct()


def join_agg_closure(c) -> dict:
    bids = c.add_input("bids", BIDS)
    auctions = c.add_input("auctions", AUCTIONS)
    edges = c.add_input("edges", EDGES)
    joined = bids.index_by(["auction"]).join(auctions.index_by(["id"]))
    per_cat = joined.index_by(["category"]).aggregate(
        {"n": ("count", None), "total": ("sum", "price")})
    return {"join": joined.output(), "agg": per_cat.output(),
            "closure": c.recursive(_closure, edges).output()}


def keyed_count(c) -> dict:
    ev = c.add_input("events", EVENTS)
    return {"counts": ev.index_by(["k"]).aggregate(
        {"n": ("count", None), "s": ("sum", "v")}).output()}


def join_avg(c) -> dict:
    """``avg = (bids.index_by(auction) ⋈ auctions.index_by(id)).index_by(category).avg(price)``,
    read as deltas only (no integrated view)."""
    auctions = c.add_input("auctions", AUCTIONS)
    bids = c.add_input("bids", BIDS)
    joined = bids.index_by(["auction"]).join(auctions.index_by(["id"]))
    avg = joined.index_by(["category"]).aggregate({"avg_price": ("avg", "price")})
    return {"avg": avg.output(view=False)}


def join_avg_steps(events: int, steps: int, seed: int = 1, categories: int = 100) -> list[dict]:
    """``steps`` steps of about ``events`` events for :func:`join_avg`, ``{"auctions": batch,
    "bids": batch}``: one auction for every ten bids, each bid on an auction announced in the
    same step or earlier."""
    rng = np.random.default_rng(seed)
    a_per = max(1, events // 11)
    b_per = events - a_per
    out = []
    for s in range(steps):
        ids = np.arange(s * a_per, (s + 1) * a_per, dtype=np.int64)
        auc = (rng.random(b_per) * ((s + 1) * a_per)).astype(np.int64)
        out.append({"auctions": pa.record_batch([ids, rng.integers(0, categories, a_per)],
                                                schema=AUCTIONS),
                    "bids": pa.record_batch([auc, rng.integers(1, 10_000, b_per)],
                                            schema=BIDS)})
    return out


CRASH_EV = pa.schema([pa.field("seq", pa.int64(), nullable=False),
                      pa.field("k", pa.int64(), nullable=False),
                      pa.field("v", pa.int64(), nullable=False)])
CRASH_DIMS = pa.schema([pa.field("k", pa.int64(), nullable=False),
                        pa.field("w", pa.int64(), nullable=False)])


def _seq_k_v_w(b):
    return {"seq": b.column("seq"), "k": b.column("k"), "v": b.column("v"), "w": b.column("w")}


def crash_views(c) -> dict:
    """Inputs ``ev(seq, k, v)`` and ``dims(k, w)``; views ``ids`` (the live events), ``agg``
    (count, sum, min, max of v per k) and ``join`` (events with their dims row), with the
    columns the crash checker (:func:`dbsp.testing.crash.check`) expects."""
    ev = c.add_input("ev", CRASH_EV)
    dm = c.add_input("dims", CRASH_DIMS)
    agg = ev.index_by(["k"]).aggregate({"n": ("count", None), "s": ("sum", "v"),
                                        "lo": ("min", "v"), "hi": ("max", "v")})
    join = ev.index_by(["k"]).join(dm.index_by(["k"])).map(
        _seq_k_v_w, pa.schema([CRASH_EV.field("seq"), CRASH_EV.field("k"), CRASH_EV.field("v"),
                               CRASH_DIMS.field("w")]))
    return {"ids": ev.output("ids"), "agg": agg.output("agg"), "join": join.output("join")}


def sample_steps(nsteps: int = 5, seed: int = 7) -> list[dict]:
    """Per step, ``{input: (rows, weights)}`` for :func:`join_agg_closure`, with retractions."""
    rng = np.random.default_rng(seed)
    steps, live_bids, live_edges = [], [], []
    for s in range(nsteps):
        step: dict = {}
        bids = [(int(a), int(p)) for a, p in zip(rng.integers(0, 40, 200),
                                                 rng.integers(1, 1000, 200))]
        gone = live_bids[: len(live_bids) // 4]
        live_bids = live_bids[len(gone):] + bids
        step["bids"] = (bids + gone, [1] * len(bids) + [-1] * len(gone))
        if s < 2:
            auc = [(i, i % 7) for i in range(s * 20, s * 20 + 20)]
            step["auctions"] = (auc, [1] * len(auc))
        edges = [(int(a), int(b)) for a, b in zip(rng.integers(0, 30, 8), rng.integers(0, 30, 8))]
        gone_e = live_edges[:2] if s % 2 else []
        live_edges = live_edges[len(gone_e):] + edges
        step["edges"] = (edges + gone_e, [1] * len(edges) + [-1] * len(gone_e))
        steps.append(step)
    return steps


def keyed_events(n: int, keys: int, seed: int) -> pa.RecordBatch:
    """``n`` events of :data:`EVENTS` over ``keys`` keys."""
    rng = np.random.default_rng(seed)
    return pa.record_batch({"k": rng.integers(0, keys, n), "v": rng.integers(0, 100, n)},
                           schema=EVENTS)


def push_step(inputs: dict, step: dict) -> None:
    """Push one step of :func:`sample_steps` into ``inputs`` (input handles by name)."""
    for name, (rows, weights) in step.items():
        if rows:
            inputs[name].push(rows, weights=np.asarray(weights, dtype=np.int64))


def _table(schema: pa.Schema, rows: list, weights: list) -> pa.Table:
    cols = list(zip(*rows)) if rows else [[] for _ in schema]
    return pa.table({**{f.name: pa.array(c, f.type) for f, c in zip(schema, cols)},
                     "__weight": pa.array(weights, pa.int64())})


def bids_files(d: str, steps: list[dict], fmt: str = "parquet", group: int = 47):
    """Each step's bids of ``steps`` (:func:`sample_steps`) as one file (Parquet row groups or
    Arrow IPC record batches of ``group`` rows) under ``d``: a
    :class:`~dbsp.connectors.slices.FileSlices` whose step ``k`` is step ``k``'s bids."""
    import os

    import pyarrow.parquet as pq

    from ..connectors.slices import FileSlices
    os.makedirs(d, exist_ok=True)
    for s, stp in enumerate(steps):
        t = _table(BIDS, *stp["bids"])
        if fmt == "parquet":
            pq.write_table(t, os.path.join(d, f"bids-{s:03d}.parquet"), row_group_size=group)
        else:
            with pa.OSFile(os.path.join(d, f"bids-{s:03d}.arrow"), "wb") as f:
                with pa.ipc.new_file(f, t.schema) as w:
                    for b in t.to_batches(max_chunksize=group):
                        w.write_batch(b)
    return FileSlices(d)


def views_pushed(steps: list[dict], workers: int = 1) -> list[dict]:
    """:func:`join_agg_closure`'s changes step by step on an embedded circuit, every input
    pushed through the driver."""
    from ..runtime.circuit import Circuit
    from ..runtime.launcher import build_outputs
    with Circuit(workers=workers) as c:
        outs = build_outputs(c, join_agg_closure)
        got = []
        for stp in steps:
            push_step(c.inputs, stp)
            c.step()
            got.append({k: o.to_dict() for k, o in outs.items()})
    return got


def views_sliced(runner, outputs: dict, steps: list[dict], src) -> list[dict]:
    """The same with the bids read by the workers from ``src`` (:func:`bids_files`):
    ``runner`` is a circuit or a launched / Spark job whose ``bids`` input is sliced."""
    got = []
    for s, stp in enumerate(steps):
        push_step(runner.inputs, {k: v for k, v in stp.items() if k != "bids"})
        if not runner.read_slices("bids", src, s):
            raise AssertionError(f"the source has no step {s}")
        runner.step()
        got.append({k: o.to_dict() for k, o in outputs.items()})
    return got


def stream_bids_sliced(c) -> dict:
    """A stream-API pipeline function (``StreamContext(circuit=c)``) whose ``bids`` input is
    declared sliced (``ctx.stream(BIDS, name="bids", sliced=True)``): the job feeds it
    pieces (``job.read_slices``) that every worker reads itself. Views ``agg`` (count and sum of
    the price per auction) and ``hot`` (bids over 500)."""
    ctx = StreamContext(circuit=c)
    bids = ctx.stream(BIDS, name="bids", sliced=True)
    agg = bids.group_by("auction").agg(n=count(), total=sum_("price")).collect(name="agg")
    hot = bids.filter(col("price") > 500).select("auction", "price").collect(name="hot")
    return {"agg": agg.handle, "hot": hot.handle}
