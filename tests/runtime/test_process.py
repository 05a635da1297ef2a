"""Worker processes: the same circuits on forked replicas exchanging over sockets, with a
worker killed mid-run reported as an error instead of a hang."""
from __future__ import annotations

import os
import signal

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import dbsp
from dbsp.runtime.process import WorkerDied

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("s", pa.string())])


def _build(c):
    t = c.add_input("t", SCHEMA)
    f = t.filter(lambda b: pc.greater_equal(b["k"], 0))
    sharded = f.index_by(["k"]).shard().flatten()
    return t, f.output(), sharded.output()


def test_processes_match_threads():
    rows = [(i % 37, f"v{i % 5}") for i in range(500)] + [(-1, "neg")]
    results = []
    for runtime in ("threads", "processes"):
        with dbsp.Circuit(workers=2, runtime=runtime) as c:
            t, out, sh = _build(c)
            t.insert(rows)
            c.step()
            t.delete(rows[:100])
            c.step()
            results.append((out.view_dict(), sh.view_dict(), sh.to_dict()))
    assert results[0] == results[1]
    assert (-1, "neg") not in results[0][0]


def test_linear_aggregate_partials_cross_processes():
    """count / sum / avg over int, float and decimal columns, with retractions, on 2 worker
    processes: each worker's partial sums travel to the key's owner (numpy columns, decimal
    sums as Arrow arrays) and are added there; the answer matches the reference model."""
    from decimal import Decimal

    from dbsp.testing import reference as ref
    from dbsp.testing.harness import check_steps
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("x", pa.int64()),
                        pa.field("f", pa.float64()), pa.field("d", pa.decimal128(9, 2))])
    aggs = {"n": ("count", None), "sx": ("sum", "x"), "sf": ("sum", "f"), "sd": ("sum", "d"),
            "ax": ("avg", "x"), "ad": ("avg", "d")}
    spec = [("count", None), ("sum", 0), ("sum", 1), ("sum", 2), ("avg", 0), ("avg", 2)]
    rows = {(k % 7, k, k / 4, Decimal(k) / 4 if k % 3 else None): 1 for k in range(60)}
    steps = [rows, {r: -1 for r in list(rows)[:25]},
             {(3, None, 1.5, Decimal("2.50")): 2, (100, 5, 0.5, Decimal("0.01")): 1}]
    check_steps(2, {"t": schema},
                lambda t: t.index_by(["k"]).aggregate(aggs),
                lambda z: ref.aggregate(z, [0], spec), [{"t": st} for st in steps],
                runtime="processes")


@pytest.mark.parametrize("rows", [[(1, "a"), (5000, "b")],   # fails in forked worker 1
                                  [(5000, "b"), (1, "a")]])  # fails in worker 0, the driver
def test_process_worker_error_is_reported(rows):
    def bad(b):
        if b.num_rows and pc.max(b["k"]).as_py() > 1000:
            raise ValueError("user function failed on a big key")
        return b

    with dbsp.Circuit(workers=2, runtime="processes") as c:
        t = c.add_input("t", SCHEMA)
        out = t.map(bad, SCHEMA).index_by(["k"]).shard().flatten().output()
        t.insert(rows)
        with pytest.raises(ValueError, match="big key"):
            c.step()
        # rolled back on every worker, over a fresh socket mesh: the next steps work
        t.insert([(1, "a"), (7, "c")])
        c.step()
        t.insert([(8, "d")])
        c.step()
        assert out.view_dict() == {(1, "a"): 1, (7, "c"): 1, (8, "d"): 1}


@pytest.mark.crash
def test_killed_worker_fails_the_step():
    with dbsp.Circuit(workers=2, runtime="processes") as c:
        t, out, sh = _build(c)
        t.insert([(1, "a")])
        c.step()
        os.kill(c._executor.pids[1], signal.SIGKILL)
        os.waitpid(c._executor.pids[1], 0)
        t.insert([(2, "b"), (3, "c")])
        with pytest.raises(WorkerDied, match="worker process 1"):
            c.step()


def test_unknown_call_is_refused_and_the_workers_keep_working():
    with dbsp.Circuit(workers=2, runtime="processes") as c:
        t = c.add_input("t", SCHEMA)
        out = t.index_by(["k"]).shard().flatten().output()
        t.insert([(1, "a")])
        c.step()
        with pytest.raises(ValueError, match="unknown call 'bogus'"):
            c._executor.call("bogus")
        t.insert([(2, "b")])
        c.step()
        assert out.view_dict() == {(1, "a"): 1, (2, "b"): 1}
        assert len(c.profile()) == len(c.nodes)


def test_state_rows_from_processes():
    with dbsp.Circuit(workers=2, runtime="processes") as c:
        t = c.add_input("t", SCHEMA)
        t.integrate().output(view=False)
        t.insert([(i, "x") for i in range(10)])
        c.step()
        assert c.state_rows() == 10
