"""aggregate: per-key aggregates of an indexed stream, maintained incrementally.

Maths
-----
For a grouping ``a: key -> values`` and an aggregate ``f`` the output is
``agg(a) = {(k, f(a[k])) : k with Σ a[k] != 0}``. Incrementally, only the keys ``T`` touched by
``Δa`` can change::

    Δagg = Σ_{k in T} ( {(k, f(I(a)[k]))} - {(k, f(z^-1(I(a))[k]))} )

* **Linear aggregates** (count, sum, avg) are sums over the rows, so ``f(I(a)[k])`` is a function
  of running *partials* (row count, non-null counts, weighted sums) with
  ``P(I(a)[k]) = P(z^-1(I(a))[k]) + P(Δa[k])``. The state is one partial row per key (an indexed
  spine); the input history is never read. Float sums accumulate rounding from retractions
  (as in every incremental engine); a partial row is dropped only when all of it is exactly zero.
* **min / max / count_distinct** (with any linear ones) are maintained from per-``(key, value)``
  weights of their column, ``c[k, v] = Σ`` of the weights of the rows of key ``k`` holding ``v``,
  kept in a value trace ``key -> v`` whose values sit in value order. With
  ``c' = c + Δc`` on the pairs of ``Δa``: ``count_distinct`` changes by
  ``#{v : c <= 0 < c'} - #{v : c > 0 >= c'}`` (``c`` probed pair by pair); ``min`` is a partial too,
  ``min' = min(min, min{v in Δa[k] : c'[k, v] > 0})``, unless the old minimum's weight dropped to
  zero: only then is the first value of positive weight sought in the value trace
  (``O(log group)``; max alike from the end). While a column has only seen insertions no weight
  is probed (the append-only fast path). Cost per step: the delta, never the groups.
* **User aggregates** (:class:`Aggregator`, and any mix with them) see whole groups by contract: the
  input trace is kept and ``f`` recomputed for the touched keys (a trace
  :meth:`~dbsp.trace.spine.Spine.lookup` gives their old groups, merged with ``Δa`` the new ones;
  cost: the size of the touched groups). The previous outputs come from an output trace.

*Filtered inputs* (``agg(when(cond, x))``, SQL ``FILTER (WHERE cond)``) of the general aggregate
are derived from each delta after the index (:class:`Filtered`): the index holds one boolean
column per condition and ``x`` once, however many aggregates filter ``x`` (q15: twelve filtered
counts over three columns and three conditions).

Both emit ``-old +new`` for the keys whose result changed. The state rows (partials, previous
outputs) are stored one per key in a spine whose value codes are *version numbers* drawn from a
per-operator counter (never reused, so a version names one content for the spine's lifetime):
replacing a row inserts ``(old, v, -1)`` and ``(new, v', +1)`` with ``v' > v``, which the spine's
merges cancel without encoding any value. The general aggregate's numeric state is read through a
flat hash table of its live rows kept beside that spine (:class:`VersionedRows` ``flat``): one
cache miss a touched key, where a probe of the spine searches every batch, and costs more as
the history adds batches and pushes the largest out of cache.

SQL semantics: ``count(None)`` is the weighted row count; ``count(col)`` counts non-null values;
``sum`` / ``avg`` / ``min`` / ``max`` ignore nulls and are null when a group has no non-null value;
``min`` / ``max`` / ``count_distinct`` consider the values of positive weight in the group's
projection on the column (``Σ`` of the weights of the rows holding a value: for any Z-set of
non-negative weights, the values of the rows present). A group exists while
its total weight is non-zero. Types: count and count_distinct int64; sum int64 for integers,
float64 for floats, decimal128(38, s) for decimals; avg float64; min / max keep the input type.
The input is sharded by key first, so every group lives on one worker.

>>> import pyarrow as pa, dbsp
>>> c = dbsp.Circuit()
>>> t = c.add_input("t", [("k", pa.string()), ("x", pa.int64())])
>>> out = t.index_by(["k"]).aggregate({"n": ("count", None), "s": ("sum", "x"),
...                                    "hi": ("max", "x")}).output()
>>> _ = t.insert([("a", 1), ("a", 5), ("b", 2)]); c.step(); sorted(out.to_dict().items())
[(('a', 2, 6, 5), 1), (('b', 1, 2, 2), 1)]
>>> _ = t.delete([("a", 5)]); c.step(); sorted(out.to_dict().items())
[(('a', 1, 1, 1), 1), (('a', 2, 6, 5), -1)]

A user-defined aggregate is vectorised over the consolidated groups of the touched keys:

>>> import numpy as np
>>> from dbsp.operators.aggregate import Aggregator
>>> class SumSquares(Aggregator):
...     output_type = pa.int64()
...     def compute(self, vals, weights, offsets):
...         x = vals.column(0).to_numpy()
...         return pa.array(np.add.reduceat(x * x * weights, offsets[:-1]))
>>> c = dbsp.Circuit()
>>> t = c.add_input("t", [("k", pa.string()), ("x", pa.int64())])
>>> out = t.index_by(["k"]).aggregate({"ss": (SumSquares(), "x")}).output()
>>> _ = t.insert([("a", 1), ("a", 3)]); c.step(); out.to_dict()
{('a', 10): 1}
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..algebra import kernels as K
from ..algebra.checked import add_overflows, group_sums, weighted_group_sums
from ..algebra.codes import KeyCodec, codec_for
from ..algebra.schema import take
from ..circuit.exchange import as_shard_map, shard_rows
from ..circuit.errors import BadRows, RowError
from ..circuit.operator import Operator, Stateful
from ..circuit.types import IndexedType, ZSetType
from ..trace.batch import (DistinctZSet, OrdIndexedZSet, ZSet, keep_exports, kept_export,
                           match_batches, memoized, ranges)
from ..trace.probe import codes_le, first_positive, pair_weights
from ..trace.spill import current_storage
from ..trace.spine import Spine
from .exchange import sharded
from .index import IndexOperator
from .output import SortedPart

KINDS = ("count", "sum", "avg", "min", "max", "count_distinct")
LINEAR = ("count", "sum", "avg")


class Aggregator:
    """A user-defined aggregate, vectorised over groups.

    Subclass it and implement :meth:`compute`; set :attr:`output_type` (or override
    :meth:`result_type`). ``aggregate({"out": (MyAgg(), "col")})`` passes only column ``col``;
    ``aggregate({"out": MyAgg()})`` passes all value columns.

    :meth:`compute` gets the *consolidated* groups of the keys touched by a step, all at once:
    ``vals`` (a record batch: each distinct value row of a group once, ascending in value order),
    ``weights`` (int64 numpy array, one non-zero multiplicity per row; positive = present) and
    ``offsets`` (int64, ``groups + 1``: group ``g`` is rows ``offsets[g]:offsets[g+1]``, never
    empty). It returns a ``pa.Array`` (or anything ``pa.array`` accepts) with one value per group.
    Groups whose total weight is zero are dropped from the output afterwards.
    """

    output_type: Optional[pa.DataType] = None

    def result_type(self, val_schema: pa.Schema) -> pa.DataType:
        if self.output_type is None:
            raise TypeError(f"{type(self).__name__} must set output_type or override result_type")
        return self.output_type

    def compute(self, vals: pa.RecordBatch, weights: np.ndarray,
                offsets: np.ndarray) -> pa.Array:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@dataclass(frozen=True)
class AggSpec:
    name: str
    kind: Any  # one of KINDS or an Aggregator
    column: Optional[str]
    in_type: Optional[pa.DataType]
    out_type: pa.DataType


@dataclass(frozen=True)
class Filtered:
    """A filtered aggregate input (SQL ``agg(x) FILTER (WHERE cond)``, or ``agg(CASE WHEN cond
    THEN x END)``): the value column ``name`` is ``source`` (a value column; None: the constant
    ``value``) where the boolean value column ``cond`` is true, null elsewhere (a null ``cond``
    is not true). The general aggregate derives it from each step's delta, after the index: the
    index keeps ``cond`` and ``source`` only, so aggregates filtering one column by several
    conditions share its values instead of indexing a nullable copy per condition."""
    name: str
    cond: str
    source: Optional[str]
    value: Any
    type: pa.DataType

    def column(self, vals: pa.RecordBatch) -> pa.Array:
        c = pc.fill_null(vals.column(self.cond), False)
        x = vals.column(self.source) if self.source is not None \
            else pa.scalar(self.value, self.type)
        return pc.if_else(c, x, pa.scalar(None, self.type))


def with_filtered(d: OrdIndexedZSet, filtered: Sequence[Filtered]) -> OrdIndexedZSet:
    """``d`` with the derived columns of ``filtered`` added to its values (codes unchanged: the
    value codes stay those of the indexed columns, which order and identify the rows)."""
    vals = d.vals
    if not filtered or filtered[0].name in vals.schema.names:
        return d
    cols = list(vals.columns) + [f.column(vals) for f in filtered]
    fields = list(vals.schema) + [pa.field(f.name, f.type) for f in filtered]
    return OrdIndexedZSet(d.keys, d.kcodes, d.offsets,
                          pa.RecordBatch.from_arrays(cols, schema=pa.schema(fields)), d.vcodes,
                          d.weights, d.kcodec, d.vcodec)


def _num_kind(t: pa.DataType) -> Optional[str]:
    if pa.types.is_integer(t):
        return "i"
    if pa.types.is_floating(t):
        return "f"
    if pa.types.is_decimal(t):
        return "d"
    return None


def parse_aggs(aggs: dict, key_schema: pa.Schema, val_schema: pa.Schema) -> list[AggSpec]:
    """Validate ``{"out": (kind, column) | Aggregator}`` against the schemas (build time)."""
    if not isinstance(aggs, dict) or not aggs:
        raise TypeError("aggregate needs a non-empty dict {output name: (kind, column)}")
    specs = []
    for name, spec in aggs.items():
        if not isinstance(name, str):
            raise TypeError(f"aggregate output names must be strings, got {name!r}")
        if name in key_schema.names:
            raise ValueError(f"aggregate output '{name}' clashes with a key column "
                             f"(keys: {key_schema.names})")
        if isinstance(spec, Aggregator):
            spec = (spec, None)
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise TypeError(f"aggregate '{name}': expected (kind, column) or an Aggregator, "
                            f"got {spec!r}")
        kind, col = spec
        in_type = None
        if col is not None:
            if col not in val_schema.names:
                raise KeyError(f"aggregate '{name}': no value column '{col}' (value columns: "
                               f"{val_schema.names}; key columns {key_schema.names} cannot be "
                               f"aggregated)")
            in_type = val_schema.field(col).type
        if isinstance(kind, Aggregator):
            vs = val_schema if col is None else pa.schema([val_schema.field(col)])
            specs.append(AggSpec(name, kind, col, in_type, kind.result_type(vs)))
            continue
        if kind not in KINDS:
            raise ValueError(f"aggregate '{name}': unknown kind {kind!r} (known: {KINDS} or an "
                             f"Aggregator)")
        if col is None and kind != "count":
            raise ValueError(f"aggregate '{name}': {kind} needs a column")
        if kind in ("count", "count_distinct"):
            out = pa.int64()
        elif kind in ("sum", "avg"):
            nk = _num_kind(in_type)
            if nk is None:
                raise TypeError(f"aggregate '{name}': {kind} needs a numeric column, "
                                f"'{col}' is {in_type}")
            if kind == "avg":
                out = pa.float64()
            else:
                out = {"i": pa.int64(), "f": pa.float64()}.get(nk) or pa.decimal128(38, in_type.scale)
        else:
            out = in_type
        specs.append(AggSpec(name, kind, col, in_type, out))
    return specs


def output_schema(key_schema: pa.Schema, specs: list[AggSpec]) -> pa.Schema:
    fields = list(key_schema)
    for s in specs:
        nullable = not (isinstance(s.kind, str) and s.kind in ("count", "count_distinct"))
        fields.append(pa.field(s.name, s.out_type, nullable=nullable))
    return pa.schema(fields)


# -- vectorised group arithmetic --------------------------------------------------------------

def _reduce(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    if len(starts) == 0:
        return np.zeros(0, dtype=x.dtype)
    return np.add.reduceat(x, starts)


def _valid(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _dec_t(scale: int) -> pa.DataType:
    return pa.decimal128(38, scale)


def _dec_zero(n: int, scale: int) -> pa.Array:
    return pa.array([Decimal(0)] * 1, _dec_t(scale)).take(np.zeros(n, np.int64))


def _dec_add(a: pa.Array, b: pa.Array, scale: int, flags: Optional[list] = None,
             what: str = "the sum") -> pa.Array:
    w = pa.decimal256(40, scale)
    return _dec_fit(pc.add(a.cast(w), b.cast(w)), scale, flags, what)


def _dec_fit(v: pa.Array, scale: int, flags: Optional[list], what: str) -> pa.Array:
    """``v`` (a wider decimal) as ``decimal128(38, scale)``: values of more than 38 digits
    are out of range (SQL), checked like integer sums (:func:`_checked`; set to 0 when flagged)."""
    bound = pa.scalar(Decimal(10) ** (38 - scale), pa.decimal256(76, scale))
    over = pc.fill_null(pc.greater_equal(pc.abs(v.cast(pa.decimal256(76, scale))), bound), False)
    if pc.any(over).as_py():
        bad = np.asarray(over.to_numpy(zero_copy_only=False), dtype=bool)
        v = pc.if_else(over, pa.scalar(Decimal(0), v.type), v)
        _checked((None, bad), flags, what, "decimal128(38)")
    return v.cast(_dec_t(scale))


def weighted_sum(arr: pa.Array, w: np.ndarray, starts: np.ndarray, key_index: np.ndarray,
                 flags: Optional[list] = None, what: str = "the values"):
    """``(Σ w*x over non-null x, Σ w over non-null x)`` per group. Sums are int64 / float64 numpy
    arrays, or decimal128(38, s) Arrow arrays. Integer sums are checked
    (:mod:`dbsp.algebra.checked`): groups out of the int64 range are added to ``flags`` as
    ``(mask, reason)`` (raised as OverflowError without ``flags``)."""
    valid = _valid(arr)
    n = _checked(group_sums(w * valid, starts), flags, f"the count of {what}")
    t = arr.type
    nk = _num_kind(t)
    if nk == "d":
        prod = pc.multiply(arr.cast(pa.decimal256(40, t.scale)),
                           pa.array(w).cast(pa.decimal256(19, 0)))
        tab = pa.table({"g": key_index, "v": prod}).group_by("g", use_threads=False)
        res = tab.aggregate([("v", "sum")]).sort_by("g").column("v_sum").combine_chunks()
        return _dec_fit(res.fill_null(Decimal(0)), t.scale, flags, f"the sum of {what}"), n
    x = arr.fill_null(0).to_numpy(zero_copy_only=False) if arr.null_count else \
        arr.to_numpy(zero_copy_only=False)
    if nk == "i":
        big = None
        if t == pa.uint64():  # values past int64 would wrap in the int64 sum
            over = np.asarray(x, dtype=np.uint64) > np.uint64(np.iinfo(np.int64).max)
            if over.any():
                big = np.zeros(len(starts), dtype=bool)
                big[key_index[over]] = True
                x = np.where(over, np.uint64(0), x)
        x = np.asarray(x, dtype=np.int64)
        sums, bad = weighted_group_sums(x, w, starts)
        if big is not None:
            bad = bad | big
        return _checked((sums, bad), flags, f"the sum of {what}"), n
    x = np.asarray(x, dtype=np.float64)
    return _reduce(x * w.astype(np.float64), starts), n


def _checked(res: tuple[Any, np.ndarray], flags: Optional[list], what: str,
             range_: str = "int64") -> Any:
    sums, bad = res
    if bad.any():
        reason = f"{what} is out of the {range_} range (SQL: numeric value out of range)"
        if flags is None:
            raise OverflowError(reason)
        flags.append((bad, reason))
    return sums


def _masked(values, valid: np.ndarray, type_: pa.DataType) -> pa.Array:
    """Arrow array of ``values`` with nulls where ``valid`` is false."""
    if isinstance(values, pa.Array):
        if valid.all():
            return values.cast(type_)
        return pc.if_else(pa.array(valid), values, pa.nulls(len(values), values.type)).cast(type_)
    return pa.array(values, type=type_, mask=~valid)


def _positive_groups(arr: pa.Array, w: np.ndarray, key_index: np.ndarray, G: int, how: str,
                     out_type: pa.DataType) -> pa.Array:
    """``how`` (min / max / count_distinct) per group over the non-null values of positive weight
    in the group's projection on the column: rows with equal values have their weights summed
    (one sort of ``(group, value code)`` pairs)."""
    rows = np.flatnonzero(_valid(arr)) if arr.null_count else np.arange(len(arr))
    if len(rows) == 0:
        if how == "count_distinct":
            return pa.array(np.zeros(G, np.int64), pa.int64()).cast(out_type)
        return pa.nulls(G, out_type)
    col = arr.take(pa.array(rows)) if arr.null_count else arr
    codec = KeyCodec([pa.field("v", arr.type, nullable=False)])
    perm, wsum = K.sort_consolidate(key_index[rows].astype(np.uint64),
                                    codec.encode([col], len(col)), w[rows])
    pos = wsum > 0
    at, g = perm[pos], key_index[rows][perm[pos]]
    if how == "count_distinct":
        return pa.array(np.bincount(g, minlength=G).astype(np.int64), pa.int64()).cast(out_type)
    if len(g) == 0:
        return pa.nulls(G, out_type)
    edge = np.r_[g[1:] != g[:-1], True] if how == "max" else np.r_[True, g[1:] != g[:-1]]
    idx = np.full(G, -1, dtype=np.int64)
    idx[g[edge]] = at[edge]
    out = col.take(pa.array(idx, mask=idx < 0))
    return out if out.type == out_type else out.cast(out_type)


def compute_groups(specs: list[AggSpec], vals: pa.RecordBatch, w: np.ndarray,
                   offsets: np.ndarray, flags: Optional[list] = None
                   ) -> tuple[np.ndarray, list[pa.Array]]:
    """Every aggregate over consolidated groups: ``(total weight per group, output columns)``.
    Integer overflows: see :func:`weighted_sum`."""
    starts = offsets[:-1]
    G = len(starts)
    key_index = np.repeat(np.arange(G, dtype=np.int64), np.diff(offsets))
    rows = _checked(group_sums(w, starts), flags, "the row count")
    cols = []
    for s in specs:
        arr = vals.column(s.column) if s.column is not None else None
        if isinstance(s.kind, Aggregator):
            v = vals if s.column is None else vals.select([s.column])
            res = s.kind.compute(v, w, offsets)
            res = res if isinstance(res, pa.Array) else pa.array(res)
            if isinstance(res, pa.ChunkedArray):
                res = res.combine_chunks()
            if len(res) != G:
                raise ValueError(f"aggregate '{s.name}': {s.kind!r}.compute returned {len(res)} "
                                 f"values for {G} groups")
            cols.append(res if res.type == s.out_type else res.cast(s.out_type))
        elif s.kind == "count":
            cnt = rows if arr is None else \
                _checked(group_sums(w * _valid(arr), starts), flags, f"count({s.column})")
            cols.append(pa.array(cnt, pa.int64()))
        elif s.kind in ("sum", "avg"):
            total, n = weighted_sum(arr, w, starts, key_index, flags, f"'{s.column}'")
            cols.append(finish_sum(s, total, n))
        else:
            cols.append(_positive_groups(arr, w, key_index, G, s.kind, s.out_type))
    return rows, cols


def decimal_to_float(arr: pa.Array) -> np.ndarray:
    """float64 of decimal128 values, correctly rounded (``unscaled / 10**scale`` when the unscaled
    value fits in 53 bits; Arrow's own cast multiplies by ``10**-scale`` and can be 1 ulp off)."""
    arr = arr.fill_null(Decimal(0))
    raw = np.frombuffer(arr.buffers()[1], dtype=np.int64)[2 * arr.offset:2 * (arr.offset + len(arr))]
    lo, hi = raw[0::2], raw[1::2]
    exact = (hi == (lo >> 63)) & (np.abs(lo) < (1 << 53))
    out = lo.astype(np.float64) / float(10 ** arr.type.scale)
    if not exact.all():
        slow = np.asarray(pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False))
        out = np.where(exact, out, slow)
    return out


def finish_sum(s: AggSpec, total, n: np.ndarray) -> pa.Array:
    """sum / avg from the weighted sum and the non-null count (null where the count is 0)."""
    valid = n != 0
    if s.kind == "sum":
        return _masked(total, valid, s.out_type)
    if isinstance(total, pa.Array):
        num = decimal_to_float(total)
    else:
        num = total.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        avg = num / np.where(valid, n, 1)
    return pa.array(avg, pa.float64(), mask=~valid)


def touched_groups(trace: Spine, d: OrdIndexedZSet) -> OrdIndexedZSet:
    """The groups of the keys of ``d`` after adding ``d`` to ``trace``: the trace's rows of those
    keys and ``d`` in one k-way merge (keys whose rows cancel disappear)."""
    parts = [sub.select_keys(ki) for sub, _, ki in match_batches(trace.batches(), d.kcodes)]
    if not parts:
        return d
    return OrdIndexedZSet.merge(parts + [d])


# -- one versioned state row per key ------------------------------------------------------------

_INT_OF_WIDTH = {32: pa.int32(), 64: pa.int64()}


def np_dtype(t: pa.DataType):
    """numpy dtype holding a column of type ``t`` in the order of its values (integers as
    themselves, temporal types as their integer storage), or None (not fixed-width ordered)."""
    if pa.types.is_integer(t):
        return np.dtype(t.to_pandas_dtype())
    if pa.types.is_temporal(t) and getattr(t, "bit_width", 0) in _INT_OF_WIDTH:
        return np.dtype(np.int64 if t.bit_width == 64 else np.int32)
    return None


def np_values(col: pa.Array, dtype) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """``(values, valid)`` of a fixed-width column as numpy (temporal types as their integer
    storage, nulls as 0; ``valid`` None when there is no null)."""
    if pa.types.is_temporal(col.type):
        col = col.view(_INT_OF_WIDTH[col.type.bit_width])
    ok = None
    if col.null_count:
        ok = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        col = col.fill_null(0)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=dtype), ok


def _np_column(b, j: int, dtype) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """:func:`np_values` of value column ``j`` of the batch ``b``, kept in the batch's ``memo``
    when it has one (an in-memory batch: it is read again every step it stays in the spine;
    the views are zero-copy when the column has no null)."""
    if b.is_file:
        return np_values(b.vals.column(j), dtype)
    return memoized(b, (j, dtype), lambda: np_values(b.vals.column(j), dtype))


def np_array(values: np.ndarray, t: pa.DataType, mask: Optional[np.ndarray] = None) -> pa.Array:
    """Arrow array of type ``t`` from numpy ``values`` (:func:`np_values`' inverse; ``mask``:
    true where null)."""
    if pa.types.is_temporal(t):
        return pa.array(values, _INT_OF_WIDTH[t.bit_width], mask=mask).view(t)
    return pa.array(values, t, mask=mask)


def rows_equal(a: pa.RecordBatch, b: pa.RecordBatch) -> np.ndarray:
    """Row-wise equality of two aligned batches (null equals null)."""
    eq = np.ones(a.num_rows, dtype=bool)
    for x, y in zip(a.columns, b.columns):
        e = pc.equal(x, y)
        both_null = pc.and_(x.is_null(), y.is_null())
        e = pc.or_(pc.fill_null(e, False), both_null)
        eq &= np.asarray(e.to_numpy(zero_copy_only=False), dtype=bool)
    return eq


#: the merge fanout of a :class:`VersionedRows` spine read through its flat table: a level
#: merges once it holds this many batches (a spine read by probes keeps the default 4, which
#: bounds the batches a probe searches). Each worker's state takes one small batch a step
#: (the changed keys' old and new rows), and a merge of a few such batches costs mostly its
#: fixed part; merging 8 at a time halves the merges. Measured (callgrind,
#: driver thread, threads runtime, join_avg 10K events, 8 steps): the linear aggregate's
#: inline merges 124K -> 76K instructions a step at W = 1, 196K -> 107K at W = 2 (two
#: spines).
FLAT_FANOUT = 8


def _all_valid(n: int) -> np.ndarray:
    return np.ones(n, dtype=bool)


class VersionedRows(Stateful):
    """A spine holding at most one row per key; its value code is the row's version number.

    Replacing row ``(k, v)`` inserts ``(k, old row, v, -1)`` and ``(k, new row, v', +1)`` in one
    consolidated batch, so the merge cancels the old row without encoding any value. Versions
    come from a counter that only grows (a version, once used, names one content for the life of
    the spine: reusing one after a deletion would let a merge pair a retraction with the wrong
    row); after a restore the counter restarts above the largest version stored.

    With ``flat``, :meth:`get_numpy` reads the live rows from a flat hash table over the key codes
    (:class:`~dbsp.algebra.kernels.LiveTable`: one cache miss a key however long the history,
    where a probe of the spine's sorted batches costs a search in every batch and grows with their
    number and size) that :meth:`put` keeps up to date in place. The spine stays the state (it is
    what checkpoints save, steps roll back and storage spills); the table is a copy of its live
    rows, used while it is provably current: u64 key codes, every batch in memory, a spine without
    storage (the table is memory the accountant does not see), and no change to the spine since
    the table's last write (``Spine.generation``: a rollback, restore or clear moves it). Otherwise
    the table is dropped and the spine probed as without ``flat``; the table is rebuilt from the
    spine's live rows at the next read that may use it.
    """

    state_attrs = ('trace', '_next')

    def __init__(self, name: str, val_schema: pa.Schema, flat: bool = False):
        # read through the flat table, the spine is written every step but read only to rebuild
        # the table and by checkpoints: it merges at a wider fanout (fewer merges of tiny
        # batches a step, see FLAT_FANOUT); with storage the table is never used
        self.trace = Spine(name=name, fanout=FLAT_FANOUT if flat and current_storage() is None
                           else 4)
        self.val_schema = val_schema
        self.vcodec = KeyCodec([])  # carried along, never used to encode
        self._next: Optional[int] = None
        self.flat = flat
        self._table: Any = None  # K.LiveTable of the live rows, current at self._gen
        self._gen = -1
        self._dtypes: Any = None  # the dtypes list the table was last read with
        self._spine: Any = None  # the spine the table copies (restore_state may swap it)

    def table_bytes(self) -> int:
        """Bytes of the flat table of live rows (0 without one)."""
        return 0 if self._table is None else int(self._table.nbytes)

    def _flat_table(self, kcodes, dtypes: list):
        """The flat table of live rows, current (rebuilt from the spine if it is stale), or
        None when it may not be used now (see the class doc)."""
        if not self.flat:
            return None
        sp = self.trace
        t = self._table
        sizes = None
        if t is not None and self._gen == sp.generation and sp is self._spine \
                and type(kcodes) is np.ndarray:
            # current (a new key bound or row filter would have moved the generation)
            if dtypes is self._dtypes:
                return t
            sizes = tuple(np.dtype(d).itemsize for d in dtypes)
            if t.itemsizes == sizes:
                self._dtypes = dtypes
                return t
        if not isinstance(kcodes, np.ndarray) or sp.storage is not None \
                or sp.key_bound is not None or sp.row_filter is not None:
            self._table = None
            return None
        if sizes is None:
            sizes = tuple(np.dtype(d).itemsize for d in dtypes)
        # stale or missing: rebuild from the spine's live rows (after a restore, a rollback or
        # at the first step; O(state) once)
        self._table = None
        gen = sp.generation
        batches = sp.batches()
        if any(b.is_file or not isinstance(b.kcodes, np.ndarray) for b in batches):
            return None
        t = K.LiveTable(sizes)
        if batches:
            keys = np.unique(np.concatenate([b.kcodes for b in batches]))
            has, cols, ver, oks = self._get_numpy_spine(keys, len(keys), dtypes, True)
            t.put(keys, np.zeros(len(keys), dtype=bool), has, ver, cols, oks)
        self._table, self._gen, self._dtypes, self._spine = t, gen, dtypes, sp
        return t

    def _versions(self, n: int) -> np.ndarray:
        if self._next is None:
            top = [v for v in (b.max_val_code() for b in self.trace.batches()) if v is not None]
            self._next = max(top) + 1 if top else 0
        v = np.arange(self._next, self._next + n, dtype=np.uint64)
        self._next += n
        return v

    def get(self, kcodes, G: int):
        """Rows of the sorted distinct keys ``kcodes``: ``(has, vals aligned to G, version)``.

        Reads only the matched rows of each batch (their versions and weights), consolidates
        ``(key, version)`` pairs and takes the value columns of the live row of each key."""
        has = np.zeros(G, dtype=bool)
        ver = np.zeros(G, dtype=np.uint64)
        found = self._live(kcodes, G)
        if found is None:
            return has, self._nulls(G), ver
        parts, p, v, bq, rq = found
        has[p] = True
        ver[p] = v
        pieces, where = [], np.full(G, -1, dtype=np.int64)
        base = 0
        for bno in np.unique(bq).tolist():
            sel = np.flatnonzero(bq == bno)
            pieces.append(take(parts[bno][0].vals, rq[sel]))
            where[p[sel]] = base + np.arange(len(sel))
            base += len(sel)
        got = pa.concat_batches(pieces) if len(pieces) > 1 else pieces[0]
        vals = got.take(pa.array(where, mask=where < 0))
        return has, vals, ver

    def get_numpy(self, kcodes, G: int, dtypes: list, valid: bool = False):
        """:meth:`get` for fixed-width columns read as numpy: ``(has, [one array of dtype
        dtypes[j] per column j, 0 where a key has no row or a null], version)``; with ``valid``
        also ``[one bool array per column: false where a key has no row or a null]`` (temporal
        columns are read as their integer storage, see :func:`np_values`). No Arrow call per
        step beyond a zero-copy view of each matched batch's columns; with ``flat``, one pass
        over the flat table (see the class doc)."""
        t = self._flat_table(kcodes, dtypes) if G else None
        if t is not None and not valid:
            return t.read(kcodes, dtypes)
        if t is not None:
            has = np.zeros(G, dtype=bool)
            ver = np.zeros(G, dtype=np.uint64)
            cols = [np.zeros(G, dtype=dt) for dt in dtypes]
            oks = [np.zeros(G, dtype=bool) for _ in dtypes] if valid else [None] * len(dtypes)
            t.get(kcodes, has, ver, cols, oks)
            return (has, cols, ver, oks) if valid else (has, cols, ver)
        return self._get_numpy_spine(kcodes, G, dtypes, valid)

    def _get_numpy_spine(self, kcodes, G: int, dtypes: list, valid: bool = False):
        """:meth:`get_numpy` from the spine's batches."""
        has = np.zeros(G, dtype=bool)
        ver = np.zeros(G, dtype=np.uint64)
        cols = [np.zeros(G, dtype=dt) for dt in dtypes]
        oks = [np.zeros(G, dtype=bool) for _ in dtypes] if valid else None
        found = self._live(kcodes, G)
        if found is None:
            return (has, cols, ver, oks) if valid else (has, cols, ver)
        parts, p, v, bq, rq = found
        has[p] = True
        ver[p] = v
        # one native gather per column over the batches holding a live row (no selection and
        # fancy index per batch and column)
        used = np.flatnonzero(np.bincount(bq, minlength=len(parts))).tolist()
        for j, out in enumerate(cols):
            none = np.zeros(0, dtype=out.dtype)
            xs: list = [none] * len(parts)
            vs: list = [None] * len(parts)  # validity; None: no null (gather fills True)
            for bno in used:
                xs[bno], vs[bno] = _np_column(parts[bno][0], j, out.dtype)
            K.gather_rows(p, bq, rq, xs, out)
            if oks is not None:
                K.gather_rows(p, bq, rq, vs, oks[j], True)  # None: no null in that batch
        return (has, cols, ver, oks) if valid else (has, cols, ver)

    def _live(self, kcodes, G: int):
        """The live row of each of the sorted distinct keys ``kcodes`` that has one: None, or
        ``(matched parts, key position, version, part number, row in the part's values)``."""
        if not G:
            return None
        batches = self.trace.batches()
        if isinstance(kcodes, np.ndarray) and all(
                not b.is_file and isinstance(b.kcodes, np.ndarray) and
                isinstance(b.vcodes, np.ndarray) for b in batches):
            # u64 keys, every batch in memory: one native pass (see K.live_versions)
            got = K.live_versions([b.kcodes for b in batches], [b.offsets for b in batches],
                                  [b.vcodes for b in batches], [b.weights for b in batches],
                                  kcodes)
            if got is not None:
                p, v, bq, rq, hits = got
                for b, h in zip(batches, hits.tolist()):
                    b.hits += h
                return ([(b,) for b in batches], p, v, bq, rq) if len(p) else None
        parts = list(match_batches(batches, kcodes))
        if not parts:
            return None
        ps, vs, ws, bs, rs = [], [], [], [], []
        for bno, (b, pi, ki) in enumerate(parts):
            lo, hi = b.offsets[ki], b.offsets[ki + 1]
            rows = ranges(lo, hi - lo)
            ps.append(np.repeat(pi, hi - lo))
            vs.append(np.asarray(b.vcodes)[rows])
            ws.append(b.weights[rows])
            bs.append(np.full(len(rows), bno, dtype=np.int64))
            rs.append(rows)
        p, v, w = np.concatenate(ps), np.concatenate(vs), np.concatenate(ws)
        bq, rq = np.concatenate(bs), np.concatenate(rs)
        if len(parts) > 1:
            # Versions only grow and each put retracts the live version of a key as it adds
            # the next: a key's weights over all batches sum to 1 when it has a live row, and
            # that row is its largest version of positive weight (no sort needed).
            # A rolled-back put breaks the last point: it re-inserts a key's older version
            # after retracting the newer one, so a live key with a retraction of a version at
            # least its largest added one is consolidated instead.
            add = w > 0
            if bool((w[add] == 1).all()) and bool((w[~add] == -1).all()):
                alive = np.bincount(p, weights=w, minlength=G) > 0
                top = np.zeros(G, dtype=np.uint64)
                np.maximum.at(top, p[add], v[add])
                neg = p[~add]
                rolled = bool((alive[neg] & (v[~add] >= top[neg])).any())
            else:
                rolled = True
            if not rolled:
                live = np.flatnonzero(add & alive[p] & (v == top[p]))
                if len(live) == 0:
                    return None
                return parts, p[live], v[live], bq[live], rq[live]
            perm, w = K.sort_consolidate(p.astype(np.uint64), v, w)
            p, v, bq, rq = p[perm], v[perm], bq[perm], rq[perm]
        live = np.flatnonzero(w > 0)  # at most one live version per key
        if len(live) == 0:
            return None
        return parts, p[live], v[live], bq[live], rq[live]

    def _nulls(self, G: int) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([pa.nulls(G, f.type) for f in self.val_schema],
                                          schema=self.val_schema)

    def put(self, keys: pa.RecordBatch, kcodes, kcodec: KeyCodec, has_old: np.ndarray,
            old_vals: pa.RecordBatch, old_ver: np.ndarray, keep_new: np.ndarray,
            new_vals: pa.RecordBatch, changed: np.ndarray, old_valid: Optional[list] = None,
            new_valid: Optional[list] = None) -> None:
        """Retract the old row and insert the new one for every ``changed`` key. ``old_vals`` /
        ``new_vals``: record batches, or lists of numpy columns (:meth:`get_numpy`), with
        ``old_valid`` / ``new_valid`` their validity (a bool array or None per column; None:
        all valid)."""
        rm = has_old & changed
        add = keep_new & changed
        if not (rm.any() or add.any()):
            return
        # per changed key: the old row (its version is the smaller) before the new one
        self._versions(0)  # (finds the counter after a restore)
        start = self._next
        table, self._table = self._table, None  # current again only once both are written
        kk, offsets, g, is_old, vcodes, w = K.versioned_pairs(rm, add, old_ver, start)
        self._next = start + int(add.sum())
        if isinstance(old_vals, list):  # numpy columns: pick old / new rows, one Arrow batch
            cols = []
            for j, (o, n, f) in enumerate(zip(old_vals, new_vals, self.val_schema)):
                ov = old_valid[j] if old_valid is not None else None
                nv = new_valid[j] if new_valid is not None else None
                mask = None
                if ov is not None or nv is not None:
                    ok = K.pick_rows(g, is_old, _all_valid(len(o)) if ov is None else ov,
                                     _all_valid(len(n)) if nv is None else nv)
                    mask = None if ok.all() else ~ok
                cols.append(np_array(K.pick_rows(g, is_old, o, n), f.type, mask))
            vals = pa.RecordBatch.from_arrays(cols, schema=self.val_schema)
        else:
            G = old_vals.num_rows
            both = pa.concat_batches([pa.RecordBatch.from_arrays(old_vals.columns,
                                                                 schema=self.val_schema),
                                      pa.RecordBatch.from_arrays(new_vals.columns,
                                                                 schema=self.val_schema)])
            vals = take(both, np.where(is_old, g, g + G))  # old rows from the first half
        self._insert(OrdIndexedZSet(take(keys, kk), K.take(kcodes, kk), offsets, vals, vcodes,
                                    w, kcodec, self.vcodec),
                     table if isinstance(old_vals, list) else None, kcodes, rm, add, start,
                     new_vals, new_valid)

    def _insert(self, b: OrdIndexedZSet, table, kcodes, rm: np.ndarray, add: np.ndarray,
                start: int, new_vals: list, new_valid: Optional[list]) -> None:
        """Insert the batch ``b`` of a put (the old rows where ``rm``, the new rows, versions
        ``start, start + 1, ...`` in key order, where ``add``) into the spine and, when the flat
        ``table`` (taken out of ``self._table`` by the caller before anything was written) was
        current before it, apply the same change to the table in place; else the table stays
        dropped (rebuilt at the next read that may use it)."""
        gen = self.trace.generation
        self.trace.insert(b)
        if table is not None and self._gen == gen \
                and self.trace is self._spine and self.trace.generation == gen + 1:
            # the added keys' versions: start, start + 1, ... in key order (as in the batch)
            table.put(kcodes, rm, add, int(start),
                      [np.ascontiguousarray(c, dtype=d) for c, d in zip(new_vals, self._dtypes)],
                      new_valid if new_valid is not None else [None] * len(new_vals))
            self._table, self._gen = table, self.trace.generation

    def clear(self) -> None:
        self.trace.clear()
        self._next = 0
        self._table = None

    def __len__(self) -> int:
        return len(self.trace)


def _emit(out_schema: pa.Schema, keys: pa.RecordBatch, old_out: pa.RecordBatch,
          new_out: pa.RecordBatch, rm: np.ndarray, add: np.ndarray) -> ZSet:
    """``-old`` rows where ``rm``, ``+new`` rows where ``add`` (key ++ aggregate columns)."""
    io, ia = np.flatnonzero(rm), np.flatnonzero(add)
    if len(io) == 0 and len(ia) == 0:
        return ZSet.empty(out_schema)
    kidx = pa.array(np.concatenate([io, ia]))
    cols = [k.take(kidx) for k in keys.columns]
    for o, n in zip(old_out.columns, new_out.columns):
        cols.append(pa.concat_arrays([o.take(pa.array(io)), n.take(pa.array(ia))]))
    w = np.concatenate([-np.ones(len(io), np.int64), np.ones(len(ia), np.int64)])
    return ZSet(pa.RecordBatch.from_arrays(cols, schema=out_schema), w)


def _emit_np(out_schema: pa.Schema, keys: pa.RecordBatch, old_out: list, new_out: list,
             rm: np.ndarray, add: np.ndarray) -> ZSet:
    """:func:`_emit` of numpy ``(values, valid)`` aggregate columns; the caller leaves out the
    keys whose row is unchanged, so the rows are distinct (a :class:`DistinctZSet`)."""
    io, ia = np.flatnonzero(rm), np.flatnonzero(add)
    if len(io) == 0 and len(ia) == 0:
        return ZSet.empty(out_schema)
    kidx = np.concatenate([io, ia])
    cols = list(take(keys, kidx).columns)
    nk = len(cols)
    for f, (ov, ook), (nv, nok) in zip(list(out_schema)[nk:], old_out, new_out):
        ok = np.concatenate([ook[io], nok[ia]])
        cols.append(np_array(np.concatenate([ov[io], nv[ia]]), f.type,
                             None if ok.all() else ~ok))
    w = np.concatenate([np.full(len(io), -1, np.int64), np.ones(len(ia), np.int64)])
    return DistinctZSet(pa.RecordBatch.from_arrays(cols, schema=out_schema), w)


# -- the operators ----------------------------------------------------------------------------

class _Partials:
    """Layout of the running partials of linear aggregates: ``__rows`` then per aggregate a
    non-null count and (sum / avg) a weighted sum."""

    def __init__(self, specs: list[AggSpec]):
        self.specs = specs
        fields = [pa.field("__rows", pa.int64())]
        self.plan = []  # per spec: (count column index or None, sum column index or None, kind)
        for i, s in enumerate(specs):
            ci = si = None
            nk = None
            if not (s.kind == "count" and s.column is None):
                ci = len(fields)
                fields.append(pa.field(f"n{i}", pa.int64()))
            if s.kind in ("sum", "avg"):
                nk = _num_kind(s.in_type)
                si = len(fields)
                t = {"i": pa.int64(), "f": pa.float64()}.get(nk) or _dec_t(s.in_type.scale)
                fields.append(pa.field(f"s{i}", t))
            self.plan.append((ci, si, nk))
        self.schema = pa.schema(fields)
        #: numpy dtype of every partial column, or None when one is a decimal (Arrow-only)
        self.dtypes = None if any(pa.types.is_decimal(f.type) for f in fields) else \
            [np.float64 if pa.types.is_floating(f.type) else np.int64 for f in fields]

    def of_delta(self, d: OrdIndexedZSet, flags: Optional[list] = None) -> list:
        """Partials of a consolidated delta, one entry per key (numpy or decimal Arrow);
        overflowing keys go to ``flags`` (see :func:`weighted_sum`)."""
        starts = d.offsets[:-1]
        key_index = None
        cols: list = [None] * len(self.schema)
        cols[0] = _checked(group_sums(d.weights, starts), flags, "the row count")
        sums: dict = {}  # column -> (weighted sum, non-null count): sum and avg of one column
        counts: dict = {}  # column -> non-null count
        for s, (ci, si, nk) in zip(self.specs, self.plan):
            arr = d.vals.column(s.column) if s.column is not None else None
            if si is not None:
                if s.column not in sums:
                    if key_index is None:
                        key_index = np.repeat(np.arange(d.num_keys, dtype=np.int64),
                                              np.diff(d.offsets))
                    sums[s.column] = weighted_sum(arr, d.weights, starts, key_index, flags,
                                                  f"'{s.column}'")
                cols[si], cols[ci] = sums[s.column]
            elif ci is not None:
                if s.column in sums:
                    cols[ci] = sums[s.column][1]
                    continue
                if s.column not in counts:
                    counts[s.column] = _checked(group_sums(d.weights * _valid(arr), starts),
                                                flags, f"count({s.column})")
                cols[ci] = counts[s.column]
        return cols

    def from_arrow(self, batch: pa.RecordBatch, has: np.ndarray) -> list:
        """Aligned old partials (zero where a key had none)."""
        out = []
        for f, col in zip(self.schema, batch.columns):
            if pa.types.is_decimal(f.type):
                out.append(pc.if_else(pa.array(has), col, _dec_zero(len(has), f.type.scale)))
            else:
                dt = np.float64 if pa.types.is_floating(f.type) else np.int64
                out.append(np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False), dtype=dt))
        return out

    def sum_groups(self, cols: list, bounds: np.ndarray, flags: Optional[list] = None) -> list:
        """Partials of rows grouped by ``bounds`` (sorted by key) summed per group (int64
        columns checked, see :func:`weighted_sum`)."""
        starts = bounds[:-1]
        out = []
        for f, c in zip(self.schema, cols):
            if pa.types.is_decimal(f.type):
                g = np.repeat(np.arange(len(starts), dtype=np.int64), np.diff(bounds))
                w = pa.decimal256(38, f.type.scale)
                res = pa.table({"g": g, "v": c.cast(w)}).group_by("g", use_threads=False) \
                    .aggregate([("v", "sum")]).sort_by("g").column("v_sum").combine_chunks()
                out.append(_dec_fit(res, f.type.scale, flags, self._what(f.name)))
            elif pa.types.is_integer(f.type):
                out.append(_checked(group_sums(c, starts), flags, self._what(f.name)))
            else:
                out.append(_reduce(c, starts))
        return out

    def equal(self, a: list, b: list) -> np.ndarray:
        """Row-wise equality of two aligned partial lists."""
        eq = np.ones(len(a[0]), dtype=bool)
        for x, y in zip(a, b):
            if isinstance(x, pa.Array):
                eq &= np.asarray(pc.fill_null(pc.equal(x, y), False)
                                 .to_numpy(zero_copy_only=False), dtype=bool)
            else:
                eq &= x == y
        return eq

    def add(self, a: list, b: list, flags: Optional[list] = None) -> list:
        """``a + b`` column by column; int64 columns checked (see :func:`weighted_sum`)."""
        out = []
        for f, x, y in zip(self.schema, a, b):
            if pa.types.is_decimal(f.type):
                out.append(_dec_add(x, y, f.type.scale, flags, self._what(f.name)))
            elif pa.types.is_integer(f.type):
                out.append(_checked(add_overflows(x, y), flags, self._what(f.name)))
            else:
                out.append(x + y)
        return out

    def _what(self, column: str) -> str:
        if column == "__rows":
            return "the row count"
        s = self.specs[int(column[1:])]
        return f"count({s.column})" if column[0] == "n" else f"the sum of '{s.column}'"

    def to_arrow(self, cols: list) -> pa.RecordBatch:
        arrs = [c if isinstance(c, pa.Array) else pa.array(c, f.type)
                for f, c in zip(self.schema, cols)]
        return pa.RecordBatch.from_arrays(arrs, schema=self.schema)

    def all_zero(self, cols: list) -> np.ndarray:
        """Partials that can be dropped: every count and sum exactly zero. (A zero row count
        alone is not enough: in a Z-set ``+1·(x=5) - 1·(x=3)`` has no rows but a sum of 2.)"""
        z = cols[0] == 0
        for f, c in zip(list(self.schema)[1:], cols[1:]):
            if pa.types.is_decimal(f.type):
                z &= np.asarray(pc.equal(c, _dec_zero(len(c), f.type.scale))
                                .to_numpy(zero_copy_only=False), dtype=bool)
            else:
                z &= c == 0
        return z

    def finish(self, cols: list) -> list[pa.Array]:
        out = []
        for s, (ci, si, nk) in zip(self.specs, self.plan):
            if s.kind == "count":
                out.append(pa.array(cols[0] if ci is None else cols[ci], pa.int64()))
            else:
                out.append(finish_sum(s, cols[si], cols[ci]))
        return out


def _take_cols(cols: list, idx: np.ndarray) -> list:
    """Rows ``idx`` of partial columns (numpy arrays, or Arrow arrays for decimal sums)."""
    return [c.take(pa.array(idx)) if isinstance(c, pa.Array) else c[idx] for c in cols]


def _concat_col(parts: list):
    return pa.concat_arrays(parts) if isinstance(parts[0], pa.Array) else np.concatenate(parts)


NEGATIVE = ("the group's row count would be negative: a row was deleted that was never "
            "inserted")


def _union(flags: list) -> tuple[np.ndarray, list]:
    """The keys flagged by any check, and a reason per flagged key (the first check's)."""
    bad = np.zeros(len(flags[0][0]), dtype=bool)
    why = np.full(len(bad), -1, dtype=np.int64)
    for j, (m, _) in enumerate(flags):
        why[m & (why < 0)] = j
        bad |= m
    return bad, [flags[j][1] for j in why[bad]]


def bad_keys(op: Operator, keys: pa.RecordBatch, d: Optional[OrdIndexedZSet], kcodes,
             flags: list, key_weights: Optional[np.ndarray] = None) -> np.ndarray:
    """Keys whose aggregate cannot be computed (``flags``: ``(mask over keys, reason)``): raise a
    :class:`~dbsp.circuit.errors.RowError` naming the first (policy ``raise``), else report them
    and return the mask of the good keys. Reported: their rows of ``d`` when given; else (their
    rows are on other workers: partials crossed the exchange) the key, with the key's row count
    of this step (``key_weights``) as weight."""
    bad, reasons = _union(flags)
    idx = np.flatnonzero(bad)
    if not op.skipping:
        raise RowError(op.name, reasons[0], keys.slice(int(idx[0]), 1).to_pylist()[0])
    if d is None:
        w = key_weights[idx] if key_weights is not None else np.zeros(len(idx), np.int64)
        op.ctx.errors.report(BadRows(op.name, take(keys, idx), w, reasons))
    else:
        rows, why = _rows_of_keys(d, kcodes, idx, reasons)
        flat = d.flatten()
        op.ctx.errors.report(BadRows(op.name, take(flat.data, rows), flat.weights[rows], why))
    return ~bad


def _rows_of_keys(d: OrdIndexedZSet, kcodes, idx: np.ndarray, reasons: list):
    """Row positions (in ``d.flatten()`` order) of the keys ``kcodes[idx]`` of ``d``, and the
    reason of each."""
    ai, bi = K.intersect(K.take(kcodes, idx), d.kcodes)
    rows, why = [], []
    for a, b in zip(ai.tolist(), bi.tolist()):
        lo, hi = int(d.offsets[b]), int(d.offsets[b + 1])
        rows.extend(range(lo, hi))
        why.extend([reasons[a]] * (hi - lo))
    return np.asarray(rows, dtype=np.int64), why


def bad_groups(op: Operator, d: OrdIndexedZSet, flags: list) -> OrdIndexedZSet:
    """``d`` without the keys flagged by ``flags`` (raising under policy ``raise``)."""
    ok = bad_keys(op, d.keys, d, d.kcodes, flags)
    return d.select_keys(np.flatnonzero(ok))


class LinearAggregateOperator(Operator):
    """count / sum / avg from running partials per key (never reads the input history).

    With ``preaggregate`` (and W > 1) the input is *not* sharded beforehand: each worker sums its
    own delta into one partial row per key, and only those rows cross the exchange (by key hash),
    where the parts of a key are added up (a combiner: the exchange moves keys, not rows).

    *Fused index.* An ``index_by`` feeding only this operator is fused into it at plan time
    (:meth:`fuse_input`): the operator then gets the loose rows and groups them by key itself
    (key codes, one stable sort, the columns it sums), without encoding the values or
    consolidating ``(key, value)`` pairs: partials are sums over rows, so equal rows need not
    meet first (the sums are exact, so they are the same). Only when some key is refused (an
    overflow, a negative count) are the rows indexed as the unfused ``index_by`` would, so the
    rows reported are the same.

    *A step's fixed cost.* Numeric partials are read through the versioned state's flat table
    (one probe a touched key) and written back beside the spine; the output rows come out
    finished, in the order of the output's row codes and consolidated
    (:func:`~dbsp.algebra.kernels.finish_emit`), as a
    :class:`~dbsp.operators.output.SortedPart` that an output handle reads as it is (no encode,
    no sort: the keys were sorted by code when grouped). With u64 keys, a step's rows (up to
    64K) are grouped in one native pass (:func:`~dbsp.algebra.kernels.group_rows`: a hash table
    of the key codes, only the distinct codes sorted).

    *W > 1.* A worker's part of the partials is one ``uint64`` array (key codes, then the bits
    of each partial column) with the plan of the codes; the parts received are merged and summed
    in one native pass (:func:`~dbsp.algebra.kernels.merge_sum_packed`) and the key columns
    read back from the codes (:func:`~dbsp.algebra.kernels.decode_u64`): no key batch is
    gathered, sent, concatenated and gathered again.
    """

    state_attrs = ('state',)

    name = "aggregate(linear)"

    def __init__(self, ctx, specs: list[AggSpec], out_schema: pa.Schema,
                 preaggregate: bool = False, positive: bool = False):
        super().__init__(ctx)
        self.positive = positive
        self.specs, self.out_schema = specs, out_schema
        self.partials = _Partials(specs)
        # numeric partials: the live rows are read through a flat table (VersionedRows' flat),
        # one probe a touched key instead of a search in every batch of the spine
        self.state = VersionedRows("aggregate.partials", self.partials.schema,
                                   flat=self.partials.dtypes is not None)
        nk = len(out_schema) - len(specs)
        self.agg_schema = pa.schema(list(out_schema)[nk:])
        self.key_schema = pa.schema(list(out_schema)[:nk])
        self.preaggregate = preaggregate and ctx.workers > 1
        #: set by the replica when the input arrives already sharded by its key (an input the
        #: driver dealt by this key, :mod:`dbsp.runtime.placement`): no partials to swap
        self.local = False
        #: the ``index_by`` fused into this operator (see the class doc), or None
        self._index: Optional[IndexOperator] = None
        #: per partial column: int64 (else float64); None when a column is a decimal
        self._is_int = None if self.partials.dtypes is None else \
            [dt is np.int64 for dt in self.partials.dtypes]
        self._np_plan = self._plan_native()
        #: (the fused index's plan, the codec of the value columns read), see _group
        self._vcodec: Optional[tuple] = None
        #: how _group groups the rows of the last input schema (see _plan_group)
        self._group_plan: Optional[tuple] = None
        #: (the batch _group made this step, its value columns as numpy), or None
        self._grouped: Optional[tuple] = None
        #: value columns the partials read (each once, in first use order)
        self._used = list(dict.fromkeys(s.column for s in specs if s.column is not None))
        #: how :func:`~dbsp.algebra.kernels.finish_emit` finishes each output column from the
        #: partials (kind 0 count, 1 sum, 2 avg; count column; sum column), when every
        #: result's type is the numpy dtype it computes (int64 counts and integer sums, float64
        #: averages and float sums), so the values are appended as they are; else None
        native_out = self.partials.dtypes is not None and all(
            f.type == (pa.float64() if s.kind == "avg" or (
                s.kind == "sum" and self.partials.dtypes[si] is np.float64) else pa.int64())
            for s, (_, si, _), f in zip(specs, self.partials.plan, self.agg_schema))
        self._fin_plan = None if not native_out else [
            (0, 0 if ci is None else ci, 0) if s.kind == "count" else
            (1 if s.kind == "sum" else 2, ci, si)
            for s, (ci, si, _) in zip(specs, self.partials.plan)]
        #: the output's row codec (the one an output handle sorts by)
        self._row_codec = codec_for(out_schema, out_schema.names)
        self._nk = nk
        #: the key codec last seen whose order is the output's key order (see _step_numeric)
        self._ordered_kcodec: Optional[KeyCodec] = None
        #: (codec, schema of its fields) of the key batches read back from codes (_keys_of)
        self._key_batch_schema: Optional[tuple] = None

    @property
    def passes_empty(self) -> bool:  # type: ignore[override]
        """An empty delta changes nothing, unless the partials must cross the exchange."""
        return not self.preaggregate or self.local

    def fuse_input(self, upstream: Operator) -> bool:
        """Take over an ``index_by`` that feeds only this operator (see the class doc)."""
        if type(upstream) is IndexOperator:
            self._index = upstream
            return True
        return False

    def _group(self, z: ZSet) -> OrdIndexedZSet:
        """The rows of ``z`` grouped by the fused index's key: distinct keys ascending by code,
        each key's rows contiguous (in input order, *not* consolidated by value; value codes
        left zero) with only the value columns the partials read. Everything a partial sum
        needs, at the price of one key encoding and one stable sort."""
        ix = self._index
        if len(z) == 0:
            return OrdIndexedZSet.empty(ix.type.key, ix.type.val)
        p = ix.plan(z)
        if p is None:
            return ix.eval(z)  # raises naming the column
        kc = p[1]
        data = z.data
        g = self._group_plan
        if g is None or g[0] is not p:  # once per input schema
            g = self._group_plan = self._plan_group(p, data.schema)
        if g[1] is not None:  # u64 keys: one native pass (None: a null, or past 64K rows)
            views: list = []  # (the keys' export: kept for the state batch that holds them)
            got = K.group_rows(data, g[1], kc._native_plan, g[2], z.weights, g[3], g[4], g[6],
                               views=views)
            if got is not None:
                keys, kcodes, bounds, vals, w = got[:5]
                d = keep_exports(OrdIndexedZSet(keys, kcodes, bounds, vals,
                                                np.zeros(len(w), np.uint64), w, kc, g[5]),
                                 views[0])
                if g[6] is not None:  # the value columns as the partials read them
                    self._grouped = (d, got[5])
                return d
        keys = data.select(ix.key)
        kcodes = kc.encode_batch(keys)
        perm = K.argsort(kcodes)
        sk = K.take(kcodes, perm)
        bounds = K.group_bounds(sk)
        first = bounds[:-1]
        vals = take(data.select(self._used), perm)
        if self._vcodec is None or self._vcodec[0] is not p:  # once per input schema
            self._vcodec = (p, codec_for(vals.schema))
        return OrdIndexedZSet(take(keys, perm[first]), K.take(sk, first), bounds, vals,
                              np.zeros(len(perm), np.uint64), z.weights[perm], kc,
                              self._vcodec[1])

    def _plan_group(self, p: tuple, schema: pa.Schema) -> tuple:
        """How :meth:`_group` groups rows of ``schema`` (``p``: the fused index's plan):
        ``(p, key column indices or None, value column indices, key schema, value schema,
        value codec)``; the indices are None unless the key codes are u64 read from the
        columns' buffers (:func:`~dbsp.algebra.kernels.group_rows`)."""
        names = schema.names
        kidx = [names.index(k) for k in self._index.key]  # type: ignore[union-attr]
        vidx = [names.index(c) for c in self._used]
        ks = pa.schema([schema.field(i) for i in kidx])
        vs = pa.schema([schema.field(i) for i in vidx])
        native = p[1]._native_plan is not None and bool(vidx)
        # numpy copies of the value columns for _native_partials, when it reads each used
        # column as a number (not only its validity), of the column's own width and kind
        np_dts = None
        if native and self._np_plan is not None and \
                [n for n, _ in self._np_plan[2]] == self._used:
            np_dts = []
            for (_, dt), i in zip(self._np_plan[2], vidx):
                t = schema.field(i).type
                own = np.dtype(t.to_pandas_dtype()) if pa.types.is_integer(t) or \
                    pa.types.is_floating(t) else None
                if dt is None or own is None or own.itemsize != np.dtype(dt).itemsize \
                        or own.kind != np.dtype(dt).kind:
                    np_dts = None
                    break
                np_dts.append(own)
        return p, kidx if native else None, vidx, ks, vs, codec_for(vs), np_dts

    def _plan_native(self) -> Optional[tuple]:
        """How :func:`~dbsp.algebra.kernels.delta_partials` computes this operator's partials:
        ``(kinds, column of each partial, [(value column, dtype or None: validity only)])``, or
        None when a sum is over decimals (the Arrow path)."""
        kinds, cols = [0] * len(self.partials.schema), [0] * len(self.partials.schema)
        used: dict = {}
        for s, (ci, si, nk) in zip(self.specs, self.partials.plan):
            if s.column is None:
                continue
            if si is not None and (nk not in ("i", "f") or s.in_type == pa.uint64()):
                return None  # decimals; uint64 values past int64 (weighted_sum flags them)
            c = used.setdefault(s.column, [len(used), None])
            if si is not None:
                kinds[si], cols[si] = (2, c[0]) if nk == "i" else (3, c[0])
                c[1] = np.int64 if nk == "i" else np.float64
            if ci is not None:
                kinds[ci], cols[ci] = 1, c[0]
        return kinds, cols, [(name, dt) for name, (_, dt) in used.items()]

    def _native_partials(self, d: OrdIndexedZSet) -> Optional[list]:
        """:meth:`_Partials.of_delta` in one native pass (None: decimals, or some key's sums
        leave int64: the checked path names it)."""
        plan = self._np_plan
        if plan is None:
            return None
        kinds, cols, used = plan
        got = self._grouped
        if got is not None:
            self._grouped = None
            if got[0] is d:  # grouped natively this step: the columns as numpy already
                return K.delta_partials(d.offsets, d.weights, kinds, cols, got[1],
                                        [None] * len(got[1]))
        values, valids = [], []
        for name, dt in used:
            arr = d.vals.column(name)
            ok = None
            if arr.null_count:
                ok = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                arr = arr.fill_null(0) if dt is not None else arr
            values.append(None if dt is None else
                          np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dt))
            valids.append(ok)
        return K.delta_partials(d.offsets, d.weights, kinds, cols, values, valids)

    def _delta_partials(self, d: OrdIndexedZSet, z: Optional[ZSet]):
        """``(d, partials of d)`` with the keys whose partials overflow left out
        (:func:`bad_groups`; partials None when no key is left). ``z``: the loose input when
        the index is fused (``d`` is :meth:`_group` of it): a refused key's rows are then
        reported as the index would have given them (consolidated)."""
        P = self.partials
        delta = self._native_partials(d)
        if delta is not None:
            return d, delta
        flags: list = []
        delta = P.of_delta(d, flags)
        if not flags:
            return d, delta
        if z is not None:
            d = self._index.eval(z)  # type: ignore[union-attr]
            flags = []
            delta = P.of_delta(d, flags)
            if not flags:
                return d, delta
        d = bad_groups(self, d, flags)
        return d, (P.of_delta(d) if len(d) else None)

    def eval(self, d: OrdIndexedZSet) -> ZSet:
        P = self.partials
        z = None
        if self._index is not None:  # index_by fused in: d is the loose rows
            z, d = d, self._group(d)
        if self.preaggregate and not self.local:
            got = self._exchange_partials(d, z)
            if got is None:
                return ZSet.empty(self.out_schema)
            keys, kcodes, kcodec, delta, keys_export = got
        else:
            if len(d) == 0:
                return ZSet.empty(self.out_schema)
            d, delta = self._delta_partials(d, z)
            if delta is None:
                return ZSet.empty(self.out_schema)
            keys, kcodes, kcodec = d.keys, d.kcodes, d.kcodec
            keys_export = kept_export(d, "keys")
        G = keys.num_rows
        if P.dtypes is not None:  # numeric partials: read, added and written back as numpy
            has_old, old, old_ver = self.state.get_numpy(kcodes, G, P.dtypes)
            old_batch = None
            fast = K.combine_partials(old, delta, has_old, self._is_int, self.positive)
            if fast is not None:  # else some key is refused: the checked path below names it
                return self._step_numeric(keys, kcodes, kcodec, has_old, old, old_ver, fast,
                                          keys_export)
        else:
            has_old, old_batch, old_ver = self.state.get(kcodes, G)
            old = P.from_arrow(old_batch, has_old)
        flags = []
        new = P.add(old, delta, flags)
        if self.positive:
            negative = new[0] < 0
            if negative.any():
                flags.append((negative, NEGATIVE))
        if flags:  # (rare) keys whose new state would be wrong: raise, or set their rows aside
            if z is not None and not self.preaggregate:
                d = self._index.eval(z)  # type: ignore[union-attr]  # the rows, consolidated
            ok = np.flatnonzero(bad_keys(self, keys, d if not self.preaggregate else None,
                                         kcodes, flags, delta[0]))
            keys, kcodes = take(keys, ok), K.take(kcodes, ok)
            delta, has_old, old_ver = _take_cols(delta, ok), has_old[ok], old_ver[ok]
            old, new = _take_cols(old, ok), _take_cols(new, ok)
            old_batch = None if old_batch is None else take(old_batch, ok)
        changed = ~has_old | ~P.equal(old, new)
        keep = ~P.all_zero(new)
        if old_batch is None:
            self.state.put(keys, kcodes, kcodec, has_old, old, old_ver, keep, new, changed)
        else:
            self.state.put(keys, kcodes, kcodec, has_old, old_batch, old_ver, keep,
                           P.to_arrow(new), changed)
        old_present = has_old & (old[0] != 0)
        new_present = new[0] != 0
        old_out = pa.RecordBatch.from_arrays(P.finish(old), schema=self.agg_schema)
        new_out = pa.RecordBatch.from_arrays(P.finish(new), schema=self.agg_schema)
        return _emit(self.out_schema, keys, old_out, new_out, old_present & changed,
                     new_present & changed)

    def _step_numeric(self, keys: pa.RecordBatch, kcodes, kcodec: KeyCodec,
                      has_old: np.ndarray, old: list, old_ver: np.ndarray, fast: tuple,
                      keys_export=None) -> ZSet:
        """The rest of a step whose new partials (numpy columns) refuse no key: the versioned
        rows of the changed keys replaced, and ``-old`` / ``+new`` output rows, through the
        native kernels (:func:`~dbsp.algebra.kernels.combine_partials`, and the versioned
        state's ``versioned_pairs`` and ``pick_rows``, shared with the general aggregate). Same state and output as the general path below it in :meth:`eval`."""
        new, changed, keep, eo, en = fast
        st = self.state
        st._versions(0)  # (sets the version counter after a restore)
        add = changed & keep
        rm = changed & has_old
        start = st._next
        table, st._table = st._table, None  # current again only once both are written
        kk, offsets, idx, src, vcodes, w = K.versioned_pairs(rm, add, old_ver, start)
        if not len(kk):
            st._table = table  # nothing written
        else:
            st._next += int(np.count_nonzero(add))
            # the old / new partials of each row picked straight into one native import
            # (int64 / float64: the partials' dtypes); the numpy columns are views of it for
            # a later read of this batch (_np_column), made only if the spine is read
            views: list = []  # (its export, kept for the merge that reads it)
            vals = K.pick_batch(idx, src, old, new, st.val_schema, views=views)
            if vals is None:
                vals = pa.RecordBatch.from_arrays(
                    [pa.array(K.pick_rows(idx, src, o, n), f.type)
                     for o, n, f in zip(old, new, st.val_schema)], schema=st.val_schema)
            if len(kk) == len(has_old):  # every touched key changed (kk: ascending, distinct)
                b = keep_exports(OrdIndexedZSet(keys, kcodes, offsets, vals, vcodes, w, kcodec,
                                                st.vcodec), keys_export, *views)
            else:
                b = keep_exports(OrdIndexedZSet(take(keys, kk), K.take(kcodes, kk), offsets, vals,
                                                vcodes, w, kcodec, st.vcodec), None, *views)
            st._insert(b, table, kcodes, rm, add, start, new, None)
        n_old = len(eo)
        if n_old + len(en) == 0:
            return ZSet.empty(self.out_schema)
        if self._fin_plan is not None:
            return self._emit_sorted(keys, kcodec, old, new, eo, en, keys_export)
        rows = np.concatenate([eo, en])
        ow = np.ones(len(rows), np.int64)
        ow[:n_old] = -1
        is_old = ow < 0  # (once, not once per partial column)
        parts = [K.pick_rows(rows, is_old, o, n) for o, n in zip(old, new)]
        fin = self._finish_numeric(parts)  # (a result type other than int64 / float64)
        cols = list(take(keys, rows).columns) + [
            pa.array(v, f.type, mask=m) for (v, m), f in zip(fin, self.agg_schema)]
        return ZSet(pa.RecordBatch.from_arrays(cols, schema=self.out_schema), ow)

    def _emit_sorted(self, keys: pa.RecordBatch, kcodec: KeyCodec, old: list, new: list,
                     eo: np.ndarray, en: np.ndarray, keys_export=None) -> ZSet:
        """The output rows of :meth:`_step_numeric` (``-old`` where ``eo``, ``+new`` where
        ``en``) finished, ordered and consolidated in one native pass
        (:func:`~dbsp.algebra.kernels.finish_emit`: a key whose old and new rows finish equal
        emits nothing) and gathered with the keys in one native import. The keys are sorted by
        their codes, so the rows come out in the order of the output's row codes: a
        :class:`~dbsp.operators.output.SortedPart` (codes built only if something reads them),
        which an output handle takes as it is, without encoding and sorting the rows again."""
        rows, ow, fin = K.finish_emit(old, new, eo, en, self._fin_plan, self._is_int)
        if not len(rows):
            return ZSet.empty(self.out_schema)
        out = K.take_batch(keys if keys_export is None else keys_export, rows, fin,
                           self.out_schema)
        if out is None:  # (keys with nulls or of variable width)
            cols = list(take(keys, rows).columns) + [
                pa.array(v, f.type, mask=m) for (v, m), f in zip(fin, self.agg_schema)]
            out = pa.RecordBatch.from_arrays(cols, schema=self.out_schema)
        if kcodec is not self._ordered_kcodec:
            # the key codes order the keys as the output's row codes order its key columns
            # when the column types are the same (a null flag keeps the order of the values)
            if [f.type for f in kcodec.fields] != [f.type for f in self.key_schema]:
                return ZSet(out, ow)
            self._ordered_kcodec = kcodec
        return SortedPart(out, ow, self._row_codec, self._nk)

    def _finish_numeric(self, parts: list) -> list:
        """:meth:`_Partials.finish` of numpy partials (no decimal) as ``(values, null mask or
        None)`` per aggregate: count as it is, sum and avg null where the non-null count is 0,
        avg as ``float(sum) / float(count)``."""
        out = []
        for s, (ci, si, _) in zip(self.specs, self.partials.plan):
            if s.kind == "count":
                out.append((parts[0] if ci is None else parts[ci], None))
                continue
            n = parts[ci]
            null = n == 0
            mask = null if null.any() else None
            if s.kind == "sum":
                out.append((parts[si], mask))
            else:
                avg = np.divide(parts[si], n, out=np.zeros(len(n), np.float64), where=~null)
                out.append((avg, mask))
        return out

    def _exchange_partials(self, d: OrdIndexedZSet, z: Optional[ZSet] = None):
        """Local partials per key, swapped by key hash, summed per key: ``(keys, kcodes, codec,
        partial columns, the keys' kept export or None)`` of the keys this worker owns, or
        None.

        Partials cross the exchange as they are computed, not as a record batch: building one,
        and reading it back on the other side, cost more than the rows themselves (a few dozen
        keys a step). With u64 key codes read from the key columns' buffers and numpy partials
        (:meth:`_pack`), a worker's part is one ``uint64`` array (the codes, then each partial
        column's bits) and the plan of the codes: the keys' columns are read back from their
        codes (:func:`~dbsp.algebra.kernels.decode_u64`), so no key batch is gathered, sent,
        concatenated and gathered again. Else a part is ``(keys, codes, partial columns)``.
        """
        P, W = self.partials, self.ctx.workers
        parts: list = [None] * W
        if len(d):
            d, local = self._delta_partials(d, z)
        if len(d):
            packed = self._pack(d, local)
            if packed is not None:
                parts = packed
            else:
                for w, idx in enumerate(shard_rows(d.kcodes, self.ctx.shards)):
                    if len(idx):
                        parts[w] = (take(d.keys, idx), K.take(d.kcodes, idx),
                                    _take_cols(local, idx))
        got = [g for g in self.ctx.transport.exchange(self.ctx.worker, parts) if g is not None]
        if not got:
            return None
        codec = d.kcodec if len(d) else KeyCodec(list(self.key_schema))
        if any(len(g) == 2 for g in got):
            if all(len(g) == 2 for g in got):
                done = self._sum_packed(got, codec)
                if done is not None:
                    return done
            got = [self._unpack(g, codec) if len(g) == 2 else g for g in got]
        if len(got) == 1:  # one consolidated part: keys already sorted and distinct
            return got[0][0], got[0][1], codec, got[0][2], None
        if P.dtypes is not None and all(type(g[1]) is np.ndarray for g in got):
            # u64 key codes and numpy partials: the sorted parts merged and summed in one
            # native pass (a dozen numpy and Arrow calls a column on a few dozen keys, else)
            kc, first, sums, over = K.merge_sum_runs(
                [g[1] for g in got], [[g[2][i] for g in got] for i in range(len(P.schema))],
                self._is_int)
            if over is None:
                return take(pa.concat_batches([g[0] for g in got]), first), kc, codec, sums, \
                    None
        kcodes = K.concat([g[1] for g in got])
        perm = K.argsort(kcodes)
        sk = K.take(kcodes, perm)
        bounds = K.group_bounds(sk)
        first = bounds[:-1]
        keys = take(pa.concat_batches([g[0] for g in got]), perm[first])
        cols = _take_cols([_concat_col([g[2][i] for g in got]) for i in range(len(P.schema))],
                          perm)
        flags = []
        sums = P.sum_groups(cols, bounds, flags)
        kc = K.take(sk, first)
        if flags:
            ok = np.flatnonzero(bad_keys(self, keys, None, kc, flags, sums[0]))
            keys, kc, sums = take(keys, ok), K.take(kc, ok), _take_cols(sums, ok)
        return keys, kc, codec, sums, None

    def _pack(self, d: OrdIndexedZSet, local: list) -> Optional[list]:
        """Per worker None (no key of ``d`` is its) or ``(array, plan)``: the codes of the keys
        of ``d`` that worker owns and the bits of their partials ``local`` as the rows of one
        ``uint64`` array (:func:`~dbsp.algebra.kernels.pack_parts`: one native pass from the
        shard map's order of the rows), and the plan of the codes (``KeyCodec``'s native plan:
        a list of tuples); None when the codes are not u64 read from the key columns or a
        partial is not a numpy column (decimals)."""
        codec = d.kcodec
        if codec._native_plan is None or type(d.kcodes) is not np.ndarray \
                or self.partials.dtypes is None \
                or any(type(c) is not np.ndarray or c.dtype.itemsize != 8 for c in local):
            return None
        plan = codec._native_plan
        order, bounds = as_shard_map(self.ctx.shards).order(d.kcodes)
        return [None if m is None else (m, plan)
                for m in K.pack_parts(d.kcodes, local, order, bounds)]

    def _columns(self, m: np.ndarray) -> list:
        """The partial columns of a packed part's rows (views, each of its dtype)."""
        return [m[1 + i].view(dt) for i, dt in enumerate(self.partials.dtypes)]

    def _keys_of(self, kc: np.ndarray, plan: list, codec: KeyCodec,
                 cols: Optional[list] = None, views: Optional[list] = None) -> pa.RecordBatch:
        """The key columns of the u64 codes ``kc`` (of ``plan``) as a batch of ``codec``'s
        fields, in one native import (``cols``: the codes decoded already; ``views``: a list
        the batch's export is appended to, when the native import made one)."""
        if cols is None:
            cols = K.decode_u64(kc, plan)
        schema = self._key_batch_schema
        if schema is None or schema[0] is not codec:
            schema = self._key_batch_schema = (codec, pa.schema(codec.fields))
        out = K.take_batch(None, None, cols, schema[1], views)
        if out is None:  # (a type take_batch does not build)
            out = pa.RecordBatch.from_arrays(
                [pa.array(v, f.type, mask=m) for f, (v, m) in zip(codec.fields, cols)],
                schema=schema[1])
        return out

    def _unpack(self, g: tuple, codec: KeyCodec) -> tuple:
        """A packed part (:meth:`_pack`) as ``(keys, codes, partial columns)``."""
        m, plan = g
        kc = np.ascontiguousarray(m[0])
        return self._keys_of(kc, plan, codec), kc, self._columns(m)

    def _sum_packed(self, got: list, codec: KeyCodec) -> Optional[tuple]:
        """:meth:`_exchange_partials`' result from packed parts only, or None when some key's
        int64 sum leaves int64 (the general path names it)."""
        plan = got[0][1]
        if any(g[1] != plan for g in got):
            return None
        # summed, and the key columns decoded, in one native call
        done = K.sum_unpack([g[0] for g in got], self._is_int, plan)
        if done is None:
            return None
        kc, cols, kcols = done
        # the keys' export kept: the output rows and the state batch's merges gather from it
        # (an export of the batch is thousands of instructions a read, on a few dozen keys)
        views: list = []
        keys = self._keys_of(kc, plan, codec, kcols, views)
        return keys, kc, codec, cols, (views[0] if views else None)

    def clock_start(self) -> None:
        self.state.clear()

    def state_rows(self) -> int:
        return len(self.state)


class _ValueCounts(Stateful):
    """Per ``(key, value)`` weights of one value column (nulls left out): an indexed spine
    ``key -> value`` whose values of a key are sorted by value code, so min / max seek the first /
    last value of positive weight and count distinct probes single pairs
    (:mod:`dbsp.trace.probe`). ``monotone`` while no negative weight was ever inserted: then
    every stored weight is positive and inserts alone cannot retract an extreme."""

    state_attrs = ('trace', '_monotone')

    def __init__(self, col: str, type_: pa.DataType):
        self.col = col
        self.schema = pa.schema([pa.field(col, type_, nullable=False)])
        self.codec = KeyCodec(list(self.schema))
        self.trace = Spine(name=f"aggregate.values({col})")
        self._monotone: Optional[bool] = None

    @property
    def monotone(self) -> bool:
        """No negative weight stored. Found from the trace on first use (it may have been
        restored with state), then kept up to date by the operator."""
        if self._monotone is None:
            self._monotone = all(not getattr(b, "is_file", False) and bool((b.weights > 0).all())
                                 for b in self.trace.batches())
        return self._monotone

    @monotone.setter
    def monotone(self, v: bool) -> None:
        self._monotone = v

    def delta(self, d: OrdIndexedZSet) -> Optional[tuple[OrdIndexedZSet, np.ndarray]]:
        """The consolidated ``key -> value`` delta of the column's non-null values and the
        position in ``d`` of each of its entries' key (None if empty).

        ``d``'s keys are sorted and distinct already, so the pairs are sorted by ``(key
        position, value code)``, two integers: the key columns are neither re-encoded nor
        compared (a key of several columns has var-length codes, whose sort costs several
        times more)."""
        arr = d.vals.column(self.col)
        vf = d.vcodec.fields
        if len(vf) == 1 and vf[0].name == self.col and arr.null_count == 0 \
                and vf[0].type == self.schema.field(0).type \
                and vf[0].nullable == self.schema.field(0).nullable:
            # the column is d's only value column and codes alike: d's (key, value) pairs are
            # already consolidated, sorted and encoded as this trace keeps them
            if not len(d):
                return None
            return (OrdIndexedZSet(d.keys, d.kcodes, d.offsets,
                                   pa.RecordBatch.from_arrays([arr], schema=self.schema),
                                   d.vcodes, d.weights, d.kcodec, self.codec), d.key_index())
        ki = d.key_index()
        if arr.null_count:
            rows = np.flatnonzero(_valid(arr))
            arr, ki, w = arr.take(pa.array(rows)), ki[rows], d.weights[rows]
        else:
            w = d.weights
        if len(ki) == 0:
            return None
        vals = pa.RecordBatch.from_arrays([arr], schema=self.schema)
        vcodes = self.codec.encode(vals.columns, len(arr))
        got = _consolidate_runs(ki, vcodes, w)
        perm, w = got if got is not None else K.sort_consolidate(ki.astype(np.uint64), vcodes, w)
        if len(perm) == 0:
            return None
        gpos = ki[perm]
        bounds = np.flatnonzero(np.r_[True, gpos[1:] != gpos[:-1], True])
        uk = gpos[bounds[:-1]]
        dv = OrdIndexedZSet(take(d.keys, uk), K.take(d.kcodes, uk), bounds.astype(np.int64),
                            take(vals, perm), K.take(vcodes, perm), w, d.kcodec, self.codec)
        return dv, gpos

    def clear(self) -> None:
        self.trace.clear()
        self._monotone = True


def _consolidate_runs(ki: np.ndarray, vcodes, w: np.ndarray):
    """:func:`K.sort_consolidate` of ``(ki, vcodes)`` pairs that are sorted already: ``(first
    row of each distinct pair, summed weight)``, zero sums dropped; None when the u64 codes are
    not in order inside each key (or a sum leaves int64: the caller's sort then reports it).

    A key's values sit in the order of their whole value code, whose first column leads, so the
    pairs of the first value column arrive sorted (``group_by().agg()`` puts the column of a min /
    max / count_distinct first): one pass finds the runs, no sort."""
    if not isinstance(vcodes, np.ndarray):
        return None
    if len(ki) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    same = ki[1:] == ki[:-1]
    if (same & (vcodes[1:] < vcodes[:-1])).any():
        return None
    starts = np.flatnonzero(np.r_[True, ~same | (vcodes[1:] != vcodes[:-1])])
    sums, bad = group_sums(w, starts)
    if bad.any():
        return None
    nz = sums != 0
    return starts[nz], sums[nz]


def _pick_first(gpos: np.ndarray, mask: np.ndarray, last: bool) -> tuple[np.ndarray, np.ndarray]:
    """Among entries sorted by (group, value) where ``mask``: ``(groups, entry index)`` of the
    first (``last``: last) entry of each group."""
    idx = np.flatnonzero(mask)
    if len(idx) == 0:
        return idx, idx
    g = gpos[idx]
    edge = np.r_[g[1:] != g[:-1], True] if last else np.r_[True, g[1:] != g[:-1]]
    return g[edge], idx[edge]


def _pair_changes(d: OrdIndexedZSet, vc: _ValueCounts, specs: list):
    """Fold this step's (key, value) change into ``vc``'s trace; what the per-column updates
    (Arrow and numpy) read: ``(dv, gpos, old_w, pos, gone)`` -- the change, each entry's key
    position in ``d``, each pair's weight before it (None when insert-only and no count_distinct
    needs it), whether the pair is present after it, and whether it was present before and is
    not now (None when insert-only). None when the step changes no pair."""
    got = vc.delta(d)
    if got is None:
        return None
    dv, gpos = got  # gpos: the position in d of each (key, value) entry's key
    insert_only = vc.monotone and bool((dv.weights > 0).all())
    need_w = not insert_only or any(s.kind == "count_distinct" for _, s in specs)
    old_w = pair_weights(vc.trace.batches(), d.kcodes, gpos, dv.vcodes) if need_w else None
    vc.trace.insert(dv)
    if not insert_only:
        vc.monotone = False
    if old_w is None:
        return dv, gpos, None, np.ones(len(dv), dtype=bool), None
    pos = old_w + dv.weights > 0
    return dv, gpos, old_w, pos, (old_w > 0) & ~pos


class GeneralAggregateOperator(Operator):
    """count / sum / avg from running partials, min / max / count_distinct from per-(key, value)
    weights: every step reads only the keys and values its delta touches.

    * linear aggregates and the row count: as :class:`LinearAggregateOperator`;
    * ``count_distinct(c)``: the running count per key changes by the values whose weight crosses
      zero: ``Δ = #{v : w_old(k,v) <= 0 < w_new(k,v)} - #{v : w_old(k,v) > 0 >= w_new(k,v)}``,
      ``w_old`` probed pair by pair;
    * ``min(c)`` / ``max(c)``: the running extreme per key is a partial too,
      ``ext_new = better(ext_old, best value of Δ with w_new > 0)``, unless a value at the old
      extreme stopped being positive: only then is the extreme sought in the value trace (the
      first / last value of positive weight, ``O(log group)``). While the column has only ever
      seen insertions (``monotone``) no weight is probed at all (append-only fast path).

    State: one row per key (partials, extremes, distinct counts) and, per min / max /
    count_distinct column, the value trace of :class:`_ValueCounts`.
    """

    state_attrs = ('state', 'values')

    name = "aggregate(general)"
    passes_empty = True

    def __init__(self, ctx, specs: list[AggSpec], out_schema: pa.Schema, positive: bool = False,
                 filtered: Sequence[Filtered] = ()):
        super().__init__(ctx)
        self.specs, self.out_schema, self.positive = specs, out_schema, positive
        self.filtered = tuple(filtered)
        nk = len(out_schema) - len(specs)
        self.agg_schema = pa.schema(list(out_schema)[nk:])
        self.linear = [s for s in specs if s.kind in LINEAR]
        self.partials = _Partials(self.linear)
        self.others = [s for s in specs if s.kind not in LINEAR]
        fields = list(self.partials.schema)
        for i, s in enumerate(self.others):
            fields.append(pa.field(f"x{i}", s.out_type))
        self.state_schema = pa.schema(fields)
        self.values: dict[str, _ValueCounts] = {}
        for s in self.others:
            if s.column not in self.values:
                self.values[s.column] = _ValueCounts(s.column, s.in_type)
        # numeric state (no decimal sum; min / max of integers or temporal values): the whole
        # step runs on numpy columns, Arrow only to read the delta and write state and output
        xt = [np.dtype(np.int64) if s.kind == "count_distinct" else np_dtype(s.in_type)
              for s in self.others]
        self.np_dtypes = None if self.partials.dtypes is None or any(t is None for t in xt) \
            else [np.dtype(t) for t in self.partials.dtypes] + xt
        # numeric state: its live rows are read through a flat table (VersionedRows' flat)
        self.state = VersionedRows("aggregate.state", self.state_schema,
                                   flat=self.np_dtypes is not None)

    def eval(self, d: OrdIndexedZSet) -> ZSet:
        if len(d) == 0:
            return ZSet.empty(self.out_schema)
        if self.filtered:
            d = with_filtered(d, self.filtered)
        if self.np_dtypes is not None:
            return self._eval_numeric(d)
        P, G = self.partials, d.num_keys
        flags: list = []
        delta = P.of_delta(d, flags)
        if flags:  # (rare) keys whose sums leave int64: raise, or set their rows aside
            d = bad_groups(self, d, flags)
            return self.eval(d) if len(d) else ZSet.empty(self.out_schema)
        has_old, old_batch, old_ver = self.state.get(d.kcodes, G)
        nl = len(P.schema)
        old = P.from_arrow(pa.RecordBatch.from_arrays(old_batch.columns[:nl], schema=P.schema),
                           has_old)
        new = P.add(old, delta, flags)
        if self.positive and (new[0] < 0).any():
            flags.append((new[0] < 0, NEGATIVE))
        if flags:  # checked before any state is touched
            d = bad_groups(self, d, flags)
            return self.eval(d) if len(d) else ZSet.empty(self.out_schema)
        old_x = old_batch.columns[nl:]
        new_x = list(old_x)
        for col, vc in self.values.items():
            specs = [(i, s) for i, s in enumerate(self.others) if s.column == col]
            self._update_column(d, vc, specs, old_x, new_x)
        cols = [pa.array(c, f.type) if not isinstance(c, pa.Array) else c
                for f, c in zip(P.schema, new)] + new_x
        new_batch = pa.RecordBatch.from_arrays(cols, schema=self.state_schema)
        changed = ~has_old | ~rows_equal(old_batch, new_batch)
        keep = ~P.all_zero(new)
        for s, x in zip(self.others, new_x):
            keep |= np.asarray(x.is_valid().to_numpy(zero_copy_only=False), dtype=bool) \
                if s.kind != "count_distinct" else \
                np.asarray(x.fill_null(0).to_numpy(zero_copy_only=False)) != 0
        self.state.put(d.keys, d.kcodes, d.kcodec, has_old, old_batch, old_ver, keep, new_batch,
                       changed)
        old_present = has_old & (old[0] != 0)
        new_present = new[0] != 0
        return _emit(self.out_schema, d.keys, self._finish(old, old_x),
                     self._finish(new, new_x), old_present & changed, new_present & changed)

    def _eval_numeric(self, d: OrdIndexedZSet) -> ZSet:
        """:meth:`eval` with every state column fixed-width: state read, updated, compared and
        written back as numpy columns (see :meth:`VersionedRows.get_numpy`); only the keys whose
        output row changes are emitted, so the output's rows are distinct."""
        P, G = self.partials, d.num_keys
        nl = len(P.schema)
        flags: list = []
        delta = P.of_delta(d, flags)
        if flags:  # (rare) keys whose sums leave int64: raise, or set their rows aside
            d = bad_groups(self, d, flags)
            return self.eval(d) if len(d) else ZSet.empty(self.out_schema)
        has_old, cols, old_ver, oks = self.state.get_numpy(d.kcodes, G, self.np_dtypes,
                                                           valid=True)
        old = cols[:nl]
        new = P.add(old, delta, flags)
        if self.positive and (new[0] < 0).any():
            flags.append((new[0] < 0, NEGATIVE))
        if flags:  # checked before any state is touched
            d = bad_groups(self, d, flags)
            return self.eval(d) if len(d) else ZSet.empty(self.out_schema)
        old_x = [(c, ok if s.kind != "count_distinct" else np.ones(G, dtype=bool))
                 for s, c, ok in zip(self.others, cols[nl:], oks[nl:])]  # a count is never null
        new_x = list(old_x)
        for col, vc in self.values.items():
            specs = [(i, s) for i, s in enumerate(self.others) if s.column == col]
            self._update_column_np(d, vc, specs, old_x, new_x)
        changed = ~has_old | ~P.equal(old, new)
        keep = ~P.all_zero(new)
        for s, (ov, ook), (nv, nok) in zip(self.others, old_x, new_x):
            changed |= (ov != nv) | (ook != nok)
            keep |= nok if s.kind != "count_distinct" else nv != 0
        lin_valid = [None] * nl
        self.state.put(d.keys, d.kcodes, d.kcodec, has_old, old + [v for v, _ in old_x], old_ver,
                       keep, new + [v for v, _ in new_x], changed,
                       lin_valid + [ok for _, ok in old_x], lin_valid + [ok for _, ok in new_x])
        old_out, new_out = self._finish_np(old, old_x), self._finish_np(new, new_x)
        rm = has_old & (old[0] != 0) & changed
        add = (new[0] != 0) & changed
        both = rm & add
        if both.any():  # a key whose output row is unchanged emits nothing
            same = both.copy()
            for (ov, ook), (nv, nok) in zip(old_out, new_out):
                eq = ov == nv
                if ov.dtype.kind == "f":
                    eq |= np.isnan(ov) & np.isnan(nv)
                same &= eq & (ook == nok)
            rm &= ~same
            add &= ~same
        return _emit_np(self.out_schema, d.keys, old_out, new_out, rm, add)

    def _finish_np(self, lin: list, xs: list) -> list:
        """Output columns as ``(values, valid)`` numpy pairs (values 0 where null)."""
        out, li, xi = [], 0, 0
        for s in self.specs:
            if s.kind in LINEAR:
                ci, si, _ = self.partials.plan[li]
                li += 1
                if s.kind == "count":
                    v = lin[0] if ci is None else lin[ci]
                    out.append((v, np.ones(len(v), dtype=bool)))
                    continue
                n = lin[ci]
                ok = n != 0
                if s.kind == "sum":
                    v = np.where(ok, lin[si], 0)
                else:
                    with np.errstate(divide="ignore", invalid="ignore"):
                        v = np.where(ok, lin[si].astype(np.float64) / np.where(ok, n, 1), 0.0)
                out.append((v, ok))
            else:
                out.append(xs[xi])
                xi += 1
        return out

    def _update_column_np(self, d: OrdIndexedZSet, vc: _ValueCounts, specs: list, old_x: list,
                          new_x: list) -> None:
        """:meth:`_update_column` on numpy ``(values, valid)`` columns."""
        ch = _pair_changes(d, vc, specs)
        if ch is None:
            return
        dv, gpos, old_w, pos, gone = ch
        G = d.num_keys
        for i, s in specs:
            if s.kind == "count_distinct":
                became = (old_w <= 0) & pos
                step = np.bincount(gpos, became.astype(np.int64) - gone.astype(np.int64),
                                   minlength=G).astype(np.int64)
                new_x[i] = (old_x[i][0] + step, np.ones(G, dtype=bool))
            else:
                new_x[i] = self._extreme_np(d, vc, dv, gpos, pos, gone, old_x[i], s.kind == "max")

    def _extreme_np(self, d, vc: _ValueCounts, dv: OrdIndexedZSet, gpos: np.ndarray,
                    pos: np.ndarray, gone: Optional[np.ndarray], old: tuple, last: bool) -> tuple:
        """:meth:`_extreme` on numpy values (integer order is the codes' order)."""
        ov, ok = old
        dvals, _ = np_values(dv.vals.column(0), ov.dtype)
        alive = ok.copy()
        if gone is not None:  # keys whose old extreme lost its positive weight
            gq = np.flatnonzero(gone & ok[gpos])
            if len(gq):
                o, x = ov[gpos[gq]], dvals[gq]
                hit = (o <= x) if last else (x <= o)
                alive[gpos[gq[hit]]] = False
        new = np.where(alive, ov, 0).astype(ov.dtype, copy=False)
        cg, ce = _pick_first(gpos, pos, last)  # best positive value of the delta per key
        if len(cg):
            x = dvals[ce]
            a = alive[cg]
            cur = new[cg]
            new[cg] = np.where(a, np.maximum(cur, x) if last else np.minimum(cur, x), x)
        valid = alive.copy()
        valid[cg] = True
        lost = ok & ~alive
        if lost.any():
            lk = np.flatnonzero(lost)
            found, bs, rows = first_positive(vc.trace.batches(), K.take(d.kcodes, lk), last)
            fk = lk[found]
            valid[lk] = False
            new[lk] = 0
            for k, b, r in zip(fk.tolist(), bs, rows.tolist()):
                new[k] = np_values(b.vals.column(0).slice(r, 1), ov.dtype)[0][0]
            valid[fk] = True
        return new, valid

    def state_memory(self) -> dict:
        m = super().state_memory()
        m["memory_bytes"] += self.state.table_bytes()  # the flat table of live rows
        return m

    def savepoint(self):
        return [vc._monotone for vc in self.values.values()]

    def restore(self, saved) -> None:
        for vc, m in zip(self.values.values(), saved):
            vc._monotone = m

    def _finish(self, lin: list, xs: list) -> pa.RecordBatch:
        lin_out = iter(self.partials.finish(lin))
        x_out = iter(xs)
        cols = []
        for s in self.specs:
            if s.kind in LINEAR:
                cols.append(next(lin_out))
            else:
                x = next(x_out)
                cols.append(x.fill_null(0) if s.kind == "count_distinct" else x)
        return pa.RecordBatch.from_arrays(cols, schema=self.agg_schema)

    def _update_column(self, d: OrdIndexedZSet, vc: _ValueCounts, specs: list, old_x: list,
                       new_x: list) -> None:
        ch = _pair_changes(d, vc, specs)
        if ch is None:
            return
        dv, gpos, old_w, pos, gone = ch
        G = d.num_keys
        if gone is None:
            gone = np.zeros(len(dv), dtype=bool)
        for i, s in specs:
            if s.kind == "count_distinct":
                became = (old_w <= 0) & pos
                step = np.bincount(gpos, became.astype(np.int64) - gone.astype(np.int64),
                                   minlength=G).astype(np.int64)
                prev = np.asarray(old_x[i].fill_null(0).to_numpy(zero_copy_only=False), np.int64)
                new_x[i] = pa.array(prev + step, pa.int64())
            else:
                new_x[i] = self._extreme(d, vc, dv, gpos, pos, gone, old_x[i], s.kind == "max")

    def _extreme(self, d, vc: _ValueCounts, dv: OrdIndexedZSet, gpos: np.ndarray,
                 pos: np.ndarray, gone: np.ndarray, old: pa.Array, last: bool) -> pa.Array:
        """The new min (``last``: max) per key of ``d`` (see the class doc)."""
        G = d.num_keys
        old_valid = np.asarray(old.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        ov = np.flatnonzero(old_valid)
        enc = vc.codec.encode([old.take(pa.array(ov)).cast(vc.schema.field(0).type)], len(ov)) \
            if len(ov) else None
        # keys whose old extreme lost its positive weight: seek them in the trace
        lost = np.zeros(G, dtype=bool)
        gq = np.flatnonzero(gone & old_valid[gpos])
        if len(gq):
            at = np.searchsorted(ov, gpos[gq])
            oc, dc = K.take(enc, at), K.take(dv.vcodes, gq)
            # a gone value at or past the old extreme
            hit = codes_le(oc, dc) if last else codes_le(dc, oc)
            lost[gpos[gq[hit]]] = True
        # best positive value of the delta per key
        cg, ce = _pick_first(gpos, pos, last)
        src = [old, dv.vals.column(0)]
        choice = np.where(old_valid & ~lost, np.arange(G), -1)
        if len(cg):
            use = choice[cg] < 0
            both = np.flatnonzero(~use)
            if len(both):
                at = np.searchsorted(ov, cg[both])
                oc, dc = K.take(enc, at), K.take(dv.vcodes, ce[both])
                better = ~codes_le(dc, oc) if last else ~codes_le(oc, dc)
                use[both[better]] = True
            choice[cg[use]] = G + ce[use]
        if lost.any():
            lk = np.flatnonzero(lost)
            found, bs, rows = first_positive(vc.trace.batches(), K.take(d.kcodes, lk), last)
            fk = lk[found]
            base = G + len(dv)
            for b, r in zip(bs, rows.tolist()):
                src.append(b.vals.column(0).slice(r, 1))
            choice[lk] = -1
            choice[fk] = base + np.arange(len(fk))
        t = old.type
        arr = pa.concat_arrays([a if a.type == t else a.cast(t) for a in src])
        return arr.take(pa.array(choice, mask=choice < 0))

    def clock_start(self) -> None:
        self.state.clear()
        for vc in self.values.values():
            vc.clear()

    def state_rows(self) -> int:
        return len(self.state) + sum(len(vc.trace) for vc in self.values.values())


class GroupAggregateOperator(Operator):
    """Aggregates that include a user :class:`Aggregator`: recomputed over the whole groups of
    the touched keys (an :class:`Aggregator` sees whole groups by contract)."""

    state_attrs = ('input', 'outputs')

    name = "aggregate(general)"

    def __init__(self, ctx, specs: list[AggSpec], out_schema: pa.Schema, positive: bool = False):
        super().__init__(ctx)
        self.specs, self.out_schema, self.positive = specs, out_schema, positive
        self.agg_schema = pa.schema(list(out_schema)[len(out_schema) - len(specs):])
        self.input = Spine(name="aggregate.input")
        self.outputs = VersionedRows("aggregate.output", self.agg_schema)

    def eval(self, d: OrdIndexedZSet) -> ZSet:
        if len(d) == 0:
            return ZSet.empty(self.out_schema)
        groups = touched_groups(self.input, d)
        if len(groups):
            flags: list = []
            rows, cols = compute_groups(self.specs, groups.vals, groups.weights, groups.offsets,
                                        flags)
            if self.positive and (rows < 0).any():
                flags.append((rows < 0, NEGATIVE))
            if flags:  # (rare) set the keys aside, or raise, before any state is touched
                ai, bi = K.intersect(d.kcodes, groups.kcodes)
                on_d = [(np.zeros(d.num_keys, dtype=bool), r) for _, r in flags]
                for (m, _), (md, _) in zip(flags, on_d):
                    md[ai] = m[bi]
                d = bad_groups(self, d, on_d)
                if len(d) == 0:
                    return ZSet.empty(self.out_schema)
                groups = touched_groups(self.input, d)
                rows, cols = compute_groups(self.specs, groups.vals, groups.weights,
                                            groups.offsets)
        G = d.num_keys
        self.input.insert(d)
        has_new = np.zeros(G, dtype=bool)
        idx = np.full(G, -1, dtype=np.int64)
        if len(groups):
            ai, bi = K.intersect(d.kcodes, groups.kcodes)
            has_new[ai] = rows[bi] != 0
            idx[ai] = bi
            new_out = pa.RecordBatch.from_arrays(cols, schema=self.agg_schema).take(
                pa.array(idx, mask=idx < 0))
        else:
            new_out = pa.RecordBatch.from_arrays([pa.nulls(G, f.type) for f in self.agg_schema],
                                                 schema=self.agg_schema)
        has_old, old_out, old_ver = self.outputs.get(d.kcodes, G)
        changed = (has_old != has_new) | (has_old & has_new & ~rows_equal(old_out, new_out))
        self.outputs.put(d.keys, d.kcodes, d.kcodec, has_old, old_out, old_ver, has_new, new_out,
                         changed)
        return _emit(self.out_schema, d.keys, old_out, new_out, has_old & changed,
                     has_new & changed)

    def clock_start(self) -> None:
        self.input.clear()
        self.outputs.clear()

    def state_rows(self) -> int:
        return len(self.input) + len(self.outputs)


def aggregate(stream, aggs: dict, positive: bool = False, filtered: Sequence[Filtered] = ()):
    """Group an indexed stream by its key and aggregate its values (see the module doc).
    ``filtered``: value columns derived per step from a condition column (:class:`Filtered`),
    which ``aggs`` may name like value columns (the general aggregate then runs)."""
    if not isinstance(stream.type, IndexedType):
        raise TypeError(f"aggregate needs an indexed stream (use .index_by([...]) first), got "
                        f"{stream.type.describe()}")
    filtered = tuple(filtered)
    vs = stream.val_schema
    for f in filtered:
        if f.cond not in vs.names or not pa.types.is_boolean(vs.field(f.cond).type):
            raise TypeError(f"aggregate: filter column {f.cond!r} of {f.name!r} must be a "
                            f"boolean value column (value columns: {vs.names})")
        if f.source is not None and f.source not in vs.names:
            raise KeyError(f"aggregate: no value column {f.source!r} for {f.name!r}")
        if f.name in vs.names:
            raise ValueError(f"aggregate: filtered column {f.name!r} clashes with a value column")
    if filtered:
        vs = pa.schema(list(vs) + [pa.field(f.name, f.type) for f in filtered])
    specs = parse_aggs(aggs, stream.key_schema, vs)
    out = output_schema(stream.key_schema, specs)
    linear = all(isinstance(x.kind, str) and x.kind in LINEAR for x in specs)
    if filtered and any(isinstance(x.kind, Aggregator) for x in specs):
        raise TypeError("aggregate: filtered columns are for the built-in aggregates, not an "
                        "Aggregator (it sees the indexed value columns)")
    if linear and not filtered:  # partial sums cross the exchange, not rows (see LinearAggregateOperator)
        # the combiner is on whatever the worker count (the operator skips it with one worker):
        # the graph does not depend on the number of workers, so a checkpoint resumes on another
        node = stream.circuit.add_node(
            LinearAggregateOperator.name,
            lambda ctx: LinearAggregateOperator(ctx, specs, out, preaggregate=True,
                                                positive=positive), [stream],
            ZSetType(out))
        # the input placement may deal its input by this key (dbsp.runtime.placement)
        stream.circuit.nodes[node.node].info["combiner"] = True
        return node
    if any(isinstance(x.kind, Aggregator) for x in specs):
        return stream.circuit.add_node(
            GroupAggregateOperator.name,
            lambda ctx: GroupAggregateOperator(ctx, specs, out, positive),
            [sharded(stream)], ZSetType(out))
    return stream.circuit.add_node(GeneralAggregateOperator.name,
                                   lambda ctx: GeneralAggregateOperator(ctx, specs, out, positive,
                                                                        filtered),
                                   [sharded(stream)], ZSetType(out))


__all__ = ["aggregate", "Aggregator", "AggSpec", "Filtered", "with_filtered", "KINDS",
           "compute_groups", "parse_aggs", "LinearAggregateOperator", "GeneralAggregateOperator",
           "GroupAggregateOperator", "VersionedRows", "rows_equal"]
