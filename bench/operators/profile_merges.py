# Run:  DBSP_SPINE_BACKGROUND=0 valgrind --tool=callgrind --instr-atstart=no \
#           python bench/operators/profile_merges.py --callgrind     (then: grep totals callgrind.out.*)
#       A/B: the same with PYTHONPATH=<other tree>/src
"""The merges the fixed-cost workload's 100-row steps owe, replayed alone: the set-up of
``bench_fixed_cost.py`` (join + per-category average, 1 worker, 200K bids of history), then
``--steps`` foreground steps recording each merge's inputs, then those merges again (the trim
check and ``Spine._merge``, as ``Spine._run_job`` runs them) with callgrind's instrumentation
switched on around them only (``--callgrind``: ``callgrind_control -i on/off``), so the total
is the instructions of the merges and nothing else. Without ``--callgrind`` it prints their
CPU time.

Measured (old tree b8fb524 -> branch merge9, 201 merges of 200,606 input rows): 125.2M -> 79.3M
instructions, 623K -> 394K a merge (the merge loop itself 182K -> 194K: it now copies the keys
too; the rest, pyarrow and numpy objects per column and Python glue, 441K -> 200K).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import time

import numpy as np

import dbsp
from dbsp.trace import spine as S
from _workload import with_history
from bench_fixed_cost import _bids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--callgrind", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    batches = [_bids(rng, 100, 20_000) for _ in range(64)]
    jobs = []
    with dbsp.Circuit(workers=1) as c:
        auctions, bids, out = with_history(c)
        for i in range(100):
            bids.push(batches[i % 64])
            c.step()
            out.delta()
        orig = S.Spine._run_job

        def record(self, job):
            jobs.append((self, list(job.inputs), job.rows))
            return orig(self, job)

        S.Spine._run_job = record
        try:
            for i in range(a.steps):
                bids.push(batches[i % 64])
                c.step()
                out.delta()
        finally:
            S.Spine._run_job = orig
        new = hasattr(S, "_merge_trims")  # (the tree before it checked the trim in one line)
        if a.callgrind:
            subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=False)
        t0 = time.process_time()
        for sp, inputs, rows in jobs:
            if new:
                S._merge_trims(inputs, rows, S._fixed_row_bytes(inputs[0]))
            else:
                S._trims_before(sum(getattr(b, "nbytes_in_memory", 0) for b in inputs))
            sp._merge(inputs, None, None)
        dt = time.process_time() - t0
        if a.callgrind:
            subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], check=False)
    print(f"{len(jobs)} merges of {sum(r for _, _, r in jobs)} input rows: "
          f"{dt / max(len(jobs), 1) * 1e6:.0f} us CPU a merge")


if __name__ == "__main__":
    main()
