"""window: tumbling, hopping and session windows over event time, with aggregates and GC.

Window kinds (sizes are ``timedelta`` for timestamp / date columns, ints for integer columns):

* :func:`tumbling` ``(size, offset)``: the windows ``[offset + i*size, offset + (i+1)*size)``;
  every row falls in exactly one.
* :func:`hopping` ``(size, every, offset)``: windows of length ``size`` starting every ``every``
  (``offset + i*every``); a row falls in ``ceil(size / every)`` of them (fewer when ``every``
  does not divide ``size``; none when it falls in a gap, ``every > size``); ``every == size`` is
  tumbling.
* :func:`session` ``(gap)``: per key, rows whose event times are closer than ``gap`` belong to one
  session (two rows at ``t1 <= t2`` with ``t2 - t1 < gap`` are in the same session, transitively);
  the session is ``[first time, last time + gap)``.

Output: one row per (key, window) holding at least one row, ``keys ++ (window_start,
window_end) ++ aggregates``; ``window_end`` is exclusive. Rows whose event time is null fall in
no window (with a declared event time they are already dropped, and counted, as late). Aggregates are those of
:mod:`dbsp.operators.aggregate` (same null and type rules).

Semantics (DBSP's): a window's row appears at the first step that puts a row in it and is
*updated* (``-old +new``) at every step that changes its contents, so the integrated view is
always the aggregate of everything that arrived on time. With a watermark (an event-time column
declared with a lateness, :mod:`dbsp.operators.watermark`) a window becomes **final** once the
watermark reaches its end: no row that can still arrive falls in it (later rows behind the
watermark are dropped as late). Its state is then dropped from the traces, so a windowed query over
an unbounded stream keeps state proportional to the open windows only. Closing a window emits
nothing (its last row stays in the view); without a watermark, all window state is kept.

Design
------
*Tumbling / hopping*: a hopping window's rows are first consolidated by (pane, keys, aggregated
columns), a pane being the slice of width ``gcd(size, every)`` holding the row's time (every time
of a pane falls in the same windows), so a burst of rows on one key is copied into its windows
once, with its summed weight. Then a vectorised flat-map gives every row its window starts; the
rows are indexed by ``(window_start, keys...)`` - the window start is the *leading key column*, so key
codes order by time - sharded by key hash, and aggregated by the engine's aggregate operators
(running partials for count/sum/avg, per-(key, value) weights for min/max/count_distinct). After
each step, every trace of that operator is cut below the key code of ``(cut, smallest keys)``
where ``cut`` is the first window start that is still open (:meth:`Spine.truncate_keys_below`).

*Sessions*: rows are indexed by the keys with the event time as the leading value column (so a
key's values are sorted by time) and sharded. :class:`KeyedRecomputeOperator` keeps the input
trace; per step, for the keys the delta touches, it reads their rows from ``gap`` before the
key's earliest changed time (further back only while the first row read may still chain into an
earlier session), computes the sessions of the old and of the new rows and emits the difference
(sessions ending before the delta's earliest time cannot change and are skipped). GC sweeps the trace, dropping the rows of sessions that ended behind the
watermark; sweeps are amortised (run when the trace has doubled since the last one).
:mod:`dbsp.operators.rolling` uses the same machinery.

>>> import pyarrow as pa, dbsp
>>> from dbsp.operators.window import tumbling, window_aggregate
>>> c = dbsp.Circuit()
>>> t = c.add_input("t", [("ts", pa.int64()), ("k", pa.string()), ("x", pa.int64())])
>>> out = window_aggregate(t, "ts", tumbling(10), ["k"], {"s": ("sum", "x")}).output()
>>> _ = t.insert([(1, "a", 5), (9, "a", 1), (12, "a", 2)]); c.step()
>>> sorted(out.to_dict().items())
[(('a', 0, 10, 6), 1), (('a', 10, 20, 2), 1)]
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import KeyCodec
from ..algebra.time import duration_to_units, from_physical, is_time_type
from ..circuit.operator import Operator
from ..circuit.types import IndexedType, ZSetType
from ..trace.batch import OrdIndexedZSet, OrdZSet, ZSet
from ..trace.probe import rows_from
from ..trace.spine import Spine
from ._values import add
from .aggregate import (LINEAR, Aggregator, GeneralAggregateOperator, GroupAggregateOperator,
                        LinearAggregateOperator, compute_groups, output_schema, parse_aggs)
from .exchange import sharded
from .watermark import WatermarkType, time_int64

WS, WE = "window_start", "window_end"
_T = "__t"  # internal name of the event time inside windowed operators
_WS = "__ws"


# --- window specs --------------------------------------------------------------------------

@dataclass(frozen=True)
class Tumbling:
    size: Any
    offset: Any = None

    kind = "tumbling"


@dataclass(frozen=True)
class Hopping:
    size: Any
    every: Any
    offset: Any = None

    kind = "hopping"


@dataclass(frozen=True)
class Session:
    gap: Any

    kind = "session"


def tumbling(size: Any, offset: Any = None) -> Tumbling:
    """Fixed, non-overlapping windows of length ``size`` (aligned to the epoch + ``offset``)."""
    return Tumbling(size, offset)


def hopping(size: Any, every: Any, offset: Any = None) -> Hopping:
    """Windows of length ``size`` starting every ``every`` (sliding windows)."""
    return Hopping(size, every, offset)


def session(gap: Any) -> Session:
    """Per-key sessions: rows closer than ``gap`` in event time are one session."""
    return Session(gap)


def _units(v: Any, t: pa.DataType, what: str, positive: bool = True) -> int:
    if v is None:
        return 0
    u = duration_to_units(v, t, what)
    if positive and u <= 0:
        raise ValueError(f"{what} must be positive, got {v!r}")
    return u


# --- window assignment ---------------------------------------------------------------------

def _from_physical(x: np.ndarray, t: pa.DataType) -> pa.Array:
    return from_physical(pa.array(x, pa.int64()), t)


class _Assign:
    """Vectorised flat-map: each row -> one row per window it falls in, ``(ws, cols...)``."""

    def __init__(self, time_col: str, t: pa.DataType, size: int, every: int, offset: int,
                 cols: list[str], out_schema: pa.Schema):
        self.time_col, self.t, self.size, self.every, self.offset = time_col, t, size, every, offset
        self.cols, self.out_schema = cols, out_schema
        self.copies = -(-size // every)

    def __call__(self, batch: pa.RecordBatch):
        t, valid = time_int64(batch.column(self.time_col))
        idx = np.flatnonzero(valid)
        tv = t[idx]
        first = tv - np.mod(tv - self.offset, self.every)  # latest window start <= t
        if self.copies == 1 and self.every == self.size:  # tumbling
            parent, ws = idx, first
        else:
            k = np.arange(self.copies, dtype=np.int64)
            ws = (first[:, None] - k[None, :] * self.every).ravel()
            parent = np.repeat(idx, self.copies)
            ok = ws + self.size > np.repeat(tv, self.copies)
            ws, parent = ws[ok], parent[ok]
        rows = batch.select(self.cols).take(pa.array(parent, pa.int64()))
        cols = [_from_physical(ws, self.t)] + list(rows.columns)
        return pa.RecordBatch.from_arrays(cols, schema=self.out_schema), parent


class _Pane:
    """Vectorised map of each row to its *pane*: the event time replaced by the start of its
    slice of width ``gcd(size, every)`` (rows with a null time dropped, as :class:`_Assign`
    drops them). Every time of one pane falls in the same hopping windows, so rows that agree on
    pane, keys and aggregated columns may be consolidated (their weights summed) before
    :class:`_Assign` copies each into its ``ceil(size / every)`` windows."""

    def __init__(self, time_col: str, t: pa.DataType, width: int, offset: int, cols: list[str],
                 out_schema: pa.Schema):
        self.time_col, self.t, self.width, self.offset = time_col, t, width, offset
        self.cols, self.out_schema = cols, out_schema

    def __call__(self, batch: pa.RecordBatch):
        t, valid = time_int64(batch.column(self.time_col))
        idx = np.flatnonzero(valid)
        tv = t[idx]
        pane = tv - np.mod(tv - self.offset, self.width)
        rows = batch.select(self.cols)
        if len(idx) != batch.num_rows:
            rows = rows.take(pa.array(idx, pa.int64()))
        cols = [_from_physical(pane, self.t)] + list(rows.columns)
        return pa.RecordBatch.from_arrays(cols, schema=self.out_schema), idx


def key_prefix_bound(kcodec: KeyCodec, first: pa.Array):
    """The smallest key code whose leading column is ``first[0]`` (an int for u64 codes, bytes
    for variable-length codes): ``truncate_keys_below`` of it drops every key with a smaller
    leading column, whatever its other columns."""
    prefix = KeyCodec(kcodec.fields[:1]).encode_reference([first]).row(0)
    if kcodec.u64:
        return int.from_bytes(prefix, "big") << (8 * (kcodec.width - len(prefix)))
    return prefix


def _spines(op: Any) -> list[Spine]:
    """Every trace of an operator (spines held directly or as ``.trace`` of a helper, also in a
    dict of helpers)."""
    out = []
    found = list(vars(op).values())
    for v in list(found):
        if isinstance(v, dict):
            found.extend(v.values())
    for v in found:
        if isinstance(v, Spine):
            out.append(v)
        elif isinstance(getattr(v, "trace", None), Spine):
            out.append(v.trace)
    return out


class WindowAggregateOperator(Operator):
    """The engine's aggregate over ``(window_start, keys) -> values``, plus watermark GC and the
    final column layout ``keys ++ (window_start, window_end) ++ aggregates``."""

    state_attrs = ('inner', 'cut')

    name = "window_aggregate"

    def __init__(self, ctx, inner: Operator, size: int, t: pa.DataType, key_schema: pa.Schema,
                 n_keys: int, out_schema: pa.Schema):
        super().__init__(ctx)
        self.inner, self.size, self.t = inner, size, t
        self.kcodec = KeyCodec(list(key_schema))
        self.ws_field = key_schema.field(0)
        self.n_keys, self.out_schema = n_keys, out_schema
        self.cut: Optional[int] = None

    def savepoint(self):
        return self.cut, self.inner.savepoint()

    def restore(self, saved) -> None:
        self.cut, inner = saved
        self.inner.restore(inner)

    def eval(self, d: OrdIndexedZSet, wm: Optional[int] = None) -> ZSet:
        z = self.inner.eval(d)
        if wm is not None:
            self.collect(wm)
        if len(z) == 0:
            return ZSet.empty(self.out_schema)
        b = z.data
        ws = b.column(0)
        p, _ = time_int64(ws)
        we = _from_physical(p + self.size, self.t)
        cols = b.columns[1:1 + self.n_keys] + [ws, we] + b.columns[1 + self.n_keys:]
        return ZSet(pa.RecordBatch.from_arrays(cols, schema=self.out_schema), z.weights)

    def collect(self, wm: int) -> None:
        """Drop the state of the windows closed by watermark ``wm`` (``start + size <= wm``)."""
        cut = wm - self.size + 1  # first window start that may still change
        if self.cut is not None and cut <= self.cut:
            return
        self.cut = cut
        bound = key_prefix_bound(self.kcodec, _from_physical(np.array([cut]), self.ws_field.type))
        for sp in _spines(self.inner):
            sp.truncate_keys_below(bound)

    def clock_start(self) -> None:
        self.inner.clock_start()

    def state_rows(self) -> int:
        return self.inner.state_rows()


def _check_keys(schema: pa.Schema, keys: Sequence[str], time_col: str) -> None:
    for k in keys:
        if k not in schema.names:
            raise KeyError(f"no key column {k!r} (columns: {schema.names})")
        if k in (WS, WE):
            raise ValueError(f"a key column may not be called {k!r} (window output column)")
    if time_col not in schema.names:
        raise KeyError(f"no time column {time_col!r} (columns: {schema.names})")
    t = schema.field(time_col).type
    if not is_time_type(t):
        raise TypeError(f"time column {time_col!r} has type {t}; windows need a timestamp, "
                        f"date32 or integer column")


def _agg_columns(aggs: dict) -> list[str]:
    cols: list[str] = []
    for spec in aggs.values():
        c = spec[1] if isinstance(spec, tuple) else None
        if c is not None and c not in cols:
            cols.append(c)
    return cols


def window_aggregate(stream, time_col: str, spec, keys: Sequence[str], aggs: dict,
                     wm_stream=None):
    """Aggregate ``stream`` per (``keys``, window of ``time_col``) (see the module doc).

    ``aggs`` is ``{"out": (kind, column)}`` as for :meth:`IndexedStream.aggregate`. ``wm_stream``
    (a :class:`WatermarkType` stream of ``time_col``) enables garbage collection of closed
    windows.
    """
    keys = list(keys)
    schema = stream.schema
    _check_keys(schema, keys, time_col)
    t = schema.field(time_col).type
    if wm_stream is not None:
        wt = wm_stream.type
        if not isinstance(wt, WatermarkType) or wt.time_type != t:
            raise TypeError(f"watermark stream {wt.describe()} does not match time column "
                            f"{time_col!r} ({t})")
    if isinstance(spec, Session):
        return session_aggregate(stream, time_col, spec, keys, aggs, wm_stream)
    if isinstance(spec, Tumbling):
        size = _units(spec.size, t, "window size")
        every = size
    elif isinstance(spec, Hopping):
        size = _units(spec.size, t, "window size")
        every = _units(spec.every, t, "window hop (every)")
    else:
        raise TypeError(f"not a window: {spec!r} (use tumbling(), hopping() or session())")
    offset = _units(spec.offset, t, "window offset", positive=False)
    vcols = [c for c in _agg_columns(aggs) if c not in keys]
    for c in _agg_columns(aggs):
        if c not in schema.names:
            raise KeyError(f"aggregate column {c!r} is not a column (columns: {schema.names})")
        if c in keys:
            raise ValueError(f"aggregate column {c!r} is a key column")
    assigned = pa.schema([pa.field(_WS, t, nullable=False)]
                         + [schema.field(k) for k in keys] + [schema.field(c) for c in vcols])
    fn = _Assign(time_col, t, size, every, offset, keys + vcols, assigned)
    if fn.copies > 1 and time_col not in keys + vcols:
        # hopping: consolidate rows by (pane, keys, aggregated columns) before copying each
        # into its windows. Nexmark q5's 92K bids a step fall on ~6.3K (auction, 2 s pane)
        # rows, so the windows' index sorts 32K rows instead of 460K; at worst (no two rows
        # alike) it costs one more sort of the input, 1 / copies of the index's.
        panes = pa.schema([pa.field(time_col, t, nullable=False)]
                          + [schema.field(k) for k in keys] + [schema.field(c) for c in vcols])
        width = math.gcd(size, every)
        stream = stream.flat_map(_Pane(time_col, t, width, offset, keys + vcols, panes),
                                 panes).consolidate()
    rows = stream.flat_map(fn, assigned)
    ix = rows.index_by([_WS] + keys)
    specs = parse_aggs(aggs, ix.key_schema, ix.val_schema)
    inner_out = output_schema(ix.key_schema, specs)
    linear = all(isinstance(x.kind, str) and x.kind in LINEAR for x in specs)
    udf = any(isinstance(x.kind, Aggregator) for x in specs)
    cls = LinearAggregateOperator if linear else \
        (GroupAggregateOperator if udf else GeneralAggregateOperator)
    agg_fields = list(inner_out)[1 + len(keys):]
    out = pa.schema([schema.field(k) for k in keys]
                    + [pa.field(WS, t, nullable=False), pa.field(WE, t, nullable=False)]
                    + agg_fields)
    key_schema = ix.key_schema
    s = sharded(ix)
    inputs = [s] if wm_stream is None else [s, wm_stream]
    return stream.circuit.add_node(
        f"window_aggregate[{spec.kind}]",
        lambda ctx: WindowAggregateOperator(ctx, cls(ctx, specs, inner_out), size, t, key_schema,
                                            len(keys), out),
        inputs, ZSetType(out))


# --- recomputation of touched keys (sessions, rolling) ---------------------------------------

class KeyedRecomputeOperator(Operator):
    """Base of operators whose output for a key is a function of all the key's rows.

    Input: a sharded indexed stream ``keys -> (t, ...)`` with the non-null event time ``t`` as
    the leading value column (so each key's values are sorted by time), and optionally the
    watermark. State: the input trace. Each step, for the touched keys::

        Δout = compute(new groups, tmin) - compute(old groups, tmin)

    where ``tmin`` is the earliest time in the delta: :meth:`compute` may skip outputs that only
    depend on rows before ``tmin`` (both terms skip the same ones, so they cancel either way).
    Subclasses implement :meth:`compute` and :meth:`retain` (which rows a watermark makes
    useless).
    """

    state_attrs = ('input', 'gc_wm', 'live')

    name = "keyed_recompute"
    MIN_GC_ROWS = 1024

    def __init__(self, ctx, out_schema: pa.Schema):
        super().__init__(ctx)
        self.out_schema = out_schema
        self.input = Spine(name=f"{self.name}.input")
        self.gc_wm: Optional[int] = None
        self.live = 0  # rows left by the last GC sweep

    def compute(self, groups: OrdIndexedZSet, tmin: int) -> ZSet:  # pragma: no cover
        raise NotImplementedError

    def retain(self, state: OrdIndexedZSet, wm: int) -> np.ndarray:  # pragma: no cover
        """Bool mask over ``state``'s value rows: the rows still needed once the watermark is
        ``wm``."""
        raise NotImplementedError

    def reach(self) -> Optional[int]:
        """How far before a key's earliest changed time its rows are first read (None: the
        whole group, every step)."""
        return None

    def enough(self, groups: OrdIndexedZSet, lo: np.ndarray, first: np.ndarray) -> np.ndarray:
        """Per key of ``groups`` (rows read from time ``lo``; ``first``: the key's earliest
        changed time; both aligned to the keys): whether those rows suffice, i.e. the rows
        before ``lo`` change none of the outputs that :meth:`compute` gives for the changed
        times. Keys not enough are read again from further back."""
        return np.ones(groups.num_keys, dtype=bool)

    def _groups(self, batches, d: OrdIndexedZSet):
        """``(old, new)`` groups of the keys of ``d``: whole, or (with :meth:`reach`) the rows
        from ``lo = first changed time - reach`` on, ``lo`` moved back (4x further each time)
        for keys where :meth:`enough` says no. Outputs that :meth:`compute` builds from rows
        before a key's changed times alone are the same in both, so they cancel."""
        reach = self.reach()
        if reach is None:
            old = self.input.lookup(d.kcodes)
            return old, d if old is None else OrdIndexedZSet.merge([old, d])
        t, _ = time_int64(d.vals.column(0))
        G = d.num_keys
        first = np.minimum.reduceat(t, d.offsets[:-1])
        step = np.full(G, max(int(reach), 1), dtype=np.int64)
        lo = first - step
        todo = np.arange(G, dtype=np.int64)
        olds, news = [], []
        while len(todo):
            sub = d.select_keys(todo)
            old, whole = rows_from(batches, sub.keys, sub.kcodes, lo[todo])
            new = sub if old is None else OrdIndexedZSet.merge([old, sub])
            ok = np.ones(len(todo), dtype=bool)
            for g in (old, new):
                if g is not None and len(g):
                    ai, _ = K.intersect(sub.kcodes, g.kcodes)
                    ok[ai] &= self.enough(g, lo[todo][ai], first[todo][ai])
            ok |= whole  # nothing lies before lo: the rows read are all there is
            done = K.take(sub.kcodes, np.flatnonzero(ok))
            if len(done):
                if old is not None and len(old):
                    olds.append(_keys_subset(old, done))
                news.append(_keys_subset(new, done))
            todo = todo[~ok]
            step[todo] *= 4
            lo[todo] -= step[todo]
        olds = [o for o in olds if o is not None and len(o)]
        news = [n for n in news if n is not None and len(n)]
        old = (OrdIndexedZSet.merge(olds) if len(olds) > 1 else olds[0]) if olds else None
        new = (OrdIndexedZSet.merge(news) if len(news) > 1 else news[0]) if news else None
        return old, new

    def eval(self, d: OrdIndexedZSet, wm: Optional[int] = None) -> ZSet:
        out: ZSet = ZSet.empty(self.out_schema)
        if len(d):
            old, new = self._groups(self.input.batches(), d)
            self.input.insert(d)
            tmin = int(time_int64(d.vals.column(0))[0].min())
            parts = []
            if old is not None and len(old):
                parts.append(self.compute(old, tmin).neg())
            if new is not None and len(new):
                parts.append(self.compute(new, tmin))
            if parts:
                z = add(ZSetType(self.out_schema), parts).consolidate()
                out = z if len(z) else out
        if wm is not None:
            self.collect(wm)
        return out

    def collect(self, wm: int) -> None:
        """An amortised GC sweep: when the watermark has moved and the trace has doubled since
        the last sweep, keep only the rows :meth:`retain` still needs."""
        if self.gc_wm is not None and wm <= self.gc_wm:
            return
        n = len(self.input)
        if n < max(self.MIN_GC_ROWS, 2 * self.live):
            return
        self.gc_wm = wm
        state = self.input.consolidated()
        self.input.clear()
        if state is None or len(state) == 0:
            self.live = 0
            return
        keep = self.retain(state, wm)
        kept = state.filter_rows(keep) if hasattr(state, "filter_rows") else \
            _filter_rows(state, keep)
        if len(kept):
            self.input.insert(kept)
        self.live = len(kept)

    def clock_start(self) -> None:
        self.input.clear()

    def savepoint(self):
        return self.gc_wm, self.live

    def restore(self, saved) -> None:
        self.gc_wm, self.live = saved

    def state_rows(self) -> int:
        return len(self.input)


def _keys_subset(g: OrdIndexedZSet, kcodes) -> Optional[OrdIndexedZSet]:
    """The keys of ``g`` among the sorted distinct ``kcodes``, with their rows."""
    ai, _ = K.intersect(g.kcodes, kcodes)
    return g.select_keys(ai) if len(ai) else None


def _filter_rows(ix: OrdIndexedZSet, mask: np.ndarray) -> OrdIndexedZSet:
    keys = ix.key_rows().filter(pa.array(mask))
    vals = ix.vals.filter(pa.array(mask))
    return OrdIndexedZSet.from_parts(keys, vals, ix.weights[mask], ix.kcodec, ix.vcodec)


def positive(groups: OrdIndexedZSet) -> tuple[np.ndarray, np.ndarray]:
    """``(row indices with positive weight, their key index)`` of an indexed batch."""
    rows = np.flatnonzero(groups.weights > 0)
    return rows, groups.key_index()[rows]


# --- sessions ------------------------------------------------------------------------------

class SessionOperator(KeyedRecomputeOperator):
    """Session windows per key, aggregated (see the module doc)."""

    name = "session_window"

    def __init__(self, ctx, gap: int, t: pa.DataType, specs, n_keys: int, out_schema: pa.Schema):
        super().__init__(ctx, out_schema)
        self.gap, self.t, self.specs, self.n_keys = gap, t, specs, n_keys

    def _sessions(self, groups: OrdIndexedZSet):
        """``(rows, start flags, session offsets, times)`` over the positive rows."""
        rows, kidx = positive(groups)
        t, _ = time_int64(groups.vals.column(0))
        t = t[rows]
        n = len(rows)
        start = np.ones(n, dtype=bool)
        if n > 1:
            start[1:] = (kidx[1:] != kidx[:-1]) | (t[1:] - t[:-1] >= self.gap)
        first = np.flatnonzero(start)
        offsets = np.append(first, n).astype(np.int64)
        return rows, kidx, offsets, t

    def reach(self) -> Optional[int]:
        return self.gap

    def enough(self, groups: OrdIndexedZSet, lo: np.ndarray, first: np.ndarray) -> np.ndarray:
        """The first positive row read is ``gap`` or more after ``lo``: no earlier row can chain
        into its session, so every session read is whole."""
        rows, kidx = positive(groups)
        ok = np.ones(groups.num_keys, dtype=bool)
        if len(rows):
            t, _ = time_int64(groups.vals.column(0))
            head = np.r_[True, kidx[1:] != kidx[:-1]]
            k0 = kidx[head]
            ok[k0] = t[rows[head]] - lo[k0] >= self.gap
        return ok

    def compute(self, groups: OrdIndexedZSet, tmin: int) -> ZSet:
        rows, kidx, offsets, t = self._sessions(groups)
        if len(rows) == 0:
            return ZSet.empty(self.out_schema)
        first, last = offsets[:-1], offsets[1:] - 1
        ws, we = t[first], t[last] + self.gap
        live = we > tmin  # sessions ending at or before tmin cannot change
        vals = groups.vals.take(pa.array(rows))
        total, cols = compute_groups(self.specs, vals, groups.weights[rows], offsets)
        keep = np.flatnonzero(live & (total > 0))
        keys = groups.keys.take(pa.array(kidx[first[keep]]))
        k = pa.array(keep)
        out = list(keys.columns) + [_from_physical(ws[keep], self.t),
                                    _from_physical(we[keep], self.t)] + [c.take(k) for c in cols]
        return ZSet(pa.RecordBatch.from_arrays(out, schema=self.out_schema),
                    np.ones(len(keep), np.int64))

    def retain(self, state: OrdIndexedZSet, wm: int) -> np.ndarray:
        keep = np.zeros(len(state), dtype=bool)
        rows, kidx, offsets, t = self._sessions(state)
        if len(rows):
            we = t[offsets[1:] - 1] + self.gap
            open_ = np.repeat(we > wm, np.diff(offsets))
            keep[rows[open_]] = True
        # rows of non-positive weight are kept while they may still be cancelled on time
        tall, _ = time_int64(state.vals.column(0))
        keep |= (state.weights <= 0) & (tall >= wm)
        return keep


def time_first(stream, time_col: str, keys: list[str], cols: list[str]):
    """``stream`` indexed by ``keys`` with values ``(__t, cols...)``: the event time leads (not
    null; rows without a time are dropped), so each key's values are sorted by time."""
    schema = stream.schema
    t = schema.field(time_col).type
    pre = pa.schema([schema.field(k) for k in keys] + [pa.field(_T, t, nullable=False)]
                    + [schema.field(c) for c in cols])
    rows = stream.flat_map(_Reorder(time_col, keys, cols, pre), pre)
    return rows.index_by(keys)


class _Reorder:
    """Flat-map to ``keys ++ (time, cols...)``, dropping rows whose time is null."""

    def __init__(self, time_col: str, keys: list[str], cols: list[str], out_schema: pa.Schema):
        self.time_col, self.keys, self.cols, self.out_schema = time_col, keys, cols, out_schema

    def __call__(self, batch: pa.RecordBatch):
        col = batch.column(self.time_col)
        idx = np.arange(batch.num_rows, dtype=np.int64)
        if col.null_count:
            idx = np.flatnonzero(np.asarray(col.is_valid().to_numpy(zero_copy_only=False)))
            batch = batch.take(pa.array(idx))
        arrs = [batch.column(k) for k in self.keys] + [batch.column(self.time_col)] + \
            [batch.column(c) for c in self.cols]
        return pa.RecordBatch.from_arrays(arrs, schema=self.out_schema), idx


def session_aggregate(stream, time_col: str, spec: Session, keys: list[str], aggs: dict,
                      wm_stream=None):
    schema = stream.schema
    t = schema.field(time_col).type
    gap = _units(spec.gap, t, "session gap")
    for c in _agg_columns(aggs):
        if c not in schema.names:
            raise KeyError(f"aggregate column {c!r} is not a column (columns: {schema.names})")
        if c in keys:
            raise ValueError(f"aggregate column {c!r} is a key column")
    vcols = [c for c in _agg_columns(aggs) if c not in keys]
    ix = time_first(stream, time_col, keys, vcols)
    specs = parse_aggs(aggs, ix.key_schema, ix.val_schema)
    agg_fields = list(output_schema(ix.key_schema, specs))[len(keys):]
    out = pa.schema([schema.field(k) for k in keys]
                    + [pa.field(WS, t, nullable=False), pa.field(WE, t, nullable=False)]
                    + agg_fields)
    s = sharded(ix)
    inputs = [s] if wm_stream is None else [s, wm_stream]
    return stream.circuit.add_node(
        "window_aggregate[session]",
        lambda ctx: SessionOperator(ctx, gap, t, specs, len(keys), out), inputs, ZSetType(out))


__all__ = ["tumbling", "hopping", "session", "Tumbling", "Hopping", "Session", "window_aggregate",
           "session_aggregate", "WindowAggregateOperator", "SessionOperator",
           "KeyedRecomputeOperator", "key_prefix_bound", "time_first", "WS", "WE", "IndexedType",
           "OrdZSet"]
