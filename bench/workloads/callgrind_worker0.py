# Run:  valgrind --tool=callgrind --collect-atstart=no --separate-threads=yes \
#           --callgrind-out-file=/tmp/w1 python bench/workloads/callgrind_worker0.py --workers 1
#       (then --workers 2 into /tmp/w2), and
#       python bench/workloads/callgrind_worker0.py --sum /tmp/w1 ; ... --sum /tmp/w2
"""Instructions of worker 0 (the driver's thread) by operator, threads runtime, join_avg steps.

callgrind's collection switch is per thread, so only the driver's thread is counted: the driver
(``split``: dealing inputs to the workers, ``read``: ``delta()``) and worker 0's operators. With
W = 2 each worker holds half the rows: an operator whose count does not halve has a per-worker
cost that a second worker pays again. Measured (issue 14, 10K events a step, instructions a
step): split 33K -> 904K, read 17K -> 162K, aggregate(linear) 1.73M -> 1.32M, the three
index_by 1.95M -> 1.15M, join 1.74M -> 1.02M (W = 1 -> W = 2). Branch split12 (the split
dealt by ``deal_batch``, the read gathered by ``gather_disjoint``), W = 2: split 885K -> 535K,
read 160K -> 98K (W = 1: 31K and 17K).

Small steps run every worker as a greenlet of the driver's thread, switched at each exchange:
a dump is made at every operator's start and end *and at every greenlet switch*, each charged
to what ran since the previous dump (the innermost label of the greenlet that ran it; ``other``
outside any). Before (marks at the start and end of ``eval`` only) the part of an operator run
before a switch went to no operator, and the other worker's part after it to this one: main
(65ec283, 3 steps) showed the aggregate at 1.49M a step at W = 1 and 1.43M at W = 2, where it
is 1.49M and 2.06M (8 steps; branch agg13: 1.44M and 1.94M)."""
from __future__ import annotations

import argparse
import collections
import functools
import glob
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "operators"))


def summarize(prefix: str, steps: int) -> None:
    files = sorted(glob.glob(prefix + ".*-01"),
                   key=lambda f: int(re.search(r"\.(\d+)-01$", f).group(1)))
    acc: collections.Counter = collections.Counter()
    total = 0
    for f in files:
        txt = open(f).read()
        trig = re.search(r"desc: Trigger: Client Request: (\S+)", txt)
        got = re.search(r"^totals: (\d+)", txt, re.M)
        n = int(got.group(1)) if got else 0
        total += n
        if trig and trig.group(1).startswith("ran:"):
            acc[trig.group(1)[4:]] += n
    print(f"{prefix}: {total / steps:,.0f} instructions a step (marks included)")
    for k, v in acc.most_common():
        print(f"  {k:26s} {v / steps:12,.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--sum", help="print the split of the dumps with this prefix and exit")
    a = ap.parse_args()
    if a.sum:
        summarize(a.sum, a.steps)
        return
    import _efficiency as E
    from callgrind_step import _helper
    from dbsp.circuit.scheduler import Scheduler
    from dbsp.operators.input import InputStream
    from dbsp.operators.output import OutputHandle
    from dbsp.trace import spine

    import greenlet

    cg = _helper()
    on = [False]
    stacks: dict = {}  # greenlet -> its labels, innermost last

    def stack() -> list:
        return stacks.setdefault(greenlet.getcurrent(), [b"ran:other"])

    def wrap(cls, name: str, label: str) -> None:
        fn = getattr(cls, name)
        mark = f"ran:{label}".encode()

        @functools.wraps(fn)
        def f(*args, **kw):
            if not on[0]:
                return fn(*args, **kw)
            s = stack()
            cg.cg_mark(s[-1])  # what ran before this call
            s.append(mark)
            try:
                return fn(*args, **kw)
            finally:
                cg.cg_mark(s.pop())
        setattr(cls, name, f)

    def switched(event: str, args) -> None:
        if on[0] and event in ("switch", "throw"):
            cg.cg_mark(stacks.get(args[0], [b"ran:other"])[-1])  # what the origin ran
    greenlet.settrace(switched)

    seen: set = set()
    init = Scheduler.__init__

    def init_marked(self, *args, **kw):
        init(self, *args, **kw)
        for op in self.ops:
            if type(op) not in seen:
                seen.add(type(op))
                wrap(type(op), "eval", type(op).__name__)
    Scheduler.__init__ = init_marked
    wrap(InputStream, "_split", "split")
    wrap(OutputHandle, "delta", "read")
    data = E.steps_of("join_avg", a.events, 3 + a.steps)
    c, job, one = E.open_run("threads", "join_avg", a.workers)
    try:
        for st in data[:3]:
            one(st)
        for sp in list(spine._spines):
            sp.wait_merges()
        cg.cg_on()
        on[0] = True
        for st in data[3:]:
            one(st)
        cg.cg_mark(stack()[-1])
        on[0] = False
        cg.cg_off()
    finally:
        (job or c).close()


if __name__ == "__main__":
    main()
