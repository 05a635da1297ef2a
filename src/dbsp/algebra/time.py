"""Event time: the physical integers behind time columns, and durations in their units.

A *time column* (:func:`is_time_type`) is a timestamp (of any unit, with or without a time zone),
a ``date32`` or an integer column. Windows, rolling frames and watermarks compute on its
*physical* value, an int64 (:func:`physical_int`): the timestamp's count of its own unit since
the epoch, the date's days, the integer itself. :func:`from_physical` is the inverse.

A window size or a lateness is given as a ``timedelta`` for timestamps and dates and as an int
(in the column's own units) for integer columns; :func:`duration_to_units` converts it to the
column's units, refusing what would be ambiguous (an int for a timestamp) or inexact (1.5 ms on
a millisecond column, 36 hours on a date column).

>>> import datetime as dt, pyarrow as pa
>>> duration_to_units(dt.timedelta(seconds=2), pa.timestamp("ms"), "window size")
2000
>>> p = physical_int(pa.array([0, 86_400_000], pa.timestamp("ms")))
>>> p.to_pylist(), from_physical(p, pa.timestamp("ms")).to_pylist()[1]
([0, 86400000], datetime.datetime(1970, 1, 2, 0, 0))
"""
from __future__ import annotations

import datetime as _dt
from typing import Any, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .dtypes import cast_value

__all__ = ["is_time_type", "duration_to_units", "physical_int", "from_physical", "epoch_ms"]

Value = Union[pa.Array, pa.Scalar]

_PER_SECOND = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}


def is_time_type(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` can be an event-time column (timestamp, date32, integer)."""
    return pa.types.is_timestamp(t) or pa.types.is_date32(t) or pa.types.is_integer(t)


def duration_to_units(d: Any, t: pa.DataType, what: str) -> int:
    """A window size / lateness (``timedelta`` or int) in the physical units of column type ``t``.

    Timestamps (and durations) count their own unit, ``date32`` days, integer columns their own
    values (an int must then be given). Raises ``TypeError`` / ``ValueError`` naming ``what`` on a
    mismatch or an inexact conversion.
    """
    if isinstance(d, np.integer):
        d = int(d)
    if pa.types.is_integer(t):
        if isinstance(d, _dt.timedelta):
            raise TypeError(f"{what}: the time column is an integer ({t}); give an int in its "
                            f"units, not a timedelta")
        if not isinstance(d, int):
            raise TypeError(f"{what} must be an int, got {d!r}")
        return d
    if pa.types.is_timestamp(t) or pa.types.is_duration(t):
        if isinstance(d, int):
            raise TypeError(f"{what}: give a timedelta for a {t} column (an int would be "
                            f"ambiguous), got {d!r}")
        if not isinstance(d, _dt.timedelta):
            raise TypeError(f"{what} must be a timedelta, got {d!r}")
        us = (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds
        num = us * _PER_SECOND[t.unit]
        if num % 1_000_000:
            raise ValueError(f"{what} {d} is not a whole number of {t.unit}")
        return num // 1_000_000
    if pa.types.is_date32(t):
        if not isinstance(d, _dt.timedelta) or d.seconds or d.microseconds:
            raise ValueError(f"{what} for a date column must be a timedelta of whole days")
        return d.days
    raise TypeError(f"{what}: column type {t} is not a time type (timestamp, date32 or integer)")


def physical_int(a: pa.Array) -> pa.Array:
    """The int64 storage of a timestamp / date / duration / integer column (nulls kept)."""
    t = a.type
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t):
        return a.cast(pa.int64())
    if pa.types.is_date32(t):
        return a.cast(pa.int32()).cast(pa.int64())
    if pa.types.is_integer(t):
        return a.cast(pa.int64()) if t != pa.int64() else a
    raise TypeError(f"column type {t} is not a time type")


def from_physical(a: Value, t: pa.DataType) -> Value:
    """Inverse of :func:`physical_int`: int64 values (array or scalar) as type ``t``."""
    if pa.types.is_date32(t):
        return cast_value(cast_value(a, pa.int32()), t)
    return cast_value(a, t)


def epoch_ms(v: Value) -> Value:
    """Milliseconds since the Unix epoch (int64, floored) of timestamps or dates; any other
    value is returned unchanged. A time zone does not change the instant."""
    t = v.type
    if pa.types.is_timestamp(t):
        if t.tz is not None:
            v = cast_value(v, pa.timestamp(t.unit))
        v = cast_value(v, pa.timestamp("ms")) if t.unit in ("s",) else v
        unit = v.type.unit
        i = cast_value(v, pa.int64())
        if unit == "ms":
            return i
        if unit == "us":
            return pc.divide(pc.subtract(i, pc.modulo(i, 1000)), 1000)
        if unit == "ns":
            return pc.divide(pc.subtract(i, pc.modulo(i, 1_000_000)), 1_000_000)
        return i
    if pa.types.is_date32(t):
        return pc.multiply_checked(cast_value(cast_value(v, pa.int32()), pa.int64()), 86_400_000)
    if pa.types.is_date64(t):
        return cast_value(v, pa.int64())
    return v
