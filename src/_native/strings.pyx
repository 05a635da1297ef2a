"""String kernels on Arrow's buffers: one pass per row, no temporaries the size of the input
(native twins of the Arrow-compute paths in ``dbsp.algebra.strings``).

* ``split_part(offsets, data, valid, sep, index)`` -- for each row ``data[offsets[i] :
  offsets[i + 1]]``, the ``index``-th (0-based) piece of the row split on the literal byte string
  ``sep`` (leftmost, non-overlapping matches, as ``str.split``); returns the new offsets (int32 or
  int64 as the input's), the pieces' bytes and a uint8 mask of the rows that have such a piece.
  Two passes: locate each piece and sum the lengths, then copy the bytes with ``memcpy``.

Every loop runs without the GIL.
"""
cimport numpy as cnp
from libc.stdint cimport uint8_t, int32_t, int64_t
from libc.string cimport memcpy, memchr

import numpy as np

cnp.import_array()


cdef extern from "string.h" nogil:
    void* memmem(const void* haystack, size_t haystacklen, const void* needle, size_t needlelen)


cdef inline const uint8_t* find(const uint8_t* p, const uint8_t* end, const uint8_t* sep,
                                int64_t m) noexcept nogil:
    """The first occurrence of ``sep`` in ``[p, end)``, or NULL."""
    if end - p < m:
        return NULL
    if m == 1:
        return <const uint8_t*>memchr(p, sep[0], end - p)
    return <const uint8_t*>memmem(p, end - p, sep, m)


def split_part(offsets, data, valid, bytes sep, int64_t index):
    """See the module doc. ``offsets``: int32 or int64 (n + 1 values, absolute positions in
    ``data``); ``valid``: uint8 per row (0: null row) or None."""
    cdef int64_t[::1] off = np.ascontiguousarray(offsets, dtype=np.int64)
    cdef const uint8_t[::1] d = np.frombuffer(data, dtype=np.uint8) if data is not None \
        else np.zeros(1, np.uint8)
    cdef int64_t n = off.shape[0] - 1
    cdef const uint8_t[::1] ok
    cdef bint has_valid = valid is not None
    if has_valid:
        ok = np.ascontiguousarray(valid, dtype=np.uint8)
    cdef int64_t m = len(sep)
    if m == 0:
        raise ValueError("split_part: sep must not be empty")
    cdef const uint8_t* s = sep
    starts_a = np.empty(n, dtype=np.int64)
    lens_a = np.zeros(n, dtype=np.int64)
    has_a = np.zeros(n, dtype=np.uint8)
    cdef int64_t[::1] starts = starts_a
    cdef int64_t[::1] lens = lens_a
    cdef uint8_t[::1] has = has_a
    cdef const uint8_t* base = &d[0]
    cdef const uint8_t* p
    cdef const uint8_t* end
    cdef const uint8_t* q
    cdef int64_t i, k, total = 0
    with nogil:
        for i in range(n):
            if has_valid and not ok[i]:
                continue
            p = base + off[i]
            end = base + off[i + 1]
            k = 0
            while k < index:
                q = find(p, end, s, m)
                if q == NULL:
                    break
                p = q + m
                k += 1
            if k < index:
                continue
            q = find(p, end, s, m)
            if q == NULL:
                q = end
            has[i] = 1
            starts[i] = p - base
            lens[i] = q - p
            total += q - p
    out_off_a = np.empty(n + 1, dtype=np.int32 if total < 2**31 else np.int64)
    out_a = np.empty(max(total, 1), dtype=np.uint8)
    cdef uint8_t[::1] out = out_a
    cdef int64_t pos = 0
    cdef int32_t[::1] o32
    cdef int64_t[::1] o64
    cdef bint wide = out_off_a.dtype == np.int64
    if wide:
        o64 = out_off_a
    else:
        o32 = out_off_a
    with nogil:
        for i in range(n):
            if wide:
                o64[i] = pos
            else:
                o32[i] = <int32_t>pos
            if lens[i]:
                memcpy(&out[pos], base + starts[i], lens[i])
                pos += lens[i]
        if wide:
            o64[n] = pos
        else:
            o32[n] = <int32_t>pos
    return out_off_a, out_a[:total], has_a
