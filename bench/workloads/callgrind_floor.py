# Run:  for e in 10000 5000; do valgrind --tool=callgrind --collect-atstart=yes \
#           --callgrind-out-file=/tmp/floor_$e python bench/workloads/callgrind_floor.py --events $e; done
#       grep -h ^totals /tmp/floor_10000.1 /tmp/floor_5000.1   (floor = 2 x I(5000) / I(10000))
#       --workers 2: W = 2 on the same steps; DBSP_SPINE_BACKGROUND=0: every merge in the
#       stepping thread (a count that repeats to 0.02%).
#       A/B: the same from the other checkout (its own python); with background merges run each
#       twice: where the merger's merges fall moves a W = 1 count by about 1.5%.
"""Instructions of the threads runtime's steps of ``join_avg``, every thread counted (the
spines' merger too): the count behind ``_efficiency.py``'s *floor* (2 x CPU of 1 worker on
steps of half the events / CPU of 1 worker) and, with ``--workers 2``, behind its ratio itself
(small steps: every worker a greenlet of the driver's thread), without the clock's noise on a
shared machine (single rounds of the CPU ratio scatter over 1.1-1.8 on the 2-vCPU VM).

The steps are ``_efficiency.steps_of`` (3 warm-up steps, then ``--steps`` measured), run as
``cpu_of_run`` runs them: the window is settled at both edges (every merge its steps owe is in
it), and it is counted between ``CALLGRIND_ZERO_STATS`` and ``CALLGRIND_DUMP_STATS``, which
cover every thread. (Until late in stop 28 the window was toggled with ``CALLGRIND_TOGGLE_COLLECT``,
which callgrind keeps per thread: the merger never counted, only the merges run inline in the
stepping thread, and the window was not settled. Every figure this docstring gave before,
W = 1 233.2M and W = 2 297.8M among them, was the stepping thread's alone.)

Measured (stop 28, 10K events, 40 steps, seed 1000):

* every thread, background merges: W = 1 404.1M (its merger's first thread naming ran
  ``ldconfig`` through ``ctypes.util.find_library``: 4.8M of regex; fixed), then 399.8M and
  394.2M; W = 2 450.55M, 450.55M, 450.59M: **W2/W1 1.13-1.14**. W = 1 at 5K events 243.9M
  and 237.7M: floor 1.21 (two workers on half the rows each pay less than that: their spines
  are half the size, and the 100 categories of the average are split between them);
* every merge in the stepping thread (``DBSP_SPINE_BACKGROUND=0``): W = 1 367.82M twice,
  W = 2 427.27M and 427.34M: **1.162**;
* the stepping thread alone (the old count): W = 1 234.7M, W = 2 296.6M and 298.6M (1.27).

The second worker's 1.5M instructions a step (every merge in the stepping thread): the
driver's sorted split 0.67M beside 0.57M of sorting and gathering its ``index_by`` no longer
does, the interpreter and allocator ~0.6M (each worker's operators' Python), the join's rank
probes 0.15M (one worker's auction ids are dense, and a dense range is matched by offset; each
of two workers holds a hashed half of them).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "operators"))

from _efficiency import open_run, settle, steps_of  # noqa: E402
from callgrind_step import _helper  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--workload", default="join_avg")
    ap.add_argument("--workers", type=int, default=1,
                    help="W (2: the count of W = 2 on the same steps, against W = 1's)")
    a = ap.parse_args()
    data = steps_of(a.workload, a.events, 3 + a.steps, seed=a.seed)
    cg = _helper()
    circuit, job, one = open_run("threads", a.workload, a.workers)
    for st in data[:3]:
        one(st)
    settle(circuit)
    cg.cg_zero()
    for st in data[3:]:
        one(st)
    settle(circuit)  # the merges the window's steps owe, as cpu_of_run charges them
    circuit.close()
    cg.cg_dump()


if __name__ == "__main__":
    main()
