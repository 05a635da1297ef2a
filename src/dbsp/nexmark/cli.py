"""``dbsp nexmark``: run Nexmark queries on the embedded runtime, time them, verify them.

Every (query, worker count) runs in a process of its own, started by a fork server that holds
nothing but the imported modules, so the peak RSS reported is the query's own: never the
parent's generator tables or DuckDB reference results. Inside, the query is timed two ways in
one run:

* **end to end** (``e2e``): ``--generators`` processes of their own produce the events chunk by
  chunk (``--chunk`` events per step), as a source would run, and hand each chunk over as Arrow
  IPC in shared memory, read zero-copy (:mod:`dbsp.nexmark.source`); the query's main thread
  pushes each chunk and steps the circuit; the clock runs from the moment the generators may
  start to the last step's end. This is the rate the pipeline sustains with its source running,
  what Feldera and Flink publish. ``--generators 0`` puts the generator on a thread of the
  query's process instead (it then shares the pipeline's GIL).
* **push + step**: the sum, over steps, of the time spent pushing a chunk and stepping the
  circuit (the wait for the next chunk excluded).

The generator processes are started beside the query's process by the same fork server, so
neither's memory counts in the other's peak RSS.

Outputs go to a sink that keeps only the last step's change (a black hole), unless
``--verify``: then each query's integrated view is kept, sent back to the parent and compared,
row by row with multiplicities, with the same query computed from scratch by DuckDB over all
generated events (:mod:`dbsp.nexmark.reference`); any difference fails the run (exit 1). q10
writes Parquet files (its view is read back from them); q12's processing time comes from the
wall clock, or under ``--verify`` from a deterministic :class:`~dbsp.operators.proc_time.StepClock`
that the reference reproduces.

Published per-core figures of the Rust DBSP engine (Nexmark, 100M events, 8 cores; in
``../shared/research/feldera-anchors.md``) are printed beside ours as a ratio of per-core
end-to-end rates (our rate divided by the worker count).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import queue
import resource
import shutil
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Optional

import pyarrow as pa

from tqdm import tqdm

from .. import WEIGHT
from ..api import StreamContext
from ..operators.proc_time import StepClock, WallClock
from ..storage.config import StorageConfig
from .generator import (AUCTION_SCHEMA, BID_SCHEMA, PERSON_SCHEMA, SIDE_INPUT_SCHEMA,
                        EventReader, NexmarkGenerator, side_input)
from .queries import QUERIES, VARIANTS, QueryEnv
from .reference import compare_results, reference_results, step_proc_times
from .source import GeneratorChannel, GeneratorProcesses

RUST_DBSP_PER_CORE = {"q0": 1_173_000, "q1": 1_093_000, "q2": 1_094_000, "q3": 1_008_000,
                      "q4": 811_000}
ALL_QUERIES = ",".join(f"q{i}" for i in range(23))
DEFAULT_QUERIES = ALL_QUERIES
#: start of the deterministic processing-time clock under --verify, and its tick per step (ms)
PROC_CLOCK_START_MS = 1_436_918_400_000
PROC_CLOCK_TICK_MS = 1_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=1_000_000, help="events to generate")
    p.add_argument("--queries", default=DEFAULT_QUERIES,
                   help="comma-separated query names (default q0..q22; also q14_rows, q14 with "
                        "its user function called per row)")
    p.add_argument("--workers", default="1,2",
                   help="circuit replicas, or a comma-separated list of counts to run each "
                        "query with (default 1,2)")
    p.add_argument("--runtime", choices=["threads", "processes"], default="threads",
                   help="workers as threads of one process or as forked processes")
    p.add_argument("--chunk", type=int, default=100_000, help="events per step")
    p.add_argument("--generators", type=int, default=2, metavar="P",
                   help="generator processes feeding each query through shared memory "
                        "(default 2); 0: a generator thread inside the query's process")
    p.add_argument("--storage", metavar="DIR",
                   help="keep operator state beyond the memory budget in layer files under DIR")
    p.add_argument("--memory-budget", type=int, metavar="MB", default=None,
                   help="with --storage: memory for state (in-memory batches + block cache)")
    p.add_argument("--backend", default="auto",
                   help="with --storage: auto, uring, pread or mmap")
    p.add_argument("--out-dir", metavar="DIR",
                   help="where q10 writes its Parquet files (default: a temporary directory, "
                        "removed at the end)")
    p.add_argument("--checkpoint-seconds", type=float, default=None, metavar="S",
                   help="with --storage: exactly-once (input and output logs) and a checkpoint "
                        "every S seconds")
    p.add_argument("--compare-checkpoints", action="store_true",
                   help="with --storage and --checkpoint-seconds: run every query both without "
                        "and with checkpoints (alternating, --repeat times) and print the ratio "
                        "of the end-to-end rates")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="runs of each query (with --compare-checkpoints: pairs of runs); the "
                        "median is reported")
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


def _peak_mb() -> float:
    """Peak RSS of this process, plus the largest worker process's (``runtime="processes"``;
    each worker's peak is its own)."""
    own = _status_mb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    return own + kids


def _storage(args: argparse.Namespace, name: str):
    if not args.storage:
        return None
    name += getattr(args, "storage_tag", "")
    kw = {"backend": args.backend}
    if args.memory_budget is not None:
        kw["memory_budget_bytes"] = args.memory_budget << 20
    return StorageConfig(os.path.join(args.storage, name), **kw)


def _generate(gen, events: int, chunk: int, q: "queue.Queue", stop: threading.Event) -> None:
    """The source: put every chunk on ``q``, then ``None`` (an exception is put, too)."""
    try:
        for batch in gen.iter_batches(events, chunk):
            while not stop.is_set():
                try:
                    q.put(batch, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
        q.put(None)
    except BaseException as e:  # handed to the consumer, which re-raises it
        q.put(e)


@contextlib.contextmanager
def _source(channel: Optional[GeneratorChannel], args: argparse.Namespace):
    """The chunks, from the generator processes (``channel``) or from a generator thread."""
    if channel is not None:
        batches = channel.batches()
        try:
            yield batches
        finally:
            batches.close()
        return
    q: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    producer = threading.Thread(
        target=_generate, args=(NexmarkGenerator(seed=args.seed), args.events, args.chunk, q,
                                stop), name="nexmark-generator", daemon=True)

    def drain():
        producer.start()
        while True:
            batch = q.get()
            if batch is None:
                return
            if isinstance(batch, BaseException):
                raise batch
            yield batch
    try:
        yield drain()
    finally:
        stop.set()
        if producer.is_alive():
            producer.join()


def _table_bytes(table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def _read_table(data: bytes):
    return pa.ipc.open_stream(data).read_all()


def run_query(name: str, workers: int, args: argparse.Namespace, out_dir: str,
              channel: Optional[GeneratorChannel] = None) -> dict:
    """Build query ``name`` on ``workers`` workers, feed it ``args.events`` events from the
    generator processes behind ``channel`` (or, without one, from a generator thread), time it;
    with ``args.verify`` the result carries the view (Arrow IPC bytes under ``"view_ipc"``).
    Meant to run in a process of its own (:func:`run`)."""
    start_mb = _status_mb("VmRSS")
    load_start = os.getloadavg()[0]
    ctx = StreamContext(workers=workers, runtime=args.runtime, name=name,
                        storage=_storage(args, f"{name}-w{workers}"),
                        checkpoint_seconds=getattr(args, "checkpoint_seconds", None))
    # events arrive in event-time order: no lateness (a late event would be counted and dropped)
    # the input log records event ranges, not rows: recovery generates them again
    readers: dict = {}
    gen = NexmarkGenerator(seed=args.seed)
    streams = {kind: ctx.stream(gen_schema(kind), name=kind, time="date_time",
                                reread=EventReader(gen, kind, readers))
               for kind in ("person", "auction", "bid")}
    streams["side_input"] = ctx.stream(SIDE_INPUT_SCHEMA, name="side_input")
    clock = StepClock(PROC_CLOCK_START_MS, PROC_CLOCK_TICK_MS) if args.verify else WallClock()
    env = QueryEnv(out_dir=out_dir, clock=clock)
    built = {**QUERIES, **VARIANTS}[name](streams, env)
    sink = None
    if hasattr(built, "collect"):
        out = built.collect(name, view=bool(args.verify)).handle
    else:  # a file sink (q10)
        sink, out = built, None
    c = ctx.circuit
    push_step = 0.0
    bar = tqdm(total=args.events, desc=f"{name:>4} w{workers}", unit="ev", unit_scale=True,
               disable=args.no_progress, leave=True, file=sys.stderr)
    with c:
        streams["side_input"].push(side_input())  # the bounded side input, with step 0
        if channel is not None:
            channel.wait_ready()  # the processes have built their generators
        with _source(channel, args) as batches:
            t_start = time.perf_counter()
            for batch in batches:
                t0 = time.perf_counter()
                span = (batch.start_event, batch.start_event + batch.count)
                for kind, rb in batch.as_dict().items():
                    if rb.num_rows:
                        streams[kind].push(rb, span=span)
                ctx.step()
                push_step += time.perf_counter() - t0
                bar.update(batch.count)
        e2e = time.perf_counter() - t_start
        bar.close()
        peak = _peak_mb()
        result: dict[str, Any] = {
            "query": name, "workers": workers, "events": args.events,
            "e2e_seconds": e2e, "e2e_events_per_s": args.events / e2e if e2e else 0.0,
            "push_step_seconds": push_step,
            "push_step_events_per_s": args.events / push_step if push_step else 0.0,
            "steps": c.steps, "late_rows": sum(ctx.late_rows.values()),
            "state_rows": c.state_rows(), "peak_rss_mb": peak, "start_rss_mb": start_mb,
            # the machine's 1-minute load average when the query started and ended: figures
            # measured on a shared machine are read with it
            "load_avg": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        }
        if out is not None:
            result["output_rows"] = out.rows_out
        if ctx.durable is not None:
            result["checkpoints"] = len(ctx.durable.pauses)
            result["max_checkpoint_pause_s"] = ctx.durable.report()["max_pause_seconds"]
        if args.verify:
            view = out.view().to_arrow() if out is not None else sink.read()
            result["view_rows"] = view.num_rows
            result["view_ipc"] = _table_bytes(view)
    return result


def _child(name: str, workers: int, args: argparse.Namespace, out_dir: str, conn,
           channel: Optional[GeneratorChannel] = None) -> None:
    """Entry point of a query process: send :func:`run_query`'s result (or the error)."""
    try:
        conn.send(run_query(name, workers, args, out_dir, channel))
    except BaseException as e:  # reported by the parent
        conn.send({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
    finally:
        conn.close()


_FORKSERVER_PRELOAD = ["dbsp", "dbsp.api", "dbsp.nexmark.queries", "dbsp.nexmark.generator",
                       "dbsp.nexmark.source",
                       "pyarrow", "pyarrow.compute", "numpy", "tqdm"]


def run_one(name: str, workers: int, args: argparse.Namespace, out_dir: str) -> dict:
    """:func:`run_query` in a fresh process from the fork server (its memory is its own)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_FORKSERVER_PRELOAD)
    gens = args.generators
    source = GeneratorProcesses(args.events, args.chunk, seed=args.seed, processes=gens,
                                mp_context=ctx) if gens > 0 else contextlib.nullcontext()
    with source:
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(name, workers, args, out_dir, child,
                                             source.channel if gens > 0 else None),
                        name=f"nexmark-{name}-w{workers}")
        p.start()
        child.close()
        try:
            res = parent.recv()
        except EOFError:
            res = {"error": f"query process died (exit code {p.exitcode})"}
        p.join()
    res["generators"] = gens
    return res


def _run_repeated(name: str, workers: int, args: argparse.Namespace, out_dir: str) -> dict:
    """:func:`run_one` ``args.repeat`` times (the run with the median end-to-end rate is
    returned); with ``args.compare_checkpoints`` each repetition is a pair of runs, without and
    with checkpoints, in alternating order (the machine's load drifts), and the result is the
    run with checkpoints, carrying the median rate without them and the ratio of the medians.
    With several runs each gets a fresh storage directory, removed after it (a durable
    pipeline would resume from the last)."""
    modes = [None, args.checkpoint_seconds] if args.compare_checkpoints else \
        [args.checkpoint_seconds]
    runs: dict = {m: [] for m in modes}
    for r in range(args.repeat):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            a = argparse.Namespace(**vars(args))
            a.checkpoint_seconds = m
            several = len(modes) * args.repeat > 1  # (a single run leaves its state to see)
            a.storage_tag = f"-r{r}-{'ckpt' if m is not None else 'plain'}" if several else ""
            res = run_one(name, workers, a, out_dir)
            if a.storage and several:
                shutil.rmtree(os.path.join(a.storage, f"{name}-w{workers}{a.storage_tag}"),
                              ignore_errors=True)
            if "error" in res:
                return res
            runs[m].append(res)

    def median(rs: list) -> dict:
        return sorted(rs, key=lambda x: x["e2e_events_per_s"])[(len(rs) - 1) // 2]

    res = median(runs[modes[-1]])
    res["e2e_runs_events_per_s"] = [x["e2e_events_per_s"] for x in runs[modes[-1]]]
    if args.compare_checkpoints:
        plain = [x["e2e_events_per_s"] for x in runs[None]]
        base = median(runs[None])["e2e_events_per_s"]
        res["no_checkpoint_e2e_runs_events_per_s"] = plain
        res["no_checkpoint_e2e_events_per_s"] = base
        res["checkpoint_ratio"] = res["e2e_events_per_s"] / base if base else 0.0
        print(f"{name} (workers={workers}): end to end {base:,.0f} ev/s without checkpoints, "
              f"{res['e2e_events_per_s']:,.0f} ev/s with a checkpoint every "
              f"{args.checkpoint_seconds:g} s ({res.get('checkpoints', 0)} taken, max pause "
              f"{res.get('max_checkpoint_pause_s', 0.0) * 1e3:.1f} ms): ratio "
              f"{res['checkpoint_ratio']:.2f} (median of {args.repeat})", file=sys.stderr)
    return res


def gen_schema(kind: str):
    return {"person": PERSON_SCHEMA, "auction": AUCTION_SCHEMA, "bid": BID_SCHEMA}[kind]


def _reference_name(q: str) -> str:
    """The reference query a query (or a variant such as ``q14_rows``) is checked against."""
    return q.split("_", 1)[0]


def _reference(args, names: list[str]) -> dict:
    t0 = time.perf_counter()
    gen = NexmarkGenerator(seed=args.seed)
    tables = gen.tables(args.events)
    tables["side_input"] = side_input()
    tables["bid_proc_time"] = step_proc_times(
        args.events, args.chunk, StepClock(PROC_CLOCK_START_MS, PROC_CLOCK_TICK_MS), gen)
    ref = reference_results(tables, sorted({_reference_name(q) for q in names}))
    print(f"reference (DuckDB, from scratch over {args.events:,} events): "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return ref


def _parse_workers(s: str) -> list[int]:
    try:
        ws = [int(x) for x in str(s).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--workers must be a count or a comma-separated list of counts, "
                         f"got {s!r}") from None
    if not ws or any(w <= 0 for w in ws):
        raise ValueError(f"--workers counts must be positive, got {s!r}")
    return ws


def run(args: argparse.Namespace) -> int:
    known = {**QUERIES, **VARIANTS}
    names = [q.strip() for q in args.queries.split(",") if q.strip()]
    unknown = [q for q in names if q not in known]
    if unknown:
        print(f"dbsp nexmark: unknown queries {unknown}; known: {', '.join(known)}",
              file=sys.stderr)
        return 2
    try:
        worker_counts = _parse_workers(args.workers)
    except ValueError as e:
        print(f"dbsp nexmark: {e}", file=sys.stderr)
        return 2
    if args.events <= 0 or args.chunk <= 0 or args.repeat <= 0:
        print("dbsp nexmark: --events, --chunk and --repeat must be positive", file=sys.stderr)
        return 2
    if args.compare_checkpoints and args.checkpoint_seconds is None:
        print("dbsp nexmark: --compare-checkpoints needs --checkpoint-seconds S (and --storage)",
              file=sys.stderr)
        return 2
    if args.generators < 0:
        print(f"dbsp nexmark: --generators must be 0 (a thread) or a count of processes, "
              f"got {args.generators}", file=sys.stderr)
        return 2
    if (args.memory_budget is not None or args.backend != "auto" or
            args.checkpoint_seconds is not None) and not args.storage:
        print("dbsp nexmark: --memory-budget, --backend and --checkpoint-seconds need "
              "--storage DIR", file=sys.stderr)
        return 2
    refs = _reference(args, names) if args.verify else {}
    out_root = args.out_dir or tempfile.mkdtemp(prefix="dbsp-nexmark-")
    results: dict[str, dict[str, dict]] = {}
    failed = False
    try:
        for q in names:
            for w in worker_counts:
                res = _run_repeated(q, w, args, os.path.join(out_root, f"w{w}"))
                view = res.pop("view_ipc", None)
                if "error" in res:
                    print(f"{q} (workers={w}): FAILED: {res['error']}\n"
                          f"{res.get('traceback', '')}", file=sys.stderr)
                    failed = True
                elif args.verify:
                    diffs = compare_results(refs[_reference_name(q)], _read_table(view),
                                            actual_weight=WEIGHT)
                    res["verified"], res["differences"] = not diffs, diffs
                    if diffs:
                        print(f"{q} (workers={w}): result differs from the reference:",
                              file=sys.stderr)
                        for d in diffs:
                            print(f"  {d}", file=sys.stderr)
                        failed = True
                else:
                    res["verified"] = None
                results.setdefault(q, {})[str(w)] = res
    finally:
        if not args.out_dir:
            shutil.rmtree(out_root, ignore_errors=True)
    _print_table(results)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        doc = {"events": args.events, "workers": worker_counts, "runtime": args.runtime,
               "storage": args.storage, "memory_budget_mb": args.memory_budget,
               "chunk": args.chunk, "generators": args.generators, "seed": args.seed,
               "cpus": os.cpu_count(),
               "rust_dbsp_per_core": RUST_DBSP_PER_CORE,
               "queries": {q: {w: {k: v for k, v in r.items() if k != "traceback"}
                               for w, r in rs.items()} for q, rs in results.items()}}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    if failed:
        print("dbsp nexmark: FAILED", file=sys.stderr)
        return 1
    return 0


def _print_table(results: dict[str, dict[str, dict]]) -> None:
    head = (f"{'query':<9}{'W':>3}{'events':>12}{'e2e s':>8}{'e2e ev/s':>12}"
            f"{'push+step ev/s':>16}{'e2e /core':>11}{'Rust/core':>11}{'ratio':>7}"
            f"{'peak MB':>9}{'verified':>10}")
    print(head)
    print("-" * len(head))
    slow: list[str] = []
    for q, rs in results.items():
        for w, r in rs.items():
            if "error" in r:
                print(f"{q:<9}{w:>3}{'failed':>12}")
                continue
            per_core = r["e2e_events_per_s"] / int(w)
            if per_core < 1_000_000:
                slow.append(f"{q}/w{w}")
            rust = RUST_DBSP_PER_CORE.get(q)
            ver = {True: "yes", False: "NO", None: "-"}[r["verified"]]
            print(f"{q:<9}{w:>3}{r['events']:>12,}{r['e2e_seconds']:>8.2f}"
                  f"{r['e2e_events_per_s']:>12,.0f}{r['push_step_events_per_s']:>16,.0f}"
                  f"{per_core:>11,.0f}{(f'{rust:,}' if rust else '-'):>11}"
                  f"{(f'{per_core / rust:.2f}' if rust else '-'):>7}"
                  f"{r['peak_rss_mb']:>9.0f}{ver:>10}")
    if slow:
        print(f"below 1M events/s per core (end to end): {', '.join(slow)}")
