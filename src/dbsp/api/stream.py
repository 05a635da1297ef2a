"""Fluent streams: :class:`DataStream` and the keyed / windowed views made from it.

A :class:`DataStream` wraps one stream of the core circuit (:class:`dbsp.operators.stream.Stream`)
and its :class:`~dbsp.api.context.StreamContext`. Every method appends operators to the circuit
and returns a new stream; nothing runs until the context steps. Column expressions
(:mod:`dbsp.api.expr`) are compiled against the stream's schema *here*, so an unknown column or a
type error is raised while the pipeline is built.

Every stream carries Z-set deltas: ``select`` of a subset of columns is a multiset projection
(rows that become equal add their weights), ``filter`` keeps weights, joins multiply them,
``distinct`` turns the integrated stream into a set. Sinks (``collect``, ``for_each``) see the
change of each step; ``collect()`` also keeps the integrated view.

Event time: a stream made by ``ctx.stream(src, time="ts", lateness=...)`` knows its time column
and watermark; the knowledge follows through ``filter``, ``select``/``with_columns``/``map`` that
keep the column unchanged, and into ``window``/``rolling``, which use the watermark to drop the
state of what is final (see :mod:`dbsp.operators.window`). Joins, aggregates, ``concat`` and
expressions that rewrite the column drop it (windows after them keep all their state); declare it
again with :meth:`DataStream.with_watermark`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import pyarrow as pa

from ..algebra.dtypes import as_type, common_type
from ..algebra.schema import as_schema
from ..circuit.types import ZSetType
from ..connectors.files import ParquetSink
from ..operators.aggregate import Aggregator, Filtered
from ..operators.lookup_join import lookup_join_rows
from ..operators.proc_time import Clock, WallClock, proc_time
from ..operators.rolling import rolling_aggregate
from ..operators.window import Hopping, Session, Tumbling, window_aggregate
from .expr import AggExpr, Alias, Col, Expr, Lit, When, col
from .expr import count as _count_rows
from .expr.aggregates import AggRef, has_aggregates, resolve_aggregates
from .sink import Collector, ForEach

Aggish = Union[AggExpr, tuple, Any]


@dataclass(frozen=True)
class TimeInfo:
    """What a stream knows about its event time: the column and the watermark stream."""

    column: str
    watermark: Any  # core stream of WatermarkType, or None
    source: Optional[str] = None


def _as_expr(e: Any) -> Expr:
    if isinstance(e, Expr):
        return e
    if isinstance(e, str):
        return Col(e)
    if isinstance(e, AggExpr):
        return AggRef(e)  # the output column of the agg(...) before (or a clear error)
    return Lit(e)


def _named(exprs: Sequence[Any], named: dict, what: str) -> list[tuple[str, Expr]]:
    out: list[tuple[str, Expr]] = []
    for e in exprs:
        ex = _as_expr(e)
        name = ex.output_name()
        if name is None:
            raise ValueError(f"{what}: expression {ex!r} has no name; give it one with "
                             f".alias('name') or as a keyword argument")
        out.append((name, ex))
    for name, e in named.items():
        out.append((name, _as_expr(e)))
    seen: set[str] = set()
    for name, _ in out:
        if name in seen:
            raise ValueError(f"{what}: column {name!r} is produced twice")
        seen.add(name)
    return out


class _Projection:
    """The vectorised function of a select: every compiled expression over the batch."""

    def __init__(self, compiled: list, schema: pa.Schema):
        self.compiled, self.schema = compiled, schema

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        cols = [c(batch) for c in self.compiled]
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)

    def explain(self, batch: pa.RecordBatch) -> str:
        """The first expression that fails on ``batch`` (for error messages)."""
        for f, c in zip(self.schema, self.compiled):
            try:
                c(batch)
            except Exception:  # noqa: BLE001 - looking for the one that fails
                return f"{f.name} = {c.expr!r}"
        return ", ".join(f"{f.name} = {c.expr!r}" for f, c in zip(self.schema, self.compiled))


def compile_projection(schema: pa.Schema, items: list[tuple[str, Expr]], what: str):
    """``(function, output schema)`` of ``items`` (name, expression) over ``schema``; columns
    passed through unchanged keep their field (and nullability)."""
    compiled, fields = [], []
    for name, e in items:
        c = e.compile(schema, f"{what} column {name!r}")
        compiled.append(c)
        base = e.arg if isinstance(e, Alias) else e
        if isinstance(base, Col):
            fields.append(schema.field(base.name).with_name(name))
        else:
            t = c.type
            if pa.types.is_null(t):
                raise TypeError(f"{what} column {name!r}: {e!r} is always null and has no type; "
                                f"give it one with .cast(type)")
            fields.append(pa.field(name, t))
    out = pa.schema(fields)
    as_schema(out)  # supported types, no duplicates, no reserved names
    return _Projection(compiled, out), out


def _passthrough(items: list[tuple[str, Expr]], column: str) -> bool:
    """Whether ``column`` is carried through unchanged under the same name."""
    for name, e in items:
        if name == column:
            base = e.arg if isinstance(e, Alias) else e
            return isinstance(base, Col) and base.name == column
    return False


class DataStream:
    """A stream of Z-set deltas over :attr:`schema` (see the module doc)."""

    def __init__(self, ctx, core, time: Optional[TimeInfo] = None, name: Optional[str] = None,
                 origin: Optional[str] = None):
        self.ctx = ctx
        self._s = core
        self._time = time
        self.name = name
        self.origin = origin or name  # the source this stream derives from (for reports)
        # output name -> aggregate, when this stream is (a filter of) an agg(...)'s output:
        # aggregates in expressions over it stand for those columns (SQL HAVING)
        self._aggs: Optional[dict[str, AggExpr]] = None

    def __repr__(self) -> str:
        t = f", time={self._time.column!r}" if self._time else ""
        return f"<DataStream {self.name or '#%d' % self._s.node} {self.schema.names}{t}>"

    # -- shape ----------------------------------------------------------------------------
    @property
    def schema(self) -> pa.Schema:
        return self._s.schema

    @property
    def columns(self) -> list[str]:
        return list(self.schema.names)

    @property
    def core(self):
        """The underlying :class:`dbsp.operators.stream.Stream`."""
        return self._s

    @property
    def time_column(self) -> Optional[str]:
        return self._time.column if self._time else None

    def _having(self, e: Any, where: str) -> Any:
        """``e`` with aggregates replaced by this stream's aggregate output columns."""
        if self._aggs is None or not has_aggregates(e):
            return e
        return resolve_aggregates(e, self._aggs, where)

    def _new(self, core, keep_time: bool = False, time: Optional[TimeInfo] = None) -> "DataStream":
        t = time if time is not None else (self._time if keep_time else None)
        if t is not None and t.column not in core.schema.names:
            t = None
        return DataStream(self.ctx, core, t, origin=self.origin)

    # -- projections ----------------------------------------------------------------------
    def select(self, *exprs: Any, **named: Any) -> "DataStream":
        """New rows of the given columns / expressions: ``select("a", (col("b") * 2).alias("b2"),
        c=col("x") + 1)``. Positional expressions are named after their first column or alias."""
        items = [(n, self._having(e, "select")) for n, e in _named(exprs, named, "select")]
        if not items:
            raise ValueError("select needs at least one column")
        fn, out = compile_projection(self.schema, items, "select")
        keep = self._time is not None and _passthrough(items, self._time.column)
        return self._new(self._s.map(fn, out), keep_time=keep)

    def with_columns(self, *exprs: Any, **named: Any) -> "DataStream":
        """All columns, with the given ones added or replaced (in place, by name)."""
        items = [(n, self._having(e, "with_columns"))
                 for n, e in _named(exprs, named, "with_columns")]
        new = dict(items)
        cols: list[tuple[str, Expr]] = [(n, new.pop(n) if n in new else Col(n))
                                        for n in self.schema.names]
        cols += [(n, e) for n, e in items if n in new]
        fn, out = compile_projection(self.schema, cols, "with_columns")
        keep = self._time is not None and _passthrough(cols, self._time.column)
        return self._new(self._s.map(fn, out), keep_time=keep)

    def map(self, fn: Optional[Callable] = None, /, schema: Any = None,
            **exprs: Any) -> "DataStream":
        """``map(a=expr, b=expr)``: like :meth:`select` with named expressions; or ``map(fn,
        schema)`` with a vectorised ``fn(RecordBatch) -> RecordBatch | dict of arrays``."""
        if fn is None:
            return self.select(**exprs)
        if exprs:
            raise TypeError("map takes a function or named expressions, not both")
        return self._new(self._s.map(fn, schema))

    def drop(self, *columns: str) -> "DataStream":
        for c in columns:
            if c not in self.schema.names:
                raise KeyError(f"drop: no column {c!r} (columns: {self.schema.names})")
        return self.select(*[n for n in self.schema.names if n not in columns])

    def rename(self, mapping: Optional[dict] = None, **kw: str) -> "DataStream":
        """Rename columns: ``rename({"old": "new"})`` or ``rename(old="new")``."""
        m = dict(mapping or {}, **kw)
        for c in m:
            if c not in self.schema.names:
                raise KeyError(f"rename: no column {c!r} (columns: {self.schema.names})")
        items = [(m.get(n, n), Col(n)) for n in self.schema.names]
        fn, out = compile_projection(self.schema, items, "rename")
        time = None
        if self._time is not None:
            time = TimeInfo(m.get(self._time.column, self._time.column), self._time.watermark,
                            self._time.source)
        return self._new(self._s.map(fn, out), time=time)

    def map_rows(self, fn: Callable[[tuple], tuple], schema: Any) -> "DataStream":
        """Per-row Python (slow path): ``fn(row tuple) -> row tuple`` of ``schema``."""
        return self._new(self._s.map_rows(fn, schema))

    def flat_map(self, fn: Callable, schema: Any) -> "DataStream":
        """Vectorised flat map: ``fn(batch) -> (out_batch, parent indices)``."""
        return self._new(self._s.flat_map(fn, schema))

    def flat_map_rows(self, fn: Callable[[tuple], Sequence[tuple]], schema: Any) -> "DataStream":
        """Per-row flat map (slow path): ``fn(row) -> iterable of row tuples``."""
        return self._new(self._s.flat_map_rows(fn, schema))

    def with_processing_time(self, column: str = "p_time",
                             clock: Optional[Clock] = None) -> "DataStream":
        """All columns plus ``column`` (``timestamp[ms]``): the processing time of the step each
        row arrives in, read from ``clock`` (default :class:`~dbsp.operators.proc_time.WallClock`;
        a :class:`~dbsp.operators.proc_time.StepClock` makes it deterministic). For insert-only
        streams: see :mod:`dbsp.operators.proc_time`."""
        return self._new(proc_time(self._s, column, clock or WallClock()), keep_time=True)

    # -- filters --------------------------------------------------------------------------
    def filter(self, pred: Any) -> "DataStream":
        """Keep the rows where the boolean expression (or vectorised ``pred(batch)``) is true;
        null counts as false.

        After ``agg(...)``, an aggregate in the predicate stands for the output column that
        computes it (SQL ``HAVING``): ``group_by("k").agg(n=count()).filter(count() > 1)`` keeps
        the groups of more than one row, like ``filter(col("n") > 1)``."""
        if isinstance(pred, AggExpr):
            pred = AggRef(pred)
        if isinstance(pred, Expr):
            pred = self._having(pred, "filter")
            c = pred.compile(self.schema, "filter")
            if not (pa.types.is_boolean(c.type) or pa.types.is_null(c.type)):
                raise TypeError(f"filter predicate {pred!r} has type {c.type}, not bool")
            out = self._new(self._s.filter(c), keep_time=True)
            out._aggs = self._aggs
            return out
        if callable(pred):
            return self._new(self._s.filter(pred), keep_time=True)
        raise TypeError(f"filter takes an expression or a function, got {pred!r}")

    def filter_rows(self, pred: Callable[[tuple], bool]) -> "DataStream":
        """Per-row filter (slow path)."""
        return self._new(self._s.filter_rows(pred), keep_time=True)

    # -- set operations -------------------------------------------------------------------
    def concat(self, *others: "DataStream") -> "DataStream":
        """The sum (multiset union, ``UNION ALL``) of streams with the same column names.

        Column types are unified like SQL's ``UNION``: integers widen (int32 and int64 give
        int64), integers and floats give float64 (:func:`~dbsp.algebra.dtypes.common_type`);
        a column is nullable when it is in any input. Other type differences raise."""
        streams = [self, *others]
        for o in others:
            if o.schema.names != self.schema.names:
                raise TypeError(f"concat: column names differ: {self.schema.names} vs "
                                f"{o.schema.names}")
        fields = []
        for i, name in enumerate(self.schema.names):
            fs = [s.schema.field(i) for s in streams]
            try:
                t = common_type([f.type for f in fs], f"concat: column {name!r}")
            except TypeError as e:
                raise TypeError(f"{e} (cast with with_columns({name}=col({name!r}).cast(...)))") \
                    from None
            fields.append(pa.field(name, t, nullable=any(f.nullable for f in fs)))
        target = pa.schema(fields)
        cores = [s._conformed(target) for s in streams]
        return self._new(cores[0].plus(*cores[1:]))

    def _conformed(self, schema: pa.Schema):
        """This stream's core with ``schema`` (same names; types widened, nullability set)."""
        if self.schema == schema:
            return self._s
        if [f.type for f in self.schema] == [f.type for f in schema]:
            return self._align(schema)
        casts = {f.name: col(f.name).cast(f.type) for f, g in zip(schema, self.schema)
                 if f.type != g.type}
        return self.with_columns(**casts)._align(schema)

    def _align(self, schema: pa.Schema):
        """This stream's core with ``schema``'s field nullability (same names and types)."""
        def run(b, _out=schema):
            return pa.RecordBatch.from_arrays(b.columns, schema=_out)
        return self._s.map(run, schema)

    def minus(self, other: "DataStream") -> "DataStream":
        """``self - other`` (Z-set difference: weights subtract; ``EXCEPT ALL`` when ``other``
        is contained in ``self``)."""
        o = other._s if other.schema == self.schema else other._align(self.schema)
        return self._new(self._s.minus(o))

    def distinct(self) -> "DataStream":
        """Set semantics: every row with positive total weight, once."""
        return self._new(self._s.distinct())

    # -- time -----------------------------------------------------------------------------
    def with_watermark(self, time: str, lateness: Any, name: Optional[str] = None
                       ) -> "DataStream":
        """Declare ``time`` the event time of this stream with the given lateness: rows behind the
        watermark are dropped and counted in ``ctx.late_rows[name]`` and the report (``name``
        defaults to ``"<source>.<time>"``)."""
        name = name or f"{self.origin or 'stream'}.{time}"
        return self.ctx._watermark(self, time, lateness, name)

    def window(self, spec: Any, time: Optional[str] = None) -> "WindowedStream":
        """Windows of the event time: ``window(tumbling(size), time="ts").agg(...)``.
        ``time`` defaults to the stream's declared time column."""
        return GroupedStream(self, []).window(spec, time)

    def rolling(self, time: Optional[str] = None, *, range: Any = None, rows: Optional[int] = None,
                by: Sequence[str] = ()) -> "RollingStream":
        """Per-row aggregates over the trailing ``range`` (time) or ``rows`` (count) of each
        partition ``by``: ``rolling("ts", range=timedelta(seconds=10), by=["k"]).agg(...)``."""
        keys = [by] if isinstance(by, str) else list(by)
        return GroupedStream(self, keys).rolling(time, range=range, rows=rows)

    # -- keyed ----------------------------------------------------------------------------
    def group_by(self, *keys: Any) -> "GroupedStream":
        """Group by key columns (names or named expressions) for :meth:`GroupedStream.agg`,
        ``fold``, ``reduce``, ``window``, ``rolling`` or ``topk``."""
        flat: list[Any] = []
        for k in keys:
            flat.extend(k if isinstance(k, (list, tuple)) else [k])
        exprs = [_as_expr(k) for k in flat]
        if all(isinstance(e, Col) for e in exprs):
            for e in exprs:
                e.compile(self.schema, "group_by")
            return GroupedStream(self, [e.name for e in exprs])  # type: ignore[attr-defined]
        items = _named(exprs, {}, "group_by")
        names = [n for n, _ in items]
        s = self.with_columns(*[e.alias(n) for n, e in items])
        return GroupedStream(s, names)

    def agg(self, *aggs: Any, **named: Any) -> "DataStream":
        """Aggregate the whole stream (one row while it is not empty)."""
        return GroupedStream(self, []).agg(*aggs, **named)

    def join(self, other: "DataStream", on: Any = None, *, left_on: Any = None,
             right_on: Any = None, how: str = "inner", band: Any = None) -> "DataStream":
        """Equi-join on ``on`` (same names on both sides) or ``left_on``/``right_on``.

        ``how``: ``inner`` (matched pairs), ``left`` (plus unmatched left rows with nulls on the
        right), ``semi`` (left rows with a match), ``anti`` (left rows without one), ``lookup``
        (each new left row with the right side as it is at that step: a processing-time lookup
        join, ``Δleft ⋈ I(right)``, whose past output is not revised when the right side
        changes later, and which stores no left rows: for a stream joined with a bounded
        table). Output columns: the left's, then the right's non-key columns (a name that
        clashes gets ``_right``); the key columns keep the left's names. SQL null keys match
        nothing. Key types must agree; integers of different widths are widened.

        ``on=[]`` is the cross join (every left row with every right row; with ``how="semi"``
        the left rows while the right is not empty). Its one empty key lives on one worker,
        so a cross join does not spread over workers: keep one side small.

        State: when the first key column is the event time of both sides (declared with
        ``time=`` / :meth:`with_watermark`), each side's rows below the other side's watermark
        are dropped from the join's state: no new row can meet them (the result is unchanged).

        ``band=(left_col, right_col)`` (inner joins; either may be None) bounds the state of a
        join on other keys: it promises that only pairs with ``left_col >= the right's event
        time`` and ``right_col >= the left's event time`` are used downstream (a filter that
        follows, e.g. ``t between opened and expires``), so each side's rows whose column is
        below the other side's watermark are dropped; both sides then need a watermark
        (:meth:`with_watermark`). Pairs outside the band may be missing from the output.
        """
        return _join(self, other, on, left_on, right_on, how, band)

    # -- recursion ------------------------------------------------------------------------
    def iterate(self, fn: Callable[..., "DataStream"], *others: "DataStream",
                schema: Any = None, max_iterations: Optional[int] = None,
                monotone: Optional[bool] = None) -> "DataStream":
        """The least fixed point ``x = fn(x, self, *others)``, maintained incrementally.

        ``fn`` receives streams of a nested circuit - ``x`` (the result so far; of ``schema``,
        default this stream's), then this stream and ``others`` - and returns the next ``x``
        built from them. Each step iterates until nothing changes (or ``max_iterations``; then
        the step fails); the state (``x`` and the operators' traces) is carried from round to
        round, and from step to step when the inputs only grow (see
        :mod:`dbsp.operators.recursive`). Example (transitive closure)::

            paths = edges.iterate(lambda p, e: e.concat(
                p.join(e, left_on="dst", right_on="src").select("src", dst="dst_right")
            ).distinct())
        """
        ctx = self.ctx
        streams = [self, *others]
        cores = [s._s for s in streams]
        kw: dict = {}
        if schema is not None:
            kw["schema"] = as_schema(schema)
        if max_iterations is not None:
            kw["max_iterations"] = int(max_iterations)
        if monotone is not None:
            kw["monotone"] = monotone

        def body(x, *ins):
            res = fn(DataStream(ctx, x), *[DataStream(ctx, i) for i in ins])
            if not isinstance(res, DataStream):
                raise TypeError(f"iterate: fn must return a DataStream, got {res!r}")
            out = res._s
            if out.type != x.type and isinstance(out.type, ZSetType) \
                    and out.schema.names == x.schema.names \
                    and [f.type for f in out.schema] == [f.type for f in x.schema]:
                out = res._align(x.schema)  # nullability only
            return out
        core = self._s.circuit.recursive(body, *cores, **kw)
        return self._new(core)

    # -- plumbing -------------------------------------------------------------------------
    def integrate(self) -> "DataStream":
        """The running sum of the deltas (the whole collection at every step)."""
        return self._new(self._s.integrate())

    def differentiate(self) -> "DataStream":
        return self._new(self._s.differentiate())

    def delay(self) -> "DataStream":
        return self._new(self._s.delay())

    def shard(self) -> "DataStream":
        """Re-shard rows across workers by hash (rarely needed: keyed operators shard)."""
        return self._new(self._s.shard(), keep_time=True)

    # -- sinks ----------------------------------------------------------------------------
    def collect(self, name: Optional[str] = None, view: bool = True) -> "Collector":
        """A handle that fills as the context steps: the last step's change
        (:meth:`Collector.delta`) and, with ``view=True``, everything so far
        (:meth:`Collector.view`)."""
        return Collector(self._s.output(name, view=view))

    def write_parquet(self, path: Any, partition_by: Sequence[str] = (), *,
                      overwrite: bool = False) -> ParquetSink:
        """Write every step's change as Parquet files under the directory ``path`` (Hive-
        partitioned by ``partition_by``), each row with its weight; returns the
        :class:`~dbsp.connectors.files.ParquetSink` (``sink.read()`` reads the view back)."""
        sink = ParquetSink(path, self.schema, partition_by, overwrite=overwrite)
        # unconsolidated: the files form a Z-set either way, and sorting every change is the
        # most expensive part of writing an insert-only stream
        self.for_each(sink.write, skip_empty=False, consolidate=False)
        return sink

    def for_each(self, fn: Callable[[pa.Table], Any], skip_empty: bool = True,
                 consolidate: bool = True) -> None:
        """Call ``fn(delta)`` after every step with that step's change (a table with a
        ``__weight`` column); steps without a change are skipped unless ``skip_empty=False``.
        With ``consolidate=False`` the change comes as the operators produced it (a row may
        appear more than once; its weights sum to its change), which saves sorting it."""
        self.ctx._sinks.append(ForEach(self._s.output(None, view=False), fn, skip_empty,
                                       consolidate))


# --- joins -----------------------------------------------------------------------------------

def _listify(x: Any) -> list[str]:
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    return list(x)


def _join_watermarks(left: DataStream, right: DataStream, lk: list, rk: list):
    """``(left, right)`` watermark streams when both sides' event time is their leading join
    key (then the join drops each side's rows below the other's watermark), else None."""
    lt, rt = left._time, right._time
    if not lk or lt is None or rt is None or lt.watermark is None or rt.watermark is None:
        return None
    if lk[0] != lt.column or rk[0] != rt.column:
        return None
    if left.schema.field(lk[0]).type != right.schema.field(rk[0]).type:
        return None
    return lt.watermark, rt.watermark


def _band(left: DataStream, right: DataStream, band: Any, lk: list, rk: list):
    """The core join's ``band=`` for a stream join's ``band=(left_col, right_col)``."""
    if band is None:
        return None
    if not isinstance(band, (tuple, list)) or len(band) != 2:
        raise ValueError(f"join: band must be (left column, right column), got {band!r}")
    out = []
    for side, other, s, keys, c in (("left", "right", left, lk, band[0]),
                                    ("right", "left", right, rk, band[1])):
        if c is None:
            out.append(None)
            continue
        if c in keys:
            raise ValueError(f"join: band column {c!r} of the {side} is a join key")
        o = right if side == "left" else left
        if o._time is None or o._time.watermark is None:
            raise ValueError(f"join: band column {c!r} of the {side} is compared with the "
                             f"{other} side's event time, but the {other} side has no watermark "
                             f"(declare one with with_watermark)")
        out.append((c, o._time.watermark))
    return tuple(out)


def _join(left: DataStream, right: DataStream, on, left_on, right_on, how: str,
          band: Any = None) -> DataStream:
    if how not in ("inner", "left", "semi", "anti", "lookup"):
        raise ValueError(f"join: how must be 'inner', 'left', 'semi', 'anti' or 'lookup', "
                         f"got {how!r}")
    if on is not None:
        if left_on is not None or right_on is not None:
            raise TypeError("join: give on= or left_on=/right_on=, not both")
        lk = rk = _listify(on)
    else:
        lk, rk = _listify(left_on), _listify(right_on)
    cross = on is not None and not lk  # on=[]: every left row with every right row
    if band is not None and how != "inner":
        raise ValueError(f"join: band= needs how='inner' (a dropped row would turn unmatched), "
                         f"got how={how!r}")
    if (not lk and not cross) or len(lk) != len(rk):
        raise ValueError(f"join: need the same number of key columns on both sides (left "
                         f"{lk}, right {rk}); for a cross join (every pair) pass on=[]")
    ls, rs = left.schema, right.schema
    for side, keys, s in (("left", lk, ls), ("right", rk, rs)):
        for k in keys:
            if k not in s.names:
                raise KeyError(f"join: no {side} key column {k!r} ({side} columns: {s.names})")
    # key types: equal, or integers widened to a common type
    lcast, rcast = {}, {}
    for a, b in zip(lk, rk):
        ta, tb = ls.field(a).type, rs.field(b).type
        if ta == tb:
            continue
        if pa.types.is_integer(ta) and pa.types.is_integer(tb):
            t = common_type([ta, tb], "join key")
            if ta != t:
                lcast[a] = t
            if tb != t:
                rcast[b] = t
            continue
        raise TypeError(f"join: key types differ: left {a!r} is {ta}, right {b!r} is {tb} "
                        f"(cast one side with with_columns(...cast(...)))")
    if lcast:
        left = left.with_columns(**{k: col(k).cast(t) for k, t in lcast.items()})
    if rcast:
        right = right.with_columns(**{k: col(k).cast(t) for k, t in rcast.items()})
    lvals = [n for n in left.schema.names if n not in lk]
    rix = right._s.index_by(rk)
    if how == "lookup":  # the left rows are probed as they are: not indexed, not moved
        out = DataStream(left.ctx, lookup_join_rows(left._s, lk, rix))
        rvals = out.columns[len(lk) + len(lvals):]
        order = list(left.schema.names) + rvals
        return out.select(*order) if out.columns != order else out
    bd = _band(left, right, band, lk, rk)
    lix = left._s.index_by(lk)
    wms = _join_watermarks(left, right, lk, rk)
    if how in ("semi", "anti"):
        core = lix.semijoin(rix, wms) if how == "semi" else lix.antijoin(rix, wms)
        out = DataStream(left.ctx, core)
        return out.select(*left.schema.names) if out.columns != left.columns else out
    core = lix.join(rix, watermarks=wms, band=bd) if how == "inner" else \
        lix.left_join(rix, watermarks=wms)
    out = DataStream(left.ctx, core)
    # core layout: lk ++ left values ++ right values; put the left's columns in its order
    rvals = out.columns[len(lk) + len(lvals):]
    order = list(left.schema.names) + rvals
    return out.select(*order) if out.columns != order else out


# --- aggregation -------------------------------------------------------------------------------

def _agg_items(aggs: Sequence[Any], named: dict) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for a in aggs:
        if isinstance(a, AggExpr):
            n = a.output_name()
            if n is None:
                raise ValueError(f"aggregate {a!r} has no name; use .alias('name') or a keyword")
            items.append((n, a))
        else:
            raise TypeError(f"positional aggregates must be expressions like sum_(col('x')) "
                            f"(named with .alias), got {a!r}; pass other forms as keywords")
    items += list(named.items())
    seen: set[str] = set()
    for n, _ in items:
        if n in seen:
            raise ValueError(f"aggregate output {n!r} given twice")
        seen.add(n)
    if not items:
        raise ValueError("agg needs at least one aggregate")
    return items


_SPEC_KIND = {"count_all": "count", "count": "count", "sum": "sum", "avg": "avg", "mean": "avg",
              "min": "min", "max": "max", "count_distinct": "count_distinct"}


def _filter_of(e: Expr) -> Optional[tuple[Expr, Expr]]:
    """``(cond, x)`` of ``when(cond, x)`` with one case and no ``otherwise`` (null elsewhere: a
    filtered aggregate input), x not a null literal; else None."""
    if isinstance(e, When) and len(e.cases) == 1 and e.default is None:
        cond, x = e.cases[0]
        if not (isinstance(x, Lit) and x.value is None):
            return cond, x
    return None


def _plan_aggs(stream: DataStream, keys: list[str], items: list[tuple[str, Any]],
               extra: Sequence[str] = (), filtered: Optional[list] = None):
    """Pre-projection and core specs for aggregates.

    Returns ``(projected stream, {"out": (kind, column)})``: every aggregate input that is not a
    plain column becomes a computed column ``__a<i>``; ``extra`` columns are kept too.

    With a ``filtered`` list (the general aggregate, see :func:`_splits_filters`), an input
    ``when(cond, x)`` (null where ``cond`` is not true) is not computed before the index: ``cond``
    becomes a boolean column ``__f<j>`` (one per distinct condition), ``x`` a column or a
    constant, and ``filtered`` receives the :class:`~dbsp.operators.aggregate.Filtered` that
    derives ``__a<i>`` from them after the index. q15's twelve counts then index three value
    columns and three flags instead of eleven nullable columns.
    """
    schema = stream.schema
    proj: list[tuple[str, Expr]] = [(k, Col(k)) for k in keys]
    proj += [(c, Col(c)) for c in extra if c not in keys]
    if any(isinstance(a, Aggregator) for _, a in items):  # it sees every non-key column
        proj += [(c, Col(c)) for c in schema.names if c not in keys and c not in extra]
    used = {n for n, _ in proj}
    specs: dict[str, Any] = {}
    conds: dict[str, str] = {}  # repr of a filter condition -> its column

    def add_input(e: Expr, i: int) -> str:
        if isinstance(e, Col) and e.name in schema.names and e.name not in keys:
            if e.name not in used:
                proj.append((e.name, e))
                used.add(e.name)
            return e.name
        name = f"__a{i}"
        proj.append((name, e))
        used.add(name)
        return name

    for i, (out, a) in enumerate(items):
        if out in keys:
            raise ValueError(f"aggregate output {out!r} clashes with a key column")
        if isinstance(a, str) and a in ("count", "count_all"):
            a = AggExpr("count_all", None)
        if isinstance(a, tuple) and len(a) == 2 and not isinstance(a[0], Aggregator):
            kind, arg = a
            if kind not in _SPEC_KIND:
                raise ValueError(f"aggregate {out!r}: unknown kind {kind!r} "
                                 f"(known: {sorted(_SPEC_KIND)})")
            if arg is None and _SPEC_KIND[kind] != "count":
                raise ValueError(f"aggregate {out!r}: {kind} needs a column")
            kind = {"mean": "avg"}.get(kind, kind)
            a = AggExpr("count_all", None) if arg is None else AggExpr(kind, _as_expr(arg))
        if isinstance(a, AggExpr):
            kind = _SPEC_KIND[a.kind]
            if a.arg is None:
                specs[out] = ("count", None)
                continue
            c = a.arg.compile(schema, f"aggregate {out!r}")
            t = c.type
            numeric = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
            if kind in ("sum", "avg") and not numeric:
                raise TypeError(f"aggregate {out!r}: {a.kind} needs a number, but {a.arg!r} is {t}")
            if pa.types.is_null(t):
                raise TypeError(f"aggregate {out!r}: {a.arg!r} is always null and has no type")
            split = _filter_of(a.arg) if filtered is not None else None
            if split is not None and pa.types.is_boolean(split[0].compile(schema).type):
                cond, x = split
                cname = conds.get(repr(cond))
                if cname is None:
                    cname = conds[repr(cond)] = f"__f{len(conds)}"
                    proj.append((cname, cond))
                    used.add(cname)
                if isinstance(x, Lit):
                    source, value = None, x.value
                elif isinstance(x, Col) and x.name in schema.names and x.name not in keys:
                    source, value = add_input(x, i), None
                else:
                    source, value = f"__v{i}", None
                    proj.append((source, x))  # when()'s type is its one value's
                    used.add(source)
                filtered.append(Filtered(f"__a{i}", cname, source, value, t))
                specs[out] = (kind, f"__a{i}")
                continue
            specs[out] = (kind, add_input(a.arg, i))
        elif isinstance(a, Aggregator):
            specs[out] = a  # all value columns
        elif isinstance(a, tuple) and len(a) == 2:
            agg, arg = a
            specs[out] = (agg, None if arg is None else add_input(_as_expr(arg), i))
        else:
            raise TypeError(f"aggregate {out!r}: expected an expression like sum_(col('x')), a "
                            f"(kind, column) pair or an Aggregator, got {a!r}")
    names = [n for n, _ in proj]
    fixed = len(keys) + len([c for c in extra if c not in keys])
    ordered = {spec[1] for spec in specs.values() if isinstance(spec, tuple)
               and spec[0] in ("min", "max", "count_distinct")}
    ordered |= {f.source for f in filtered or () if f.name in ordered and f.source is not None}
    if ordered and names != list(schema.names) and \
            not any(isinstance(a, Aggregator) for _, a in items):
        # the column of a min / max / count_distinct leads the values: a key's values are
        # sorted by it, so the aggregate's (key, value) pairs need no sort
        # (aggregate._consolidate_runs)
        tail = proj[fixed:]
        proj = proj[:fixed] + [p for p in tail if p[0] in ordered] + \
            [p for p in tail if p[0] not in ordered]
        names = [n for n, _ in proj]
    if not proj or names == list(schema.names):
        # nothing to compute (no projection: count() alone, no key, counts the rows as they are;
        # a batch of no columns would have no rows)
        return stream, specs
    fn, out_schema = compile_projection(schema, proj, "aggregate input")
    keep = stream._time is not None and _passthrough(proj, stream._time.column)
    return stream._new(stream._s.map(fn, out_schema), keep_time=keep), specs


def _splits_filters(items: list[tuple[str, Any]]) -> bool:
    """Whether the aggregates run as the general aggregate (some min / max / count_distinct, no
    user Aggregator), which derives filtered inputs after the index (:class:`Filtered`); the
    linear aggregate indexes nothing (its index is fused) and keeps them computed."""
    kinds = [_SPEC_KIND.get(a.kind) for _, a in items if isinstance(a, AggExpr)]
    return len(kinds) == len(items) and any(k in ("min", "max", "count_distinct")
                                            for k in kinds)


def _with_aggs(out: DataStream, items: list[tuple[str, Any]]) -> DataStream:
    """``out`` knowing which of its columns are which aggregates (for HAVING)."""
    out._aggs = {n: a for n, a in items if isinstance(a, AggExpr)}
    return out


def _fold_aggregator(init: Any, step: Callable, output_type: pa.DataType, name: str):
    """A user aggregate from a per-row Python step function (slow path)."""

    class Fold(Aggregator):
        def __init__(self):
            self.output_type = output_type

        def compute(self, vals, weights, offsets):
            single = vals.num_columns == 1
            cols = [c.to_pylist() for c in vals.columns]
            out = []
            for g in range(len(offsets) - 1):
                acc = init() if callable(init) else init
                for i in range(int(offsets[g]), int(offsets[g + 1])):
                    row = cols[0][i] if single else tuple(c[i] for c in cols)
                    for _ in range(int(weights[i])):  # rows of weight <= 0 are not present
                        acc = step(acc, row)
                out.append(acc)
            return pa.array(out, type=output_type)

        def __repr__(self):
            return f"fold({name})"
    return Fold()


def _reduce_aggregator(fn: Callable, output_type: pa.DataType, name: str):
    """``functools.reduce(fn, values)`` per group, each value repeated by its weight."""

    class Reduce(Aggregator):
        def __init__(self):
            self.output_type = output_type

        def compute(self, vals, weights, offsets):
            xs = vals.column(0).to_pylist()
            out = []
            for g in range(len(offsets) - 1):
                items = [xs[i] for i in range(int(offsets[g]), int(offsets[g + 1]))
                         for _ in range(max(int(weights[i]), 0)) if xs[i] is not None]
                out.append(functools.reduce(fn, items) if items else None)
            return pa.array(out, type=output_type)

        def __repr__(self):
            return f"reduce({name})"
    return Reduce()


class GroupedStream:
    """A stream grouped by key columns (from :meth:`DataStream.group_by`)."""

    def __init__(self, stream: DataStream, keys: list[str]):
        self.stream, self.keys = stream, keys
        for k in keys:
            if k not in stream.schema.names:
                raise KeyError(f"group_by: no column {k!r} (columns: {stream.schema.names})")

    def __repr__(self) -> str:
        return f"<GroupedStream by {self.keys} of {self.stream!r}>"

    def agg(self, *aggs: Any, **named: Any) -> DataStream:
        """One row per group: ``keys ++ aggregates``, updated as the groups change.

        Aggregates: ``count()``, ``count(e)``, ``sum_(e)``, ``avg(e)``, ``min_(e)``, ``max_(e)``,
        ``count_distinct(e)`` (or ``col("x").sum()``...), a ``(kind, column)`` pair, or an
        :class:`~dbsp.operators.aggregate.Aggregator`; positional ones need ``.alias``. SQL
        semantics: nulls are ignored, ``sum``/``avg``/``min``/``max`` of no value is null; a group
        exists while its total weight is positive.
        """
        items = _agg_items(aggs, named)
        filtered: Optional[list] = [] if _splits_filters(items) else None
        pre, specs = _plan_aggs(self.stream, self.keys, items, filtered=filtered)
        core = pre._s.index_by(self.keys).aggregate(specs, positive=True,
                                                    filtered=filtered or ())
        return _with_aggs(DataStream(self.stream.ctx, core), items)

    def fold(self, init: Any, step: Callable[[Any, Any], Any], *, column: Any = None,
             type: Any, name: str = "fold") -> DataStream:
        """A user aggregate by a per-row Python step ``step(acc, value) -> acc`` from ``init`` (a
        value or a zero-argument factory); ``value`` is ``column``'s value, or the tuple of all
        non-key columns. Recomputed over a group whenever it changes (slow path)."""
        agg = _fold_aggregator(init, step, as_type(type), name)
        if column is None:
            return self.agg(**{name: agg})
        return self.agg(**{name: (agg, column)})

    def reduce(self, fn: Callable[[Any, Any], Any], column: Any, *, name: Optional[str] = None,
               type: Any = None) -> DataStream:
        """``functools.reduce(fn, values)`` over the non-null values of ``column`` per group
        (each value repeated by its weight). Slow path."""
        e = _as_expr(column)
        c = e.compile(self.stream.schema, "reduce")
        n = name or e.output_name() or "reduce"
        t = as_type(type) if type is not None else c.type
        return self.agg(**{n: (_reduce_aggregator(fn, t, n), column)})

    def count(self, name: str = "count") -> DataStream:
        return self.agg(**{name: _count_rows()})

    def topk(self, k: int, by: Any, descending: Any = False,
             rank: Optional[str] = None, append_only: bool = False) -> DataStream:
        """The first ``k`` rows of each group ordered by ``by`` (all columns kept; with
        ``rank=`` a 1-based rank column is added). ``descending``: one bool for every ``by``
        column, or one per column (``ORDER BY b ASC, c DESC`` is ``by=["b", "c"],
        descending=[False, True]``). ``append_only=True``: the stream only ever inserts (an
        event stream), so only each group's top ``k`` rows are kept in state instead of every
        row; a deletion is then an error."""
        by = _listify(by)
        src = self.stream
        vals = [n for n in src.schema.names if n not in self.keys]
        stored = [c for c in by if c in vals] + [c for c in vals if c not in by]
        if stored != vals:
            # the top-k's trace keeps the order-by columns first; index them in that order so
            # the operator need not re-encode every delta's values in it
            src = src.select(*self.keys, *stored)
        rows = src._s
        flags = descending if isinstance(descending, (list, tuple)) else [descending] * len(by)
        if append_only and by and by[0] in vals and not any(flags):
            # rows that the step's own rows push out of their key's top k never reach the index
            rows = rows.topk_prefilter(self.keys, by[0], k)
        core = rows.index_by(self.keys).topk(k, by, descending, rank, append_only)
        out = DataStream(self.stream.ctx, core)
        order = list(self.keys) + vals + ([rank] if rank is not None else [])
        return out.select(*order) if out.columns != order else out

    def window(self, spec: Any, time: Optional[str] = None) -> "WindowedStream":
        time = time or self.stream.time_column
        if time is None:
            raise ValueError("window needs time= (the stream has no declared event-time column)")
        return WindowedStream(self.stream, self.keys, spec, time)

    def rolling(self, time: Optional[str] = None, *, range: Any = None,
                rows: Optional[int] = None) -> "RollingStream":
        time = time or self.stream.time_column
        if time is None:
            raise ValueError("rolling needs time= (the stream has no declared event-time column)")
        return RollingStream(self.stream, self.keys, time, range, rows)


def _wm_for(stream: DataStream, time: str):
    t = stream._time
    return t.watermark if (t is not None and t.column == time) else None


class WindowedStream:
    """A stream cut into event-time windows; finish with :meth:`agg`."""

    def __init__(self, stream: DataStream, keys: list[str], spec: Any, time: str):
        if not isinstance(spec, (Tumbling, Hopping, Session)):
            raise TypeError(f"window: expected tumbling(...), hopping(...) or session(...), "
                            f"got {spec!r}")
        if time not in stream.schema.names:
            raise KeyError(f"window: no time column {time!r} (columns: {stream.schema.names})")
        self.stream, self.keys, self.spec, self.time = stream, keys, spec, time

    def agg(self, *aggs: Any, **named: Any) -> DataStream:
        """One row per (key, window): ``keys ++ (window_start, window_end) ++ aggregates``
        (aggregates as for :meth:`GroupedStream.agg`; see :mod:`dbsp.operators.window` for when
        results appear, change and become final)."""
        items = _agg_items(aggs, named)
        for n, _ in items:
            if n in ("window_start", "window_end"):
                raise ValueError(f"aggregate output {n!r} clashes with a window column")
        pre, specs = _plan_aggs(self.stream, self.keys, items, extra=[self.time])
        if self.time in self.keys:
            raise ValueError(f"window: the time column {self.time!r} cannot be a key")
        wm = _wm_for(pre, self.time)
        core = window_aggregate(pre._s, self.time, self.spec, self.keys, specs, wm)
        return _with_aggs(DataStream(self.stream.ctx, core), items)


class RollingStream:
    """Per-row trailing aggregates (from :meth:`DataStream.rolling`); finish with :meth:`agg`."""

    def __init__(self, stream: DataStream, keys: list[str], time: str, range_: Any,
                 rows: Optional[int]):
        self.stream, self.keys, self.time, self.range, self.rows = stream, keys, time, range_, rows

    def agg(self, *aggs: Any, **named: Any) -> DataStream:
        """Every input row ``++`` its aggregates (``count``, ``sum``, ``avg``, ``min``, ``max``)
        over its frame (see :mod:`dbsp.operators.rolling`)."""
        items = _agg_items(aggs, named)
        src = self.stream
        extra = [c for c in src.schema.names if c not in self.keys]
        pre, specs = _plan_aggs(src, self.keys, items, extra=extra)
        for n, s in specs.items():
            if not isinstance(s, tuple) or s[0] not in ("count", "sum", "avg", "min", "max"):
                raise TypeError(f"rolling aggregate {n!r}: only count, sum, avg, min and max "
                                f"are supported, got {s!r}")
        wm = _wm_for(pre, self.time)
        core = rolling_aggregate(pre._s, self.time, self.keys, specs, range_=self.range,
                                 rows=self.rows, wm_stream=wm)
        out = DataStream(src.ctx, core)
        order = list(src.schema.names) + [n for n, _ in items]
        if out.columns != order:  # drop computed aggregate inputs, restore the column order
            out = out.select(*order)
        return out


__all__ = ["DataStream", "GroupedStream", "WindowedStream", "RollingStream", "TimeInfo",
           "compile_projection"]
