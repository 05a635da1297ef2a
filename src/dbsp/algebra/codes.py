"""Normalized key codes: the one ordering every layer, merge and cursor uses.

Goals
-----
Native kernels (sort, merge, seek, join, hash) must not care about column types. So every key
(one or several columns, any supported type, nullable) is encoded into a *code* whose plain
unsigned comparison gives the key order: lexicographic over the columns, nulls first.

Design
------
Each column contributes a big-endian, order-preserving byte string:

* nullable columns first contribute one flag byte: ``0`` for null, ``1`` for a value (a null's
  value bytes are all zero, so every null compares equal and before every value);
* signed integers (and date32, timestamps, durations) flip the sign bit; unsigned integers are
  taken as they are; bool is one byte; float64 maps ``x`` to its bits with the sign bit flipped
  when ``x >= 0`` and all bits inverted when ``x < 0`` (``-0.0`` is folded onto ``0.0`` and every
  NaN onto one NaN, which sorts last);
* decimal128 is 16 bytes of two's complement with the sign bit flipped;
* strings and binary are escaped (``00`` -> ``00 FF``) and terminated by ``00 00``, which keeps
  the encoding prefix-free, so concatenated columns compare correctly with ``memcmp``.

Types that have an order-preserving code through another type are first *normalized* to it
(:func:`normalize`): float32 and float16 widen exactly to float64 (so ``float32(x)`` and
``float64(x)`` share a code); dictionary-encoded columns are decoded to their value type (codes
never depend on a batch's dictionary); nested columns (struct, list, large / fixed-size list, map)
become binary columns holding their *nested code*, escaped like any binary value:

* a struct value is the concatenation of its fields' codes (each field with its null flag), so
  structs order field by field;
* a list value is, for every element, ``01`` then the element's code (with its null flag),
  then ``00``: lists order element by element, a prefix before a longer list;
* a map value is the list of its ``(key, value)`` entries in stored order (two maps with the same
  entries in another order are different values, as in Arrow).

Escaping a prefix-free, order-preserving byte string keeps both properties, so nested values are
ordered (lexicographically, recursively) and may be keys as well as payload.

When every column is fixed-width and the total is at most 8 bytes, the code is the big-endian
integer of those bytes: one ``uint64`` per row (the fast path for the common integer keys).
Otherwise it is a :class:`VarCodes`: Arrow-style ``offsets`` (int64, n+1) and ``data`` (uint8),
compared with ``memcmp`` then length.

Invariants
----------
* ``encode(a) < encode(b)`` (unsigned / memcmp) iff ``a < b`` in key order; equal iff equal.
* Codes are deterministic functions of the key values and the key *types*: the same key encodes
  the same way in every batch, worker and process (the exchange hashes codes).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .identity import IdentityCache

__all__ = ["VarCodes", "CodeArray", "Code", "Codes", "KeyCodec", "codec_for"]


@dataclass(frozen=True)
class VarCodes:
    """Variable-length codes in Arrow binary layout: row ``i`` is ``data[offsets[i]:offsets[i+1]]``."""

    offsets: np.ndarray  # int64, n + 1, offsets[0] may be > 0 for a slice
    data: np.ndarray  # uint8

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, i: int) -> bytes:
        return self.data[self.offsets[i]:self.offsets[i + 1]].tobytes()

    def to_list(self) -> list[bytes]:
        o, d = self.offsets, self.data.tobytes()
        return [d[o[i]:o[i + 1]] for i in range(len(o) - 1)]

    @staticmethod
    def from_list(rows: Sequence[bytes]) -> "VarCodes":
        lens = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        data = np.frombuffer(b"".join(rows), dtype=np.uint8)
        return VarCodes(offsets, data)

    @property
    def nbytes(self) -> int:
        return self.offsets.nbytes + self.data.nbytes


#: a column of codes: one ``uint64`` per row (keys of at most 8 bytes) or :class:`VarCodes`
CodeArray = Union[np.ndarray, VarCodes]
#: one code: an ``int`` (u64 codes) or ``bytes`` (var codes)
Code = Union[int, bytes]


class Codes:
    """What every layer does with a column of codes, whichever representation it has.

    A code column is either a ``uint64`` ndarray or a :class:`VarCodes`; the native kernels take
    both, and the Python layers above ask these functions instead of checking the type
    themselves. This class is the one place that tells the two representations apart.

    >>> import numpy as np
    >>> u = np.array([3, 5, 9], dtype=np.uint64)
    >>> Codes.at(u, 1), Codes.kind(u), Codes.one(7, like=u)
    (5, 'u64', array([7], dtype=uint64))
    >>> v = VarCodes.from_list([b"a", b"bc"])
    >>> Codes.at(v, 1), Codes.kind(v), Codes.row_lengths(v).tolist()
    (b'bc', 'var', [1, 2])
    """

    __slots__ = ()

    @staticmethod
    def is_u64(codes: CodeArray) -> bool:
        """Whether ``codes`` are fixed-width ``uint64`` codes."""
        return isinstance(codes, np.ndarray)

    @staticmethod
    def kind(codes: CodeArray) -> str:
        """``"u64"`` or ``"var"`` (the layer file format's names)."""
        return "u64" if isinstance(codes, np.ndarray) else "var"

    @staticmethod
    def at(codes: CodeArray, i: int) -> Code:
        """Row ``i`` as one code (``int`` or ``bytes``)."""
        if isinstance(codes, np.ndarray):
            return int(codes[i])
        o = codes.offsets
        return codes.data[o[i]:o[i + 1]].tobytes()

    @staticmethod
    def one(code: Code, like: CodeArray) -> CodeArray:
        """A one-row code array holding ``code``, in the representation of ``like`` (a probe
        for the kernels' ``lower_bound``)."""
        if isinstance(like, np.ndarray):
            return np.asarray([code], dtype=np.uint64)
        return VarCodes.from_list([bytes(code)])  # type: ignore[arg-type]

    @staticmethod
    def slice(codes: CodeArray, lo: int, hi: int) -> CodeArray:
        """Rows ``lo:hi`` without copying (a VarCodes slice keeps absolute offsets)."""
        if isinstance(codes, np.ndarray):
            return codes[lo:hi]
        return VarCodes(codes.offsets[lo:hi + 1], codes.data)

    @staticmethod
    def row_lengths(codes: CodeArray) -> np.ndarray:
        """Bytes of each row's code (8 for u64 codes, big-endian when packed)."""
        if isinstance(codes, np.ndarray):
            return np.full(len(codes), 8, np.int64)
        return np.diff(codes.offsets).astype(np.int64)

    @staticmethod
    def to_list(codes: CodeArray) -> list:
        """Every row as a Python ``int`` or ``bytes``."""
        return codes.tolist() if isinstance(codes, np.ndarray) else codes.to_list()

    @staticmethod
    def empty(u64: bool) -> CodeArray:
        """No rows, in the given representation."""
        if u64:
            return np.zeros(0, dtype=np.uint64)
        return VarCodes(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8))

    @staticmethod
    def as_code(bound: Any) -> Code:
        """One code from an ``int``, ``bytes``, numpy integer or one-row code array."""
        if isinstance(bound, np.ndarray):
            return int(bound[0])
        if isinstance(bound, VarCodes):
            return bound.row(0)
        if isinstance(bound, np.integer):
            return int(bound)
        return bound


# --- per-type normalization ---------------------------------------------------------------

_SIGNED = {pa.int8(): 1, pa.int16(): 2, pa.int32(): 4, pa.int64(): 8}
_UNSIGNED = {pa.uint8(): 1, pa.uint16(): 2, pa.uint32(): 4, pa.uint64(): 8}


def _fixed_width(t: pa.DataType) -> int | None:
    """Bytes a value of type ``t`` takes in a code (without the null flag); None if variable."""
    if pa.types.is_dictionary(t):
        return _fixed_width(t.value_type)
    if pa.types.is_floating(t):
        return 8  # float32 / float16 are coded as the float64 of the same value
    if _is_nested(t):
        return None
    if t in _SIGNED:
        return _SIGNED[t]
    if t in _UNSIGNED:
        return _UNSIGNED[t]
    if pa.types.is_boolean(t):
        return 1
    if pa.types.is_float64(t):
        return 8
    if pa.types.is_date32(t):
        return 4
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t):
        return 8
    if pa.types.is_time32(t):
        return 4
    if pa.types.is_time64(t):
        return 8
    if pa.types.is_decimal128(t):
        return 16
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) \
            or pa.types.is_large_binary(t):
        return None
    raise TypeError(f"column type {t} is not supported as a key")


def _ordered_uint(arr: pa.Array) -> tuple[np.ndarray, int]:
    """Order-preserving unsigned integers of a fixed-width column (nulls -> 0) and their width."""
    t = arr.type
    w = _fixed_width(t)
    if pa.types.is_boolean(t):
        v = np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.uint64)
        return v, 1
    if pa.types.is_float64(t):
        f = np.asarray(arr.fill_null(0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
        f = np.where(f == 0.0, 0.0, f)  # fold -0.0
        f = np.where(np.isnan(f), np.nan, f)  # one NaN
        bits = f.view(np.uint64)
        neg = (bits >> np.uint64(63)).astype(bool)
        out = np.where(neg, ~bits, bits | np.uint64(1 << 63))
        return out.astype(np.uint64), 8
    storage = _storage_numpy(arr)
    if t in _UNSIGNED:
        return storage.astype(np.uint64), w
    # signed family (ints, dates, timestamps, durations, times)
    signed = storage.astype(np.int64)
    bias = np.uint64(1 << (8 * w - 1))
    return (signed.view(np.uint64) if w == 8 else signed.astype(np.uint64) & np.uint64((1 << (8 * w)) - 1)) ^ bias, w


def _storage_numpy(arr: pa.Array) -> np.ndarray:
    """Values of a fixed-width non-bool column as numpy, nulls replaced by zero."""
    t = arr.type
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        arr = arr.cast(pa.int32())
    elif pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) \
            or pa.types.is_time64(t):
        arr = arr.cast(pa.int64())
    if arr.null_count:
        arr = arr.fill_null(0)
    return arr.to_numpy(zero_copy_only=False)


#: the unsigned numpy view of the values buffer of the integer and temporal types (by bit width)
_UVIEW = {8: np.dtype(np.uint8), 16: np.dtype(np.uint16), 32: np.dtype(np.uint32),
          64: np.dtype(np.uint64)}


def _buffer_plan(t: pa.DataType):
    """``(unsigned dtype of the values buffer, signed)`` of a type whose code comes straight from
    its values (integers, dates, times, timestamps, durations: same order as their storage
    integer), else None (booleans, floats, decimals, variable-width, dictionaries, nested)."""
    if t in _UNSIGNED:
        return _UVIEW[t.bit_width], False
    if t in _SIGNED or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t) \
            or pa.types.is_duration(t):
        return _UVIEW[t.bit_width], True
    return None


def _valid_u64(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=np.uint64)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint64)


def _escape(b: bytes) -> bytes:
    return b.replace(b"\x00", b"\x00\xff") + b"\x00\x00"


def _column_bytes(arr: pa.Array, nullable: bool) -> list[bytes]:
    """Per-row code bytes of one column (general path, used when the key is not u64)."""
    t = arr.type
    n = len(arr)
    w = _fixed_width(t)
    valid = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else np.ones(n, bool)
    out: list[bytes] = []
    if w is None:
        vals = arr.to_pylist()
        for i in range(n):
            v = vals[i]
            body = b"" if v is None else _escape(v.encode() if isinstance(v, str) else bytes(v))
            if v is None:
                body = b"\x00\x00"
            out.append((b"\x01" if valid[i] else b"\x00") + body if nullable else body)
        return out
    if pa.types.is_decimal128(t):
        raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8)[arr.offset * 16:(arr.offset + n) * 16]
        raw = raw.reshape(n, 16)
        for i in range(n):
            if not valid[i]:
                body = bytes(16)
            else:
                le = bytes(raw[i])  # little-endian two's complement
                be = bytearray(le[::-1])
                be[0] ^= 0x80
                body = bytes(be)
            out.append((b"\x01" if valid[i] else b"\x00") + body if nullable else body)
        return out
    u, w = _ordered_uint(arr)
    be = u.astype(">u8").view(np.uint8).reshape(n, 8)[:, 8 - w:]
    for i in range(n):
        body = be[i].tobytes() if valid[i] else bytes(w)
        out.append((b"\x01" if valid[i] else b"\x00") + body if nullable else body)
    return out


def _is_nested(t: pa.DataType) -> bool:
    return (pa.types.is_struct(t) or pa.types.is_list(t) or pa.types.is_large_list(t)
            or pa.types.is_fixed_size_list(t) or pa.types.is_map(t))


def needs_normalize(t: pa.DataType) -> bool:
    """Whether columns of type ``t`` are coded through :func:`normalize`."""
    return pa.types.is_dictionary(t) or pa.types.is_float32(t) or pa.types.is_float16(t) \
        or _is_nested(t)


def normalize(arr: Any) -> pa.Array:
    """The column whose code is ``arr``'s code (see the module doc): float32 / float16 as
    float64, dictionaries decoded, nested columns as binary columns of their nested code (nulls
    kept); any other column unchanged."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    t = arr.type
    if pa.types.is_dictionary(t):
        return normalize(arr.dictionary_decode())
    if pa.types.is_float32(t) or pa.types.is_float16(t):
        return arr.cast(pa.float64())
    if _is_nested(t):
        codes = _nested_codes(arr)
        data = pa.py_buffer(codes.data)
        start = int(codes.offsets[0])
        offs = codes.offsets - start
        total = int(offs[-1]) if len(offs) else 0
        valid = None
        if arr.null_count:  # a fresh bitmap at offset 0 (the array may be a slice)
            valid = pa.array(arr.is_valid().to_numpy(zero_copy_only=False)).buffers()[1]
        if total < 2 ** 31 - 1:
            return pa.Array.from_buffers(pa.binary(), len(arr), [
                valid, pa.py_buffer(offs.astype(np.int32)), data.slice(start, total)],
                null_count=arr.null_count)
        return pa.Array.from_buffers(pa.large_binary(), len(arr), [
            valid, pa.py_buffer(offs), data.slice(start, total)], null_count=arr.null_count)
    return arr


def _as_var(codec: "KeyCodec", cols: Sequence[pa.Array], n: int) -> VarCodes:
    """``codec``'s codes of ``cols`` as :class:`VarCodes` (u64 codes as their big-endian bytes)."""
    c = codec.encode(cols, n)
    if isinstance(c, VarCodes):
        return c
    w = codec.width or 0
    be = c.astype(">u8").view(np.uint8).reshape(n, 8)[:, 8 - w:]
    return VarCodes(np.arange(n + 1, dtype=np.int64) * w, np.ascontiguousarray(be).reshape(-1))


def _spread(lens: np.ndarray, src_starts: np.ndarray, dst_starts: np.ndarray) -> tuple:
    """Byte positions copying pieces ``[src_starts[i], +lens[i])`` to ``[dst_starts[i], ...)``:
    ``(src_index, dst_index)``, vectorised."""
    total = int(lens.sum())
    if total == 0:
        e = np.zeros(0, np.int64)
        return e, e
    if lens[0] == lens.min() == lens.max():  # equal pieces (fixed-width codes): broadcast
        ar = np.arange(int(lens[0]), dtype=np.int64)
        return ((src_starts[:, None] + ar).reshape(-1),
                (np.asarray(dst_starts)[:, None] + ar).reshape(-1))
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    return np.repeat(src_starts, lens) + within, np.repeat(dst_starts, lens) + within


def _concat_rows(parts: Sequence[VarCodes], n: int) -> VarCodes:
    """Row ``i`` = ``parts[0][i] + parts[1][i] + ...``."""
    lens = [np.diff(p.offsets) for p in parts]
    total = np.zeros(n, np.int64)
    for ln in lens:
        total += ln
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(total, out=offsets[1:])
    out = np.empty(int(offsets[-1]), np.uint8)
    acc = offsets[:-1].copy()
    for p, ln in zip(parts, lens):
        si, di = _spread(ln, p.offsets[:-1], acc)
        out[di] = p.data[si]
        acc += ln
    return VarCodes(offsets, out)


def _nested_codes(arr: pa.Array) -> VarCodes:
    """The nested code of every row of a struct / list / map column (any bytes for a null row:
    the column's null flag hides them)."""
    n = len(arr)
    t = arr.type
    if pa.types.is_struct(t):
        children = arr.flatten()  # respects the slice offset
        fields = [t.field(i) for i in range(t.num_fields)]
        if not fields:
            return VarCodes(np.zeros(n + 1, np.int64), np.zeros(0, np.uint8))
        parts = [_as_var(KeyCodec([f]), [normalize(c)], n) for f, c in zip(fields, children)]
        return _concat_rows(parts, n)
    if pa.types.is_map(t):
        entry = pa.struct([t.key_field, t.item_field])
        arr = arr.cast(pa.list_(pa.field("entries", entry, nullable=False)))
        t = arr.type
    counts = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
    counts = counts.astype(np.int64)
    elems = arr.flatten()  # the elements of the non-null rows, in row order
    m = len(elems)
    item = pa.field("item", t.value_type, nullable=True)
    e = _as_var(KeyCodec([item]), [normalize(elems)], m)
    elen = np.diff(e.offsets)
    row_of = np.repeat(np.arange(n, dtype=np.int64), counts)
    piece = elen + 1  # 01 + element code
    dst = np.cumsum(piece) - piece + row_of  # one 00 terminator per earlier row
    rows_len = np.bincount(row_of, weights=piece, minlength=n).astype(np.int64) + 1
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(rows_len, out=offsets[1:])
    out = np.zeros(int(offsets[-1]), np.uint8)  # terminators are the zeros left over
    out[dst] = 1
    si, di = _spread(elen, e.offsets[:-1], dst + 1)
    out[di] = e.data[si]
    return VarCodes(offsets, out)


@functools.lru_cache(maxsize=1)
def _native_codes():
    """``dbsp._native.codes`` (the var-code encoder), or None when it is not built; looked up
    once (an import statement per encode costs several calls)."""
    try:
        from dbsp._native import codes as nc  # type: ignore
    except ImportError:  # pragma: no cover - reference path
        return None
    return nc


_ARROW_C: Any = False  # not looked up yet


def _native_arrow():
    """``dbsp._native.arrow_c`` (the u64 encoder of :meth:`KeyCodec.encode_batch`), or None
    when it is not built (or ``DBSP_KERNELS=ref`` asks for the reference paths); looked up once."""
    global _ARROW_C
    if _ARROW_C is False:
        try:
            from dbsp._native import arrow_c  # type: ignore
        except ImportError:  # pragma: no cover - reference path
            arrow_c = None
        _ARROW_C = None if os.environ.get("DBSP_KERNELS") == "ref" else arrow_c
    return _ARROW_C


@functools.lru_cache(maxsize=1024)
def _codec_from_ipc(b: bytes) -> "KeyCodec":
    return KeyCodec(list(pa.ipc.read_schema(pa.py_buffer(b))))


class KeyCodec:
    """Encodes the key columns of one schema into codes (see the module doc)."""

    def __init__(self, fields: Sequence[pa.Field]):
        self.fields = list(fields)
        widths = []
        for f in self.fields:
            w = _fixed_width(f.type)
            widths.append(None if w is None else w + (1 if f.nullable else 0))
        self.fixed = all(w is not None for w in widths)
        self.width = sum(widths) if self.fixed else None  # type: ignore[arg-type]
        self.u64 = self.fixed and self.width is not None and self.width <= 8
        # columns coded through another type (see normalize); None when there are none
        norm = [needs_normalize(f.type) for f in self.fields]
        self._norm = norm if any(norm) else None
        #: per field: ``(storage dtype, signed)`` when its code is read straight from the values
        #: buffer (integers and temporal types, see :func:`_buffer_plan`), else None
        self._plan = [None if nz else _buffer_plan(f.type) for f, nz in zip(self.fields, norm)]
        #: ``(byte width, signed, nullable)`` per column when every column's code comes from its
        #: values buffer and the codes are u64: :meth:`encode_batch` then encodes natively
        self._nullable = [f.nullable for f in self.fields]
        self._native_plan = [(p[0].itemsize, p[1], f.nullable) for f, p in
                             zip(self.fields, self._plan)] \
            if self.u64 and self.fields and all(p is not None for p in self._plan) else None

    def __reduce__(self):
        # a codec is rebuilt from its fields; sent as an Arrow IPC schema (pickling the fields
        # one by one costs several microseconds each, on every batch an exchange sends)
        b = self.__dict__.get("_ipc")
        if b is None:
            b = self._ipc = pa.schema(self.fields).serialize().to_pybytes()
        return _codec_from_ipc, (b,)

    def __repr__(self) -> str:
        kind = "u64" if self.u64 else "var"
        return f"KeyCodec({[f.name for f in self.fields]}, {kind})"

    def encode(self, columns: Sequence[pa.Array], num_rows: int | None = None) -> CodeArray:
        """Codes of the rows of ``columns``; ``num_rows`` is needed when there are no columns
        (the empty key: every row gets the same code)."""
        if len(columns) != len(self.fields):
            raise ValueError(f"expected {len(self.fields)} key columns, got {len(columns)}")
        if not columns:
            if num_rows is None:
                raise ValueError("num_rows is required to encode zero columns")
            return np.zeros(num_rows, dtype=np.uint64)
        if self._norm is not None:
            columns = [normalize(c) if nz else c for c, nz in zip(columns, self._norm)]
        if self.u64:
            return self._encode_u64(columns)
        _nc = _native_codes()
        if _nc is not None:
            return _nc.encode_var(list(columns), [f.nullable for f in self.fields])
        return self.encode_reference(columns)

    def encode_batch(self, batch: pa.RecordBatch) -> CodeArray:
        """:meth:`encode` of the columns of ``batch`` (exactly this codec's fields, in order).
        Integer and temporal keys without nulls are encoded from the batch's buffers in one
        native call (``dbsp._native.arrow_c.encode_u64``, whose reference is
        :meth:`_encode_u64`), without a pyarrow object per column."""
        n = batch.num_rows
        if n and self._native_plan is not None:
            na = _native_arrow()
            if na is not None:
                got = na.encode_u64(batch, self._native_plan)
                if got is not None:
                    return got
        elif n and not self.u64 and self._norm is None and self.fields \
                and _native_arrow() is not None:  # (None also under DBSP_KERNELS=ref)
            # var codes read through one export of the batch (``encode_var_batch``; its
            # reference is :meth:`encode_reference`), no pyarrow object per column
            got = _native_codes().encode_var_batch(batch, self._nullable)
            if got is not None:
                return got
        return self.encode(batch.columns, n)

    def _encode_u64(self, columns: Sequence[pa.Array]) -> np.ndarray:
        n = len(columns[0]) if columns else 0
        code = None
        for f, col, plan in zip(self.fields, columns, self._plan):
            if n and plan is not None and not col.null_count and isinstance(col, pa.Array):
                # integers and temporal values without nulls: read the values buffer in place
                dt, signed = plan
                w = dt.itemsize
                u = np.frombuffer(col.buffers()[1], dtype=dt, count=n, offset=col.offset * w)
                if signed:  # two's complement with the sign bit flipped sorts as unsigned
                    u = u ^ dt.type(1 << (8 * w - 1))
                u = u.astype(np.uint64, copy=False) if w < 8 else u
            else:
                u, w = _ordered_uint(col)
                if col.null_count:
                    u = np.where(_valid_u64(col).astype(bool), u, np.uint64(0))
            if f.nullable:  # a validity byte before the value
                flag = _valid_u64(col)
                code = flag if code is None else (code << np.uint64(8)) | flag
            code = u if code is None or w == 8 else (code << np.uint64(8 * w)) | u
        if code is None:
            return np.zeros(n, dtype=np.uint64)
        return code if code.base is None else code.copy()

    def encode_reference(self, columns: Sequence[pa.Array]) -> VarCodes:
        """Pure-Python encoding of the general path (the oracle for the native encoder)."""
        n = len(columns[0]) if columns else 0
        if self._norm is not None:
            columns = [normalize(c) if nz else c for c, nz in zip(columns, self._norm)]
        per_col = [_column_bytes(c, f.nullable) for f, c in zip(self.fields, columns)]
        rows = [b"".join(pc[i] for pc in per_col) for i in range(n)]
        return VarCodes.from_list(rows)


#: the codecs of the schema objects met, in front of :func:`_codec_cached`, whose key hashes
#: the schema (three quarters of an empty step of the join + average circuit)
_CODEC_BY_ID = IdentityCache()


def codec_for(schema: pa.Schema, names: Sequence[str] | None = None) -> KeyCodec:
    """The codec of the ``names`` columns (default: all) of ``schema``; cached, so the batches of
    a stream share one codec."""
    nm = None if names is None else tuple(names)
    got = _CODEC_BY_ID.get(schema, nm)
    if got is not None:
        return got
    return _CODEC_BY_ID.put(schema, _codec_cached(schema, tuple(schema.names) if nm is None
                                                  else nm), nm)


@functools.lru_cache(maxsize=4096)
def _codec_cached(schema: pa.Schema, names: tuple) -> KeyCodec:
    return KeyCodec([schema.field(n) for n in names])
