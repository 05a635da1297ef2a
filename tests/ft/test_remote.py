"""Recovery of replicas on the launcher (worker processes joined by the mesh): a killed worker
ends its generation, the next one reloads the last checkpoint and replays the input log, and the
crash checker finds every row exactly once; a replica or driver of an old generation is fenced."""
from __future__ import annotations

import pytest

from dbsp.ft import remote
from dbsp.ft.remote import Fence, Fenced, launch_durable
from dbsp.testing import crash
from dbsp.testing import pipelines as P

EVENTS, CHUNK = 300, 10
STEPS = EVENTS // CHUNK


def _read(events=EVENTS, chunk=CHUNK):
    return lambda step, token: crash.step_input(step, events, chunk)


def _clean(res):
    return {k: res[k] for k in ("lost", "duplicated", "unexpected")}


def test_fence_refuses_old_generations(tmp_path):
    f = Fence(tmp_path)
    assert f.current() == 0
    assert f.advance() == 1 and f.advance() == 2
    f.check(2)
    with pytest.raises(Fenced, match="generation 1 is fenced off by generation 2"):
        f.check(1, "publish")
    (tmp_path / remote.GENERATION_FILE).write_text("garbage")
    with pytest.raises(Fenced, match="not a generation number"):
        f.current()


def test_runs_to_the_end_without_failures(tmp_path):
    with launch_durable(P.crash_views, 2, tmp_path, checkpoint_every=4) as job:
        co = job.run(_read())
        assert co.stop(STEPS) == STEPS
        assert job.generation == 1 and job.restarts == 0
    assert crash.check(str(tmp_path), EVENTS)["ok"] > 0
    assert _clean(crash.check(str(tmp_path), EVENTS)) == {"lost": 0, "duplicated": 0,
                                                          "unexpected": 0}


def test_a_replica_lost_after_the_last_step_loses_nothing_on_close(tmp_path, caplog):
    """A worker process killed after the last step, before the job closes: the last checkpoint
    on close cannot be taken (a warning says so) and close does not fail; the next generation
    replays the logged steps after the previous checkpoint, and every event is there once."""
    import os
    import signal
    import time
    with launch_durable(P.crash_views, 2, tmp_path, checkpoint_every=4) as job:
        d = job.open()
        for step in range(6):
            for name, part in crash.step_input(step, EVENTS, CHUNK).items():
                d.circuit.inputs[name].put_pending(*part)
            d.step()
        d.wait_checkpoint()
        pid = job.pids()[1]
        os.kill(pid, signal.SIGKILL)
        for _ in range(200):  # until the kernel has reaped it (a send then fails)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)
        with caplog.at_level("WARNING", logger="dbsp.ft"):
            job.close()
        assert any("no checkpoint on close at step 6" in r.getMessage()
                   for r in caplog.records), caplog.text
    with launch_durable(P.crash_views, 2, tmp_path, checkpoint_every=4) as job:
        co = job.run(_read())
        assert co.stop(STEPS) == STEPS
    assert _clean(crash.check(str(tmp_path), EVENTS)) == {"lost": 0, "duplicated": 0,
                                                          "unexpected": 0}


def test_checkpoints_are_written_beside_the_next_steps(tmp_path):
    """Replicas write a checkpoint's state on a thread of their own while the driver steps on
    (the writer polls them for the results between steps)."""
    with launch_durable(P.crash_views, 2, tmp_path) as job:
        d = job.open()
        assert d.background
        for step in range(3):
            for name, part in crash.step_input(step, EVENTS, CHUNK).items():
                d.circuit.inputs[name].put_pending(*part)
            d.step()
            if step == 0:
                assert d.checkpoint(wait=False) is None  # returns once the state is captured
        d.wait_checkpoint()
        assert d.last_checkpoint.step == 1 and len(d.store.checkpoints) == 1
        d.checkpoint_on_close = False


def test_old_generation_cannot_write_output_or_checkpoints(tmp_path):
    """The driver and the replicas of generation 1 after generation 2 started: every append
    to the logs, every checkpoint (a replica's state file, the catalog) is refused."""
    with launch_durable(P.crash_views, 2, tmp_path) as job:
        d = job.open()
        for name, part in crash.step_input(0, EVENTS, CHUNK).items():
            d.circuit.inputs[name].put_pending(*part)
        d.step()
        d.checkpoint()
        Fence(tmp_path).advance()  # a newer generation took over
        for name, part in crash.step_input(1, EVENTS, CHUNK).items():
            d.circuit.inputs[name].put_pending(*part)
        with pytest.raises(Fenced, match="input log refused"):
            d.step()
        d.input_log.append(1, {}, {})  # as if it had got past the input log
        d.step_no = 1
        d.circuit.step()
        with pytest.raises(Fenced, match="output log refused"):
            d._write_outputs(1)
        with pytest.raises(Fenced, match=r"worker 0: save_worker_\w+ refused"):
            d.checkpoint()
        # the driver's own catalog write is fenced too
        with pytest.raises(Fenced, match="checkpoint catalog refused"):
            d.store._write_catalog(d.store.checkpoints)
        assert d.output_log.end == 1
        d.checkpoint_on_close = False


@pytest.mark.slow
@pytest.mark.parametrize("workers,every,seed", [(2, 3, 1), (3, 5, 2)])
def test_killed_workers_recover_exactly_once(tmp_path, workers, every, seed):
    with launch_durable(P.crash_views, workers, tmp_path, checkpoint_every=every,
                        max_restarts=10) as job:
        kills = crash.run_killed(job, _read(), STEPS, 3, seed)
        co = job.ft
        # every kill ends a generation; a generation may also fail while it forms (a peer's
        # handshake timing out on a loaded machine): then one more starts
        assert len(kills) >= 1 and co.restarts == len(job.recovery_seconds) >= len(kills)
        assert job.restarts >= len(kills), kills
        recs = crash.check_recoveries(job, kills, pieces_per_step=0,
                                      checkpoint_every=every)
        print(f"\nkills {kills}\nrecoveries {recs}")
        assert any(r["replayed_steps"] > 0 for r in recs), recs
    res = crash.check(str(tmp_path), EVENTS)
    assert _clean(res) == {"lost": 0, "duplicated": 0, "unexpected": 0}, (res, kills)


def _feed(d, lo, hi):
    for step in range(lo, hi):
        for name, part in crash.step_input(step, EVENTS, CHUNK).items():
            d.circuit.inputs[name].put_pending(*part)
        d.step()


def _checkpoints_whole(root) -> None:
    """Every checkpoint the catalog names has its directory, one state file per worker of its
    layout, and every batch file its state files name (what a restore opens)."""
    import json
    import os
    with open(os.path.join(root, "checkpoints.json")) as f:
        cps = json.load(f)["catalog"]["checkpoints"]
    for c in cps:
        W = c["layout"]["shards"]["workers"]
        for w in range(W):
            assert os.path.exists(os.path.join(root, c["name"], f"worker-{w}.state")), (c, w)
        for p in c["files"]:
            assert os.path.exists(os.path.join(root, p)), (c["name"], p)


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_a_generation_ended_mid_checkpoint_never_publishes_it_broken(tmp_path, delay):
    """The replicas stop while they write a checkpoint's state in the background (as
    ``DurableJob.restart`` did before it waited for the write): the driver's writer must not
    take the stopped generation's missing results for "every worker done" and publish a
    checkpoint without its workers' state or naming none of their batch files (which the next
    generation's store then removes as orphans). Either the checkpoint is refused, or it is
    published whole; the next generation recovers, exactly once."""
    import time
    from dbsp.checkpoint.store import CheckpointError
    from dbsp.runtime.process import WorkerDied
    with launch_durable(P.crash_views, 2, tmp_path) as job:
        d = job.open()
        _feed(d, 0, 4)
        d.checkpoint(wait=True)
        _feed(d, 4, 7)
        pc = d.store.begin(d.circuit, d.step_no)  # the replicas write in the background
        time.sleep(delay)
        d.circuit.close()  # the generation ends, the write perhaps not finished
        try:
            pc.finish()
        except (CheckpointError, WorkerDied):
            pass
        _checkpoints_whole(str(tmp_path))
        d = job.restart()  # the next generation: the latest checkpoint, the log replayed
        assert d.step_no == 7
        _feed(d, 7, STEPS)
    _checkpoints_whole(str(tmp_path))
    res = crash.check(str(tmp_path), EVENTS)
    assert res["ok"] > 0 and _clean(res) == {"lost": 0, "duplicated": 0, "unexpected": 0}


def _kill_worker(job, w):
    """kill -9 replica ``w`` of the current generation and wait until it is gone."""
    import os
    import signal
    import time
    pid = job.pids()[w]
    os.kill(pid, signal.SIGKILL)
    for _ in range(500):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)


@pytest.mark.slow
def test_checkpoint_cadence_survives_generations(tmp_path):
    """``checkpoint_every=3`` on the launcher, a replica killed two steps into each of three
    generations: each new generation counts the steps it replayed as steps since the
    checkpoint it restored, so the next checkpoint comes at the cadence (steps 3, 6, 9, ...)
    and no recovery replays more than 3 steps. When each generation restarted the count, its
    first checkpoint came 3 steps after its recovery, after the next kill: the replays grew
    2, 4, 6 from one checkpoint (the launcher run that replayed 9)."""
    with launch_durable(P.crash_views, 2, tmp_path, checkpoint_every=3) as job:
        d = job.open()
        _feed(d, 0, 5)
        d.wait_checkpoint()
        assert d.last_checkpoint.step == 3
        for _ in range(3):
            _kill_worker(job, 1)
            d = job.restart()
            s = d.step_no
            _feed(d, s, s + 2)
            d.wait_checkpoint()
            assert d.step_no - d.last_checkpoint.step < 3 and d.last_checkpoint.step % 3 == 0, \
                (d.step_no, d.last_checkpoint.step)
        _feed(d, d.step_no, STEPS)
        recs = job.report()["recoveries"]
        assert [r["replayed_steps"] for r in recs] == [0, 2, 1, 0], recs
    res = crash.check(str(tmp_path), EVENTS)
    assert res["ok"] > 0 and _clean(res) == {"lost": 0, "duplicated": 0, "unexpected": 0}


class _Clock:
    """The driver's wall clock, moved by hand (from the real time: log file times are real)."""

    def __init__(self):
        import time
        self.now = time.time()

    def __call__(self):
        return self.now


@pytest.mark.slow
def test_time_cadence_survives_generations(tmp_path):
    """``checkpoint_seconds=100`` on the launcher, 30 s a step by the driver's clock, a replica
    killed two steps (60 s) into each generation and 20 s down: each generation counts the
    time since the restored checkpoint was taken (the catalog's wall time), so checkpoints
    still come (steps 4, 7, 9), and the one that recovers 100 s after its checkpoint commits
    one before new input. When each generation restarted the time, no checkpoint came after
    the first and the replays grew 1, 3, 5."""
    clock = _Clock()

    def feed(d, n):
        for _ in range(n):
            clock.now += 30
            _feed(d, d.step_no, d.step_no + 1)
        d.wait_checkpoint()

    with launch_durable(P.crash_views, 2, tmp_path, checkpoint_seconds=100,
                        clock=clock) as job:
        d = job.open()
        feed(d, 5)
        assert d.last_checkpoint.step == 4
        cps = []
        for _ in range(3):
            _kill_worker(job, 1)
            clock.now += 20
            d = job.restart()
            feed(d, 2)
            cps.append(d.last_checkpoint.step)
        assert cps == [7, 7, 9], cps
        recs = job.report()["recoveries"]
        assert [(r["replayed_steps"], r["checkpointed"]) for r in recs] == \
            [(0, None), (1, None), (0, None), (2, 9)], recs
        crash.check_recoveries(job, [], pieces_per_step=0, checkpoint_seconds=100)
        _feed(d, d.step_no, STEPS)
    res = crash.check(str(tmp_path), EVENTS)
    assert res["ok"] > 0 and _clean(res) == {"lost": 0, "duplicated": 0, "unexpected": 0}
