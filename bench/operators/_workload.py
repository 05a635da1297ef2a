"""Shared data and circuits of the operator benchmarks (fixed seeds).

The workload: auctions ``(id, category)`` and bids ``(auction, price)``; each bid refers to an
auction announced in the same step or earlier. The query joins bids with auctions and keeps the
average price per category::

    avg = (bids.index_by(auction) ⋈ auctions.index_by(id)).index_by(category).avg(price)
"""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

import dbsp

AUCTIONS = pa.schema([pa.field("id", pa.int64(), False), pa.field("category", pa.int64(), False)])
BIDS = pa.schema([pa.field("auction", pa.int64(), False), pa.field("price", pa.int64(), False)])
CATEGORIES = 100


def iter_workload_steps(n_bids: int, n_auctions: int, steps: int, seed: int = 1):
    """``steps`` pairs ``(auctions batch, bids batch)``, auctions and bids spread evenly,
    generated one step at a time (so a memory benchmark does not hold the data)."""
    rng = np.random.default_rng(seed)
    a_per, b_per = n_auctions // steps, n_bids // steps
    cat = rng.integers(0, CATEGORIES, n_auctions, dtype=np.int64)
    for s in range(steps):
        ids = np.arange(s * a_per, (s + 1) * a_per, dtype=np.int64)
        auc = (rng.random(b_per) * ((s + 1) * a_per)).astype(np.int64)
        price = rng.integers(1, 10_000, b_per, dtype=np.int64)
        yield (pa.record_batch([ids, cat[ids]], schema=AUCTIONS),
               pa.record_batch([auc, price], schema=BIDS))


def workload_steps(n_bids: int, n_auctions: int, steps: int, seed: int = 1) -> list:
    """:func:`iter_workload_steps` as a list."""
    return list(iter_workload_steps(n_bids, n_auctions, steps, seed))


def build_query(c: dbsp.Circuit):
    """Inputs and the output handle (no integrated view: only deltas are read)."""
    auctions = c.add_input("auctions", AUCTIONS)
    bids = c.add_input("bids", BIDS)
    joined = bids.index_by(["auction"]).join(auctions.index_by(["id"]))
    avg = joined.index_by(["category"]).aggregate({"avg_price": ("avg", "price")})
    return auctions, bids, avg.output(view=False)



def with_history(c: dbsp.Circuit, n_bids: int = 200_000, n_auctions: int = 20_000,
                 steps: int = 20, seed: int = 1):
    """:func:`build_query` on ``c`` after ``steps`` steps of the workload (the history of the
    fixed-cost benchmarks and their profilers, generated before the first step): its handles."""
    history = workload_steps(n_bids, n_auctions, steps, seed)
    auctions, bids, out = build_query(c)
    for a, b in history:
        auctions.push(a)
        bids.push(b)
        c.step()
        out.delta()
    return auctions, bids, out

def run_workload(data: list, workers: int, runtime: str = "threads") -> float:
    """Seconds to feed every step (push, step, read the consolidated delta)."""
    with dbsp.Circuit(workers=workers, runtime=runtime) as c:
        auctions, bids, out = build_query(c)
        t0 = time.perf_counter()
        for a, b in data:
            auctions.push(a)
            bids.push(b)
            c.step()
            out.delta()
        return time.perf_counter() - t0


def wait_for_merges() -> None:
    """Let background spine merges finish (so a measurement starts from a settled state)."""
    from dbsp.trace import spine
    for sp in list(spine._spines):
        sp.wait_merges()


def in_forked_child(fn, *args):
    """``fn(*args)`` in a forked child (fresh allocator state, the peak RSS its own: a
    measurement that starts from this process's heap, not from what the runs before it left),
    its result sent back; an exception in the child is raised here with the child's traceback,
    and a child that dies without a result raises too."""
    import multiprocessing as mp
    import os
    import sys
    import traceback
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)

    def target(conn):
        try:
            conn.send(("ok", fn(*args)))
        except BaseException as e:  # reported to the parent
            conn.send(("error", repr(e) + "\n" + traceback.format_exc()))
        conn.close()
        os._exit(0)

    sys.stdout.flush()
    proc = ctx.Process(target=target, args=(child,))
    proc.start()
    child.close()
    try:
        kind, res = parent.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"the forked child died without a result (exit code "
                           f"{proc.exitcode})") from None
    proc.join()
    if kind == "error":
        raise RuntimeError(res)
    return res
