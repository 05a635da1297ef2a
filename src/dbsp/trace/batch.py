"""Batches: immutable, columnar, consolidated Z-sets built from the native layers.

Layers (the storage design's vocabulary) map onto Arrow + codes like this:

* ``ColumnLayer``  = key columns (an Arrow ``RecordBatch``) + their codes + an int64 weight
  column; rows strictly ascending by code.
* ``OrderedLayer`` = distinct key columns + codes + ``offsets`` (int64, one more than keys) into a
  child layer holding the values of key ``i`` at rows ``offsets[i]:offsets[i+1]``.

The batch types:

* :class:`ZSet` – a *loose* Z-set: rows and weights, any order, duplicates allowed. Linear
  operators (map, filter, plus, neg) work on it without sorting; it is what most stream deltas are.
* :class:`OrdZSet` – ``ColumnLayer`` over whole rows: consolidated (sorted by row code, each row
  once, no zero weight).
* :class:`OrdIndexedZSet` – ``OrderedLayer(key) -> ColumnLayer(value, weight)``: consolidated by
  ``(key, value)``, with the rows of each key contiguous. Joins, aggregates and traces use it.

Invariants: once built, a batch never changes (the arrays are shared, never written). Every
constructor that is not marked ``_unchecked`` establishes consolidation itself.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import Codes, KeyCodec, VarCodes
from ..algebra.schema import WEIGHT, concat_batches, empty_batch, take

_EMPTY_I64 = np.zeros(0, dtype=np.int64)


def _codec_for(schema: pa.Schema, names: Sequence[str]) -> KeyCodec:
    return KeyCodec([schema.field(n) for n in names])


def _empty_codes(codec: KeyCodec) -> Codes:
    if codec.u64:
        return np.zeros(0, dtype=np.uint64)
    return VarCodes(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8))


class ZSet:
    """A loose Z-set: an Arrow record batch and one int64 weight per row, in any order."""

    __slots__ = ("data", "weights")

    def __init__(self, data: pa.RecordBatch, weights: np.ndarray):
        if data.num_rows != len(weights):
            raise ValueError(f"{data.num_rows} rows but {len(weights)} weights")
        self.data = data
        self.weights = weights

    @property
    def schema(self) -> pa.Schema:
        return self.data.schema

    def __len__(self) -> int:
        return self.data.num_rows

    @classmethod
    def empty(cls, schema: pa.Schema) -> "ZSet":
        return cls(empty_batch(schema), _EMPTY_I64)

    def neg(self) -> "ZSet":
        return ZSet(self.data, -self.weights)

    def consolidate(self) -> "OrdZSet":
        return OrdZSet.from_loose(self)

    def to_arrow(self) -> pa.Table:
        """This Z-set as a table with a trailing ``__weight`` column."""
        t = pa.Table.from_batches([self.data], schema=self.schema)
        return t.append_column(WEIGHT, pa.array(self.weights, pa.int64()))

    def to_pandas(self):
        return self.to_arrow().to_pandas()

    def to_dict(self) -> dict[tuple, int]:
        """``{row tuple: weight}`` summed over duplicates, zero weights dropped (for tests/REPL)."""
        out: dict[tuple, int] = {}
        cols = [c.to_pylist() for c in self.data.columns]
        for i, w in enumerate(self.weights.tolist()):
            row = tuple(c[i] for c in cols)
            out[row] = out.get(row, 0) + w
        return {r: w for r, w in out.items() if w != 0}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} rows, {self.schema.names})"


class OrdZSet(ZSet):
    """A consolidated Z-set: ``ColumnLayer`` over whole rows (see the module doc)."""

    __slots__ = ("codes", "codec")

    def __init__(self, data: pa.RecordBatch, weights: np.ndarray, codes: Codes, codec: KeyCodec):
        super().__init__(data, weights)
        self.codes = codes
        self.codec = codec

    @classmethod
    def empty(cls, schema: pa.Schema) -> "OrdZSet":
        codec = _codec_for(schema, schema.names)
        return cls(empty_batch(schema), _EMPTY_I64, _empty_codes(codec), codec)

    @classmethod
    def from_loose(cls, z: ZSet, codec: Optional[KeyCodec] = None) -> "OrdZSet":
        if isinstance(z, OrdZSet):
            return z
        codec = codec or _codec_for(z.schema, z.schema.names)
        if len(z) == 0:
            return cls(z.data, _EMPTY_I64, _empty_codes(codec), codec)
        codes = codec.encode(z.data.columns, len(z))
        perm, w = K.sort_consolidate(codes, None, z.weights)
        return cls(take(z.data, perm), w, K.take(codes, perm), codec)

    @classmethod
    def from_arrow(cls, data: pa.RecordBatch, weights: Optional[np.ndarray] = None) -> "OrdZSet":
        w = np.ones(data.num_rows, np.int64) if weights is None else np.asarray(weights, np.int64)
        return cls.from_loose(ZSet(data, w))

    def consolidate(self) -> "OrdZSet":
        return self

    def neg(self) -> "OrdZSet":
        return OrdZSet(self.data, -self.weights, self.codes, self.codec)

    @staticmethod
    def merge(batches: Sequence["OrdZSet"]) -> "OrdZSet":
        """The sum of consolidated batches (one k-way merge)."""
        batches = [b for b in batches if len(b)]
        if not batches:
            raise ValueError("merge of no non-empty batches; use OrdZSet.empty(schema)")
        if len(batches) == 1:
            return batches[0]
        gidx, w = K.merge_consolidate([(b.codes, None, b.weights) for b in batches])
        data = concat_batches(batches[0].schema, [b.data for b in batches])
        codes = K.concat([b.codes for b in batches])
        return OrdZSet(take(data, gidx), w, K.take(codes, gidx), batches[0].codec)

    def index_by(self, key: Sequence[str]) -> "OrdIndexedZSet":
        return OrdIndexedZSet.from_loose(self, key)

    def slice(self, lo: int, hi: int) -> "OrdZSet":
        """Rows ``lo:hi`` (still consolidated; zero-copy views of this batch's buffers)."""
        lo, hi = max(0, lo), min(len(self), hi)
        hi = max(lo, hi)
        return OrdZSet(self.data.slice(lo, hi - lo), self.weights[lo:hi],
                       slice_codes(self.codes, lo, hi), self.codec)

    def filter_rows(self, mask: np.ndarray) -> "OrdZSet":
        """The rows where ``mask`` (bool, one per row) is true (still consolidated)."""
        idx = np.flatnonzero(mask)
        if len(idx) == len(self):
            return self
        return OrdZSet(take(self.data, idx), self.weights[idx], K.take(self.codes, idx),
                       self.codec)


class OrdIndexedZSet:
    """``OrderedLayer(key) -> ColumnLayer(value, weight)``, consolidated by ``(key, value)``.

    ``keys`` holds each distinct key once (ascending by ``kcodes``); the values of key ``i`` are
    rows ``offsets[i]:offsets[i+1]`` of ``vals`` / ``vcodes`` / ``weights``, ascending by ``vcodes``.
    """

    __slots__ = ("keys", "kcodes", "offsets", "vals", "vcodes", "weights", "kcodec", "vcodec")

    def __init__(self, keys: pa.RecordBatch, kcodes: Codes, offsets: np.ndarray,
                 vals: pa.RecordBatch, vcodes: Codes, weights: np.ndarray,
                 kcodec: KeyCodec, vcodec: KeyCodec):
        self.keys, self.kcodes, self.offsets = keys, kcodes, offsets
        self.vals, self.vcodes, self.weights = vals, vcodes, weights
        self.kcodec, self.vcodec = kcodec, vcodec

    # -- shape -----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Number of (key, value) rows."""
        return len(self.weights)

    @property
    def num_keys(self) -> int:
        return self.keys.num_rows

    @property
    def key_schema(self) -> pa.Schema:
        return self.keys.schema

    @property
    def val_schema(self) -> pa.Schema:
        return self.vals.schema

    def __repr__(self) -> str:
        return (f"OrdIndexedZSet({self.num_keys} keys, {len(self)} rows, key={self.keys.schema.names}, "
                f"val={self.vals.schema.names})")

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def empty(cls, key_schema: pa.Schema, val_schema: pa.Schema) -> "OrdIndexedZSet":
        kc = _codec_for(key_schema, key_schema.names)
        vc = _codec_for(val_schema, val_schema.names)
        return cls(empty_batch(key_schema), _empty_codes(kc), np.zeros(1, np.int64),
                   empty_batch(val_schema), _empty_codes(vc), _EMPTY_I64, kc, vc)

    @classmethod
    def from_parts(cls, keys: pa.RecordBatch, vals: pa.RecordBatch, weights: np.ndarray,
                   kcodec: Optional[KeyCodec] = None, vcodec: Optional[KeyCodec] = None,
                   kcodes: Optional[Codes] = None, vcodes: Optional[Codes] = None
                   ) -> "OrdIndexedZSet":
        """Build from row-aligned key and value batches (any order, duplicates allowed)."""
        kcodec = kcodec or _codec_for(keys.schema, keys.schema.names)
        vcodec = vcodec or _codec_for(vals.schema, vals.schema.names)
        if keys.num_rows == 0:
            return cls.empty(keys.schema, vals.schema)
        kcodes = kcodec.encode(keys.columns, keys.num_rows) if kcodes is None else kcodes
        vcodes = vcodec.encode(vals.columns, vals.num_rows) if vcodes is None else vcodes
        perm, w = K.sort_consolidate(kcodes, vcodes, np.asarray(weights, np.int64))
        return cls._from_sorted_rows(keys, vals, kcodes, vcodes, perm, w, kcodec, vcodec)

    @classmethod
    def _from_sorted_rows(cls, keys, vals, kcodes, vcodes, perm, w, kcodec, vcodec):
        if len(perm) == 0:
            return cls.empty(keys.schema, vals.schema)
        ks = K.take(kcodes, perm)
        bounds = K.group_bounds(ks)
        first = bounds[:-1]
        return cls(take(keys, perm[first]), K.take(ks, first), bounds,
                   take(vals, perm), K.take(vcodes, perm), w, kcodec, vcodec)

    @classmethod
    def from_loose(cls, z: ZSet, key: Sequence[str]) -> "OrdIndexedZSet":
        key = list(key)
        missing = [k for k in key if k not in z.schema.names]
        if missing:
            raise KeyError(f"no column {missing[0]!r} to index by (columns: {z.schema.names})")
        vnames = [n for n in z.schema.names if n not in key]
        return cls.from_parts(z.data.select(key), z.data.select(vnames), z.weights)

    @staticmethod
    def merge(batches: Sequence["OrdIndexedZSet"]) -> "OrdIndexedZSet":
        """The sum of consolidated indexed batches (one k-way merge over ``(key, value)``)."""
        batches = [b for b in batches if len(b)]
        if not batches:
            raise ValueError("merge of no non-empty batches")
        if len(batches) == 1:
            return batches[0]
        rows = [b.flat_kcodes() for b in batches]
        gidx, w = K.merge_consolidate([(rk, b.vcodes, b.weights) for rk, b in zip(rows, batches)])
        b0 = batches[0]
        kc = K.concat(rows)
        vc = K.concat([b.vcodes for b in batches])
        keys = concat_batches(b0.key_schema, [b.key_rows() for b in batches])
        vals = concat_batches(b0.val_schema, [b.vals for b in batches])
        # gidx is already sorted by (key, value): group it directly
        ks = K.take(kc, gidx)
        bounds = K.group_bounds(ks)
        first = bounds[:-1]
        return OrdIndexedZSet(take(keys, gidx[first]), K.take(ks, first), bounds,
                              take(vals, gidx), K.take(vc, gidx), w, b0.kcodec, b0.vcodec)

    # -- views ----------------------------------------------------------------------------
    def key_index(self) -> np.ndarray:
        """For each value row, the index of its key (int64)."""
        return np.repeat(np.arange(self.num_keys, dtype=np.int64), np.diff(self.offsets))

    def flat_kcodes(self) -> Codes:
        """The key code of every value row."""
        return K.take(self.kcodes, self.key_index())

    def key_rows(self) -> pa.RecordBatch:
        """The key columns repeated for every value row."""
        return take(self.keys, self.key_index())

    def flatten(self) -> ZSet:
        """Rows ``key ++ value`` with their weights (a loose Z-set; already consolidated)."""
        kr = self.key_rows()
        cols = list(kr.columns) + list(self.vals.columns)
        fields = list(kr.schema) + list(self.vals.schema)
        return ZSet(pa.RecordBatch.from_arrays(cols, schema=pa.schema(fields)), self.weights)

    def neg(self) -> "OrdIndexedZSet":
        return OrdIndexedZSet(self.keys, self.kcodes, self.offsets, self.vals, self.vcodes,
                              -self.weights, self.kcodec, self.vcodec)

    def to_arrow(self) -> pa.Table:
        return self.flatten().to_arrow()

    def to_dict(self) -> dict[tuple, int]:
        return self.flatten().to_dict()

    def select_keys(self, key_idx: np.ndarray) -> "OrdIndexedZSet":
        """The sub-batch of the given keys (ascending key indices)."""
        if len(key_idx) == 0:
            return OrdIndexedZSet.empty(self.key_schema, self.val_schema)
        lo, hi = self.offsets[key_idx], self.offsets[key_idx + 1]
        counts = hi - lo
        offsets = np.zeros(len(key_idx) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        rows = _ranges(lo, counts)
        return OrdIndexedZSet(take(self.keys, key_idx), K.take(self.kcodes, key_idx), offsets,
                              take(self.vals, rows), K.take(self.vcodes, rows), self.weights[rows],
                              self.kcodec, self.vcodec)

    def slice_keys(self, lo: int, hi: int) -> "OrdIndexedZSet":
        """Keys ``lo:hi`` and their values (zero-copy views of this batch's buffers)."""
        lo, hi = max(0, lo), min(self.num_keys, hi)
        hi = max(lo, hi)
        r0, r1 = int(self.offsets[lo]), int(self.offsets[hi])
        return OrdIndexedZSet(self.keys.slice(lo, hi - lo), slice_codes(self.kcodes, lo, hi),
                              self.offsets[lo:hi + 1] - r0, self.vals.slice(r0, r1 - r0),
                              slice_codes(self.vcodes, r0, r1), self.weights[r0:r1],
                              self.kcodec, self.vcodec)

    def filter_rows(self, mask: np.ndarray) -> "OrdIndexedZSet":
        """The value rows where ``mask`` (bool, one per value row) is true; keys left without
        values are dropped (still consolidated)."""
        mask = np.asarray(mask, dtype=bool)
        if mask.all():
            return self
        rows = np.flatnonzero(mask)
        if len(mask) == 0:
            return self
        # kept values per key (every key of a consolidated batch has at least one value)
        kept = np.add.reduceat(mask.astype(np.int64), self.offsets[:-1])
        kidx = np.flatnonzero(kept)
        if len(kidx) == 0:
            return OrdIndexedZSet.empty(self.key_schema, self.val_schema)
        offsets = np.zeros(len(kidx) + 1, np.int64)
        np.cumsum(kept[kidx], out=offsets[1:])
        return OrdIndexedZSet(take(self.keys, kidx), K.take(self.kcodes, kidx), offsets,
                              take(self.vals, rows), K.take(self.vcodes, rows), self.weights[rows],
                              self.kcodec, self.vcodec)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for each start/count (vectorised)."""
    total = int(counts.sum())
    if total == 0:
        return _EMPTY_I64
    ends = np.cumsum(counts)
    out = np.ones(total, dtype=np.int64)
    nz = counts > 0
    s, c, e = starts[nz], counts[nz], ends[nz]
    out[0] = s[0]
    if len(s) > 1:
        out[e[:-1]] = s[1:] - (s[:-1] + c[:-1] - 1)
    return np.cumsum(out)


def slice_codes(codes: Codes, lo: int, hi: int) -> Codes:
    """Rows ``lo:hi`` of a code array, without copying (a VarCodes slice keeps absolute offsets)."""
    if isinstance(codes, np.ndarray):
        return codes[lo:hi]
    return VarCodes(codes.offsets[lo:hi + 1], codes.data)


ranges = _ranges

__all__ = ["ZSet", "OrdZSet", "OrdIndexedZSet", "ranges", "slice_codes"]
_ = Any
