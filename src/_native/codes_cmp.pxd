# Inline helpers to compare and key codes; shared by sort, merge, search and hashing.
#
# Cython modules of ``dbsp._native`` cannot call each other's cdef functions at run time, so
# everything shared lives here as ``cdef inline`` (compiled into each module that cimports it).
#
# Order of var codes: ``memcmp`` over the common length, then the shorter code first. The
# big-endian u64 of a code's first 8 bytes (zero padded) is monotone in that order, so a radix
# sort on the prefix followed by a tie-break of equal prefixes sorts var codes.
from libc.stdint cimport uint8_t, int64_t, uint64_t
from libc.string cimport memcmp, memcpy

from _native.types cimport var_t, codes_t

cdef extern from *:
    """
    static inline uint64_t dbsp_bswap64(uint64_t x) { return __builtin_bswap64(x); }
    static inline int dbsp_clz64(uint64_t x) { return x ? __builtin_clzll(x) : 64; }
    """
    uint64_t dbsp_bswap64(uint64_t x) nogil
    int dbsp_clz64(uint64_t x) nogil


cdef inline int bytes_cmp(const uint8_t* a, int64_t la, const uint8_t* b,
                          int64_t lb) noexcept nogil:
    """<0, 0, >0 as bytes a <, ==, > bytes b (memcmp, then length)."""
    cdef int64_t m = la if la < lb else lb
    cdef int c = 0
    if m > 0:
        c = memcmp(a, b, <size_t>m)
    if c != 0:
        return c
    return (la > lb) - (la < lb)


cdef inline int var_cmp(const var_t* a, int64_t i, const var_t* b, int64_t j) noexcept nogil:
    """Compare row i of a with row j of b."""
    return bytes_cmp(a.data + a.offsets[i], a.offsets[i + 1] - a.offsets[i],
                     b.data + b.offsets[j], b.offsets[j + 1] - b.offsets[j])


cdef inline bint var_eq(const var_t* a, int64_t i, const var_t* b, int64_t j) noexcept nogil:
    cdef int64_t la = a.offsets[i + 1] - a.offsets[i]
    if la != b.offsets[j + 1] - b.offsets[j]:
        return False
    return la == 0 or memcmp(a.data + a.offsets[i], b.data + b.offsets[j], <size_t>la) == 0


cdef inline int codes_cmp(const codes_t* a, int64_t i, const codes_t* b, int64_t j) noexcept nogil:
    """Compare row i of a with row j of b (both u64 or both var)."""
    cdef uint64_t x, y
    if a.u64 != NULL:
        x = a.u64[i]
        y = b.u64[j]
        return (x > y) - (x < y)
    return var_cmp(&a.var, i, &b.var, j)


cdef inline bint codes_eq(const codes_t* a, int64_t i, const codes_t* b, int64_t j) noexcept nogil:
    if a.u64 != NULL:
        return a.u64[i] == b.u64[j]
    return var_eq(&a.var, i, &b.var, j)


cdef inline uint64_t be_prefix(const uint8_t* p, int64_t n) noexcept nogil:
    """Big-endian u64 of the first min(n, 8) bytes at p, zero padded (n may be <= 0)."""
    cdef uint64_t x = 0
    cdef int64_t k
    if n >= 8:
        memcpy(&x, p, 8)
        return dbsp_bswap64(x)
    for k in range(n):
        x |= (<uint64_t>p[k]) << (56 - 8 * k)
    return x


cdef inline uint64_t var_prefix(const var_t* v, int64_t i, int64_t skip) noexcept nogil:
    """Big-endian u64 of bytes [skip, skip + 8) of row i, zero padded."""
    cdef int64_t s = v.offsets[i] + skip
    return be_prefix(v.data + s, v.offsets[i + 1] - s)


cdef inline int64_t min_head(const uint64_t** runs, const int64_t* pos, const int64_t* n,
                             int64_t W, uint64_t* head) noexcept nogil:
    """Of ``W`` sorted u64 runs, each read from ``pos[w]`` up to ``n[w]``: the run whose head
    is the smallest code (the first such run), its head in ``head[0]``; -1 when every run is
    spent. The step of the k-way merges that sum partials per key."""
    cdef int64_t w, best = -1
    cdef uint64_t k, bk = 0
    for w in range(W):
        if pos[w] < n[w]:
            k = runs[w][pos[w]]
            if best < 0 or k < bk:
                best, bk = w, k
    head[0] = bk
    return best
