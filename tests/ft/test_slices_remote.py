"""Durable replicas on the launcher that read their own input slices (``dbsp.runtime.slices``):
the input log records each step's pieces by position with the row counts and checksums the
workers reported, recovery reads the same rows again (also after a kill: 0 lost, 0 duplicated),
and a source changed under the log fails recovery with a ``RecoveryError``."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dbsp.connectors.slices import FileSlices
from dbsp.ft import RecoveryError
from dbsp.ft.logs import InputLog, Slices
from dbsp.ft.remote import launch_durable
from dbsp.runtime.slices import SourceStep
from dbsp.testing import crash
from dbsp.testing import pipelines as P

EVENTS, CHUNK = 300, 10
STEPS = EVENTS // CHUNK


def ev_files(d, events=EVENTS, chunk=CHUNK, group=4) -> FileSlices:
    """The crash stream's ``ev`` input, one Parquet file per step of ``group``-row units."""
    os.makedirs(d, exist_ok=True)
    k = 0
    while (inp := crash.step_input(k, events, chunk)) is not None:
        batch, w = inp["ev"]
        t = pa.Table.from_batches([batch]).append_column("__weight", pa.array(w, pa.int64()))
        pq.write_table(t, os.path.join(d, f"ev-{k:05d}.parquet"), row_group_size=group)
        k += 1
    return FileSlices(d)


def sliced_read(events=EVENTS, chunk=CHUNK):
    def read(step, token):
        inp = crash.step_input(step, events, chunk)
        if inp is None:
            return None
        inp["ev"] = SourceStep(step)  # the workers read it: only dims passes the driver
        return inp
    return read


def _clean(res):
    return {k: res[k] for k in ("lost", "duplicated", "unexpected")}


def test_sliced_steps_are_logged_by_position_and_replayed(tmp_path):
    src = ev_files(tmp_path / "ev", events=60)
    store = tmp_path / "store"
    read = sliced_read(events=60)
    with launch_durable(P.crash_views, 2, store, checkpoint_every=100,
                        sliced={"ev": src}) as job:
        d = job.open()
        for s in range(6):
            inp = read(s, None)
            if "dims" in inp:
                d.circuit.inputs["dims"].put_pending(*inp["dims"])
            d.step(slices={"ev": s})
        log = InputLog(os.path.join(store, "ft", "input"))
        rec = log.read(3)[0]["ev"]
        assert isinstance(rec, Slices) and rec.pushed is None
        assert [p["file"] for p in rec.pieces] == [src.files[3]] * len(rec.pieces) and rec.pieces
        assert [r for r, _ in rec.report] == [p["end"] - p["start"] for p in rec.pieces]
        assert max(os.path.getsize(log.path(s)) for s in range(1, 6)) < 2000  # no rows
        before = d.step_no
        d2 = job.restart()  # a new generation: the last checkpoint, then the log replayed
        assert d2.step_no == before and d2.replayed >= 5
        # the replay read the same pieces again (else the output log would differ)
        d2.checkpoint_on_close = False
        # a file of a step after the checkpoint is rewritten with other rows
        t = pq.read_table(src.files[3])
        t = t.set_column(2, "v", pa.array([x + 1 for x in t.column("v").to_pylist()]))
        pq.write_table(t, src.files[3], row_group_size=4)
        with pytest.raises(RecoveryError, match=r"step 3: input 'ev': .*source changed"):
            job.restart()
        job.durable = None
    res = crash.check(str(store), 60)
    assert res["duplicated"] == res["unexpected"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("workers,every,seed", [(2, 3, 11), (3, 4, 12)])
def test_killed_workers_reading_slices_recover_exactly_once(tmp_path, workers, every, seed):
    src = ev_files(tmp_path / "ev")
    store = tmp_path / "store"
    with launch_durable(P.crash_views, workers, store, checkpoint_every=every,
                        max_restarts=10, sliced={"ev": src}) as job:
        kills = crash.run_killed(job, sliced_read(), STEPS, 3, seed)
        assert len(kills) >= 1 and job.restarts >= len(kills), kills
        recs = crash.check_recoveries(job, kills, checkpoint_every=every)
        print(f"\nkills {kills}\nrecoveries {recs}")
        # the workers read the logged pieces of every replayed step again
        assert all(r["replayed_pieces"] >= r["replayed_steps"] for r in recs), recs
        assert any(r["replayed_pieces"] > 0 for r in recs), recs
    res = crash.check(str(store), EVENTS)
    assert res["ok"] > 0
    assert _clean(res) == {"lost": 0, "duplicated": 0, "unexpected": 0}, (res, kills)
