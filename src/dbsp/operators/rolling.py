"""rolling: per-row aggregates over a trailing frame of each partition (SQL ``OVER``).

For every input row ``r`` of partition key ``k`` the output is ``r ++ aggregates`` where the
aggregates range over a *frame* of the rows of ``k`` ordered by event time:

* ``range=R`` (``RANGE BETWEEN R PRECEDING AND CURRENT ROW``): the rows with time in
  ``[t(r) - R, t(r)]`` - both ends included, so rows at the same time (peers) see each other;
* ``rows=N`` (``ROWS BETWEEN N-1 PRECEDING AND CURRENT ROW``): ``r`` and the ``N - 1`` rows before
  it in ``(time, row)`` order. A row of weight ``w`` counts as ``w`` rows here, and each copy gets
  its own frame.

Aggregates: ``count`` (rows, or non-null values of a column), ``sum``, ``avg``, ``min``, ``max``
over numeric or temporal columns; nulls are ignored (null when the frame has no value). The output
row has the input row's weight. Rows without an event time are dropped.

Incremental semantics: a new or retracted row at time ``t`` changes the outputs of the rows of its
partition at ``t`` and after, which are retracted and re-emitted. With a watermark ``wm`` the
outputs of rows before ``wm`` are final; the state keeps only the rows a future frame can still
reach (``t >= wm - R`` for ``range``; rows from ``wm`` on plus the ``N - 1`` before them for
``rows``), so memory is bounded by the rate times the frame.

Design: :class:`~dbsp.operators.window.KeyedRecomputeOperator` (the partition's rows in the
trace, time-ordered as the leading value column); per step only the rows of the touched
partitions from just before their earliest change are read (``R`` before it for ``range``; for
``rows``, back until ``N - 1`` rows precede it), not the whole partitions; their frames are
computed with numpy only: frame bounds by ``searchsorted`` over ``(partition, time)`` ranks,
sums / counts / extremes by ``ufunc.reduceat`` over ``[lo, hi)`` (so a float sum adds the same
rows in the same order every time, and unchanged rows cancel exactly).

>>> import pyarrow as pa, dbsp
>>> from dbsp.operators.rolling import rolling_aggregate
>>> c = dbsp.Circuit()
>>> t = c.add_input("t", [("ts", pa.int64()), ("k", pa.string()), ("x", pa.int64())])
>>> out = rolling_aggregate(t, "ts", ["k"], {"s": ("sum", "x")}, range_=10).output()
>>> _ = t.insert([(1, "a", 1), (5, "a", 2), (20, "a", 4)]); c.step()
>>> sorted(out.to_dict().items())
[((1, 'a', 1, 1), 1), ((5, 'a', 2, 3), 1), ((20, 'a', 4, 4), 1)]
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..algebra.time import from_physical, is_time_type
from ..circuit.types import ZSetType
from ..trace.batch import OrdIndexedZSet, ZSet
from .watermark import WatermarkType, time_int64
from .window import KeyedRecomputeOperator, _units, positive, time_first
from .exchange import sharded

KINDS = ("count", "sum", "avg", "min", "max")


def _window_reduce(ufunc, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, identity) -> np.ndarray:
    """``ufunc`` over ``x[lo[i]:hi[i]]`` for every i (``lo < hi``), vectorised by reduceat."""
    if len(lo) == 0:
        return np.zeros(0, dtype=x.dtype)
    xx = np.append(x, np.array([identity], dtype=x.dtype))
    idx = np.empty(2 * len(lo), dtype=np.int64)
    idx[0::2], idx[1::2] = lo, hi
    return ufunc.reduceat(xx, idx)[0::2]


def _dense_rank(*arrays: np.ndarray) -> list[np.ndarray]:
    allv = np.concatenate(arrays)
    _, inv = np.unique(allv, return_inverse=True)
    out, i = [], 0
    for a in arrays:
        out.append(inv[i:i + len(a)].astype(np.int64))
        i += len(a)
    return out


def frame_bounds_range(g: np.ndarray, t: np.ndarray, R: int) -> tuple[np.ndarray, np.ndarray]:
    """``[lo, hi)`` of the rows ``j`` of the same group with ``t[i] - R <= t[j] <= t[i]``
    (rows sorted by ``(g, t)``)."""
    rt, rlo = _dense_rank(t, t - R)
    M = int(max(rt.max(initial=0), rlo.max(initial=0))) + 2
    comp = g * M + rt
    lo = np.searchsorted(comp, g * M + rlo, side="left")
    hi = np.searchsorted(comp, comp, side="right")
    return lo, hi


class RollingOperator(KeyedRecomputeOperator):
    name = "rolling"

    def __init__(self, ctx, t: pa.DataType, specs: list, range_: Optional[int],
                 rows: Optional[int], n_keys: int, val_schema: pa.Schema, out_schema: pa.Schema,
                 order: list[int]):
        super().__init__(ctx, out_schema)
        self.t, self.specs, self.range, self.rows = t, specs, range_, rows
        self.n_keys, self.val_schema, self.order = n_keys, val_schema, order

    def reach(self) -> Optional[int]:
        """Range frames: ``range`` before a key's earliest change. Row frames: the rows before it
        are counted by :meth:`enough` (starting one time unit back)."""
        return self.range if self.rows is None else 1

    def enough(self, groups: OrdIndexedZSet, lo: np.ndarray, first: np.ndarray) -> np.ndarray:
        if self.rows is None:
            return np.ones(groups.num_keys, dtype=bool)
        # a row frame needs rows - 1 rows before the first changed one: the rows read before
        # the key's earliest changed time (each copy counts)
        prow, g = positive(groups)
        tt, _ = time_int64(groups.vals.column(0))
        before = tt[prow] < first[g]
        n = np.bincount(g[before], groups.weights[prow][before], minlength=groups.num_keys)
        return n >= self.rows - 1

    def compute(self, groups: OrdIndexedZSet, tmin: int) -> ZSet:
        prow, g = positive(groups)
        tt, _ = time_int64(groups.vals.column(0))
        w = groups.weights[prow]
        t = tt[prow]
        if self.rows is not None:  # each copy of a row is its own row of the frame
            rep = np.repeat(np.arange(len(prow)), w)
            prow, g, t, w = prow[rep], g[rep], t[rep], np.ones(len(rep), np.int64)
            n = len(prow)
            idx = np.arange(n, dtype=np.int64)
            gstart = np.zeros(n, dtype=np.int64)
            if n:
                new = np.ones(n, dtype=bool)
                new[1:] = g[1:] != g[:-1]
                gstart = np.maximum.accumulate(np.where(new, idx, 0))
            lo = np.maximum(gstart, idx - (self.rows - 1))
            hi = idx + 1
        else:
            lo, hi = frame_bounds_range(g, t, self.range)
        out_i = np.flatnonzero(t >= tmin)  # earlier rows' frames did not change
        if len(out_i) == 0:
            return ZSet.empty(self.out_schema)
        lo, hi = lo[out_i], hi[out_i]
        vals = groups.vals.take(pa.array(prow))
        aggs = [self._agg(s, vals, w, lo, hi) for s in self.specs]
        src_rows = pa.array(prow[out_i])
        keys = groups.keys.take(pa.array(groups.key_index()[prow[out_i]]))
        vsel = groups.vals.take(src_rows)
        cols = list(keys.columns) + list(vsel.columns)
        cols = [cols[i] for i in self.order] + aggs
        return ZSet(pa.RecordBatch.from_arrays(cols, schema=self.out_schema), w[out_i])

    def _agg(self, spec, vals: pa.RecordBatch, w: np.ndarray, lo, hi) -> pa.Array:
        name, kind, column, out_type = spec
        if column is None:
            return pa.array(_window_reduce(np.add, w, lo, hi, 0), pa.int64())
        arr = vals.column(column)
        valid = np.ones(len(arr), dtype=bool) if arr.null_count == 0 else \
            np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        cnt = _window_reduce(np.add, w * valid, lo, hi, 0)
        if kind == "count":
            return pa.array(cnt, pa.int64())
        t = arr.type
        if pa.types.is_floating(t):
            x = np.asarray(pc.fill_null(arr, 0.0).to_numpy(zero_copy_only=False), np.float64)
        else:
            x, _ = time_int64(arr) if not pa.types.is_integer(t) else \
                (np.asarray(pc.fill_null(arr, 0).to_numpy(zero_copy_only=False), np.int64), None)
        has = cnt != 0
        if kind in ("sum", "avg"):
            s = _window_reduce(np.add, x * w.astype(x.dtype), lo, hi, 0)
            if kind == "sum":
                return pa.array(s, out_type, mask=~has)
            with np.errstate(divide="ignore", invalid="ignore"):
                return pa.array(s.astype(np.float64) / np.where(has, cnt, 1), pa.float64(),
                                mask=~has)
        if x.dtype == np.float64:
            hi_v, lo_v = np.inf, -np.inf
        else:
            hi_v, lo_v = np.iinfo(np.int64).max, np.iinfo(np.int64).min
        if kind == "min":
            r = _window_reduce(np.minimum, np.where(valid, x, hi_v), lo, hi, hi_v)
        else:
            r = _window_reduce(np.maximum, np.where(valid, x, lo_v), lo, hi, lo_v)
        res = pa.array(r, pa.float64() if x.dtype == np.float64 else pa.int64(), mask=~has)
        if res.type != out_type:
            res = from_physical(res, out_type) if not pa.types.is_integer(out_type) else \
                res.cast(out_type)
        return res

    def retain(self, state: OrdIndexedZSet, wm: int) -> np.ndarray:
        t, _ = time_int64(state.vals.column(0))
        if self.rows is None:
            return t >= wm - self.range
        keep = t >= wm
        # plus, per key, the last rows - 1 rows before wm (values are time-ordered per key)
        before = np.flatnonzero(~keep)
        if len(before) and self.rows > 1:
            kidx = state.key_index()[before]
            # position from the end within each key's run of rows before wm
            n = len(before)
            last = np.ones(n, dtype=bool)
            last[:-1] = kidx[1:] != kidx[:-1]
            ends = np.flatnonzero(last)
            run_end = np.repeat(ends, np.diff(np.append(-1, ends)))
            from_end = run_end - np.arange(n)
            keep[before[from_end < self.rows - 1]] = True
        return keep


def rolling_aggregate(stream, time_col: str, keys: Sequence[str], aggs: dict,
                      range_: Any = None, rows: Optional[int] = None, wm_stream=None):
    """Per-row rolling aggregates ``{"out": (kind, column or None)}`` over ``range_`` (time) or
    ``rows`` (count) per partition of ``keys``; see the module doc."""
    keys = list(keys)
    schema = stream.schema
    for k in keys:
        if k not in schema.names:
            raise KeyError(f"no partition column {k!r} (columns: {schema.names})")
    if time_col not in schema.names:
        raise KeyError(f"no time column {time_col!r} (columns: {schema.names})")
    t = schema.field(time_col).type
    if not is_time_type(t):
        raise TypeError(f"time column {time_col!r} has type {t}; rolling needs a timestamp, "
                        f"date32 or integer column")
    if (range_ is None) == (rows is None):
        raise ValueError("rolling needs exactly one of range= (a time span) or rows= (a count)")
    R = _units(range_, t, "rolling range", positive=False) if range_ is not None else None
    if R is not None and R < 0:
        raise ValueError("rolling range must be >= 0")
    if rows is not None and (not isinstance(rows, int) or rows < 1):
        raise ValueError(f"rolling rows must be a positive int, got {rows!r}")
    if wm_stream is not None and not (isinstance(wm_stream.type, WatermarkType)
                                      and wm_stream.type.time_type == t):
        raise TypeError("watermark stream does not match the time column")
    specs = []
    for name, spec in aggs.items():
        if name in schema.names:
            raise ValueError(f"rolling output {name!r} clashes with an input column")
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise TypeError(f"rolling aggregate {name!r}: expected (kind, column), got {spec!r}")
        kind, col = spec
        if kind not in KINDS:
            raise ValueError(f"rolling aggregate {name!r}: unknown kind {kind!r} (known: {KINDS})")
        if col is None:
            if kind != "count":
                raise ValueError(f"rolling aggregate {name!r}: {kind} needs a column")
            specs.append((name, kind, None, pa.int64()))
            continue
        if col not in schema.names:
            raise KeyError(f"rolling aggregate {name!r}: no column {col!r} "
                           f"(columns: {schema.names})")
        ct = schema.field(col).type
        numeric = pa.types.is_integer(ct) or pa.types.is_floating(ct)
        temporal = pa.types.is_timestamp(ct) or pa.types.is_date32(ct) or \
            pa.types.is_duration(ct)
        if kind == "count":
            out_t = pa.int64()
        elif kind in ("sum", "avg"):
            if not numeric:
                raise TypeError(f"rolling aggregate {name!r}: {kind} needs an integer or float "
                                f"column, {col!r} is {ct}")
            out_t = pa.float64() if (kind == "avg" or pa.types.is_floating(ct)) else pa.int64()
        else:
            if not (numeric or temporal):
                raise TypeError(f"rolling aggregate {name!r}: {kind} needs a numeric or temporal "
                                f"column, {col!r} is {ct}")
            out_t = pa.float64() if pa.types.is_floating(ct) else ct
        specs.append((name, kind, col, out_t))
    others = [c for c in schema.names if c not in keys and c != time_col]
    ix = time_first(stream, time_col, keys, others)
    # internal layout keys ++ (__t, others); the output keeps the input's column order
    internal = keys + [time_col] + others
    order = [internal.index(c) for c in schema.names]
    specs = [(n, k, (None if c is None else ("__t" if c == time_col else c)), o)
             for n, k, c, o in specs]
    out = pa.schema(list(schema) + [pa.field(n, o) for n, _, _, o in specs])
    s = sharded(ix)
    inputs = [s] if wm_stream is None else [s, wm_stream]
    vs = ix.val_schema
    return stream.circuit.add_node(
        "rolling", lambda ctx: RollingOperator(ctx, t, specs, R, rows, len(keys), vs, out, order),
        inputs, ZSetType(out))


__all__ = ["rolling_aggregate", "RollingOperator", "frame_bounds_range", "KINDS"]
