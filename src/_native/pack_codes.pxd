# The u64 key codes of integer / temporal columns without nulls read from an exported record
# batch (``arrow_abi.pxd``): ``arrow_c.encode_u64``'s packing, shared with the kernels that read
# a batch's key columns from their own export (``hashing.gather_disjoint`` and
# ``hashing.deal_batch``) instead of exporting a selection of them again. The reference is
# ``KeyCodec._encode_u64``.
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from _native.arrow_abi cimport ArrowArray


cdef inline void widen(const uint8_t* base, uint64_t* out, int w, uint64_t flip,
                       int64_t n) noexcept nogil:
    """``out[i] = value i ^ flip`` for values of ``w`` bytes (the first part of a code)."""
    cdef int64_t i
    if w == 8:
        for i in range(n):
            out[i] = (<const uint64_t*>base)[i] ^ flip
    elif w == 4:
        for i in range(n):
            out[i] = (<const uint32_t*>base)[i] ^ flip
    elif w == 2:
        for i in range(n):
            out[i] = ((<const uint16_t*>base)[i] ^ flip) & 0xFFFF
    else:
        for i in range(n):
            out[i] = (base[i] ^ flip) & 0xFF


cdef inline void pack_codes(ArrowArray* src, const int* cols, list plan, uint64_t* out,
                            int64_t n):
    """The u64 codes (as ``arrow_c.encode_u64``) of the columns ``cols`` (NULL:
    ``0..len(plan)-1``) of an exported batch into ``out``, ``plan`` per column ``(byte width, signed, nullable)``.
    The caller has checked the columns: each one values buffer of its plan's width, no nulls,
    the codes within 64 bits."""
    cdef int64_t c, i
    cdef int w
    cdef bint signed, nullable, first = True  # the first part is assigned (no zero fill)
    cdef uint64_t flip
    cdef ArrowArray* ch
    cdef const uint8_t* base
    for c in range(len(plan)):
        w, signed, nullable = plan[c]
        ch = src.children[cols[c] if cols != NULL else c]
        base = <const uint8_t*>ch.buffers[1] + (ch.offset + src.offset) * w
        flip = (<uint64_t>1) << (8 * w - 1) if signed else 0
        with nogil:
            if nullable:  # the validity byte: every row is valid here
                if first:
                    for i in range(n):
                        out[i] = 1
                else:
                    for i in range(n):
                        out[i] = (out[i] << 8) | 1
                first = False
            if first or w == 8:  # (w == 8 only as the sole column of a u64 codec)
                widen(base, out, w, flip, n)
            elif w == 4:
                for i in range(n):
                    out[i] = (out[i] << 32) | ((<const uint32_t*>base)[i] ^ flip)
            elif w == 2:
                for i in range(n):
                    out[i] = (out[i] << 16) | (((<const uint16_t*>base)[i] ^ flip) & 0xFFFF)
            else:
                for i in range(n):
                    out[i] = (out[i] << 8) | ((base[i] ^ flip) & 0xFF)
            first = False
