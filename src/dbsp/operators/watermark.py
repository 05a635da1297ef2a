"""watermark: event time, lateness and the waterline of a stream; late rows dropped and counted.

An input may declare an *event-time column* ``t`` and a *lateness* ``L`` (how far out of order
its rows may arrive). The lateness operator keeps, per stream, the largest event time seen so far
and derives the **watermark** (DBSP's waterline)::

    wm[s] = max(event times of the rows kept in steps 0..s) - L            (None before any row)

It is monotone (a maximum minus a constant) and the same on every worker: each step every worker
contributes its local maximum through ``transport.all_gather``. At step ``s`` a row whose event
time is below ``wm[s-1]`` (the watermark *before* the step) is **late**: it is dropped and counted,
never mixed into the results. Rows of one step never make each other late (a step is a set, its
rows have no order), and a row exactly at the watermark is on time. A row whose event time is
null cannot be placed in time; it is treated as late too. Retractions (negative weights) obey the
same rule: deleting a row that is already behind the watermark is dropped and counted.

Downstream operators use the watermark to garbage-collect state: whatever only rows *below*
``wm[s]`` could still change is final after step ``s`` (a tumbling window ``[a, a + size)`` with
``a + size <= wm[s]``, a session that ended before it...), so its state can be dropped: a query
over an unbounded stream keeps bounded state.

The operator produces one :class:`Timed` value per step; projection nodes make it three streams:
the on-time rows (a Z-set stream of the input's schema), the watermark (a :class:`WatermarkType`
stream whose value is an int in the time column's physical units, or None), and per-step stats
(a one-row Z-set ``(late_rows, watermark)`` from worker 0, read by the driver) - plus, on demand,
the late rows themselves (a dead-letter stream).

>>> import pyarrow as pa, dbsp
>>> from dbsp.operators.watermark import watermark
>>> c = dbsp.Circuit()
>>> t = c.add_input("t", [("ts", pa.int64()), ("x", pa.int64())])
>>> w = watermark(t, "ts", 10)
>>> on_time, stats = w.data.output(), w.stats.output(view=False)
>>> _ = t.insert([(100, 1), (95, 2)]); c.step(); sorted(on_time.to_dict())   # wm becomes 90
[(95, 2), (100, 1)]
>>> _ = t.insert([(89, 3), (90, 4)]); c.step(); sorted(on_time.to_dict())    # 89 < 90: late
[(90, 4)]
>>> stats.to_dict()
{(1, 90): 1}
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..algebra.time import duration_to_units, is_time_type, physical_int
from ..circuit.operator import Operator
from ..circuit.types import ZSetType
from ..trace.batch import ZSet

STATS_SCHEMA = pa.schema([pa.field("late_rows", pa.int64(), nullable=False),
                          pa.field("watermark", pa.int64())])


@dataclass(frozen=True)
class WatermarkType:
    """A stream of watermarks: one ``Optional[int]`` per step, in the physical units of
    ``time_type`` (timestamp units, days for date32, the integer itself)."""

    column: str
    time_type: pa.DataType

    def describe(self) -> str:
        return f"Watermark[{self.column}: {self.time_type}]"


@dataclass
class Timed:
    data: ZSet
    late: ZSet
    watermark: Optional[int]
    stats: ZSet


@dataclass(frozen=True)
class TimedType:
    schema: pa.Schema
    column: str

    def describe(self) -> str:
        return f"Timed{self.schema.names}[{self.column}]"


def time_int64(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(physical int64 values with nulls as 0, valid mask)`` of a time column."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    p = physical_int(arr)
    if p.null_count:
        valid = np.asarray(p.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        vals = pc.fill_null(p, 0).to_numpy(zero_copy_only=False)
    else:
        valid = np.ones(len(p), dtype=bool)
        vals = p.to_numpy(zero_copy_only=False)
    return np.asarray(vals, dtype=np.int64), valid


class LatenessOperator(Operator):
    """Drops (and counts) rows behind the watermark and advances the watermark."""

    state_attrs = ('max_seen', 'watermark', 'late_rows')

    name = "lateness"

    def __init__(self, ctx, schema: pa.Schema, column: str, lateness: int):
        super().__init__(ctx)
        self.schema, self.column, self.lateness = schema, column, lateness
        self.max_seen: Optional[int] = None
        self.watermark: Optional[int] = None
        self.late_rows = 0  # over all workers (every worker learns the total each step)

    def eval(self, z: ZSet) -> Timed:
        wm = self.watermark
        late = ZSet.empty(self.schema)
        kept = z
        n_late = 0
        local_max: Optional[int] = None
        if len(z):
            t, valid = time_int64(z.data.column(self.column))
            keep = valid if wm is None else valid & (t >= wm)
            if not keep.all():
                drop = ~keep
                n_late = int(np.abs(z.weights[drop]).sum())
                mask = pa.array(keep)
                late = ZSet(z.data.filter(pa.array(drop)), z.weights[drop])
                kept = ZSet(z.data.filter(mask), z.weights[keep])
            if keep.any():
                local_max = int(t[keep].max())
        W = self.ctx.workers
        if W > 1:
            got = self.ctx.transport.all_gather(self.ctx.worker, (local_max, n_late))
        else:
            got = [(local_max, n_late)]
        maxes = [m for m, _ in got if m is not None]
        total_late = sum(c for _, c in got)
        if maxes:
            m = max(maxes)
            if self.max_seen is None or m > self.max_seen:
                self.max_seen = m
                self.watermark = m - self.lateness
        self.late_rows += total_late
        if self.ctx.worker == 0:
            stats = ZSet(pa.RecordBatch.from_arrays(
                [pa.array([total_late], pa.int64()), pa.array([self.watermark], pa.int64())],
                schema=STATS_SCHEMA), np.ones(1, np.int64))
        else:
            stats = ZSet.empty(STATS_SCHEMA)
        return Timed(kept, late, self.watermark, stats)

    def savepoint(self):
        return self.max_seen, self.watermark, self.late_rows

    def restore(self, saved) -> None:
        self.max_seen, self.watermark, self.late_rows = saved

    def state_rows(self) -> int:
        return 0


class FieldOperator(Operator):
    """Projects one field of a :class:`Timed` value."""

    name = "field"

    def __init__(self, ctx, field: str):
        super().__init__(ctx)
        self.field = field

    def eval(self, value: Any) -> Any:
        return getattr(value, self.field)


@dataclass
class Watermarked:
    """The streams a :func:`watermark` node makes."""

    data: Any       # on-time rows (Stream)
    watermark: Any  # Stream of WatermarkType
    stats: Any      # Stream of STATS_SCHEMA, one row per step from worker 0
    late: Any       # the dropped rows (Stream), a dead-letter stream to output if wanted
    column: str
    time_type: pa.DataType
    lateness: int


def watermark(stream, column: str, lateness: Any) -> Watermarked:
    """Declare ``column`` the event time of ``stream`` with the given lateness (an int in the
    column's physical units, or a ``timedelta`` for timestamp / date columns)."""
    schema = stream.schema
    if column not in schema.names:
        raise KeyError(f"no time column {column!r} (columns: {schema.names})")
    t = schema.field(column).type
    if not is_time_type(t):
        raise TypeError(f"time column {column!r} has type {t}; it must be a timestamp, date32 or "
                        f"integer")
    L = duration_to_units(lateness, t, f"lateness of {column!r}")
    if L < 0:
        raise ValueError(f"lateness must be >= 0, got {lateness!r}")
    c = stream.circuit
    node = c.add_node(f"lateness[{column}]",
                      lambda ctx: LatenessOperator(ctx, schema, column, L), [stream],
                      TimedType(schema, column))

    def field(name: str, type_):
        return c.add_node(f"lateness.{name}", lambda ctx: FieldOperator(ctx, name), [node], type_)
    return Watermarked(field("data", ZSetType(schema)),
                       field("watermark", WatermarkType(column, t)),
                       field("stats", ZSetType(STATS_SCHEMA)),
                       field("late", ZSetType(schema)), column, t, L)


__all__ = ["watermark", "Watermarked", "WatermarkType", "LatenessOperator", "STATS_SCHEMA",
           "time_int64"]
