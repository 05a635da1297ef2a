"""One fixture over every runtime: the same circuits give identical output, step by step,
embedded (1 and 2 workers), on the launcher (2 and 3 processes), on Spark ``local[2]`` and on
``local-cluster[2,1,1024]`` (a standalone master, a worker and two executor JVMs, from the pip
wheel alone). The circuits: a join, an aggregate and a recursive query
(:func:`~dbsp.testing.pipelines.join_agg_closure`); Nexmark q4 and q7 and a windowed query
(:func:`~dbsp.nexmark.pipelines.nexmark_views`). Then, on ``local-cluster``: a whole executor
JVM killed mid-run at random steps, and the crash checker finds every row exactly once.

The Spark sessions come from ``conftest.py`` (one live session at a time, shared with the
other Spark tests).
"""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

pyspark = pytest.importorskip("pyspark", reason="pip install dbsp[spark]")  # CI installs it

import dbsp  # noqa: E402
from dbsp.runtime.launcher import build_outputs, launch  # noqa: E402
from dbsp.spark import SparkJob, durable  # noqa: E402
from dbsp.testing import crash  # noqa: E402
from dbsp.nexmark import pipelines as NP  # noqa: E402
from dbsp.testing import pipelines as P  # noqa: E402
from _spark import CLUSTER, LOCAL, executor_of, sample_tables  # noqa: E402

EVENTS, CHUNK = 200, 10
STEPS = EVENTS // CHUNK

pytestmark = pytest.mark.slow



def _steps(pipeline):
    if pipeline is P.join_agg_closure:
        return [sample_tables(st) for st in P.sample_steps(4)]
    return [{k: pa.Table.from_batches([rb]) for k, rb in st.items()}
            for st in NP.nexmark_steps(12_000, 3_000)]


def _drive(inputs, outputs, step, steps):
    """Per step, every output's change as a dict; then every view."""
    got = []
    for st in steps:
        for name, t in st.items():
            if "__weight" in t.column_names:
                inputs[name].push(t.drop_columns(["__weight"]), t.column("__weight").to_numpy())
            else:
                inputs[name].push(t)
        step()
        got.append({k: o.to_dict() for k, o in outputs.items()})
    return got, {k: o.view_dict() for k, o in outputs.items()}


def _run(runtime: str, pipeline, steps, sessions):
    kind, _, n = runtime.partition("-")
    if kind == "embedded":
        with dbsp.Circuit(workers=int(n)) as c:
            outs = build_outputs(c, pipeline)
            return _drive(c.inputs, outs, c.step, steps)
    if kind == "launcher":
        with launch(pipeline, int(n)) as job:
            return _drive(job.inputs, job.outputs, job.step, steps)
    with SparkJob(sessions.get(LOCAL if kind == "local" else CLUSTER), pipeline,
                  workers=2, timeout=600) as job:
        return _drive(job.inputs, job.outputs, job.step, steps)


RUNTIMES = ["embedded-1", "embedded-2", "launcher-2", "launcher-3", "local-2", "cluster-2"]
PIPELINES = {"join_agg_closure": P.join_agg_closure, "nexmark_views": NP.nexmark_views}
_want: dict = {}


@pytest.fixture(params=RUNTIMES)
def runtime(request, sessions):
    """The one fixture over every runtime: ``runtime(pipeline, steps)`` runs ``pipeline`` on
    the runtime of this parameter (embedded 1 and 2 workers, the launcher's 2 and 3 processes,
    Spark ``local[2]`` and ``local-cluster[2,1,1024]`` with 2 barrier tasks) and returns each
    step's changes and the final views."""
    def run(pipeline, steps):
        return _run(request.param, pipeline, steps, sessions)
    run.name = request.param
    return run


def _expected(name):
    """The reference: one embedded worker (computed once per pipeline)."""
    if name not in _want:
        _want[name] = _run("embedded-1", PIPELINES[name], _steps(PIPELINES[name]), None)
    return _want[name]


@pytest.mark.parametrize("name", list(PIPELINES))
def test_same_output_on_every_runtime(runtime, name):
    per_step, views = _expected(name)
    assert all(len(v) > 0 for v in views.values()), f"{name}: a view is empty, the test is vacuous"
    got_steps, got_views = runtime(PIPELINES[name], _steps(PIPELINES[name]))
    assert len(got_steps) == len(per_step)
    for i, (a, b) in enumerate(zip(got_steps, per_step)):
        assert a == b, f"{runtime.name} {name}: step {i} differs"
    assert got_views == views


def test_killed_executors_recover_exactly_once(sessions, tmp_path):
    """kill -9 of a whole executor JVM at random steps, twice: the standalone worker starts a
    new executor, the driver the next generation; every row exactly once."""
    spark = sessions.get(CLUSTER)
    with durable(spark, P.crash_views, storage=tmp_path, workers=2, checkpoint_every=4,
                 max_restarts=10, timeout=600) as job:
        kills = crash.run_killed(job, lambda step, token: crash.step_input(step, EVENTS, CHUNK),
                                 STEPS, 2, random.randrange(1 << 30), pick=executor_of)
        assert len(kills) >= 1 and job.restarts >= len(kills), kills
        recs = crash.check_recoveries(job, kills, pieces_per_step=0, checkpoint_every=4)
        assert any(r["replayed_steps"] > 0 for r in recs), recs
    res = crash.check(str(tmp_path), EVENTS)
    assert (res["lost"], res["duplicated"], res["unexpected"]) == (0, 0, 0), (res, kills)
    assert res["ok"] > 0


def jvm_of(pid: int) -> int:
    """The JVM above a Spark task's Python worker: its executor's on ``local-cluster``, the
    driver's on ``local[N]`` (Spark's unit of placement: a task's "host")."""
    p = pid
    while p > 1:
        with open(f"/proc/{p}/comm") as f:
            if f.read().strip() == "java":
                return p
        with open(f"/proc/{p}/stat") as f:
            p = int(f.read().rsplit(")", 1)[1].split()[1])
    raise AssertionError(f"no JVM above process {pid}")


def test_same_workers_recover_on_fewer_executors(sessions, tmp_path):
    """Seed 000: the worker count is fixed for recovery, the hosts are not. 2 workers in 2
    executor JVMs (``local-cluster``) checkpoint, run on and stop without a last checkpoint (as
    a crash would leave it); the same 2 workers as tasks of one JVM (``local[2]``) reload that
    checkpoint from the shared storage as it is (nothing re-sharded), replay the steps after it
    and run to the end: every step's changes equal a one-worker run, every row exactly once."""
    spark = sessions.get(CLUSTER)
    with durable(spark, P.crash_views, storage=tmp_path, workers=2, checkpoint_every=5,
                 timeout=600) as job:
        job.open()
        crash.feed(job, 12, EVENTS, CHUNK)
        before = {jvm_of(pid) for pid in job.pids().values()}
        job.durable.checkpoint_on_close = False  # steps 10, 11 are left to replay
    assert len(before) == 2, before
    spark = sessions.get(LOCAL)
    with durable(spark, P.crash_views, storage=tmp_path, workers=2, checkpoint_every=5) as job:
        d = job.open()
        assert d.replayed == 2 and d.layout_change is None
        after = {jvm_of(pid) for pid in job.pids().values()}
        crash.feed(job, STEPS, EVENTS, CHUNK)
    assert len(after) == 1 and not after & before, (before, after)
    assert crash.logged_steps(str(tmp_path)) == crash.fixed_scale_steps(EVENTS, CHUNK)
    res = crash.check(str(tmp_path), EVENTS)
    assert (res["lost"], res["duplicated"], res["unexpected"]) == (0, 0, 0), res
    assert res["ok"] > 0
