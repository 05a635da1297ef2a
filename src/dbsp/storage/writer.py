"""Streaming writer of layer files (format: :mod:`dbsp.storage.format`).

Rows are appended in sorted order, in chunks of any size; every stream cuts its own full data
blocks as soon as it has enough rows, so memory stays at about one block per stream plus the
index entries (about 32 bytes per data block) and, when the number of keys is not given up
front, 8 bytes per key for the Bloom filter.

Example::

    spec = LayerSpec(code="u64", schema=pa.schema([("v", pa.int64())]))
    with LayerFileWriter(path, spec) as w:
        w.append(codes, columns=[v], weights=weights)
    # path now exists, fsynced; path + ".mut" never survives a crash as a finished file
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from . import format as F
from .format import (BLOCK_ALIGN, BUF_ALIGN, HEADER_SIZE, NO_BUF, BlockHeader, Physical, align)
from .._native import block as _nb

__all__ = ["LayerSpec", "LayerFileWriter", "BLOOM_SEED"]

BLOOM_SEED = 0x517CC1B727220A95
_FLUSH_BYTES = 1 << 20


@dataclass(frozen=True)
class LayerSpec:
    """What one layer of a file holds.

    ``code``: ``"u64"`` (one uint64 key code per row) or ``"var"`` (byte-string codes).
    ``schema``: the Arrow columns stored beside the codes (None: none).
    ``weights``: store an int64 weight per row. ``offsets``: ordered layer; store ``rows + 1``
    int64 offsets into the next layer of the file.
    """

    code: str = "u64"
    schema: Optional[pa.Schema] = None
    weights: bool = True
    offsets: bool = False

    def __post_init__(self):
        if self.code not in ("u64", "var"):
            raise ValueError(f"code must be 'u64' or 'var', got {self.code!r}")


def _a64(n: int) -> int:
    return (n + BUF_ALIGN - 1) // BUF_ALIGN * BUF_ALIGN


class _Sink:
    """Appends whole blocks to the ``.mut`` file, flushing about 1 MiB at a time."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self.offset = 0
        self._pending: list = []
        self._pending_bytes = 0

    def put(self, ext) -> int:
        off = self.offset
        self._pending.append(ext)
        self._pending_bytes += len(ext)
        self.offset += len(ext)
        if self._pending_bytes >= _FLUSH_BYTES:
            self.flush()
        return off

    def flush(self):
        bufs = self._pending
        while bufs:
            n = os.writev(self.fd, bufs[:1024])
            # drop fully written buffers, keep the rest of a partial one
            while bufs and n >= len(bufs[0]):
                n -= len(bufs[0])
                bufs.pop(0)
            if n:
                bufs[0] = memoryview(bufs[0])[n:]
        self._pending = []
        self._pending_bytes = 0

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _as_bytes(p) -> memoryview:
    if isinstance(p, np.ndarray):
        return memoryview(np.ascontiguousarray(p).reshape(-1).view(np.uint8))
    mv = memoryview(p)
    return mv if (mv.format == "B" and mv.ndim == 1) else mv.cast("B")


def _make_block(kind: int, flags: int, stream: int, first_row: int, n: int, level: int,
                parts: Sequence[Optional[Any]], aux: int, compress: bool) -> bytearray:
    """Lay out up to 4 buffers (64-aligned) after the header, compress if that saves a 4 KiB
    page, checksum. The payload is copied once, straight into the block's extent."""
    bufs = [NO_BUF] * 4
    views = [None] * 4
    pos = 0
    for i, p in enumerate(parts):
        if p is None:
            continue
        pos = _a64(pos)
        bufs[i] = pos
        views[i] = _as_bytes(p)
        pos += views[i].nbytes
    raw = pos
    ext = bytearray(align(HEADER_SIZE + raw))
    for i, mv in enumerate(views):
        if mv is not None and mv.nbytes:
            ext[HEADER_SIZE + bufs[i]:HEADER_SIZE + bufs[i] + mv.nbytes] = mv
    stored = raw
    if compress and raw >= 2 * BLOCK_ALIGN:
        import lz4.block
        c = lz4.block.compress(memoryview(ext)[HEADER_SIZE:HEADER_SIZE + raw], store_size=False)
        if align(HEADER_SIZE + len(c)) < len(ext):
            flags |= F.FLAG_LZ4
            stored = len(c)
            ext = bytearray(align(HEADER_SIZE + stored))
            ext[HEADER_SIZE:HEADER_SIZE + stored] = c
    BlockHeader(kind, flags, stream, len(ext), stored, raw, first_row, n, level, tuple(bufs),
                aux).pack_into(ext, 0)
    ck = _nb.crc32c(memoryview(ext)[8:])
    ext[4:8] = int(ck).to_bytes(4, "little")
    return ext


class _StreamWriter:
    """Cuts one stream (codes, a column, weights or offsets) into data blocks."""

    def __init__(self, fw: "LayerFileWriter", sid: int, layer: int, role: str, name: str,
                 phys: Physical, nullable: bool, keyed: bool, arrow_type: Optional[str] = None):
        self.fw, self.sid, self.layer, self.role, self.name = fw, sid, layer, role, name
        self.phys, self.nullable, self.keyed = phys, nullable, keyed
        self.arrow_type = arrow_type
        self.rows = 0                 # rows appended
        self.emitted = 0              # rows written into blocks
        self.cap = fw.block_size - HEADER_SIZE
        # pending rows
        self._vals = None             # fixed: V{w} array; bool: bool array
        self._offs = None             # var: int64 offsets starting at 0
        self._data = None             # var: uint8
        self._valid = None            # bool array or None (all valid)
        # index entries of the data blocks: first_row, rows, offset, extent, first key
        self.e_first, self.e_rows, self.e_off, self.e_ext, self.e_key = [], [], [], [], []
        self.bytes_raw = 0
        self.bytes_stored = 0
        self.index_blocks = 0
        self.depth = 0
        self.root = None
        if phys.kind == "fixed":
            self._dt = np.dtype(f"V{phys.itemsize}")
            self._per_block = self._fixed_rows_per_block()
        elif phys.kind == "bool":
            self._per_block = self._fixed_rows_per_block()
        elif phys.kind == "ipc":
            self._arr = None          # pending rows as one Arrow array
            self._ipc_schema: Optional[pa.Schema] = None  # set at the first rows
        else:
            self._odt = np.dtype("<i4") if phys.offset_width == 4 else np.dtype("<i8")

    def _fixed_rows_per_block(self) -> int:
        def cost(m):
            c = _a64((m + 7) // 8) if self.nullable else 0
            if self.phys.kind == "bool":
                return c + (m + 7) // 8
            return c + m * self.phys.itemsize
        lo, hi = 1, self.cap * 8 + 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cost(mid) <= self.cap:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # -- appending ---------------------------------------------------------------------------

    def _cat_valid(self, n_old: int, valid, n_new: int):
        if valid is None and self._valid is None:
            return None
        old = self._valid if self._valid is not None else np.ones(n_old, dtype=bool)
        new = valid if valid is not None else np.ones(n_new, dtype=bool)
        return np.concatenate([old, new]) if n_old else np.ascontiguousarray(new)

    def append_fixed(self, vals: np.ndarray, valid: Optional[np.ndarray]):
        n = len(vals)
        if n == 0:
            return
        n_old = 0 if self._vals is None else len(self._vals)
        self._valid = self._cat_valid(n_old, valid, n)
        # no copy when nothing is pending: blocks are cut from the caller's array directly
        # (only read; the remainder is copied in _emit_fixed)
        self._vals = vals if self._vals is None else np.concatenate([self._vals, vals])
        self.rows += n
        self._emit_fixed(final=False)

    def append_var(self, offs: np.ndarray, data: np.ndarray, valid: Optional[np.ndarray]):
        n = len(offs) - 1
        if n == 0:
            return
        offs = offs.astype(np.int64, copy=False)
        data = data[offs[0]:offs[-1]]
        offs = offs - offs[0]
        n_old = 0 if self._offs is None else len(self._offs) - 1
        self._valid = self._cat_valid(n_old, valid, n)
        if self._offs is None:
            self._offs, self._data = offs, data
        else:
            self._offs = np.concatenate([self._offs, offs[1:] + self._offs[-1]])
            self._data = np.concatenate([self._data, data])
        self.rows += n
        self._emit_var(final=False)

    def append_ipc(self, arr: pa.Array):
        n = len(arr)
        if n == 0:
            return
        arr = _compact_dictionary(arr)   # sizes are estimated from the buffers
        self._arr = arr if self._arr is None else pa.concat_arrays([self._arr, arr])
        self.rows += n
        self._emit_ipc(final=False)

    # -- cutting blocks ----------------------------------------------------------------------

    def _ipc_bytes(self, a: pa.Array) -> pa.Buffer:
        """One IPC stream holding ``a`` (its dictionary reduced to the values it uses)."""
        a = _compact_dictionary(a)
        sink = pa.BufferOutputStream()
        batch = pa.RecordBatch.from_arrays([a], schema=self._ipc_schema)
        with pa.ipc.new_stream(sink, self._ipc_schema) as w:
            w.write_batch(batch)
        return sink.getvalue()

    def _emit_ipc(self, final: bool):
        """Cut blocks of about ``cap`` serialised bytes: the row count is estimated from the
        pending rows' buffer size, then halved while the message does not fit (a single row
        larger than a block makes a block of its own, like a long string does)."""
        if self._arr is None:
            return
        arr = self._arr
        total = len(arr)
        nb = max(arr.get_total_buffer_size(), 1)
        if not final and nb < self.cap:
            return
        if self._ipc_schema is None:
            self._ipc_schema = pa.schema([pa.field("v", arr.type, self.nullable)])
        p = 0
        per_row = nb / total
        while p < total:
            rest = total - p
            m = max(1, min(rest, int(self.cap * 0.9 / per_row)))
            if m == rest and not final:
                break
            while True:
                buf = self._ipc_bytes(arr.slice(p, m))
                if buf.size <= self.cap or m == 1:
                    break
                m = max(1, m // 2)
            if m == rest and not final and buf.size < self.cap // 2:
                break
            key = None
            self._write_data(m, [None, None, buf, None], buf.size, 0, key)
            p += m
        if p == total:
            self._arr = None
        elif p:
            self._arr = pa.concat_arrays([arr.slice(p)])


    def _validity_part(self, lo: int, hi: int):
        if self._valid is None:
            return None, 0
        v = self._valid[lo:hi]
        if v.all():
            return None, 0
        return np.packbits(v, bitorder="little"), F.FLAG_VALIDITY

    def _emit_fixed(self, final: bool):
        pending = 0 if self._vals is None else len(self._vals)
        pos = 0
        per = self._per_block
        while pending - pos >= per or (final and pending - pos > 0):
            m = min(per, pending - pos)
            vals = self._vals[pos:pos + m]
            vpart, flags = self._validity_part(pos, pos + m)
            if self.phys.kind == "bool":
                vals_part = np.packbits(vals, bitorder="little")
                nbytes = len(vals_part)
            else:
                vals_part = vals
                nbytes = m * self.phys.itemsize
            key = None
            if self.keyed:
                key = int(vals[:1].view("<u8")[0])
            self._write_data(m, [vpart, None, vals_part, None], nbytes, flags, key)
            pos += m
        if pos:
            self._vals = self._vals[pos:].copy() if pos < pending else None
            if self._valid is not None:
                self._valid = self._valid[pos:].copy() if pos < pending else None

    def _var_take(self, p: int) -> int:
        """Rows from pending row ``p`` on that fill one block (at least 1)."""
        n = len(self._offs) - 1 - p
        ow = self.phys.offset_width
        mmax = min(n, self.cap // ow + 1)
        m = np.arange(1, mmax + 1, dtype=np.int64)
        cost = _a64_np((m + 1) * ow) + (self._offs[p + 1:p + mmax + 1] - self._offs[p])
        if self.nullable:
            cost += _a64_np((m + 7) // 8)
        k = int(np.searchsorted(cost, self.cap, side="right"))
        return max(k, 1)

    def _emit_var(self, final: bool):
        if self._offs is None:
            return
        total = len(self._offs) - 1
        p = 0
        ow = self.phys.offset_width
        while p < total:
            m = self._var_take(p)
            if p + m == total and not final:
                # the rest fits in one block: wait for more rows unless it is nearly full
                n = total - p
                full = _a64((n + 1) * ow) + int(self._offs[-1] - self._offs[p]) + (
                    _a64((n + 7) // 8) if self.nullable else 0)
                if full < self.cap - 256:
                    break
            offs = self._offs[p:p + m + 1]
            base = int(offs[0])
            data = self._data[base:int(offs[-1])]
            o = (offs - base).astype(self._odt)
            vpart, flags = self._validity_part(p, p + m)
            key = data[:int(o[1])].tobytes() if self.keyed else None
            self._write_data(m, [vpart, o, data, None], len(data), flags, key)
            p += m
        if p == total:
            self._offs = self._data = self._valid = None
        elif p:
            rest = self._offs[p:]
            self._data = self._data[int(rest[0]):].copy()
            self._offs = rest - rest[0]
            if self._valid is not None:
                self._valid = self._valid[p:].copy()

    def _write_data(self, m: int, parts, nbytes: int, flags: int, key):
        ext = _make_block(F.KIND_DATA, flags, self.sid, self.emitted, m, 0, parts, nbytes,
                          self.fw.compress)
        off = self.fw._sink.put(ext)
        self.e_first.append(self.emitted)
        self.e_rows.append(m)
        self.e_off.append(off)
        self.e_ext.append(len(ext))
        self.e_key.append(key)
        self.bytes_raw += HEADER_SIZE + int.from_bytes(ext[20:24], "little")
        self.bytes_stored += len(ext)
        self.emitted += m

    # -- finishing: index tree ---------------------------------------------------------------

    def finish(self):
        if self.phys.kind == "ipc":
            self._emit_ipc(final=True)
        elif self.phys.kind == "var":
            self._emit_var(final=True)
        else:
            self._emit_fixed(final=True)
        assert self.emitted == self.rows, (self.emitted, self.rows)
        level_entries = list(zip(self.e_first, self.e_rows, self.e_off, self.e_ext, self.e_key))
        if not level_entries:
            return
        level = 1
        fan = self.fw.index_fanout
        var_keys = self.keyed and self.phys.kind == "var"
        while True:
            nodes = []
            i = 0
            while i < len(level_entries):
                j = self._node_take(level_entries, i, fan, var_keys)
                nodes.append(self._write_index(level_entries[i:j], level, var_keys))
                i = j
            self.depth = level
            if len(nodes) == 1:
                self.root = (nodes[0][2], nodes[0][3])
                return
            level_entries = nodes
            level += 1

    def _node_take(self, entries, i: int, fan: int, var_keys: bool) -> int:
        cap = self.cap
        n_left = len(entries) - i
        limit = min(n_left, fan) if fan else n_left
        if not var_keys:
            kw = 8 if self.keyed else 0
            lo, hi = 1, limit
            while lo < hi:
                mid = (lo + hi + 1) // 2
                c = _a64(8 * mid) * 2 + _a64(4 * mid) + (_a64(kw * mid) if kw else 0)
                if c <= cap:
                    lo = mid
                else:
                    hi = mid - 1
            return i + max(lo, 1)
        size = 0
        m = 0
        while m < limit:
            klen = len(entries[i + m][4])
            c = _a64(8 * (m + 1)) * 2 + _a64(4 * (m + 1)) + _a64(8 * (m + 2)) + size + klen
            if m and c > cap:
                break
            size += klen
            m += 1
        return i + max(m, 1)

    def _write_index(self, entries, level: int, var_keys: bool):
        n = len(entries)
        first = np.fromiter((e[0] for e in entries), dtype="<u8", count=n)
        offs = np.fromiter((e[2] for e in entries), dtype="<u8", count=n)
        exts = np.fromiter((e[3] for e in entries), dtype="<u4", count=n)
        rows = int(sum(e[1] for e in entries))
        flags = 0
        keys = None
        if self.keyed:
            flags |= F.FLAG_KEYS
            if var_keys:
                flags |= F.FLAG_VARKEYS
                kl = np.fromiter((len(e[4]) for e in entries), dtype="<i8", count=n)
                ko = np.zeros(n + 1, dtype="<i8")
                np.cumsum(kl, out=ko[1:])
                kd = b"".join(e[4] for e in entries)
                keys = bytearray(_a64(8 * (n + 1)) + len(kd))
                keys[:8 * (n + 1)] = ko.tobytes()
                keys[_a64(8 * (n + 1)):] = kd
            else:
                keys = np.fromiter((e[4] for e in entries), dtype="<u8", count=n)
        ext = _make_block(F.KIND_INDEX, flags, self.sid, int(first[0]), n, level,
                          [first, offs, exts, keys], rows, False)
        off = self.fw._sink.put(ext)
        self.index_blocks += 1
        self.bytes_stored += len(ext)
        return (int(first[0]), rows, off, len(ext), entries[0][4])

    def meta(self) -> dict:
        return {
            "layer": self.layer, "role": self.role, "name": self.name,
            "phys": self.phys.to_json(), "nullable": self.nullable, "rows": self.rows,
            "blocks": len(self.e_off), "index_blocks": self.index_blocks, "depth": self.depth,
            "root": list(self.root) if self.root else None, "keyed": self.keyed,
            "arrow_type": self.arrow_type,
            "bytes_raw": self.bytes_raw, "bytes_stored": self.bytes_stored,
        }


def _compact_dictionary(a: pa.Array) -> pa.Array:
    """A dictionary array whose dictionary holds only the values it uses (when it holds more
    values than the array has rows); the type is kept."""
    if pa.types.is_dictionary(a.type) and len(a.dictionary) > len(a):
        used = a.dictionary_decode().dictionary_encode()
        return used.cast(a.type) if used.type != a.type else used
    return a


def _a64_np(x: np.ndarray) -> np.ndarray:
    return (x + (BUF_ALIGN - 1)) // BUF_ALIGN * BUF_ALIGN


def _arrow_parts(arr: pa.Array, phys: Physical):
    """(values, valid) of an Arrow array in the writer's pending form, zero-copy where the
    layout allows it."""
    n = len(arr)
    off = arr.offset
    bufs = arr.buffers()
    valid = None
    if arr.null_count and bufs[0] is not None:
        bits = np.frombuffer(bufs[0], dtype=np.uint8)
        valid = np.unpackbits(bits, bitorder="little", count=off + n)[off:].astype(bool)
    if phys.kind == "fixed":
        vals = np.frombuffer(bufs[1], dtype=f"V{phys.itemsize}",
                             count=off + n)[off:] if n else np.empty(0, f"V{phys.itemsize}")
        return ("fixed", vals, valid)
    if phys.kind == "bool":
        bits = np.frombuffer(bufs[1], dtype=np.uint8)
        vals = np.unpackbits(bits, bitorder="little", count=off + n)[off:].astype(bool)
        return ("fixed", vals, valid)
    odt = np.int32 if phys.offset_width == 4 else np.int64
    offs = np.frombuffer(bufs[1], dtype=odt, count=off + n + 1)[off:] if bufs[1] is not None \
        else np.zeros(n + 1, dtype=odt)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None \
        else np.empty(0, np.uint8)
    return ("var", (offs, data), valid)


class LayerFileWriter:
    """Write one layer file: ``append`` chunks in sorted order, then ``finish``.

    Parameters
    ----------
    path : str
        Final file name; data goes to ``path + ".mut"`` until ``finish`` renames it.
    layers : LayerSpec or list of LayerSpec
        One spec per layer; an ordered layer (``offsets=True``) points into the next one.
    block_size : int
        Data block size (multiple of 4096; 64 KiB by default).
    compression : None or "lz4"
        Per-block lz4; a block is stored compressed only if that saves at least a 4 KiB page.
    bloom_fpr : float or None
        Target false-positive rate of the Bloom filter over layer 0's codes (None: no filter).
    expected_keys : int, optional
        Layer 0's row count, or an upper bound on it: the filter is then built while writing
        instead of from 8 bytes per key kept until ``finish``, and folded down at ``finish`` to
        the keys actually written (within a factor of 2 of the right size).
    index_fanout : int, optional
        Cap on children per index block (tests use it to build deep trees from few rows).
    metadata : dict, optional
        JSON-able user metadata stored in the trailer.
    durable : bool
        fsync the file and its directory (default). Tests may turn it off.
    """

    def __init__(self, path: Union[str, os.PathLike], layers: Union[LayerSpec, Sequence[LayerSpec]],
                 *, block_size: int = 65536, compression: Optional[str] = None,
                 bloom_fpr: Optional[float] = 1e-4, expected_keys: Optional[int] = None,
                 index_fanout: Optional[int] = None, metadata: Optional[dict] = None,
                 durable: bool = True):
        if block_size % BLOCK_ALIGN or block_size < BLOCK_ALIGN:
            raise ValueError(f"block_size must be a multiple of {BLOCK_ALIGN}, got {block_size}")
        if compression not in (None, "lz4"):
            raise ValueError(f"compression must be None or 'lz4', got {compression!r}")
        if index_fanout is not None and index_fanout < 2:
            raise ValueError("index_fanout must be at least 2")
        self.path = os.fspath(path)
        self.mut_path = self.path + ".mut"
        self.layers = [layers] if isinstance(layers, LayerSpec) else list(layers)
        if not self.layers:
            raise ValueError("a layer file needs at least one layer")
        if self.layers[-1].offsets:
            raise ValueError("the last layer cannot be ordered (its offsets need a next layer)")
        self.block_size = block_size
        self.compress = compression == "lz4"
        self.compression = compression
        self.index_fanout = index_fanout or 0
        self.metadata = metadata or {}
        self.durable = durable
        self.bloom_fpr = bloom_fpr
        self._sink = _Sink(self.mut_path)
        self._done = False
        self.streams: list[_StreamWriter] = []
        self._layer_streams: list[dict] = []
        for li, spec in enumerate(self.layers):
            d: dict = {"codes": None, "columns": [], "weights": None, "offsets": None}
            phys = F.U64 if spec.code == "u64" else F.VAR64
            d["codes"] = self._add_stream(li, "codes", "codes", phys, False, True)
            if spec.schema is not None:
                for f in spec.schema:
                    ph = F.physical_of(f.type, f.name)
                    d["columns"].append(self._add_stream(li, "column", f.name, ph, f.nullable,
                                                         False, str(f.type)))
            if spec.weights:
                d["weights"] = self._add_stream(li, "weights", "weights", F.I64, False, False)
            if spec.offsets:
                d["offsets"] = self._add_stream(li, "offsets", "offsets", F.I64, False, False)
            self._layer_streams.append(d)
        self._last_code = [None] * len(self.layers)
        self._last_offset = [0] * len(self.layers)
        # Bloom filter over layer 0 codes
        self._hashes: list = []
        self._words = None
        self._bloom_k = 0
        self._bloom_bpk = 0.0
        if bloom_fpr is not None:
            self._bloom_bpk, self._bloom_k = F.bloom_params(bloom_fpr)
            if expected_keys is not None:
                self._words = self._alloc_filter(expected_keys, foldable=True)

    def _add_stream(self, layer, role, name, phys, nullable, keyed, arrow_type=None):
        s = _StreamWriter(self, len(self.streams), layer, role, name, phys, nullable, keyed,
                          arrow_type)
        self.streams.append(s)
        return s

    def _blocks_for(self, n: int) -> int:
        return max(1, int(np.ceil(max(n, 1) * self._bloom_bpk / 512)))

    def _alloc_filter(self, n: int, foldable: bool = False) -> np.ndarray:
        nblocks = self._blocks_for(n)
        if foldable and nblocks >= 64:  # a multiple of 64 blocks: up to 6 halvings at finish
            nblocks = (nblocks + 63) // 64 * 64
        return np.zeros(nblocks * 8, dtype=np.uint64)

    def _fold_filter(self, nkeys: int) -> None:
        """Halve the filter while it stays big enough for the keys actually written: the block
        of a hash is ``((h >> 32) * nblocks) >> 32``, so with half the blocks it is the old
        block // 2, and OR-ing block pairs gives exactly the filter built at the smaller size
        (``expected_keys`` need only be an upper bound, e.g. the sum over a merge's inputs)."""
        w = self._words
        need = self._blocks_for(nkeys)
        while (len(w) // 8) % 2 == 0 and len(w) // 16 >= need:
            w = np.bitwise_or(w.reshape(-1, 2, 8)[:, 0, :], w.reshape(-1, 2, 8)[:, 1, :]).reshape(-1)
        self._words = np.ascontiguousarray(w)

    # -- appending ---------------------------------------------------------------------------

    def append(self, codes, columns=None, weights=None, offsets=None, *, layer: int = 0):
        """Append rows to ``layer``.

        ``codes``: uint64 array (u64 layers) or :class:`~dbsp.algebra.codes.VarCodes` /
        ``(offsets, data)`` (var layers). ``columns``: Arrow arrays (or a RecordBatch/Table)
        matching the layer's schema. ``weights``: int64 array. ``offsets`` (ordered layers):
        for each row, the first row of its range in the next layer; the final end offset is
        added by ``finish`` (the next layer's row count).
        """
        if self._done:
            raise ValueError("writer already finished")
        spec = self.layers[layer]
        st = self._layer_streams[layer]
        new_last = None
        # codes
        if spec.code == "u64":
            c = np.ascontiguousarray(codes, dtype=np.uint64)
            n = len(c)
            if layer == 0 and n:
                if n > 1 and not bool(np.all(c[1:] >= c[:-1])):
                    bad = int(np.argmin(c[1:] >= c[:-1])) + 1
                    raise ValueError(f"layer 0 codes are not sorted: row {st['codes'].rows + bad}")
                if self._last_code[0] is not None and int(c[0]) < self._last_code[0]:
                    raise ValueError(f"layer 0 codes are not sorted across chunks: row "
                                     f"{st['codes'].rows}")
                new_last = int(c[-1])
        else:
            co, cd = (codes.offsets, codes.data) if hasattr(codes, "offsets") else codes
            co = np.ascontiguousarray(co, dtype=np.int64)
            cd = np.ascontiguousarray(cd, dtype=np.uint8)
            n = len(co) - 1
            if layer == 0 and n:
                first = cd[co[0]:co[1]].tobytes()
                if self._last_code[0] is not None and first < self._last_code[0]:
                    raise ValueError(f"layer 0 codes are not sorted across chunks: row "
                                     f"{st['codes'].rows}")
                new_last = cd[co[n - 1]:co[n]].tobytes()
        # validate the other parts before writing anything
        cols = []
        if spec.schema is not None:
            if columns is None:
                raise ValueError(f"layer {layer} has columns {spec.schema.names}; none given")
            if isinstance(columns, (pa.RecordBatch, pa.Table)):
                columns = [columns.column(i) for i in range(columns.num_columns)]
            if len(columns) != len(spec.schema):
                raise ValueError(f"layer {layer} has {len(spec.schema)} columns, got "
                                 f"{len(columns)}")
            for f, a in zip(spec.schema, columns):
                if isinstance(a, pa.ChunkedArray):
                    a = a.combine_chunks()
                elif not isinstance(a, pa.Array):
                    a = pa.array(a, type=f.type)
                if a.type != f.type:
                    raise TypeError(f"column {f.name!r}: expected {f.type}, got {a.type}")
                if len(a) != n:
                    raise ValueError(f"column {f.name!r} has {len(a)} rows, codes have {n}")
                if not f.nullable and a.null_count:
                    raise ValueError(f"column {f.name!r} is not nullable but has "
                                     f"{a.null_count} nulls")
                cols.append(a)
        elif columns:
            raise ValueError(f"layer {layer} has no columns")
        w = None
        if spec.weights:
            if weights is None:
                raise ValueError(f"layer {layer} stores weights; none given")
            w = np.ascontiguousarray(weights, dtype=np.int64)
            if len(w) != n:
                raise ValueError(f"weights have {len(w)} rows, codes have {n}")
        o = None
        if spec.offsets:
            if offsets is None:
                raise ValueError(f"layer {layer} is ordered; offsets needed")
            o = np.ascontiguousarray(offsets, dtype=np.int64)
            if len(o) != n:
                raise ValueError(f"offsets have {len(o)} rows, codes have {n}")
            if n and (o[0] < self._last_offset[layer] or
                      (n > 1 and not bool(np.all(o[1:] >= o[:-1])))):
                raise ValueError(f"layer {layer} offsets decrease")
        # everything is valid: now change state
        if o is not None and n:
            self._last_offset[layer] = int(o[-1])
        if new_last is not None:
            self._last_code[0] = new_last
        if spec.code == "u64":
            st["codes"].append_fixed(c.view("V8"), None)
            if layer == 0 and self.bloom_fpr is not None and n:
                self._add_hashes(_nb.hash_u64(c, BLOOM_SEED))
        else:
            st["codes"].append_var(co, cd, None)
            if layer == 0 and self.bloom_fpr is not None and n:
                self._add_hashes(_nb.hash_var(co, cd, BLOOM_SEED))
        for s, a in zip(st["columns"], cols):
            if s.phys.kind == "ipc":
                s.append_ipc(a)
                continue
            kind, vals, valid = _arrow_parts(a, s.phys)
            if kind == "var":
                s.append_var(vals[0], vals[1], valid)
            else:
                s.append_fixed(vals, valid)
        if w is not None:
            st["weights"].append_fixed(w.view("V8"), None)
        if o is not None:
            st["offsets"].append_fixed(o.view("V8"), None)

    def _add_hashes(self, h: np.ndarray):
        if self._words is not None:
            _nb.bloom_add(self._words, self._bloom_k, h)
        else:
            self._hashes.append(h)

    # -- finishing ---------------------------------------------------------------------------

    def finish(self) -> str:
        """Write the remaining blocks, index, filter and trailer; fsync; rename. Returns the
        final path."""
        if self._done:
            raise ValueError("writer already finished")
        try:
            for li, spec in enumerate(self.layers):
                if spec.offsets:
                    st = self._layer_streams[li]
                    end = self._layer_streams[li + 1]["codes"].rows
                    if end < self._last_offset[li]:
                        raise ValueError(f"layer {li} offsets point past layer {li + 1}'s "
                                         f"{end} rows")
                    st["offsets"].append_fixed(np.array([end], dtype=np.int64).view("V8"), None)
            for s in self.streams:
                s.finish()
            filt = None
            if self.bloom_fpr is not None:
                filt = self._write_filter()
            self._write_trailer(filt)
            self._sink.flush()
            if self.durable:
                os.fsync(self._sink.fd)
            self._sink.close()
            os.rename(self.mut_path, self.path)
            if self.durable:
                _fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        except BaseException:
            self.abort()
            raise
        self._done = True
        return self.path

    def _write_filter(self) -> dict:
        nkeys = self._layer_streams[0]["codes"].rows
        if self._words is None:
            self._words = self._alloc_filter(nkeys)
            for h in self._hashes:
                _nb.bloom_add(self._words, self._bloom_k, h)
            self._hashes = []
        else:
            self._fold_filter(nkeys)
        ext = _make_block(F.KIND_FILTER, 0, 0xFFFF, 0, 0, 0, [self._words, None, None, None],
                          len(self._words), False)
        off = self._sink.put(ext)
        return {"offset": off, "extent": len(ext), "keys": nkeys, "words": len(self._words),
                "k": self._bloom_k, "bits_per_key": self._bloom_bpk,
                "target_fpr": self.bloom_fpr, "seed": BLOOM_SEED, "hash": "dbsp-v1",
                "layer": 0}

    def _write_trailer(self, filt):
        layers = []
        for li, spec in enumerate(self.layers):
            st = self._layer_streams[li]
            layers.append({
                "rows": st["codes"].rows, "code": spec.code,
                "schema": F.schema_to_b64(spec.schema) if spec.schema is not None else None,
                "ordered": spec.offsets,
                "codes": st["codes"].sid,
                "columns": [s.sid for s in st["columns"]],
                "weights": st["weights"].sid if st["weights"] else None,
                "offsets": st["offsets"].sid if st["offsets"] else None,
            })
        incompat = F.INCOMPAT_LZ4 if self.compress else 0
        compat = F.COMPAT_BLOOM if filt else 0
        meta = {
            "version": F.FORMAT_VERSION, "block_size": self.block_size, "checksum": "crc32c",
            "compression": self.compression, "layers": layers,
            "streams": [s.meta() for s in self.streams], "filter": filt,
            "metadata": self.metadata, "incompat": incompat, "compat": compat,
        }
        payload = F.dumps_trailer(meta)
        extent = align(HEADER_SIZE + len(payload) + F.TAIL.size)
        ext = bytearray(extent)
        BlockHeader(F.KIND_TRAILER, 0, 0xFFFF, extent, len(payload), len(payload), 0, 0, 0,
                    (0, NO_BUF, NO_BUF, NO_BUF), len(payload)).pack_into(ext, 0)
        ext[HEADER_SIZE:HEADER_SIZE + len(payload)] = payload
        file_size = self._sink.offset + extent
        F.TAIL.pack_into(ext, extent - F.TAIL.size, F.TAIL_MAGIC, F.FORMAT_VERSION, extent,
                         file_size, incompat, compat)
        ext[4:8] = int(_nb.crc32c(memoryview(ext)[8:])).to_bytes(4, "little")
        self._sink.put(ext)

    def abort(self):
        """Drop the ``.mut`` file (on errors; also called by the context manager)."""
        self._done = True
        try:
            self._sink.close()
        finally:
            try:
                os.unlink(self.mut_path)
            except FileNotFoundError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is None:
            if not self._done:
                self.finish()
        elif not self._done:
            self.abort()
        return False


def _fsync_dir(d: str):
    fd = os.open(d or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
