"""Layout changes of a durable job on the launcher (seed 000, "Scale in and out", "Layout
changes", "Rolling upgrade"): 1 -> 2 -> 3 -> 2 worker processes on one stream give, step for
step, the output of a run that never changed scale; the same 2 workers recover on 2 hosts from a
checkpoint taken on 1; a rolling upgrade moves the shards off the workers to upgrade, restarts
them on another version of the package and moves back, exactly-once throughout."""
from __future__ import annotations

import json
import os
import shutil

import pytest

import dbsp
from dbsp.ft.remote import launch_durable
from dbsp.testing import crash
from dbsp.testing import pipelines as P

EVENTS, CHUNK = 300, 10
STEPS = EVENTS // CHUNK
A, B = "127.0.0.1", "127.0.0.2"  # two "hosts": loopback addresses of this machine


def feed(job, steps: int) -> None:
    crash.feed(job, steps, EVENTS, CHUNK)


def logged_steps(root) -> dict:
    return crash.logged_steps(str(root))


def fixed_scale_steps() -> dict:
    return crash.fixed_scale_steps(EVENTS, CHUNK)


def catalog(root) -> list[dict]:
    with open(os.path.join(str(root), "checkpoints.json")) as f:
        return json.load(f)["catalog"]["checkpoints"]


def check_exactly_once(root) -> None:
    res = crash.check(str(root), EVENTS)
    assert res["ok"] > 0
    assert {k: res[k] for k in ("lost", "duplicated", "unexpected")} == \
        {"lost": 0, "duplicated": 0, "unexpected": 0}, res


@pytest.mark.slow
def test_scale_1_2_3_2_on_the_launcher_equals_a_fixed_scale_run(tmp_path):
    changes = []
    with launch_durable(P.crash_views, 1, tmp_path, checkpoint_every=4) as job:
        job.open()
        feed(job, 6)
        for W, n in [(2, 8), (3, 8), (2, 8)]:
            step = job.durable.step_no
            ch = job.relayout(W)
            # no input in between: the new layout's first checkpoint is at the same step
            assert ch["step"] == step and catalog(tmp_path)[-1]["step"] == step
            assert catalog(tmp_path)[-1]["layout"]["shards"]["workers"] == W
            assert len(job.pids()) == W
            changes.append(ch)
            feed(job, n)
        assert job.durable.step_no == STEPS
    print("\nstate moved at each change:",
          [(c["from_workers"], c["to_workers"], round(c["moved_fraction"], 3))
           for c in changes])
    assert [(c["from_workers"], c["to_workers"]) for c in changes] == [(1, 2), (2, 3), (3, 2)]
    for c in changes:
        assert 0 < c["moved_fraction"] < 0.5, c  # hash % W would move 1/2 .. 2/3
        assert c["kept_rows"] > 0
    assert logged_steps(tmp_path) == fixed_scale_steps()
    check_exactly_once(tmp_path)


@pytest.mark.slow
def test_scale_1_2_3_2_on_the_launcher_moves_about_the_minimum(tmp_path):
    """A keyed count over 20K evenly spread keys: each change of 1 -> 2 -> 3 -> 2 processes
    moves at most 1.2x the minimum |W'-W|/max(W, W') of the stored rows, and the output log
    equals one embedded worker's step for step. (Each generation took the default map of its
    W instead of the last checkpoint's map resized: 2 -> 3 moved 0.53 of the state, the
    minimum being 1/3.)"""
    steps = [{"events": P.keyed_events(4000, 20_000, seed=s)} for s in range(8)]
    with launch_durable(P.keyed_count, 1, tmp_path, checkpoint_every=4) as job:
        changes = crash.scale_run(job, [1, 2, 3, 2], steps, 2)
    crash.check_moved(changes, "launcher, keyed count over 20K keys")
    assert crash.logged_steps(str(tmp_path)) == crash.one_worker_steps(P.keyed_count, steps)


@pytest.mark.slow
def test_same_workers_recover_on_more_hosts(tmp_path):
    """Seed 000: the worker count is fixed for recovery, the hosts are not. 2 workers on 1 host
    checkpoint, run on and stop without a last checkpoint (as a crash would leave it); 2
    workers on 2 hosts reload that checkpoint as it is (nothing re-sharded) and replay."""
    with launch_durable(P.crash_views, 2, tmp_path, checkpoint_every=5,
                        hosts=[A, A]) as job:
        job.open()
        feed(job, 12)
        assert catalog(tmp_path)[-1]["layout"]["hosts"] == [A, A]
        shards = catalog(tmp_path)[-1]["layout"]["shards"]
        job.durable.checkpoint_on_close = False  # steps 10, 11 are left to replay
    assert catalog(tmp_path)[-1]["step"] == 10
    with launch_durable(P.crash_views, 2, tmp_path, checkpoint_every=5,
                        hosts=[A, B]) as job:
        d = job.open()
        assert d.replayed == 2 and d.layout_change is None
        assert {i["address"] for i in job.gen.coordinator.info.values()} == {A, B}
        feed(job, STEPS)
    last = catalog(tmp_path)[-1]["layout"]
    assert last["hosts"] == [A, B] and last["shards"] == shards
    assert logged_steps(tmp_path) == fixed_scale_steps()
    check_exactly_once(tmp_path)


def new_version(tmp_path, version: str) -> dict:
    """Another version of the package on disk (a copy with another version string), and the
    environment that makes a worker import it."""
    src = os.path.dirname(dbsp.__file__)
    dst = tmp_path / "upgrade" / "dbsp"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    if not (dst / "_native").exists():  # an editable install keeps the extensions elsewhere
        import dbsp._native as native
        os.symlink(list(native.__path__)[0], dst / "_native")
    init = dst / "_version.py"
    text = init.read_text()
    assert f'__version__ = "{dbsp.__version__}"' in text
    init.write_text(text.replace(f'__version__ = "{dbsp.__version__}"',
                                 f'__version__ = "{version}"'))
    return {"PYTHONPATH": str(tmp_path / "upgrade")}


@pytest.mark.slow
def test_rolling_upgrade_by_layout_change(tmp_path):
    """The procedure of the README ("Rolling upgrade"): workers 0 and 1 on hosts A and B run
    the old version. Scale in to worker 0 on A (B's shards move to A), scale out again with
    worker 1 on B running the new version (its shards move back), then upgrade A in place: a
    change of placement with the same shards moves nothing. Output exactly-once and equal to a
    run that was never upgraded; every checkpoint's layout records each worker's version."""
    old, new = dbsp.__version__, dbsp.__version__ + "+upgrade"
    env_new = new_version(tmp_path, new)
    root = tmp_path / "store"
    with launch_durable(P.crash_views, 2, root, checkpoint_every=4, hosts=[A, B]) as job:
        job.open()
        feed(job, 6)
        job.durable.wait_checkpoint()  # checkpoints are written in the background
        assert catalog(root)[-1]["layout"]["versions"] == [old, old]
        out = job.relayout(1, hosts=[A])                       # 1. B's shards onto A
        assert out["moved_fraction"] > 0
        feed(job, 6)
        back = job.relayout(2, hosts=[A, B], env=[None, env_new])  # 2. B upgraded, shards back
        assert back["moved_fraction"] > 0
        lay = catalog(root)[-1]["layout"]
        assert lay["versions"] == [old, new] and lay["hosts"] == [A, B]
        info = job.gen.coordinator.info
        assert info[1]["code"].startswith(str(tmp_path / "upgrade"))
        assert not info[0]["code"].startswith(str(tmp_path))
        feed(job, 6)
        inplace = job.relayout(2, hosts=[A, B], env=env_new)   # 3. A upgraded in place
        assert inplace["moved_fraction"] == 0.0 and inplace["hosts_after"] == [A, B]
        job.durable.wait_checkpoint()
        assert catalog(root)[-1]["layout"]["versions"] == [new, new]
        feed(job, STEPS)
        assert job.durable.step_no == STEPS
    assert logged_steps(root) == fixed_scale_steps()
    check_exactly_once(root)
