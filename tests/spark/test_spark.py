"""dbsp on Spark local[2]: the barrier job of W replicas gives, step by step, the same output as
the embedded runtime; DataFrames go in and changes come out through Arrow; the spark.dbsp.*
settings are read; a worker error reaches the driver and the job stops cleanly."""
from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time

import pyarrow as pa
import pytest

pyspark = pytest.importorskip("pyspark", reason="pip install dbsp[spark]")  # CI installs it

import dbsp  # noqa: E402
from dbsp.runtime.launcher import build_outputs  # noqa: E402
from dbsp.spark import SparkJob, durable, run, settings  # noqa: E402
from dbsp.testing import crash  # noqa: E402
from dbsp.testing import pipelines as P  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    s = (SparkSession.builder.master("local[2]").appName("dbsp-tests")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.python.task.killTimeout", "500ms")
         .getOrCreate())
    yield s
    s.stop()


def _tables(step):
    """One step of sample_steps as Arrow tables (with a __weight column)."""
    schemas = {"bids": P.BIDS, "auctions": P.AUCTIONS, "edges": P.EDGES}
    out = {}
    for name, (rows, weights) in step.items():
        cols = list(zip(*rows)) if rows else [[] for _ in schemas[name]]
        t = pa.table({f.name: pa.array(c, f.type) for f, c in zip(schemas[name], cols)})
        out[name] = t.append_column("__weight", pa.array(weights, pa.int64()))
    return out


def _frames(spark, step):
    """One step of sample_steps as Spark DataFrames (with a __weight column)."""
    schemas = {"bids": P.BIDS, "auctions": P.AUCTIONS, "edges": P.EDGES}
    out = {}
    for name, (rows, weights) in step.items():
        cols = list(zip(*rows)) if rows else [[] for _ in schemas[name]]
        t = pa.table({f.name: pa.array(c, f.type) for f, c in zip(schemas[name], cols)})
        out[name] = spark.createDataFrame(t.append_column("__weight", pa.array(weights,
                                                                               pa.int64())))
    return out


def _embedded(steps):
    with dbsp.Circuit(workers=1) as c:
        outs = build_outputs(c, P.join_agg_closure)
        got = []
        for st in steps:
            P.push_step(c.inputs, st)
            c.step()
            got.append({k: o.to_dict() for k, o in outs.items()})
        return got


def test_barrier_job_matches_embedded(spark):
    """W = 2 on local[2]: the workers hold both slots, so input goes in as Arrow."""
    steps = P.sample_steps(4)
    want = _embedded(steps)
    with SparkJob(spark, P.join_agg_closure, workers=2) as job:
        assert job.startup_seconds > 0
        got = []
        for st in steps:
            for name, t in _tables(st).items():
                job.push(name, t)
            job.step()
            got.append({k: o.to_dict() for k, o in job.outputs.items()})
        assert job.circuit.state_rows() > 0
        # a Spark job now would wait for a slot forever: refused with the reason instead
        with pytest.raises(RuntimeError, match="task slots"):
            job.changes("agg")
        with pytest.raises(RuntimeError, match="task slots"):
            job.push("bids", _frames(spark, steps[0])["bids"])
    assert got == want
    assert sorted(r["worker"] for r in job.result) == [0, 1]  # both tasks ended normally


def test_dataframes_in_and_out_with_a_free_slot(spark):
    """W = 1 leaves a slot free: DataFrames are read and changes come back as DataFrames."""
    steps = P.sample_steps(2, seed=3)
    want = _embedded(steps)
    with SparkJob(spark, P.join_agg_closure, workers=1) as job:
        for st, w in zip(steps, want):
            for name, df in _frames(spark, st).items():
                job.push(name, df)
            job.step()
            back = job.changes("agg").toArrow()
            got = {(r["category"], r["n"], r["total"]): r["__weight"] for r in back.to_pylist()}
            assert got == w["agg"]


def test_run_returns_every_change_with_its_step(spark):
    steps = P.sample_steps(3, seed=11)
    want = _embedded(steps)
    spark.conf.set("spark.dbsp.workers", "2")
    try:
        assert settings(spark)["spark.dbsp.workers"] == "2"
        out = run(spark, "dbsp.testing.pipelines:join_agg_closure",
                  [_frames(spark, st) for st in steps])
    finally:
        spark.conf.unset("spark.dbsp.workers")
    t = out["closure"].toArrow()
    for i in range(len(steps)):
        rows = t.filter(pa.compute.equal(t["__step"], i))
        got = {(r["src"], r["dst"]): r["__weight"] for r in rows.to_pylist()}
        assert got == want[i]["closure"]


def test_more_workers_than_slots_is_refused_at_once(spark):
    with pytest.raises(ValueError, match="task slots"):
        SparkJob(spark, P.keyed_count, workers=3)


def test_worker_error_reaches_the_driver(spark):
    def failing(c):  # a local function: cloudpickle ships it by value to the executors
        ev = c.add_input("events", P.EVENTS)

        def boom(b):
            if pa.compute.any(pa.compute.equal(b["k"], 13)).as_py():
                raise ValueError("key 13 is poison")
            return b
        return {"out": ev.map(boom, P.EVENTS).output()}

    job = SparkJob(spark, failing, workers=2)
    try:
        job.push("events", P.keyed_events(100, 50, seed=1))
        job.push("events", [(13, 1)])
        with pytest.raises(ValueError, match="poison"):
            job.step()
    finally:
        job.close()
    assert not job.gen.alive


# -- recovery ----------------------------------------------------------------------------------

EVENTS, CHUNK = 200, 10
STEPS = EVENTS // CHUNK


def kill_tasks(job, rng, kills, stop, log, pick=None, sig=signal.SIGKILL):
    """Kill a replica process (a Spark task's Python worker; ``pick(pid)``: the process to kill
    instead, e.g. its executor) of the running generation ``kills`` times, at random steps, each
    once the generation before has recovered."""
    done = 0
    while done < kills and not stop.is_set():
        time.sleep(rng.uniform(0.1, 0.8))
        d = job.ft.durable if job.ft is not None else None
        pids = job.pids()
        if not pids or d is None or d is not job.durable or not d.opened \
                or d.step_no >= STEPS - 2:
            continue
        w = rng.choice(sorted(pids))
        victim = pick(pids[w]) if pick is not None else pids[w]
        try:
            os.kill(victim, sig)
        except ProcessLookupError:
            continue
        g = job.generation
        log.append((g, w, d.step_no, victim))
        done += 1
        while not stop.is_set():
            d = job.ft.durable
            if job.generation > g and d is job.durable and d.opened:
                break
            time.sleep(0.05)


def run_killed(job, kills, seed, pick=None):
    rng = random.Random(seed)
    stop, log = threading.Event(), []
    co = job.run(lambda step, token: crash.step_input(step, EVENTS, CHUNK))
    t = threading.Thread(target=kill_tasks, args=(job, rng, kills, stop, log, pick),
                         daemon=True)
    t.start()
    try:
        assert co.stop(STEPS) == STEPS
    finally:
        stop.set()
        t.join()
    return log


def test_durable_job_without_failures_is_exactly_once(spark, tmp_path):
    with durable(spark, P.crash_views, storage=tmp_path, workers=2, checkpoint_every=5) as job:
        co = job.run(lambda step, token: crash.step_input(step, EVENTS, CHUNK))
        assert co.stop(STEPS) == STEPS
        assert job.generation == 1
    res = crash.check(str(tmp_path), EVENTS)
    assert res["ok"] > 0 and res["lost"] == res["duplicated"] == res["unexpected"] == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_killed_spark_tasks_recover_exactly_once(spark, tmp_path, seed):
    """kill -9 of a task's Python worker at random steps, twice per run: Spark aborts the
    barrier job, the driver submits the next generation, which reloads the last checkpoint and
    replays the input log; the crash checker finds every row exactly once."""
    with durable(spark, P.crash_views, storage=tmp_path, workers=2, checkpoint_every=4,
                 max_restarts=10) as job:
        kills = run_killed(job, 2, seed)
        assert len(kills) >= 1 and job.restarts >= len(kills), kills
        assert len(job.recovery_seconds) >= len(kills)
    res = crash.check(str(tmp_path), EVENTS)
    assert (res["lost"], res["duplicated"], res["unexpected"]) == (0, 0, 0), (res, kills)
    assert res["ok"] > 0
