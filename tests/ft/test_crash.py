"""The crash harness (dbsp.testing.crash): a real child process killed with kill -9, at random
moments and at every named kill point; the checker reads only the output log.

More rounds: ``python -m dbsp.testing.crash --rounds 1000``."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from dbsp.storage.faults import KILL_POINTS
from dbsp.testing import crash

pytestmark = [pytest.mark.crash]

ROUNDS = int(os.environ.get("DBSP_CRASH_ROUNDS", "50"))


@pytest.mark.slow
def test_random_kills_lose_and_duplicate_nothing():
    combos = [(1, 1), (2, 4), (1, 10), (2, 1), (1, 4), (2, 10)]
    total = {"ok": 0, "lost": 0, "duplicated": 0, "unexpected": 0, "killed": 0}
    for r in range(ROUNDS):
        w, e = combos[r % len(combos)]
        res = crash.run_round(1000 + r, w, e, events=200, chunk=10, kills=2)
        for k in total:
            total[k] += res[k]
        assert res["lost"] == res["duplicated"] == res["unexpected"] == 0, res
    assert total["killed"] >= ROUNDS // 2, total  # the kills really happened


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_named_kill_points_recover_exactly(point):
    res = crash.run_round(7, 2, 2, events=300, chunk=10, kill_at=point, kills=3)
    assert res["self_killed"] == 3, res  # the process killed itself there three times
    assert res["lost"] == res["duplicated"] == res["unexpected"] == 0, res


def test_checker_sees_losses_and_duplicates():
    """The checker is not blind: output a replay re-appended (instead of discarding) shows as
    duplicated / unexpected rows, and a lost prefix of the log as lost rows."""
    from dbsp.ft import OutputLog
    d = tempfile.mkdtemp()
    try:
        subprocess.run([sys.executable, "-m", "dbsp.testing.crash", "child", "--dir", d,
                        "--events", "100", "--every", "0"], check=True)
        want = crash.expected(100)
        n = sum(len(v) for v in want.values())
        assert crash.check(d, 100) == {"ok": n, "lost": 0, "duplicated": 0, "unexpected": 0}
        out = os.path.join(d, "ft", "output")
        log = OutputLog(out)
        _, tables = log.read(2)  # step 2 once more, as a replay that did not discard would
        log.write(log.end, {k: t.drop_columns(["__step"]) for k, t in tables.items()})
        res = crash.check(d, 100)
        assert res["duplicated"] > 0 and res["unexpected"] > 0, res
        for s in range(log.first, 3):  # the first three steps' output lost
            os.unlink(log.path(s))
        res = crash.check(d, 100)
        assert res["lost"] > 0, res
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
def test_random_kills_with_a_rereadable_source():
    """The input log records positions of the ``ev`` stream (``--source reread``): recovery
    reads them again, exactly once."""
    combos = [(1, 1), (2, 4), (1, 10), (2, 1), (1, 4), (2, 10)]
    killed = 0
    for r in range(max(6, ROUNDS // 5)):
        w, e = combos[r % len(combos)]
        res = crash.run_round(3000 + r, w, e, events=200, chunk=10, kills=2, source="reread")
        killed += res["killed"]
        assert res["lost"] == res["duplicated"] == res["unexpected"] == 0, res
    assert killed >= 3


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_named_kill_points_with_a_rereadable_source(point):
    res = crash.run_round(8, 2, 2, events=300, chunk=10, kill_at=point, kills=3, source="reread")
    assert res["self_killed"] == 3, res
    assert res["lost"] == res["duplicated"] == res["unexpected"] == 0, res


@pytest.mark.slow
def test_random_kills_with_worker_processes():
    """A few rounds with a worker process per worker (``--runtime processes``); the long run is
    ``python -m dbsp.testing.crash --runtime processes --rounds 1000``."""
    for r, (e, src) in enumerate([(1, "pushed"), (4, "reread"), (10, "pushed")]):
        res = crash.run_round(4000 + r, 2, e, events=100, chunk=10, kills=2,
                              runtime="processes", source=src)
        assert res["lost"] == res["duplicated"] == res["unexpected"] == 0, res
