# Run:  python bench/workloads/callgrind_launcher.py --workers 1 --out /tmp/cgl1
#       python bench/workloads/callgrind_launcher.py --workers 2 --out /tmp/cgl2
#       python bench/workloads/callgrind_launcher.py --sliced   (the workers read the bids)
#       (A/B: the same with PYTHONPATH=<other tree>/src; needs gcc and valgrind's headers)
"""Instructions of the launcher's worker processes by phase, join_avg steps (issues 13 and 14).

The driver launches the workers under ``valgrind --tool=callgrind`` (collection off), steps
through ``--warm`` steps, then switches collection on in every worker (an ``apply`` between
steps), runs ``--steps`` steps and switches it off. Each worker dumps at the start and end of
every operator's ``eval``, of each exchange, and of each read and write of its control socket,
so its instructions split into those phases (a phase's own part: nested phases apart); what
lies outside all of them is the step loop (``other``). Only each worker's main thread is
counted: callgrind keeps the collection switch per thread, so a spine's merger (which starts
with collection off) is not, nor are its merges (``callgrind_floor.py`` counts every
thread). Printed: instructions a step, W = 1 against the sum over the W workers.

Measured (10K events a step, 2 warm + 3 steps; W = 1 / W = 2, instructions a step): total 5.72M
/ 8.10M; aggregate 1.56M / 2.38M, index_by 1.93M / 2.28M, join 1.80M / 2.28M, the mesh
exchange 0 / 0.32M, reading the step's input 0.16M / 0.31M, sending the outputs 0.11M / 0.21M,
the step loop 0.14M / 0.27M. So 70% of the difference is each worker's per-step fixed cost in
the operators (mostly their Python glue and numpy / Arrow calls, paid once more by the second
worker), 30% the launcher's own messages.

``--sliced`` (stop 34): the workers read the bids themselves, so the exchange after the bids'
``index_by`` splits and merges every step's rows. W = 1 / W = 2: 6.84M / 13.37M before the
exchange's native split and two-run merge (the exchange 4.13M of the second), 6.58M / 11.12M
after (the exchange 2.15M): 1.95 -> 1.69. Stop 35: the workers deal the bids by key at the
input, and that exchange is local: 6.16M / 9.17M (1.49; the deal 0.82M and its exchange 0.47M
of the second), and at ``--events 100000`` 41.7M / 58.1M -> 42.7M / 48.9M (1.39 -> 1.15).
"""
from __future__ import annotations

import argparse
import collections
import functools
import glob
import os
import re
import shutil
import stat
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "operators"))

_CG: list = []


def _marked(fn, label: str):
    s, e = f"start:{label}".encode(), f"end:{label}".encode()
    cg = _CG[0]

    @functools.wraps(fn)
    def f(*args, **kw):
        cg.cg_mark(s)
        try:
            return fn(*args, **kw)
        finally:
            cg.cg_mark(e)
    return f


def cg_start(replica) -> int:
    """(In a worker, between steps.) Mark the phases, zero the counts, collect from now on."""
    from callgrind_step import _helper
    from dbsp.runtime import process
    from dbsp.storage import wire
    if not _CG:
        _CG.append(_helper())
        seen: set = set()
        for op in replica.ops:
            t = type(op)
            if op is not None and t not in seen:
                seen.add(t)
                t.eval = _marked(t.eval, t.__name__)
        process.wire = type(sys)("wire_marked")  # serve_replica's own reference to the module
        process.wire.__dict__.update(wire.__dict__)
        process.wire.send = _marked(wire.send, "ctrl_send")
        process.wire.recv = _marked(wire.recv, "ctrl_recv")
        tr = replica.ctx.transport
        tr.exchange = _marked(tr.exchange, "mesh_exchange")
        replica._plan = None  # the step plan binds each eval at its first step: bind again
    _CG[0].cg_on()
    return os.getpid()


def cg_stop(replica) -> int:
    _CG[0].cg_off()
    return os.getpid()


def summarize(prefix: str, steps: int) -> dict:
    """Instructions a step by phase, summed over the dumps of every worker: a dump belongs to
    the innermost phase open while it was counted (a phase's own part, nested ones apart)."""
    acc: collections.Counter = collections.Counter()
    dumps: dict = collections.defaultdict(list)
    for f in glob.glob(prefix + "*"):
        m = re.search(r"w(\d+)\.(\d+)-(\d+)$", f)
        if not m:
            continue
        # the worker's main thread: its phases (another thread never collects: module doc)
        if m.group(3) == "01":
            dumps[m.group(1)].append((int(m.group(2)), f))
    for files in dumps.values():
        stack: list = []
        for _, f in sorted(files):
            txt = open(f).read()
            n = int(re.search(r"^totals: (\d+)", txt, re.M).group(1))
            trig = re.search(r"desc: Trigger: Client Request: (\S+)", txt)
            acc["total"] += n
            acc[stack[-1] if stack else "other"] += n
            kind, _, label = (trig.group(1) if trig else "").partition(":")
            if kind == "start":
                stack.append(label)
            elif kind == "end" and stack:
                stack.pop()
    return {k: v / steps for k, v in acc.items()}


def run(workers: int, out: str, events: int, warm: int, steps: int, sliced: bool = False
        ) -> dict:
    import _efficiency as E
    import callgrind_launcher as me  # by its module name: the workers import it
    from dbsp.runtime.launcher import launch
    from dbsp.testing import pipelines as P
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    wrapper = os.path.join(tempfile.mkdtemp(prefix="dbsp-cgl-"), "python")
    with open(wrapper, "w") as f:
        f.write(f"#!/bin/sh\nexec valgrind -q --tool=callgrind --collect-atstart=no "
                f"--separate-threads=yes "
                f"--callgrind-out-file={out}/w%p {sys.executable} \"$@\"\n")
    os.chmod(wrapper, os.stat(wrapper).st_mode | stat.S_IEXEC)
    data = E.steps_of("join_avg", events, warm + steps)
    source = None
    if sliced:  # the bids written as pieces that each worker reads itself (_efficiency's mode)
        source, data = E.write_sliced("join_avg", data, tempfile.mkdtemp(prefix="dbsp-cgl-"))
    with launch(P.join_avg, workers=workers, python=wrapper, timeout=600,
                sliced=["bids"] if sliced else []) as job:
        outs = job.outputs

        def one(st: dict) -> None:
            for name, b in st.items():
                if source is not None and name == "bids":
                    job.circuit.read_slices(name, source, b)
                else:
                    job.inputs[name].push(b)
            job.step()
            for o in outs.values():
                o.delta()
        for st in data[:warm]:
            one(st)
        ex = job.coordinator
        ex.apply(me.cg_start)
        for st in data[warm:]:
            one(st)
        ex.apply(me.cg_stop)
    return summarize(os.path.join(out, "w"), steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default="/tmp/dbsp-cgl")
    ap.add_argument("--sliced", action="store_true",
                    help="the workers read the bids themselves (see _efficiency's sliced mode)")
    a = ap.parse_args()
    res = {}
    for w in (int(x) for x in a.workers.split(",")):
        res[w] = run(w, f"{a.out}{w}", a.events, a.warm, a.steps, a.sliced)
    keys = sorted(set().union(*res.values()), key=lambda k: -max(r.get(k, 0) for r in res.values()))
    print(f"join_avg {a.events} ev/step: worker instructions a step (summed over workers)")
    print(f"{'':22s}" + "".join(f"{'W=' + str(w):>14s}" for w in res))
    for k in keys:
        print(f"{k:22s}" + "".join(f"{r.get(k, 0):14,.0f}" for r in res.values()))


if __name__ == "__main__":
    main()
