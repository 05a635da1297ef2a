"""proc_time: stamp every row with the processing time of the step that carries it.

``proc_time(clock)(a)[step s] = {(r ++ clock.now_ms(s)) : a[r] for r in a}``: each row of the
change of step ``s`` gets one extra ``timestamp[ms]`` column, the same for the whole step, read
from a :class:`Clock` given the step number. It is linear within a step (a map), but it is *not*
time-invariant: a row deleted at a later step gets a later stamp and does not cancel the row it
deletes. Processing time is meant for insert-only streams (Nexmark q12, Flink's ``PROCTIME()``).

Clocks:

* :class:`WallClock` -- the machine's clock when the step runs (each worker reads its own).
* :class:`StepClock` ``(start_ms, tick_ms)`` -- ``start_ms + s * tick_ms``: deterministic, for
  tests and for verifying a processing-time query against a from-scratch reference. Workers
  step in lockstep, so every worker stamps a step alike.

The step number ``s`` counts this operator's evaluations (0 for the first step), so it must not
sit inside a nested (recursive) scope, where an operator is evaluated once per iteration.

>>> import pyarrow as pa, dbsp
>>> c = dbsp.Circuit()
>>> t = c.add_input("t", [("x", pa.int64())])
>>> out = proc_time(t, "p", StepClock(0, 1000)).output()
>>> _ = t.insert([(1,)]); c.step(); _ = t.insert([(2,)]); c.step()
>>> [(r[0], r[1].second) for r in sorted(out.to_dict())]
[(2, 1)]
"""
from __future__ import annotations

import time
from typing import Protocol

import numpy as np
import pyarrow as pa

from ..circuit.operator import Operator
from ..circuit.types import ZSetType
from ..trace.batch import ZSet

__all__ = ["Clock", "WallClock", "StepClock", "ProcTimeOperator", "proc_time"]

TS_MS = pa.timestamp("ms")


class Clock(Protocol):
    """Processing time in epoch milliseconds at step ``step`` (0-based)."""

    def now_ms(self, step: int) -> int: ...


class WallClock:
    """The machine's wall clock (``time.time_ns``), in milliseconds."""

    def now_ms(self, step: int) -> int:
        return time.time_ns() // 1_000_000

    def __repr__(self) -> str:
        return "WallClock()"


class StepClock:
    """A deterministic clock: ``start_ms + step * tick_ms``."""

    def __init__(self, start_ms: int, tick_ms: int):
        if tick_ms < 0:
            raise ValueError(f"StepClock: tick_ms must be >= 0, got {tick_ms}")
        self.start_ms, self.tick_ms = int(start_ms), int(tick_ms)

    def now_ms(self, step: int) -> int:
        return self.start_ms + step * self.tick_ms

    def __repr__(self) -> str:
        return f"StepClock({self.start_ms}, {self.tick_ms})"


class ProcTimeOperator(Operator):
    name = "proc_time"
    state_attrs = ("step",)  # (a wall clock's times are not reproduced on replay)

    def __init__(self, ctx, clock: Clock, schema: pa.Schema):
        super().__init__(ctx)
        self.clock, self.schema = clock, schema
        self.step = 0

    def eval(self, z: ZSet) -> ZSet:
        step = self.step
        self.step += 1
        if len(z) == 0:
            return ZSet.empty(self.schema)
        now = np.full(len(z), self.clock.now_ms(step), dtype=np.int64)
        cols = list(z.data.columns) + [pa.array(now).cast(TS_MS)]
        return ZSet(pa.RecordBatch.from_arrays(cols, schema=self.schema), z.weights)

    def savepoint(self) -> int:
        return self.step

    def restore(self, saved: int) -> None:  # a rolled-back step did not happen
        self.step = saved


def proc_time(stream, column: str, clock: Clock):
    """``stream`` with a ``timestamp[ms]`` column ``column``: the processing time of its step."""
    if column in stream.schema.names:
        raise ValueError(f"proc_time: the stream already has a column {column!r}")
    if not callable(getattr(clock, "now_ms", None)):
        raise TypeError(f"proc_time: clock must have a now_ms(step) method, got {clock!r}")
    schema = pa.schema(list(stream.schema) + [pa.field(column, TS_MS, False)])
    return stream.circuit.add_node("proc_time", lambda ctx: ProcTimeOperator(ctx, clock, schema),
                                   [stream], ZSetType(schema))
