# Run:  for e in 10000 5000; do valgrind --tool=callgrind --collect-atstart=no \
#           --callgrind-out-file=/tmp/floor_$e python bench/workloads/callgrind_floor.py --events $e; done
#       grep -h ^totals /tmp/floor_10000.1 /tmp/floor_5000.1   (floor = 2 x I(5000) / I(10000))
#       A/B: the same from the other checkout (its own python); run each twice: the background
#       merges make a run's count move by about 1.5%.
"""Instructions of the threads runtime's steps of ``join_avg`` with 1 worker, every thread
counted (the background merges too): the count behind ``_efficiency.py``'s *floor* (2 x CPU of
1 worker on steps of half the events / CPU of 1 worker), without the clock's noise on a shared
machine (its floor moved between 1.03 and 1.56 over six runs of one build).

The steps are ``_efficiency.steps_of`` (3 warm-up steps, then ``--steps`` measured, one
callgrind dump for them all, ``circuit.close()`` included), run as ``cpu_of_run`` runs them.

Measured (branch agg11, 40 steps, seed 1000, two runs each): main 238.8M / 242.4M at 10K events
and 158.0M / 155.7M at 5K (floor 1.30); agg11 241.6M / 241.5M and 154.2M / 153.8M (1.28).

``--workers 2`` counts W = 2 on the same steps (small steps: every worker a greenlet of the
driver's thread), for the instructions behind the efficiency ratio itself. Measured (10K
events, 40 steps): W = 1 233.2M; W = 2 on b386474 313.7M and 301.8M in two runs (the
background merges move a run's count by a few percent), on dac4038 297.8M and 297.9M (the
split's recount and code passes); W2/W1 1.29 -> 1.28. The second worker's ~2.0M a step
(b386474, the 313.7M run): the driver's sorted split (~0.77M beside ~0.48M of gathers its
index no longer makes), the interpreter and allocator (~0.8M: each worker's operators'
Python), merges (+0.16M), the join's rank probes (+0.18M)."""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "operators"))

from _efficiency import open_run, steps_of  # noqa: E402
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
    cg.cg_on()
    for st in data[3:]:
        one(st)
    circuit.close()
    cg.cg_off()


if __name__ == "__main__":
    main()
