"""Sliced sources in the stream API: ``ctx.stream(FileSlices(...))`` has the workers read the
pieces of each step themselves (Parquet row groups, Arrow IPC record batches), equal step by
step to the same rows pushed through the driver; with worker threads and processes; and a
durable pipeline logs the pieces, resumes after them, and replays them after a crash."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dbsp.api import StreamContext, col, count, sum_
from dbsp.connectors.slices import FileSlices
from dbsp.testing import pipelines as P


def _pipeline(ctx, source):
    bids = ctx.stream(source, name="bids")
    out = bids.group_by("auction").agg(n=count(), total=sum_("price")).collect()
    hot = bids.filter(col("price") > 500).select("auction", "price").collect()
    return bids, out, hot


def _pushed(steps, workers=1):
    """Every step's changes with the bids pushed through the driver."""
    ctx = StreamContext(workers=workers)
    bids, out, hot = _pipeline(ctx, P.BIDS)
    got = []
    for stp in steps:
        rows, weights = stp["bids"]
        bids.push(rows, weights=np.asarray(weights, np.int64))
        ctx.step()
        got.append((out.delta_dict(), hot.delta_dict()))
    ctx.close()
    return got


@pytest.mark.parametrize("workers,runtime,fmt", [(1, "threads", "parquet"),
                                                 (2, "threads", "arrow"),
                                                 (3, "processes", "parquet")])
def test_sliced_stream_equals_the_driver_fed_stream(tmp_path, workers, runtime, fmt):
    steps = P.sample_steps(5)
    want = _pushed(steps)
    src = P.bids_files(str(tmp_path / "bids"), steps, fmt, group=37)
    assert all(len(src.pieces(k)) >= 2 for k in range(len(steps)))  # several per step
    ctx = StreamContext(workers=workers, runtime=runtime)
    bids, out, hot = _pipeline(ctx, src)
    assert ctx.circuit.sliced == {"bids"}
    got = []
    while not ctx.drained:
        ctx.step()
        got.append((out.delta_dict(), hot.delta_dict()))
        k = len(got) - 1
        pieces = ctx.circuit.last_slices["bids"]["pieces"]
        assert pieces == src.pieces(k)
    ctx.close()
    assert got == want
    assert bids.source.rows_in == src.rows


def _in_one_step(steps) -> list:
    """The view's rows (sorted) of the pipeline fed every step's bids through the driver in
    one step."""
    with StreamContext() as ref:
        bids, out, _ = _pipeline(ref, P.BIDS)
        for stp in steps:
            rows, weights = stp["bids"]
            bids.push(rows, weights=np.asarray(weights, np.int64))
        ref.step()
        return sorted(out.rows())


def test_execute_runs_the_sliced_steps_and_stops(tmp_path):
    steps = P.sample_steps(3)
    src = P.bids_files(str(tmp_path / "bids"), steps)
    ctx = StreamContext(workers=2)
    _, out, _ = _pipeline(ctx, src)
    ctx.execute()
    assert ctx.steps == 3 and ctx.drained
    assert sorted(out.rows()) == _in_one_step(steps)
    ctx.close()


def test_a_sliced_source_needs_a_schema():
    class NoSchema:
        def pieces(self, k):
            return None

        def read(self, piece):
            raise AssertionError

    with pytest.raises(TypeError, match="schema="):
        StreamContext().stream(NoSchema(), name="x")
    ctx = StreamContext()
    s = ctx.stream(NoSchema(), name="x", schema=P.BIDS)
    assert s.source.exhausted and ctx.drained


def test_durable_sliced_stream_resumes_after_the_logged_pieces(tmp_path):
    """Three steps, a checkpoint after the second, then a crash (no close): the reopened
    pipeline restores the checkpoint, replays the third step's logged pieces (read again by the
    workers, checked against the logged rows and checksum) and goes on from the fourth; the
    changes over both runs are the driver-fed run's, each step once."""
    steps = P.sample_steps(6)
    want = _pushed(steps)
    src = P.bids_files(str(tmp_path / "bids"), steps)
    store = str(tmp_path / "store")
    ctx = StreamContext(workers=2, storage=store, checkpoint_every=2)
    _, out, hot = _pipeline(ctx, src)
    got = []
    for k in range(3):
        ctx.step()
        got.append((out.delta_dict(), hot.delta_dict()))
        if k == 1:
            ctx.durable.wait_checkpoint()  # (written in the background)
    ctx.circuit.close()  # a crash: the last step is after the checkpoint, no last checkpoint
    ctx2 = StreamContext(workers=2, storage=store, checkpoint_every=2)
    _, out2, hot2 = _pipeline(ctx2, FileSlices(str(tmp_path / "bids")))
    ctx2.open()
    assert ctx2.durable.replayed == 1 and ctx2.steps == 3
    rec = ctx2.durable.recovery  # checkpoint 2 reloaded, step 2's pieces read again
    assert rec["checkpoint_step"] == 2 and rec["replayed_steps"] == 1
    assert rec["replayed_pieces"] >= 1
    while not ctx2.drained:
        ctx2.step()
        got.append((out2.delta_dict(), hot2.delta_dict()))
    ctx2.close()
    assert got == want
    assert sorted(out2.rows()) == _in_one_step(steps)


def test_durable_sliced_stream_refuses_a_changed_file_on_replay(tmp_path):
    import pyarrow.parquet as pq
    from dbsp.ft.durable import RecoveryError
    steps = P.sample_steps(3)
    d = str(tmp_path / "bids")
    src = P.bids_files(d, steps)
    store = str(tmp_path / "store")
    ctx = StreamContext(workers=1, storage=store, durable=True)
    _pipeline(ctx, src)
    ctx.step()
    ctx.step()
    ctx.circuit.close()  # no checkpoint: both steps replay
    t = pq.read_table(src.files[1])
    i = t.schema.get_field_index("price")
    t = t.set_column(i, t.schema.field(i), pa.array(t.column(i).to_numpy()[::-1].copy()))
    pq.write_table(t, src.files[1], row_group_size=47)  # same rows per group, other content
    ctx2 = StreamContext(workers=1, storage=store, durable=True)
    _pipeline(ctx2, FileSlices(d))
    with pytest.raises(RecoveryError, match="bids"):
        ctx2.open()
    ctx2.circuit.close()


@pytest.mark.parametrize("procs", [2, 3])
def test_launcher_workers_read_the_sliced_stream_of_a_stream_api_pipeline(tmp_path, procs):
    """A stream-API pipeline function declaring ``ctx.stream(BIDS, name="bids", sliced=True)``
    run by the launcher (no ``sliced=`` at launch: the pipeline says it): each worker process
    reads its own pieces, no bid row is in any request the driver sends, and the changes
    equal the driver-fed stream's step for step."""
    from dbsp.runtime.launcher import launch
    steps = P.sample_steps(4)
    want = _pushed(steps)
    src = P.bids_files(str(tmp_path / "bids"), steps, group=29)
    with launch(P.stream_bids_sliced, workers=procs) as job:
        assert job.circuit.sliced == {"bids"}
        sent = []
        send = job.coordinator._send
        job.coordinator._send = lambda msgs: (sent.append(msgs), send(msgs))[1]
        got = []
        for k in range(len(steps)):
            assert job.read_slices("bids", src, k) == len(src.pieces(k))
            job.step()
            got.append((job.outputs["agg"].to_dict(), job.outputs["hot"].to_dict()))
    bids = job.circuit.inputs["bids"].node
    steps_sent = [m for msgs in sent for m in msgs.values() if m[0] == "step"]
    assert steps_sent and not any(bids in m[1] for m in steps_sent)
    assert any("__slices" in m[1] for m in steps_sent)
    assert got == want


def test_sliced_true_needs_a_schema():
    with pytest.raises(TypeError, match="sliced=True"):
        StreamContext().stream(pa.table({"a": [1]}), name="x", sliced=True)
