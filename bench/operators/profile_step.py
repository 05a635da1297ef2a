# Run:  python bench/operators/profile_step.py [--rows 100] [--top 30]
"""Where the calls of one small step come from: the set-up of ``bench_fixed_cost.py`` (the join +
per-category average circuit, 1 worker, 200K bids of history), then ``--steps`` steps of
``--rows`` bids each under ``sys.setprofile``.

Prints the Python and C function calls per step (the figure ``bench_fixed_cost`` reports) split
by the operator whose ``eval`` was running (outermost on the stack; ``out.delta()`` for the
output read, ``driver/scheduler`` for the rest), then the ``--top`` callees. Calls into Cython
methods of pyarrow are not seen by the profiler (they are counted inside their caller), so the
figure counts Python-level work, not Arrow's.
"""
from __future__ import annotations

import argparse
import collections
import sys

import numpy as np

import dbsp
from _workload import with_history
from bench_fixed_cost import _bids


def _operator(frame) -> str:
    """The outermost operator ``eval`` (or the output read) on the stack of ``frame``."""
    found = "driver/scheduler"
    while frame is not None:
        co = frame.f_code
        if co.co_name == "eval" and "/operators/" in co.co_filename:
            found = type(frame.f_locals.get("self")).__name__
        elif co.co_name == "delta" and co.co_filename.endswith("output.py"):
            found = "out.delta()"
        frame = frame.f_back
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    batches = [_bids(rng, a.rows, 20_000) for _ in range(64)] if a.rows else []
    by_op: collections.Counter = collections.Counter()
    by_fn: collections.Counter = collections.Counter()

    def prof(frame, event, arg):
        if event == "call":
            co = frame.f_code
            by_fn[f"{co.co_filename.rsplit('/', 1)[-1]}:{co.co_qualname}"] += 1
        elif event == "c_call":
            by_fn[f"C {getattr(arg, '__qualname__', arg)}"] += 1
        else:
            return
        by_op[_operator(frame)] += 1

    with dbsp.Circuit(workers=1) as c:
        auctions, bids, out = with_history(c)
        for i in range(100 + a.steps):
            if a.rows:
                bids.push(batches[i % len(batches)])
            if i >= 100:
                sys.setprofile(prof)
            c.step()
            out.delta()
            sys.setprofile(None)
    n = a.steps
    print(f"{a.rows}-row step: {sum(by_op.values()) / n:.0f} calls")
    for k, v in by_op.most_common():
        print(f"  {v / n:7.1f}  {k}")
    print(f"top {a.top} callees:")
    for k, v in by_fn.most_common(a.top):
        print(f"  {v / n:7.1f}  {k}")


if __name__ == "__main__":
    main()
