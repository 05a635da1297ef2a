# Run:  python bench/workloads/scale_report.py [--keys 200000] [--steps 8] [--scales 1,2,3,2]
"""Scale in and out on one stream (issue 13; seed 000, "Scale in and out"): how much state a
cold layout change moves.

A join + aggregate pipeline (``bids`` joined with ``auctions`` on the auction id, then the
count, sum, max and count-distinct per auction, and the count per category) runs its steps in
segments, one per worker count of ``--scales``; between segments it is closed (a last
checkpoint) and resumed with the next worker count, which re-shards the checkpoint's state
(:mod:`dbsp.checkpoint.reshard`). Its output, step by step, must equal a run on one worker that
never changed scale (checked; the script fails otherwise).

For each change it prints the fraction of the stored rows of state that changed worker, beside

* the minimum: ``|W' - W| / max(W, W')`` (``1/(W+1)`` for ``W -> W+1``): the share the new
  worker must receive, or the removed worker's share;
* what the dynamic shard map predicts (the hash space that changes owner, ``ShardMap.moved``);
* what fixed sharding (S = 1024) would move, and what ``hash % W`` would move (``W/(W+1)`` in
  the limit), both over the same keys' codes.

The target (issue 13): the dynamic map within 1.2x the minimum.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from dbsp.algebra import kernels as K
from dbsp.algebra.codes import codec_for
from dbsp.api import StreamContext
from dbsp.api.expr.aggregates import count, count_distinct, max_, sum_
from dbsp.circuit.exchange import ShardMap, as_shard_map

BIDS = pa.schema([("auction", pa.int64()), ("price", pa.int64())])
AUCTIONS = pa.schema([("id", pa.int64()), ("category", pa.int64())])


def build(ctx):
    bids = ctx.stream(BIDS, name="bids")
    auctions = ctx.stream(AUCTIONS, name="auctions")
    j = bids.join(auctions, left_on="auction", right_on="id")
    outs = {"per_auction": bids.group_by("auction").agg(
                n=count(), t=sum_("price"), hi=max_("price"),
                d=count_distinct("price")).collect(name="per_auction", view=False),
            "per_category": j.group_by("category").agg(n=count()).collect(
                name="per_category", view=False)}
    return (bids, auctions), outs


def make_steps(keys: int, steps: int, seed: int = 7) -> list:
    r = np.random.default_rng(seed)
    out = []
    per = keys // steps
    for i in range(steps):
        ids = np.arange(i * per, (i + 1) * per, dtype=np.int64)
        auctions = pa.table({"id": ids, "category": r.integers(0, 50, len(ids))}, schema=AUCTIONS)
        n = 4 * per
        bids = pa.table({"auction": r.integers(0, (i + 1) * per, n),
                         "price": r.integers(1, 1000, n)}, schema=BIDS)
        out.append((bids, auctions))
    return out


def run(ctx, ins, outs, steps) -> list:
    res = []
    for bids, auctions in steps:
        ins[0].push(bids)
        ins[1].push(auctions)
        ctx.step()
        res.append({n: o.delta_dict() for n, o in outs.items()})
    return res


def minimum(w0: int, w1: int) -> float:
    return abs(w1 - w0) / max(w0, w1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=200_000, help="auctions over the whole run")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--scales", default="1,2,3,2")
    ap.add_argument("--runtime", default="threads", choices=["threads", "processes"])
    a = ap.parse_args(argv)
    scales = [int(x) for x in a.scales.split(",")]
    steps = make_steps(a.keys, a.steps)
    per = -(-len(steps) // len(scales))

    ctx = StreamContext(workers=1)
    ins, outs = build(ctx)
    ref = run(ctx, ins, outs, steps)
    ctx.close()

    codes = codec_for(pa.schema([("auction", pa.int64())])).encode(
        [pa.array(np.arange(a.keys, dtype=np.int64))], a.keys)
    got = []
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for seg, W in enumerate(scales):
            t0 = time.perf_counter()
            ctx = StreamContext(workers=W, storage=d, durable=True, runtime=a.runtime)
            ins, outs = build(ctx)
            ctx.open()
            ch = ctx.report()["fault_tolerance"]["layout_change"]
            resume = time.perf_counter() - t0
            got += run(ctx, ins, outs, steps[seg * per:(seg + 1) * per])
            ctx.close()
            if ch is not None:
                w0, w1 = ch["from_workers"], ch["to_workers"]
                dyn = as_shard_map(1)
                for x in scales[1:seg]:
                    dyn = dyn.resize(x)
                fixed = ShardMap.fixed(w0, 1024)
                modw = float(np.mean(K.shard(codes, w0) != K.shard(codes, w1)))
                rows.append((w0, w1, ch["moved_fraction"], minimum(w0, w1),
                             dyn.moved(dyn.resize(w1)), fixed.moved(fixed.resize(w1)), modw,
                             ch["moved_rows"], ch["moved_rows"] + ch["kept_rows"],
                             ch["reused_batches"], ch["cut_batches"], resume))
    same = len(ref) == len(got) and all(x == y for x, y in zip(ref, got))
    print(f"{a.keys} auctions, {4 * a.keys} bids in {a.steps} steps, scales {a.scales} "
          f"({a.runtime}); output equal to a 1-worker run: {same}")
    print(f"{'change':>8} {'moved':>7} {'min':>7} {'ratio':>6} {'dyn map':>8} {'fixed':>7} "
          f"{'hash%W':>7} {'rows moved / stored':>22} {'reused':>7} {'cut':>5} {'resume s':>9}")
    ok = same
    for w0, w1, mv, mn, dyn, fx, modw, moved, stored, reused, cut, sec in rows:
        ratio = mv / mn
        ok &= ratio <= 1.2
        print(f"{w0:>3} -> {w1:<2} {mv:7.3f} {mn:7.3f} {ratio:6.2f} {dyn:8.3f} {fx:7.3f} "
              f"{modw:7.3f} {moved:>10} / {stored:<10} {reused:7d} {cut:5d} {sec:9.2f}")
    print("target (moved <= 1.2x the minimum, output equal):", "met" if ok else "NOT met")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
