"""Spark tasks that read their own input (``dbsp.runtime.slices``): Parquet files dealt to the
barrier tasks by row group on ``local[2]`` and ``local[4]`` (3 tasks), and a DataFrame as the
barrier job's own input (each task reads its partition step by step), equal to the driver-fed
path; and a durable job on ``local[4]`` scaled 1 -> 2 -> 3 -> 2 tasks, equal to a fixed-scale
run, exactly-once, with the state moved at each change beside the minimum 1/(W+1)."""
from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pytest

pytest.importorskip("pyspark", reason="pip install dbsp[spark]")  # CI installs it

import dbsp  # noqa: E402
import dbsp.api  # noqa: E402
from dbsp.runtime.slices import SourceStep  # noqa: E402
from dbsp.spark import SparkJob, durable, run  # noqa: E402
from dbsp.testing import crash  # noqa: E402
from dbsp.testing import pipelines as P  # noqa: E402
from _spark import check_changes, keyed_counts, view_rows  # noqa: E402


_pushed, _sliced_views, bids_files = P.views_pushed, P.views_sliced, P.bids_files

pytestmark = pytest.mark.slow

EVENTS, CHUNK = 300, 10
STEPS = EVENTS // CHUNK


def test_tasks_read_their_own_file_slices_local2(spark, tmp_path):
    steps = P.sample_steps(4)
    want = _pushed(steps)
    src = bids_files(tmp_path / "bids", steps)
    with SparkJob(spark, P.join_agg_closure, workers=2, sliced=["bids"]) as job:
        sent = []
        send = job.coordinator._send
        job.coordinator._send = lambda msgs: (sent.append(msgs), send(msgs))[1]
        got = _sliced_views(job, job.outputs, steps, src)
    bids = job.circuit.inputs["bids"].node
    assert not any(bids in m[1] for msgs in sent for m in msgs.values() if m[0] == "step")
    assert got == want


def test_stream_api_pipeline_declares_its_sliced_input_local2(spark, tmp_path):
    """A stream-API pipeline function (``ctx.stream(BIDS, name="bids", sliced=True)``) on
    Spark, with no ``sliced=`` given to the job: the tasks read the pieces themselves, equal
    to the stream fed through the driver."""
    from dbsp.api import StreamContext
    steps = P.sample_steps(3)
    want = []
    ctx = StreamContext()
    bids = ctx.stream(P.BIDS, name="bids")
    agg = bids.group_by("auction").agg(n=dbsp.api.count(), total=dbsp.api.sum_("price")) \
        .collect()
    for stp in steps:
        rows, weights = stp["bids"]
        bids.push(rows, weights=weights)
        ctx.step()
        want.append(agg.delta_dict())
    ctx.close()
    src = bids_files(tmp_path / "bids", steps)
    got = []
    with SparkJob(spark, P.stream_bids_sliced, workers=2) as job:
        assert job.circuit.sliced == {"bids"}
        for k in range(len(steps)):
            job.read_slices("bids", src, k)
            job.step()
            got.append(job.outputs["agg"].to_dict())
    assert got == want


def test_run_with_sliced_steps_local2(spark, tmp_path):
    steps = P.sample_steps(3)
    src = bids_files(tmp_path / "bids", steps)
    want = Counter()
    for s, d in enumerate(_pushed(steps)):
        want.update({(s,) + k: w for k, w in d["agg"].items()})
    plan = []
    for s, stp in enumerate(steps):
        st = {k: v for k, v in stp.items() if k != "bids"}
        tables = {}
        for name, (rows, weights) in st.items():
            schema = {"auctions": P.AUCTIONS, "edges": P.EDGES}[name]
            cols = list(zip(*rows)) if rows else [[] for _ in schema]
            t = pa.table({f.name: pa.array(c, f.type) for f, c in zip(schema, cols)})
            tables[name] = t.append_column("__weight", pa.array(weights, pa.int64()))
        tables["bids"] = SourceStep(s)
        plan.append(tables)
    out = run(spark, P.join_agg_closure, plan, workers=2, sources={"bids": src})
    t = out["agg"].toArrow()
    got = Counter()
    for r in t.to_pylist():
        got[(r["__step"], r["category"], r["n"], r["total"])] += r["__weight"]
    assert +got == +want


def test_dataframe_partitions_are_the_barrier_job_input_local2(spark):
    ev = P.keyed_events(4000, 50, 3)  # 2000 rows a partition: the last step reads nothing
    want = keyed_counts(ev)
    df = spark.createDataFrame(pa.Table.from_batches([ev]))
    view: Counter = Counter()
    rows = 0
    with SparkJob(spark, P.keyed_count, workers=2, partitioned=("events", df, 500)) as job:
        k = 0
        while True:
            job.read_partition(k)
            job.step()
            rows += sum(r for r, _ in job.circuit.last_slices["events"]["report"])
            view.update(job.outputs["counts"].to_dict())
            k += 1
            if job.partition_ended:
                break
    assert rows == 4000 and k >= 4000 // (2 * 500)
    assert view_rows(view) == want


def test_three_tasks_read_their_own_file_slices_local4(spark4, tmp_path):
    steps = P.sample_steps(4)
    want = _pushed(steps)
    src = bids_files(tmp_path / "bids", steps, "arrow")
    with SparkJob(spark4, P.join_agg_closure, workers=3, sliced=["bids"]) as job:
        got = _sliced_views(job, job.outputs, steps, src)
    assert got == want


def test_scale_1_2_3_2_on_spark_local4_equals_a_fixed_scale_run(spark4, tmp_path):
    changes = []
    with durable(spark4, P.crash_views, storage=tmp_path, workers=1, checkpoint_every=4,
                 timeout=600) as job:
        job.open()
        crash.feed(job, 6, EVENTS, CHUNK)
        for W, n in [(2, 8), (3, 8), (2, 8)]:
            step = job.durable.step_no
            ch = job.relayout(W)
            with open(tmp_path / "checkpoints.json") as f:
                last = json.load(f)["catalog"]["checkpoints"][-1]
            assert ch["step"] == step and last["step"] == step
            assert last["layout"]["shards"]["workers"] == W and len(job.pids()) == W
            changes.append(ch)
            crash.feed(job, n, EVENTS, CHUNK)
        assert job.durable.step_no == STEPS
    check_changes(changes, "Spark local[4]")
    assert crash.logged_steps(str(tmp_path)) == crash.fixed_scale_steps(EVENTS, CHUNK)
    res = crash.check(str(tmp_path), EVENTS)
    assert res["ok"] > 0 and (res["lost"], res["duplicated"], res["unexpected"]) == (0, 0, 0)


def test_partition_reader_reads_pieces_from_the_task_iterator():
    from dbsp.spark import PartitionReader
    batches = [pa.record_batch({"k": list(range(i, i + 3))}) for i in range(0, 9, 3)]
    pulled = []

    def it():
        for b in batches:
            pulled.append(b)
            yield b
    r = PartitionReader(it())
    assert r.read({"start": 0, "end": 4}).column("k").to_pylist() == [0, 1, 2, 3]
    assert len(pulled) == 2  # read lazily, as far as the piece needs
    assert r.read({"start": 0, "end": 4}).num_rows == 4  # a rolled-back step reads it again
    assert r.read({"start": 4, "end": 8}).column("k").to_pylist() == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="let go"):
        r.read({"start": 0, "end": 4})
    assert r.read({"start": 8, "end": 12}).column("k").to_pylist() == [8]
    t = r.read({"start": 12, "end": 16})
    assert t.num_rows == 0 and t.schema == batches[0].schema and r.done


def test_durable_job_on_dataframe_partitions_recovers_exactly_once(spark, tmp_path):
    """The DataFrame as the durable job's barrier input: steps logged as row ranges of each
    task's partition; a new generation (as after a lost task) re-reads its partition, skips
    the rows before the checkpoint and checks the replayed ones; the output log holds every
    change once."""
    ev = P.keyed_events(3000, 40, 5)
    want = keyed_counts(ev)
    df = spark.createDataFrame(pa.Table.from_batches([ev]))
    with durable(spark, P.keyed_count, storage=tmp_path, workers=2, checkpoint_every=2,
                 timeout=600, partitioned=("events", df, 300)) as job:
        d = job.open()
        for k in range(3):
            d.step(slices={"events": k})
        d = job.restart()  # the next generation: the last checkpoint, then the log replayed
        assert d.step_no == 3 and d.replayed >= 1
        k = 3
        while not job.partition_ended:
            d.step(slices={"events": k})
            k += 1
    got: Counter = Counter()
    for _, tables in crash.read_outputs(str(tmp_path / "ft" / "output")):
        for t in tables.values():  # the one output (keyed_count's view is not named)
            for r in t.to_pylist():
                got[(r["k"], r["n"], r["s"])] += r["__weight"]
    assert view_rows(got) == want
