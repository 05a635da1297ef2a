# Run:  python bench/operators/profile_aggregate_phases.py [--runtime threads] [--events 10000]
"""Where the linear aggregate's CPU goes, by phase, with 1 and with 2 workers (issue 14).

The join + per-category average (:func:`dbsp.testing.pipelines.join_avg`), ``--steps`` steps of
``--events`` events after 3 warm ones, W = 1 and W = 2 interleaved ``--rounds`` times. The
aggregate's methods and the kernels it calls are wrapped with a clock of the calling thread's
CPU (``time.thread_time``): in the ``threads`` runtime each worker thread's own time, so a wait
at the exchange's barrier costs nothing and the phases are summed over workers. In the
``processes`` runtime each forked worker measures its own phases and returns them through the
executor's ``apply`` (worker 0 is this process).

Phases are inclusive (``eval`` holds all the others; ``_exchange_partials`` holds
``_delta_partials``, ``shard_rows``, ``exchange`` and ``merge_sum_runs``), CPU µs a step summed
over workers, medians over rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workloads"))

import _efficiency as E  # noqa: E402
from dbsp.algebra import kernels as K  # noqa: E402
from dbsp.operators import aggregate as A  # noqa: E402
from dbsp.runtime import socket_transport, threads  # noqa: E402

_ACC: dict = defaultdict(float)
_LOCK = threading.Lock()
_ON = [False]


_INSIDE = threading.local()


def _wrap(owner, attr: str, label: str, outer: bool = False) -> None:
    """Clock ``owner.attr`` under ``label``; only while the aggregate's ``eval`` runs in this
    thread unless ``outer`` (the eval itself: kernels and ``take`` are shared with other
    operators)."""
    orig = getattr(owner, attr)

    def timed(*a, **kw):
        if not _ON[0] or not (outer or getattr(_INSIDE, "on", False)):
            return orig(*a, **kw)
        if outer:
            _INSIDE.on = True
        t0 = time.thread_time()
        try:
            return orig(*a, **kw)
        finally:
            dt = time.thread_time() - t0
            if outer:
                _INSIDE.on = False
            with _LOCK:
                _ACC[label] += dt
    setattr(owner, attr, timed)


def install() -> None:
    L = A.LinearAggregateOperator
    _wrap(L, "eval", "eval", outer=True)
    for m in ("_group", "_delta_partials", "_exchange_partials", "_step_numeric",
              "_emit_sorted"):
        _wrap(L, m, m)
    _wrap(A.VersionedRows, "get_numpy", "state.get_numpy")
    _wrap(A.VersionedRows, "_insert", "state._insert")
    _wrap(A, "shard_rows", "shard_rows")
    _wrap(A, "take", "take (Arrow)")
    for k in ("group_rows", "delta_partials", "merge_sum_runs", "combine_partials",
              "versioned_pairs", "pick_batch", "finish_emit", "take_batch"):
        _wrap(K, k, "K." + k)
    _wrap(threads.InProcTransport, "exchange", "transport.exchange")
    _wrap(socket_transport.SocketTransport, "exchange", "transport.exchange")


def _phases(switch=None) -> dict:
    """This process's accumulators; ``switch``: turn the clock on (True) or off (False) and
    clear it when turned on."""
    if switch is not None:
        _ON[0] = switch
        if switch:
            _ACC.clear()
    return dict(_ACC)


def _apply(replica, switch) -> dict:
    """:func:`_phases` in every worker process (the executor's ``apply``)."""
    return _phases(switch)


def one_run(runtime: str, workers: int, data: list, warm: int) -> dict:
    circuit, job, one = E.open_run(runtime, "join_avg", workers)
    try:
        for st in data[:warm]:
            one(st)
        multi = runtime == "processes" and workers > 1
        _phases(True)
        if multi:
            circuit._executor.apply(_apply, True)
        for st in data[warm:]:
            one(st)
        got = [_phases(False)]
        if multi:
            got = circuit._executor.apply(_apply, False)
        out: dict = defaultdict(float)
        for g in got:
            for k, v in g.items():
                out[k] += v / (len(data) - warm) * 1e6
        return out
    finally:
        (job or circuit).close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", default="threads", choices=("threads", "processes"))
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    install()
    warm = 3
    data = E.steps_of("join_avg", a.events, warm + a.steps)
    runs: dict = {1: [], 2: []}
    for _ in range(a.rounds):
        for w in (1, 2):
            runs[w].append(one_run(a.runtime, w, data, warm))
    med = statistics.median
    print(f"{a.runtime} join_avg {a.events} ev/step x{a.steps}, {a.rounds} rounds, load "
          f"{os.getloadavg()[0]:.1f}: aggregate(linear) CPU us a step, summed over workers")
    print(f"{'':24s} {'W=1':>8s} {'W=2':>8s} {'W2-W1':>8s}")
    names = sorted(set().union(*(r for rs in runs.values() for r in rs)),
                   key=lambda k: -med(r.get(k, 0.0) for r in runs[2]))
    for k in names:
        m1 = med(r.get(k, 0.0) for r in runs[1])
        m2 = med(r.get(k, 0.0) for r in runs[2])
        print(f"  {k:22s} {m1:8.0f} {m2:8.0f} {m2 - m1:8.0f}")


if __name__ == "__main__":
    main()
