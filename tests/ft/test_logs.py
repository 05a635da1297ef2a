"""The input and output logs (dbsp.ft.logs): 000's write(step, output) rules, checksums, trim."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from dbsp.ft import InputLog, LogCorrupt, OutputGap, OutputLog, OutputMismatch, read_outputs

S = pa.schema([("x", pa.int64())])


def _t(xs, w=None):
    return pa.table({"x": xs, "__weight": w or [1] * len(xs)})


def test_output_log_rules(tmp_path):
    log = OutputLog(str(tmp_path), check=True)
    assert log.write(0, {"o": _t([1, 2])})
    assert log.write(1, {})
    assert not log.write(0, {"o": _t([2, 1])})  # replayed, equal: discarded
    with pytest.raises(OutputMismatch):
        log.write(1, {"o": _t([3])})
    with pytest.raises(OutputGap, match="step 3"):
        log.write(3, {"o": _t([3])})
    assert log.write(2, {"o": _t([3], [-1])})
    recs = read_outputs(str(tmp_path))
    assert [s for s, _ in recs] == [0, 1, 2]
    assert recs[2][1]["o"].column("__step").to_pylist() == [2]  # every row carries its step
    again = OutputLog(str(tmp_path))
    assert (again.first, again.end) == (0, 3)


def test_input_log_roundtrip_positions_trim_and_corruption(tmp_path):
    log = InputLog(str(tmp_path))
    b = pa.RecordBatch.from_pydict({"x": [1, 2, 3]}, schema=S)
    log.append(0, {"t": (b, np.array([1, -1, 2])), "u": None}, {"t": 3})
    log.append(1, {"t": None}, {})
    with pytest.raises(LogCorrupt, match="appending step 5"):
        log.append(5, {}, {})
    parts, pos, _ = log.read(0)
    assert parts["t"][0].to_pydict() == {"x": [1, 2, 3]}
    assert parts["t"][1].tolist() == [1, -1, 2] and "u" not in parts
    assert InputLog(str(tmp_path)).position("t") == 3  # the last record carries it
    log.trim(1)
    assert (log.first, log.end) == (1, 2) and not os.path.exists(log.path(0))
    log.trim(5)  # the last record stays: it carries the end and the positions
    assert (log.first, log.end) == (1, 2) and InputLog(str(tmp_path)).position("t") == 3
    p = log.path(1)
    data = bytearray(open(p, "rb").read())
    data[-10] ^= 1
    open(p, "wb").write(bytes(data))
    with pytest.raises(LogCorrupt, match="checksum"):
        InputLog(str(tmp_path))
    os.unlink(p)
    open(p + ".mut", "wb").close()  # a record a crash left half written
    fresh = InputLog(str(tmp_path))
    assert fresh.end == fresh.first and not os.path.exists(p + ".mut")


def test_output_log_sync_and_repair_of_torn_records(tmp_path):
    """Output records are fsynced per checkpoint (sync); after a power loss a record after the
    checkpoint may be torn: repair drops it and every later one (the replay writes them)."""
    from dbsp.storage import faults
    log = OutputLog(str(tmp_path))
    for s in range(5):
        log.write(s, {"o": _t([s])})
    faults.fail_fsync_at(None)
    assert log.sync(3) == 3 and log.synced == 3 and faults.fsync_calls() == 4  # 3 + the dir
    with open(log.path(3), "r+b") as f:
        f.truncate(10)
    again = OutputLog(str(tmp_path))
    assert again.repair(3) == 2 and (again.first, again.end) == (0, 3)
    assert not os.path.exists(log.path(4))
    assert again.write(3, {"o": _t([3])})  # the replay appends it again


def test_input_log_group_commit_waits_before_output(tmp_path):
    """append(wait=False) returns at once; wait(step) raises the write's error, and the log
    refuses further appends (a failed fsync is never retried over)."""
    from dbsp.storage import faults
    log = InputLog(str(tmp_path))
    b = pa.RecordBatch.from_pydict({"x": [1]}, schema=S)
    log.append(0, {"t": (b, np.array([1]))}, {"t": 1}, wait=False)
    log.wait(0)
    assert log.position("t") == 1
    faults.fail_fsync_at(1)
    try:
        log.append(1, {"t": (b, np.array([1]))}, {"t": 2}, wait=False)
        with pytest.raises(OSError):
            log.wait(1)
        assert log.position("t") == 1  # not recorded durably
        with pytest.raises(LogCorrupt, match="earlier write"):
            log.append(2, {}, {})
    finally:
        faults.fail_fsync_at(None)
        log.close()
