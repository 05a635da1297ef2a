"""Engine threads carry their names into the kernel (``/proc/.../comm``: what perf, top -H and
py-spy show)."""
from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pyarrow as pa
import pytest

from dbsp.storage.osthreads import name_os_thread

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl names: Linux")


def _comm(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().strip()


def _names() -> set:
    """The kernel's names of this process's threads (a thread that ends while they are read,
    another test's helper say, is left out: it was not one of those looked for)."""
    out = set()
    for t in os.listdir("/proc/self/task"):
        try:
            out.add(_comm(int(t)))
        except FileNotFoundError:
            pass
    return out


@linux
def test_a_thread_takes_its_python_name_cut_to_15_bytes():
    got = {}

    def run():
        got["ok"] = name_os_thread()
        got["comm"] = _comm(threading.get_native_id())

    t = threading.Thread(target=run, name="dbsp-a-long-thread-name")
    t.start()
    t.join()
    assert got == {"ok": True, "comm": "dbsp-a-long-thr"}


@linux
def test_the_spines_merger_and_the_threads_runtime_name_their_threads():
    import dbsp
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False),
                        pa.field("v", pa.int64(), nullable=False)])
    with dbsp.Circuit(workers=2, runtime="threads") as c:
        ev = c.add_input("ev", schema)
        out = ev.index_by(["k"]).aggregate({"n": ("count", None)}).output()
        rng = np.random.default_rng(1)
        for _ in range(40):  # enough rows for merges on the merger and steps on both threads
            ev.push(pa.record_batch([rng.integers(0, 1 << 40, 40_000), np.ones(40_000, np.int64)],
                                    schema=schema))
            c.step()
            out.delta()
        names = _names()
    assert any(n.startswith("dbsp-worker-") for n in names), names
    assert any(n.startswith("dbsp-merger") for n in names), names


@linux
def test_naming_a_thread_starts_no_process(monkeypatch):
    """libc's prctl is found among the process's own symbols: no ``ldconfig`` child (what
    ``ctypes.util.find_library`` runs) the first time an engine thread names itself."""
    import subprocess

    from dbsp.storage import osthreads

    def no_child(*a, **k):
        raise AssertionError(f"a child process was started: {a}")

    tid = threading.get_native_id()
    before = _comm(tid)
    monkeypatch.setattr(osthreads, "_prctl", None)
    monkeypatch.setattr(subprocess, "Popen", no_child)
    try:
        assert name_os_thread("dbsp-test")
        assert _comm(tid) == "dbsp-test"
    finally:
        name_os_thread(before)
