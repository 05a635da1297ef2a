# Run:  valgrind --tool=callgrind --collect-atstart=no --separate-threads=yes \
#           --callgrind-out-file=/tmp/cga.%p python bench/operators/callgrind_aggregate.py 2
#       python bench/operators/callgrind_aggregate.py --sum /tmp/cga
#       A/B: the same with PYTHONPATH=<other tree>/src (W = 1 and 2); needs gcc and valgrind.
"""Instructions of the linear aggregate's ``eval`` on join_avg (10K events a step, processes
runtime), W = 1 or 2, under callgrind: collection is switched on only inside the aggregate's
``eval`` (in every worker process), one dump per eval. ``--sum PREFIX`` adds up the dumps of
every process: the aggregate's instructions a step, summed over workers, which no other
engineer's load on the machine changes (user-space only: the transport's system calls are not
counted).

Measured (issue 14, branch agg10): 1.765M (W=1) / 3.351M (W=2) a step at f7d037d, 1.575M /
2.756M after (the packed exchange parts, merge_sum_packed, group_rows by hash)."""
from __future__ import annotations

import glob
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "workloads"))

STEPS, WARM = 5, 3


def _sum(prefix: str) -> None:
    total, n = 0, 0
    for f in glob.glob(prefix + "*"):
        with open(f) as fh:
            m = re.search(r"^totals: (\d+)", fh.read(), re.M)
        if m and int(m.group(1)):
            total += int(m.group(1))
            n += 1
    print(f"{n} evals, {total / STEPS:,.0f} instructions a step (summed over workers)")


def main() -> None:
    if sys.argv[1] == "--sum":
        return _sum(sys.argv[2])
    import callgrind_step as CS
    import _efficiency as E
    from dbsp.operators import aggregate as A
    workers = int(sys.argv[1])
    cg = CS._helper()
    on = _ON
    orig = A.LinearAggregateOperator.eval

    def timed(self, d):
        if not on[0]:
            return orig(self, d)
        cg.cg_on()
        try:
            return orig(self, d)
        finally:
            cg.cg_off()
    A.LinearAggregateOperator.eval = timed
    data = E.steps_of("join_avg", 10_000, WARM + STEPS)
    circuit, job, one = E.open_run("processes", "join_avg", workers)
    try:
        for st in data[:WARM]:
            one(st)
        on[0] = True
        if workers > 1:
            circuit._executor.apply(_switch, True)
        for st in data[WARM:]:
            one(st)
        on[0] = False
        if workers > 1:
            circuit._executor.apply(_switch, False)
    finally:
        (job or circuit).close()


_ON = [False]  # collecting inside the aggregate's eval (each process its own)


def _switch(replica, value: bool) -> None:
    """Switch collection in a forked worker (through the executor's ``apply``)."""
    _ON[0] = value


if __name__ == "__main__":
    main()
