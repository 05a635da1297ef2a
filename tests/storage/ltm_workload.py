"""The larger-than-memory workload, run as a subprocess by test_larger_than_memory.py (and by hand).

Bids ``(auction, price)`` joined with auctions ``(id, category)``, then the average price per
category (the workload of ``bench/operators/_workload.py``), fed step by step from a generator so
the input is never held: the only large memory is the join's state (every bid, indexed by auction).

Modes:

* ``memory``: no storage. Prints the final per-category averages and the state's size (bytes of
  every spine batch at the end).
* ``baseline``: the fixed overhead: imports, a circuit with storage, its slab pool touched whole,
  and ``baseline_steps`` steps of the same step size (so one step's transient memory counts).
* ``disk``: with ``StorageConfig(dir, memory_budget_bytes=budget, backend=...)``.

Each prints one JSON line: ``result`` (category -> [avg, count]), ``maxrss`` (peak RSS in bytes,
``VmHWM``; see :func:`peak_rss`), ``ru_maxrss``, ``state_bytes``, ``seconds``, storage stats.

    python tests/storage/ltm_workload.py disk --bids 6000000 --budget-mib 32 --dir /tmp/x
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np
import pyarrow as pa

AUCTIONS = pa.schema([pa.field("id", pa.int64(), False), pa.field("category", pa.int64(), False)])
BIDS = pa.schema([pa.field("auction", pa.int64(), False), pa.field("price", pa.int64(), False)])
CATEGORIES = 100


def steps(n_bids: int, n_auctions: int, n_steps: int, seed: int = 7):
    """Yield ``(auctions, bids)`` per step: auctions spread evenly, each bid on an auction
    announced in its step or earlier."""
    a_per, b_per = n_auctions // n_steps, n_bids // n_steps
    cat = np.random.default_rng(seed).integers(0, CATEGORIES, n_auctions, dtype=np.int64)
    for s in range(n_steps):
        rng = np.random.default_rng((seed, s))
        ids = np.arange(s * a_per, (s + 1) * a_per, dtype=np.int64)
        auc = (rng.random(b_per) * ((s + 1) * a_per)).astype(np.int64)
        price = rng.integers(1, 10_000, b_per, dtype=np.int64)
        yield (pa.record_batch([ids, cat[ids]], schema=AUCTIONS),
               pa.record_batch([auc, price], schema=BIDS))


def peak_rss() -> int:
    """This process's peak RSS in bytes: ``VmHWM`` of ``/proc/self/status`` (the high-water mark
    of the address space exec created). ``ru_maxrss`` is not usable from a test: Linux carries the
    spawner's high-water mark into it across ``exec`` (``signal_struct.maxrss``), so a child of a
    500 MiB pytest process reports at least 500 MiB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def state_bytes() -> tuple[int, int]:
    """``(bytes of in-memory batches, bytes of batch files)`` over every spine at the end."""
    from dbsp.trace import spine
    mem = files = 0
    for sp in list(spine._spines):
        for b in sp.batches():
            if getattr(b, "is_file", False):
                files += b.file_bytes
            else:
                mem += b.nbytes_in_memory
    return mem, files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["memory", "baseline", "disk"])
    ap.add_argument("--bids", type=int, default=6_000_000)
    ap.add_argument("--auctions", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--baseline-steps", type=int, default=3)
    ap.add_argument("--budget-mib", type=float, default=32)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--round-mib", type=float, default=None, help="merge_round_bytes")
    ap.add_argument("--min-spill-kib", type=float, default=None, help="min_spill_bytes")
    ap.add_argument("--no-merge-helper", action="store_true", help="merge_process_rows=None")
    a = ap.parse_args(argv)

    import dbsp
    from dbsp.storage.config import StorageConfig
    from dbsp.trace import spine

    storage = None
    if a.mode != "memory":
        extra = {}
        if a.round_mib is not None:
            extra["merge_round_bytes"] = int(a.round_mib * (1 << 20))
        if a.min_spill_kib is not None:
            extra["min_spill_bytes"] = int(a.min_spill_kib * 1024)
        if a.no_merge_helper:
            extra["merge_process_rows"] = None
        storage = StorageConfig(a.dir, memory_budget_bytes=int(a.budget_mib * (1 << 20)),
                                backend=a.backend, **extra)
    t0 = time.perf_counter()
    res: dict = {}
    with dbsp.Circuit(storage=storage) as c:
        auctions = c.add_input("auctions", AUCTIONS)
        bids = c.add_input("bids", BIDS)
        joined = bids.index_by(["auction"]).join(auctions.index_by(["id"]))
        out = joined.index_by(["category"]).aggregate(
            {"avg_price": ("avg", "price"), "n": ("count", None)}).output(view=False)
        n_steps = a.baseline_steps if a.mode == "baseline" else a.steps
        if a.mode == "baseline":
            from dbsp.storage.manager import backend_for
            pool = getattr(backend_for(storage), "pool", None)
            if pool is not None:  # every slot of the block cache resident, as at worst
                np.frombuffer(pool, dtype=np.uint8)[:] = 1
        for s, (au, bi) in enumerate(steps(a.bids, a.auctions, a.steps)):
            if s >= n_steps:
                break
            auctions.push(au)
            bids.push(bi)
            c.step()
            for row, w in out.delta().to_dict().items():
                res[row] = res.get(row, 0) + w
        seconds = time.perf_counter() - t0
        in_memory, in_files = state_bytes()
        rows_in_files = sum(len(b) for sp in list(spine._spines) for b in sp.batches()
                            if getattr(b, "is_file", False))
        stats = c.storage_stats()
        from dbsp.trace.merge_helper import helpers_stats
        helpers = helpers_stats()
    final = {str(r[0]): [r[1], r[2]] for r, w in sorted(res.items()) if w}
    assert all(w == 1 for w in res.values() if w), "an aggregate row has weight != 1"
    print(json.dumps({"mode": a.mode, "result": final, "maxrss": peak_rss(),
        "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "state_bytes": in_memory + in_files, "state_in_memory_bytes": in_memory,
        "state_file_bytes": in_files, "rows_in_files": rows_in_files, "seconds": seconds,
        "storage": stats.get("memory", {}), "helpers": helpers,
        "files_written": sum(w["files_written"] for w in stats.get("workers", []))}))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (its allocations are not part of the run)


if __name__ == "__main__":
    raise SystemExit(main())
