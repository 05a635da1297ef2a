# Run:  valgrind --tool=callgrind --collect-atstart=no --separate-threads=yes \
#           --callgrind-out-file=/tmp/cg python bench/operators/callgrind_step.py [--rows 100]
#       grep -H ^totals /tmp/cg.*-01      (one file per measured step: its instructions)
#       A/B: the same with PYTHONPATH=<other tree>/src; needs gcc and valgrind's headers.
"""Instructions of one small step of the join + per-category average circuit under callgrind:
the set-up of ``bench_fixed_cost.py`` (200K bids of history, 30 warm steps), then ``--steps``
steps of ``--rows`` bids, each after the spines' background merges finished (so a step's count
does not depend on where a merge stands) and each dumped on its own (``CALLGRIND_DUMP_STATS``
through a tiny helper library compiled on the fly). With ``--by-operator`` a dump is also made
at each operator ``eval``'s start and end (``cgout.N-01``'s trigger names it), which costs a few
thousand instructions a mark: for the split, not for the total.

Measured (branch step9, 100 rows, merges waited for): 844K instructions a step before the
branch, 706K after (the bids index 143K -> 78K, the aggregate ~390K -> ~330K)."""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile

import numpy as np

import dbsp
from _workload import wait_for_merges, with_history
from bench_fixed_cost import _bids

_HELPER = """#include <valgrind/callgrind.h>
void cg_on(void) { CALLGRIND_ZERO_STATS; CALLGRIND_TOGGLE_COLLECT; }
void cg_off(void) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS; }
void cg_mark(const char *s) { CALLGRIND_DUMP_STATS_AT(s); }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(void) { CALLGRIND_DUMP_STATS; }
"""


def _helper() -> ctypes.CDLL:
    d = tempfile.mkdtemp(prefix="dbsp-cg-")
    src, lib = os.path.join(d, "cg.c"), os.path.join(d, "libcg.so")
    with open(src, "w") as f:
        f.write(_HELPER)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", src, "-o", lib], check=True)
    cg = ctypes.CDLL(lib)
    cg.cg_mark.argtypes = [ctypes.c_char_p]
    return cg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--by-operator", action="store_true")
    a = ap.parse_args()
    cg = _helper()
    on = [False]
    if a.by_operator:
        from dbsp.circuit import scheduler as S
        seen: set = set()
        init = S.Scheduler.__init__

        def marked(ev, name: str):
            s, e = f"start:{name}".encode(), f"end:{name}".encode()

            def f(*args):
                if not on[0]:
                    return ev(*args)
                cg.cg_mark(s)
                try:
                    return ev(*args)
                finally:
                    cg.cg_mark(e)
            return f

        def init_marked(self, *args, **kw):
            init(self, *args, **kw)
            for op in self.ops:
                t = type(op)
                if op is not None and t not in seen:
                    seen.add(t)
                    t.eval = marked(t.eval, t.__name__)
        S.Scheduler.__init__ = init_marked
    rng = np.random.default_rng(7)
    batches = [_bids(rng, a.rows, 20_000) for _ in range(64)] if a.rows else []
    with dbsp.Circuit(workers=1) as c:
        auctions, bids, out = with_history(c)
        for i in range(30 + a.steps):
            if a.rows:
                bids.push(batches[i % len(batches)])
            wait_for_merges()
            measured = i >= 30
            if measured:
                cg.cg_on()
                on[0] = True
            c.step()
            out.delta()
            if measured:
                on[0] = False
                cg.cg_off()


if __name__ == "__main__":
    main()
