# Run:  pytest bench/workloads/bench_efficiency.py --benchmark-only -s
#       (a quick report without pytest: python bench/workloads/_efficiency.py)
"""Parallel efficiency (issues 13 and 14): CPU seconds of 2 workers over 1 on the same work.

For each runtime (``threads``, ``processes``: embedded; ``launcher``: the driver and worker
processes joined by the TCP mesh) and two workloads (:func:`dbsp.testing.pipelines.keyed_count`,
one linear aggregate over 1M keys; :func:`~dbsp.testing.pipelines.join_avg`, bids joined with
auctions and the average price per category), at steps of 10K and 100K events, each step's
change read as Arrow: W = 1 and W = 2 interleaved (``DBSP_BENCH_EFF_ROUNDS`` rounds, default
3) on the same steps, CPU over every process in the steady state (see
``bench/workloads/_efficiency.py``). Targets: ``cpu_ratio`` <= 1.25 at 10K, <= 1.1 at 100K.

``extra_info``: ``cpu_ratio`` (median) and each round's, ``floor`` (the ratio if exchanges,
splits and copies were free: what 2 workers pay because each runs the whole circuit's per-step
fixed cost), the wall-clock ``speedup`` of 2 workers and its ``ceiling`` on this machine.
"""
from __future__ import annotations

import os

import pytest

from _efficiency import STEPS, efficiency, report

ROUNDS = int(os.environ.get("DBSP_BENCH_EFF_ROUNDS", 3))


@pytest.mark.parametrize("events", [10_000, 100_000])
@pytest.mark.parametrize("workload", ["keyed_count", "join_avg"])
@pytest.mark.parametrize("runtime", ["threads", "processes", "launcher"])
def test_parallel_efficiency(benchmark, runtime, workload, events):
    benchmark.group = f"efficiency-{workload}-{events}"
    steps = int(os.environ.get("DBSP_BENCH_EFF_STEPS", STEPS))
    out: list = []
    benchmark.pedantic(lambda: out.append(efficiency(runtime, workload, events, steps, ROUNDS)),
                       rounds=1, iterations=1)
    r = out[0]
    benchmark.extra_info.update({k: v for k, v in r.items() if k != "workload"})
    print("\n" + report(r))
