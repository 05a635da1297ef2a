# Run:  valgrind --tool=callgrind --collect-atstart=no --separate-threads=yes \
#           --callgrind-out-file=/tmp/jw1 python bench/workloads/callgrind_join_phases.py --workers 1
#       (then --workers 2 into /tmp/jw2), and
#       python bench/workloads/callgrind_join_phases.py --sum /tmp/jw1 ; ... --sum /tmp/jw2
"""Instructions of the join's phases on the driver's thread (threads runtime, join_avg steps,
every worker a greenlet there): probes of the traces (``match_trace``), pair expansion
(``join_matched``), the output build, the spines' inserts, inline merges and snapshots, the rest
of ``JoinOperator.eval`` (``join_glue``). Each call is bracketed by callgrind dumps (a few
thousand instructions a mark, counted in the enclosing phase: twice as many at W = 2), and
the steps are settled (no merge owed) before each is measured.

Measured (branch join13, 10K events a step, steps 21-26, instructions a step, W1 / W2):
main: match_trace 258K / 578K, join_matched 869K / 920K, build 585K / 659K, inline merges
251K / 332K, the join 2.16M / 2.87M; join13: match_trace 211K / 363K, join_matched 663K /
717K, the join 1.89M / 2.43M."""
from __future__ import annotations

import argparse
import collections
import functools
import glob
import os
import re
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "operators"))


def summarize(prefix: str, steps: int) -> None:
    """Instructions a step by phase: each dump's count goes to the innermost phase open while
    it ran (the dumps of the driver's thread, in order)."""
    files = sorted(glob.glob(prefix + ".*-01"),
                   key=lambda f: int(re.search(r"\.(\d+)-01$", f).group(1)))
    acc: collections.Counter = collections.Counter()
    stack: list = []
    for f in files:
        txt = open(f).read()
        trig = re.search(r"desc: Trigger: Client Request: (\S+)", txt)
        if not trig:
            continue
        n = int(re.search(r"^totals: (\d+)", txt, re.M).group(1))
        kind, label = trig.group(1).split(":", 1)
        if kind == "start":
            if stack:
                acc[stack[-1]] += n
            stack.append(label)
        else:
            acc[label] += n
            stack.pop()
    print(f"{prefix}: join {sum(acc.values()) / steps:,.0f} instructions a step")
    for k, v in acc.most_common():
        print(f"  {k:26s} {v / steps:12,.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--sum", help="print the split of the dumps with this prefix and exit")
    a = ap.parse_args()
    if a.sum:
        summarize(a.sum, a.steps)
        return
    import _efficiency as E
    from callgrind_step import _helper
    from dbsp.operators import join as J
    from dbsp.trace import spine

    cg = _helper()
    on = [False]
    main_thread = threading.main_thread()

    def wrap(obj, name: str, label: str) -> None:
        fn = getattr(obj, name)
        s, e = f"start:{label}".encode(), f"end:{label}".encode()

        @functools.wraps(fn)
        def f(*args, **kw):
            if not on[0] or threading.current_thread() is not main_thread:
                return fn(*args, **kw)  # (a merger thread's merges are not the step's)
            cg.cg_mark(s)
            try:
                return fn(*args, **kw)
            finally:
                cg.cg_mark(e)
        setattr(obj, name, f)

    wrap(J.JoinOperator, "eval", "join_glue")
    wrap(J, "match_trace", "match_trace")
    wrap(J, "join_matched", "join_matched")
    wrap(J.JoinOperator, "_build", "build")
    wrap(spine.Spine, "insert", "insert")
    wrap(spine.Spine, "_run_job", "inline_merge")
    wrap(spine.Spine, "batches", "batches")
    data = E.steps_of("join_avg", a.events, a.warm + a.steps)
    c, job, one = E.open_run("threads", "join_avg", a.workers)
    try:
        for st in data[:a.warm]:
            one(st)
        E.settle(c)
        cg.cg_on()
        on[0] = True
        for st in data[a.warm:]:
            one(st)
            E.settle(c)
        on[0] = False
        cg.cg_off()
    finally:
        (job or c).close()


if __name__ == "__main__":
    main()
