"""Date and time functions of column expressions: the ``.dt`` namespace.

``col("ts").dt.epoch_ms()``, ``.dt.floor(timedelta(minutes=5))``, ``.dt.year()``... Each is a
:class:`~dbsp.api.expr.tree.Func` node over Arrow's temporal kernels, checked at build time and
null where its operand is null. The arithmetic of event time (physical integers, durations in a
column's units) is :mod:`dbsp.algebra.time`, shared with the window and watermark operators.

>>> import datetime as dt, pyarrow as pa
>>> from dbsp.api.expr import col
>>> e = col("ts").dt.floor(dt.timedelta(seconds=10)).dt.epoch_ms()
>>> e.compile(pa.schema([("ts", pa.timestamp("ms"))]))(
...     pa.record_batch({"ts": pa.array([12_345, None], pa.timestamp("ms"))})).to_pylist()
[10000, None]
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ...algebra.dtypes import cast_value, is_null
from ...algebra.time import duration_to_units, epoch_ms as _epoch_ms, from_physical, is_time_type
from .tree import Expr, Func, extension, need


def _strftime(v: Any, fmt: str) -> Any:
    """``pc.strftime`` once per distinct value (formatting costs ~1 µs a value; times that
    share a day or a minute, once floored, repeat a lot)."""
    if isinstance(v, pa.Scalar) or len(v) < 64:
        return pc.strftime(v, format=fmt)
    d = pc.dictionary_encode(v)
    if len(d.dictionary) * 2 > len(v):  # mostly distinct: format directly
        return pc.strftime(v, format=fmt)
    return pc.strftime(d.dictionary, format=fmt).take(d.indices)


@extension("dt")
class DtNamespace:
    """Date/time functions (``col("date_time").dt.…``)."""

    def __init__(self, e: Expr):
        self._e = e

    def epoch_ms(self) -> Expr:
        """Milliseconds since the Unix epoch (int64) of a timestamp or date."""
        return Func("dt.epoch_ms", [self._e],
                    need(lambda t: pa.types.is_timestamp(t) or pa.types.is_date(t),
                          "a timestamp or date"),
                    lambda a, n: _epoch_ms(a[0]))

    def floor(self, every: Any) -> Expr:
        """Round down to a multiple of ``every`` (a ``timedelta``; an int for integer columns)
        counted from the epoch: the start of the tumbling window the value falls in."""
        def check(ts):
            t = ts[0]
            if not (is_time_type(t) or is_null(t)):
                return "needs a timestamp, date32 or integer time column"
            try:
                duration_to_units(every, t, "floor size")
            except (TypeError, ValueError) as e:
                return str(e)
            return t

        def impl(a, n):
            v = a[0]
            t = v.type
            if is_null(t):
                return v
            size = duration_to_units(every, t, "floor size")
            if size <= 0:
                raise ValueError("floor size must be positive")
            i = v.cast(pa.int64()) if not pa.types.is_date32(t) else \
                cast_value(cast_value(v, pa.int32()), pa.int64())
            f = pc.subtract(i, pc.modulo(i, size))
            return from_physical(f, t)
        return Func("dt.floor", [self._e], check, impl, params=(every,))

    def _part(self, name: str, fn) -> Expr:
        return Func(f"dt.{name}", [self._e],
                    need(lambda t: pa.types.is_timestamp(t) or pa.types.is_date(t),
                          "a timestamp or date"),
                    lambda a, n: cast_value(fn(a[0]), pa.int64()))

    def year(self) -> Expr:
        return self._part("year", pc.year)

    def month(self) -> Expr:
        return self._part("month", pc.month)

    def day(self) -> Expr:
        return self._part("day", pc.day)

    def hour(self) -> Expr:
        return self._part("hour", pc.hour)

    def minute(self) -> Expr:
        return self._part("minute", pc.minute)

    def second(self) -> Expr:
        return self._part("second", pc.second)

    def day_of_week(self) -> Expr:
        """Monday = 0 ... Sunday = 6."""
        return self._part("day_of_week", pc.day_of_week)

    def strftime(self, fmt: str) -> Expr:
        """The timestamp or date formatted by the C/strftime ``fmt`` (``"%Y-%m-%d"``,
        ``"%H:%M"``), as a string; timestamps without a time zone are read as UTC."""
        return Func("dt.strftime", [self._e],
                    need(lambda t: pa.types.is_timestamp(t) or pa.types.is_date(t),
                         "a timestamp or date"),
                    lambda a, n: _strftime(a[0], fmt), params=(fmt,))

    def date(self) -> Expr:
        return Func("dt.date", [self._e], need(pa.types.is_timestamp, "a timestamp"),
                    lambda a, n: cast_value(a[0], pa.date32()))


__all__ = ["DtNamespace"]
