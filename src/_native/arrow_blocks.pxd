# Inline helpers for record batches of fixed-width columns through the Arrow C data interface
# (``arrow_abi.pxd``): the byte width of a column's format string, whether an exported column
# can be read as one values buffer, and one aligned block holding a whole struct array (the
# header and every column's values) that its import owns and frees in one ``release``.
#
# ``merge_pairs`` builds its merged record batches with these; ``arrow_c.pyx`` cimports the
# release callbacks, ``blk_width``, ``blk_head`` and ``blk_up64`` (its ``_struct_block`` takes
# a size its callers lay out themselves, validity buffers included, so it stays there).
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free
from libc.string cimport memset

from _native.arrow_abi cimport ArrowArray, ArrowSchema

cdef extern from "<stdlib.h>" nogil:
    void* aligned_alloc(size_t alignment, size_t size)


cdef inline void blk_release_parent(ArrowArray* a) noexcept nogil:
    free(a.private_data)  # the one block holding every struct and buffer of the batch
    a.release = NULL


cdef inline void blk_release_child(ArrowArray* a) noexcept nogil:
    a.release = NULL  # memory belongs to the parent's block


cdef inline int blk_width(const char* f) noexcept nogil:
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


cdef inline bint blk_plain(const ArrowArray* ch) noexcept nogil:
    """Whether an exported fixed-width column is one values buffer: no nulls, no dictionary,
    no children."""
    if ch.n_children != 0 or ch.n_buffers != 2 or ch.dictionary != NULL:
        return False
    return ch.null_count == 0 or (ch.null_count == -1 and ch.buffers[0] == NULL)


cdef inline size_t blk_up64(size_t x) noexcept nogil:
    return (x + 63) & ~(<size_t>63)


cdef inline size_t blk_head(Py_ssize_t kt) noexcept nogil:
    """Bytes of a struct batch's header: parent, children, child pointers, buffer tables."""
    return blk_up64(sizeof(ArrowArray) * (kt + 1) + sizeof(ArrowArray*) * kt
                    + sizeof(void*) * (1 + 2 * kt))


cdef inline uint8_t* blk_struct(Py_ssize_t kt, const int* widths, int64_t cap) noexcept nogil:
    """One 64-byte aligned block holding a struct array of ``kt`` fixed-width children (bytes
    per value ``widths``) with room for ``cap`` rows: the header zeroed and linked, each
    child's values buffer after it (no validity). Lengths are 0 until the caller sets them
    (:func:`blk_set_length`). NULL when out of memory. Released by ``blk_release_parent``."""
    cdef size_t head = blk_head(kt), size = head
    cdef Py_ssize_t c
    for c in range(kt):
        size += blk_up64(<size_t>widths[c] * <size_t>cap)
    cdef uint8_t* block = <uint8_t*>aligned_alloc(64, blk_up64(size))
    if block == NULL:
        return NULL
    memset(block, 0, head)
    cdef ArrowArray* out = <ArrowArray*>block
    cdef ArrowArray* kids = out + 1
    cdef ArrowArray** kidp = <ArrowArray**>(kids + kt)
    cdef const void** bufs = <const void**>(kidp + kt)
    cdef uint8_t* data = block + head
    out.n_buffers = 1
    out.n_children = kt
    out.buffers = bufs
    out.children = kidp
    out.release = blk_release_parent
    out.private_data = block
    for c in range(kt):
        kidp[c] = &kids[c]
        kids[c].n_buffers = 2
        kids[c].buffers = bufs + 1 + 2 * c
        kids[c].buffers[1] = data
        kids[c].release = blk_release_child
        data += blk_up64(<size_t>widths[c] * <size_t>cap)
    return block


cdef inline void blk_set_length(uint8_t* block, int64_t n) noexcept nogil:
    """Set the rows of a block's struct array and of each of its children."""
    cdef ArrowArray* out = <ArrowArray*>block
    cdef int64_t c
    out.length = n
    for c in range(out.n_children):
        out.children[c].length = n


cdef inline void blk_gather(const uint8_t* src, uint8_t* dst, int w, const int64_t* idx,
                            int64_t m) noexcept nogil:
    """``dst[i] = src[idx[i]]`` for ``m`` values of ``w`` bytes each."""
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


cdef inline uint8_t* blk_gathered(const ArrowArray* src, const int* cols, const int* ws,
                                  Py_ssize_t nc, const int64_t* idx, int64_t m) noexcept nogil:
    """A struct block (:func:`blk_struct`) of ``m`` rows whose child ``c`` is column ``cols[c]``
    of the struct array ``src`` (an exported batch, or a block of this file; fixed-width,
    ``ws[c]`` bytes a value, no nulls) gathered at the rows ``idx`` (checked by the caller).
    NULL when out of memory."""
    cdef uint8_t* block = blk_struct(nc, ws, m)
    cdef const ArrowArray* ch
    cdef Py_ssize_t c
    if block == NULL:
        return NULL
    blk_set_length(block, m)
    for c in range(nc):
        ch = src.children[cols[c]]
        blk_gather(<const uint8_t*>ch.buffers[1] + (ch.offset + src.offset) * ws[c],
                   <uint8_t*>(<ArrowArray*>block + 1 + c).buffers[1], ws[c], idx, m)
    return block


cdef inline bytes blk_schema_widths(dict cache, schema):
    """The byte width of each column of ``schema`` (1 to 64 columns, each fixed-width and not
    a dictionary), or None, read from one export of it and kept in ``cache`` (``id(schema) ->
    (schema, widths)``; the schema is kept, so its id is not reused): an operator passes the
    same schema object every step (an output's, a state's values), and a schema export costs
    some 8K instructions, more than a 100-row gather."""
    got = cache.get(id(schema))
    if got is not None and (<tuple>got)[0] is schema:
        return (<tuple>got)[1]
    cdef ArrowSchema sout
    sout.release = NULL
    cdef int64_t c, kt
    cdef bytearray ws = None
    cdef int w
    schema._export_to_c(<uintptr_t>&sout)
    try:
        kt = sout.n_children
        if 0 < kt <= 64:
            ws = bytearray(kt)
            for c in range(kt):
                w = blk_width(sout.children[c].format)
                if w == 0 or w > 255 or sout.children[c].dictionary != NULL:
                    ws = None
                    break
                ws[c] = w
    finally:
        if sout.release != NULL:
            sout.release(&sout)
    out = None if ws is None else bytes(ws)
    if len(cache) >= 256:
        cache.clear()
    cache[id(schema)] = (schema, out)
    return out
