"""File merges in a helper process (dbsp.trace.merge_helper): the same results as merges in
the merger thread, the helper really takes the merges, a killed helper costs nothing but speed,
and closing circuits with several helpers never waits for ever. (The operator tests of
``test_spill.py`` run their random cases with merges in the helper and in the thread.)"""
from __future__ import annotations

import os
import signal

import numpy as np
import pyarrow as pa
import pytest

from dbsp import Circuit
from dbsp.trace import merge_helper as mp
from dbsp.storage.config import StorageConfig
from storage_helpers import tiny

L = pa.schema([pa.field("k", pa.int64()), pa.field("a", pa.string())])
R = pa.schema([pa.field("k", pa.int64()), pa.field("b", pa.int64())])


def helper_config(root, **kw) -> StorageConfig:
    """Every merge of 3 rows or more writes a file, and every one of them goes to the helper."""
    return tiny(root, **dict({"merge_process_rows": 3}, **kw))


def _join(l, r):
    return l.index_by(["k"]).join(r.index_by(["k"]))


def _steps(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for t in range(n):
        ks = rng.integers(0, 50, 200)
        out.append((pa.table({"k": ks, "a": [f"s{t}-{i}" for i in range(200)]}),
                    pa.table({"k": np.arange(t * 5, t * 5 + 5) % 50,
                              "b": np.arange(5) + t})))
    return out


def _run(storage, steps, workers=1, kill_helper_at=None):
    """Feed ``steps`` to the join; the integrated output, and the helpers' statistics."""
    with Circuit(workers=workers, storage=storage) as c:
        l, r = c.add_input("l", L), c.add_input("r", R)
        out = _join(l, r).output()
        for t, (a, b) in enumerate(steps):
            if t == kill_helper_at:
                for h in list(mp._helpers.values()):
                    os.kill(h.pid, signal.SIGKILL)
            l.push(a)
            r.push(b)
            c.step()
        view = out.view_dict()
        stats = mp.helpers_stats()
        failed = [h for h in mp._helpers.values() if h.failed]
    return view, stats, failed


def test_helper_takes_the_merges_and_matches_memory(tmp_path, workers):
    steps = _steps(12, seed=3)
    want, _, _ = _run(None, steps, workers)
    got, stats, failed = _run(helper_config(tmp_path), steps, workers)
    assert got == want
    assert not failed
    assert len(stats) == workers
    assert sum(s["jobs"] for s in stats) > 0, stats
    assert all(s["private_peak_bytes"] > 0 for s in stats)


@pytest.mark.crash
def test_killed_helper_merges_fall_back_to_the_thread(tmp_path, caplog):
    steps = _steps(12, seed=4)
    want, _, _ = _run(None, steps)
    with caplog.at_level("WARNING", logger="dbsp.storage"):
        got, stats, failed = _run(helper_config(tmp_path), steps, kill_helper_at=6)
    assert got == want
    assert len(failed) == 1 and stats == []
    assert "merge helper of worker 0 failed" in caplog.text


def test_helpers_off(tmp_path):
    got, stats, _ = _run(helper_config(tmp_path, merge_process_rows=None), _steps(3, seed=5))
    assert stats == [] and got


def test_fork_refused_merges_in_the_thread(tmp_path, monkeypatch, caplog):
    import gc

    def refuse():
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refuse)
    steps = _steps(6, seed=6)
    want, _, _ = _run(None, steps)
    with caplog.at_level("WARNING", logger="dbsp.storage"):
        got, stats, _ = _run(helper_config(tmp_path), steps)
    assert got == want and stats == []
    assert gc.get_freeze_count() == 0  # the parent's heap is not left frozen
    assert "cannot start a merge helper" in caplog.text
