"""What several Spark test modules share besides their sessions (``conftest.py``): the
sample steps as Arrow tables, the one-worker reference of a keyed stream, the executor
above a task (what the executor-kill tests kill), and the account of a job's layout
changes."""
from __future__ import annotations

from collections import Counter

import pyarrow as pa

import dbsp
from dbsp.runtime.launcher import build_outputs
from dbsp.testing import pipelines as P

#: the masters of the Spark tests' sessions (``conftest.Sessions``)
LOCAL, LOCAL4, CLUSTER = "local[2]", "local[4]", "local-cluster[2,1,1024]"


def sample_tables(step: dict) -> dict[str, pa.Table]:
    """One step of :func:`~dbsp.testing.pipelines.sample_steps` as Arrow tables (with a
    ``__weight`` column)."""
    schemas = {"bids": P.BIDS, "auctions": P.AUCTIONS, "edges": P.EDGES}
    out = {}
    for name, (rows, weights) in step.items():
        cols = list(zip(*rows)) if rows else [[] for _ in schemas[name]]
        t = pa.table({f.name: pa.array(c, f.type) for f, c in zip(schemas[name], cols)})
        out[name] = t.append_column("__weight", pa.array(weights, pa.int64()))
    return out


def keyed_counts(ev: pa.RecordBatch) -> dict:
    """:func:`~dbsp.testing.pipelines.keyed_count`'s view of ``ev`` on one embedded worker,
    in one step (the reference of the DataFrame-input tests)."""
    with dbsp.Circuit() as c:
        outs = build_outputs(c, P.keyed_count)
        c.inputs["events"].push(ev)
        c.step()
        return outs["counts"].to_dict()


def executor_of(pid: int) -> int:
    """The executor JVM above a Spark task's Python worker (its ancestor running
    CoarseGrainedExecutorBackend): the ``pick`` of :func:`dbsp.testing.crash.run_killed`
    that kills a whole executor."""
    p = pid
    while p > 1:
        with open(f"/proc/{p}/cmdline", "rb") as f:
            if b"CoarseGrainedExecutorBackend" in f.read():
                return p
        with open(f"/proc/{p}/stat") as f:
            p = int(f.read().rsplit(")", 1)[1].split()[1])
    raise AssertionError(f"no executor JVM above process {pid}")


def check_changes(changes: list[dict], title: str) -> None:
    """Print the state moved at each layout change of a 1 -> 2 -> 3 -> 2 run beside the
    minimum 1/(W+1), and check that each moved some of it and kept the rest."""
    print(f"\n{title}, state moved at each change (fraction, minimum 1/(W+1)):")
    for c in changes:
        lo = 1 / max(c["from_workers"], c["to_workers"])
        print(f"  {c['from_workers']} -> {c['to_workers']} tasks: {c['moved_fraction']:.3f} "
              f"(min {lo:.3f}, ratio {c['moved_fraction'] / lo:.2f}; {c['moved_rows']} of "
              f"{c['moved_rows'] + c['kept_rows']} rows), {c['seconds']:.1f} s")
    assert [(c["from_workers"], c["to_workers"]) for c in changes] == [(1, 2), (2, 3), (3, 2)]
    for c in changes:
        assert 0 < c["moved_fraction"] < 1 and c["kept_rows"] > 0


def view_rows(view: Counter) -> dict:
    """The rows of a view summed from its changes (zero weights dropped)."""
    return {r: w for r, w in view.items() if w}
