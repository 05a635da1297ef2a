"""Timed batches: Z-sets whose every weight carries a time, for the state of nested circuits.

Inside a recursive (nested) circuit a trace must remember *when* (at which iteration of the
inner loop) each change happened, so the innermost layer holds ``(time, weight)`` pairs instead
of a bare weight. These are the storage design's two remaining batch types, beside
:class:`~dbsp.trace.batch.OrdZSet` and :class:`~dbsp.trace.batch.OrdIndexedZSet`:

* :class:`OrdKeyBatch` = ``OrderedLayer(K) -> ColumnLayer(T, R)``: keys, and for key ``i`` the
  rows ``offsets[i]:offsets[i+1]`` of ``times`` / ``weights``.
* :class:`OrdValBatch` = ``OrderedLayer(K) -> OrderedLayer(V) -> ColumnLayer(T, R)``: keys; the
  values of key ``i`` are ``key_offsets[i]:key_offsets[i+1]`` of ``vals`` / ``vcodes``; the times
  of value ``j`` are rows ``val_offsets[j]:val_offsets[j+1]`` of ``times`` / ``weights``.

Times are int64 (a nested-iteration counter; the order is the integers'). Both batches are
consolidated by ``(key, [value,] time)``: ascending, each triple once, no zero weight, no empty
key or value. :meth:`merge` is one k-way merge (``K.merge_consolidate`` over flattened rows whose
second code packs ``(value code, time)``); :meth:`advance_times` is differential dataflow's
compaction for a totally ordered time: every time below the frontier becomes the frontier (the
batch can no longer tell those times apart, and need not, since no reader asks about times before
the frontier), then equal ``(key, value, time)`` rows are summed; :meth:`to_untimed` sums over
times. Like the other batches these are immutable: every operation returns a new batch.

:class:`TimedTrace` is the *trace* of timed rows a nested incremental operator keeps
(:mod:`dbsp.operators.nested`): every change it has seen, indexed by ``(outer step, inner
iteration)`` with the outer steps already summed (consolidated) and the inner iteration kept.
It stores the ``K -> V -> T`` layout of :class:`OrdValBatch` flattened into the value layer of an
ordinary :class:`~dbsp.trace.spine.Spine` of :class:`OrdIndexedZSet` (the value row is
``value ++ (time,)``, so rows sort by ``(key, value, time)`` exactly as in an ``OrdValBatch``).
Keeping it in a spine gives the timed state everything the untimed state has: LSM merges in the
background, spilling to layer files, the step journal (rollback) and checkpoints.
:meth:`TimedTrace.probe` returns a key's timed rows; :func:`at_times` keeps the rows whose time
passes a test and drops the time column (a loose indexed batch, what a join needs).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import CodeArray, Codes, KeyCodec, VarCodes, codec_for
from ..algebra.schema import concat_batches, empty_batch, take
from .batch import EMPTY_I64, OrdIndexedZSet, OrdZSet, ZSet, ranges
from .cursor import OrdKeyBatchCursor, OrdValBatchCursor
from .spine import Spine

__all__ = ["OrdKeyBatch", "OrdValBatch", "TimedTrace", "at_times", "time_codes", "pack_codes",
           "TIME"]

_SIGN = np.uint64(1 << 63)


def time_codes(times: np.ndarray) -> np.ndarray:
    """Order-preserving u64 codes of int64 times (the sign bit flipped)."""
    return np.asarray(times, dtype=np.int64).view(np.uint64) ^ _SIGN


def pack_codes(*parts: CodeArray) -> VarCodes:
    """Per row, the concatenation of the rows of ``parts`` (u64 codes as 8 big-endian bytes).

    Every part is fixed-width or prefix-free, so the packed codes compare like the tuples."""
    n = len(parts[0])
    lens = [Codes.row_lengths(p) for p in parts]
    total = np.sum(lens, axis=0) if n else EMPTY_I64
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(total, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    pos = offsets[:-1].copy()
    for p, ln in zip(parts, lens):
        if Codes.is_u64(p):
            be = np.ascontiguousarray(p, dtype=np.uint64).astype(">u8").view(np.uint8)
            dst = (pos[:, None] + np.arange(8, dtype=np.int64)).ravel()
            data[dst] = be
        else:
            data[ranges(pos, ln)] = p.data[ranges(p.offsets[:-1], ln)]
        pos += ln
    return VarCodes(offsets, data)


def _codec_for(schema: pa.Schema) -> KeyCodec:
    """The (cached) codec of all of ``schema``'s columns."""
    return codec_for(schema)


def _bounds(*codes: CodeArray) -> np.ndarray:
    """Offsets (g+1) of the runs of equal rows of the row-aligned, sorted code arrays."""
    n = len(codes[0])
    if n == 0:
        return np.zeros(1, np.int64)
    if len(codes) == 1:
        return K.group_bounds(codes[0])
    if all(Codes.is_u64(c) for c in codes):
        change = np.zeros(n - 1, bool)
        for c in codes:
            change |= c[1:] != c[:-1]
        return np.concatenate([[0], np.flatnonzero(change) + 1, [n]]).astype(np.int64)
    return K.group_bounds(pack_codes(*codes))


def _starts_where_equal(*ids: np.ndarray) -> np.ndarray:
    """Start rows of the runs of equal ``ids`` tuples (the arrays are row-aligned)."""
    n = len(ids[0])
    if n == 0:
        return EMPTY_I64
    change = np.zeros(n - 1, bool)
    for a in ids:
        change |= a[1:] != a[:-1]
    return np.concatenate([[0], np.flatnonzero(change) + 1]).astype(np.int64)


def _reduce(w: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.add.reduceat(w, starts) if len(starts) else EMPTY_I64


def _offsets_from_owner(owner: np.ndarray, n_owner: int) -> np.ndarray:
    """Offsets of sorted ``owner`` ids (each owner in 0..n_owner-1, all present or not)."""
    return np.searchsorted(owner, np.arange(n_owner + 1), side="left").astype(np.int64)


# --- OrdKeyBatch ------------------------------------------------------------------------------

class OrdKeyBatch:
    """``OrderedLayer(K) -> ColumnLayer(T, R)``: keys with ``(time, weight)`` lists."""

    __slots__ = ("keys", "kcodes", "offsets", "times", "weights", "kcodec")

    def __init__(self, keys: pa.RecordBatch, kcodes: CodeArray, offsets: np.ndarray,
                 times: np.ndarray, weights: np.ndarray, kcodec: KeyCodec):
        self.keys, self.kcodes, self.offsets = keys, kcodes, offsets
        self.times, self.weights, self.kcodec = times, weights, kcodec

    def cursor(self) -> OrdKeyBatchCursor:
        return OrdKeyBatchCursor(self)

    def __len__(self) -> int:
        """Number of ``(key, time)`` rows."""
        return len(self.weights)

    @property
    def num_keys(self) -> int:
        return self.keys.num_rows

    @property
    def key_schema(self) -> pa.Schema:
        return self.keys.schema

    def __repr__(self) -> str:
        return f"OrdKeyBatch({self.num_keys} keys, {len(self)} rows, key={self.keys.schema.names})"

    @classmethod
    def empty(cls, key_schema: pa.Schema) -> "OrdKeyBatch":
        kc = _codec_for(key_schema)
        return cls(empty_batch(key_schema), Codes.empty(kc.u64), np.zeros(1, np.int64),
                   EMPTY_I64, EMPTY_I64, kc)

    @classmethod
    def from_parts(cls, keys: pa.RecordBatch, times, weights=None,
                   kcodec: Optional[KeyCodec] = None,
                   kcodes: Optional[CodeArray] = None) -> "OrdKeyBatch":
        """Build from row-aligned keys, times and weights (any order, duplicates allowed)."""
        kcodec = kcodec or _codec_for(keys.schema)
        n = keys.num_rows
        if n == 0:
            return cls.empty(keys.schema)
        t = np.broadcast_to(np.asarray(times, np.int64), (n,)).copy()
        w = np.ones(n, np.int64) if weights is None else np.asarray(weights, np.int64)
        kcodes = kcodec.encode(keys.columns, n) if kcodes is None else kcodes
        perm, w = K.sort_consolidate(kcodes, time_codes(t), w)
        return cls._build(keys, kcodes, perm, t[perm], w, kcodec)

    @classmethod
    def _build(cls, keys_src: pa.RecordBatch, kcodes_src: CodeArray, rk: np.ndarray,
               times: np.ndarray, w: np.ndarray, kcodec: KeyCodec) -> "OrdKeyBatch":
        """From consolidated rows sorted by (key, time); ``rk[i]`` is row i's key in the sources."""
        if len(rk) == 0:
            return cls.empty(keys_src.schema)
        ks = K.take(kcodes_src, rk)
        kb = _bounds(ks)
        first = kb[:-1]
        return cls(take(keys_src, rk[first]), K.take(ks, first), kb, times, w, kcodec)

    @classmethod
    def from_zset(cls, z: ZSet, time: int) -> "OrdKeyBatch":
        """Every row of ``z`` (the key) at one time."""
        oz = OrdZSet.from_loose(z)
        n = len(oz)
        return cls(oz.data, oz.codes, np.arange(n + 1, dtype=np.int64),
                   np.full(n, time, np.int64), oz.weights, oz.codec)

    def key_index(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_keys, dtype=np.int64), np.diff(self.offsets))

    def neg(self) -> "OrdKeyBatch":
        return OrdKeyBatch(self.keys, self.kcodes, self.offsets, self.times, -self.weights,
                           self.kcodec)

    @staticmethod
    def merge(batches: Sequence["OrdKeyBatch"]) -> "OrdKeyBatch":
        """The sum of consolidated timed batches (one k-way merge over ``(key, time)``)."""
        batches = [b for b in batches if len(b)]
        if not batches:
            raise ValueError("merge of no non-empty batches")
        if len(batches) == 1:
            return batches[0]
        rks = [b.key_index() for b in batches]
        runs = [(K.take(b.kcodes, rk), time_codes(b.times), b.weights)
                for b, rk in zip(batches, rks)]
        gidx, w = K.merge_consolidate(runs)
        base = np.cumsum([0] + [b.num_keys for b in batches[:-1]])
        rk_cat = np.concatenate([rk + o for rk, o in zip(rks, base)])
        b0 = batches[0]
        keys = concat_batches(b0.key_schema, [b.keys for b in batches])
        kc = K.concat([b.kcodes for b in batches])
        t = np.concatenate([b.times for b in batches])
        return OrdKeyBatch._build(keys, kc, rk_cat[gidx], t[gidx], w, b0.kcodec)

    def advance_times(self, frontier: int) -> "OrdKeyBatch":
        """Every time below ``frontier`` becomes ``frontier``; equal ``(key, time)`` rows merge."""
        if len(self) == 0 or int(self.times.min()) >= frontier:
            return self
        t = np.maximum(self.times, np.int64(frontier))
        ki = self.key_index()
        starts = _starts_where_equal(ki, t)
        w = _reduce(self.weights, starts)
        keep = np.flatnonzero(w)
        rows = starts[keep]
        ki2 = ki[rows]
        kidx = np.unique(ki2)
        offsets = _offsets_from_owner(np.searchsorted(kidx, ki2), len(kidx))
        if len(kidx) == 0:
            return OrdKeyBatch.empty(self.key_schema)
        return OrdKeyBatch(take(self.keys, kidx), K.take(self.kcodes, kidx), offsets,
                           t[rows], w[keep], self.kcodec)

    def to_untimed(self) -> OrdZSet:
        """The Z-set of the keys, weights summed over times (zero sums dropped)."""
        if self.num_keys == 0:
            return OrdZSet.empty(self.key_schema)
        w = _reduce(self.weights, self.offsets[:-1])
        kidx = np.flatnonzero(w)
        return OrdZSet(take(self.keys, kidx), w[kidx], K.take(self.kcodes, kidx), self.kcodec)

    def to_dict(self) -> dict[tuple, int]:
        """``{(key tuple, time): weight}`` (for tests and the REPL)."""
        cols = [c.to_pylist() for c in self.keys.columns]
        ki = self.key_index().tolist()
        return {(tuple(c[k] for c in cols), t): w
                for k, t, w in zip(ki, self.times.tolist(), self.weights.tolist())}


# --- OrdValBatch ------------------------------------------------------------------------------

class OrdValBatch:
    """``OrderedLayer(K) -> OrderedLayer(V) -> ColumnLayer(T, R)`` (see the module doc)."""

    __slots__ = ("keys", "kcodes", "key_offsets", "vals", "vcodes", "val_offsets", "times",
                 "weights", "kcodec", "vcodec")

    def __init__(self, keys: pa.RecordBatch, kcodes: CodeArray, key_offsets: np.ndarray,
                 vals: pa.RecordBatch, vcodes: CodeArray, val_offsets: np.ndarray,
                 times: np.ndarray, weights: np.ndarray, kcodec: KeyCodec, vcodec: KeyCodec):
        self.keys, self.kcodes, self.key_offsets = keys, kcodes, key_offsets
        self.vals, self.vcodes, self.val_offsets = vals, vcodes, val_offsets
        self.times, self.weights = times, weights
        self.kcodec, self.vcodec = kcodec, vcodec

    def cursor(self) -> OrdValBatchCursor:
        return OrdValBatchCursor(self)

    def __len__(self) -> int:
        """Number of ``(key, value, time)`` rows."""
        return len(self.weights)

    @property
    def num_keys(self) -> int:
        return self.keys.num_rows

    @property
    def num_vals(self) -> int:
        """Number of distinct ``(key, value)`` pairs."""
        return self.vals.num_rows

    @property
    def key_schema(self) -> pa.Schema:
        return self.keys.schema

    @property
    def val_schema(self) -> pa.Schema:
        return self.vals.schema

    def __repr__(self) -> str:
        return (f"OrdValBatch({self.num_keys} keys, {self.num_vals} values, {len(self)} rows, "
                f"key={self.keys.schema.names}, val={self.vals.schema.names})")

    @classmethod
    def empty(cls, key_schema: pa.Schema, val_schema: pa.Schema) -> "OrdValBatch":
        kc, vc = _codec_for(key_schema), _codec_for(val_schema)
        return cls(empty_batch(key_schema), Codes.empty(kc.u64), np.zeros(1, np.int64),
                   empty_batch(val_schema), Codes.empty(vc.u64), np.zeros(1, np.int64),
                   EMPTY_I64, EMPTY_I64, kc, vc)

    @classmethod
    def from_parts(cls, keys: pa.RecordBatch, vals: pa.RecordBatch, times, weights=None,
                   kcodec: Optional[KeyCodec] = None, vcodec: Optional[KeyCodec] = None
                   ) -> "OrdValBatch":
        """Build from row-aligned keys, values, times and weights (any order, duplicates ok)."""
        kcodec = kcodec or _codec_for(keys.schema)
        vcodec = vcodec or _codec_for(vals.schema)
        n = keys.num_rows
        if n == 0:
            return cls.empty(keys.schema, vals.schema)
        t = np.broadcast_to(np.asarray(times, np.int64), (n,)).copy()
        w = np.ones(n, np.int64) if weights is None else np.asarray(weights, np.int64)
        kcodes = kcodec.encode(keys.columns, n)
        vcodes = vcodec.encode(vals.columns, n)
        perm, w = K.sort_consolidate(kcodes, pack_codes(vcodes, time_codes(t)), w)
        return cls._build(keys, kcodes, perm, vals, vcodes, perm, t[perm], w, kcodec, vcodec)

    @classmethod
    def _build(cls, keys_src, kcodes_src, rk, vals_src, vcodes_src, rv, times, w,
               kcodec, vcodec) -> "OrdValBatch":
        """From consolidated rows sorted by (key, value, time); ``rk[i]`` / ``rv[i]`` are row i's
        key / value in the sources."""
        if len(rk) == 0:
            return cls.empty(keys_src.schema, vals_src.schema)
        ks = K.take(kcodes_src, rk)
        vs = K.take(vcodes_src, rv)
        vb = _bounds(ks, vs)             # row offsets of the (key, value) groups
        kb = _bounds(ks)                 # row offsets of the key groups
        key_offsets = np.searchsorted(vb, kb).astype(np.int64)
        kfirst, vfirst = kb[:-1], vb[:-1]
        return cls(take(keys_src, rk[kfirst]), K.take(ks, kfirst), key_offsets,
                   take(vals_src, rv[vfirst]), K.take(vs, vfirst), vb, times, w, kcodec, vcodec)

    @classmethod
    def from_indexed(cls, z: OrdIndexedZSet, time: int) -> "OrdValBatch":
        """Every row of ``z`` at one time."""
        n = len(z)
        return cls(z.keys, z.kcodes, z.offsets, z.vals, z.vcodes,
                   np.arange(n + 1, dtype=np.int64), np.full(n, time, np.int64), z.weights,
                   z.kcodec, z.vcodec)

    def val_index(self) -> np.ndarray:
        """For each row, the index of its ``(key, value)``."""
        return np.repeat(np.arange(self.num_vals, dtype=np.int64), np.diff(self.val_offsets))

    def val_key_index(self) -> np.ndarray:
        """For each ``(key, value)``, the index of its key."""
        return np.repeat(np.arange(self.num_keys, dtype=np.int64), np.diff(self.key_offsets))

    def neg(self) -> "OrdValBatch":
        return OrdValBatch(self.keys, self.kcodes, self.key_offsets, self.vals, self.vcodes,
                           self.val_offsets, self.times, -self.weights, self.kcodec, self.vcodec)

    @staticmethod
    def merge(batches: Sequence["OrdValBatch"]) -> "OrdValBatch":
        """The sum of consolidated timed batches (one k-way merge over ``(key, value, time)``)."""
        batches = [b for b in batches if len(b)]
        if not batches:
            raise ValueError("merge of no non-empty batches")
        if len(batches) == 1:
            return batches[0]
        rvs = [b.val_index() for b in batches]
        rks = [b.val_key_index()[rv] for b, rv in zip(batches, rvs)]
        runs = [(K.take(b.kcodes, rk), pack_codes(K.take(b.vcodes, rv), time_codes(b.times)),
                 b.weights) for b, rk, rv in zip(batches, rks, rvs)]
        gidx, w = K.merge_consolidate(runs)
        kbase = np.cumsum([0] + [b.num_keys for b in batches[:-1]])
        vbase = np.cumsum([0] + [b.num_vals for b in batches[:-1]])
        rk_cat = np.concatenate([rk + o for rk, o in zip(rks, kbase)])
        rv_cat = np.concatenate([rv + o for rv, o in zip(rvs, vbase)])
        b0 = batches[0]
        keys = concat_batches(b0.key_schema, [b.keys for b in batches])
        vals = concat_batches(b0.val_schema, [b.vals for b in batches])
        kc = K.concat([b.kcodes for b in batches])
        vc = K.concat([b.vcodes for b in batches])
        t = np.concatenate([b.times for b in batches])
        return OrdValBatch._build(keys, kc, rk_cat[gidx], vals, vc, rv_cat[gidx], t[gidx], w,
                                  b0.kcodec, b0.vcodec)

    def advance_times(self, frontier: int) -> "OrdValBatch":
        """Every time below ``frontier`` becomes ``frontier``; equal ``(key, value, time)`` rows
        merge, and values and keys left without rows disappear."""
        if len(self) == 0 or int(self.times.min()) >= frontier:
            return self
        t = np.maximum(self.times, np.int64(frontier))
        vi = self.val_index()
        starts = _starts_where_equal(vi, t)
        w = _reduce(self.weights, starts)
        keep = np.flatnonzero(w)
        rows = starts[keep]
        return self._regroup(vi[rows], t[rows], w[keep])

    def _regroup(self, vi: np.ndarray, t: np.ndarray, w: np.ndarray) -> "OrdValBatch":
        """The batch of rows ``(value vi[i], time t[i], weight w[i])`` (sorted, non-zero)."""
        if len(vi) == 0:
            return OrdValBatch.empty(self.key_schema, self.val_schema)
        vidx = np.unique(vi)
        val_offsets = _offsets_from_owner(np.searchsorted(vidx, vi), len(vidx))
        vk = self.val_key_index()[vidx]
        kidx = np.unique(vk)
        key_offsets = _offsets_from_owner(np.searchsorted(kidx, vk), len(kidx))
        return OrdValBatch(take(self.keys, kidx), K.take(self.kcodes, kidx), key_offsets,
                           take(self.vals, vidx), K.take(self.vcodes, vidx), val_offsets,
                           t, w, self.kcodec, self.vcodec)

    def to_untimed(self) -> OrdIndexedZSet:
        """The indexed Z-set, weights summed over times (zero sums dropped)."""
        if self.num_vals == 0:
            return OrdIndexedZSet.empty(self.key_schema, self.val_schema)
        w = _reduce(self.weights, self.val_offsets[:-1])
        vidx = np.flatnonzero(w)
        if len(vidx) == 0:
            return OrdIndexedZSet.empty(self.key_schema, self.val_schema)
        vk = self.val_key_index()[vidx]
        kidx = np.unique(vk)
        offsets = _offsets_from_owner(np.searchsorted(kidx, vk), len(kidx))
        return OrdIndexedZSet(take(self.keys, kidx), K.take(self.kcodes, kidx), offsets,
                              take(self.vals, vidx), K.take(self.vcodes, vidx), w[vidx],
                              self.kcodec, self.vcodec)

    def to_dict(self) -> dict[tuple, int]:
        """``{(key tuple, value tuple, time): weight}`` (for tests and the REPL)."""
        kcols = [c.to_pylist() for c in self.keys.columns]
        vcols = [c.to_pylist() for c in self.vals.columns]
        vi = self.val_index()
        vk = self.val_key_index()
        out = {}
        for v, t, w in zip(vi.tolist(), self.times.tolist(), self.weights.tolist()):
            k = int(vk[v])
            out[(tuple(c[k] for c in kcols), tuple(c[v] for c in vcols), t)] = w
        return out


# --- TimedTrace -------------------------------------------------------------------------------

#: the name of the time column a :class:`TimedTrace` appends to the values
TIME = "__time"


def timed_schema(val_schema: pa.Schema) -> pa.Schema:
    """``val_schema ++ (TIME: int64 not null)``."""
    if TIME in val_schema.names:
        raise ValueError(f"a value column is named {TIME!r}, the name of the time column")
    return pa.schema(list(val_schema) + [pa.field(TIME, pa.int64(), nullable=False)])


def times_of(ix: OrdIndexedZSet) -> np.ndarray:
    """The time of every value row of a batch probed from a :class:`TimedTrace`."""
    col = ix.vals.column(ix.vals.num_columns - 1)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)


def at_times(ix: Optional[OrdIndexedZSet], mask: np.ndarray) -> Optional[OrdIndexedZSet]:
    """The value rows of timed ``ix`` where ``mask`` is true, without the time column.

    The result groups rows by key (keys ascending, ``offsets`` valid) but a value may appear
    once per time, so it is *loose* within a key: fit for joins (which read keys, offsets,
    values and weights), not for merging. None when no row passes."""
    if ix is None or not mask.any():
        return None
    sub = ix.filter_rows(mask)
    if len(sub) == 0:
        return None
    vals = sub.vals.select(list(range(sub.vals.num_columns - 1)))
    return OrdIndexedZSet(sub.keys, sub.kcodes, sub.offsets, vals, sub.vcodes, sub.weights,
                          sub.kcodec, sub.vcodec)


class TimedTrace:
    """Changes indexed by ``(key, value, inner time)``, outer time consolidated (module doc).

    ``insert(parts)`` adds one outer step's changes: ``parts`` are ``(time, OrdIndexedZSet)``
    (or ``(time, OrdZSet)`` for a trace of rows: the row is the key and the value is empty).
    """

    def __init__(self, key_schema: pa.Schema, val_schema: pa.Schema, name: str = "timed"):
        self.key_schema, self.val_schema = key_schema, val_schema
        self.schema = timed_schema(val_schema)
        self.spine = Spine(name=name)
        #: the largest inner time stored (-1: none); every reader stops asking after it
        self.max_time = -1

    def __len__(self) -> int:
        return len(self.spine)

    def insert(self, parts: Sequence[tuple[int, ZSet | OrdIndexedZSet]]) -> None:
        parts = [(t, p) for t, p in parts if p is not None and len(p)]
        if not parts:
            return
        keys, vals, ws = [], [], []
        for t, p in parts:
            if isinstance(p, OrdIndexedZSet):
                keys.append(p.key_rows())
                cols = list(p.vals.columns)
            else:
                keys.append(p.data)
                cols = []
            n = len(p)
            vals.append(pa.RecordBatch.from_arrays(cols + [pa.array(np.full(n, t, np.int64))],
                                                   schema=self.schema))
            ws.append(p.weights)
        kb = concat_batches(self.key_schema, [pa.RecordBatch.from_arrays(k.columns,
                                                                          schema=self.key_schema)
                                              for k in keys])
        batch = OrdIndexedZSet.from_parts(kb, concat_batches(self.schema, vals),
                                          np.concatenate(ws))
        if len(batch):
            self.spine.insert(batch)
            self.max_time = max(self.max_time, max(t for t, _ in parts))

    def probe(self, codes: CodeArray) -> Optional[OrdIndexedZSet]:
        """The timed rows (values ``++ (time,)``) of the sorted distinct key ``codes``."""
        if len(codes) == 0 or self.max_time < 0:
            return None
        return self.spine.lookup(codes)

    def to_val_batch(self) -> OrdValBatch:
        """The whole trace as one :class:`OrdValBatch` (for tests and the REPL)."""
        ix = self.spine.consolidated()
        if ix is None or len(ix) == 0:
            return OrdValBatch.empty(self.key_schema, self.val_schema)
        vals = ix.vals.select(list(range(ix.vals.num_columns - 1)))
        vals = pa.RecordBatch.from_arrays(vals.columns, schema=self.val_schema)
        return OrdValBatch.from_parts(ix.key_rows(), vals, times_of(ix), ix.weights)

    def clear(self) -> None:
        self.spine.clear()
        self.max_time = -1

    # -- checkpoints (duck-typed like dbsp.circuit.operator.Stateful) -------------------------
    def spines(self) -> list:
        return [self.spine]

    def checkpoint_state(self) -> dict:
        return {"spine": self.spine.image(), "max_time": self.max_time}

    def restore_state(self, state: dict) -> None:
        self.spine.restore(state["spine"])
        self.max_time = int(state["max_time"])
