"""A cold layout change of a durable job on Spark ``local[2]``: 1 barrier task, then 2, on one
stream; output step for step equal to a run that never changed scale, exactly-once, the state
moved reported, the new layout committed before any input. On ``local[4]``, 1 -> 2 -> 3 -> 2
tasks over many evenly spread keys: the state moved at each change within 1.2x the minimum."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspark", reason="pip install dbsp[spark]")  # CI installs it

from dbsp.spark import durable  # noqa: E402
from dbsp.testing import crash  # noqa: E402
from dbsp.testing import pipelines as P  # noqa: E402

EVENTS, CHUNK = 300, 10
STEPS = EVENTS // CHUNK

pytestmark = pytest.mark.slow


def test_scale_1_2_on_spark_equals_a_fixed_scale_run(spark, tmp_path):
    with durable(spark, P.crash_views, storage=tmp_path, workers=1, checkpoint_every=4,
                 timeout=600) as job:
        job.open()
        crash.feed(job, 12, EVENTS, CHUNK)
        ch = job.relayout(2)
        print(f"\nSpark 1 -> 2 tasks: state moved {ch['moved_fraction']:.3f} "
              f"({ch['moved_rows']} of {ch['moved_rows'] + ch['kept_rows']} rows), "
              f"{ch['seconds']:.1f} s")
        assert (ch["from_workers"], ch["to_workers"], ch["step"]) == (1, 2, 12)
        assert 0 < ch["moved_fraction"] < 1 and ch["kept_rows"] > 0
        with open(tmp_path / "checkpoints.json") as f:
            last = json.load(f)["catalog"]["checkpoints"][-1]
        assert last["step"] == 12 and last["layout"]["shards"]["workers"] == 2
        assert len(job.pids()) == 2
        crash.feed(job, STEPS, EVENTS, CHUNK)
        assert job.durable.step_no == STEPS
    assert crash.logged_steps(str(tmp_path)) == crash.fixed_scale_steps(EVENTS, CHUNK)
    res = crash.check(str(tmp_path), EVENTS)
    assert res["ok"] > 0 and (res["lost"], res["duplicated"], res["unexpected"]) == (0, 0, 0)



def test_scale_1_2_3_2_on_spark_moves_about_the_minimum(spark4, tmp_path):
    """A keyed count over 20K evenly spread keys (the crash stream's 7 keys make the fraction
    moved coarse): each change of 1 -> 2 -> 3 -> 2 tasks moves at most 1.2x the minimum
    |W'-W|/max(W, W') of the stored rows (hash % W would move 1/2, 2/3, 2/3), and the output
    log equals, step for step, one embedded worker's changes."""
    steps = [{"events": P.keyed_events(4000, 20_000, seed=s)} for s in range(8)]
    with durable(spark4, P.keyed_count, storage=tmp_path, workers=1, checkpoint_every=4,
                 timeout=600) as job:
        changes = crash.scale_run(job, [1, 2, 3, 2], steps, 2)
        assert job.durable.step_no == len(steps)
    crash.check_moved(changes, "Spark local[4], keyed count over 20K keys")
    assert crash.logged_steps(str(tmp_path)) == crash.one_worker_steps(P.keyed_count, steps)
