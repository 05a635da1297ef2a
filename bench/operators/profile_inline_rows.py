# Run:  python bench/operators/profile_inline_rows.py step 0,1024,4096,8192,32768 4
#       DBSP_BENCH_BIDS=3000000 DBSP_BENCH_STEPS=300 \
#           python bench/operators/profile_inline_rows.py rate 0,8192,32768 6
"""The spine's inline-merge threshold (``DBSP_SPINE_INLINE_ROWS``) measured: each value in a
fresh forked child, the values alternating round by round (a shared machine drifts), medians
over the rounds. ``step``: 1,000 timed 100-row steps of the join + average circuit after the
set-up of ``bench_fixed_cost.py`` (its history and 100 warm steps): median wall and
stepping-thread CPU a step, whole-process CPU a step (the merger's merges too). ``rate``:
a round of ``bench_join_avg_rate.py`` (``DBSP_BENCH_BIDS`` bids in ``DBSP_BENCH_STEPS`` steps):
seconds, process and stepping-thread CPU. Each prints the merges of its first round by input
rows (powers of two) and by where they ran (``inline``: the stepping thread; ``merger``).

Measured (2 shared vCPUs, load 8): see ``spine.INLINE_ROWS``.
"""
from __future__ import annotations

import collections
import os
import statistics
import sys
import threading
import time

import numpy as np

from _workload import in_forked_child, with_history
from bench_fixed_cost import _bids, process_cpu


def _count_merges() -> collections.Counter:
    """Counts every spine merge from now on by (where it ran, its input rows rounded down to
    a power of two)."""
    from dbsp.trace import spine as S
    seen: collections.Counter = collections.Counter()
    orig = S.Spine._run_job

    def run_job(self, job):
        where = "inline" if threading.current_thread() is threading.main_thread() else "merger"
        seen[(where, 1 << max(0, int(job.rows).bit_length() - 1))] += 1
        return orig(self, job)

    S.Spine._run_job = run_job
    return seen


def rate_child(inline: int) -> dict:
    """``bench_join_avg_rate.py``'s round (its size from ``DBSP_BENCH_BIDS`` / ``_STEPS``)."""
    os.environ["DBSP_SPINE_INLINE_ROWS"] = str(inline)
    merges = _count_merges()
    import bench_join_avg_rate
    return dict(bench_join_avg_rate._child(), merges=dict(merges))


def step_child(inline: int, steps: int) -> dict:
    os.environ["DBSP_SPINE_INLINE_ROWS"] = str(inline)
    import dbsp
    rng = np.random.default_rng(7)
    batches = [_bids(rng, 100, 20_000) for _ in range(64)]
    with dbsp.Circuit(workers=1) as c:
        auctions, bids, out = with_history(c, steps=20)
        for i in range(100):  # warm, as bench_fixed_cost (the history's merges settle)
            bids.push(batches[i % 64])
            c.step()
            out.delta()
        merges = _count_merges()
        wall, thr = [], []
        cpu0 = process_cpu()
        for i in range(steps):
            bids.push(batches[i % 64])
            t0, th0 = time.perf_counter(), time.thread_time()
            c.step()
            out.delta()
            wall.append(time.perf_counter() - t0)
            thr.append(time.thread_time() - th0)
        proc = (process_cpu() - cpu0) / steps
    return {"wall_us": statistics.median(wall) * 1e6, "thread_cpu_us": statistics.median(thr) * 1e6,
            "mean_wall_us": statistics.mean(wall) * 1e6, "process_cpu_us": proc * 1e6,
            "merges": dict(merges), "load": os.getloadavg()[0]}


def main() -> None:
    kind, values, rounds = sys.argv[1], [int(v) for v in sys.argv[2].split(",")], int(sys.argv[3])
    res = collections.defaultdict(list)
    for r in range(rounds):
        for v in (values if r % 2 == 0 else values[::-1]):
            if kind == "rate":
                got = in_forked_child(rate_child, v)
            else:
                got = in_forked_child(step_child, v, 1000)
            res[v].append(got)
            print(v, {k: round(x, 2) if isinstance(x, float) else x
                      for k, x in got.items() if k != "merges"}, flush=True)
    for v in values:
        rs = res[v]
        keys = [k for k in rs[0] if k not in ("merges", "load")]
        print("INLINE", v, {k: round(statistics.median(x[k] for x in rs), 3) for k in keys},
              "loads", [round(x["load"], 1) for x in rs])
        print("   merges (first round):", sorted(rs[0]["merges"].items()))


if __name__ == "__main__":
    main()
