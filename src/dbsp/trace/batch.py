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

The batch-probe interface
-------------------------
Spines and the operators that probe state use only :class:`BatchReader` (below) on the batches a
spine holds, so a batch may live in memory (this module) or in a layer file
(:mod:`dbsp.trace.file_batch`): ``probe_keys`` / ``match`` / ``select_keys`` / ``row_weights``
answer point lookups, ``cursor`` and ``iter_pieces`` scan, ``cut_below`` applies a key bound,
``nbytes_in_memory`` is what the memory accountant counts. Only batches an operator builds
itself (deltas, lookup results) are read through their arrays.
"""
from __future__ import annotations


from typing import Any, Callable, Iterator, Optional, Protocol, Sequence, Union

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.checked import WeightOverflowError
from ..algebra.codes import CodeArray, Codes, KeyCodec, codec_for
from ..algebra.schema import (WEIGHT, concat_batches, empty_batch, fixed_columns,
                              from_fixed_columns, py_values, take, take_batches)
from .cursor import OrdIndexedZSetCursor, OrdZSetCursor
from .key_filter import filtered_intersect

EMPTY_I64 = np.zeros(0, dtype=np.int64)
#: batches of this many keys or more are probed through a sample of their key codes (their
#: 512 KB of codes and more no longer stay in the cache between probes)
SAMPLE_MIN_KEYS = 1 << 16
#: a batch keeps its runs of consecutive key codes when it has at least this many keys a run
RUN_MIN_KEYS = 64
_EMPTY_CODES = {True: Codes.empty(True), False: Codes.empty(False)}


def _empty_codes(u64: bool) -> CodeArray:
    """Codes of no rows (shared: an empty array cannot be written)."""
    return _EMPTY_CODES[u64]


class BatchReader(Protocol):
    """What a spine and the operators probing its state ask of a stored batch (in memory or
    in a file). Keys are the rows of a Z-set (:class:`OrdZSet`), the keys of an indexed batch.

    * ``probe_keys(codes) -> (probe_idx, key_idx)``: for sorted distinct ``codes``, the positions
      of those present (``codes[probe_idx[i]]`` is key ``key_idx[i]``), ascending.
    * ``match(codes)``: ``None`` or ``(batch, probe_idx, key_idx)`` where ``batch`` is an
      in-memory batch holding the matched keys (the batch itself in memory; a selection of the
      file) and ``key_idx`` indexes it; the join's probe.
    * ``select_keys(key_idx)``: the in-memory sub-batch of those keys (ascending indices).
    * ``row_weights(codes)``: Z-sets: the weight of each sorted distinct row code (0 if absent).
    * ``prefetch_keys(codes)``: start reading what ``probe_keys(codes)`` will read.
    * ``cut_below(bound)``: the batch without its keys below a key code (``int`` / ``bytes``).
    * ``cursor()``, ``iter_pieces(rows)``: sequential reads (pieces may split a key's values).
    * ``to_memory()``, ``__len__`` (rows), ``num_keys``, ``nbytes_in_memory``, ``indexed``,
      ``is_file``, ``max_val_code()``; ``nbytes_upper``: a cheap upper bound of
      ``nbytes_in_memory`` (whole Arrow buffers, not walked for the ranges referenced); ``hits``: keys found by ``match`` / ``row_weights`` so
      far (how hot the batch is).
    """

    indexed: bool
    is_file: bool

    def __len__(self) -> int: ...
    @property
    def num_keys(self) -> int: ...
    @property
    def nbytes_in_memory(self) -> int: ...
    @property
    def nbytes_upper(self) -> int: ...
    def probe_keys(self, codes: CodeArray) -> tuple[np.ndarray, np.ndarray]: ...
    def match(self, codes: CodeArray) -> Optional[tuple[Any, np.ndarray, np.ndarray]]: ...
    def select_keys(self, key_idx: np.ndarray) -> Any: ...
    def prefetch_keys(self, codes: CodeArray) -> None: ...
    def cut_below(self, bound: Union[int, bytes]) -> Any: ...
    def cursor(self) -> Any: ...
    def iter_pieces(self, rows: int) -> Iterator[Any]: ...
    def to_memory(self) -> Any: ...
    def max_val_code(self) -> Optional[int]: ...


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
        return cls(empty_batch(schema), EMPTY_I64)

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
        """``{row tuple: weight}`` summed over duplicates, zero weights dropped (for tests/REPL);
        nested values as tuples (:func:`~dbsp.algebra.schema.py_values`)."""
        rows, ws = self._py_rows(), self.weights.tolist()
        out: dict[tuple, int] = {}
        for row, w in zip(rows, ws):
            out[row] = out.get(row, 0) + w
        return {r: w for r, w in out.items() if w != 0}

    def _py_rows(self):
        """The rows as Python tuples (an iterator; columns converted whole by Arrow)."""
        cols = [py_values(c) for c in self.data.columns]
        return zip(*cols) if cols else iter([()] * len(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} rows, {self.schema.names})"


class DistinctZSet(ZSet):
    """A loose Z-set known to be consolidated but in no order: distinct rows, non-zero weights
    (an aggregate's change, one ``-old`` / ``+new`` row per key). The workers' parts of one such
    stream are distinct from each other too (the operator making it is sharded by key), so a
    reader needing no order can concatenate them without sorting."""

    __slots__ = ()


class KeyedZSet(ZSet):
    """A loose Z-set whose rows are consolidated and in ``(key code, value code)`` order, the key
    being the columns ``key`` and the value the others (in schema order), with those u64 codes
    (``kcodes``, ``vcodes``: one per row, as ``codec_for(schema, key)`` and
    ``codec_for(schema, values)`` encode them): the driver's split of an input that
    ``index_by(key)`` reads hands each worker its rows so
    (:func:`dbsp.circuit.exchange.deal_sorted`), and that operator makes them an
    :class:`OrdIndexedZSet` without sorting or gathering them again
    (:meth:`OrdIndexedZSet.from_keyed`). To any other reader it is a Z-set like any other.

    ``layer``: the key layer of those rows when the split made it, ``(key batch, distinct key
    codes, offsets)``, else None (it is made from the codes then)."""

    __slots__ = ("key", "kcodes", "vcodes", "layer")

    def __init__(self, data: pa.RecordBatch, weights: np.ndarray, key: tuple,
                 kcodes: np.ndarray, vcodes: np.ndarray, layer: Optional[tuple] = None):
        super().__init__(data, weights)
        self.key, self.kcodes, self.vcodes = key, kcodes, vcodes
        self.layer = layer


class OrdZSet(ZSet):
    """A consolidated Z-set: ``ColumnLayer`` over whole rows (see the module doc)."""

    __slots__ = ("codes", "codec", "_nb", "hits", "key_filter")

    def __init__(self, data: pa.RecordBatch, weights: np.ndarray, codes: CodeArray, codec: KeyCodec):
        super().__init__(data, weights)
        self.codes = codes
        self.codec = codec
        self._nb = -1
        self.hits = 0  # keys found by probes while stored (the accountant spills cold first)
        self.key_filter = None  # a Bloom filter over the rows, once a merge made this batch large

    @classmethod
    def empty(cls, schema: pa.Schema) -> "OrdZSet":
        codec = codec_for(schema, schema.names)
        return cls(empty_batch(schema), EMPTY_I64, _empty_codes(codec.u64), codec)

    @classmethod
    def from_loose(cls, z: ZSet, codec: Optional[KeyCodec] = None) -> "OrdZSet":
        if isinstance(z, OrdZSet):
            return z
        codec = codec or codec_for(z.schema, z.schema.names)
        if len(z) == 0:
            return cls(z.data, EMPTY_I64, _empty_codes(codec.u64), codec)
        codes = codec.encode_batch(z.data)
        try:
            perm, w = K.sort_consolidate(codes, None, z.weights)
        except WeightOverflowError as e:
            raise _named(e, [z.data]) from None
        return cls(take(z.data, perm), w, K.take(codes, perm), codec)

    @classmethod
    def from_arrow(cls, data: pa.RecordBatch, weights: Optional[np.ndarray] = None) -> "OrdZSet":
        w = np.ones(data.num_rows, np.int64) if weights is None else np.asarray(weights, np.int64)
        return cls.from_loose(ZSet(data, w))

    def consolidate(self) -> "OrdZSet":
        return self

    def to_dict(self) -> dict[tuple, int]:
        """``{row tuple: weight}``: rows are distinct and weights non-zero already, so the dict
        is built in one C-level pass (the summing path of :meth:`ZSet.to_dict` only when two
        rows meet as Python values, e.g. ``0.0`` and ``-0.0``)."""
        return _distinct_rows_dict(self)

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
        try:
            gidx, w = K.merge_consolidate([(b.codes, None, b.weights) for b in batches])
        except WeightOverflowError as e:
            raise _named(e, [b.data for b in batches]) from None
        b0 = batches[0]
        # gather the output from the inputs at gidx, without concatenated copies of them (a
        # merge's inputs and output already coexist; those copies were a third of its memory)
        codes = K.take_runs([b.codes for b in batches], gidx)
        return OrdZSet(take_batches(b0.schema, [b.data for b in batches], gidx), w, codes,
                       b0.codec)

    def index_by(self, key: Sequence[str]) -> "OrdIndexedZSet":
        return OrdIndexedZSet.from_loose(self, key)

    def slice(self, lo: int, hi: int) -> "OrdZSet":
        """Rows ``lo:hi`` (still consolidated; zero-copy views of this batch's buffers)."""
        lo, hi = max(0, lo), min(len(self), hi)
        hi = max(lo, hi)
        return OrdZSet(self.data.slice(lo, hi - lo), self.weights[lo:hi],
                       Codes.slice(self.codes, lo, hi), self.codec)

    def filter_rows(self, mask: np.ndarray) -> "OrdZSet":
        """The rows where ``mask`` (bool, one per row) is true (still consolidated)."""
        idx = np.flatnonzero(mask)
        if len(idx) == len(self):
            return self
        return OrdZSet(take(self.data, idx), self.weights[idx], K.take(self.codes, idx),
                       self.codec)

    # -- the batch-probe interface (BatchReader) ------------------------------------------
    indexed = False
    is_file = False

    @property
    def num_keys(self) -> int:
        return len(self)

    @property
    def nbytes_in_memory(self) -> int:
        if self._nb < 0:  # immutable: computed once (Arrow's nbytes walks every buffer)
            self._nb = self.data.nbytes + self.codes.nbytes + self.weights.nbytes
            if self.key_filter is not None:
                self._nb += self.key_filter.nbytes
        return self._nb

    @property
    def nbytes_upper(self) -> int:
        """A cheap upper bound of :attr:`nbytes_in_memory` (that value once known): Arrow's
        ``get_total_buffer_size`` counts whole buffers, where ``nbytes`` walks them to count
        only the ranges referenced (3-10 us a record batch: most of a small merge's cost when
        the value is asked once and never reused)."""
        if self._nb >= 0:
            return self._nb
        kf = self.key_filter
        return (self.data.get_total_buffer_size() + self.codes.nbytes + self.weights.nbytes
                + (kf.nbytes if kf is not None else 0))

    def probe_keys(self, codes: CodeArray) -> tuple[np.ndarray, np.ndarray]:
        """``(probe_idx, row_idx)`` of the sorted distinct row ``codes`` present here."""
        if len(codes) == 0 or len(self) == 0:
            return EMPTY_I64, EMPTY_I64
        return filtered_intersect(codes, self.codes, self.key_filter)

    def match(self, codes: CodeArray):
        pi, ki = self.probe_keys(codes)
        self.hits += len(pi)
        return None if len(pi) == 0 else (self, pi, ki)

    def select_keys(self, idx: np.ndarray) -> "OrdZSet":
        """Rows ``idx`` (ascending)."""
        return OrdZSet(take(self.data, idx), self.weights[idx], K.take(self.codes, idx),
                       self.codec)

    def row_weights(self, codes: CodeArray) -> np.ndarray:
        """The weight of each sorted distinct row code (0 where absent)."""
        out = np.zeros(len(codes), np.int64)
        pi, ki = self.probe_keys(codes)
        self.hits += len(pi)
        if len(pi):
            out[pi] = self.weights[ki]
        return out

    def prefetch_keys(self, codes: CodeArray) -> None:
        pass

    def cut_below(self, bound) -> "OrdZSet":
        """The rows whose code is ``>= bound`` (a zero-copy suffix)."""
        i = _first_at_least(self.codes, bound)
        return self if i == 0 else self.slice(i, len(self))

    def cursor(self) -> OrdZSetCursor:
        return OrdZSetCursor(self)

    def iter_pieces(self, rows: int) -> Iterator["OrdZSet"]:
        """Consecutive zero-copy slices of at most ``rows`` rows."""
        for lo in range(0, len(self), max(rows, 1)):
            yield self.slice(lo, lo + rows)

    def to_memory(self) -> "OrdZSet":
        return self

    def max_val_code(self) -> Optional[int]:
        return None


class OrdIndexedZSet:
    """``OrderedLayer(key) -> ColumnLayer(value, weight)``, consolidated by ``(key, value)``.

    ``keys`` holds each distinct key once (ascending by ``kcodes``); the values of key ``i`` are
    rows ``offsets[i]:offsets[i+1]`` of ``vals`` / ``vcodes`` / ``weights``, ascending by ``vcodes``.
    """

    __slots__ = ("keys", "kcodes", "offsets", "vals", "vcodes", "weights", "kcodec", "vcodec",
                 "_nb", "hits", "memo")

    def __init__(self, keys: pa.RecordBatch, kcodes: CodeArray, offsets: np.ndarray,
                 vals: pa.RecordBatch, vcodes: CodeArray, weights: np.ndarray,
                 kcodec: KeyCodec, vcodec: KeyCodec):
        self.keys, self.kcodes, self.offsets = keys, kcodes, offsets
        self.vals, self.vcodes, self.weights = vals, vcodes, weights
        self.kcodec, self.vcodec = kcodec, vcodec
        self._nb = -1
        self.hits = 0  # keys found by probes while stored (the accountant spills cold first)
        #: None, or a dict where a reader keeps what it derived from this (immutable) batch and
        #: reads again every step while the batch sits in a spine (the aggregate state's numpy
        #: views of its value columns); dropped with the batch
        self.memo: Optional[dict] = None

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
        kc = codec_for(key_schema, key_schema.names)
        vc = codec_for(val_schema, val_schema.names)
        return cls(empty_batch(key_schema), _empty_codes(kc.u64), np.zeros(1, np.int64),
                   empty_batch(val_schema), _empty_codes(vc.u64), EMPTY_I64, kc, vc)

    @classmethod
    def empty_like(cls, b: Any) -> "OrdIndexedZSet":
        """No rows, with the schemas and codecs of ``b`` (an indexed batch, maybe in a file)."""
        kc, vc = b.kcodec, b.vcodec
        return cls(empty_batch(b.key_schema), _empty_codes(kc.u64), np.zeros(1, np.int64),
                   empty_batch(b.val_schema), _empty_codes(vc.u64), EMPTY_I64, kc, vc)

    @classmethod
    def from_parts(cls, keys: pa.RecordBatch, vals: pa.RecordBatch, weights: np.ndarray,
                   kcodec: Optional[KeyCodec] = None, vcodec: Optional[KeyCodec] = None,
                   kcodes: Optional[CodeArray] = None, vcodes: Optional[CodeArray] = None
                   ) -> "OrdIndexedZSet":
        """Build from row-aligned key and value batches (any order, duplicates allowed)."""
        kcodec = kcodec or codec_for(keys.schema, keys.schema.names)
        vcodec = vcodec or codec_for(vals.schema, vals.schema.names)
        if keys.num_rows == 0:
            return cls.empty(keys.schema, vals.schema)
        kcodes = kcodec.encode_batch(keys) if kcodes is None else kcodes
        vcodes = vcodec.encode_batch(vals) if vcodes is None else vcodes
        try:
            perm, w = K.sort_consolidate(kcodes, vcodes, np.asarray(weights, np.int64))
        except WeightOverflowError as e:
            raise _named(e, [_side_by_side(keys, vals)]) from None
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
    def from_keyed(cls, z: KeyedZSet, vnames: Sequence[str], kcodec: KeyCodec,
                   vcodec: KeyCodec) -> "OrdIndexedZSet":
        """``z``'s rows (non-empty, sorted and consolidated already) indexed by ``z.key``, the
        value columns ``vnames`` (the others): no sort, no gather of the values (a zero-copy
        selection of ``z``'s columns); the key layer as the split made it (``z.layer``), else
        the key columns gathered at each key's first row."""
        if z.layer is not None:
            keys, kcodes, offsets = z.layer
            return cls(keys, kcodes, offsets, z.data.select(list(vnames)), z.vcodes, z.weights,
                       kcodec, vcodec)
        bounds = K.group_bounds(z.kcodes)
        keys = z.data.select(list(z.key))
        if len(bounds) - 1 == len(z):  # every key once: its rows are the key layer
            return cls(keys, z.kcodes, bounds, z.data.select(list(vnames)), z.vcodes, z.weights,
                       kcodec, vcodec)
        first = bounds[:-1]
        return cls(take(keys, first), K.take(z.kcodes, first), bounds,
                   z.data.select(list(vnames)), z.vcodes, z.weights, kcodec, vcodec)

    @classmethod
    def from_loose(cls, z: ZSet, key: Sequence[str], vnames: Optional[Sequence[str]] = None,
                   kcodec: Optional[KeyCodec] = None, vcodec: Optional[KeyCodec] = None
                   ) -> "OrdIndexedZSet":
        """Index the rows of ``z`` by the ``key`` columns. An operator indexing every step
        passes the value columns ``vnames`` and both codecs, worked out once."""
        if vnames is None:
            key = list(key)
            missing = [k for k in key if k not in z.schema.names]
            if missing:
                raise KeyError(f"no column {missing[0]!r} to index by (columns: {z.schema.names})")
            vnames = [n for n in z.schema.names if n not in key]
        return cls.from_parts(z.data.select(key), z.data.select(vnames), z.weights, kcodec, vcodec)

    @staticmethod
    def merge(batches: Sequence["OrdIndexedZSet"]) -> "OrdIndexedZSet":
        """The sum of consolidated indexed batches (one k-way merge over ``(key, value)``)."""
        batches = [b for b in batches if len(b)]
        if not batches:
            raise ValueError("merge of no non-empty batches")
        if len(batches) == 1:
            return batches[0]
        b0 = batches[0]
        # u64 codes, fixed-width key and value columns without nulls: the whole merge in one
        # native call (merged, regrouped, both record batches built; no object per column)
        # each input read through its kept export (made once: most were handed out free by
        # the kernel that built the batch), the output's exports kept for its own merge
        views: list = []
        try:
            got = K.merge_indexed_batches(
                [(b.kcodes, b.offsets, b.vcodes, b.weights, exported(b, "keys"),
                  exported(b, "vals")) for b in batches],
                b0.keys.schema, b0.vals.schema, views=views)
        except WeightOverflowError as e:
            raise _named(e, [b.flatten().data for b in batches]) from None
        if got is not None:
            keys, kc, bounds, vals, vc, w = got
            return keep_exports(OrdIndexedZSet(keys, kc, bounds, vals, vc, w, b0.kcodec,
                                               b0.vcodec), *views)
        if all(Codes.is_u64(b.kcodes) and Codes.is_u64(b.vcodes)
               for b in batches):
            # fixed-width codes: merge and regroup in one native pass
            cols = [fixed_columns(b.vals) for b in batches] if b0.vals.num_columns else [None]
            if all(c is not None for c in cols):
                # ... that gathers the value columns too: no row index, no concatenated copy of
                # the inputs (a top-level merge is the process's peak: inputs + output only)
                try:
                    vcols, w, vc, kc, bounds, ksrc = K.merge_indexed_cols(
                        [(b.kcodes, b.offsets, b.vcodes, b.weights, c)
                         for b, c in zip(batches, cols)])
                except WeightOverflowError as e:
                    raise _named(e, [b.flatten().data for b in batches]) from None
                del cols
                keys = concat_batches(b0.key_schema, [b.keys for b in batches])
                return OrdIndexedZSet(take(keys, ksrc), kc, bounds,
                                      from_fixed_columns(b0.val_schema, vcols), vc, w,
                                      b0.kcodec, b0.vcodec)
            try:
                gidx, w, vc, kc, bounds, ksrc = K.merge_indexed(
                    [(b.kcodes, b.offsets, b.vcodes, b.weights) for b in batches])
            except WeightOverflowError as e:
                raise _named(e, [b.flatten().data for b in batches]) from None
            return OrdIndexedZSet(take_batches(b0.key_schema, [b.keys for b in batches], ksrc),
                                  kc, bounds,
                                  take_batches(b0.val_schema, [b.vals for b in batches], gidx),
                                  vc, w, b0.kcodec, b0.vcodec)
        kis = [b.key_index() for b in batches]
        rows = [K.take(b.kcodes, ki) for b, ki in zip(batches, kis)]
        try:
            gidx, w = K.merge_consolidate([(rk, b.vcodes, b.weights)
                                           for rk, b in zip(rows, batches)])
        except WeightOverflowError as e:
            raise _named(e, [b.flatten().data for b in batches]) from None
        # the key row of every value row, as an index into the concatenated *distinct* keys (the
        # key columns are taken once per output key, never expanded to every value row)
        koff = np.cumsum([0] + [b.num_keys for b in batches[:-1]])
        kidx = np.concatenate([ki + o for ki, o in zip(kis, koff.tolist())])
        # gidx is already sorted by (key, value): group it directly; every output column and
        # code array is gathered from the inputs, without concatenated copies of them
        ks = K.take_runs(rows, gidx)
        del rows
        bounds = K.group_bounds(ks)
        first = bounds[:-1]
        return OrdIndexedZSet(take_batches(b0.key_schema, [b.keys for b in batches],
                                           kidx[gidx[first]]),
                              K.take(ks, first), bounds,
                              take_batches(b0.val_schema, [b.vals for b in batches], gidx),
                              K.take_runs([b.vcodes for b in batches], gidx), w,
                              b0.kcodec, b0.vcodec)

    # -- views ----------------------------------------------------------------------------
    def key_index(self) -> np.ndarray:
        """For each value row, the index of its key (int64)."""
        return np.repeat(np.arange(self.num_keys, dtype=np.int64), np.diff(self.offsets))

    def flat_kcodes(self) -> CodeArray:
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
        return _distinct_rows_dict(self.flatten())  # (key, value) rows are distinct

    def select_keys(self, key_idx: np.ndarray) -> "OrdIndexedZSet":
        """The sub-batch of the given keys (ascending distinct key indices)."""
        if len(key_idx) == 0:
            return OrdIndexedZSet.empty(self.key_schema, self.val_schema)
        if len(key_idx) == self.num_keys:  # every key: this batch
            return self
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
        return OrdIndexedZSet(self.keys.slice(lo, hi - lo), Codes.slice(self.kcodes, lo, hi),
                              self.offsets[lo:hi + 1] - r0, self.vals.slice(r0, r1 - r0),
                              Codes.slice(self.vcodes, r0, r1), self.weights[r0:r1],
                              self.kcodec, self.vcodec)

    # -- the batch-probe interface (BatchReader) ------------------------------------------
    indexed = True
    is_file = False

    @property
    def nbytes_in_memory(self) -> int:
        if self._nb < 0:  # immutable: computed once (Arrow's nbytes walks every buffer)
            self._nb = (self.keys.nbytes + self.kcodes.nbytes + self.offsets.nbytes
                        + self.vals.nbytes + self.vcodes.nbytes + self.weights.nbytes)
        return self._nb + memo_nbytes(self) if self.memo else self._nb

    @property
    def nbytes_upper(self) -> int:
        """A cheap upper bound of :attr:`nbytes_in_memory` (see :attr:`OrdZSet.nbytes_upper`)."""
        if self._nb >= 0:
            return self.nbytes_in_memory
        return (self.keys.get_total_buffer_size() + self.vals.get_total_buffer_size()
                + self.kcodes.nbytes + self.offsets.nbytes + self.vcodes.nbytes
                + self.weights.nbytes + memo_nbytes(self))

    def code_sample(self) -> Optional[np.ndarray]:
        """Every 16th key code (:func:`~dbsp.algebra.kernels.code_sample`), made on the first
        probe and kept in ``memo``, for a batch of :data:`SAMPLE_MIN_KEYS` keys or more (None
        for a smaller one, whose codes stay in the cache anyway, or for var codes): a probe
        then gallops through the cached sample and misses the cache once per probed key."""
        if len(self.offsets) - 1 < SAMPLE_MIN_KEYS:
            return None
        return memoized(self, "code_sample", lambda: K.code_sample(self.kcodes))

    def code_runs(self) -> Optional[np.ndarray]:
        """Where the runs of consecutive key codes start (:func:`~dbsp.algebra.kernels.
        code_runs`), made on the first probe and kept in ``memo``, for a batch of
        :data:`SAMPLE_MIN_KEYS` keys or more whose keys are at most one run per
        :data:`RUN_MIN_KEYS` keys (ids numbered in order, a few ranges of them); None
        otherwise. A probe then finds a key's position without reading the key codes."""
        if len(self.offsets) - 1 < SAMPLE_MIN_KEYS:
            return None
        return memoized(self, "code_runs", lambda: _few_runs(self.kcodes))

    def code_rank(self) -> Optional[np.ndarray]:
        """The rank directory of the key codes (:func:`~dbsp.algebra.kernels.code_rank`: a
        bitmap of their range and counts, at most 2 bytes a key), made on first use and kept
        in ``memo``; None when the codes fill their range (the intersection's dense case needs
        none). A probe then places each code with a bit test and a popcount: for the shard of
        a hash-sharded id key (a random part of a range of ids). The caller decides when it
        repays its making (``match(codes, rank=True)``)."""
        return memoized(self, "code_rank", lambda: K.code_rank(self.kcodes))

    def probe_keys(self, codes: CodeArray) -> tuple[np.ndarray, np.ndarray]:
        """``(probe_idx, key_idx)`` of the sorted distinct key ``codes`` present here."""
        if len(codes) == 0 or self.num_keys == 0:
            return EMPTY_I64, EMPTY_I64
        return K.intersect(codes, self.kcodes, self.code_sample(), self.code_runs())

    def match(self, codes: CodeArray, rank: bool = False):
        """``None`` or ``(self, probe_idx, key_idx)``: in memory, a probe needs no copy (one
        native intersection; this runs for every batch of every probed spine, every step).
        ``rank``: probe through :meth:`code_rank`."""
        if len(codes) == 0 or len(self.offsets) <= 1:
            return None
        pi, ki = K.intersect(codes, self.kcodes, self.code_sample(), self.code_runs(),
                             self.code_rank() if rank else None)
        n = len(pi)
        self.hits += n
        return (self, pi, ki) if n else None

    def prefetch_keys(self, codes: CodeArray) -> None:
        pass

    def cut_below(self, bound) -> "OrdIndexedZSet":
        """The keys ``>= bound`` with their values (a zero-copy suffix)."""
        i = _first_at_least(self.kcodes, bound)
        return self if i == 0 else self.slice_keys(i, self.num_keys)

    def cursor(self) -> OrdIndexedZSetCursor:
        return OrdIndexedZSetCursor(self)

    def row_slice(self, r0: int, r1: int) -> "OrdIndexedZSet":
        """Value rows ``r0:r1`` with the keys they belong to (zero-copy). The first and last
        key may keep only part of their values: a *piece*, for streaming merges."""
        n = len(self)
        r0, r1 = max(0, min(r0, n)), max(0, min(r1, n))
        if r0 >= r1:
            return OrdIndexedZSet.empty_like(self)
        if r0 == 0 and r1 == n:
            return self
        off = self.offsets
        ka = int(off.searchsorted(r0, side="right")) - 1
        kb = int(off.searchsorted(r1, side="left"))
        offsets = np.minimum(np.maximum(off[ka:kb + 1], r0), r1) - r0  # ufuncs: cheap calls
        return OrdIndexedZSet(self.keys.slice(ka, kb - ka), Codes.slice(self.kcodes, ka, kb),
                              offsets, self.vals.slice(r0, r1 - r0),
                              Codes.slice(self.vcodes, r0, r1), self.weights[r0:r1],
                              self.kcodec, self.vcodec)

    def iter_pieces(self, rows: int) -> Iterator["OrdIndexedZSet"]:
        """Consecutive pieces of at most ``rows`` value rows (see :meth:`row_slice`)."""
        for lo in range(0, len(self), max(rows, 1)):
            yield self.row_slice(lo, lo + rows)

    def to_memory(self) -> "OrdIndexedZSet":
        return self

    def max_val_code(self) -> Optional[int]:
        """The largest value code (u64 value codes only; None otherwise or when empty)."""
        if len(self) == 0 or not Codes.is_u64(self.vcodes):
            return None
        return int(np.max(self.vcodes))

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


def _distinct_rows_dict(z: ZSet) -> dict[tuple, int]:
    """``{row tuple: weight}`` of a Z-set whose rows are distinct with non-zero weights."""
    out = dict(zip(z._py_rows(), z.weights.tolist()))
    return out if len(out) == len(z) else ZSet.to_dict(z)


def _few_runs(kcodes: CodeArray) -> Optional[np.ndarray]:
    """``code_runs(kcodes)`` when there is at most one run per :data:`RUN_MIN_KEYS` codes."""
    return K.code_runs(kcodes, len(kcodes) // RUN_MIN_KEYS)  # (stops past that many runs)


def memoized(batch: Any, key: Any, make: Callable[[], Any]) -> Any:
    """What a reader derived from an immutable stored ``batch`` (in memory or in a file) and
    reads again every step: ``make()`` the first time, then kept under ``key`` in the batch's
    ``memo`` (made on first use) and dropped with the batch."""
    memo = batch.memo
    if memo is None:
        memo = batch.memo = {}
    if key in memo:
        return memo[key]
    got = memo[key] = make()
    nb = _owned_nbytes(got)
    if nb:
        memo[MEMO_NBYTES] = memo.get(MEMO_NBYTES, 0) + nb
    return got


#: key of a batch's ``memo`` under which :func:`memoized` sums the bytes its entries own
MEMO_NBYTES = "__nbytes"


def memo_nbytes(batch: Any) -> int:
    """Bytes of the arrays :func:`memoized` made for ``batch`` and that own their memory (views
    of the batch's own buffers are not counted twice): part of its ``nbytes_in_memory``, so the
    memory accountant sees a rank directory or a converted value column as it sees the rows."""
    memo = batch.memo
    return memo.get(MEMO_NBYTES, 0) if memo else 0


def _owned_nbytes(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return x.nbytes if x.flags.owndata else 0
    if isinstance(x, tuple):
        return sum(_owned_nbytes(y) for y in x)
    return 0


def exported(b: Any, part: str):
    """``b.keys`` or ``b.vals`` of an immutable batch exported once
    (:func:`~dbsp.algebra.kernels.export_batch`) and kept in its ``memo``, for the native
    kernels that read it (``take_batch_runs``, ``merge_indexed_batches``): a stored batch is
    gathered from step after step and merged later, and an export costs more than a small
    step's gather."""
    return memoized(b, ("export", part), lambda: K.export_batch(getattr(b, part)))


def kept_export(b: Any, part: str):
    """The export of ``b.keys`` / ``b.vals`` kept in its ``memo`` (:func:`keep_exports`,
    :func:`exported`), else None: read without making one."""
    memo = b.memo
    return None if memo is None else memo.get(("export", part))


def keep_exports(b: Any, keys: Any = None, vals: Any = None) -> Any:
    """``b`` with the exports of its ``keys`` / ``vals`` that the kernel which built them handed
    out (``views=[]``) kept for :func:`exported`; returns ``b``."""
    if keys is not None or vals is not None:
        memo = b.memo
        if memo is None:
            memo = b.memo = {}
        if keys is not None:
            memo[("export", "keys")] = keys
        if vals is not None:
            memo[("export", "vals")] = vals
    return b


def match_batches(batches: Sequence[Any], codes: CodeArray) -> list[tuple]:
    """Probe every batch (of a spine snapshot) with the sorted distinct key ``codes``: the list
    of ``(batch, probe_idx, key_idx)`` of the batches with matches (see
    :meth:`BatchReader.match`). Batches in layer files are asked to prefetch first, so their
    reads overlap; in-memory batches are probed at once (this runs for every probed spine of
    every step: a plain loop and a list, not a generator)."""
    if len(codes) == 0:
        return []
    for b in batches:
        if b.is_file:
            b.prefetch_keys(codes)
    out = []
    for b in batches:
        m = b.match(codes)
        if m is not None:
            out.append(m)
    return out


def _first_at_least(codes: CodeArray, bound) -> int:
    """Position of the first code ``>= bound`` (``int`` for u64 codes, ``bytes`` for var) in a
    sorted code array."""
    if len(codes) == 0 or Codes.at(codes, 0) >= bound:
        return 0
    return int(K.lower_bound(codes, Codes.one(bound, like=codes))[0])


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for each start/count (vectorised)."""
    total = int(counts.sum())
    if total == 0:
        return EMPTY_I64
    ends = np.cumsum(counts)
    out = np.ones(total, dtype=np.int64)
    nz = counts > 0
    s, c, e = starts[nz], counts[nz], ends[nz]
    out[0] = s[0]
    if len(s) > 1:
        out[e[:-1]] = s[1:] - (s[:-1] + c[:-1] - 1)
    return np.cumsum(out)


ranges = _ranges


def merge_batches(batches: Sequence[Any]) -> Any:
    """The sum of non-empty consolidated batches of one kind (one native k-way merge; batches
    in layer files are read into memory first)."""
    batches = [b.to_memory() if getattr(b, "is_file", False) else b for b in batches]
    if batches[0].indexed:
        return OrdIndexedZSet.merge(batches)
    return OrdZSet.merge(batches)

__all__ = ["ZSet", "DistinctZSet", "KeyedZSet", "OrdZSet", "OrdIndexedZSet", "BatchReader", "match_batches", "memoized", "merge_batches",
           "ranges", "EMPTY_I64"]


def _side_by_side(keys: pa.RecordBatch, vals: pa.RecordBatch) -> pa.RecordBatch:
    names = keys.schema.names + [n for n in vals.schema.names if n not in keys.schema.names]
    cols = keys.columns + [c for n, c in zip(vals.schema.names, vals.columns)
                           if n not in keys.schema.names]
    return pa.RecordBatch.from_arrays(cols, names=names)


def _named(e: WeightOverflowError, parts: Sequence[pa.RecordBatch]) -> WeightOverflowError:
    """``e`` naming its first group's row: ``parts`` are the rows the kernel was given, one
    batch per run, in order (the error's rows index their concatenation)."""
    r = e.rows[0]
    for p in parts:
        if r < p.num_rows:
            row = p.slice(r, 1).to_pylist()[0]
            return WeightOverflowError(e.rows, e.sums, row, e.where)
        r -= p.num_rows
    return e
