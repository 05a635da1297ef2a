"""WorkerStorage (dbsp.storage.manager): a worker's directory, its file names, the process's
backend and the disk-space gate. Nothing here knows a batch: these are the storage layer's own
promises."""
from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from dbsp.storage import config as storage_config
from dbsp.storage import manager
from dbsp.storage.config import StorageConfig
from dbsp.storage.manager import WorkerStorage, backend_for, reserved_bytes


def _cfg(root, **kw) -> StorageConfig:
    return StorageConfig(str(root), **dict({"min_free_bytes": 0, "cache_bytes": 1 << 20}, **kw))


def test_directory_per_worker_and_unique_names(tmp_path):
    a, b = WorkerStorage(_cfg(tmp_path), 0), WorkerStorage(_cfg(tmp_path), 1)
    assert a.dir == os.path.join(str(tmp_path), "worker-0") and os.path.isdir(a.dir)
    assert b.dir == os.path.join(str(tmp_path), "worker-1") and os.path.isdir(b.dir)
    names = {a.new_path() for _ in range(1000)}
    assert len(names) == 1000
    assert all(os.path.dirname(p) == a.dir and p.endswith(".dbsp") for p in names)


def test_temporaries_of_a_crash_are_removed_but_not_by_a_helper(tmp_path):
    d = tmp_path / "worker-0"
    d.mkdir()
    (d / "b-1.dbsp.mut").write_bytes(b"half a file")
    (d / "b-2.dbsp").write_bytes(b"a finished file")
    helper = WorkerStorage(_cfg(tmp_path), 0, helper=True)  # shares a live worker's directory
    assert helper.removed_temporaries == 0 and (d / "b-1.dbsp.mut").exists()
    ws = WorkerStorage(_cfg(tmp_path), 0)
    assert ws.removed_temporaries == 1
    assert sorted(os.listdir(d)) == ["b-2.dbsp"]


def test_one_backend_per_process_and_configuration(tmp_path):
    c1, c2 = _cfg(tmp_path / "a"), _cfg(tmp_path / "b")
    assert backend_for(c1) is backend_for(c2)  # same backend kind, cache and block size
    c3 = _cfg(tmp_path / "c", cache_bytes=2 << 20)
    assert backend_for(c3) is not backend_for(c1)
    assert WorkerStorage(c1, 0).backend is backend_for(c1)


def test_config_must_be_given():
    with pytest.raises(ValueError, match="StorageConfig or a directory"):
        WorkerStorage(None)


def test_pickles_as_its_config_and_worker(tmp_path):
    import pickle
    ws = WorkerStorage(_cfg(tmp_path), 3)
    back = pickle.loads(pickle.dumps(ws))
    assert type(back) is WorkerStorage and back.config == ws.config and back.worker == 3


def test_reserve_disk_holds_and_releases(tmp_path):
    ws = WorkerStorage(_cfg(tmp_path), 0)
    before = reserved_bytes()
    with ws.reserve_disk(12345, "test"):
        assert reserved_bytes() == before + 12345
    assert reserved_bytes() == before
    with pytest.raises(RuntimeError):
        with ws.reserve_disk(777, "test"):
            raise RuntimeError("the merge failed")
    assert reserved_bytes() == before  # released whatever the outcome


def test_full_disk_waits_until_space_is_freed(tmp_path, monkeypatch):
    ws = WorkerStorage(_cfg(tmp_path), 0)
    free = {"bytes": 100}
    monkeypatch.setattr(storage_config, "free_space", lambda path: free["bytes"])
    done = threading.Event()

    def merge():
        with ws.reserve_disk(1000, "a merge"):
            done.set()

    t = threading.Thread(target=merge)
    t.start()
    time.sleep(0.1)
    assert not done.is_set() and ws.disk_waits >= 1  # stalled, not failed
    free["bytes"] = 10_000
    t.join(timeout=10)
    assert done.is_set() and ws.disk_wait_seconds > 0


def test_full_disk_fails_with_a_typed_error_after_the_bounded_wait(tmp_path, monkeypatch):
    from dataclasses import replace

    from dbsp.storage.manager import DiskFull
    ws = WorkerStorage(replace(_cfg(tmp_path), disk_wait_seconds=0.3), 0)
    monkeypatch.setattr(storage_config, "free_space", lambda path: 100)
    before = reserved_bytes()
    t0 = time.monotonic()
    with pytest.raises(DiskFull, match="disk_wait_seconds=0.3") as e:
        with ws.reserve_disk(1000, "a merge"):
            pass
    assert 0.3 <= time.monotonic() - t0 < 3 and e.value.errno == errno.ENOSPC
    assert reserved_bytes() == before and ws.disk_waits >= 1


def test_reservations_count_against_each_other(tmp_path, monkeypatch):
    ws = WorkerStorage(_cfg(tmp_path), 0)
    monkeypatch.setattr(storage_config, "free_space", lambda path: 1500)
    got = threading.Event()

    def second():
        with ws.reserve_disk(1000, "second"):
            got.set()

    with ws.reserve_disk(1000, "first"):
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.1)
        assert not got.is_set()  # 1500 free, 1000 reserved: the second waits
    t.join(timeout=10)
    assert got.is_set() and reserved_bytes() == 0


def test_fork_hooks_run_in_a_forked_child(tmp_path):
    calls = []
    manager.on_fork(lambda: calls.append(os.getpid()))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            manager.check_fork()
            os.write(w, b"1" if calls and calls[-1] == os.getpid() else b"0")
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    manager.check_fork()  # the parent is not a forked child: nothing runs here
    assert os.getpid() not in calls
