# Compare: pytest bench/operators/bench_workload.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""The workload: an incremental join of 1M bids with 100K auctions plus the average price per
category, fed in 100 steps (11K events a step), with 1 and 2 workers (threads; and forked
processes). Timed: the whole run (push, step, read the delta), fresh circuit each round.

Targets: >= 1M events/s with 2 workers and >= 1.7x the 1-worker figure. ``extra_info``:
``events_per_s`` (best round), and for 2 workers ``speedup_vs_1_worker`` measured interleaved
with 1-worker runs in the same test (a shared machine drifts; interleaving keeps it fair).

``one_worker_cores`` is the CPU time of a 1-worker run over its wall time: one worker is not one
core, its spines merge on a background thread. On a machine with ``C`` cores, ``W`` workers can be
at most ``C / one_worker_cores`` times faster (``speedup_bound``), even with free exchanges.

``speedup_ceiling``: W workers each run a step over 1/W of the rows, so even with free exchanges
and no driver work they are at most ``T(1 worker, full steps) / T(1 worker, steps 1/W the size)``
faster. Both are measured interleaved (untimed, before each round), so the report separates the
cost of the fixed per-step work every worker repeats (the ceiling) from the cost of exchanging
(the gap between the ceiling and ``speedup_vs_1_worker``). On a 2-vCPU VM: ceiling 1.22-1.44x.

``cpu_ratio_vs_1_worker``: CPU seconds (rusage of this process and of its reaped children: every
thread and worker process) of the W-worker run over those of the interleaved 1-worker run on the
same work; target <= 1.25 at these steps of 11K events (what parallelism costs in total work).
"""
from __future__ import annotations

import os
import resource
import statistics
import time

import pytest

from _workload import run_workload, workload_steps

N_BIDS, N_AUCTIONS, STEPS, ROUNDS = 1_000_000, 100_000, 100, 3
EVENTS = N_BIDS + N_AUCTIONS


@pytest.fixture(scope="module")
def data():
    return workload_steps(N_BIDS, N_AUCTIONS, STEPS, seed=1)


@pytest.fixture(scope="module")
def small_steps():
    """Steps of half the size (what each of 2 workers handles), for the speed-up ceiling."""
    return workload_steps(N_BIDS // 2, N_AUCTIONS // 2, STEPS, seed=2)


@pytest.mark.parametrize("workers,runtime", [(1, "threads"), (2, "threads"), (2, "processes")])
def test_bids_auctions_workload(benchmark, data, small_steps, workers, runtime):
    benchmark.group = "workload-join-avg"
    times: list = []
    base: list = []
    cores: list = []
    part: list = []
    cpu_w: list = []
    cpu_1: list = []

    def one_worker_run():  # untimed, before each round: the interleaved 1-worker reference
        if workers > 1:
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            base.append(run_workload(data, 1))
            r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
            cores.append(cpu / (t1 - t0))  # the whole call: build, steps, close
            cpu_1.append(cpu)
            if workers == 2:
                part.append(run_workload(small_steps, 1))
        return (), {}

    def run():
        c0 = _cpu_seconds()
        times.append(run_workload(data, workers, runtime))
        cpu_w.append(_cpu_seconds() - c0)

    benchmark.pedantic(run, setup=one_worker_run, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    info = {"workers": workers, "runtime": runtime, "events": EVENTS,
            "events_per_s": EVENTS / min(times), "median_s": statistics.median(times)}
    if base:
        info["one_worker_events_per_s"] = EVENTS / min(base)
        info["speedup_vs_1_worker"] = statistics.median(base) / statistics.median(times)
        info["one_worker_cores"] = statistics.median(cores)
        ncpu = len(os.sched_getaffinity(0))
        info["speedup_bound"] = min(workers, ncpu) / info["one_worker_cores"]
    if cpu_1:
        info["cpu_ratio_vs_1_worker"] = statistics.median(cpu_w) / statistics.median(cpu_1)
    if part:
        info["speedup_ceiling"] = statistics.median(base) / statistics.median(part)
    benchmark.extra_info.update(info)


def _cpu_seconds() -> float:
    """User + system CPU of this process (all its threads) and of its reaped child processes."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
