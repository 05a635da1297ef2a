# Compare: pytest bench/micro/bench_wire.py --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""One message across a process boundary, encoded and decoded (no socket): the skeleton codec
of :mod:`dbsp.storage.wire` (``dumps`` / ``loads``) beside its pickle path (``dumps_pickled``),
on the messages a multi-process step sends: a step's input for one worker (a Z-set), a worker's
reply (an output part), an aggregate's partials through an exchange. 10 and 5,000 rows of 3
int64 columns, fixed data.

``extra_info["pickle_over_skeleton"]``: the pickle path's median over the skeleton's, measured
in the same run (when it went in, loaded machine: step 1.9 / 1.7, reply 3.0 / 2.1, exchange 1.1 / 1.2
at 10 / 5,000 rows; a round trip here includes joining the frames and copying the body).
"""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest

import dbsp.runtime.wire_types  # noqa: F401  (registers the batches)
from dbsp.algebra.codes import KeyCodec
from dbsp.operators.output import SortedPart
from dbsp.storage import wire
from dbsp.trace.batch import ZSet

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("n", pa.int64(), False),
                    pa.field("s", pa.int64(), False)])


def _message(kind: str, n: int):
    b = pa.record_batch([np.arange(n), np.arange(n) * 3, np.arange(n) % 7], schema=SCHEMA)
    w = np.ones(n, np.int64)
    if kind == "step":
        return ("step", {3: ZSet(b, w)})
    if kind == "reply":
        return ("ok", {7: SortedPart(b, w, KeyCodec(list(SCHEMA)), 1)})
    return (5, (b.select([0]), np.arange(n, dtype=np.uint64), [np.arange(n), np.ones(n)]))


def _join(frames) -> bytes:
    return b"".join(bytes(memoryview(f).cast("B")) for f in frames)


def _roundtrip_seconds(dumps, msg, reps: int = 200) -> float:
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(reps):
            wire.loads(_join(dumps(msg)))
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


@pytest.mark.parametrize("rows", [10, 5000])
@pytest.mark.parametrize("kind", ["step", "reply", "exchange"])
def test_wire_roundtrip(benchmark, kind, rows):
    benchmark.group = f"wire {kind} {rows} rows"
    msg = _message(kind, rows)
    benchmark(lambda: wire.loads(_join(wire.dumps(msg))))
    benchmark.extra_info["pickle_over_skeleton"] = round(
        _roundtrip_seconds(wire.dumps_pickled, msg) / _roundtrip_seconds(wire.dumps, msg), 2)
