"""Parallel efficiency of two source trees, interleaved: ``_efficiency.efficiency`` (W = 1, W = 2
and the half-size floor reference, one round) for the old tree then the new, round after round,
each run in a fresh process whose ``PYTHONPATH`` is that tree's ``src``; medians per side.

    python bench/workloads/ab_efficiency.py --old /path/to/old/src [--new src] [--rounds 5]
        [--configs launcher:keyed_count:10000,processes:join_avg:100000,...] [--steps N]

Each line printed is one run (runtime, workload, events, side, cpu_ratio, floor, CPU ms a step
of W = 1 and W = 2, the wall-clock speed-up of W = 2 and its ceiling, the 1-minute load
average); then per configuration the medians of each side.
Both trees must be built (their native modules in place). ``--steps``: measured steps a run
(default: ``_efficiency.STEPS``, as the report); a run of 40 10K-event steps measures about
0.1 s of CPU a side, so single rounds scatter widely (1.1-1.6 seen on one tree): more steps a
run narrow them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RUNTIMES = ("launcher", "processes", "threads")
ALL = [f"{rt}:{wl}:{ev}" for wl in ("keyed_count", "join_avg") for ev in (10_000, 100_000)
       for rt in RUNTIMES]
_ONE = ("import sys, json; sys.path.insert(0, %r); import _efficiency as E; "
        "rt, wl, ev = sys.argv[1], sys.argv[2], int(sys.argv[3]); "
        "steps = int(sys.argv[4]) or E.STEPS; "
        "print(json.dumps(E.efficiency(rt, wl, ev, steps, 1)))") % HERE


def run(src: str, rt: str, wl: str, ev: str, steps: int = 0) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    out = subprocess.run([sys.executable, "-c", _ONE, rt, wl, ev, str(steps)], env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{rt} {wl} {ev} with {src} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="the old tree's src directory")
    ap.add_argument("--new", default=os.path.join(HERE, "..", "..", "src"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--configs", default=",".join(ALL), help="runtime:workload:events,...")
    ap.add_argument("--steps", type=int, default=0, help="measured steps a run (0: default)")
    a = ap.parse_args(argv)
    med = statistics.median
    for cfg in a.configs.split(","):
        rt, wl, ev = cfg.split(":")
        got: dict = {"old": [], "new": []}
        for _ in range(a.rounds):
            for side, src in (("old", a.old), ("new", a.new)):
                r = run(src, rt, wl, ev, a.steps)
                got[side].append(r)
                print(rt, wl, ev, side, f"{r['cpu_ratio']:.3f} {r['floor']:.3f} "
                      f"{r['cpu_ms_per_step_w1']:.2f} {r['cpu_ms_per_step_w2']:.2f} "
                      f"{r['speedup']:.2f} {r['ceiling']:.2f}",
                      os.getloadavg()[0], flush=True)
        for side, rs in got.items():
            ratios = [r["cpu_ratio"] for r in rs]
            print(f"MEDIAN {rt} {wl} {ev} {side}: cpu_ratio {med(ratios):.2f} (floor "
                  f"{med(r['floor'] for r in rs):.2f}); rounds "
                  f"{', '.join(f'{x:.2f}' for x in ratios)}; wall speed-up "
                  f"{med(r['speedup'] for r in rs):.2f} (ceiling "
                  f"{med(r['ceiling'] for r in rs):.2f})", flush=True)


if __name__ == "__main__":
    main()
