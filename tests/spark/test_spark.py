"""dbsp on Spark local[2]: the barrier job of W replicas gives, step by step, the same output as
the embedded runtime; DataFrames go in and changes come out through Arrow; the spark.dbsp.*
settings are read; a worker error reaches the driver and the job stops cleanly."""
from __future__ import annotations

import pyarrow as pa
import pytest

pyspark = pytest.importorskip("pyspark", reason="pip install dbsp[spark]")  # CI installs it

import dbsp  # noqa: E402
from dbsp.runtime.launcher import build_outputs  # noqa: E402
from dbsp.spark import SparkJob, durable, run, settings  # noqa: E402
from dbsp.testing import crash  # noqa: E402
from dbsp.testing import pipelines as P  # noqa: E402
from _spark import sample_tables  # noqa: E402

pytestmark = pytest.mark.slow


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
            for name, t in sample_tables(st).items():
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


def run_killed(job, kills, seed, pick=None):
    return crash.run_killed(job, lambda step, token: crash.step_input(step, EVENTS, CHUNK),
                            STEPS, kills, seed, pick)


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
        recs = crash.check_recoveries(job, kills, pieces_per_step=0, checkpoint_every=4)
        assert any(r["replayed_steps"] > 0 for r in recs), recs
    res = crash.check(str(tmp_path), EVENTS)
    assert (res["lost"], res["duplicated"], res["unexpected"]) == (0, 0, 0), (res, kills)
    assert res["ok"] > 0


def test_killed_spark_tasks_keep_the_time_cadence(spark, tmp_path):
    """``checkpoint_seconds=100`` on Spark, 30 s a step by the driver's clock (moved by the
    input reader), tasks killed at random steps: every generation counts the time from when the
    restored checkpoint was taken, so a recovery past due commits one before new input and no
    recovery replays more than about twice the cadence (4 steps of 30 s)."""
    import time

    class Clock:
        now = time.time()

        def __call__(self):
            return self.now

    clock = Clock()

    def read(step, token):
        clock.now += 30
        return crash.step_input(step, EVENTS, CHUNK)

    with durable(spark, P.crash_views, storage=tmp_path, workers=2, checkpoint_seconds=100,
                 clock=clock, max_restarts=10) as job:
        kills = crash.run_killed(job, read, STEPS, 2, 3)
        assert len(kills) >= 1 and job.restarts >= len(kills), kills
        recs = crash.check_recoveries(job, kills, pieces_per_step=0, checkpoint_seconds=100)
        assert all(r["replayed_steps"] <= 8 for r in recs), recs
    res = crash.check(str(tmp_path), EVENTS)
    assert (res["lost"], res["duplicated"], res["unexpected"]) == (0, 0, 0), (res, kills)


# -- Structured Streaming source ---------------------------------------------------------------

def _durable_steps(d, lo, hi, chunk=10):
    """Events lo..hi of the crash stream through a durable embedded pipeline in ``d``."""
    from dbsp.api import StreamContext
    ctx = StreamContext(storage=d, durable=True)
    ev = ctx.stream(P.CRASH_EV, name="ev")
    ev.collect(name="ids")
    ctx.open()
    for a in range(lo, hi, chunk):
        rows = [crash.event(s) for s in range(a, min(a + chunk, hi))]
        ev.push(pa.table({"seq": [r[0] for r in rows], "k": [r[1] for r in rows],
                          "v": [r[2] for r in rows]}), position=a + chunk)
        ctx.step()
    ctx.close()


def _start_stream(df, name, tries=3):
    """Start a memory sink and process what is there. Spark starts the planner side of a
    Python streaming source as a fresh Python process and gives it a fixed 10 s to connect
    back (PythonWorkerFactory.createSimpleWorker), which a loaded 2-core machine can miss:
    that start-up error, and only it, is retried."""
    for i in range(tries):
        q = df.writeStream.format("memory").queryName(name).start()
        try:
            q.processAllAvailable()
            return q
        except Exception as e:
            q.stop()
            if "to connect back" not in str(e) or i == tries - 1:
                raise


def test_structured_streaming_reads_the_output_log_by_steps(spark, tmp_path):
    from dbsp.spark import source
    source.register(spark)
    d = str(tmp_path)
    _durable_steps(d, 0, 30)
    df = spark.readStream.format("dbsp").option("path", d).option("output", "ids").load()
    assert df.columns == ["seq", "k", "v", "__weight", "__step"]
    q = _start_stream(df, "dbsp_ids")
    try:
        got = spark.sql("select seq, __weight as w, __step as s from dbsp_ids").collect()
        assert sorted((r.seq, r.w, r.s) for r in got) == \
            [(s, 1, s // 10) for s in range(30)]
        _durable_steps(d, 30, 50)  # the pipeline goes on: only the new steps arrive
        q.processAllAvailable()
        got = spark.sql("select seq, __step as s from dbsp_ids").collect()
        assert sorted((r.seq, r.s) for r in got) == [(s, s // 10) for s in range(50)]
        offs = [p["sources"][0]["endOffset"] for p in q.recentProgress if p["sources"]]
        assert '{"step":5}' in {o.replace(" ", "") for o in offs if o}
    finally:
        q.stop()


def test_structured_streaming_source_options_are_checked(spark, tmp_path):
    from dbsp.spark import source
    source.register(spark)
    with pytest.raises(Exception, match="option\\('output'"):
        spark.readStream.format("dbsp").option("path", str(tmp_path)).load()
    with pytest.raises(Exception, match="holds no output log"):
        spark.readStream.format("dbsp").option("path", str(tmp_path / "nope")) \
            .option("output", "ids").load()
