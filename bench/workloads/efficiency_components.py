# Compare two trees: PYTHONPATH=/path/to/old/src python bench/workloads/efficiency_components.py
#   --runtime processes --workload join_avg, then the same with this tree's src (alternate them)
"""What a second worker costs per step, by component (issues 13 and 14).

    python bench/workloads/efficiency_components.py [--runtime launcher] [--workload keyed_count]
        [--events 10000] [--steps 40] [--rounds 3] [--calls] [--floor]

For one runtime and workload, W = 1 and W = 2 run interleaved ``rounds`` times on the same
steps (each step's change read with ``delta()``, as :mod:`_efficiency` does), each run in a
process forked for it (``_efficiency.fresh``). CPU microseconds
a step are split into:

* ``split``: the driver dealing each input's rows to the workers (``InputStream._split``);
* ``step``: the driver inside the executor's step (sending inputs, waiting, reading replies;
  in the ``processes`` runtime that includes worker 0's own step; in ``threads`` every
  worker's step, as the process's CPU);
* ``gather``: the output handles taking the workers' parts (``OutputHandle._gather``);
* ``read``: ``delta()`` of every output (the driver's consolidation of the parts);
* ``workers``: CPU of the worker processes other than the driver (``launcher``, ``processes``);
* ``kernel``: the kernel's account of every process (``_efficiency.usage``, from ``/proc``):
  user and system CPU, minor page faults and context switches (voluntary: a wait for a
  message or a lock; involuntary: preempted) a step. Where ``total`` grows more than the
  workers' extra instructions explain, these say whether it is system time (sockets,
  wake-ups, faults) or user time running slower (cache misses of data moved between cores);
* ``threads`` (``threads`` runtime): CPU of each kind of thread of the process, from each
  thread's own CPU clock: the driver (worker 0 steps in it), the other workers' threads, the
  spine's background mergers, the rest; says whether a second worker's CPU is in the workers,
  in the mergers, or in the driver waiting for them;
* ``calls`` (``--calls``): the functions a second worker calls again, or only with W > 1
  (:func:`_wrap_calls`), each its thread's CPU with its callees and its calls a step: says
  which of a worker's fixed costs a second worker pays again in the threads runtime, where
  the ``operators`` clocks of a small step's greenlets also count the other workers' time;
* ``floor`` (``--floor``): W = 1 on steps of half the events as each worker's share, and W = 2
  against it: the ratio two workers would have if only their own per-step fixed cost were
  paid twice, and the rest (the parallel overhead) split into driver and workers
  (:func:`_floor`);
* ``ops``: per operator kind, the CPU seconds the workers spent in it, summed over workers
  (the scheduler's per-operator clock is switched to the thread's CPU clock for the
  measurement; worker processes forked by the ``processes`` runtime inherit the switch, the
  ``launcher``'s spawned ones do not: there the figures are wall seconds, an exchange's
  including its wait for the slowest peer).

``split``, ``gather`` and ``read`` run in the driver's thread and are its own CPU clock
(``time.thread_time``): a process clock would charge them the spines' background merges that
ran meanwhile on the other core. ``step`` and ``driver`` are CPU of the whole process
(``time.process_time``), so in ``threads`` they include what the worker threads ran meanwhile. Medians over rounds; the absolute figures
swing with the machine's load, the W = 2 - W = 1 differences within a round less so.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections import defaultdict

import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dbsp.operators.input import InputStream  # noqa: E402
from dbsp.operators.output import OutputHandle  # noqa: E402

import _efficiency as E  # noqa: E402
from dbsp.circuit import scheduler as _sched  # noqa: E402


_sched.CLOCK = "thread"  # each operator timed by its thread's CPU clock

PHASES = ("split", "step", "gather", "read")


class _Clock:
    """Thread CPU seconds spent inside some methods, and their calls (patched for the
    measurement only)."""

    def __init__(self):
        self.acc: dict = defaultdict(float)
        self.calls: dict = defaultdict(int)
        self.on = False

    def wrap(self, owner, attr: str, phase: str):
        orig = getattr(owner, attr)
        clock = self

        def timed(*a, **kw):
            if not clock.on:
                return orig(*a, **kw)
            t0 = time.thread_time()
            try:
                return orig(*a, **kw)
            finally:
                clock.acc[phase] += time.thread_time() - t0
                clock.calls[phase] += 1
        setattr(owner, attr, timed)
        return orig


def _wrap_calls(clock: _Clock) -> list:
    """``--calls``: the functions a second worker calls again, or only with W > 1, each timed
    (its thread's CPU, callees included) under the label it is printed with. None of them
    waits in an exchange: in the threads runtime's small steps every worker is a greenlet of
    the driver's thread, so a function that waits there would be charged the other workers'
    operators too (as the ``operators`` section is). Functions called in worker processes are
    not seen (the launcher's workers are spawned; the processes runtime's forked ones keep
    their own counts): there only the driver's are."""
    from dbsp.operators import aggregate as agg, index as ix, input as inp, join, output as out
    from dbsp.trace import batch, spine
    labels = []
    for owner, attr, label in [
            (inp.InputStream, "push", "push (driver)"),
            (inp, "deal_sorted", "split: deal_sorted"),
            (ix.IndexOperator, "eval", "index_by"),
            (batch.OrdIndexedZSet, "from_keyed", "index_by: from_keyed"),
            (join, "match_trace", "join: match_trace"),
            (spine.Spine, "insert", "spine.insert"),
            (agg.LinearAggregateOperator, "_group", "aggregate: _group"),
            (agg.LinearAggregateOperator, "_pack", "aggregate: _pack (W>1)"),
            (agg.LinearAggregateOperator, "_sum_packed", "aggregate: _sum_packed (W>1)"),
            (agg.LinearAggregateOperator, "_step_numeric", "aggregate: _step_numeric"),
            (out, "_merge_disjoint", "read: _merge_disjoint (W>1)")]:
        clock.wrap(owner, attr, label)
        labels.append(label)
    return labels


def one_run(runtime: str, workload: str, workers: int, data: list, warm: int, clock: _Clock):
    circuit, job, one = E.open_run(runtime, workload, workers)
    orig_step = None
    try:
        for st in data[:warm]:
            one(st)
        ex = circuit._executor
        orig_step = ex.step
        t_in = [0.0]

        def timed_step(*a, **kw):
            t0 = time.process_time()
            try:
                return orig_step(*a, **kw)
            finally:
                t_in[0] += time.process_time() - t0
        ex.step = timed_step
        prof0 = _profile(circuit)
        pids = E.pids_of(circuit, runtime)
        u0 = E.usage(pids)
        th0 = _thread_cpu()
        c0 = E._cpu(circuit, runtime)
        d0 = time.process_time()
        clock.acc.clear()
        clock.calls.clear()
        clock.on = True
        for st in data[warm:]:
            one(st)
        clock.on = False
        driver = time.process_time() - d0
        total = E._cpu(circuit, runtime) - c0
        th1 = _thread_cpu()
        u1 = E.usage(pids)
        prof = _profile(circuit)
        ops: dict = defaultdict(float)
        for name, s in prof.items():
            ops[name] += s - prof0.get(name, 0.0)
        n = len(data) - warm
        out = {k: clock.acc[k] / n * 1e6 for k in ("split", "gather", "read")}
        out["calls"] = {k: (clock.acc[k] / n * 1e6, clock.calls[k] / n) for k in clock.calls
                        if k not in PHASES}
        out["step"] = t_in[0] / n * 1e6
        out["driver"] = driver / n * 1e6
        out["workers"] = (total - driver) / n * 1e6 if runtime != "threads" else 0.0
        out["total"] = total / n * 1e6
        out["ops"] = {k: v / n * 1e6 for k, v in ops.items()}
        out["threads"] = {k: (th1.get(k, 0.0) - th0.get(k, 0.0)) / n * 1e6
                          for k in set(th0) | set(th1)} if runtime == "threads" else {}
        out["kernel"] = {k: (u1[k] - u0[k]) / n * (1e6 if k in ("user", "sys") else 1)
                         for k in E.USAGE}
        return out
    finally:
        (job or circuit).close()


def _role(name: str) -> str:
    if name == "MainThread":
        return "driver (worker 0)"
    if name.startswith("dbsp-worker-"):
        return "workers 1.."
    if name.startswith("dbsp-merger"):
        return "mergers"
    return "other"


def _thread_cpu() -> dict:
    """CPU seconds so far of this process's Python threads, summed by :func:`_role` (each
    thread's CPU clock; a thread that ended is not counted)."""
    acc: dict = defaultdict(float)
    for t in threading.enumerate():
        try:
            acc[_role(t.name)] += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError):  # ended meanwhile, or not started
            pass
    return acc


def _profile(circuit) -> dict:
    acc: dict = defaultdict(float)
    for row in circuit.profile():
        acc[row["name"].split(":")[0]] += row["seconds"]
    return acc


def _floor(runtime: str, runs: dict) -> None:
    """``--floor``: W = 2 against what it would cost if the second worker paid only for its
    own share of the work. Each worker of W = 2 runs every operator on half the rows, so its
    reference is one worker on steps of half the events (``half``, same circuit and runtime);
    the driver's reference is W = 1's driver on the whole step. Per round:

    * ``floor`` = (driver(W = 1) + 2 x workers(half)) / total(W = 1): the ratio two workers
      would have with a free split, free exchanges and a free merge of their outputs (what is
      above 1 is each worker's per-step fixed cost, paid twice);
    * ``parallel overhead``: total(W = 2) minus that, in the driver (its split of each input,
      a message to and from each worker, the merge of the outputs' parts) and in the workers
      (exchanges, partial aggregates, and running from caches another process used last).

    Where the driver runs worker 0 (``threads``; ``processes`` at W = 1) it has no share of
    its own: the floor is then 2 x total(half) / total(W = 1) and the overhead is not split.
    ``_efficiency.py``'s ``floor`` is that formula with the half-size run always on the
    threads runtime: for the launcher it leaves the messages between processes out of the
    reference too, where this one keeps the runtime's own costs of one worker in it."""
    med = statistics.median
    own = runtime == "launcher"
    fl, od, ow, ot = [], [], [], []
    for r1, r2, rh in zip(runs[1], runs[2], runs["half"]):
        if own:
            ideal = r1["driver"] + 2 * rh["workers"]
            od.append(r2["driver"] - r1["driver"])
            ow.append(r2["workers"] - 2 * rh["workers"])
        else:
            ideal = 2 * rh["total"]
        fl.append(ideal / r1["total"])
        ot.append(r2["total"] - ideal)
    print("floor (W = 1 on half the events as each worker's share; medians over rounds):")
    h = runs["half"]
    print(f"  W = 1 on half the events: total {med(r['total'] for r in h):.0f} us a step"
          + (f" (driver {med(r['driver'] for r in h):.0f}, worker "
             f"{med(r['workers'] for r in h):.0f})" if own else ""))
    print(f"  floor {med(fl):.2f} (rounds {', '.join(f'{x:.2f}' for x in fl)}); CPU W2/W1 "
          f"{med(r2['total'] / r1['total'] for r1, r2 in zip(runs[1], runs[2])):.2f}")
    print(f"  parallel overhead {med(ot):.0f} us a step"
          + (f": driver {med(od):.0f}, workers {med(ow):.0f}" if own else ""))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runtime", default="launcher")
    ap.add_argument("--workload", default="keyed_count")
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--calls", action="store_true",
                    help="also time the functions a second worker calls again (see _wrap_calls)")
    ap.add_argument("--floor", action="store_true",
                    help="also run W = 1 on steps of half the events: what W = 2 would cost "
                         "if a second worker paid only its own share (see _floor)")
    a = ap.parse_args(argv)
    steps = a.steps or E.STEPS
    clock = _Clock()
    clock.wrap(InputStream, "_split", "split")
    clock.wrap(OutputHandle, "_gather", "gather")
    clock.wrap(OutputHandle, "delta", "read")
    labels = _wrap_calls(clock) if a.calls else []
    data = E.steps_of(a.workload, a.events, a.warm + steps)
    half = E.steps_of(a.workload, a.events // 2, a.warm + steps, seed=1000) if a.floor else None
    runs: dict = {1: [], 2: [], "half": []}
    for _ in range(a.rounds):   # each run in a process of its own (_efficiency.fresh)
        for w in (1, 2):
            runs[w].append(E.fresh(one_run, a.runtime, a.workload, w, data, a.warm, clock))
        if half is not None:
            runs["half"].append(E.fresh(one_run, a.runtime, a.workload, 1, half, a.warm,
                                        clock))
    med = statistics.median
    print(f"{a.runtime} {a.workload} {a.events} ev/step x{steps}, {a.rounds} rounds, load "
          f"{os.getloadavg()[0]:.1f}: CPU us a step (median)")
    keys = ["split", "step", "gather", "read", "driver", "workers", "total"]
    print(f"{'':10s} {'W=1':>9s} {'W=2':>9s} {'W2-W1':>9s}")
    for k in keys:
        m1, m2 = med(r[k] for r in runs[1]), med(r[k] for r in runs[2])
        print(f"{k:10s} {m1:9.0f} {m2:9.0f} {m2 - m1:9.0f}")
    print("kernel (/proc, all processes; user and sys in us, the rest counts, a step):")
    for k in E.USAGE:
        m1 = med(r["kernel"][k] for r in runs[1])
        m2 = med(r["kernel"][k] for r in runs[2])
        print(f"  {k:18s} {m1:9.0f} {m2:9.0f} {m2 - m1:9.0f}")
    roles = sorted(set().union(*(r["threads"] for rs in runs.values() for r in rs)))
    if roles:
        print("threads (CPU us a step, each thread's CPU clock):")
    for k in roles:
        m1 = med(r["threads"].get(k, 0.0) for r in runs[1])
        m2 = med(r["threads"].get(k, 0.0) for r in runs[2])
        print(f"  {k:18s} {m1:9.0f} {m2:9.0f} {m2 - m1:9.0f}")
    if labels:
        print("calls (us a step of the thread's CPU, callees included; calls a step):")
    for k in labels:
        t1, n1 = (med(r["calls"].get(k, (0.0, 0.0))[i] for r in runs[1]) for i in (0, 1))
        t2, n2 = (med(r["calls"].get(k, (0.0, 0.0))[i] for r in runs[2]) for i in (0, 1))
        print(f"  {k:30s} {t1:7.0f} {t2:7.0f} {t2 - t1:7.0f}   {n1:4.1f} {n2:4.1f}")
    if half is not None:
        _floor(a.runtime, runs)
    names = sorted(set().union(*(r["ops"] for rs in runs.values() for r in rs)))
    print("operators (CPU us a step, summed over workers; wall in the launcher):")
    for k in names:
        m1 = med(r["ops"].get(k, 0.0) for r in runs[1])
        m2 = med(r["ops"].get(k, 0.0) for r in runs[2])
        print(f"  {k:18s} {m1:9.0f} {m2:9.0f} {m2 - m1:9.0f}")


if __name__ == "__main__":
    main()
