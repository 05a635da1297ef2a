"""Native encoder of var key codes: the twin of ``KeyCodec.encode_reference`` (same bytes).

See :mod:`dbsp.algebra.codes` for the encoding. This module reads the Arrow buffers of the key
columns directly (validity bitmaps, int32/int64 offsets and data of string/binary columns,
fixed-width values, bool bitmaps, decimal128) and builds the :class:`VarCodes` in two passes:
the byte size of every row (column by column), then the bytes (row by row, so that the output is
written in order, once). ``KeyCodec.encode`` calls it for
every key that does not fit one u64.

Every loop runs without the GIL.
"""
cimport numpy as cnp
from libc.stdint cimport uint8_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t
from libc.string cimport memchr, memcpy, memset

from _native.codes_cmp cimport dbsp_bswap64
from _native.arrays cimport empty1, zeros1
from _native.arrow_abi cimport ArrowArray, ArrowSchema
from libc.stdint cimport uintptr_t

import numpy as np
import pyarrow as pa

from dbsp.algebra.codes import VarCodes

cnp.import_array()

cdef enum:
    K_UINT = 0       # unsigned integer of `src` bytes, taken as it is
    K_INT = 1        # signed integer (ints, dates, times, timestamps, durations): sign bit flipped
    K_BOOL = 2       # bit-packed booleans: one byte 0/1
    K_F64 = 3        # float64: -0.0 folded, NaNs folded, order-preserving bits
    K_DEC = 4        # decimal128: 16 bytes big-endian, sign bit flipped
    K_VAR32 = 5      # string/binary: escaped bytes + 00 00; int32 offsets
    K_VAR64 = 6      # large_string/large_binary: int64 offsets

ctypedef struct col_t:
    int kind
    int width                 # bytes of a value in the code (fixed kinds)
    bint nullable             # a flag byte precedes the value
    int64_t offset            # the array's offset (rows, or bits for bitmaps)
    const uint8_t* valid      # validity bitmap or NULL
    const uint8_t* values     # fixed-width values, bool bitmap, or var data
    const int32_t* off32
    const int64_t* off64


cdef inline bint is_valid(const col_t* c, int64_t i) noexcept nogil:
    cdef int64_t b
    if c.valid == NULL:
        return True
    b = c.offset + i
    return (c.valid[b >> 3] >> (b & 7)) & 1


cdef inline void var_span(const col_t* c, int64_t i, int64_t* start,
                          int64_t* length) noexcept nogil:
    cdef int64_t j = c.offset + i
    if c.kind == K_VAR32:
        start[0] = c.off32[j]
        length[0] = <int64_t>c.off32[j + 1] - c.off32[j]
    else:
        start[0] = c.off64[j]
        length[0] = c.off64[j + 1] - c.off64[j]


cdef inline int64_t count_zeros(const uint8_t* p, int64_t n) noexcept nogil:
    """Zero bytes in p[0:n], found with ``memchr`` (they are rare in text)."""
    cdef int64_t z = 0
    cdef const uint8_t* q
    while n > 0:
        q = <const uint8_t*>memchr(p, 0, <size_t>n)
        if q == NULL:
            break
        z += 1
        n -= q - p + 1
        p = q + 1
    return z


cdef inline uint64_t fixed_value(const col_t* c, int64_t i) noexcept nogil:
    """The order-preserving unsigned value (low ``width`` bytes) of row i of a fixed column."""
    cdef int64_t j = c.offset + i
    cdef uint64_t u = 0, bias
    cdef double f = 0.0
    if c.kind == K_BOOL:
        return (c.values[j >> 3] >> (j & 7)) & 1
    if c.kind == K_F64:
        memcpy(&f, c.values + 8 * j, 8)
        if f == 0.0:
            f = 0.0                       # -0.0 -> 0.0
        if f != f:
            u = <uint64_t>0x7FF8000000000000   # every NaN -> the one NaN numpy makes
        else:
            memcpy(&u, &f, 8)
        if u >> 63:
            return ~u
        return u | (<uint64_t>1 << 63)
    u = 0
    # little-endian hosts (checked at import); constant-size loads for the usual widths
    if c.width == 8:
        memcpy(&u, c.values + 8 * j, 8)
    elif c.width == 4:
        u = (<const uint32_t*>c.values)[j]
    elif c.width == 2:
        u = (<const uint16_t*>c.values)[j]
    elif c.width == 1:
        u = c.values[j]
    else:
        memcpy(&u, c.values + c.width * j, c.width)
    if c.kind == K_INT:
        bias = <uint64_t>1 << (8 * c.width - 1)
        return u ^ bias
    return u


cdef void sizes(const col_t* c, int64_t n, int64_t* size, bint* bad) noexcept nogil:
    """Add column c's bytes to size[i] for every row."""
    cdef int64_t i, s = 0, ln = 0, extra = 1 if c.nullable else 0
    if c.kind != K_VAR32 and c.kind != K_VAR64:
        for i in range(n):
            size[i] += c.width + extra
        return
    for i in range(n):
        if is_valid(c, i):
            var_span(c, i, &s, &ln)
            if ln < 0:
                bad[0] = True
                return
            size[i] += extra + ln + count_zeros(c.values + s, ln) + 2
        else:
            size[i] += extra + 2


cdef inline uint8_t* fill_cell(const col_t* c, int64_t i, uint8_t* p) noexcept nogil:
    """Write column c's bytes of row i at p; the end of them."""
    cdef int64_t s = 0, ln = 0, k, w = c.width
    cdef const uint8_t* src
    cdef const uint8_t* z
    cdef uint64_t u
    cdef bint ok = is_valid(c, i)
    if c.nullable:
        p[0] = 1 if ok else 0
        p += 1
    if c.kind == K_VAR32 or c.kind == K_VAR64:
        if ok:
            var_span(c, i, &s, &ln)
            src = c.values + s
            while ln > 0:             # copy up to and including each 00, then escape it
                z = <const uint8_t*>memchr(src, 0, <size_t>ln)
                if z == NULL:
                    memcpy(p, src, <size_t>ln)
                    p += ln
                    break
                k = z - src + 1
                memcpy(p, src, <size_t>k)
                p[k] = 0xFF
                p += k + 1
                src += k
                ln -= k
        p[0] = 0
        p[1] = 0
        return p + 2
    if c.kind == K_DEC:
        if ok:
            src = c.values + 16 * (c.offset + i)
            for k in range(16):
                p[k] = src[15 - k]
            p[0] ^= 0x80
        else:
            memset(p, 0, 16)
        return p + 16
    u = fixed_value(c, i) if ok else 0
    u = dbsp_bswap64(u << (8 * (8 - w))) if w < 8 else dbsp_bswap64(u)
    if w == 8:
        memcpy(p, &u, 8)
    elif w == 4:
        memcpy(p, &u, 4)
    elif w == 2:
        memcpy(p, &u, 2)
    elif w == 1:
        p[0] = <uint8_t>u
    else:
        memcpy(p, &u, <size_t>w)
    return p + w


# --- column description (Python side) -----------------------------------------------------------

_SIGNED = {pa.int8(): 1, pa.int16(): 2, pa.int32(): 4, pa.int64(): 8}
_UNSIGNED = {pa.uint8(): 1, pa.uint16(): 2, pa.uint32(): 4, pa.uint64(): 8}


cdef int64_t size_rows(const col_t* cs, int64_t m, int64_t n, int64_t* o) noexcept nogil:
    """Pass 1 of an encoding: ``o[i + 1]`` = the running sum of the rows' sizes (``o`` zeroed,
    ``n + 1`` long); the total, or -1 when a column's Arrow offsets decrease."""
    cdef int64_t i, j, total = 0
    cdef bint bad = False
    for j in range(m):
        sizes(&cs[j], n, o + 1, &bad)
        if bad:
            return -1
    for i in range(n):
        total += o[i + 1]
        o[i + 1] = total
    return total


cdef void fill_rows(const col_t* cs, int64_t m, int64_t n, uint8_t* d,
                    const int64_t* o) noexcept nogil:
    """Pass 2 of an encoding: the bytes of every row at ``d + o[i]``, row by row (the output
    is written in order, once)."""
    cdef int64_t i, j
    cdef uint8_t* q
    for i in range(n):
        q = d + o[i]
        for j in range(m):
            q = fill_cell(&cs[j], i, q)


cdef tuple describe(object arr):
    """(kind, width) of a column type; TypeError for the types codes do not support."""
    t = arr.type
    if t in _SIGNED:
        return K_INT, _SIGNED[t]
    if t in _UNSIGNED:
        return K_UINT, _UNSIGNED[t]
    if pa.types.is_boolean(t):
        return K_BOOL, 1
    if pa.types.is_float64(t):
        return K_F64, 8
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return K_INT, 4
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) \
            or pa.types.is_time64(t):
        return K_INT, 8
    if pa.types.is_decimal128(t):
        return K_DEC, 16
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return K_VAR32, 0
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return K_VAR64, 0
    raise TypeError(f"column type {t} is not supported as a key")


cdef inline const uint8_t* buf_ptr(object buf):
    if buf is None:
        return NULL
    return <const uint8_t*><size_t>buf.address


cdef void check_size(object buf, int64_t need, str what) except *:
    if buf is None or buf.size < need:
        have = 0 if buf is None else buf.size
        raise ValueError(f"Arrow {what} buffer too small ({have} < {need})")


cdef col_t column(object arr, bint nullable, int64_t n) except *:
    cdef col_t c
    cdef int64_t off
    memset(&c, 0, sizeof(col_t))
    kind, width = describe(arr)
    c.kind = kind
    c.width = width
    c.nullable = nullable
    off = arr.offset
    c.offset = off
    bufs = arr.buffers()
    if arr.null_count and bufs[0] is not None:
        check_size(bufs[0], (off + n + 7) // 8, "validity")
        c.valid = buf_ptr(bufs[0])
    if kind == K_VAR32 or kind == K_VAR64:
        ow = 4 if kind == K_VAR32 else 8
        check_size(bufs[1], (off + n + 1) * ow if n else 0, "offsets")
        if n:
            c.off32 = <const int32_t*>buf_ptr(bufs[1])
            c.off64 = <const int64_t*>buf_ptr(bufs[1])
            last = c.off32[off + n] if kind == K_VAR32 else c.off64[off + n]
            first = c.off32[off] if kind == K_VAR32 else c.off64[off]
            if first < 0 or (last > 0 and (bufs[2] is None or last > bufs[2].size)):
                raise ValueError("Arrow offsets point outside the data buffer")
        c.values = buf_ptr(bufs[2]) if len(bufs) > 2 else NULL
    elif kind == K_BOOL:
        check_size(bufs[1], (off + n + 7) // 8, "values")
        c.values = buf_ptr(bufs[1])
    else:
        check_size(bufs[1], (off + n) * width, "values")
        c.values = buf_ptr(bufs[1])
    return c


def encode_var(columns, nullable):
    """Var codes (:class:`VarCodes`) of the rows of ``columns`` (pyarrow arrays, equal lengths);
    ``nullable[j]``: column j's code carries a null flag byte. Same bytes as
    ``KeyCodec.encode_reference``."""
    cols = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    nullable = list(nullable)
    if len(nullable) != len(cols):
        raise ValueError("one nullable flag per column")
    cdef int64_t n = len(cols[0]) if cols else 0, i, m = len(cols), j, total = 0
    for c in cols:
        if len(c) != n:
            raise ValueError("key columns differ in length")
    cdef col_t* cs = NULL
    cdef cnp.ndarray offs = np.zeros(n + 1, dtype=np.int64)
    cdef int64_t* o = <int64_t*>cnp.PyArray_DATA(offs)
    cdef cnp.ndarray descs = np.zeros(max(m, 1) * ((sizeof(col_t) + 7) // 8), dtype=np.int64)
    cs = <col_t*>cnp.PyArray_DATA(descs)
    for j in range(m):
        cs[j] = column(cols[j], bool(nullable[j]), n)
    cdef cnp.ndarray data
    cdef uint8_t* d
    with nogil:
        total = size_rows(cs, m, n, o)
    if total < 0:
        raise ValueError("Arrow offsets decrease")
    data = np.empty(total, dtype=np.uint8)
    d = <uint8_t*>cnp.PyArray_DATA(data)
    with nogil:
        fill_rows(cs, m, n, d, o)
    return VarCodes(offs, data)


cdef bint format_kind(const char* f, int* kind, int* width) noexcept nogil:
    """``describe`` of an Arrow C format string: (kind, width) of the types codes support,
    False for the others (the caller's path then raises naming the type)."""
    cdef int i = 2, commas = 0
    cdef char c = f[0]
    if c == 0:
        return False
    if f[1] == 0:
        if c == b'c' or c == b's' or c == b'i' or c == b'l':
            kind[0] = K_INT
            width[0] = 1 if c == b'c' else (2 if c == b's' else (4 if c == b'i' else 8))
        elif c == b'C' or c == b'S' or c == b'I' or c == b'L':
            kind[0] = K_UINT
            width[0] = 1 if c == b'C' else (2 if c == b'S' else (4 if c == b'I' else 8))
        elif c == b'b':
            kind[0] = K_BOOL
            width[0] = 1
        elif c == b'g':
            kind[0] = K_F64
            width[0] = 8
        elif c == b'u' or c == b'z':
            kind[0] = K_VAR32
            width[0] = 0
        elif c == b'U' or c == b'Z':
            kind[0] = K_VAR64
            width[0] = 0
        else:
            return False
        return True
    if c == b'd' and f[1] == b':':  # decimal "d:P,S" (128 bits) or "d:P,S,bits"
        while f[i] != 0:
            if f[i] == b',':
                commas += 1
                if commas == 2:
                    if f[i + 1] == b'1' and f[i + 2] == b'2' and f[i + 3] == b'8' \
                            and f[i + 4] == 0:
                        break
                    return False
            i += 1
        kind[0] = K_DEC
        width[0] = 16
        return True
    if c != b't' or f[2] == 0:
        return False
    cdef char k = f[1], u = f[2]
    kind[0] = K_INT
    if k == b'd':  # date32 (days) / date64 (milliseconds)
        width[0] = 4 if u == b'D' else 8
        return u == b'D' or u == b'm'
    if k == b't':  # time32 (s, ms) / time64 (us, ns)
        width[0] = 4 if (u == b's' or u == b'm') else 8
        return u == b's' or u == b'm' or u == b'u' or u == b'n'
    if k == b's' or k == b'D':  # timestamp (any zone) / duration
        width[0] = 8
        return u == b's' or u == b'm' or u == b'u' or u == b'n'
    return False


def encode_var_batch(batch, nullable):
    """:func:`encode_var` of the columns of the record batch ``batch``, read through the Arrow C
    data interface (one export of the batch: no pyarrow Array, DataType or Buffer object per
    column, which cost more than encoding a few hundred rows). None when a column's type is not
    one codes support, or is dictionary-encoded (the caller's path then raises naming it).
    ``nullable[j]``: column j's code carries a null flag byte."""
    cdef ArrowArray src
    cdef ArrowSchema ssrc
    src.release = NULL
    ssrc.release = NULL
    cdef int64_t n, i, m, j, total = 0, off
    cdef int kind = 0, width = 0
    cdef col_t* cs
    cdef ArrowArray* ch
    cdef cnp.ndarray offs, descs, data
    cdef int64_t* o
    batch._export_to_c(<uintptr_t>&src, <uintptr_t>&ssrc)
    try:
        m = src.n_children
        n = src.length
        if m == 0 or len(nullable) != m or src.dictionary != NULL:
            return None
        descs = zeros1(m * ((sizeof(col_t) + 7) // 8), cnp.NPY_INT64)
        cs = <col_t*>cnp.PyArray_DATA(descs)
        for j in range(m):
            ch = src.children[j]
            if ssrc.children[j].dictionary != NULL or ch.dictionary != NULL \
                    or not format_kind(ssrc.children[j].format, &kind, &width):
                return None
            off = ch.offset + src.offset
            cs[j].kind = kind
            cs[j].width = width
            cs[j].nullable = bool(nullable[j])
            cs[j].offset = off
            if ch.null_count != 0 and ch.n_buffers > 0 and ch.buffers[0] != NULL:
                cs[j].valid = <const uint8_t*>ch.buffers[0]
            if kind == K_VAR32 or kind == K_VAR64:
                if ch.n_buffers != 3:
                    return None
                cs[j].off32 = <const int32_t*>ch.buffers[1]
                cs[j].off64 = <const int64_t*>ch.buffers[1]
                cs[j].values = <const uint8_t*>ch.buffers[2]
            else:
                if ch.n_buffers != 2:
                    return None
                cs[j].values = <const uint8_t*>ch.buffers[1]
        offs = zeros1(n + 1, cnp.NPY_INT64)
        o = <int64_t*>cnp.PyArray_DATA(offs)
        with nogil:
            total = size_rows(cs, m, n, o)
        if total < 0:
            raise ValueError("Arrow offsets decrease")
        data = empty1(total, cnp.NPY_UINT8)
        with nogil:
            fill_rows(cs, m, n, <uint8_t*>cnp.PyArray_DATA(data), o)
    finally:
        if src.release != NULL:
            src.release(&src)
        if ssrc.release != NULL:
            ssrc.release(&ssrc)
    return VarCodes(offs, data)


import sys as _sys
if _sys.byteorder != "little":  # pragma: no cover
    raise ImportError("dbsp._native.codes reads Arrow buffers as little-endian")
