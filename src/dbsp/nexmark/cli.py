"""``dbsp nexmark``: run Nexmark queries on the embedded runtime, time them, verify them.

Every query runs in its own forked process, so its peak memory is its own. Inside, events are
generated chunk by chunk (``--chunk`` events per step); the clock runs only around pushing a
chunk and stepping the circuit, never around generating it. With ``--verify`` the query's final
integrated view is compared, row by row with multiplicities, with the same query computed from
scratch by DuckDB over all generated events (:mod:`dbsp.nexmark.reference`); any difference
fails the run (exit 1) and is printed.

Published per-core figures of the Rust DBSP engine (Nexmark, 100M events, 8 cores; in
``../shared/research/feldera-anchors.md``) are printed beside ours as a ratio.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import time
from typing import Any

RUST_DBSP_PER_CORE = {"q0": 1_173_000, "q1": 1_093_000, "q2": 1_094_000, "q3": 1_008_000,
                      "q4": 811_000}
DEFAULT_QUERIES = "q0,q1,q2,q3,q4,q5,q6,q7,q8"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=1_000_000, help="events to generate")
    p.add_argument("--queries", default=DEFAULT_QUERIES,
                   help=f"comma-separated query names (default {DEFAULT_QUERIES}; also q9)")
    p.add_argument("--workers", type=int, default=2, help="circuit replicas (default 2)")
    p.add_argument("--runtime", choices=["threads", "processes"], default="threads",
                   help="workers as threads of one process or as forked processes")
    p.add_argument("--chunk", type=int, default=100_000, help="events per step")
    p.add_argument("--storage", metavar="DIR",
                   help="keep operator state beyond the memory budget in layer files under DIR")
    p.add_argument("--memory-budget", type=int, metavar="MB", default=None,
                   help="with --storage: memory for state (in-memory batches + block cache)")
    p.add_argument("--backend", default="auto",
                   help="with --storage: auto, uring, pread or mmap")
    p.add_argument("--seed", type=int, default=0, help="generator seed")
    p.add_argument("--verify", action="store_true",
                   help="compare every final result with DuckDB computing it from scratch")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status (MiB), 0 where unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _reset_peak() -> float:
    """Start a fresh high-water mark for this process; returns the RSS it starts from (MiB).

    A forked query process begins with its parent's resident pages (the generator's tables, and
    the DuckDB reference results under ``--verify``); resetting makes the peak the query's own
    plus what it inherited and still maps, and the start figure says how much that was."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status_mb("VmRSS")


def _peak_mb() -> float:
    """Peak RSS of this process since :func:`_reset_peak`, plus the largest worker process's
    (``runtime="processes"``; each worker's peak is its own)."""
    own = _status_mb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    return own + kids


def _run_query(name: str, args: argparse.Namespace, expected, conn) -> None:
    """Child process: build, feed, time, verify; send a result dict through ``conn``."""
    try:
        conn.send(_run_query_inner(name, args, expected))
    except BaseException as e:  # reported by the parent
        import traceback
        conn.send({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
    finally:
        conn.close()


def _run_query_inner(name: str, args: argparse.Namespace, expected) -> dict:
    from tqdm import tqdm

    import dbsp
    from ..api import StreamContext
    from .generator import NexmarkGenerator
    from .queries import QUERIES

    start_mb = _reset_peak()
    gen = NexmarkGenerator(seed=args.seed)
    ctx = StreamContext(workers=args.workers, runtime=args.runtime, name=name,
                        storage=_storage(args, name))
    # events arrive in event-time order: no lateness (a late event would be counted and dropped)
    streams = {kind: ctx.stream(gen_schema(kind), name=kind, time="date_time")
               for kind in ("person", "auction", "bid")}
    out = QUERIES[name](streams).collect(name).handle
    c = ctx.circuit
    seconds = 0.0
    bar = tqdm(total=args.events, desc=f"{name:>4}", unit="ev", unit_scale=True,
               disable=args.no_progress, leave=True, file=sys.stderr)
    with c:
        for batch in gen.iter_batches(args.events, args.chunk):
            t0 = time.perf_counter()
            for kind, rb in batch.as_dict().items():
                if rb.num_rows:
                    streams[kind].push(rb)
            ctx.step()
            seconds += time.perf_counter() - t0
            bar.update(batch.count)
        bar.close()
        result: dict[str, Any] = {
            "events": args.events, "seconds": seconds,
            "events_per_s": args.events / seconds if seconds else 0.0,
            "output_rows": out.rows_out, "steps": c.steps,
            "late_rows": sum(ctx.late_rows.values()), "state_rows": c.state_rows(),
        }
        if expected is not None:
            from .reference import compare_results
            view = out.view().to_arrow()
            diffs = compare_results(expected, view, actual_weight=dbsp.WEIGHT)
            result["verified"] = not diffs
            result["differences"] = diffs
            result["view_rows"] = view.num_rows
        else:
            result["verified"] = None
    result["peak_rss_mb"] = _peak_mb()
    result["start_rss_mb"] = start_mb
    return result


def _storage(args: argparse.Namespace, name: str):
    if not args.storage:
        return None
    from ..storage.config import StorageConfig
    kw = {"backend": args.backend}
    if args.memory_budget is not None:
        kw["memory_budget_bytes"] = args.memory_budget << 20
    return StorageConfig(os.path.join(args.storage, name), **kw)


def gen_schema(kind: str):
    from . import generator
    return {"person": generator.PERSON_SCHEMA, "auction": generator.AUCTION_SCHEMA,
            "bid": generator.BID_SCHEMA}[kind]


def _reference(args, names: list[str]) -> dict:
    from .generator import NexmarkGenerator
    from .reference import reference_results
    t0 = time.perf_counter()
    tables = NexmarkGenerator(seed=args.seed).tables(args.events)
    ref = reference_results(tables, names)
    print(f"reference (DuckDB, from scratch over {args.events:,} events): "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return ref


def run(args: argparse.Namespace) -> int:
    from .queries import QUERIES
    names = [q.strip() for q in args.queries.split(",") if q.strip()]
    unknown = [q for q in names if q not in QUERIES]
    if unknown:
        print(f"dbsp nexmark: unknown queries {unknown}; known: {', '.join(QUERIES)}",
              file=sys.stderr)
        return 2
    if args.events <= 0 or args.chunk <= 0 or args.workers <= 0:
        print("dbsp nexmark: --events, --chunk and --workers must be positive", file=sys.stderr)
        return 2
    if (args.memory_budget is not None or args.backend != "auto") and not args.storage:
        print("dbsp nexmark: --memory-budget and --backend need --storage DIR", file=sys.stderr)
        return 2
    refs = _reference(args, names) if args.verify else {}
    ctx = mp.get_context("fork")
    results: dict[str, dict] = {}
    failed = False
    for q in names:
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_run_query, args=(q, args, refs.get(q), child), name=f"nexmark-{q}")
        p.start()
        child.close()
        try:
            res = parent.recv()
        except EOFError:
            res = {"error": f"query process died (exit code {p.exitcode})"}
        p.join()
        if "error" in res:
            print(f"{q}: FAILED: {res['error']}\n{res.get('traceback', '')}", file=sys.stderr)
            failed = True
        elif res.get("verified") is False:
            print(f"{q}: result differs from the reference:", file=sys.stderr)
            for d in res["differences"]:
                print(f"  {d}", file=sys.stderr)
            failed = True
        results[q] = res
    _print_table(results, args)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        doc = {"events": args.events, "workers": args.workers, "runtime": args.runtime,
               "storage": args.storage, "memory_budget_mb": args.memory_budget,
               "chunk": args.chunk, "seed": args.seed, "cpus": os.cpu_count(),
               "queries": {q: {k: v for k, v in r.items() if k not in ("traceback",)}
                           for q, r in results.items()}}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    if failed:
        print("dbsp nexmark: FAILED", file=sys.stderr)
        return 1
    return 0


def _print_table(results: dict[str, dict], args) -> None:
    cores = min(args.workers, os.cpu_count() or 1)
    head = (f"{'query':<6}{'events':>12}{'seconds':>10}{'events/s':>14}{'per core':>12}"
            f"{'Rust/core':>11}{'ratio':>8}{'start MB':>10}{'peak MB':>10}{'verified':>10}")
    print(head)
    print("-" * len(head))
    for q, r in results.items():
        if "error" in r:
            print(f"{q:<6}{'failed':>12}")
            continue
        per_core = r["events_per_s"] / cores
        rust = RUST_DBSP_PER_CORE.get(q)
        ver = {True: "yes", False: "NO", None: "-"}[r["verified"]]
        print(f"{q:<6}{r['events']:>12,}{r['seconds']:>10.2f}{r['events_per_s']:>14,.0f}"
              f"{per_core:>12,.0f}{(f'{rust:,}' if rust else '-'):>11}"
              f"{(f'{per_core / rust:.2f}' if rust else '-'):>8}{r['start_rss_mb']:>10.0f}"
              f"{r['peak_rss_mb']:>10.0f}"
              f"{ver:>10}")
