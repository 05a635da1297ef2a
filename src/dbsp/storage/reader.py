"""Reader of layer files (format: :mod:`dbsp.storage.format`), built for cursors.

A cursor over a file-backed layer needs a few things, each in O(log n) block reads or better:

* ``codes(i, j)``, ``column(c, i, j)``, ``weights(i, j)``, ``offsets(i, j)``: row ranges as
  numpy / Arrow **views** of the pooled block when the range lies in one data block (a copy only
  when it spans blocks); ``read(i, j)`` returns all of a layer's streams at once, and
  ``boundary(i)`` tells where the next block of any stream starts, so a cursor that steps
  ``i -> boundary(i)`` only ever gets zero-copy views;
* ``lower_bound(probe, lo, hi)``: the first row in ``[lo, hi)`` whose code is ``>= probe``,
  descending the code stream's index (first code of every child) then searching one block;
* ``may_contain(code)``: the Bloom filter over layer 0's codes;
* ``prefetch(i, j)``: start reading every block of rows ``[i, j)`` in the background.

Views pin their pool slot for as long as they (or anything made from them) are alive, so hold
them only while needed. Index blocks are decoded into small private arrays and cached per file.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from .._native import block as _nb
from ..algebra.codes import VarCodes
from . import format as F
from .backend import default_backend
from .format import (BLOCK_ALIGN, HEADER_SIZE, TAIL, CorruptBlockError,
                     FormatVersionError, Physical, TruncatedFileError)

__all__ = ["LayerFile", "LayerChunk", "StreamInfo", "read_metadata"]

_NODE_CACHE = 512


@dataclass
class StreamInfo:
    sid: int
    layer: int
    role: str
    name: str
    phys: Physical
    nullable: bool
    rows: int
    blocks: int
    index_blocks: int
    depth: int
    root: Optional[tuple]
    keyed: bool
    arrow_type: Optional[pa.DataType]
    bytes_raw: int
    bytes_stored: int


@dataclass
class LayerChunk:
    """Rows ``[start, stop)`` of one layer: codes, columns (Arrow), weights, and for ordered
    layers ``offsets`` = offsets[start:stop + 1] (into the next layer)."""

    start: int
    stop: int
    codes: Union[np.ndarray, VarCodes]
    columns: list
    weights: Optional[np.ndarray]
    offsets: Optional[np.ndarray]


class _Node:
    __slots__ = ("first", "offs", "exts", "keys", "kdata", "first_row", "rows", "level")


def _read_exact(fd: int, n: int, off: int) -> bytes:
    b = os.pread(fd, n, off)
    if len(b) != n:
        raise TruncatedFileError(f"short read at offset {off}")
    return b


def read_metadata(path: Union[str, os.PathLike]) -> dict:
    """Check the tail and trailer of a layer file and return the trailer (as a dict) with
    ``file_size``, ``trailer_offset`` and ``trailer_extent`` added. Raises
    TruncatedFileError, FormatVersionError or CorruptBlockError."""
    path = os.fspath(path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < BLOCK_ALIGN or size % BLOCK_ALIGN:
            raise TruncatedFileError(
                f"{path}: not a complete dbsp layer file: size {size} B is not a positive "
                f"multiple of {BLOCK_ALIGN} (truncated?)")
        tail = _read_exact(fd, TAIL.size, size - TAIL.size)
        magic, version, textent, fsize, incompat, compat = TAIL.unpack(tail)
        if magic != F.TAIL_MAGIC:
            raise TruncatedFileError(
                f"{path}: no layer file trailer at the end of the file ({size} B): truncated "
                f"or not a dbsp layer file")
        if fsize != size:
            raise TruncatedFileError(
                f"{path}: file is {size} B but its trailer says {fsize} B (truncated or "
                f"extended)")
        if version > F.FORMAT_VERSION or version < F.MIN_READ_VERSION:
            raise FormatVersionError(
                f"{path}: layer file format version {version}; this dbsp reads versions "
                f"{F.MIN_READ_VERSION}..{F.FORMAT_VERSION}")
        if incompat & ~F.INCOMPAT_KNOWN:
            raise FormatVersionError(
                f"{path}: unknown incompatible features {incompat & ~F.INCOMPAT_KNOWN:#x}; "
                f"a newer dbsp wrote it")
        if textent % BLOCK_ALIGN or textent < BLOCK_ALIGN or textent > size:
            raise CorruptBlockError(path, size - TAIL.size, f"bad trailer extent {textent}")
        toff = size - textent
        tb = _read_exact(fd, textent, toff)
        code = _nb.verify_block(tb, textent)
        if code:
            raise CorruptBlockError(path, toff, "trailer: " + F.verify_reason(code))
        h = F.BlockHeader.parse(tb)
        if h.kind != F.KIND_TRAILER:
            raise CorruptBlockError(path, toff, f"expected the trailer, found kind {h.kind}")
        meta = F.loads_trailer(tb[HEADER_SIZE:HEADER_SIZE + h.stored])
        meta["file_size"] = size
        meta["trailer_offset"] = toff
        meta["trailer_extent"] = textent
        return meta
    finally:
        os.close(fd)


def _ipc_block(buf: pa.Buffer, t: pa.DataType, n: int, path: str, s) -> pa.Array:
    """The column of an ``ipc`` data block (see :mod:`dbsp.storage.format`): zero-copy views
    over ``buf``. A block whose message does not hold ``n`` rows of type ``t`` is corrupt (its
    checksum passed, so the writer was wrong or the file foreign)."""
    try:
        tab = pa.ipc.open_stream(buf).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptBlockError(path, 0, f"column {s.name!r}: bad Arrow IPC block: {e}") from e
    if tab.num_columns != 1 or tab.num_rows != n or tab.column(0).type != t:
        types = ", ".join(str(f.type) for f in tab.schema)
        raise CorruptBlockError(path, 0, f"column {s.name!r}: IPC block holds "
                                f"{tab.num_rows} rows of ({types}), expected {n} of {t}")
    col = tab.column(0)
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


class LayerFile:
    """An open layer file. ``backend``: a :mod:`dbsp.storage.backend` backend (default: the
    process-wide one). Thread-safe for reads."""

    def __init__(self, path: Union[str, os.PathLike], backend=None):
        self.path = os.fspath(path)
        self.meta = read_metadata(self.path)
        self.backend = backend if backend is not None else default_backend()
        self.size = self.meta["file_size"]
        self.version = self.meta["version"]
        self.block_size = self.meta["block_size"]
        self.streams: list[StreamInfo] = []
        for sid, s in enumerate(self.meta["streams"]):
            at = None
            self.streams.append(StreamInfo(
                sid, s["layer"], s["role"], s["name"], Physical.from_json(s["phys"]),
                s["nullable"], s["rows"], s["blocks"], s["index_blocks"], s["depth"],
                tuple(s["root"]) if s["root"] else None, s["keyed"], at, s["bytes_raw"],
                s["bytes_stored"]))
        self.layers = self.meta["layers"]
        self.schemas: list[Optional[pa.Schema]] = []
        for li, L in enumerate(self.layers):
            sch = F.schema_from_b64(L["schema"]) if L["schema"] else None
            self.schemas.append(sch)
            if sch is not None:
                for f, sid in zip(sch, L["columns"]):
                    self.streams[sid].arrow_type = f.type
        self._fh = self.backend.open(self.path)
        if self._fh.size != self.size:
            raise TruncatedFileError(f"{self.path}: size changed while opening")
        self._nodes: dict = {}
        self._nodes_lock = threading.Lock()
        self._words = None
        self._bloom_k = 0
        self._bloom_seed = 0
        filt = self.meta.get("filter")
        if filt:
            self._load_filter(filt)
        self.closed = False

    # -- basics ------------------------------------------------------------------------------

    @property
    def n_rows(self) -> int:
        """Rows of layer 0."""
        return self.layers[0]["rows"]

    def rows(self, layer: int = 0) -> int:
        return self.layers[layer]["rows"]

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def schema(self, layer: int = 0) -> Optional[pa.Schema]:
        return self.schemas[layer]

    def close(self):
        if not self.closed:
            self.closed = True
            self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def __repr__(self):
        return (f"LayerFile({self.path!r}, layers={[L['rows'] for L in self.layers]}, "
                f"backend={self.backend.name})")

    def _stream(self, layer: int, role: str, col=None) -> StreamInfo:
        L = self.layers[layer]
        if role == "codes":
            return self.streams[L["codes"]]
        if role == "column":
            cols = L["columns"]
            if isinstance(col, str):
                names = [self.streams[s].name for s in cols]
                if col not in names:
                    raise KeyError(f"layer {layer} has no column {col!r}; columns: {names}")
                col = names.index(col)
            return self.streams[cols[col]]
        sid = L[role]
        if sid is None:
            raise ValueError(f"layer {layer} has no {role}")
        return self.streams[sid]

    # -- blocks ------------------------------------------------------------------------------

    def _load_filter(self, filt: dict):
        off, ext = filt["offset"], filt["extent"]
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            b = _read_exact(fd, ext, off)
        finally:
            os.close(fd)
        F.verify_block(b, ext, self.path, off)
        h = F.BlockHeader.parse(b)
        if h.kind != F.KIND_FILTER or h.aux != filt["words"]:
            raise CorruptBlockError(self.path, off, "filter block does not match the trailer")
        self._words = np.frombuffer(b, dtype=np.uint64, count=h.aux,
                                    offset=HEADER_SIZE + h.bufs[0]).copy()
        self._bloom_k = filt["k"]
        self._bloom_seed = filt["seed"]

    def _read(self, extents):
        return self._fh.read(extents)

    def _node(self, sid: int, off: int, ext: int, first_row: int, rows: int) -> _Node:
        nd = self._nodes.get(off)
        if nd is not None:
            return nd
        buf = self._read([(off, ext)])[0]
        h = F.BlockHeader.parse(buf)
        if h.kind != F.KIND_INDEX or h.stream != sid or h.first_row != first_row or \
                h.aux != rows or h.n == 0:
            raise CorruptBlockError(self.path, off, f"index block does not match its parent "
                                    f"(stream {h.stream}/{sid}, rows {h.first_row}+{h.aux} vs "
                                    f"{first_row}+{rows}, kind {h.kind})")
        n = h.n
        nd = _Node()
        b0, b1, b2, b3 = h.bufs
        base = HEADER_SIZE
        nd.first = np.frombuffer(buf, dtype="<u8", count=n, offset=base + b0).astype(np.int64)
        nd.offs = np.frombuffer(buf, dtype="<u8", count=n, offset=base + b1).astype(np.int64)
        nd.exts = np.frombuffer(buf, dtype="<u4", count=n, offset=base + b2).astype(np.int64)
        nd.keys = None
        nd.kdata = None
        if h.flags & F.FLAG_KEYS:
            if h.flags & F.FLAG_VARKEYS:
                ko = np.frombuffer(buf, dtype="<i8", count=n + 1, offset=base + b3).copy()
                dpos = base + b3 + ((8 * (n + 1) + 63) // 64) * 64
                nd.keys = ko
                nd.kdata = np.frombuffer(buf, dtype=np.uint8, count=int(ko[-1]),
                                         offset=dpos).copy()
            else:
                nd.keys = np.frombuffer(buf, dtype="<u8", count=n, offset=base + b3).copy()
        nd.first_row = first_row
        nd.rows = rows
        nd.level = h.level
        # bounds: children sorted, first child at the node's start, inside the node
        if nd.first[0] != first_row or (n > 1 and not bool(np.all(nd.first[1:] > nd.first[:-1]))) \
                or nd.first[-1] >= first_row + rows or bool(np.any(nd.offs % BLOCK_ALIGN)) or \
                bool(np.any(nd.offs + nd.exts > self.size)):
            raise CorruptBlockError(self.path, off, "index block entries out of bounds")
        del buf
        with self._nodes_lock:
            if len(self._nodes) >= _NODE_CACHE:
                self._nodes.pop(next(iter(self._nodes)))
            self._nodes[off] = nd
        return nd

    def _data_blocks(self, s: StreamInfo, i: int, j: int) -> list:
        """(first_row, rows, offset, extent) of the data blocks of stream s overlapping [i, j)."""
        if s.root is None or i >= j:
            return []
        out: list = []
        self._collect(s, s.root[0], s.root[1], 0, s.rows, i, j, s.depth, out)
        return out

    def _collect(self, s, off, ext, first_row, rows, i, j, level, out):
        nd = self._node(s.sid, off, ext, first_row, rows)
        if nd.level != level:
            raise CorruptBlockError(self.path, off, f"index level {nd.level}, expected {level}")
        first = nd.first
        a = max(int(np.searchsorted(first, i, side="right")) - 1, 0)
        b = int(np.searchsorted(first, j, side="left"))
        end = first_row + rows
        for k in range(a, b):
            c0 = int(first[k])
            c1 = int(first[k + 1]) if k + 1 < len(first) else end
            if level == 1:
                out.append((c0, c1 - c0, int(nd.offs[k]), int(nd.exts[k])))
            else:
                self._collect(s, int(nd.offs[k]), int(nd.exts[k]), c0, c1 - c0, i, j,
                              level - 1, out)

    def _check_data(self, buf, s: StreamInfo, blk) -> F.BlockHeader:
        h = F.BlockHeader.parse(buf)
        if h.kind != F.KIND_DATA or h.stream != s.sid or h.first_row != blk[0] or h.n != blk[1]:
            raise CorruptBlockError(self.path, blk[2], f"data block does not match the index "
                                    f"(stream {h.stream}/{s.sid}, rows {h.first_row}+{h.n} vs "
                                    f"{blk[0]}+{blk[1]}, kind {h.kind})")
        return h

    # -- row ranges --------------------------------------------------------------------------

    def _check_range(self, s: StreamInfo, i: int, j: int):
        if i < 0 or j > s.rows or i > j:
            raise IndexError(f"rows [{i}, {j}) out of range [0, {s.rows}] of {s.role} "
                             f"{s.name!r} in {self.path}")

    def _pieces(self, s: StreamInfo, i: int, j: int):
        """Yield (buf, header, lo, hi) for the data blocks of rows [i, j), reading them in
        groups small enough for the pool: a caller that copies each piece before taking the
        next never holds more than one group of pins."""
        blocks = self._data_blocks(s, i, j)
        pool = getattr(self.backend, "pool", None)
        group = max(1, min(64, pool.nslots // 4)) if pool is not None else 256
        for g in range(0, len(blocks), group):
            part = blocks[g:g + group]
            bufs = self._read([(b[2], b[3]) for b in part])
            for k, blk in enumerate(part):
                buf = bufs[k]
                bufs[k] = None
                h = self._check_data(buf, s, blk)
                lo = max(i, blk[0]) - blk[0]
                hi = min(j, blk[0] + blk[1]) - blk[0]
                yield buf, h, lo, hi
                del buf

    def _fixed(self, s: StreamInfo, i: int, j: int, dtype, copy: bool = False) -> np.ndarray:
        self._check_range(s, i, j)
        if i == j:
            return np.empty(0, dtype=dtype)
        out = None
        pos = 0
        for buf, h, lo, hi in self._pieces(s, i, j):
            a = np.frombuffer(buf, dtype=dtype, count=h.n, offset=HEADER_SIZE + h.bufs[2])
            if out is None and hi - lo == j - i:
                return a[lo:hi].copy() if copy else a[lo:hi]   # one block: a view
            if out is None:
                out = np.empty(j - i, dtype=dtype)
            out[pos:pos + hi - lo] = a[lo:hi]
            pos += hi - lo
            del a
        return out

    def codes(self, i: int, j: int, layer: int = 0,
              copy: bool = False) -> Union[np.ndarray, VarCodes]:
        """Codes of rows [i, j): uint64 array or VarCodes (views when in one block, unless
        ``copy``: then never a view, so nothing stays pinned in the pool)."""
        s = self._stream(layer, "codes")
        if s.phys.kind == "fixed":
            return self._fixed(s, i, j, "<u8", copy)
        self._check_range(s, i, j)
        if i == j:
            return VarCodes(np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.uint8))
        parts = []
        for buf, h, lo, hi in self._pieces(s, i, j):
            o = np.frombuffer(buf, dtype="<i8", count=h.n + 1, offset=HEADER_SIZE + h.bufs[1])
            d = np.frombuffer(buf, dtype=np.uint8, count=h.aux, offset=HEADER_SIZE + h.bufs[2])
            if not parts and hi - lo == j - i and not copy:
                return VarCodes(o[lo:hi + 1], d)          # one block: views
            o = o[lo:hi + 1]
            parts.append((o - o[0], d[o[0]:o[-1]].copy()))
            del d
        offs = [np.zeros(1, dtype=np.int64)]
        base = 0
        for o, d in parts:
            offs.append(o[1:] + base)
            base += len(d)
        return VarCodes(np.concatenate(offs), np.concatenate([d for _, d in parts]))

    def weights(self, i: int, j: int, layer: int = 0, copy: bool = False) -> np.ndarray:
        """int64 weights of rows [i, j)."""
        return self._fixed(self._stream(layer, "weights"), i, j, "<i8", copy)

    def offsets(self, i: int, j: int, layer: int = 0, copy: bool = False) -> np.ndarray:
        """Entries [i, j) of an ordered layer's offsets (``rows + 1`` entries in all; row r's
        range in the next layer is ``[offsets[r], offsets[r + 1])``)."""
        return self._fixed(self._stream(layer, "offsets"), i, j, "<i8", copy)

    def column(self, col: Union[int, str], i: int, j: int, layer: int = 0,
               chunked: bool = False, copy: bool = False) -> Union[pa.Array, pa.ChunkedArray]:
        """Column ``col`` (index or name) of rows [i, j) as an Arrow array: zero-copy when the
        range is in one block (unless ``copy``); ``chunked=True`` gives a zero-copy ChunkedArray
        in every case (it pins every block of the range: keep such ranges well under the pool
        size)."""
        s = self._stream(layer, "column", col)
        self._check_range(s, i, j)
        t = s.arrow_type
        if i == j:
            return pa.chunked_array([], type=t) if chunked else pa.array([], type=t)
        arrs = []
        for buf, h, lo, hi in self._pieces(s, i, j):
            pb = pa.py_buffer(buf)
            validity = None
            if h.flags & F.FLAG_VALIDITY:
                validity = pb.slice(HEADER_SIZE + h.bufs[0], (h.n + 7) // 8)
            if s.phys.kind == "ipc":
                a = _ipc_block(pb.slice(HEADER_SIZE + h.bufs[2], h.aux), t, h.n, self.path,
                               s).slice(lo, hi - lo)
            elif s.phys.kind == "var":
                ob = pb.slice(HEADER_SIZE + h.bufs[1], (h.n + 1) * s.phys.offset_width)
                db = pb.slice(HEADER_SIZE + h.bufs[2], h.aux)
                a = pa.Array.from_buffers(t, hi - lo, [validity, ob, db], offset=lo)
            else:
                vb = pb.slice(HEADER_SIZE + h.bufs[2], h.aux)
                a = pa.Array.from_buffers(t, hi - lo, [validity, vb], offset=lo)
            if not chunked and (copy or not (not arrs and hi - lo == j - i)):
                a = pa.concat_arrays([a])             # spans blocks: copy, unpin at once
            arrs.append(a)
            del pb, buf, validity
        if chunked:
            return pa.chunked_array(arrs, type=t)
        return arrs[0] if len(arrs) == 1 else pa.concat_arrays(arrs)

    def read(self, i: int, j: int, layer: int = 0, columns: Optional[Sequence] = None,
             copy: bool = False) -> LayerChunk:
        """All streams of rows [i, j) of a layer (``columns``: a subset by index or name;
        ``copy``: no views, so nothing of the chunk pins the pool)."""
        L = self.layers[layer]
        ncols = len(L["columns"])
        cols = range(ncols) if columns is None else columns
        return LayerChunk(
            i, j, self.codes(i, j, layer, copy),
            [self.column(c, i, j, layer, copy=copy) for c in cols],
            self.weights(i, j, layer, copy) if L["weights"] is not None else None,
            self.offsets(i, j + 1, layer, copy) if L["offsets"] is not None else None)

    def boundary(self, i: int, layer: int = 0) -> int:
        """The smallest row > i where some stream of the layer starts a new data block (the
        layer's row count at the end): ``read(i, boundary(i))`` is zero-copy."""
        L = self.layers[layer]
        n = L["rows"]
        if i >= n:
            return n
        sids = [L["codes"], *L["columns"]] + [L[r] for r in ("weights",) if L[r] is not None]
        best = n
        for sid in sids:
            s = self.streams[sid]
            b = self._data_blocks(s, i, i + 1)
            if b:
                best = min(best, b[0][0] + b[0][1])
        if L["offsets"] is not None:
            # read(i, j) takes offsets entries [i, j + 1): in one block while j < block end
            b = self._data_blocks(self.streams[L["offsets"]], i, i + 1)
            if b:
                best = min(best, b[0][0] + b[0][1] - 1)
        return max(best, i + 1)

    def block_starts(self, layer: int = 0, role: str = "codes", col=None) -> np.ndarray:
        """First row of every data block of a stream (reads the whole index)."""
        s = self._stream(layer, role, col)
        return np.array([b[0] for b in self._data_blocks(s, 0, s.rows)], dtype=np.int64)

    def prefetch(self, i: int, j: int, layer: int = 0, columns: Optional[Sequence] = None,
                 codes: bool = True, weights: bool = True) -> None:
        """Start loading the blocks of rows [i, j) (index blocks are read now)."""
        ext = self.extents(i, j, layer, columns, codes, weights)
        if ext:
            self._fh.prefetch(ext)

    def extents(self, i: int, j: int, layer: int = 0, columns: Optional[Sequence] = None,
                codes: bool = True, weights: bool = True, offsets: bool = True) -> list:
        """``(offset, extent)`` of every data block that rows [i, j) of a layer touch (what
        :meth:`read` would read), for callers that gather many ranges into one
        :meth:`prefetch_extents`."""
        L = self.layers[layer]
        n = L["rows"]
        i, j = max(0, i), min(j, n)
        if i >= j:
            return []
        sids = []
        if codes:
            sids.append(L["codes"])
        cols = range(len(L["columns"])) if columns is None else columns
        sids += [self._stream(layer, "column", c).sid for c in cols]
        if weights and L["weights"] is not None:
            sids.append(L["weights"])
        if offsets and L["offsets"] is not None:
            sids.append(L["offsets"])
        ext = []
        for sid in sids:
            s = self.streams[sid]
            hi = j + 1 if s.role == "offsets" else j
            ext += [(b[2], b[3]) for b in self._data_blocks(s, i, hi)]
        return ext

    def prefetch_extents(self, extents: Sequence) -> None:
        """Start loading the given blocks (from :meth:`extents` / :meth:`code_blocks`)."""
        if extents:
            self._fh.prefetch(list(extents))

    # -- the code stream's block table (for vectorised probes) ------------------------------

    def code_blocks(self, layer: int = 0):
        """The data blocks of a layer's code stream, from its index (cached): ``(first_row,
        rows, offset, extent)`` as int64 arrays and ``first_code`` (uint64 array or VarCodes):
        block ``b`` holds rows ``[first_row[b], first_row[b] + rows[b])`` and starts with code
        ``first_code[b]``. With it, a sorted probe finds its block with one vectorised search
        and every block a probe touches is read in one backend call (:meth:`code_block_views`)."""
        cache = getattr(self, "_code_blocks", None)
        if cache is None:
            cache = self._code_blocks = {}
        got = cache.get(layer)
        if got is not None:
            return got
        s = self._stream(layer, "codes")
        first, offs, exts, keys = [], [], [], []
        if s.root is not None:
            self._leaves(s, s.root[0], s.root[1], 0, s.rows, s.depth, first, offs, exts, keys)
        fr = np.asarray(first, dtype=np.int64)
        rows = np.diff(np.append(fr, s.rows)).astype(np.int64)
        if s.phys.kind == "var":
            fc = VarCodes.from_list(keys)
        else:
            fc = np.asarray(keys, dtype=np.uint64)
        got = (fr, rows, np.asarray(offs, dtype=np.int64), np.asarray(exts, dtype=np.int64), fc)
        cache[layer] = got
        return got

    def _leaves(self, s, off, ext, first_row, rows, level, first, offs, exts, keys):
        nd = self._node(s.sid, off, ext, first_row, rows)
        if nd.level != level:
            raise CorruptBlockError(self.path, off, f"index level {nd.level}, expected {level}")
        n = len(nd.first)
        end = first_row + rows
        if level == 1:
            first.extend(nd.first.tolist())
            offs.extend(nd.offs.tolist())
            exts.extend(nd.exts.tolist())
            if nd.kdata is not None:
                ko, kd = nd.keys, nd.kdata
                keys.extend(kd[ko[k]:ko[k + 1]].tobytes() for k in range(n))
            else:
                keys.extend(nd.keys.tolist())
            return
        for k in range(n):
            c0 = int(nd.first[k])
            c1 = int(nd.first[k + 1]) if k + 1 < n else end
            self._leaves(s, int(nd.offs[k]), int(nd.exts[k]), c0, c1 - c0, level - 1, first,
                         offs, exts, keys)

    def code_block_views(self, block_ids: Sequence[int], layer: int = 0):
        """Yield ``(block_id, first_row, codes)`` for the given code-stream blocks (from
        :meth:`code_blocks`), read together in as few backend calls as the pool allows (so an
        io_uring backend keeps them all in flight); ``codes`` is a zero-copy view (uint64 array
        or VarCodes) that pins its block while alive."""
        s = self._stream(layer, "codes")
        fr, rows, offs, exts, _ = self.code_blocks(layer)
        ids = list(block_ids)
        pool = getattr(self.backend, "pool", None)
        group = max(1, min(64, pool.nslots // 4)) if pool is not None else 256
        var = s.phys.kind == "var"
        for g in range(0, len(ids), group):
            part = ids[g:g + group]
            bufs = self._read([(int(offs[b]), int(exts[b])) for b in part])
            for k, b in enumerate(part):
                buf = bufs[k]
                bufs[k] = None
                blk = (int(fr[b]), int(rows[b]), int(offs[b]), int(exts[b]))
                h = self._check_data(buf, s, blk)
                if var:
                    o = np.frombuffer(buf, dtype="<i8", count=h.n + 1,
                                      offset=HEADER_SIZE + h.bufs[1])
                    d = np.frombuffer(buf, dtype=np.uint8, count=h.aux,
                                      offset=HEADER_SIZE + h.bufs[2])
                    codes = VarCodes(o, d)
                else:
                    codes = np.frombuffer(buf, dtype="<u8", count=h.n,
                                          offset=HEADER_SIZE + h.bufs[2])
                del buf
                yield b, blk[0], codes

    # -- seeking -----------------------------------------------------------------------------

    def lower_bound(self, probe, lo: int = 0, hi: Optional[int] = None, layer: int = 0) -> int:
        """First row r in [lo, hi) with ``codes[r] >= probe`` (hi if none).

        Codes must be sorted within [lo, hi) (true for a whole top layer and for each key's
        range of a lower layer). Reads one block per index level plus one data block."""
        s = self._stream(layer, "codes")
        if hi is None:
            hi = s.rows
        self._check_range(s, lo, hi)
        if lo >= hi:
            return hi
        var = s.phys.kind == "var"
        if var:
            probe = bytes(probe) if not isinstance(probe, bytes) else probe
        else:
            probe = int(probe)
            if probe < 0:
                return lo
            if probe >= 1 << 64:
                return hi
        return self._lb(s, s.root[0], s.root[1], 0, s.rows, s.depth, probe, lo, hi, var)

    def _lb(self, s, off, ext, first_row, rows, level, probe, lo, hi, var) -> int:
        nd = self._node(s.sid, off, ext, first_row, rows)
        first = nd.first
        end = first_row + rows
        a = max(int(np.searchsorted(first, lo, side="right")) - 1, 0)
        b = int(np.searchsorted(first, hi, side="left"))
        # children a+1 .. b-1 start inside (lo, hi): their first keys are sorted there
        if b - (a + 1) > 0:
            if var:
                p = _nb.var_lower_bound(nd.keys, nd.kdata, a + 1, b, probe)
            else:
                p = a + 1 + int(np.searchsorted(nd.keys[a + 1:b], np.uint64(probe), side="left"))
            c = max(p - 1, a)
        else:
            c = a
        c0 = int(first[c])
        c1 = int(first[c + 1]) if c + 1 < len(first) else end
        sub_lo, sub_hi = max(lo, c0), min(hi, c1)
        if level == 1:
            blk = (c0, c1 - c0, int(nd.offs[c]), int(nd.exts[c]))
            buf = self._read([(blk[2], blk[3])])[0]
            h = self._check_data(buf, s, blk)
            if var:
                o = np.frombuffer(buf, dtype="<i8", count=h.n + 1, offset=HEADER_SIZE + h.bufs[1])
                d = np.frombuffer(buf, dtype=np.uint8, count=h.aux, offset=HEADER_SIZE + h.bufs[2])
                r = _nb.var_lower_bound(o, d, sub_lo - c0, sub_hi - c0, probe)
            else:
                a_ = np.frombuffer(buf, dtype="<u8", count=h.n, offset=HEADER_SIZE + h.bufs[2])
                r = (sub_lo - c0) + int(np.searchsorted(a_[sub_lo - c0:sub_hi - c0],
                                                        np.uint64(probe), side="left"))
            return c0 + r
        return self._lb(s, int(nd.offs[c]), int(nd.exts[c]), c0, c1 - c0, level - 1, probe,
                        sub_lo, sub_hi, var)

    # -- Bloom filter ------------------------------------------------------------------------

    @property
    def has_filter(self) -> bool:
        return self._words is not None

    def may_contain(self, code) -> bool:
        """False only if ``code`` is certainly not a layer-0 code of this file."""
        if self._words is None:
            return True
        if self.layers[0]["code"] == "u64":
            h = _nb.hash_one_u64(int(code), self._bloom_seed)
        else:
            h = _nb.hash_one_bytes(bytes(code), self._bloom_seed)
        return _nb.bloom_query_one(self._words, self._bloom_k, h)

    def may_contain_many(self, codes) -> np.ndarray:
        """Vectorised ``may_contain`` over a uint64 array or VarCodes."""
        if self._words is None:
            return np.ones(len(codes), dtype=bool)
        return _nb.bloom_query(self._words, self._bloom_k, F.hash_codes(codes, self._bloom_seed))
