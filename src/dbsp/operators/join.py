"""join, left_join, semijoin, antijoin: incremental equi-joins of indexed streams on their key.

Maths
-----
The inner join is bilinear, so its incremental form joins each delta with the integral of the
other side (DBSP, Thm. 3.4)::

    Δ(a ⋈ b) = Δa ⋈ I(b) + z^-1(I(a)) ⋈ Δb          where I(b) already includes Δb

The other joins are built from it, distinct and linear operators, so they are incremental too::

    semijoin(a, b)  = a ⋈ distinct(keys(b))          (left rows, weights of a)
    antijoin(a, b)  = a - semijoin(a, b)
    left_join(a, b) = a ⋈ b + pad_null(antijoin(a, b))

When right rows of a key appear, ``distinct(keys(b))`` turns +1, the semijoin gains the left rows
and the null-padded rows are retracted; when the last right row disappears the reverse happens.

Design
------
Both inputs are sharded by key hash (:func:`dbsp.operators.exchange.sharded`; a pass-through with one
worker), so every key's rows meet on one worker. Each side keeps a
:class:`~dbsp.trace.spine.Spine` of :class:`OrdIndexedZSet` batches; a delta is joined with every
batch of the other spine by :func:`~dbsp.algebra.kernels.intersect` (matching keys) and
:func:`~dbsp.algebra.kernels.expand_pairs` (the cross product of their values); the payload
columns follow through Arrow ``take`` and weights multiply. Work per step is proportional to the
delta, the number of matches, and the (logarithmic) number of batches.

Keys follow SQL: a key with a null in any column matches nothing (such left rows are unmatched in
``left_join`` and kept by ``antijoin``). Both sides must have the same key column types (names may
differ; the output uses the left names); nullability may differ.

*Watermark GC* (DBSP's waterlines for joins): when the leading key column of both sides is an
event time with a watermark on each side (``watermarks=(left_wm, right_wm)``, streams of
:class:`~dbsp.operators.watermark.WatermarkType`), a row of a side whose key starts below the
*other* side's watermark can never meet a new row again (rows behind a watermark are dropped as
late), so after each step every trace is cut below the opposite watermark's key prefix
(:meth:`Spine.truncate_keys_below`; the semijoin's key set, below its own side's watermark). The
result is unchanged; the state holds only the keys the watermarks leave open, e.g. Nexmark q7's
bids of the open windows instead of every bid.

*Band GC* (for joins keyed on something else, e.g. an id): ``band=(left_side, right_side)``, each
None or ``(column, watermark)``: a value column of that side and the *other* side's watermark
stream, of the column's time type. It is the caller's promise that only pairs with
``left[column] >= time of the right row`` (resp. ``right[column] >= time of the left row``) are
used downstream, e.g. Nexmark q9's ``opened <= bid_time <= expires``. A row whose column is below
the other side's watermark can then meet only rows at or above it (later rows behind the
watermark are dropped as late), i.e. only pairs that are not used, so merges of the trace drop it
(:meth:`Spine.retain_values`, a vectorised mask per merged batch: no scan per step; the filter
lags the watermark by one step, see :class:`ValueBound`), and a stored batch whose every row is
behind it goes at once, as a committed key bound frees whole batches. The filter's watermark is
part of the checkpoint. The output
restricted to the promised pairs is unchanged; pairs outside it may be missing, or (for a row
inserted and retracted in batches not merged yet) one half of such a pair may still appear.

Output rows are ``key ++ left values ++ right values`` (right columns whose names clash get the
suffix ``_right``), or what ``fn(keys, left_vals, right_vals)`` returns: a record batch of
``schema`` computed once per step, vectorised over all matched pairs.

>>> import pyarrow as pa, dbsp
>>> c = dbsp.Circuit()
>>> emp = c.add_input("emp", [("dept", pa.int64()), ("name", pa.string())])
>>> dept = c.add_input("dept", [("id", pa.int64()), ("title", pa.string())])
>>> j = emp.index_by(["dept"]).join(dept.index_by(["id"])).output()
>>> _ = emp.insert([(1, "ann"), (2, "bob")]); _ = dept.insert([(1, "sales")]); c.step()
>>> j.to_dict()
{(1, 'ann', 'sales'): 1}
>>> _ = dept.insert([(2, "ops")]); c.step(); j.to_dict()
{(2, 'bob', 'ops'): 1}
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..algebra import kernels as K
from ..algebra.codes import Codes, KeyCodec
from ..algebra.time import physical_int
from ..algebra.schema import as_schema, empty_batch, take, take_batches
from ..circuit.errors import RowError
from ..circuit.operator import Operator
from ..circuit.types import IndexedType, ZSetType
from ..trace.batch import OrdIndexedZSet, OrdZSet, ZSet, exported, match_batches, memoized
from ..trace.spine import Spine
from ._util import key_prefix_bound, to_record_batch
from .distinct import sign_changes
from .exchange import sharded
from .watermark import WatermarkType

EMPTY_SCHEMA = pa.schema([])


# -- helpers shared by the operators that need keys together --------------------------------

def null_key_mask(keys: pa.RecordBatch) -> Optional[np.ndarray]:
    """Boolean mask of keys with a null in some column, or None when there are none."""
    mask = None
    for col in keys.columns:
        if col.null_count:
            m = np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
            mask = m if mask is None else (mask | m)
    return mask


def drop_null_keys(ix: OrdIndexedZSet) -> OrdIndexedZSet:
    """``ix`` without the keys that have a null column (SQL: they match nothing)."""
    if ix.num_keys == 0:
        return ix
    m = null_key_mask(ix.keys)
    if m is None or not m.any():
        return ix
    return ix.select_keys(np.flatnonzero(~m))


def zero_column_batch(n: int) -> pa.RecordBatch:
    """A record batch with no columns and ``n`` rows."""
    return pa.RecordBatch.from_arrays([pa.nulls(n)], names=["_"]).select([])


def join_pairs(x: OrdIndexedZSet, y: OrdIndexedZSet):
    """Matched value pairs of two consolidated indexed batches: ``(key_idx, xs, ys, weights)``
    (``key_idx`` indexes ``x.keys``; ``xs`` / ``ys`` index ``x.vals`` / ``y.vals``), or None."""
    if x.num_keys == 0 or y.num_keys == 0:
        return None
    ai, bi = K.intersect(x.kcodes, y.kcodes)
    if len(ai) == 0:
        return None
    return join_matched(x, ai, y, bi)


#: a stored batch of this many keys or more is probed through its keys' rank directory when
#: they are a dense part of their range (smaller ones: a walk of the codes costs little more)
RANK_MIN_KEYS = 1 << 10
#: ... and a probe of at least one code per this many of its keys makes it (its making costs a
#: pass over the keys: a few probes, e.g. new ids above most of the stored ones, do not repay
#: it); once made, every probe uses it
RANK_PROBES = 8


#: key of a stored batch's ``memo`` under which :func:`match_trace` keeps what a probe of the
#: batch reads besides the probe (its key codes, code sample and code runs; the last two are
#: memoized, and counted, on their own): one dict lookup a batch and step
PROBE_PARTS = "probe_parts"


def match_trace(batches: list, codes) -> list:
    """:func:`~dbsp.trace.batch.match_batches` of a join's trace, in one native call over the
    spine (:func:`~dbsp.algebra.kernels.intersect_batches`) when every batch is in memory: a
    batch costs no Python call of its own, and one whose key range misses the probe's (an
    older batch of a trace whose keys grow with time) costs four binary searches.

    An in-memory batch of :data:`RANK_MIN_KEYS` keys or more is probed through its keys' rank
    directory (:meth:`~dbsp.trace.batch.OrdIndexedZSet.code_rank`) once a probe is dense enough
    to repay its making (:data:`RANK_PROBES`). That is the shard of a hash-sharded id key (every
    W-th id, at random) that the intersection's own dense case (every id of a range) no longer
    covers once there are two workers."""
    n = len(codes)
    if n == 0:
        return []
    parts = []
    u64 = Codes.is_u64(codes)
    for b in batches:
        if type(b) is not OrdIndexedZSet:
            # (file batches prefetch first, then read only the blocks of the probed keys)
            return _match_each(batches, codes, n, u64)
        memo = b.memo
        part = memo.get(PROBE_PARTS) if memo is not None else None
        if part is None:
            part = (b.kcodes, b.code_sample(), b.code_runs(), None)
            if b.memo is None:
                b.memo = {}
            b.memo[PROBE_PARTS] = part  # (its arrays: the batch's own, or memoized and counted)
        nk = len(part[0])
        if u64 and nk >= RANK_MIN_KEYS and (n * RANK_PROBES >= nk or "code_rank" in b.memo):
            part = part[:3] + (b.code_rank(),)
        parts.append(part)
    out = []
    for k, pi, ki in K.intersect_batches(codes, parts):
        b = batches[k]
        b.hits += len(pi)
        out.append((b, pi, ki))
    return out


def _match_each(batches: list, codes, n: int, u64: bool) -> list:
    """:func:`match_trace` batch by batch, for a spine with batches in layer files."""
    if n * RANK_PROBES < RANK_MIN_KEYS or any(b.is_file for b in batches) or not u64:
        # (no batch is probed densely enough; file batches prefetch first)
        return match_batches(batches, codes)
    out = []
    for b in batches:
        if type(b) is OrdIndexedZSet and b.num_keys >= RANK_MIN_KEYS and (
                n * RANK_PROBES >= b.num_keys or "code_rank" in (b.memo or ())):
            m = b.match(codes, True)
        else:
            m = b.match(codes)
        if m is not None:
            out.append(m)
    return out


#: a stored batch of fewer keys is not checked for :func:`unit_values` (its check, a pass over
#: its offsets and weights once, costs a few microseconds: more than a small batch's pairs
#: save). It is not about the cache: the general pair loop reads two offsets and a weight per
#: pair and multiplies with an overflow check, and took twice the time of the unit loop on
#: 4.5K pairs with a 7.2K-key batch (27 against 14 us). At 16K, the auction batches of two
#: workers (half the keys of one worker's) fell under the bound where one worker's did not:
#: a cost of the second worker, per row
UNIT_MIN_KEYS = 1 << 12


def unit_values(b: OrdIndexedZSet) -> bool:
    """Whether every key of ``b`` holds one value of weight 1 (a primary key's index of
    inserts), worked out once per (immutable) batch and kept in its ``memo``; False for a batch
    of fewer than :data:`UNIT_MIN_KEYS` keys (not checked)."""
    if b.num_keys < UNIT_MIN_KEYS:
        return False
    return memoized(b, "unit_values", lambda: bool(
        b.num_keys == len(b) and K.is_identity(b.offsets[:-1]) and (b.weights == 1).all()))


def join_matched(x: OrdIndexedZSet, ai: np.ndarray, y: OrdIndexedZSet, bi: np.ndarray,
                 stored: str = ""):
    """:func:`join_pairs` for keys already matched: key ``ai[m]`` of ``x`` equals key ``bi[m]``
    of ``y`` (both ascending). ``stored`` (``"x"`` or ``"y"``): the side that is a batch of a
    trace; when each of its keys holds one value of weight 1 its offsets and weights are not
    read (two cache misses per pair on a batch of millions of keys)."""
    # one native pass (arguments by position: keywords cost a parse per call)
    kidx, xs, ys, w, over = K.join_matched_pairs(
        x.offsets, ai, y.offsets, bi, x.weights, y.weights, stored == "x" and unit_values(x),
        stored == "y" and unit_values(y))
    if over is not None:  # a joined pair's weight would wrap: an error naming the key
        i = int(np.argmax(over))
        key = x.keys.slice(int(kidx[i]), 1).to_pylist()[0]
        raise RowError("join", f"the weight of a joined pair would be "
                               f"{int(x.weights[xs[i]]) * int(y.weights[ys[i]])}, out of the "
                               f"int64 range of weights", key)
    return kidx, xs, ys, w


def _describe(s: pa.Schema) -> str:
    return "(" + ", ".join(f"{f.name}: {f.type}{'' if f.nullable else ' not null'}"
                           for f in s) + ")"


def _check_indexed(stream, what: str, side: str) -> None:
    if not isinstance(stream.type, IndexedType):
        raise TypeError(f"{what}: the {side} input must be an indexed stream (use "
                        f".index_by([...]) first), got {stream.type.describe()}")


def check_keys(left, right, what: str) -> None:
    """Same number and types of key columns (names and nullability may differ)."""
    _check_indexed(left, what, "left")
    _check_indexed(right, what, "right")
    lk, rk = left.key_schema, right.key_schema
    if len(lk) != len(rk) or any(a.type != b.type for a, b in zip(lk, rk)):
        raise TypeError(f"{what}: the key schemas differ: left key {_describe(lk)}, right key "
                        f"{_describe(rk)}; both sides must have the same key column types "
                        f"(cast or map one side first)")


class RecodeKeysOperator(Operator):
    """Re-encode the keys of indexed batches for a key schema that differs only in nullability
    (adding a null flag to non-null keys keeps their order, so batches stay sorted)."""

    name = "recode_keys"

    def __init__(self, ctx, key_schema: pa.Schema, val_schema: pa.Schema):
        super().__init__(ctx)
        self.key_schema, self.val_schema = key_schema, val_schema
        self.codec = KeyCodec(list(key_schema))

    def eval(self, ix: OrdIndexedZSet) -> OrdIndexedZSet:
        if ix.num_keys == 0:
            return OrdIndexedZSet.empty(self.key_schema, self.val_schema)
        keys = pa.RecordBatch.from_arrays(ix.keys.columns, schema=self.key_schema)
        return OrdIndexedZSet(keys, self.codec.encode(keys.columns, keys.num_rows), ix.offsets,
                              ix.vals, ix.vcodes, ix.weights, self.codec, ix.vcodec)


def _common_keys(left, right):
    """Streams whose key codes are comparable: when nullability differs, both get nullable keys."""
    lk, rk = left.key_schema, right.key_schema
    if all(a.nullable == b.nullable for a, b in zip(lk, rk)):
        return left, right
    return _recode(left, lk, rk), _recode(right, rk, lk)


def _recode(stream, ks: pa.Schema, other: pa.Schema):
    target = pa.schema([f.with_nullable(f.nullable or g.nullable) for f, g in zip(ks, other)])
    if target == ks:
        return stream
    vs = stream.val_schema
    out = stream.circuit.add_node("recode_keys",
                                  lambda ctx: RecodeKeysOperator(ctx, target, vs),
                                  [stream], IndexedType(target, vs))
    stream.circuit.nodes[out.node].info["recode_keys"] = True
    return out


def prepare(left, right, what: str):
    """Check, align key encodings and shard both sides of a join."""
    check_keys(left, right, what)
    if left.circuit is not right.circuit:
        raise ValueError(f"{what}: the two streams belong to different circuits")
    left, right = _common_keys(left, right)
    return sharded(left), sharded(right)


def pair_schema(lk: pa.Schema, lv: pa.Schema, rv: pa.Schema,
                nullable_right: bool = False) -> pa.Schema:
    """``key ++ left values ++ right values``; clashing right names get ``_right``."""
    used = set(lk.names) | set(lv.names)
    fields = list(lk) + list(lv)
    for f in rv:
        name = f.name
        while name in used:
            name += "_right"
        used.add(name)
        fields.append(pa.field(name, f.type, nullable=True if nullable_right else f.nullable))
    return pa.schema(fields)


# -- watermark GC ---------------------------------------------------------------------------

class KeyBounds:
    """Cuts traces below a watermark's key prefix, once per rise of the watermark."""

    def __init__(self, key_schema: pa.Schema):
        self.kcodec = KeyCodec(list(key_schema))
        self.last: dict[int, int] = {}  # id(spine) -> watermark it was last cut at

    def cut(self, spine: Spine, wm: Optional[int]) -> None:
        if wm is None:
            return
        prev = self.last.get(id(spine))
        if prev is not None and wm <= prev:
            return
        self.last[id(spine)] = wm
        spine.truncate_keys_below(key_prefix_bound(self.kcodec, wm))


class ValueBound:
    """Band GC of one trace: rows whose value column ``col`` is below a watermark are dropped by
    the trace's merges (the filter is replaced once per rise of the watermark), and after every
    step a stored batch whose every value is below it is dropped at once (its column's largest
    value is computed once per batch and kept in the batch's ``memo``: a step costs a comparison
    per stored batch, not a scan).

    The filter lags one step: after step ``s`` it drops rows below ``wm[s-1]``, the bound every
    row of step ``s`` already obeys. Merges may apply it at once, outside the step's journal, so
    a rolled-back step ``s`` that is replayed still finds every row its on-time rows (at or above
    ``wm[s-1]``) can meet in the band. A checkpoint saves ``seen`` (:meth:`JoinOperator.
    checkpoint_state`): the recovered operator puts the same filter in place after its first
    step as the operator that never stopped, not one step later."""

    def __init__(self, col: int):
        self.col = col
        self.last: Optional[int] = None  # the bound of the filter in place
        self.seen: Optional[int] = None  # the watermark of the last step
        self._fns: Optional[tuple] = None  # (bound, keep, dead) of the filter in place

    def cut(self, spine: Spine, wm: Optional[int]) -> None:
        bound, self.seen = self.seen, wm if self.seen is None or (wm is not None and
                                                                  wm > self.seen) else self.seen
        if bound is not None and (self.last is None or bound > self.last):
            self.last = bound
        if self.last is None:
            return
        if self._fns is None or self._fns[0] != self.last:
            self._fns = (self.last, *self._filter(self.last))
        # every step, not only when the bound rises: a batch inserted behind the bound (a
        # right row that expired before it arrived) goes at once too
        spine.retain_values(*self._fns[1:])

    def _filter(self, bound: int) -> tuple:
        """``(keep, dead)`` of :meth:`Spine.retain_values` for rows at or above ``bound``."""
        col = self.col
        key = ("band_max", col)

        def keep(batch) -> np.ndarray:
            v = physical_int(batch.vals.column(col))
            if not v.null_count:
                return np.asarray(v.to_numpy(zero_copy_only=False)) >= bound
            return np.asarray(pc.fill_null(pc.greater_equal(v, bound), False), dtype=bool)

        def dead(batch) -> bool:
            top = memoized(batch, key, lambda: _column_max(batch, col))
            return top is None or top < bound  # None: every value null (keep drops nulls too)
        return keep, dead


def _column_max(batch, col: int) -> Optional[int]:
    """The largest value of value column ``col`` of an indexed batch as an int (None: no value
    that is not null); a batch in a file is read piece by piece, never whole."""
    pieces = batch.iter_pieces(1 << 16, copy=False) if batch.is_file else (batch,)
    tops = [pc.max(physical_int(p.vals.column(col))).as_py() for p in pieces]
    tops = [t for t in tops if t is not None]
    return max(tops) if tops else None


def _check_band(a, b, band, what: str) -> tuple:
    """``((left col index, right watermark) | None, (right col index, left watermark) | None)``
    of a join's ``band=`` option, checked against the sides' value columns."""
    if band is None:
        return None
    if len(band) != 2:
        raise ValueError(f"{what}: band must be (left, right), each None or (column, watermark)")
    out = []
    for side, other, s, spec in (("left", "right", a, band[0]), ("right", "left", b, band[1])):
        if spec is None:
            out.append(None)
            continue
        name, wm = spec
        vs = s.val_schema
        if name not in vs.names:
            raise KeyError(f"{what}: band: no {side} value column {name!r} (value columns: "
                           f"{vs.names}; a key column cannot bound the band)")
        t = vs.field(name).type
        if wm is None or not isinstance(wm.type, WatermarkType) or wm.type.time_type != t:
            got = "None" if wm is None else wm.type.describe()
            raise TypeError(f"{what}: band: the {side} column {name!r} is {t}, but the {other} "
                            f"watermark it is compared with is {got}")
        out.append((vs.get_field_index(name), wm))
    return tuple(out) if any(out) else None


def _check_gc(a, b, watermarks, what: str) -> tuple:
    """The watermark streams of a join's sides, checked against its leading key column."""
    if watermarks is None:
        return ()
    lw, rw = watermarks
    kt = a.key_schema.field(0).type
    for side, w in (("left", lw), ("right", rw)):
        if w is None:
            raise ValueError(f"{what}: watermark GC needs the watermarks of both sides")
        if not isinstance(w.type, WatermarkType) or w.type.time_type != kt:
            raise TypeError(f"{what}: the {side} watermark ({w.type.describe()}) is not of the "
                            f"leading key column's type {kt}")
    return lw, rw


# -- the join operator ----------------------------------------------------------------------

class JoinOperator(Operator):
    """``Δa ⋈ I(b) + z^-1(I(a)) ⋈ Δb`` on sharded indexed streams.

    ``mode``: ``"pairs"`` (``key ++ lv ++ rv``), ``"left"`` (``key ++ lv``: the semijoin, whose
    right side is a key set of weight 1) or ``"fn"`` (``fn(keys, lv, rv)``).
    """

    state_attrs = ('left', 'right')

    name = "join"
    passes_empty = True  # two empty deltas: nothing joined, nothing inserted

    def __init__(self, ctx, out_schema: pa.Schema, mode: str, fn: Optional[Callable] = None,
                 key_schema: Optional[pa.Schema] = None, lval: Optional[pa.Schema] = None,
                 rval: Optional[pa.Schema] = None, key_gc: bool = True,
                 band: tuple = (None, None)):
        super().__init__(ctx)
        self.out_schema, self.mode, self.fn = out_schema, mode, fn
        self.key_schema, self.lval, self.rval = key_schema, lval, rval
        self.left = Spine(name="join.left")
        self.right = Spine(name="join.right")
        self.bounds = KeyBounds(key_schema) if key_schema is not None and key_gc else None
        # band GC: per side, the value column index bounded by the other side's watermark
        self.band = tuple(None if c is None else ValueBound(c) for c in band)
        #: whether a key may hold a null (both sides' keys have the same nullability, see
        #: _common_keys): when none may, no delta is searched for null keys
        self._null_keys = key_schema is None or any(f.nullable for f in key_schema)

    def eval(self, da: OrdIndexedZSet, db: OrdIndexedZSet, *wms: Optional[int]) -> ZSet:
        out = self._eval(da, db)
        if self.bounds is not None:
            # watermark GC: a side's rows only ever meet the other side's new rows, whose keys
            # start at or above the other side's watermark
            lwm, rwm = wms[0], wms[1]
            wms = wms[2:]
            self.bounds.cut(self.left, rwm)
            self.bounds.cut(self.right, lwm)
        it = iter(wms)  # band GC: one watermark per bounded side, left first
        for spine, vb in zip((self.left, self.right), self.band):
            if vb is not None:
                vb.cut(spine, next(it))
        return out

    def _eval(self, da: OrdIndexedZSet, db: OrdIndexedZSet) -> ZSet:
        if self._null_keys:
            da, db = drop_null_keys(da), drop_null_keys(db)
        pieces = []
        n_left = 0  # pieces[:n_left]: x a stored batch of the left trace; after them y stored
        if len(db):
            # z^-1(I(a)) ⋈ Δb: each stored batch is probed with Δb's keys (batch-probe
            # interface: file batches read only the blocks of those keys, all prefetched first)
            for sub, pi, ki in match_trace(self.left.batches(), db.kcodes):
                pieces.append((sub, db, join_matched(sub, ki, db, pi, "x")))
            n_left = len(pieces)
            self.right.insert(db)
        if len(da):
            for sub, pi, ki in match_trace(self.right.batches(), da.kcodes):  # Δa ⋈ I(b)
                pieces.append((da, sub, join_matched(da, pi, sub, ki, "y")))
            self.left.insert(da)
        return self._build(pieces, n_left, da, db)

    def _build(self, pieces, n_left: int = -1, da: Optional[OrdIndexedZSet] = None,
               db: Optional[OrdIndexedZSet] = None) -> ZSet:
        """The output of the matched pairs of ``pieces``, ``(x, y, join_matched(...))`` each.
        ``n_left``: the first ``n_left`` pieces' ``x`` and the others' ``y`` are stored batches
        of a trace, the others the deltas going into the traces this step (their columns are
        exported once and kept: see :func:`~dbsp.trace.batch.exported`): ``db``, the ``y`` of
        the first ``n_left`` pieces, and ``da``, the ``x`` of the others (each needed when it
        has a piece); -1: none is known to be."""
        if not pieces:
            return ZSet.empty(self.out_schema)
        if self.mode not in ("left", "fn"):
            # keys, left and right values of every matched pair gathered into the output in one
            # native pass (one export per batch met, a stored batch's kept from step to step;
            # one import: no pyarrow object per column and piece, no concat); None when a
            # column is not fixed-width without nulls
            if n_left < 0:
                ks = [(x.keys, p[0]) for x, _, p in pieces]
                lv = [(x.vals, p[1]) for x, _, p in pieces]
                rv = [(y.vals, p[2]) for _, y, p in pieces]
            else:
                # the deltas too, each looked up once (Δb is the y of the first n_left pieces,
                # Δa the x of the others): each goes into its trace this step, and the index
                # that built it handed out its exports for free
                dl = exported(da, "keys") if n_left < len(pieces) else None
                dlv = exported(da, "vals") if n_left < len(pieces) else None
                drv = exported(db, "vals") if n_left > 0 else None
                ks = [(exported(x, "keys") if i < n_left else dl, p[0])
                      for i, (x, _, p) in enumerate(pieces)]
                lv = [(exported(x, "vals") if i < n_left else dlv, p[1])
                      for i, (x, _, p) in enumerate(pieces)]
                rv = [(drv if i < n_left else exported(y, "vals"), p[2])
                      for i, (_, y, p) in enumerate(pieces)]
            out = K.take_batch_runs(self.out_schema, [ks, lv, rv])
            if out is not None:
                ws = [p[3] for _, _, p in pieces]
                return ZSet(out, ws[0] if len(ws) == 1 else np.concatenate(ws))
        # the delta side is one batch for every stored batch it met: one take over the
        # concatenated indices instead of a take per piece and a concat
        ws = [p[3] for _, _, p in pieces]
        w = ws[0] if len(ws) == 1 else np.concatenate(ws)
        keys = _gather_runs([(x.keys, p[0]) for x, _, p in pieces])
        lvals = _gather_runs([(x.vals, p[1]) for x, _, p in pieces])
        if not lvals.num_columns:
            lvals = zero_column_batch(len(w))
        if self.mode == "left":
            cols = list(keys.columns) + list(lvals.columns)
            return ZSet(pa.RecordBatch.from_arrays(cols, schema=self.out_schema), w)
        rvals = _gather_runs([(y.vals, p[2]) for _, y, p in pieces])
        if not rvals.num_columns:
            rvals = zero_column_batch(len(w))
        if self.mode == "fn":
            keys = _rename(keys, self.key_schema)
            lvals, rvals = _rename(lvals, self.lval), _rename(rvals, self.rval)
            out = to_record_batch(self.fn(keys, lvals, rvals), self.out_schema, "join function")
            if out.num_rows != len(w):
                raise ValueError(f"join function returned {out.num_rows} rows for {len(w)} "
                                 f"matched pairs")
            return ZSet(out, w)
        cols = list(keys.columns) + list(lvals.columns) + list(rvals.columns)
        return ZSet(pa.RecordBatch.from_arrays(cols, schema=self.out_schema), w)

    def savepoint(self):
        # band GC: the watermarks a rolled-back step saw must not bound the filters after it
        return tuple(None if vb is None else (vb.last, vb.seen) for vb in self.band) \
            if any(self.band) else None

    def restore(self, saved) -> None:
        if saved is not None:
            for vb, sv in zip(self.band, saved):
                if vb is not None:
                    vb.last, vb.seen = sv

    def checkpoint_state(self) -> dict:
        out = super().checkpoint_state()
        # band GC: the last watermark each filter saw, so that the recovered filter rises
        # after its first step (from the restored watermark), as it would have without the stop
        for side, vb in zip(("left", "right"), self.band):
            if vb is not None:
                out[f"band_{side}"] = int(vb.seen) if isinstance(vb.seen, np.integer) \
                    else vb.seen
        return out

    def restore_state(self, state: dict) -> None:
        state = dict(state)
        seen = {side: state.pop(f"band_{side}", None) for side in ("left", "right")}
        super().restore_state(state)  # (a checkpoint of before the band was saved: None)
        for side, vb in zip(("left", "right"), self.band):
            if vb is not None:
                vb.seen, vb.last = seen[side], None

    def clock_start(self) -> None:
        self.left.clear()
        self.right.clear()

    def state_rows(self) -> int:
        return len(self.left) + len(self.right)


def _gather_runs(parts: list) -> pa.RecordBatch:
    """The rows ``idx`` of each ``(batch, idx)`` pair one after another, in one batch: gathered
    straight from the batches met (:func:`take_batches`), without a taken copy of each run and
    a concatenation of those."""
    if len(parts) == 1 or all(p[0] is parts[0][0] for p in parts):
        return _take_runs(parts)[0]
    batches: list = []
    start: dict = {}
    at = 0
    for b, _ in parts:
        if id(b) not in start:
            start[id(b)] = at
            batches.append(b)
            at += b.num_rows
    idx = np.concatenate([np.asarray(i, dtype=np.int64) + start[id(b)] for b, i in parts])
    return take_batches(parts[0][0].schema, batches, idx)


def _take_runs(parts: list) -> list:
    """``take(batch, idx)`` for ``(batch, idx)`` pairs, one take per run of pairs on the same
    batch (their indices concatenated, so the rows keep their order)."""
    out, i, n = [], 0, len(parts)
    while i < n:
        b, j = parts[i][0], i + 1
        while j < n and parts[j][0] is b:
            j += 1
        idx = parts[i][1] if j == i + 1 else np.concatenate([p[1] for p in parts[i:j]])
        out.append(take(b, idx))
        i = j
    return out


def _rename(batch: pa.RecordBatch, schema: Optional[pa.Schema]) -> pa.RecordBatch:
    if schema is None or batch.schema == schema:
        return batch
    if not schema.names:
        return batch
    return pa.RecordBatch.from_arrays(batch.columns, schema=schema)


def _fn_schema(fn: Callable, schema: Any, k: pa.Schema, lv: pa.Schema, rv: pa.Schema) -> pa.Schema:
    if schema is not None:
        return as_schema(schema)
    out = to_record_batch(fn(empty_batch(k), empty_batch(lv), empty_batch(rv)), None,
                          "join function")
    return as_schema(out.schema)


def _join_node(a, b, out_schema: pa.Schema, mode: str, fn=None, rval=None, wms=(), band=None):
    key, lval = a.key_schema, a.val_schema
    rval = rval if rval is not None else b.val_schema
    key_gc = bool(wms)
    cols = (None, None) if band is None else tuple(None if s is None else s[0] for s in band)
    bwms = [] if band is None else [s[1] for s in band if s is not None]
    return a.circuit.add_node(
        f"join({mode})", lambda ctx: JoinOperator(ctx, out_schema, mode, fn, key, lval, rval,
                                                  key_gc, cols),
        [a, b, *wms, *bwms], ZSetType(out_schema))


def join(left, right, fn: Optional[Callable] = None, schema: Any = None, watermarks=None,
         band=None):
    """Incremental inner join of two indexed streams on their keys (see the module doc;
    ``watermarks``: ``(left, right)`` watermark streams of the leading key column, for GC;
    ``band``: ``(left, right)``, each None or ``(value column, other side's watermark)``, for
    band GC)."""
    a, b = prepare(left, right, "join")
    wms = _check_gc(a, b, watermarks, "join")
    bd = _check_band(a, b, band, "join")
    if fn is None:
        out = pair_schema(a.key_schema, a.val_schema, b.val_schema)
        return _join_node(a, b, out, "pairs", wms=wms, band=bd)
    out = _fn_schema(fn, schema, left.key_schema, left.val_schema, right.val_schema)
    return _join_node(a, b, out, "fn", fn, right.val_schema, wms=wms, band=bd)


# -- key sets: distinct(keys(b)) --------------------------------------------------------------

class KeySetOperator(Operator):
    """``distinct(keys(b))`` as an indexed stream ``key -> ()`` of weight ±1 changes; keys with a
    null column are left out (they match nothing)."""

    state_attrs = ('trace',)

    name = "distinct_keys"

    def __init__(self, ctx, key_schema: pa.Schema):
        super().__init__(ctx)
        self.key_schema = key_schema
        self.trace = Spine(name="distinct_keys")
        self.bounds = KeyBounds(key_schema)

    def eval(self, db: OrdIndexedZSet, wm: Optional[int] = None) -> OrdIndexedZSet:
        out = self._eval(db)
        self.bounds.cut(self.trace, wm)  # no new row of this side has a key below its watermark
        return out

    def _eval(self, db: OrdIndexedZSet) -> OrdIndexedZSet:
        db = drop_null_keys(db)
        if len(db) == 0:
            return OrdIndexedZSet.empty(self.key_schema, EMPTY_SCHEMA)
        kw = np.add.reduceat(db.weights, db.offsets[:-1])
        nz = np.flatnonzero(kw)
        if len(nz) == 0:
            return OrdIndexedZSet.empty(self.key_schema, EMPTY_SCHEMA)
        keys, codes, kw = take(db.keys, nz), K.take(db.kcodes, nz), kw[nz]
        old = self.trace.weights_of(codes)
        w = sign_changes(old, kw)
        self.trace.insert(OrdZSet(keys, kw, codes, db.kcodec))
        keep = np.flatnonzero(w)
        n = len(keep)
        if n == 0:
            return OrdIndexedZSet.empty(self.key_schema, EMPTY_SCHEMA)
        vcodec = KeyCodec([])
        return OrdIndexedZSet(take(keys, keep), K.take(codes, keep), np.arange(n + 1, dtype=np.int64),
                              zero_column_batch(n), np.zeros(n, np.uint64), w[keep], db.kcodec,
                              vcodec)

    def clock_start(self) -> None:
        self.trace.clear()

    def state_rows(self) -> int:
        return len(self.trace)


def _key_set(b, wm=None):
    ks = b.key_schema
    return b.circuit.add_node("distinct_keys", lambda ctx: KeySetOperator(ctx, ks),
                              [b] if wm is None else [b, wm], IndexedType(ks, EMPTY_SCHEMA))


def _semijoin_sharded(a, b, wms=()):
    return _join_node(a, _key_set(b, wms[1] if wms else None), a.type.flat_schema, "left",
                      wms=wms)


def semijoin(left, right, watermarks=None):
    """Rows ``key ++ left values`` of ``left`` whose key has rows of positive total weight on the
    right, with the left weights: ``a ⋈ distinct(keys(b))`` (``watermarks``: as for
    :func:`join`)."""
    a, b = prepare(left, right, "semijoin")
    return _semijoin_sharded(a, b, _check_gc(a, b, watermarks, "semijoin"))


def antijoin(left, right, watermarks=None):
    """Rows ``key ++ left values`` of ``left`` whose key is absent on the right:
    ``a - semijoin(a, b)`` (``watermarks``: as for :func:`join`)."""
    a, b = prepare(left, right, "antijoin")
    return a.flatten().minus(_semijoin_sharded(a, b, _check_gc(a, b, watermarks, "antijoin")))


# -- left outer join --------------------------------------------------------------------------

class PadNullsOperator(Operator):
    """Append all-null columns (the right side of unmatched left rows)."""

    name = "pad_nulls"

    def __init__(self, ctx, out_schema: pa.Schema, n_null: int):
        super().__init__(ctx)
        self.out_schema, self.n_null = out_schema, n_null

    def eval(self, z: ZSet) -> ZSet:
        n = len(z)
        nulls = [pa.nulls(n, f.type) for f in list(self.out_schema)[len(self.out_schema) - self.n_null:]]
        return ZSet(pa.RecordBatch.from_arrays(list(z.data.columns) + nulls,
                                               schema=self.out_schema), z.weights)


class SplitApplyOperator(Operator):
    """Apply ``fn(keys, lvals, rvals)`` to rows ``key ++ lv ++ rv`` (split by position)."""

    name = "join_fn"

    def __init__(self, ctx, fn, schemas, out_schema: pa.Schema):
        super().__init__(ctx)
        self.fn, self.schemas, self.out_schema = fn, schemas, out_schema

    def eval(self, z: ZSet) -> ZSet:
        if len(z) == 0:
            return ZSet.empty(self.out_schema)
        cols, parts, i = z.data.columns, [], 0
        for s in self.schemas:
            part = cols[i:i + len(s)]
            parts.append(pa.RecordBatch.from_arrays(part, schema=s) if part
                         else zero_column_batch(len(z)))
            i += len(s)
        out = to_record_batch(self.fn(*parts), self.out_schema, "left_join function")
        if out.num_rows != len(z):
            raise ValueError(f"left_join function returned {out.num_rows} rows for {len(z)}")
        return ZSet(out, z.weights)


def left_join(left, right, fn: Optional[Callable] = None, schema: Any = None, watermarks=None):
    """Left outer join: ``a ⋈ b + pad_null(antijoin(a, b))`` (see the module doc); the right
    columns are nullable in the output (``watermarks``: as for :func:`join`)."""
    a, b = prepare(left, right, "left_join")
    wms = _check_gc(a, b, watermarks, "left_join")
    flat = pair_schema(a.key_schema, a.val_schema, b.val_schema, nullable_right=True)
    inner = _join_node(a, b, flat, "pairs", wms=wms)
    anti = a.flatten().minus(_semijoin_sharded(a, b, wms))
    n_null = len(b.val_schema)
    padded = a.circuit.add_node("pad_nulls", lambda ctx: PadNullsOperator(ctx, flat, n_null),
                                [anti], ZSetType(flat))
    res = inner.plus(padded)
    if fn is None:
        return res
    rv = pa.schema([f.with_nullable(True) for f in right.val_schema])
    schemas = [left.key_schema, left.val_schema, rv]
    out = _fn_schema(fn, schema, *schemas)
    return res.circuit.add_node("left_join_fn",
                                lambda ctx: SplitApplyOperator(ctx, fn, schemas, out),
                                [res], ZSetType(out))


__all__ = ["join", "left_join", "semijoin", "antijoin", "JoinOperator", "KeySetOperator",
           "KeyBounds",
           "sharded", "prepare", "pair_schema", "join_pairs", "join_matched", "drop_null_keys",
           "check_keys"]
