# Run:  python bench/workloads/view_latency.py [--workers 1] [--events 10000] [--steps 300]
"""Step latency of a pipeline whose output keeps its view (``collect()``'s default): the
keyed count (``dbsp.testing.pipelines.keyed_count``: count and sum per key, 1M keys) stepped
``--steps`` times at ``--events`` events a step, each step's change read with ``delta()``.

Prints the median, p99 and largest step time (wall, push + step + read), the whole run's wall
and CPU seconds (the process: every thread, the view's folds and the spines' merges included),
and the view's size at the end. The view folds its unread deltas every
``OutputHandle.MAX_PENDING_ROWS`` rows (``--fold-rows``); the fold runs on a thread of its own,
so the step that reaches the bound does not wait for it (see ``dbsp.operators.output``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dbsp  # noqa: E402
from dbsp.operators.output import OutputHandle  # noqa: E402
from dbsp.runtime.launcher import build_outputs  # noqa: E402
from dbsp.testing import pipelines as P  # noqa: E402

from _efficiency import settle, steps_of  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--runtime", default="threads")
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--fold-rows", type=int, default=OutputHandle.MAX_PENDING_ROWS)
    a = ap.parse_args(argv)
    OutputHandle.MAX_PENDING_ROWS = a.fold_rows
    data = steps_of("keyed_count", a.events, a.steps)
    c = dbsp.Circuit(workers=a.workers, runtime=a.runtime)
    outs = build_outputs(c, P.keyed_count)
    walls = []
    cpu0, t0 = time.process_time(), time.perf_counter()
    for st in data:
        t = time.perf_counter()
        for name, batch in st.items():
            c.inputs[name].push(batch)
        c.step()
        for o in outs.values():
            o.delta()
        walls.append((time.perf_counter() - t) * 1e3)
    settle(c)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    w = sorted(walls)
    worst = max(range(len(walls)), key=walls.__getitem__)
    print(f"keyed count, {a.runtime} W={a.workers}, {a.events} events x {a.steps} steps: step "
          f"median {statistics.median(w):.2f} ms, p99 {w[int(len(w) * 0.99)]:.1f} ms, max "
          f"{w[-1]:.1f} ms (step {worst}); run {wall:.2f} s wall, {cpu:.2f} s CPU; view "
          f"{len(outs['counts'].view())} rows")
    c.close()


if __name__ == "__main__":
    main()
