"""File-backed batches: a consolidated batch in one layer file, read through the storage layer.

:class:`FileOrdZSet` and :class:`FileOrdIndexedZSet` answer the batch-probe interface
(:class:`~dbsp.trace.batch.BatchReader`) exactly like their in-memory twins, so a spine holds
either kind; only what a read needs comes into memory, through the process's backend and slab
pool (:mod:`dbsp.storage`).

Goals
-----
* State larger than memory: a file batch keeps in memory only its Bloom filter, the block table
  of its key codes and the reader's index nodes (a few bytes per data block).
* Probes cost block reads, not scans, and their I/O overlaps: a sorted probe is filtered by key
  range and Bloom filter, mapped to the data blocks of the key-code stream with one vectorised
  search over the block table, and all those blocks are read in one backend call (io_uring keeps
  them in flight together); :meth:`prefetch_keys` starts the same reads in the background, which
  :meth:`Spine.lookup <dbsp.trace.spine.Spine.lookup>` does for every batch before probing any.
* Sequential reads (cursors, merges) read ahead: every chunk read prefetches the next one.
* Immutable and self-cleaning: a file is written once (``.mut`` then renamed), never changed,
  and deleted when the last batch object referring to it is gone, unless it is pinned
  (:meth:`BatchFile.pin`, for checkpoints).

Design
------
Layout: an ``OrdZSet`` is one ``ColumnLayer`` (layer 0: row codes, the columns, weights); an
``OrdIndexedZSet`` is ``OrderedLayer -> ColumnLayer`` (layer 0: key codes, key columns, offsets
into layer 1; layer 1: value codes, value columns, weights). The trailer's metadata records the
kind, the codecs' fields, first/last key codes and the largest u64 value code.

A :class:`BatchFile` is the open file (a :class:`~dbsp.storage.reader.LayerFile`) with its
finaliser; file batches are *views* of keys ``[k0, k1)`` of one (``cut_below`` makes a narrower
view, zero I/O beyond one seek). Reads of key or row ranges go through ``LayerFile.read``: a range
inside one data block is a zero-copy view of the pooled block (it pins the slot while alive), a
range across blocks is copied. Selections of scattered keys read them in *clusters*: keys closer
than ``_GAP`` rows share one range read (capped at ``_SPAN`` rows), then Arrow/numpy ``take``
picks the rows.

Writing (:class:`BatchFileSink`) takes consolidated in-memory pieces in order; a key whose values
continue from the previous piece is written once. Pieces come from :func:`write_batch` (spilling
an in-memory batch) or :func:`dbsp.trace.merge_stream.merge_stream` (a streaming merge).

Invariants
----------
* A file batch and the in-memory batch it was written from answer every probe, cursor and piece
  read identically (``tests/storage/test_file_batch.py``).
* Nothing is ever written to an existing batch file.
"""
from __future__ import annotations

import os
import weakref
from typing import Any, Iterator, Optional, Union

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import CodeArray, Codes, KeyCodec
from ..algebra.schema import empty_batch
from ..storage import format as F
from ..storage.reader import LayerFile
from ..storage.writer import LayerFileWriter, LayerSpec
from .batch import OrdIndexedZSet, OrdZSet, memo_nbytes, ranges
from .cursor import as_code

__all__ = ["BatchFile", "FileOrdZSet", "FileOrdIndexedZSet", "FileBatchCursor", "BatchFileSink",
           "write_batch", "open_batch", "is_file_batch"]

_EMPTY = np.zeros(0, dtype=np.int64)
_GAP = 512          # keys/rows closer than this are read as one range
_SPAN = 1 << 16     # ... up to this many rows per range read
_WINDOW = 1 << 15   # rows a cursor window holds


def is_file_batch(b: Any) -> bool:
    return bool(getattr(b, "is_file", False))


def _zero_cols(n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.nulls(n)], names=["_"]).select([])


def _record_batch(cols: list, schema: pa.Schema, n: int) -> pa.RecordBatch:
    if not len(schema):
        return _zero_cols(n)
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def _schema_b64(fields) -> str:
    return F.schema_to_b64(pa.schema(list(fields)))


def _code_json(c) -> Any:
    return c if isinstance(c, int) else {"hex": bytes(c).hex()}


def _code_from_json(v) -> Union[int, bytes, None]:
    if v is None or isinstance(v, int):
        return v
    return bytes.fromhex(v["hex"])


def _clusters(starts: np.ndarray, ends: np.ndarray, gap: int = _GAP, span: int = _SPAN):
    """Group sorted disjoint ranges ``[starts[i], ends[i])`` into reads: ``(lo, hi)`` index
    bounds of each group (ranges closer than ``gap``, within one ``span``-aligned bucket)."""
    n = len(starts)
    if n == 0:
        return []
    brk = np.flatnonzero((starts[1:] - ends[:-1] > gap) | (starts[1:] // span != starts[:-1] // span)) + 1
    b = np.concatenate([[0], brk, [n]]).astype(np.int64)
    return list(zip(b[:-1].tolist(), b[1:].tolist()))


# --- the file ------------------------------------------------------------------------------------

def _release(lf: LayerFile, path: str, state: dict) -> None:
    try:
        lf.close()
    except Exception:  # pragma: no cover - best effort in a finaliser
        pass
    acct = state.get("accountant")
    if acct is not None and state.get("resident"):
        acct.add(resident_delta=-state["resident"])
    if state["pins"] == 0 and state["delete"]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class BatchFile:
    """One open batch file shared by the file batches (views) over it. The file is deleted when
    this object is collected, unless pinned."""

    def __init__(self, path: str, backend=None, *, kcodec: Optional[KeyCodec] = None,
                 vcodec: Optional[KeyCodec] = None, delete: bool = True, accountant=None):
        self.lf = LayerFile(path, backend)
        self.path = path
        md = self.lf.meta.get("metadata") or {}
        self.kind = md.get("kind")
        if self.kind not in ("zset", "indexed"):
            raise ValueError(f"{path}: not a dbsp batch file (metadata kind {self.kind!r})")
        self.indexed = self.kind == "indexed"
        if kcodec is None:
            kcodec = KeyCodec(list(F.schema_from_b64(md["kcodec"])))
        if vcodec is None and self.indexed:
            vcodec = KeyCodec(list(F.schema_from_b64(md["vcodec"])))
        self.kcodec, self.vcodec = kcodec, vcodec
        self.schemas = [self.lf.schema(i) for i in range(self.lf.n_layers)]
        self.n_keys = self.lf.rows(0)
        self.n_rows = self.lf.rows(1) if self.indexed else self.n_keys
        self.first_code = _code_from_json(md.get("first"))
        self.last_code = _code_from_json(md.get("last"))
        self.vmax = md.get("vmax")
        self.var = self.lf.layers[0]["code"] == "var"
        self.file_bytes = self.lf.size
        self.blocks = self.lf.code_blocks(0)
        fr, _, _, _, fc = self.blocks
        self.resident = (0 if self.lf._words is None else self.lf._words.nbytes) + \
            fr.nbytes * 4 + fc.nbytes + 4096
        self._state = {"pins": 0, "delete": delete, "accountant": accountant,
                       "resident": self.resident}
        if accountant is not None:
            accountant.add(resident_delta=self.resident)
        self._fin = weakref.finalize(self, _release, self.lf, path, self._state)

    def __repr__(self) -> str:
        return f"BatchFile({os.path.basename(self.path)}, {self.kind}, {self.n_rows} rows)"

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def pin(self) -> None:
        """Keep the file on disk after this object is gone (a checkpoint refers to it)."""
        self._state["pins"] += 1

    def unpin(self) -> None:
        self._state["pins"] = max(0, self._state["pins"] - 1)

    @property
    def pinned(self) -> bool:
        return self._state["pins"] > 0

    def batch(self) -> Union["FileOrdZSet", "FileOrdIndexedZSet"]:
        """A file batch over the whole file."""
        cls = FileOrdIndexedZSet if self.indexed else FileOrdZSet
        return cls(self, 0, self.n_keys)


def open_batch(path: str, backend=None, *, delete: bool = False):
    """Open an existing batch file (e.g. listed by a checkpoint); not deleted unless
    ``delete``."""
    return BatchFile(path, backend, delete=delete).batch()


# --- file batches ----------------------------------------------------------------------------------

class _FileBatch:
    """Keys ``[k0, k1)`` of a :class:`BatchFile` (common part of both kinds)."""

    is_file = True
    indexed = False

    def __init__(self, file: BatchFile, k0: int, k1: int):
        self.file = file
        self.k0, self.k1 = int(k0), int(k1)
        self._first: Any = None
        self._last: Any = None
        self._probe_memo: Optional[tuple] = None
        #: None, or what a reader derived from this (immutable) batch, as
        #: :attr:`OrdIndexedZSet.memo <dbsp.trace.batch.OrdIndexedZSet>`
        self.memo: Optional[dict] = None
        self.hits = 0
        if self.k0 == 0:
            self._first = file.first_code
        if self.k1 == file.n_keys:
            self._last = file.last_code

    # -- shape ---------------------------------------------------------------------------
    @property
    def lf(self) -> LayerFile:
        return self.file.lf

    @property
    def num_keys(self) -> int:
        return self.k1 - self.k0

    @property
    def nbytes_in_memory(self) -> int:
        return self.file.resident + memo_nbytes(self) if self.memo else self.file.resident

    nbytes_upper = nbytes_in_memory  # (its resident bytes: already cheap)

    @property
    def file_bytes(self) -> int:
        return self.file.file_bytes

    @property
    def path(self) -> str:
        return self.file.path

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.file.name}, keys {self.k0}:{self.k1}, "
                f"{len(self)} rows)")

    def _view(self, k0: int, k1: int):
        return type(self)(self.file, k0, k1)

    def first_code(self):
        if self._first is None and self.k1 > self.k0:
            self._first = Codes.at(self.lf.codes(self.k0, self.k0 + 1, copy=True), 0)
        return self._first

    def last_code(self):
        if self._last is None and self.k1 > self.k0:
            self._last = Codes.at(self.lf.codes(self.k1 - 1, self.k1, copy=True), 0)
        return self._last

    def max_val_code(self) -> Optional[int]:
        return self.file.vmax

    def cut_below(self, bound):
        """The keys ``>= bound`` (a narrower view of the same file; one seek)."""
        if self.k1 == self.k0 or self.first_code() >= bound:
            return self
        if self.last_code() < bound:
            return self._view(self.k1, self.k1)
        i = self.lf.lower_bound(bound, self.k0, self.k1, layer=0)
        return self._view(i, self.k1)

    # -- probes ----------------------------------------------------------------------------
    def _candidates(self, codes: CodeArray):
        """``(cand, blk)``: positions in ``codes`` that may be keys of this view (key range and
        Bloom filter), and the code block each falls in. Memoised for the last probe, so
        :meth:`prefetch_keys` followed by :meth:`probe_keys` does the work once."""
        memo = self._probe_memo
        if memo is not None and memo[0] is codes:
            return memo[1], memo[2]
        n = len(codes)
        cand = _EMPTY
        blk = _EMPTY
        if n and self.k1 > self.k0:
            lo = int(K.lower_bound(codes, Codes.one(self.first_code(), like=codes))[0])
            hi = int(K.upper_bound(codes, Codes.one(self.last_code(), like=codes))[0])
            if hi > lo:
                sub = Codes.slice(codes, lo, hi)
                cand = np.arange(lo, hi, dtype=np.int64)
                if self.lf.has_filter:
                    ok = self.lf.may_contain_many(sub)
                    if not ok.all():
                        cand = cand[ok]
                        sub = K.take(codes, cand)
                if len(cand):
                    fc = self.file.blocks[4]
                    blk = K.upper_bound(fc, sub) - 1
        self._probe_memo = (codes, cand, blk)
        return cand, blk

    def prefetch_keys(self, codes: CodeArray) -> None:
        """Start reading (in the background) the key-code blocks :meth:`probe_keys` will read."""
        cand, blk = self._candidates(codes)
        if len(blk):
            _, _, offs, exts, _ = self.file.blocks
            u = np.unique(blk)
            self.lf.prefetch_extents(list(zip(offs[u].tolist(), exts[u].tolist())))

    def probe_keys(self, codes: CodeArray) -> tuple[np.ndarray, np.ndarray]:
        """``(probe_idx, key_idx)`` of the sorted distinct ``codes`` that are keys here (key
        indices relative to this view), ascending."""
        cand, blk = self._candidates(codes)
        self._probe_memo = None
        if len(cand) == 0:
            return _EMPTY, _EMPTY
        starts = np.flatnonzero(np.concatenate([[True], blk[1:] != blk[:-1]]))
        ends = np.append(starts[1:], len(blk))
        ids = blk[starts].tolist()
        where = dict(zip(ids, zip(starts.tolist(), ends.tolist())))
        out_p, out_k = [], []
        for b, first_row, bcodes in self.lf.code_block_views(ids):
            s, e = where[b]
            pc = cand[s:e]
            pi, bi = K.intersect(K.take(codes, pc), bcodes)
            del bcodes
            if len(pi):
                kk = bi + first_row
                ok = (kk >= self.k0) & (kk < self.k1)
                out_p.append(pc[pi[ok]])
                out_k.append(kk[ok] - self.k0)
        if not out_p:
            return _EMPTY, _EMPTY
        return np.concatenate(out_p), np.concatenate(out_k)

    def match(self, codes: CodeArray):
        """``None`` or ``(in-memory batch of the matched keys, probe_idx, arange)``."""
        pi, ki = self.probe_keys(codes)
        self.hits += len(pi)
        if len(pi) == 0:
            return None
        return self.select_keys(ki), pi, np.arange(len(ki), dtype=np.int64)

    # -- key-range reads -------------------------------------------------------------------
    def _layer_take(self, layer: int, idx: np.ndarray, *, columns: bool = True,
                    weights: bool = True, offsets: bool = False):
        """Rows ``idx`` (absolute, ascending) of a layer: ``(codes, column arrays, weights,
        offsets lo, offsets hi)``, read cluster by cluster (see the module doc)."""
        lf = self.lf
        L = lf.layers[layer]
        ncols = len(L["columns"])
        clusters = _clusters(idx, idx + 1)
        ext = []
        if len(clusters) > 1:
            for a, b in clusters:
                ext += lf.extents(int(idx[a]), int(idx[b - 1]) + 1, layer,
                                  None if columns else [], True, weights, offsets)
            lf.prefetch_extents(ext)
        codes, cols, ws, olo, ohi = [], [[] for _ in range(ncols)], [], [], []
        for a, b in clusters:
            i, j = int(idx[a]), int(idx[b - 1]) + 1
            rel = idx[a:b] - i
            codes.append(K.take(lf.codes(i, j, layer), rel))
            if columns:
                ra = pa.array(rel, type=pa.int64())
                for c in range(ncols):
                    cols[c].append(lf.column(c, i, j, layer).take(ra))
            if weights and L["weights"] is not None:
                ws.append(lf.weights(i, j, layer)[rel])
            if offsets:
                o = lf.offsets(i, j + 1, layer)
                olo.append(o[rel])
                ohi.append(o[rel + 1])
        cat = np.concatenate
        codes = codes[0] if len(codes) == 1 else K.concat(codes)
        cols = [c[0] if len(c) == 1 else pa.concat_arrays(c) for c in cols] if columns else None
        ws = (cat(ws) if ws else None)
        return codes, cols, ws, (cat(olo) if olo else None), (cat(ohi) if ohi else None)

    def _layer_ranges(self, layer: int, lo: np.ndarray, hi: np.ndarray):
        """The rows of the disjoint ascending ranges ``[lo[i], hi[i])`` of a layer, concatenated:
        ``(codes, column arrays, weights)``."""
        lf = self.lf
        L = lf.layers[layer]
        ncols = len(L["columns"])
        keep = hi > lo
        lo, hi = lo[keep], hi[keep]
        clusters = _clusters(lo, hi)
        if len(clusters) > 1:
            ext = []
            for a, b in clusters:
                ext += lf.extents(int(lo[a]), int(hi[b - 1]), layer)
            lf.prefetch_extents(ext)
        codes, cols, ws = [], [[] for _ in range(ncols)], []
        for a, b in clusters:
            i, j = int(lo[a]), int(hi[b - 1])
            if b - a == 1:
                ch = lf.read(i, j, layer, copy=True)
                codes.append(ch.codes)
                for c in range(ncols):
                    cols[c].append(ch.columns[c])
                ws.append(ch.weights)
                continue
            rel = ranges(lo[a:b] - i, hi[a:b] - lo[a:b])
            ra = pa.array(rel, type=pa.int64())
            codes.append(K.take(lf.codes(i, j, layer), rel))
            for c in range(ncols):
                cols[c].append(lf.column(c, i, j, layer).take(ra))
            ws.append(lf.weights(i, j, layer)[rel])
        if not codes:
            return None
        codes = codes[0] if len(codes) == 1 else K.concat(codes)
        cols = [c[0] if len(c) == 1 else pa.concat_arrays(c) for c in cols]
        return codes, cols, (ws[0] if len(ws) == 1 else np.concatenate(ws))

    # -- sequential reads --------------------------------------------------------------------
    def cursor(self):
        return FileBatchCursor(self)

    def keys_between(self, lo=None, hi=None):
        """The keys with codes in ``[lo, hi)`` (None: unbounded) as an in-memory batch."""
        a = self.k0 if lo is None else self.lf.lower_bound(lo, self.k0, self.k1)
        b = self.k1 if hi is None else self.lf.lower_bound(hi, self.k0, self.k1)
        return self._view(a, max(a, b)).to_memory()

    def to_dict(self) -> dict:
        return self.to_memory().to_dict()

    def to_arrow(self) -> pa.Table:
        return self.to_memory().to_arrow()

    def flatten(self):
        return self.to_memory().flatten()


class FileOrdZSet(_FileBatch):
    """An :class:`~dbsp.trace.batch.OrdZSet` in a layer file (see the module doc)."""

    indexed = False

    def __init__(self, file: BatchFile, k0: int, k1: int):
        super().__init__(file, k0, k1)
        self.codec = file.kcodec
        self.schema = file.schemas[0]

    def __len__(self) -> int:
        return self.k1 - self.k0

    def _chunk(self, i: int, j: int, copy: bool = False) -> OrdZSet:
        ch = self.lf.read(i, j, 0, copy=copy)
        return OrdZSet(_record_batch(ch.columns, self.schema, j - i), ch.weights, ch.codes,
                       self.codec)

    def to_memory(self) -> OrdZSet:
        if self.k1 == self.k0:
            return _empty_zset(self.schema, self.codec, self.file.var)
        return self._chunk(self.k0, self.k1, copy=True)

    def select_keys(self, idx: np.ndarray) -> OrdZSet:
        """Rows ``idx`` (relative, ascending) as an in-memory :class:`OrdZSet`."""
        if len(idx) == 0:
            return _empty_zset(self.schema, self.codec, self.file.var)
        codes, cols, ws, _, _ = self._layer_take(0, np.asarray(idx, np.int64) + self.k0)
        return OrdZSet(_record_batch(cols, self.schema, len(idx)), ws, codes, self.codec)

    def row_weights(self, codes: CodeArray) -> np.ndarray:
        """The weight of each sorted distinct row code (0 where absent)."""
        out = np.zeros(len(codes), np.int64)
        pi, ki = self.probe_keys(codes)
        self.hits += len(pi)
        if len(pi):
            _, _, ws, _, _ = self._layer_take(0, ki + self.k0, columns=False)
            out[pi] = ws
        return out

    def iter_pieces(self, rows: int, copy: bool = True) -> Iterator[OrdZSet]:
        """Consecutive in-memory slices of at most ``rows`` rows, each read prefetching the
        next (``copy``: no pool pins survive a piece)."""
        rows = max(rows, 1)
        for lo in range(self.k0, self.k1, rows):
            hi = min(lo + rows, self.k1)
            if hi < self.k1:
                self.lf.prefetch(hi, min(hi + rows, self.k1), 0)
            yield self._chunk(lo, hi, copy)

    def _window(self, k: int, rows: int):
        hi = min(k + rows, self.k1)
        if hi < self.k1:
            self.lf.prefetch(hi, min(hi + rows, self.k1), 0)
        return self._chunk(k, hi)


class FileOrdIndexedZSet(_FileBatch):
    """An :class:`~dbsp.trace.batch.OrdIndexedZSet` in a layer file (see the module doc)."""

    indexed = True

    def __init__(self, file: BatchFile, k0: int, k1: int):
        super().__init__(file, k0, k1)
        self.kcodec, self.vcodec = file.kcodec, file.vcodec
        self.key_schema, self.val_schema = file.schemas[0], file.schemas[1]
        if k0 == 0 and k1 == file.n_keys:
            self.r0, self.r1 = 0, file.n_rows
        elif k1 > k0:
            o = self.lf.offsets(k0, k0 + 1, copy=True)
            o2 = self.lf.offsets(k1, k1 + 1, copy=True)
            self.r0, self.r1 = int(o[0]), int(o2[0])
        else:
            self.r0 = self.r1 = 0

    def __len__(self) -> int:
        return self.r1 - self.r0

    def _empty(self) -> OrdIndexedZSet:
        return OrdIndexedZSet.empty_like(self)

    def _build(self, k: tuple, v: tuple, offsets: np.ndarray) -> OrdIndexedZSet:
        kc, kcols = k
        vc, vcols, w = v
        return OrdIndexedZSet(_record_batch(kcols, self.key_schema, len(offsets) - 1), kc,
                              offsets, _record_batch(vcols, self.val_schema, len(w)), vc, w,
                              self.kcodec, self.vcodec)

    def _chunk(self, k0: int, k1: int, r0: int, r1: int, copy: bool = False) -> OrdIndexedZSet:
        """Keys ``[k0, k1)`` cut to value rows ``[r0, r1)`` (a piece when rows split keys)."""
        lf = self.lf
        c0 = lf.read(k0, k1, 0, copy=copy)
        c1 = lf.read(r0, r1, 1, copy=copy)
        off = np.clip(c0.offsets, r0, r1) - r0
        return self._build((c0.codes, c0.columns), (c1.codes, c1.columns, c1.weights), off)

    def to_memory(self) -> OrdIndexedZSet:
        if self.k1 == self.k0:
            return self._empty()
        return self._chunk(self.k0, self.k1, self.r0, self.r1, copy=True)

    def select_keys(self, key_idx: np.ndarray) -> OrdIndexedZSet:
        """The keys ``key_idx`` (relative, ascending) with their values, in memory."""
        if len(key_idx) == 0:
            return self._empty()
        ks = np.asarray(key_idx, np.int64) + self.k0
        kc, kcols, _, olo, ohi = self._layer_take(0, ks, weights=False, offsets=True)
        counts = ohi - olo
        offsets = np.zeros(len(ks) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        vc, vcols, w = self._layer_ranges(1, olo, ohi)
        return self._build((kc, kcols), (vc, vcols, w), offsets)

    def iter_pieces(self, rows: int, copy: bool = True) -> Iterator[OrdIndexedZSet]:
        """Consecutive in-memory pieces of at most ``rows`` value rows (the first and last key
        of a piece may hold part of their values), each read prefetching the next."""
        rows = max(rows, 1)
        lf = self.lf
        k = self.k0
        while k < self.k1:
            kb = min(k + rows, self.k1)
            c0 = lf.read(k, kb, 0, copy=True)
            if kb < self.k1:
                lf.prefetch(kb, min(kb + rows, self.k1), 0)
            off = c0.offsets
            keys = _record_batch(c0.columns, self.key_schema, kb - k)
            r, rend = int(off[0]), int(off[-1])
            while r < rend:
                r1 = min(r + rows, rend)
                if r1 < rend:
                    lf.prefetch(r1, min(r1 + rows, rend), 1)
                c1 = lf.read(r, r1, 1, copy=copy)
                ka = int(np.searchsorted(off, r, side="right")) - 1
                kz = int(np.searchsorted(off, r1, side="left"))
                o = np.clip(off[ka:kz + 1], r, r1) - r
                yield OrdIndexedZSet(keys.slice(ka, kz - ka), Codes.slice(c0.codes, ka, kz), o,
                                     _record_batch(c1.columns, self.val_schema, r1 - r),
                                     c1.codes, c1.weights, self.kcodec, self.vcodec)
                r = r1
            k = kb

    def _window(self, k: int, rows: int):
        """Whole keys from ``k`` with at most ``rows`` values (at least one key)."""
        lf = self.lf
        kmax = min(k + rows, self.k1)
        off = lf.offsets(k, kmax + 1, copy=True)
        n = int(np.searchsorted(off, off[0] + rows, side="right")) - 1
        kb = k + max(n, 1)
        if kb < self.k1:
            lf.prefetch(kb, min(kb + rows, self.k1), 0)
        return self._chunk(k, kb, int(off[0]), int(off[kb - k]))


def _empty_zset(schema: pa.Schema, codec: KeyCodec, var: bool) -> OrdZSet:
    return OrdZSet(empty_batch(schema), _EMPTY, Codes.empty(not var), codec)


# --- cursor ------------------------------------------------------------------------------------------

class FileBatchCursor:
    """The cursor vocabulary over a file batch: a window of whole keys in memory (views of the
    pooled blocks where they allow), the in-memory cursor over it, and a prefetch of the next
    window whenever one is loaded. ``seek_key`` past the window seeks the file's index."""

    def __init__(self, fb: _FileBatch, window_rows: int = _WINDOW):
        self.fb = fb
        self.window_rows = window_rows
        self._win = None
        self._inner = None
        self._wk0 = self._wk1 = fb.k0
        self._wlast = None
        self.rewind_keys()

    def _load(self, k: int) -> None:
        fb = self.fb
        if k >= fb.k1:
            self._win = self._inner = None
            self._wk0 = self._wk1 = fb.k1
            return
        w = fb._window(k, self.window_rows)
        self._win = w
        self._wk0, self._wk1 = k, k + w.num_keys
        self._inner = w.cursor()
        kc = w.kcodes if fb.indexed else w.codes
        self._wlast = Codes.at(kc, len(kc) - 1)

    @property
    def batch(self):
        """The in-memory window (what ``val_range`` indexes into)."""
        return self._win

    @property
    def key_index(self) -> int:
        return self._wk0 - self.fb.k0 + self._inner.key_index

    def key_valid(self) -> bool:
        return self._inner is not None and self._inner.key_valid()

    def key(self) -> tuple:
        return self._inner.key()

    def key_code(self):
        return self._inner.key_code()

    def step_key(self) -> None:
        if self._inner is None:
            return
        self._inner.step_key()
        if not self._inner.key_valid():
            self._load(self._wk1)

    def seek_key(self, key) -> None:
        codec = self.fb.kcodec if self.fb.indexed else self.fb.codec
        self.seek_key_code(as_code(codec, key))

    def seek_key_code(self, code) -> None:
        if self._inner is None:
            return
        if code <= self._wlast:
            self._inner.seek_key_code(code)
            return
        k = self.fb.lf.lower_bound(code, self._wk1, self.fb.k1)
        self._load(k)

    def rewind_keys(self) -> None:
        self._load(self.fb.k0)

    def val_valid(self) -> bool:
        return self._inner is not None and self._inner.val_valid()

    def val(self) -> tuple:
        return self._inner.val()

    def val_code(self):
        return self._inner.val_code()

    def weight(self) -> int:
        return self._inner.weight()

    def step_val(self) -> None:
        if self._inner is not None:
            self._inner.step_val()

    def seek_val(self, val=()) -> None:
        if self._inner is not None:
            self._inner.seek_val(val)

    def seek_val_code(self, code) -> None:
        if self._inner is not None:
            self._inner.seek_val_code(code)

    def rewind_vals(self) -> None:
        if self._inner is not None:
            self._inner.rewind_vals()

    def val_range(self) -> tuple[int, int]:
        return self._inner.val_range() if self._inner is not None else (0, 0)

    def keys_between(self, lo=None, hi=None):
        codec = self.fb.kcodec if self.fb.indexed else self.fb.codec
        return self.fb.keys_between(None if lo is None else as_code(codec, lo),
                                    None if hi is None else as_code(codec, hi))


# --- writing -----------------------------------------------------------------------------------------

def batch_codecs(proto) -> tuple:
    """``(key codec, value codec or None)`` of the batches like ``proto``."""
    return (proto.kcodec, proto.vcodec) if proto.indexed else (proto.codec, None)


def open_written(storage, path: str, kcodec, vcodec):
    """The batch of a file just written for ``storage`` (by a sink here or by the worker's merge
    helper), counted in its statistics and its resident memory in the accountant."""
    storage.files_written += 1
    bf = BatchFile(path, storage.backend, kcodec=kcodec, vcodec=vcodec,
                   accountant=storage.accountant)
    storage.bytes_written += bf.file_bytes
    return bf.batch()


class BatchFileSink:
    """Writes consolidated in-memory pieces, in order, into one new batch file.

    ``proto``: a batch of the kind written (schemas and codecs). ``expected_keys``: an upper
    bound on the keys (sizes the Bloom filter up front, so nothing grows per key)."""

    def __init__(self, storage, proto, expected_keys: int, name: str = ""):
        self.storage = storage
        self.indexed = bool(proto.indexed)
        self.path = storage.new_path()
        self.kcodec, self.vcodec = batch_codecs(proto)
        if self.indexed:
            kcode = "u64" if self.kcodec.u64 else "var"
            kcode = _codes_kind(proto, "k", kcode)
            vcode = _codes_kind(proto, "v", "u64" if self.vcodec.u64 else "var")
            specs = [LayerSpec(kcode, proto.key_schema, weights=False, offsets=True),
                     LayerSpec(vcode, proto.val_schema, weights=True)]
            md = {"kind": "indexed", "kcodec": _schema_b64(self.kcodec.fields),
                  "vcodec": _schema_b64(self.vcodec.fields)}
        else:
            kcode = _codes_kind(proto, "k", "u64" if self.kcodec.u64 else "var")
            specs = [LayerSpec(kcode, proto.schema, weights=True)]
            md = {"kind": "zset", "kcodec": _schema_b64(self.kcodec.fields)}
        md["spine"] = name
        self.meta = md
        self.w = LayerFileWriter(self.path, specs, expected_keys=max(int(expected_keys), 1),
                                 metadata=md, **storage.writer_options())
        self.rows = 0
        self.keys = 0
        self.first = None
        self.last = None
        self.vmax: Optional[int] = None

    def append(self, piece) -> None:
        n = len(piece)
        if n == 0:
            return
        w = self.w
        if not self.indexed:
            w.append(piece.codes, columns=list(piece.data.columns), weights=piece.weights)
            if self.first is None:
                self.first = Codes.at(piece.codes, 0)
            self.last = Codes.at(piece.codes, n - 1)
            self.rows += n
            self.keys += n
            return
        kc = piece.kcodes
        nk = len(kc)
        skip = 1 if self.last is not None and Codes.at(kc, 0) == self.last else 0
        if nk > skip:
            kcols = [c.slice(skip) for c in piece.keys.columns] if skip else \
                list(piece.keys.columns)
            w.append(Codes.slice(kc, skip, nk), columns=kcols,
                     offsets=piece.offsets[skip:nk] + self.rows, layer=0)
            self.keys += nk - skip
        w.append(piece.vcodes, columns=list(piece.vals.columns), weights=piece.weights, layer=1)
        if self.first is None:
            self.first = Codes.at(kc, 0)
        self.last = Codes.at(kc, nk - 1)
        self.rows += n
        if Codes.is_u64(piece.vcodes):
            m = int(piece.vcodes.max())
            self.vmax = m if self.vmax is None else max(self.vmax, m)

    def finish_path(self) -> Optional[str]:
        """Close the file and return its path, not opened (None if nothing was written; the
        file is then removed)."""
        if self.rows == 0:
            self.w.abort()
            return None
        self.meta.update({"first": _code_json(self.first), "last": _code_json(self.last),
                          "vmax": self.vmax, "rows": self.rows, "keys": self.keys})
        self.w.metadata = self.meta
        return self.w.finish()

    def finish(self):
        """Close the file and return a file batch over it (None if nothing was written; the
        file is then removed)."""
        path = self.finish_path()
        return None if path is None else open_written(self.storage, path, self.kcodec,
                                                      self.vcodec)

    def abort(self) -> None:
        self.w.abort()


def _codes_kind(proto, which: str, default: str) -> str:
    """Whether the key / value codes of ``proto`` are u64 or var (value codes need not follow
    their codec: version numbers are u64 under an empty codec)."""
    if proto.is_file:
        lf = proto.lf
        layer = 0 if which == "k" or not proto.indexed else 1
        return lf.layers[layer]["code"]
    codes = (proto.kcodes if which == "k" else proto.vcodes) if proto.indexed else proto.codes
    return Codes.kind(codes)


def write_batch(storage, batch, name: str = "", chunk_rows: int = 1 << 16):
    """Write an in-memory consolidated batch to a new file; returns the file batch (``None`` for
    an empty batch)."""
    if len(batch) == 0:
        return None
    sink = BatchFileSink(storage, batch, batch.num_keys, name)
    try:
        for piece in batch.iter_pieces(chunk_rows):
            sink.append(piece)
        return sink.finish()
    except BaseException:
        sink.abort()
        raise
