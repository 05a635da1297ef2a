# Run:  pytest bench/operators/bench_join_avg_rate.py --benchmark-only -s
# Size: DBSP_BENCH_BIDS (default 10,000,000; auctions a tenth, 1,000 steps: DBSP_BENCH_STEPS),
#       DBSP_BENCH_ROUNDS (default 3; a fresh forked child per round).
# A/B:  run it in two trees, alternating, e.g. ``for i in 1 2 3; do for t in old new; do
#       (cd /work/wt-$t && pytest bench/operators/bench_join_avg_rate.py --benchmark-only -s
#       ); done; done``, and compare the medians.
"""Issue 14's rate target: the join + per-category average at >= 3M events/s with 1 worker,
each step's change read.

The workload of ``_workload.py`` (bids joined with auctions, average price per category) at
10M bids + 1M auctions in 1,000 steps of 11K events, state in memory, 1 worker (threads
runtime), each round in a fresh forked child. Timed per step: generating the step's two
batches (:func:`_workload.iter_workload_steps`, inside the clock), ``push``, ``step`` and
reading the step's change with ``out.delta()``. Printed and in ``extra_info``:
``events_per_s`` (median round; ``best_events_per_s``: the best one), ``process_cpu_s`` (CPU
seconds of the whole process over the timed loop: the stepping thread plus the spines'
background merges), ``step_thread_cpu_s`` (the stepping thread alone: what bounds the rate on
an idle machine with a core to spare for merges), and ``load`` (the 1-minute load average when
the round ended: on a shared machine the rate says little without it).

Measured (branch jav8, 2 shared vCPUs at load 8, one round per tree, alternating 3 times):
0.91-1.41M events/s against 0.84-1.60M before the branch, stepping thread 2.59-3.19 s against
2.27-3.52 s: at that load the machine, not the code, sets these figures. What the branch
changed was measured inside one run instead, swapping the kernel every two steps (the
stepping thread's CPU per step, new/old: 0.88-0.95 over steps 500-1000; ``search.intersect``
alone 0.34-0.72), see the commits of ``search.intersect``.
"""
from __future__ import annotations

import os
import resource
import statistics
import time

import pytest

from _workload import build_query, in_forked_child, iter_workload_steps

N_BIDS = int(os.environ.get("DBSP_BENCH_BIDS", 10_000_000))
N_AUCTIONS = N_BIDS // 10
STEPS = int(os.environ.get("DBSP_BENCH_STEPS", 1_000))
ROUNDS = int(os.environ.get("DBSP_BENCH_ROUNDS", 3))
EVENTS = N_BIDS + N_AUCTIONS
TARGET = 3_000_000


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _child() -> dict:
    import dbsp
    with dbsp.Circuit() as c:
        auctions, bids, out = build_query(c)
        cpu0, thr0, t0 = _cpu(), time.thread_time(), time.perf_counter()
        for a, b in iter_workload_steps(N_BIDS, N_AUCTIONS, STEPS):
            auctions.push(a)
            bids.push(b)
            c.step()
            out.delta()
        seconds = time.perf_counter() - t0
        cpu, thr = _cpu() - cpu0, time.thread_time() - thr0
    return {"seconds": seconds, "process_cpu_s": cpu, "step_thread_cpu_s": thr,
            "load": os.getloadavg()[0]}



@pytest.mark.slow
def test_join_avg_rate(benchmark):
    benchmark.group = "join-avg-rate"
    runs: list = []
    benchmark.pedantic(lambda: runs.append(in_forked_child(_child)), rounds=ROUNDS, iterations=1)
    rates = [EVENTS / r["seconds"] for r in runs]
    info = {"bids": N_BIDS, "auctions": N_AUCTIONS, "steps": STEPS,
            "events_per_s": statistics.median(rates), "best_events_per_s": max(rates),
            "process_cpu_s": statistics.median(r["process_cpu_s"] for r in runs),
            "step_thread_cpu_s": statistics.median(r["step_thread_cpu_s"] for r in runs),
            "load": [round(r["load"], 1) for r in runs], "target_events_per_s": TARGET}
    benchmark.extra_info.update(info)
    print(f"\njoin + avg, {N_BIDS:,} bids + {N_AUCTIONS:,} auctions in {STEPS} steps, delta read "
          f"each step: " + ", ".join(f"{x / 1e6:.2f}" for x in rates) + "M events/s (median "
          f"{info['events_per_s'] / 1e6:.2f}M); process CPU {info['process_cpu_s']:.2f} s, "
          f"stepping thread {info['step_thread_cpu_s']:.2f} s; load {info['load']}")
