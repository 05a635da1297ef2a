"""A durable pipeline with worker processes: a worker killed with ``kill -9`` between or in the
middle of steps is replaced inside a plain ``ctx.step()`` (restore the last checkpoint, replay
the input log), seen by the program only as a warning and ``report()["fault_tolerance"]
["worker_restarts"]``; and checkpoints written by the worker processes beside the next steps."""
from __future__ import annotations

import logging
import os
import signal
import threading

import pyarrow as pa
import pytest

from dbsp.api import StreamContext
from dbsp.api.expr.aggregates import count, max_, sum_
from dbsp.ft import read_outputs

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])


def make(d, **kw):
    ctx = StreamContext(workers=2, runtime="processes", storage=d, **kw)
    s = ctx.stream(SCHEMA, name="s")
    agg = s.group_by("k").agg(n=count(), t=sum_("v"), hi=max_("v")).collect(name="agg")
    return ctx, s, agg


def expected(rows):
    out = {}
    for k, v in rows:
        n, t, hi = out.get(k, (0, 0, None))
        out[k] = (n + 1, t + v, v if hi is None else max(hi, v))
    return {(k, n, t, hi): 1 for k, (n, t, hi) in out.items()}


def logged_view(d):
    got: dict = {}
    for _, tables in read_outputs(os.path.join(d, "ft", "output")):
        t = tables.get("agg")
        for r in ([] if t is None else t.to_pylist()):
            key = (r["k"], r["n"], r["t"], r["hi"])
            got[key] = got.get(key, 0) + r["__weight"]
    return {k: w for k, w in got.items() if w}


def rows_of(i):
    return [(j % 7, i * 10 + j) for j in range(10)]


@pytest.mark.slow
def test_killed_worker_process_is_replaced_inside_step(tmp_path, caplog):
    d = str(tmp_path)
    ctx, s, agg = make(d, checkpoint_every=3)
    pushed = []
    kills = {4, 9, 10}  # between steps, twice in a row, right after a checkpoint
    with caplog.at_level(logging.WARNING, logger="dbsp.ft"):
        for i in range(14):
            if i in kills:
                pid = ctx.circuit._executor.pids[1]
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            s.push(rows_of(i))
            pushed += rows_of(i)
            ctx.step()
            assert agg.view_dict() == expected(pushed)  # as if nothing had happened
    rep = ctx.report()
    assert rep["fault_tolerance"]["worker_restarts"] == 3
    assert rep["steps"] == 14
    assert sum("worker process died" in r.getMessage() for r in caplog.records) == 3
    ctx.close()
    assert logged_view(d) == expected(pushed)  # the output log: no loss, no duplicate


@pytest.mark.slow
def test_worker_killed_during_a_step(tmp_path):
    d = str(tmp_path)
    ctx, s, agg = make(d, checkpoint_every=2)
    pushed = []
    for i in range(4):
        s.push(rows_of(i))
        pushed += rows_of(i)
        ctx.step()
    pid = ctx.circuit._executor.pids[1]
    # the kill lands while the step runs (a big step: the worker is busy for a while)
    big = [(j % 1000, j) for j in range(200_000)]
    killer = threading.Timer(0.05, os.kill, (pid, signal.SIGKILL))
    s.push(big)
    pushed += big
    killer.start()
    ctx.step()
    killer.join()
    s.push(rows_of(99))
    pushed += rows_of(99)
    ctx.step()
    assert agg.view_dict() == expected(pushed)
    # the kill landed in the big step, or (if it was done first) before the next one
    assert ctx.report()["fault_tolerance"]["worker_restarts"] == 1
    ctx.close()
    assert logged_view(d) == expected(pushed)


def test_process_checkpoints_are_written_beside_the_steps(tmp_path):
    d = str(tmp_path)
    ctx, s, agg = make(d, durable=True)
    pushed = []
    for i in range(3):
        s.push(rows_of(i))
        pushed += rows_of(i)
        ctx.step()
    assert ctx.durable.background
    assert ctx.checkpoint(wait=False) is None  # captured; written by the workers' threads
    for i in range(3, 6):
        s.push(rows_of(i))
        pushed += rows_of(i)
        ctx.step()
    ctx.durable.wait_checkpoint()
    assert ctx.report()["last_checkpoint"]["step"] == 3
    ctx.durable.checkpoint_on_close = False
    ctx.close()
    ctx2, s2, agg2 = make(d, durable=True)
    ctx2.open()
    assert ctx2.durable.last_checkpoint.step == 3 and ctx2.durable.replayed == 3
    assert agg2.view_dict() == expected(pushed)
    ctx2.close()
