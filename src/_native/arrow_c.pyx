"""Record batches through the Arrow C data interface: small gathers without a Python object per
column (native twin of ``take_batch`` in ``kernels_ref``).

A pyarrow object costs more to make than a hundred rows cost to move: every ``pa.Array`` built or
read (``batch.column(i)``, ``batch.columns``, ``Array.from_buffers``) wraps its ``DataType`` again
(a couple of thousand instructions each in pyarrow 26), and ``RecordBatch.from_arrays(...,
schema=)`` wraps every field. A numpy gather of each column of a small batch therefore spent
most of its time making and unmaking those wrappers, not gathering.

* ``take_batch(batch, idx)``: rows ``idx`` of ``batch`` when every column is fixed-width
  (integers, floats, dates, times, timestamps, durations) without nulls, else None. The batch is
  exported once (``_export_to_c``: no Python object per column), each column gathered from its
  values buffer into one aligned allocation, and the result imported once
  (``RecordBatch._import_from_c`` with the batch's own schema object). Row indices outside
  ``0..num_rows-1`` raise IndexError.

Ownership: the output ``ArrowArray`` and everything it points to (children, buffer tables,
values) are one allocation, freed by the parent's ``release`` (Arrow C++ imports a record batch
whole and releases only the parent; the children's ``release`` only marks them released).
Gather loops run without the GIL.
"""
cimport numpy as cnp
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free
from libc.string cimport memset

import numpy as np
import pyarrow as pa

cnp.import_array()

cdef extern from "<stdlib.h>" nogil:
    void* aligned_alloc(size_t alignment, size_t size)


cdef struct ArrowSchema:
    const char* format
    const char* name
    const char* metadata
    int64_t flags
    int64_t n_children
    ArrowSchema** children
    ArrowSchema* dictionary
    void (*release)(ArrowSchema*) noexcept nogil
    void* private_data


cdef struct ArrowArray:
    int64_t length
    int64_t null_count
    int64_t offset
    int64_t n_buffers
    int64_t n_children
    const void** buffers
    ArrowArray** children
    ArrowArray* dictionary
    void (*release)(ArrowArray*) noexcept nogil
    void* private_data


cdef void _release_parent(ArrowArray* a) noexcept nogil:
    free(a.private_data)  # the one block holding every struct and buffer of the batch
    a.release = NULL


cdef void _release_child(ArrowArray* a) noexcept nogil:
    a.release = NULL  # memory belongs to the parent's block


cdef int _width(const char* f) noexcept nogil:
    """Bytes per value of a fixed-width format string without children, else 0."""
    cdef char c = f[0]
    if c == 0:
        return 0
    if f[1] == 0:
        if c == b'c' or c == b'C':
            return 1
        if c == b's' or c == b'S' or c == b'e':
            return 2
        if c == b'i' or c == b'I' or c == b'f':
            return 4
        if c == b'l' or c == b'L' or c == b'g':
            return 8
        return 0
    if c != b't' or f[2] == 0:
        return 0
    cdef char k = f[1], u = f[2]
    if k == b'd':  # date32 (days) / date64 (milliseconds)
        return 4 if u == b'D' else (8 if u == b'm' else 0)
    if k == b't':  # time32 (s, ms) / time64 (us, ns)
        return 4 if (u == b's' or u == b'm') else (8 if (u == b'u' or u == b'n') else 0)
    if k == b's' or k == b'D':  # timestamp (with or without a zone) / duration
        return 8 if (u == b's' or u == b'm' or u == b'u' or u == b'n') else 0
    return 0


cdef inline size_t _up64(size_t x) noexcept nogil:
    return (x + 63) & ~(<size_t>63)


cdef void _gather(const uint8_t* src, uint8_t* dst, int w, const int64_t* idx,
                  int64_t m) noexcept nogil:
    cdef int64_t i
    if w == 8:
        for i in range(m):
            (<uint64_t*>dst)[i] = (<const uint64_t*>src)[idx[i]]
    elif w == 4:
        for i in range(m):
            (<uint32_t*>dst)[i] = (<const uint32_t*>src)[idx[i]]
    elif w == 2:
        for i in range(m):
            (<uint16_t*>dst)[i] = (<const uint16_t*>src)[idx[i]]
    else:
        for i in range(m):
            dst[i] = src[idx[i]]


_import_batch = pa.RecordBatch._import_from_c


def take_batch(batch, idx):
    """Rows ``idx`` (integers in ``0..num_rows-1``) of the record batch ``batch`` when every
    column is fixed-width without nulls, else None."""
    cdef cnp.ndarray ix = np.ascontiguousarray(idx, dtype=np.int64)
    cdef int64_t m = ix.shape[0], n, i, lo = 0, hi = 0
    cdef const int64_t* p = <const int64_t*>cnp.PyArray_DATA(ix)
    cdef ArrowArray src
    cdef ArrowSchema ssrc
    src.release = NULL
    ssrc.release = NULL
    batch._export_to_c(<uintptr_t>&src, <uintptr_t>&ssrc)
    cdef int64_t k = src.n_children, c
    cdef int widths[64]
    cdef ArrowArray* ch
    cdef ArrowArray* out = NULL
    cdef ArrowArray* kids
    cdef ArrowArray** kidp
    cdef const void** bufs
    cdef uint8_t* block
    cdef uint8_t* data
    cdef size_t head, size
    cdef int w
    try:
        n = src.length
        if k == 0 or k > 64 or src.dictionary != NULL:
            return None
        for c in range(k):
            ch = src.children[c]
            w = _width(ssrc.children[c].format)
            if (w == 0 or ch.n_children != 0 or ch.n_buffers != 2 or ch.dictionary != NULL
                    or ssrc.children[c].dictionary != NULL):
                return None
            if ch.null_count != 0 and not (ch.null_count == -1 and ch.buffers[0] == NULL):
                return None
            widths[c] = w
        with nogil:
            for i in range(m):
                if p[i] < 0 or p[i] >= n:
                    hi = 1
                    lo = p[i]
                    break
        if hi:
            raise IndexError(f"take: row index {lo} out of range for {n} rows")
        # one block: parent, children, child pointers, buffer tables, then each column's values
        head = _up64(sizeof(ArrowArray) * (k + 1) + sizeof(ArrowArray*) * k
                     + sizeof(void*) * (1 + 2 * k))
        size = head
        for c in range(k):
            size += _up64(<size_t>widths[c] * <size_t>m)
        block = <uint8_t*>aligned_alloc(64, size)
        if block == NULL:
            raise MemoryError()
        memset(block, 0, head)
        out = <ArrowArray*>block
        kids = out + 1
        kidp = <ArrowArray**>(kids + k)
        bufs = <const void**>(kidp + k)
        data = block + head
        out.length = m
        out.n_buffers = 1
        out.n_children = k
        out.buffers = bufs
        out.children = kidp
        out.release = _release_parent
        out.private_data = block
        with nogil:
            for c in range(k):
                ch = src.children[c]
                w = widths[c]
                kidp[c] = &kids[c]
                kids[c].length = m
                kids[c].n_buffers = 2
                kids[c].buffers = bufs + 1 + 2 * c
                kids[c].buffers[1] = data
                kids[c].release = _release_child
                _gather(<const uint8_t*>ch.buffers[1] + (ch.offset + src.offset) * w, data, w,
                        p, m)
                data += _up64(<size_t>w * <size_t>m)
    finally:
        if src.release != NULL:
            src.release(&src)
        if ssrc.release != NULL:
            ssrc.release(&ssrc)
    return _import_batch(<uintptr_t>out, batch.schema)
