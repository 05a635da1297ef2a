"""The crash harness: a durable pipeline in a real child process, killed with ``kill -9`` at
random moments (or at named kill points), restarted until it finishes; a checker that reads only
the output log and classifies every row as ok / lost / duplicated / unexpected.

Run it: ``python -m dbsp.testing.crash --rounds 50`` (``--workers``, ``--every``,
``--events``, ``--kill-at NAME``; prints a summary line per round and a total).

The pipeline (:func:`child_main`): an input ``ev(seq, k, v)`` fed with a sequence-numbered
stream (event ``seq`` has ``k = seq % 7``, ``v = (seq * 7919) % 1000 - 500``; every fifth event
also retracts the event three before it, so min and max must handle retractions), and an input
``dims(k, w)`` filled once. The producer pushes each chunk with ``position=`` its last sequence
number + 1 and, after a restart, continues from the position the input log recorded. With
``--source reread`` the ``ev`` stream is re-readable (``ctx.stream(..., reread=...)``: the events
``[lo, hi)`` are computed again from their sequence numbers) and each push carries its
``span=(lo, hi)``: the input log records positions, not rows, and recovery reads them again
(:mod:`dbsp.ft.logs`). Views:

* ``ids``: the live events themselves (a loss or a duplicate of one event is one bad row);
* ``agg``: count, sum, min, max of ``v`` per ``k``;
* ``join``: events joined with ``dims`` on ``k``.

The checker (:func:`check`) integrates each view's deltas from the output log (each record
carries its step; the log holds every step once) and compares with the views computed directly
from the sequence: a row expected with weight 1 and found with weight 1 is *ok*, found with 0 is
*lost*, found with more is *duplicated*; a row found that is not expected is *unexpected*.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from ..api import StreamContext
from ..api.expr.aggregates import count, max_, min_, sum_
from ..ft import read_outputs
from ..runtime.circuit import Circuit
from ..runtime.launcher import build_outputs
from ..storage.config import StorageConfig
from .pipelines import CRASH_DIMS, CRASH_EV, crash_views

K = 7
EV_SCHEMA = [("seq", "int64"), ("k", "int64"), ("v", "int64")]


def event(seq: int) -> tuple[int, int, int]:
    return seq, seq % K, (seq * 7919) % 1000 - 500


def live_events(n: int, retract: bool = True) -> list[tuple[int, int, int]]:
    """The events alive after ``n`` were fed (every fifth retracts the one three before, unless
    not ``retract``: a stream of insertions only)."""
    dead = {s - 3 for s in range(n) if s % 5 == 4 and s >= 3} if retract else set()
    return [event(s) for s in range(n) if s not in dead]


def dims() -> list[tuple[int, int]]:
    return [(k, 100 + k) for k in range(K)]


def expected(n: int, retract: bool = True) -> dict[str, dict[tuple, int]]:
    ev = live_events(n, retract)
    agg: dict[int, list] = {}
    for _, k, v in ev:
        agg.setdefault(k, []).append(v)
    w = dict(dims())
    return {
        "ids": {e: 1 for e in ev},
        "agg": {(k, len(vs), sum(vs), min(vs), max(vs)): 1 for k, vs in agg.items()},
        "join": {(s, k, v, w[k]): 1 for s, k, v in ev},
    }


def events_table(lo: int, hi: int) -> Any:
    """Events ``[lo, hi)`` of the stream as one Arrow table, insertions only (no retraction, no
    ``__weight``): a source whose rows may be cut into steps in any order (the crash checker's
    ``check(..., retract=False)``)."""
    rows = [event(s) for s in range(lo, hi)]
    return pa.table({"seq": pa.array([r[0] for r in rows], pa.int64()),
                     "k": pa.array([r[1] for r in rows], pa.int64()),
                     "v": pa.array([r[2] for r in rows], pa.int64())})


def ev_table(lo: int, hi: int) -> Any:
    """The rows pushed for events ``[lo, hi)``: the events (weight 1), then the retractions of
    the events three before every fifth one (weight -1), with a ``__weight`` column."""
    ins = [event(s) for s in range(lo, hi)]
    dels = [event(s - 3) for s in range(lo, hi) if s % 5 == 4 and s >= 3]
    rows = ins + dels
    return pa.table({"seq": pa.array([r[0] for r in rows], pa.int64()),
                     "k": pa.array([r[1] for r in rows], pa.int64()),
                     "v": pa.array([r[2] for r in rows], pa.int64()),
                     "__weight": pa.array([1] * len(ins) + [-1] * len(dels), pa.int64())})


# -- the child ---------------------------------------------------------------------------------

def child_main(args: argparse.Namespace) -> int:
    every = args.every if args.every > 0 else None
    # small files and merges into files from a few hundred rows: state on disk, merges that
    # write files (the "merge-mid" kill point), checkpoints naming files written by merges
    storage = StorageConfig(args.dir, min_file_rows=64, merge_process_rows=None)
    ctx = StreamContext(workers=args.workers, storage=storage, checkpoint_every=every,
                        durable=True, runtime=args.runtime)
    reread = getattr(args, "source", "pushed") == "reread"
    ev = ctx.stream(pa.schema([(n, getattr(pa, t)()) for n, t in EV_SCHEMA]), name="ev",
                    reread=ev_table if reread else None)
    dm = ctx.stream(pa.schema([("k", pa.int64()), ("w", pa.int64())]), name="dims")
    ev.collect(name="ids")
    ev.group_by("k").agg(n=count(), s=sum_("v"), lo=min_("v"), hi=max_("v")).collect(name="agg")
    ev.join(dm, on="k").select("seq", "k", "v", "w").collect(name="join")
    ctx.open()
    if ctx.recorded_position("dims") is None:
        dm.push(dims(), position=1)
    pos = ctx.recorded_position("ev") or 0
    chunk = args.chunk
    while pos < args.events:
        hi = min(pos + chunk, args.events)
        ev.push(ev_table(pos, hi), position=hi, span=(pos, hi) if reread else None)
        ctx.step()
        pos = hi
    ctx.close()
    return 0


def step_input(step: int, events: int, chunk: int) -> Optional[dict]:
    """The input of step ``step`` of the harness's stream cut into steps of ``chunk`` events
    (step 0 also fills ``dims``): ``{input: (RecordBatch, weights)}``, None past the end. For
    drivers that feed :class:`dbsp.ft.coordinator.Coordinator` (replicas on the launcher or on
    Spark, :func:`dbsp.testing.pipelines.crash_views`)."""
    lo = step * chunk
    if lo >= events:
        return None
    hi = min(lo + chunk, events)
    rows = [event(s) for s in range(lo, hi)] + \
        [event(s - 3) for s in range(lo, hi) if s % 5 == 4 and s >= 3]
    w = np.r_[np.ones(hi - lo, np.int64), -np.ones(len(rows) - (hi - lo), np.int64)]
    cols = list(zip(*rows))
    out = {"ev": (pa.record_batch([pa.array(c, pa.int64()) for c in cols], schema=CRASH_EV), w)}
    if step == 0:
        d = dims()
        out["dims"] = (pa.record_batch([pa.array([r[0] for r in d], pa.int64()),
                                        pa.array([r[1] for r in d], pa.int64())],
                                       schema=CRASH_DIMS), np.ones(len(d), np.int64))
    return out


# -- the checker -----------------------------------------------------------------------------------

def read_views(directory: str) -> tuple[dict[str, Counter], int]:
    """Every view integrated from the output log alone, and the number of steps logged."""
    views: dict[str, Counter] = {"ids": Counter(), "agg": Counter(), "join": Counter()}
    recs = read_outputs(os.path.join(directory, "ft", "output"))
    for i, (step, tables) in enumerate(recs):
        if step != recs[0][0] + i:
            raise AssertionError(f"output log has a gap before step {step}")
        for name, t in tables.items():
            if name not in views:
                continue
            cols = [c for c in t.column_names if c not in ("__weight", "__step")]
            steps = t.column("__step").to_pylist()
            if any(s != step for s in steps):
                raise AssertionError(f"a row of record {step} carries another step")
            rows = zip(*[t.column(c).to_pylist() for c in cols])
            for r, w in zip(rows, t.column("__weight").to_pylist()):
                views[name][tuple(r)] += w
    return views, len(recs)


def check(directory: str, n: int, retract: bool = True) -> dict[str, int]:
    """Classify every row (see the module doc): counts of ok / lost / duplicated / unexpected.
    ``retract=False``: the stream had no retractions (events ``[0, n)`` inserted once each, in
    any order and division into steps: e.g. a DataFrame the workers read themselves)."""
    got, _ = read_views(directory)
    want = expected(n, retract)
    out = Counter(ok=0, lost=0, duplicated=0, unexpected=0)
    for name, rows in want.items():
        g = got[name]
        for r in rows:
            w = g.get(r, 0)
            out["ok" if w == 1 else "lost" if w <= 0 else "duplicated"] += 1
        for r, w in g.items():
            if w != 0 and r not in rows:
                out["unexpected"] += 1
    return dict(out)


# -- replicas elsewhere (the launcher, Spark) -----------------------------------------------------

def kill_replicas(job, rng, kills, stop, log, steps, pick=None, sig=signal.SIGKILL):
    """Kill a replica process (a Spark task's Python worker; ``pick(pid)``: the process to kill
    instead, e.g. its executor) of the running generation ``kills`` times, at random steps, each
    once the generation before has recovered, the job has a checkpoint and steps after it (so
    that every recovery reloads one and replays the log after it). ``log`` gets
    ``(generation, worker, step, pid, checkpoint)`` per kill: ``step`` the next step of the killed generation, ``checkpoint`` the
    step of its last checkpoint (None before the first)."""
    done = 0
    while done < kills and not stop.is_set():
        time.sleep(rng.uniform(0.1, 0.8))
        d = job.ft.durable if job.ft is not None else None
        pids = job.pids()
        if not pids or d is None or d is not job.durable or not d.opened:
            continue
        # read before and after the step count: a checkpoint of the step just reached, still
        # being written when the replica dies, may yet be published and leave nothing to replay
        busy = d.checkpointing
        step, cp = d.step_no, d.last_checkpoint
        if busy or d.checkpointing or step >= steps - 2 or cp is None or step <= cp.step:
            continue  # a checkpoint to reload, and logged steps after it to replay
        w = rng.choice(sorted(pids))
        victim = pick(pids[w]) if pick is not None else pids[w]
        try:
            os.kill(victim, sig)
        except ProcessLookupError:
            continue
        g = job.generation
        log.append((g, w, step, victim, cp.step))
        done += 1
        while not stop.is_set():
            d = job.ft.durable
            if job.generation > g and d is job.durable and d.opened:
                break
            time.sleep(0.05)


def run_killed(job, read, steps, kills, seed, pick=None):
    """Run ``job`` (a :class:`dbsp.ft.remote.DurableJob`) over ``read`` up to ``steps`` while
    :func:`kill_replicas` kills ``kills`` times; returns the kills
    ``(generation, worker, step, pid, checkpoint)``."""
    rng = random.Random(seed)
    stop, log = threading.Event(), []

    def paced(step, token):
        # until the kills are done and the last one has ended its generation, a step waits a
        # little: on a quiet machine the whole run would otherwise end before the killer's
        # first (randomly timed) look at it, or before Spark noticed a killed executor
        if (len(log) < kills or job.generation <= log[-1][0]) and not stop.is_set():
            time.sleep(0.2)
        return read(step, token)

    co = job.run(paced)
    t = threading.Thread(target=kill_replicas, args=(job, rng, kills, stop, log, steps, pick),
                         daemon=True)
    t.start()
    try:
        if co.stop(steps) != steps:
            raise AssertionError(f"the job stopped at step {co.step}, not {steps}")
    finally:
        stop.set()
        t.join()
    return log


def check_recoveries(job, kills, pieces_per_step=None,
                     checkpoint_every=None, checkpoint_seconds=None) -> list[dict]:
    """Assert that every kill of :func:`run_killed` was followed by a real recovery, as the
    driver's report (``job.report()["recoveries"]``) tells it: a later generation that restored
    a checkpoint no older than the killed generation's last one (when it had one), replayed the
    logged steps from there up to at least the step the kill interrupted, and, with
    ``pieces_per_step`` (the pieces of sliced sources each step logs), had its workers read
    again that many pieces of each replayed step (0: no sliced source). With
    ``checkpoint_every`` (the job's), no recovery replayed more than twice that many steps
    (:mod:`dbsp.ft.durable`: the cadence counts from the last committed checkpoint, however
    often the replicas die; one checkpoint may be lost while it is written). With
    ``checkpoint_seconds`` (the job's), every recovery that ended ``checkpoint_seconds`` or
    more after its restored checkpoint was taken (``checkpoint_age``, by the job's clock)
    committed a checkpoint before any new input. Returns the recoveries after the first opened
    generation's."""
    recs = job.report()["recoveries"]
    gens = [r["generation"] for r in recs]
    assert gens == sorted(set(gens)), recs  # (the first may be 2: 1 failed while forming)
    for r in recs:
        first = 0 if r["checkpoint_step"] is None else r["checkpoint_step"]
        assert r["step"] == first + r["replayed_steps"], r
        if pieces_per_step is not None:
            assert r["replayed_pieces"] == pieces_per_step * r["replayed_steps"], r
        if checkpoint_every is not None:
            assert r["replayed_steps"] <= 2 * checkpoint_every, (
                f"generation {r['generation']} replayed {r['replayed_steps']} steps with a "
                f"checkpoint every {checkpoint_every}", recs)
        if checkpoint_seconds is not None and r["checkpoint_age"] >= checkpoint_seconds:
            assert r["checkpointed"] == r["step"], (
                f"generation {r['generation']} recovered {r['checkpoint_age']:.1f} s after its "
                f"checkpoint was taken, with a checkpoint every {checkpoint_seconds} s, and "
                f"committed none before new input", recs)
    later = recs[1:]
    for g, w, step, pid, cp in kills:
        after = [r for r in later if r["generation"] > g]
        assert after, (f"kill of worker {w} (generation {g}, step {step}) was never recovered "
                       f"from", recs)
        r = after[0]  # the generation that recovered from it (or failed forming first)
        assert r["step"] >= step, (f"the recovery after the kill at step {step} resumed at "
                                   f"step {r['step']}: logged steps were not replayed", r)
        if cp is not None:
            assert r["checkpoint_step"] is not None and r["checkpoint_step"] >= cp, (
                f"the recovery after the kill at step {step} restored checkpoint "
                f"{r['checkpoint_step']}, not the killed generation's last ({cp})", r)
    return later


# -- layout changes: step by step against one worker that never changed scale -----------------------

def feed(job, steps: int, events: int, chunk: int) -> None:
    """Push and run up to ``steps`` more steps of the crash stream through the current
    generation of ``job`` (a :class:`dbsp.ft.remote.DurableJob` stepped by hand)."""
    d = job.durable
    for _ in range(steps):
        inp = step_input(d.step_no, events, chunk)
        if inp is None:
            return
        for name, part in inp.items():
            d.circuit.inputs[name].put_pending(*part)
        d.step()


def _rows(t: Any) -> Counter:
    cols = [c for c in t.column_names if c not in ("__weight", "__step")]
    out: Counter = Counter()
    for r, w in zip(zip(*[t.column(c).to_pylist() for c in cols]),
                    t.column("__weight").to_pylist()):
        out[tuple(r)] += w
    return +out


def logged_steps(directory: str) -> dict[int, dict[str, Counter]]:
    """Every step's changes, by view, as the output log of ``directory`` holds them (views
    that changed only)."""
    out = {}
    for s, tables in read_outputs(os.path.join(directory, "ft", "output")):
        rows = {n: _rows(t) for n, t in tables.items()}
        out[s] = {n: r for n, r in rows.items() if r}
    return out


def fixed_scale_steps(events: int, chunk: int) -> dict[int, dict[str, Counter]]:
    """The crash stream's changes step by step on one embedded worker (no layout change, no
    failure): what :func:`logged_steps` must give after any layout change."""
    got = {}
    with Circuit(workers=1) as c:
        outs = build_outputs(c, crash_views)
        s = 0
        while (inp := step_input(s, events, chunk)) is not None:
            for name, part in inp.items():
                c.inputs[name].put_pending(*part)
            c.step()
            rows = {k: _rows(o.delta().to_arrow()) for k, o in outs.items()}
            got[s] = {k: r for k, r in rows.items() if r}
            s += 1
    return got


def one_worker_steps(pipeline: Any, steps: list[dict]) -> dict[int, dict[str, Counter]]:
    """``pipeline``'s changes step by step on one embedded worker, fed ``steps`` (per step,
    ``{input: RecordBatch}``), by output name as the output log names them: what
    :func:`logged_steps` must give for a durable job fed the same steps at any scale."""
    got = {}
    with Circuit(workers=1) as c:
        outs = build_outputs(c, pipeline)
        for s, inp in enumerate(steps):
            for name, batch in inp.items():
                c.inputs[name].push(batch)
            c.step()
            rows = {o.name: _rows(o.delta().to_arrow()) for o in outs.values()}
            got[s] = {k: r for k, r in rows.items() if r}
    return got


def scale_run(job, scales: list[int], steps: list[dict], per: int) -> list[dict]:
    """Feed ``steps`` (per step, ``{input: RecordBatch}``) to ``job`` (a
    :class:`dbsp.ft.remote.DurableJob` on ``scales[0]`` workers, stepped by hand), ``per``
    steps per worker count of ``scales``, with a cold layout change (``job.relayout``) before
    each new count. Returns the changes (what ``relayout`` reported)."""
    d = job.open()
    changes = []
    for seg, W in enumerate(scales):
        if W != job.workers:
            changes.append(job.relayout(W))
            d = job.durable
        for inp in steps[seg * per:(seg + 1) * per]:
            for name, batch in inp.items():
                d.circuit.inputs[name].push(batch)
            d.step()
    return changes


def check_moved(changes: list[dict], title: str, within: float = 1.2) -> None:
    """Print the state moved at each layout change beside the minimum ``|W'-W| / max(W, W')``
    (``1/(W+1)`` for ``W -> W+1``; the removed worker's share for ``W+1 -> W``) and assert it
    is at most ``within`` times that (issue 13's target for the dynamic shard map; ``hash %
    W`` moves ``W/(W+1)``)."""
    print(f"\n{title}, state moved at each change (fraction of the stored rows):")
    for c in changes:
        w0, w1 = c["from_workers"], c["to_workers"]
        least = abs(w1 - w0) / max(w0, w1)
        print(f"  {w0} -> {w1}: {c['moved_fraction']:.3f}, minimum {least:.3f}, ratio "
              f"{c['moved_fraction'] / least:.2f} ({c['moved_rows']} of "
              f"{c['moved_rows'] + c['kept_rows']} rows), {c['seconds']:.1f} s")
    for c in changes:
        w0, w1 = c["from_workers"], c["to_workers"]
        assert 0 < c["moved_fraction"] <= within * abs(w1 - w0) / max(w0, w1), c


# -- the parent --------------------------------------------------------------------------------------

class _Forked:
    """A child made by ``fork`` from this (already imported) process: the same pipeline as the
    ``child`` command without an interpreter start per run (which dominated a round)."""

    def __init__(self, args: argparse.Namespace, env: dict):
        err = os.path.join(args.dir, "child.err")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.environ.clear()
                os.environ.update(env)
                code = child_main(args)
            except BaseException:
                import traceback
                with open(err, "w") as f:
                    traceback.print_exc(file=f)
            finally:
                os._exit(code)
        self.pid, self.err, self.returncode = pid, err, None

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is not None:  # reaped already
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG if deadline is not None else 0)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                return self.returncode
            if time.monotonic() >= deadline:  # type: ignore[operator]
                raise subprocess.TimeoutExpired("crash child", timeout)
            time.sleep(0.005)

    def communicate(self, timeout: Optional[float] = None) -> tuple[bytes, bytes]:
        self.wait(timeout)
        try:
            with open(self.err, "rb") as f:
                return b"", f.read()
        except FileNotFoundError:
            return b"", b""


#: seconds a whole run of the child took, unkilled, by its settings (:func:`run_round` draws
#: its kill moments within it)
_FULL_RUN: dict = {}


def run_round(seed: int, workers: int, every: int, events: int, chunk: int,
              kill_at: Optional[str] = None, kills: int = 3, runtime: str = "threads",
              keep: bool = False, max_starts: int = 30, fork: bool = True,
              source: str = "pushed") -> dict:
    """One round: a fresh directory, the child killed ``kills`` times at random moments (or at
    ``kill_at``, a named kill point, at a random passage of it), restarted until it finishes;
    then :func:`check`. ``fork``: children forked from this process (else a fresh
    interpreter each run: ``python -m dbsp.testing.crash child``). ``source``: ``pushed``
    (the input log holds the rows) or ``reread`` (it holds positions; see the module doc)."""
    if source not in ("pushed", "reread"):
        raise ValueError(f"source must be 'pushed' or 'reread', got {source!r}")
    rng = random.Random(seed)
    d = tempfile.mkdtemp(prefix="dbsp-crash-")
    cmd = [sys.executable, "-m", "dbsp.testing.crash", "child", "--dir", d,
           "--workers", str(workers), "--every", str(every), "--events", str(events),
           "--chunk", str(chunk), "--runtime", runtime, "--source", source]
    cargs = argparse.Namespace(dir=d, workers=workers, every=every, events=events, chunk=chunk,
                               runtime=runtime, source=source)
    starts = killed = self_killed = 0
    key = (workers, every, events, chunk, runtime, source, fork)
    t0 = time.monotonic()
    try:
        while True:
            starts += 1
            if starts > max_starts:
                raise RuntimeError(f"round {seed}: the child did not finish in {max_starts} starts")
            env = dict(os.environ)
            if kill_at and killed < kills:  # at a random passage of the point
                env["DBSP_KILL_AT"] = f"{kill_at}:{rng.randint(1, 4)}"
            else:
                env.pop("DBSP_KILL_AT", None)
            if fork:
                p: Any = _Forked(cargs, env)
            else:
                p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
            if not kill_at and killed < kills:
                # a random moment of the run: within the time a whole unkilled run of these
                # settings took (once seen), so a faster engine is still killed mid-run
                full = _FULL_RUN.get(key)
                if fork:
                    hi = 1.5 if full is None else max(0.1, min(1.5, 0.9 * full))
                    wait = rng.uniform(0.05, hi)
                else:
                    hi = 2.5 if full is None else max(0.5, min(2.5, 0.9 * full))
                    wait = rng.uniform(0.4, hi)
                started = time.monotonic()
                try:
                    p.wait(timeout=wait)
                    if starts == 1 and p.returncode == 0:  # a whole run, never killed
                        _FULL_RUN[key] = time.monotonic() - started
                except subprocess.TimeoutExpired:
                    os.kill(p.pid, signal.SIGKILL)
                    killed += 1
            _, err = p.communicate(timeout=300)
            if p.returncode == 0:
                break
            if p.returncode == -signal.SIGKILL:
                if kill_at:
                    killed += 1
                    self_killed += 1
                continue
            raise RuntimeError(f"round {seed}: the child failed (rc {p.returncode}):\n"
                               f"{err.decode(errors='replace')[-3000:]}")
        res = check(d, events)
        res.update(seed=seed, workers=workers, every=every, source=source, runtime=runtime,
                   starts=starts, killed=killed,
                   self_killed=self_killed, seconds=round(time.monotonic() - t0, 2))
        return res
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dbsp.testing.crash", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("child")
    c.add_argument("--dir", required=True)
    for p in (ap, c):
        p.add_argument("--workers", type=int, default=None)
        p.add_argument("--every", type=int, default=None)
        p.add_argument("--events", type=int, default=600)
        p.add_argument("--chunk", type=int, default=10)
        p.add_argument("--runtime", default="threads", choices=["threads", "processes"],
                       help="the workers' runtime (processes: a worker process each)")
        p.add_argument("--source", default="pushed", choices=["pushed", "reread", "both"],
                       help="pushed: the input log holds the rows; reread: positions of a "
                            "re-readable source; both: rounds alternate")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kill-at", default=None, help="a named kill point (dbsp.storage.faults)")
    ap.add_argument("--kills", type=int, default=3, help="kills per round")
    ap.add_argument("--exec", action="store_true",
                    help="start each child as a fresh interpreter (default: fork)")
    args = ap.parse_args(argv)
    if args.cmd == "child":
        if args.source == "both":
            ap.error("child: --source is pushed or reread")
        args.workers = args.workers or 1
        args.every = 3 if args.every is None else args.every
        return child_main(args)
    total = Counter()
    combos = [(w, e, src) for w in ([args.workers] if args.workers else [1, 2])
              for e in ([args.every] if args.every is not None else [1, 4, 10])
              for src in (["pushed", "reread"] if args.source == "both" else [args.source])]
    for r in range(args.rounds):
        w, e, src = combos[r % len(combos)]
        res = run_round(args.seed + r, w, e, args.events, args.chunk, args.kill_at, args.kills,
                        args.runtime, fork=not args.exec, source=src)
        print(res, flush=True)
        for k in ("ok", "lost", "duplicated", "unexpected", "killed", "starts"):
            total[k] += res[k]
    print("total", dict(total), flush=True)
    return 0 if total["lost"] == total["duplicated"] == total["unexpected"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
