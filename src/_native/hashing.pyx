"""Hashing codes for the exchange (native twin of ``kernels_ref.hash64`` and ``kernels_ref.shard``).

Definitions (bit-exact with the reference; every process and worker must agree):

* u64 codes: ``splitmix64(code ^ seed)`` (the splitmix64 finalizer);
* var codes: FNV-1a-64 over the bytes, starting from ``seed ^ 0xcbf29ce484222325``, then
  ``splitmix64`` of that;
* ``shard = hash64 % nshards``;
* ``merge_sum_runs``: the other side of a combiner's exchange: the sorted parts of partial sums
  that every worker sent, merged by key and summed (exactly: int64 sums checked);
* ``merge_disjoint_runs``: the order that merges the workers' sorted parts of an output whose
  keys are disjoint (the driver's gather side);
* ``owner_rows``: the rows of each worker of a shard map (shard = the hash's top ``bits`` bits,
  worker = ``owners[shard]``), grouped by worker and ascending within each, in one hashing pass
  and one scatter pass (the exchange's split by key);
* ``deal_batch``: the driver's split of an input by key: a record batch's rows themselves (and
  their weights) copied to each worker's run of one Arrow C struct block, as ``owner_rows``
  deals them (the key codes given, or packed from the batch's key columns);
* ``deal_sorted``: ``deal_batch`` for rows already sorted and consolidated by (key code,
  value code) (the driver's split of an input that ``index_by`` reads): each worker's rows
  copied in that order with their codes, so that its ``index_by`` neither sorts nor gathers;
* ``gather_disjoint``: the driver's gather of an output: the workers' sorted, key-disjoint
  parts merged by their key codes (packed from each part's export) and gathered into one
  Arrow C struct block.

The u64 hash loop is vectorized (compiled for AVX-512 and AVX2 as well as the baseline on
x86-64 Linux, picked at load time). The modulo by a run-time ``nshards`` uses a precomputed
128-bit reciprocal (Lemire's fastmod) instead of a division per row, when the compiler has
128-bit integers.

Every loop runs without the GIL from ``NOGIL_MIN`` rows on (below it, releasing the GIL costs the
threads runtime a hand-off to another worker, and waiting to take it back, worth more than the
loop).
"""
cimport numpy as cnp
from libc.stdint cimport (uint8_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t, uintptr_t,
                          INT64_MIN, INT64_MAX)
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memset

from _native.arrow_abi cimport ArrowArray, ArrowSchema
from _native.pack_codes cimport pack_codes
from _native.arrow_blocks cimport (blk_gathered, blk_plain, blk_schema_widths, blk_set_length,
                                   blk_struct, blk_width)

from _native.types cimport codes_t
from _native.views cimport as_codes, codes_view
from _native.codes_cmp cimport min_head

import numpy as np
import pyarrow as pa

cnp.import_array()

_import_batch = pa.RecordBatch._import_from_c

cdef extern from *:
    """
    #include <stdint.h>
    #if defined(__SIZEOF_INT128__)
    #define DBSP_HAVE_U128 1
    /* Lemire, Kaser, Kurz, "Faster remainder by direct computation" (2019), 64-bit variant:
       M = ceil(2^128 / d); x % d = ((M * x mod 2^128) * d) >> 128. Exact for every 64-bit x and
       every d >= 1. */
    static inline void dbsp_fastmod_init(uint64_t d, uint64_t* mlo, uint64_t* mhi) {
        __uint128_t m = ((__uint128_t)0 - 1) / d + 1;   /* wraps to 0 for d == 1: x % 1 == 0 */
        *mlo = (uint64_t)m;
        *mhi = (uint64_t)(m >> 64);
    }
    static inline uint64_t dbsp_fastmod(uint64_t x, uint64_t mlo, uint64_t mhi, uint64_t d) {
        __uint128_t m = ((__uint128_t)mhi << 64) | mlo;
        __uint128_t low = m * x;                      /* mod 2^128 */
        /* (low * d) >> 128 with low = lh * 2^64 + ll */
        uint64_t ll = (uint64_t)low, lh = (uint64_t)(low >> 64);
        __uint128_t t = (__uint128_t)ll * d;
        __uint128_t u = (__uint128_t)lh * d + (t >> 64);
        return (uint64_t)(u >> 64);
    }
    #else
    #define DBSP_HAVE_U128 0
    static inline void dbsp_fastmod_init(uint64_t d, uint64_t* mlo, uint64_t* mhi) {
        *mlo = *mhi = 0;
    }
    static inline uint64_t dbsp_fastmod(uint64_t x, uint64_t mlo, uint64_t mhi, uint64_t d) {
        return x % d;
    }
    #endif

    /* splitmix64(code ^ seed) over an array. A plain loop the compiler vectorizes; on x86-64
       Linux it is also compiled for AVX2 and AVX-512 (64-bit vector multiplies) and the best
       clone is picked at load time, so the wheel stays portable. */
    #if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
    __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
    #endif
    static void dbsp_splitmix_block(const uint64_t* codes, uint64_t* out, int64_t n,
                                    uint64_t seed) {
        for (int64_t i = 0; i < n; i++) {
            uint64_t x = codes[i] ^ seed;
            x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
            x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
            out[i] = x ^ (x >> 31);
        }
    }

    /* Two workers' rows of K (2..4) columns of 8-byte values, copied a row at a time: value c
       of row i goes to a[c][p0] and b[c][p1] and only the row's worker's cursor moves (no
       branch on the random worker; each destination has one slot more than its rows). K is a
       constant in each copy, so the column pointers stay in registers. */
    #define DBSP_DEAL_ROWS(K)                                                               \
    static void dbsp_deal_rows##K(const uint8_t* dest, int64_t n,                            \
                                  const uint64_t* const* s, uint64_t* const* a,              \
                                  uint64_t* const* b) {                                      \
        const uint64_t* sv[K]; uint64_t* av[K]; uint64_t* bv[K];                             \
        for (int c = 0; c < K; c++) { sv[c] = s[c]; av[c] = a[c]; bv[c] = b[c]; }            \
        int64_t p0 = 0, p1 = 0;                                                              \
        for (int64_t i = 0; i < n; i++) {                                                    \
            int64_t d = dest[i];                                                             \
            for (int c = 0; c < K; c++) {                                                    \
                uint64_t v = sv[c][i];                                                       \
                av[c][p0] = v;                                                               \
                bv[c][p1] = v;                                                               \
            }                                                                                \
            p1 += d;                                                                         \
            p0 += 1 - d;                                                                     \
        }                                                                                    \
    }
    DBSP_DEAL_ROWS(1)
    DBSP_DEAL_ROWS(2)
    DBSP_DEAL_ROWS(3)
    DBSP_DEAL_ROWS(4)
    static void dbsp_deal_rows(const uint8_t* dest, int64_t n, int64_t k,
                               const uint64_t* const* s, uint64_t* const* a,
                               uint64_t* const* b) {
        switch (k) {
        case 1: dbsp_deal_rows1(dest, n, s, a, b); break;
        case 2: dbsp_deal_rows2(dest, n, s, a, b); break;
        case 3: dbsp_deal_rows3(dest, n, s, a, b); break;
        default: dbsp_deal_rows4(dest, n, s, a, b); break;
        }
    }
    """
    int DBSP_HAVE_U128
    void dbsp_deal_rows(const uint8_t* dest, int64_t n, int64_t k, const uint64_t** s,
                        uint64_t** a, uint64_t** b) nogil
    void dbsp_splitmix_block(const uint64_t* codes, uint64_t* out, int64_t n, uint64_t seed) nogil
    void dbsp_fastmod_init(uint64_t d, uint64_t* mlo, uint64_t* mhi) nogil
    uint64_t dbsp_fastmod(uint64_t x, uint64_t mlo, uint64_t mhi, uint64_t d) nogil


cdef extern from *:
    """
    typedef __int128 dbsp_i128;   /* exact sums of int64 partials */
    """
    ctypedef long long dbsp_i128


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    """The splitmix64 finalizer."""
    x = (x ^ (x >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * <uint64_t>0x94D049BB133111EB
    return x ^ (x >> 31)


cdef inline uint64_t fnv1a(const uint8_t* p, int64_t n, uint64_t h) noexcept nogil:
    cdef int64_t i
    for i in range(n):
        h = (h ^ p[i]) * <uint64_t>0x100000001B3
    return h


cdef inline uint64_t hash_row(const codes_t* c, int64_t i, uint64_t seed) noexcept nogil:
    if c.u64 != NULL:
        return mix64(c.u64[i] ^ seed)
    return mix64(fnv1a(c.var.data + c.var.offsets[i], c.var.offsets[i + 1] - c.var.offsets[i],
                       seed ^ <uint64_t>0xCBF29CE484222325))


cdef enum:
    BLOCK = 2048       # rows hashed at a time before the modulo pass over them (stays in L1)


cdef enum:
    #: rows below which a kernel keeps the GIL: a release is a hand-off to a thread waiting for
    #: it (the threads runtime's other workers), and taking it back waits for that thread's
    #: next release or its switch interval (5 ms): dearer than hashing a few thousand rows
    NOGIL_MIN = 1 << 14


cdef void hash_codes(const codes_t* c, uint64_t seed, uint64_t* out) noexcept nogil:
    cdef int64_t i
    if c.u64 != NULL:
        dbsp_splitmix_block(c.u64, out, c.n, seed)
        return
    for i in range(c.n):
        out[i] = hash_row(c, i, seed)


cdef void shard_codes(const codes_t* c, uint64_t seed, uint64_t d, uint64_t* out) noexcept nogil:
    """out[i] = hash(row i) % d: hash a block, then reduce it while it is in L1."""
    cdef int64_t i, lo, hi, n = c.n
    cdef uint64_t mask = d - 1, mlo = 0, mhi = 0
    cdef bint pow2 = d & mask == 0
    if not pow2 and DBSP_HAVE_U128:
        dbsp_fastmod_init(d, &mlo, &mhi)
    lo = 0
    while lo < n:
        hi = lo + BLOCK if lo + BLOCK < n else n
        if c.u64 != NULL:
            dbsp_splitmix_block(c.u64 + lo, out + lo, hi - lo, seed)
        else:
            for i in range(lo, hi):
                out[i] = hash_row(c, i, seed)
        if pow2:
            for i in range(lo, hi):
                out[i] = out[i] & mask
        elif DBSP_HAVE_U128:
            for i in range(lo, hi):
                out[i] = dbsp_fastmod(out[i], mlo, mhi, d)
        else:
            for i in range(lo, hi):
                out[i] = out[i] % d
        lo = hi


cdef uint64_t as_seed(object seed) except? 0:
    return <uint64_t>(int(seed) & 0xFFFFFFFFFFFFFFFF)


def hash64(codes, seed=0):
    """64-bit hash (uint64) of each code; equal codes hash equally in every process."""
    co = as_codes(codes)
    cdef codes_t c = codes_view(co)
    cdef uint64_t s = as_seed(seed)
    cdef cnp.ndarray out = np.empty(c.n, dtype=np.uint64)
    cdef uint64_t* o = <uint64_t*>cnp.PyArray_DATA(out)
    if c.n >= NOGIL_MIN:
        with nogil:
            hash_codes(&c, s, o)
    else:
        hash_codes(&c, s, o)
    return out


def shard(codes, nshards, seed=0):
    """Shard of each code in ``0..nshards-1`` (int64): ``hash64(codes, seed) % nshards``."""
    if nshards < 1:
        raise ValueError("nshards must be >= 1")
    co = as_codes(codes)
    cdef codes_t c = codes_view(co)
    cdef uint64_t s = as_seed(seed)
    cdef uint64_t d = <uint64_t>int(nshards)
    cdef cnp.ndarray out = np.empty(c.n, dtype=np.int64)
    cdef uint64_t* o = <uint64_t*>cnp.PyArray_DATA(out)
    if c.n >= NOGIL_MIN:
        with nogil:
            shard_codes(&c, s, d, o)
    else:
        shard_codes(&c, s, d, o)
    return out


ctypedef fused dest_t:
    uint8_t
    int32_t


cdef void owner_dest(const codes_t* c, const int32_t* owners, int bits, dest_t* dest,
                     int64_t* counts) noexcept nogil:
    """dest[i] = owners[hash(row i) >> (64 - bits)] (owners[0] when bits == 0), counting rows
    per worker (``owners``: checked to be workers already)."""
    cdef int64_t i, lo, hi, n = c.n, c1 = 0
    cdef dest_t d
    cdef uint64_t tmp[BLOCK]
    cdef int shift = 64 - bits
    if bits == 0:
        for i in range(n):
            dest[i] = <dest_t>owners[0]
        counts[owners[0]] += n
        return
    lo = 0
    while lo < n:
        hi = lo + BLOCK if lo + BLOCK < n else n
        if c.u64 != NULL:
            dbsp_splitmix_block(c.u64 + lo, tmp, hi - lo, 0)
        else:
            for i in range(lo, hi):
                tmp[i - lo] = hash_row(c, i, 0)
        if dest_t is uint8_t:
            for i in range(lo, hi):
                d = <dest_t>owners[tmp[i - lo] >> shift]
                dest[i] = d
                c1 += d   # rows of worker 1 (uint8: two workers)
        else:
            for i in range(lo, hi):
                d = <dest_t>owners[tmp[i - lo] >> shift]
                dest[i] = d
                counts[d] += 1
        lo = hi
    if dest_t is uint8_t:  # (two workers)
        counts[0] += n - c1
        counts[1] += c1


cdef void scatter_rows(const dest_t* dest, int64_t n, int64_t workers, int64_t* pos,
                       int64_t* o) noexcept nogil:
    """o[pos[dest[i]]++] = i for every row in order (``pos``: each worker's first slot). Two
    workers: two cursors in registers and no branch on the (random) worker of a row."""
    cdef int64_t i, p0, p1, d, p
    if workers == 2:
        p0, p1 = pos[0], pos[1]
        for i in range(n):
            d = dest[i]
            o[p0 ^ ((p0 ^ p1) & -d)] = i   # p1 if d else p0, without a branch
            p1 += d
            p0 += 1 - d
        return
    for i in range(n):
        d = dest[i]
        p = pos[d]   # (read once: the store to o might alias pos for the compiler)
        o[p] = i
        pos[d] = p + 1


cdef cnp.ndarray _owner_map(owners, int bits, int64_t workers, str who):
    """``owners`` as a contiguous int32 array, refused (ValueError naming ``who``, the caller)
    unless it has ``2 ** bits`` entries, each a worker in ``0..workers-1``."""
    cdef cnp.ndarray own = np.ascontiguousarray(owners, dtype=np.int32)
    if bits < 0 or bits > 63 or len(own) != (<int64_t>1 << bits):
        raise ValueError(f"{who}: {len(own)} owners for {bits} bits")
    if workers < 1:
        raise ValueError(f"{who}: workers must be >= 1")
    cdef const int32_t* op = <const int32_t*>cnp.PyArray_DATA(own)
    cdef int64_t i
    for i in range(len(own)):
        if op[i] < 0 or op[i] >= workers:
            raise ValueError(f"{who}: owner {op[i]} of shard {i} is not a worker in "
                             f"0..{workers - 1}")
    return own


def owner_rows(codes, owners, int bits, int64_t workers):
    """``(order, bounds)`` (int64): ``order[bounds[w]:bounds[w + 1]]`` are the rows (ascending)
    whose code belongs to worker ``w`` of the shard map ``owners`` (int32, ``2 ** bits``
    entries): ``owners[hash64(code) >> (64 - bits)]`` (``owners[0]`` when ``bits`` is 0).
    An owner outside ``0..workers-1`` is refused (ValueError) whether or not a row maps to
    it. The GIL is released only for :data:`NOGIL_MIN` rows or more."""
    co = as_codes(codes)
    cdef codes_t c = codes_view(co)
    cdef cnp.ndarray own = _owner_map(owners, bits, workers, "owner_rows")
    cdef const int32_t* op = <const int32_t*>cnp.PyArray_DATA(own)
    cdef int64_t n = c.n, i, w
    cdef cnp.ndarray order = np.empty(n, dtype=np.int64)
    cdef cnp.ndarray bounds = np.zeros(workers + 1, dtype=np.int64)
    cdef int64_t* o = <int64_t*>cnp.PyArray_DATA(order)
    cdef int64_t* b = <int64_t*>cnp.PyArray_DATA(bounds)
    cdef void* dest = NULL
    cdef int64_t* pos = NULL
    cdef bint small = workers <= 2
    if n == 0:
        return order, bounds
    if workers == 1:
        for i in range(n):
            o[i] = i
        b[1] = n
        return order, bounds
    dest = malloc(n * (sizeof(uint8_t) if small else sizeof(int32_t)))
    pos = <int64_t*>calloc(workers, sizeof(int64_t))
    if dest == NULL or pos == NULL:
        free(dest)
        free(pos)
        raise MemoryError()
    if n >= NOGIL_MIN:
        with nogil:
            _owner_rows(&c, op, bits, workers, small, dest, pos, b, o)
    else:
        _owner_rows(&c, op, bits, workers, small, dest, pos, b, o)
    free(dest)
    free(pos)
    return order, bounds


cdef void _owner_rows(const codes_t* c, const int32_t* op, int bits, int64_t workers,
                      bint small, void* dest, int64_t* pos, int64_t* b,
                      int64_t* o) noexcept nogil:
    cdef int64_t w, n = c.n
    if small:
        owner_dest(c, op, bits, <uint8_t*>dest, pos)
    else:
        owner_dest(c, op, bits, <int32_t*>dest, pos)
    for w in range(workers):  # counts -> start of each worker's run
        b[w + 1] = b[w] + pos[w]
        pos[w] = b[w]
    if small:
        scatter_rows(<const uint8_t*>dest, n, workers, pos, o)
    else:
        scatter_rows(<const int32_t*>dest, n, workers, pos, o)


def owner_key_rows(kcodes, offsets, owners, int bits, int64_t workers, vcodes, weights):
    """:func:`owner_rows` of an indexed batch's keys, with the value rows that go with them:
    ``(korder, kbounds, rorder, rbounds, offs, vout, wout)``. Worker ``w`` gets keys
    ``korder[kbounds[w]:kbounds[w + 1]]`` (ascending, as :func:`owner_rows` deals ``kcodes``),
    their value rows ``rorder[rbounds[w]:rbounds[w + 1]]`` (key ``g``'s rows
    ``offsets[g]:offsets[g + 1]``, key after key) and their offsets within those rows
    ``offs[kbounds[w] + w:kbounds[w + 1] + w + 1]`` (from 0). ``weights`` (int64) and
    ``vcodes``, one per value row, are gathered in ``rorder``'s order into ``wout`` and
    ``vout`` (``vout`` None when ``vcodes`` are not u64 codes: the caller takes them).
    ``offsets``: non-decreasing, one more than the keys, from 0 (ValueError otherwise).

    One pass over the keys and one over their rows (a key's rows copied as a range), where
    selecting each worker's keys from the batch costs a dozen numpy passes (offsets of the keys,
    their counts, a cumulative sum, the row ranges, a gather of each per-row array)."""
    cdef tuple ko = owner_rows(kcodes, owners, bits, workers)
    cdef cnp.ndarray korder = ko[0], kbounds = ko[1]
    cdef cnp.ndarray off = np.ascontiguousarray(offsets, dtype=np.int64)
    cdef int64_t nk = korder.shape[0], w, j, g, r, r0, r1, q = 0, at
    if off.ndim != 1 or off.shape[0] != nk + 1:
        raise ValueError(f"owner_key_rows: {off.shape[0]} offsets for {nk} keys")
    cdef const int64_t* po = <const int64_t*>cnp.PyArray_DATA(off)
    for g in range(nk):
        if po[g + 1] < po[g]:
            raise ValueError(f"owner_key_rows: offsets fall at key {g}")
    if po[0] != 0:
        raise ValueError("owner_key_rows: offsets do not start at 0")
    cdef int64_t n = po[nk]
    cdef cnp.ndarray va = None, vout = None
    cdef cnp.ndarray wa = np.ascontiguousarray(weights, dtype=np.int64)
    if wa.ndim != 1 or wa.shape[0] != n:
        raise ValueError(f"owner_key_rows: {wa.shape[0]} weights for {n} rows")
    cdef cnp.ndarray wout = np.empty(n, dtype=np.int64)
    cdef const int64_t* pw = <const int64_t*>cnp.PyArray_DATA(wa)
    cdef int64_t* qw = <int64_t*>cnp.PyArray_DATA(wout)
    cdef const uint64_t* pv = NULL
    cdef uint64_t* qv = NULL
    if type(vcodes) is np.ndarray and vcodes.dtype == np.uint64 and vcodes.ndim == 1:
        if vcodes.shape[0] != n:
            raise ValueError(f"owner_key_rows: {vcodes.shape[0]} value codes for {n} rows")
        va = np.ascontiguousarray(vcodes)
        pv = <const uint64_t*>cnp.PyArray_DATA(va)
        vout = np.empty(n, dtype=np.uint64)
        qv = <uint64_t*>cnp.PyArray_DATA(vout)
    cdef cnp.ndarray rorder = np.empty(n, dtype=np.int64)
    cdef cnp.ndarray rbounds = np.zeros(workers + 1, dtype=np.int64)
    cdef cnp.ndarray offs = np.empty(nk + workers, dtype=np.int64)
    cdef const int64_t* pk = <const int64_t*>cnp.PyArray_DATA(korder)
    cdef const int64_t* kb = <const int64_t*>cnp.PyArray_DATA(kbounds)
    cdef int64_t* pr = <int64_t*>cnp.PyArray_DATA(rorder)
    cdef int64_t* rb = <int64_t*>cnp.PyArray_DATA(rbounds)
    cdef int64_t* pf = <int64_t*>cnp.PyArray_DATA(offs)
    with nogil:
        for w in range(workers):
            at = kb[w] + w
            pf[at] = 0
            r0 = q
            for j in range(kb[w], kb[w + 1]):
                g = pk[j]
                r = po[g]
                r1 = po[g + 1]
                if qv != NULL:  # (a key holds a row or two: a loop, not a memcpy a key)
                    while r < r1:
                        pr[q] = r
                        qv[q] = pv[r]
                        qw[q] = pw[r]
                        q += 1
                        r += 1
                else:
                    while r < r1:
                        pr[q] = r
                        qw[q] = pw[r]
                        q += 1
                        r += 1
                at += 1
                pf[at] = q - r0
            rb[w + 1] = q
    return korder, kbounds, rorder, rbounds, offs, vout, wout


ctypedef fused val_t:
    uint8_t
    uint16_t
    uint32_t
    uint64_t


cdef void scatter_vals(const dest_t* dest, int64_t n, int64_t workers, const val_t* src,
                       val_t** dst) noexcept nogil:
    """``dst[dest[i]]`` gets ``src[i]``, every worker's values in row order. Two workers: each
    value is stored at both cursors and only its worker's cursor moves (no branch on the
    random worker of a row; each destination has room for one value more than its rows)."""
    cdef int64_t i, p0 = 0, p1 = 0, d
    cdef val_t v
    cdef val_t* d0
    cdef val_t* d1
    cdef val_t* q
    if workers == 2:
        d0, d1 = dst[0], dst[1]
        for i in range(n):
            d = dest[i]
            v = src[i]
            d0[p0] = v
            d1[p1] = v
            p1 += d
            p0 += 1 - d
        return
    for i in range(n):
        d = dest[i]
        q = dst[d]   # (read once: the store might alias the cursor for the compiler)
        q[0] = src[i]
        dst[d] = q + 1


cdef void scatter_col(const void* dest, bint small, int64_t n, int64_t workers,
                      const uint8_t* src, int width, void** dst) noexcept nogil:
    """:func:`scatter_vals` of one column of ``width`` bytes a value (``small``: ``dest`` is
    uint8, two workers; else int32). ``dst`` is moved."""
    if width == 8:
        if small:
            scatter_vals(<const uint8_t*>dest, n, workers, <const uint64_t*>src, <uint64_t**>dst)
        else:
            scatter_vals(<const int32_t*>dest, n, workers, <const uint64_t*>src, <uint64_t**>dst)
    elif width == 4:
        if small:
            scatter_vals(<const uint8_t*>dest, n, workers, <const uint32_t*>src, <uint32_t**>dst)
        else:
            scatter_vals(<const int32_t*>dest, n, workers, <const uint32_t*>src, <uint32_t**>dst)
    elif width == 2:
        if small:
            scatter_vals(<const uint8_t*>dest, n, workers, <const uint16_t*>src, <uint16_t**>dst)
        else:
            scatter_vals(<const int32_t*>dest, n, workers, <const uint16_t*>src, <uint16_t**>dst)
    else:
        if small:
            scatter_vals(<const uint8_t*>dest, n, workers, src, <uint8_t**>dst)
        else:
            scatter_vals(<const int32_t*>dest, n, workers, src, <uint8_t**>dst)


cdef void _deal_dest(const codes_t* c, const int32_t* op, int bits, bint small, void* dest,
                     int64_t* counts) noexcept nogil:
    if small:
        owner_dest(c, op, bits, <uint8_t*>dest, counts)
    else:
        owner_dest(c, op, bits, <int32_t*>dest, counts)


cdef void _deal_scatter(const void* dest, bint small, int64_t n, int64_t workers,
                        const ArrowArray* src, const int* widths, uint8_t* block,
                        int64_t* wout, const int64_t* weights, const int64_t* start,
                        const int64_t* counts, void** dst) noexcept nogil:
    """The copies of :func:`deal_batch`: each column of ``src`` into its child of ``block``
    and the weights into ``wout``, worker ``w``'s rows from row ``start[w]`` on, followed by
    one slot that the two-worker copy writes over and that is zeroed at the end (``dst``:
    scratch of ``workers`` pointers). Two workers and at most three columns of 8 bytes (and
    the weights): all of a row's values at once (:c:func:`dbsp_deal_rows`), else a pass a
    column."""
    cdef int64_t w, col, k = src.n_children
    cdef const ArrowArray* ch
    cdef const uint8_t* sp[65]
    cdef uint8_t* bp[65]
    cdef uint64_t* d0[4]
    cdef uint64_t* d1[4]
    cdef bint rows8 = small and k + 1 <= 4
    for col in range(k + 1):
        if col < k:
            ch = src.children[col]
            sp[col] = <const uint8_t*>ch.buffers[1] + (ch.offset + src.offset) * widths[col]
            bp[col] = <uint8_t*>(<ArrowArray*>block + 1 + col).buffers[1]
        else:
            sp[col] = <const uint8_t*>weights
            bp[col] = <uint8_t*>wout
        rows8 = rows8 and widths[col] == 8
    if rows8:
        for col in range(k + 1):
            d0[col] = <uint64_t*>bp[col] + start[0]
            d1[col] = <uint64_t*>bp[col] + start[1]
        dbsp_deal_rows(<const uint8_t*>dest, n, k + 1, <const uint64_t**>sp, d0, d1)
    else:
        for col in range(k + 1):
            for w in range(workers):
                dst[w] = bp[col] + start[w] * widths[col]
            scatter_col(dest, small, n, workers, sp[col], widths[col], dst)
    for col in range(k + 1):
        for w in range(workers):   # (no garbage between the runs)
            memset(bp[col] + (start[w] + counts[w]) * widths[col], 0, widths[col])


cdef int64_t _plain_widths(const ArrowArray* src, const ArrowSchema* ssrc,
                           int* widths) noexcept:
    """The columns of an exported record batch: their count (1 to 64), each one's bytes a value
    into ``widths``; 0 when one is not fixed-width without nulls (or there are none, or more
    than 64): such a batch is not dealt by copying values."""
    cdef int64_t col, k = src.n_children
    if k < 1 or k > 64 or src.dictionary != NULL:
        return 0
    for col in range(k):
        widths[col] = blk_width(ssrc.children[col].format)
        if widths[col] == 0 or ssrc.children[col].dictionary != NULL \
                or not blk_plain(src.children[col]):
            return 0
    return k


cdef void _release(ArrowArray* src, ArrowSchema* ssrc) noexcept:
    """Release an export (what of it is not released yet)."""
    if src.release != NULL:
        src.release(src)
    if ssrc.release != NULL:
        ssrc.release(ssrc)


cdef list _import_runs(uintptr_t block, schema, tuple arrays, const int64_t* start,
                       const int64_t* counts, int64_t workers):
    """The struct block at ``block`` (every worker's run of rows, worker ``w``'s from row
    ``start[w]``, ``counts[w]`` rows) imported (the import owns it), and per worker ``(its
    record batch, its run of each of ``arrays``)``, or None for a worker without rows."""
    dealt = _import_batch(block, schema)
    cdef int64_t w
    return [(dealt.slice(start[w], counts[w]),)
            + tuple(a[start[w]:start[w] + counts[w]] for a in arrays)
            if counts[w] else None for w in range(workers)]


cdef list _key_layer(const uint8_t* block, const int* kcols, const int* widths, int64_t nk,
                     const uint64_t* kout, const int64_t* start, const int64_t* counts,
                     int64_t workers, int64_t m, key_schema):
    """Per worker ``(key batch, distinct key codes, offsets)`` of its run of the dealt rows in
    ``block`` (a struct block of ``m`` rows whose key codes are ``kout``), as
    :func:`deal_sorted` documents; ``()`` for a worker without rows."""
    cdef int64_t g, w, c
    cdef int kw[8]
    cdef cnp.ndarray kdist = np.empty(max(m, 1), dtype=np.uint64)
    cdef cnp.ndarray kfirst = np.empty(max(m, 1), dtype=np.int64)
    cdef cnp.ndarray offs = np.empty(m + workers, dtype=np.int64)
    cdef int64_t* kstart = <int64_t*>malloc(2 * workers * sizeof(int64_t))
    cdef int64_t* kcount
    cdef uint8_t* kblock = NULL
    if kstart == NULL:
        raise MemoryError()
    kcount = kstart + workers
    try:
        g = _key_groups(kout, start, counts, workers, <uint64_t*>cnp.PyArray_DATA(kdist),
                        <int64_t*>cnp.PyArray_DATA(kfirst), <int64_t*>cnp.PyArray_DATA(offs),
                        kstart, kcount)
        for c in range(nk):
            kw[c] = widths[kcols[c]]
        kblock = blk_gathered(<const ArrowArray*>block, kcols, kw, nk,
                              <const int64_t*>cnp.PyArray_DATA(kfirst), g)
        if kblock == NULL:
            raise MemoryError()
        b = <uintptr_t>kblock
        kblock = NULL   # the import owns it
        keys = _import_batch(b, key_schema)
        return [(keys.slice(kstart[w], kcount[w]), kdist[kstart[w]:kstart[w] + kcount[w]],
                 offs[kstart[w] + w:kstart[w] + w + kcount[w] + 1]) if counts[w] else ()
                for w in range(workers)]
    finally:
        free(kblock)
        free(kstart)


def deal_batch(batch, codes, weights, owners, int bits, int64_t workers, list key_cols=None,
               list plan=None):
    """The rows of the record batch ``batch`` and their ``weights`` (int64) dealt to the
    workers of a shard map as :func:`owner_rows` deals ``codes`` (each row's key code): a list
    of ``workers`` items, each ``(record batch, weights)`` of that worker's rows in their order
    in ``batch``, or None for a worker without rows. None (nothing dealt) when a column of
    ``batch`` is not fixed-width without nulls: the caller's path is then :func:`owner_rows`
    and a take (with the codes too: no point asking again).

    ``codes`` None: the key codes are packed here from the columns ``key_cols`` of ``batch``'s
    export by ``plan`` (``(byte width, signed, nullable)`` per key column, as
    ``KeyCodec._native_plan``: ``arrow_c.encode_u64``'s codes, without selecting and
    exporting the key columns again); False (the columns could be copied, the codes not
    packed: ask again with the codes) when a key column is not of its plan's width or the
    plan is not a u64 code.

    One hashing pass writes each row's worker, then one pass a column (and one for the
    weights) copies each value to the end of its worker's run, in one Arrow C struct block
    holding every worker's run (and a zeroed slot after each) that one import owns; each
    worker's batch and weights are slices of it: no permutation of the rows, no gather
    through it, no Python object a column. The GIL is released only for :data:`NOGIL_MIN`
    rows or more."""
    cdef codes_t c
    cdef int64_t nk = 0, kbytes = 0, col
    cdef int kcols[8]
    if codes is not None:
        co = as_codes(codes)
        c = codes_view(co)
    else:
        if key_cols is None or plan is None or not 0 < len(plan) == len(key_cols) <= 8:
            raise ValueError("deal_batch: no codes, and no key columns and plan to make them")
        nk = len(plan)
        for col in range(nk):
            kcols[col] = key_cols[col]
            if kcols[col] < 0 or kcols[col] >= batch.num_columns:
                raise ValueError(f"deal_batch: no key column {kcols[col]}")
        c.u64 = NULL
        c.n = batch.num_rows
    cdef cnp.ndarray own = _owner_map(owners, bits, workers, "deal_batch")
    cdef cnp.ndarray wa = np.ascontiguousarray(weights, dtype=np.int64)
    cdef const int32_t* op = <const int32_t*>cnp.PyArray_DATA(own)
    cdef int64_t n = c.n, w, k, total = 0
    if batch.num_rows != n or wa.ndim != 1 or wa.shape[0] != n:
        raise ValueError(f"deal_batch: {batch.num_rows} rows, {n} codes, {len(wa)} weights")
    cdef ArrowArray src
    cdef ArrowSchema ssrc
    src.release = NULL
    ssrc.release = NULL
    cdef int widths[65]
    cdef void* dest = NULL
    cdef int64_t* counts = NULL
    cdef int64_t* start = NULL
    cdef void** dst = NULL
    cdef uint8_t* block = NULL
    cdef cnp.ndarray wout
    cdef const int64_t* wp = <const int64_t*>cnp.PyArray_DATA(wa)
    cdef bint small = workers == 2
    schema = batch.schema
    batch._export_to_c(<uintptr_t>&src, <uintptr_t>&ssrc)
    try:
        k = _plain_widths(&src, &ssrc, widths)
        if k == 0:
            return None
        widths[k] = 8   # (the weights)
        ssrc.release(&ssrc)
        if nk:   # the key codes from the export
            for col in range(nk):
                if plan[col][0] != widths[kcols[col]]:
                    return False
                kbytes += widths[kcols[col]] + (1 if plan[col][2] else 0)
            if kbytes > 8:
                return False
            co = np.empty(n, dtype=np.uint64)
            pack_codes(&src, kcols, plan, <uint64_t*>cnp.PyArray_DATA(<cnp.ndarray>co), n)
            c.u64 = <const uint64_t*>cnp.PyArray_DATA(<cnp.ndarray>co)
        dest = malloc(max(n, 1) * (sizeof(uint8_t) if small else sizeof(int32_t)))
        counts = <int64_t*>calloc(workers, sizeof(int64_t))
        start = <int64_t*>calloc(workers, sizeof(int64_t))
        dst = <void**>calloc(workers, sizeof(void*))
        if dest == NULL or counts == NULL or start == NULL or dst == NULL:
            raise MemoryError()
        if n >= NOGIL_MIN:
            with nogil:
                _deal_dest(&c, op, bits, small, dest, counts)
        else:
            _deal_dest(&c, op, bits, small, dest, counts)
        for w in range(workers):
            start[w] = total
            total += counts[w] + 1
        block = blk_struct(k, widths, total)
        if block == NULL:
            raise MemoryError()
        blk_set_length(block, total)
        wout = np.empty(total, dtype=np.int64)
        if n >= NOGIL_MIN:
            with nogil:
                _deal_scatter(dest, small, n, workers, &src, widths, block,
                              <int64_t*>cnp.PyArray_DATA(wout), wp, start, counts, dst)
        else:
            _deal_scatter(dest, small, n, workers, &src, widths, block,
                          <int64_t*>cnp.PyArray_DATA(wout), wp, start, counts, dst)
        src.release(&src)
        b = <uintptr_t>block
        block = NULL   # the import owns it (and releases it if the import fails)
        return _import_runs(b, schema, (wout,), start, counts, workers)
    finally:
        _release(&src, &ssrc)
        free(block)
        free(dest)
        free(counts)
        free(start)
        free(dst)

ctypedef fused gval_t:
    uint8_t
    uint16_t
    uint32_t
    uint64_t


cdef void place(const gval_t* src, const int64_t* at, int64_t n, gval_t* out) noexcept nogil:
    """``out[at[i]] = src[i]``: the source read in order, the stores scattered (a store does
    not stall as a load that misses does)."""
    cdef int64_t i
    for i in range(n):
        out[at[i]] = src[i]


cdef void place_col(const uint8_t* src, int width, const int64_t* at, int64_t n,
                    uint8_t* out) noexcept nogil:
    """:func:`place` of a column of ``width`` bytes a value."""
    if width == 8:
        place(<const uint64_t*>src, at, n, <uint64_t*>out)
    elif width == 4:
        place(<const uint32_t*>src, at, n, <uint32_t*>out)
    elif width == 2:
        place(<const uint16_t*>src, at, n, <uint16_t*>out)
    else:
        place(src, at, n, out)


cdef int64_t _key_groups(const uint64_t* kout, const int64_t* start, const int64_t* counts,
                         int64_t workers, uint64_t* kdist, int64_t* kfirst, int64_t* offs,
                         int64_t* kstart, int64_t* kcount) noexcept nogil:
    """The key layer of each worker's run of dealt rows (``kout``: their key codes, runs
    sorted): its distinct codes (``kdist``), the row of each one's first (``kfirst``, a row of
    the dealt block) and the offsets of its rows in the run (``offs``: worker ``w``'s from
    ``kstart[w] + w``, ``kcount[w] + 1`` of them, from 0 to its rows). Returns the groups."""
    cdef int64_t w, s, e, g = 0, o
    for w in range(workers):
        kstart[w] = g
        s = start[w]
        e = s + counts[w]
        o = g + w   # (each worker's offsets end with one more entry)
        while s < e:
            if s == start[w] or kout[s] != kout[s - 1]:
                kdist[g] = kout[s]
                kfirst[g] = s
                offs[o] = s - start[w]
                g += 1
                o += 1
            s += 1
        offs[o] = counts[w]
        kcount[w] = g - kstart[w]
    return g


cdef int64_t _deal_sorted(const int32_t* op, int bits, int64_t workers, const int64_t* perm,
                       int64_t m, int64_t N, const uint64_t* kc, const uint64_t* vc,
                       const int64_t* wp, int32_t* dsrc, int64_t* at,
                       int64_t* counts, int64_t* start, const ArrowArray* src,
                       const int* widths, uint8_t* block, int64_t* wout, uint64_t* kout,
                       uint64_t* vout) noexcept nogil:
    """The passes of :func:`deal_sorted` once the rows are sorted (``perm``: distinct rows in
    ``0..N-1``, checked in range by the caller; a row given twice stops the passes before any
    store of it, and is returned, else -1): each input row's worker
    (``dsrc``, hashed in input order, with the rows a worker counted), then in sorted order
    each row's place in the output (its worker's run), written at its input row (``at``;
    ``m``, a spare slot, for the rows the consolidation dropped), its weight and both its
    codes stored there; then each column read in input order and stored at its place. With no row dropped
    (``m == N``, the common case) the hashing pass's counts are the runs': no recount."""
    cdef int64_t i, w, col, d, p0, p1, s, r, total, k = src.n_children
    cdef codes_t c
    cdef const ArrowArray* ch
    c.u64 = kc
    c.n = N
    owner_dest(&c, op, bits, dsrc, counts)
    if m < N:
        # the consolidation dropped rows: count the kept ones again (with no row dropped, the
        # hashing pass counted the runs' rows already)
        for w in range(workers):
            counts[w] = 0
        for i in range(m):
            counts[dsrc[perm[i]]] += 1
    for i in range(N):   # (the dropped rows' stores go to the spare slot m; with none dropped,
        at[i] = m        # this keeps every store in the block whatever ``perm`` holds)
    total = 0
    for w in range(workers):
        start[w] = total
        total += counts[w]
    if workers == 2:
        p0, p1 = start[0], start[1]
        for i in range(m):
            r = perm[i]
            if at[r] != m:   # (a row twice: the runs would overflow their counts)
                return r
            d = dsrc[r]
            s = p0 ^ ((p0 ^ p1) & -d)   # p1 if d else p0, without a branch
            at[r] = s
            wout[s] = wp[i]
            kout[s] = kc[r]
            vout[s] = vc[r]
            p1 += d
            p0 += 1 - d
    else:
        for i in range(m):
            r = perm[i]
            if at[r] != m:
                return r
            d = dsrc[r]
            s = start[d]
            at[r] = s
            wout[s] = wp[i]
            kout[s] = kc[r]
            vout[s] = vc[r]
            start[d] = s + 1
        for w in range(workers):
            start[w] -= counts[w]
    kout[m] = 0   # (the spare slot, outside every run)
    vout[m] = 0
    for col in range(k):
        ch = src.children[col]
        place_col(<const uint8_t*>ch.buffers[1] + (ch.offset + src.offset) * widths[col],
                  widths[col], at, N, <uint8_t*>(<ArrowArray*>block + 1 + col).buffers[1])
    return -1


cdef bint _code_cols(list cols, list plan, int* out, const int* widths, int64_t k,
                     str who) except -1:
    """Copy the column indices ``cols`` to ``out`` (refused, ValueError naming ``who``,
    unless there are 1 to 8 of them, one per entry of ``plan``, each a column of the batch's
    ``k``); whether the columns' u64 codes can be packed from the export: each of its plan's
    width, the code within 64 bits."""
    cdef int64_t c, nbytes = 0
    if not 0 < len(cols) == len(plan) <= 8:
        raise ValueError(f"{who}: {len(cols)} columns for a plan of {len(plan)}")
    for c in range(len(cols)):
        out[c] = cols[c]
        if out[c] < 0 or out[c] >= k:
            raise ValueError(f"{who}: no column {out[c]}")
    for c in range(len(cols)):
        if plan[c][0] != widths[out[c]]:
            return False
        nbytes += widths[out[c]] + (1 if plan[c][2] else 0)
    return nbytes <= 8


def deal_sorted(batch, weights, list key_cols, list key_plan, list val_cols, list val_plan,
                owners, int bits, int64_t workers, sort, key_schema):
    """The driver's split of an input that ``index_by(key)`` reads: the rows of ``batch``
    sorted and consolidated by (key code, value code) once, then dealt to the workers of a
    shard map as :func:`deal_batch` deals them (by the hash of the key code): per worker
    ``(record batch, weights, key codes, value codes, key batch, distinct key codes, offsets)``
    of its rows, still sorted and consolidated, or None for a worker without rows. The codes are the u64 codes of the
    columns ``key_cols`` / ``val_cols`` by their plans (``(byte width, signed, nullable)`` per
    column, as ``KeyCodec._native_plan``), packed from one export of the batch; ``sort`` is
    :func:`dbsp.algebra.kernels.sort_consolidate`. None (nothing done) when a column is not
    fixed-width without nulls or off its plan, or a code would not fit 64 bits: the caller's
    path is then :func:`deal_batch`.

    After the sort, one pass writes each row's worker and its place in its worker's run, then
    one pass a column (and one each for the weights and both codes) copies each value to its
    place in one Arrow C struct block that one import owns; each worker's batch is a slice of
    it: the rows are gathered once, in their final order. The GIL is released only for
    :data:`NOGIL_MIN` rows or more.

    The last three items are the key layer of a worker's rows as ``index_by`` keeps it: each
    distinct key's columns once (taken at its first row; a batch of ``key_schema``, the key
    columns' fields in ``key_cols`` order), its code, and its rows at ``offsets[g]:offsets[g +
    1]``; one more pass over the dealt codes and one gather of the key columns into one block,
    so that ``index_by`` neither finds the groups nor takes the keys again."""
    cdef cnp.ndarray own = _owner_map(owners, bits, workers, "deal_sorted")
    cdef cnp.ndarray wa = np.ascontiguousarray(weights, dtype=np.int64)
    cdef int64_t N = batch.num_rows, m, i, w, k, col
    cdef uint64_t bad
    cdef int64_t twice
    if wa.ndim != 1 or wa.shape[0] != N:
        raise ValueError(f"deal_sorted: {N} rows, {len(wa)} weights")
    cdef int kcols[8]
    cdef int vcols[8]
    cdef int widths[64]
    cdef uint8_t* block = NULL
    cdef int64_t* counts = NULL
    cdef int64_t* start = NULL
    cdef cnp.ndarray ka, va, pa_, w2, wout, kout, vout
    cdef int32_t* dsrc = NULL
    cdef int64_t* at = NULL
    cdef const int32_t* op
    cdef const uint64_t* kp
    cdef const uint64_t* vp
    cdef const int64_t* wp
    cdef int64_t* wop
    cdef uint64_t* kop
    cdef uint64_t* vop
    cdef ArrowArray src
    cdef ArrowSchema ssrc
    src.release = NULL   # (nothing to release until exported)
    ssrc.release = NULL
    cdef const int64_t* pp
    schema = batch.schema
    batch._export_to_c(<uintptr_t>&src, <uintptr_t>&ssrc)
    try:
        k = _plain_widths(&src, &ssrc, widths)
        if N == 0 or k == 0:
            return None
        ssrc.release(&ssrc)
        if not _code_cols(key_cols, key_plan, kcols, widths, k, "deal_sorted") \
                or not _code_cols(val_cols, val_plan, vcols, widths, k, "deal_sorted"):
            return None
        ka = np.empty(N, dtype=np.uint64)
        va = np.empty(N, dtype=np.uint64)
        pack_codes(&src, kcols, key_plan, <uint64_t*>cnp.PyArray_DATA(ka), N)
        pack_codes(&src, vcols, val_plan, <uint64_t*>cnp.PyArray_DATA(va), N)
        perm, wsum = sort(ka, va, wa)
        pa_ = np.ascontiguousarray(perm, dtype=np.int64)
        w2 = np.ascontiguousarray(wsum, dtype=np.int64)
        m = pa_.shape[0]
        if w2.shape[0] != m or m > N:
            raise ValueError(f"deal_sorted: the sort gave {m} rows, {w2.shape[0]} weights")
        pp = <const int64_t*>cnp.PyArray_DATA(pa_)
        bad = 0
        for i in range(m):   # (no branch: one unsigned compare a row, vectorised)
            bad |= <uint64_t>pp[i] >= <uint64_t>N
        if bad:
            for i in range(m):
                if pp[i] < 0 or pp[i] >= N:
                    raise ValueError(f"deal_sorted: the sort gave row {pp[i]} of {N}")
        # (every output has a spare slot at m: the stores of the rows the sort dropped)
        dsrc = <int32_t*>malloc(N * sizeof(int32_t))
        at = <int64_t*>malloc(N * sizeof(int64_t))
        counts = <int64_t*>calloc(workers, sizeof(int64_t))
        start = <int64_t*>calloc(workers, sizeof(int64_t))
        block = blk_struct(k, widths, m + 1)
        if dsrc == NULL or at == NULL or counts == NULL or start == NULL \
                or block == NULL:
            raise MemoryError()
        blk_set_length(block, m)
        wout = np.empty(m + 1, dtype=np.int64)
        kout = np.empty(m + 1, dtype=np.uint64)
        vout = np.empty(m + 1, dtype=np.uint64)
        op = <const int32_t*>cnp.PyArray_DATA(own)
        kp, vp = <const uint64_t*>cnp.PyArray_DATA(ka), <const uint64_t*>cnp.PyArray_DATA(va)
        wp = <const int64_t*>cnp.PyArray_DATA(w2)
        wop = <int64_t*>cnp.PyArray_DATA(wout)
        kop, vop = <uint64_t*>cnp.PyArray_DATA(kout), <uint64_t*>cnp.PyArray_DATA(vout)
        if m >= NOGIL_MIN:
            with nogil:
                twice = _deal_sorted(op, bits, workers, pp, m, N, kp, vp, wp, dsrc, at, counts,
                                     start, &src, widths, block, wop, kop, vop)
        else:
            twice = _deal_sorted(op, bits, workers, pp, m, N, kp, vp, wp, dsrc, at, counts,
                                 start, &src, widths, block, wop, kop, vop)
        if twice >= 0:
            raise ValueError(f"deal_sorted: the sort gave row {twice} twice")
        src.release(&src)
        layer = _key_layer(block, kcols, widths, len(key_cols), kop, start, counts, workers,
                           m, key_schema)
        b = <uintptr_t>block
        block = NULL   # the import owns it (and releases it if the import fails)
        runs = _import_runs(b, schema, (wout, kout, vout), start, counts, workers)
        return [None if r is None else r + l for r, l in zip(runs, layer)]
    finally:
        _release(&src, &ssrc)
        free(block)
        free(dsrc)
        free(at)
        free(counts)
        free(start)


cdef list _u64_runs(kruns, str who):
    """The key runs of a k-way merge as contiguous 1-d u64 arrays (``who``: the caller, named
    in the error)."""
    cdef list ks = []
    for r in kruns:
        a = np.ascontiguousarray(r, dtype=np.uint64)
        if a.ndim != 1:
            raise ValueError(f"{who}: key runs must be 1-d")
        ks.append(a)
    return ks


def merge_sum_runs(list kruns, list cols, list is_int):
    """The parts a combiner receives, summed per key (twin of ``kernels_ref.merge_sum_runs``):
    ``kruns``: W runs of u64 codes, each ascending and distinct; ``cols[c][w]``: partial column
    ``c`` of run ``w`` (int64 where ``is_int[c]``, else float64), aligned with ``kruns[w]``.
    Returns ``(keys, first, sums, over)``: the distinct codes ascending, the position of each
    one's first row in the concatenation of the runs, every column summed per key (floats in run
    order from the first value; int64 sums exact, stored wrapped), and a bool mask of the keys
    some int64 sum of which is out of int64 (None when there is none).

    One k-way merge over the heads of the W runs (W is the worker count: a scan of the heads
    per key), in place of concatenating, sorting, grouping and summing column by column (a
    dozen calls a column on a few dozen keys). Keeps the GIL (a combiner's parts are small)."""
    cdef int64_t W = len(kruns), C = len(cols), w, c, n = 0, g = 0, i, best
    if len(is_int) != C:
        raise ValueError(f"merge_sum_runs: {len(is_int)} is_int flags for {C} columns")
    cdef list vs = []
    cdef cnp.ndarray a
    cdef list ks = _u64_runs(kruns, "merge_sum_runs")
    for w in range(W):
        n += (<cnp.ndarray>ks[w]).shape[0]
    for c in range(C):
        if len(cols[c]) != W:
            raise ValueError(f"merge_sum_runs: column {c} has {len(cols[c])} runs for {W}")
        for w in range(W):
            a = np.ascontiguousarray(cols[c][w], dtype=np.int64 if is_int[c] else np.float64)
            if a.ndim != 1 or a.shape[0] != (<cnp.ndarray>ks[w]).shape[0]:
                raise ValueError(f"merge_sum_runs: column {c} of run {w} has {len(a)} values "
                                 f"for {(<cnp.ndarray>ks[w]).shape[0]} keys")
            vs.append(a)
    cdef const uint64_t** kp = <const uint64_t**>malloc(max(W, 1) * sizeof(void*))
    cdef int64_t* kn = <int64_t*>malloc(max(W, 1) * sizeof(int64_t))
    cdef int64_t* base = <int64_t*>malloc(max(W, 1) * sizeof(int64_t))
    cdef int64_t* pos = <int64_t*>calloc(max(W, 1), sizeof(int64_t))
    cdef void** vp = <void**>malloc(max(W * C, 1) * sizeof(void*))
    cdef uint8_t* isi = <uint8_t*>malloc(max(C, 1))
    cdef void** sp = <void**>malloc(max(C, 1) * sizeof(void*))
    if kp == NULL or kn == NULL or base == NULL or pos == NULL or vp == NULL or isi == NULL \
            or sp == NULL:
        free(kp); free(kn); free(base); free(pos); free(vp); free(isi); free(sp)
        raise MemoryError()
    cdef cnp.ndarray keys = np.empty(n, dtype=np.uint64)
    cdef cnp.ndarray first = np.empty(n, dtype=np.int64)
    cdef cnp.ndarray overm = np.zeros(n, dtype=bool)
    cdef list sums = [np.empty(n, dtype=np.int64 if is_int[c] else np.float64) for c in range(C)]
    cdef uint64_t* ko = <uint64_t*>cnp.PyArray_DATA(keys)
    cdef int64_t* fo = <int64_t*>cnp.PyArray_DATA(first)
    cdef uint8_t* oo = <uint8_t*>cnp.PyArray_DATA(overm)
    cdef uint64_t k, bk
    cdef int64_t b = 0
    cdef bint unsorted = False, any_over = False
    cdef dbsp_i128 acc
    cdef double facc
    for w in range(W):
        a = ks[w]
        kp[w] = <const uint64_t*>cnp.PyArray_DATA(a)
        kn[w] = a.shape[0]
        base[w] = b
        b += kn[w]
        for i in range(1, kn[w]):
            if kp[w][i] <= kp[w][i - 1]:
                unsorted = True
    for c in range(C):
        isi[c] = 1 if is_int[c] else 0
        sp[c] = cnp.PyArray_DATA(<cnp.ndarray>sums[c])
        for w in range(W):
            vp[c * W + w] = cnp.PyArray_DATA(<cnp.ndarray>vs[c * W + w])
    if not unsorted:
        while True:
            best = min_head(kp, pos, kn, W, &bk)  # the run of the smallest head
            if best < 0:
                break
            ko[g] = bk
            fo[g] = base[best] + pos[best]
            for c in range(C):
                if isi[c]:
                    acc = (<const int64_t*>vp[c * W + best])[pos[best]]
                    for w in range(best + 1, W):
                        if pos[w] < kn[w] and kp[w][pos[w]] == bk:
                            acc += (<const int64_t*>vp[c * W + w])[pos[w]]
                    (<int64_t*>sp[c])[g] = <int64_t>acc
                    if acc < <dbsp_i128>INT64_MIN or acc > <dbsp_i128>INT64_MAX:
                        oo[g] = 1
                        any_over = True
                else:
                    facc = (<const double*>vp[c * W + best])[pos[best]]
                    for w in range(best + 1, W):
                        if pos[w] < kn[w] and kp[w][pos[w]] == bk:
                            facc += (<const double*>vp[c * W + w])[pos[w]]
                    (<double*>sp[c])[g] = facc
            pos[best] += 1
            for w in range(best + 1, W):
                if pos[w] < kn[w] and kp[w][pos[w]] == bk:
                    pos[w] += 1
            g += 1
    free(kp); free(kn); free(base); free(pos); free(vp); free(isi); free(sp)
    if unsorted:
        raise ValueError("merge_sum_runs: a key run is not ascending and distinct")
    return (keys[:g], first[:g], [s[:g] for s in sums], overm[:g] if any_over else None)


cdef int64_t _merge_two(const uint64_t* a, int64_t na, const uint64_t* b, int64_t nb,
                        int64_t* o) noexcept nogil:
    """:func:`merge_disjoint_runs` of two runs (the driver's gather of two workers' parts):
    one two-pointer pass whose choice of run is arithmetic, not a branch (the runs of two
    workers interleave at random, and the k-way loop's mispredicted branches made it 30 ns a
    row). Returns the rows written, or -1 when a key is in both runs (both heads equal: every
    smaller key was taken before, so a shared key always meets itself there)."""
    cdef int64_t i = 0, j = 0, g = 0, t
    cdef uint64_t x, y
    while i < na and j < nb:
        x = a[i]
        y = b[j]
        if x == y:
            return -1
        t = x < y                       # 1: take a's head, 0: b's
        o[g] = t * i + (1 - t) * (na + j)
        g += 1
        i += t
        j += 1 - t
    while i < na:
        o[g] = i
        g += 1
        i += 1
    while j < nb:
        o[g] = na + j
        g += 1
        j += 1
    return g


cdef int64_t _disjoint_order(list ks, int64_t* base, int64_t* o) except -3:
    """The merge of :func:`merge_disjoint_runs` of the contiguous u64 runs ``ks`` into ``o``
    (room for every row): the rows written, or -1 when a key is in two runs; ``base[w]``: run
    ``w``'s first position in the concatenation (``base[W]``: the rows). ValueError when a
    run is not ascending."""
    cdef int64_t W = len(ks), w, g = 0, i, best, b = 0
    cdef cnp.ndarray a
    cdef const uint64_t** kp = <const uint64_t**>malloc(max(W, 1) * sizeof(void*))
    cdef int64_t* kn = <int64_t*>malloc(max(W, 1) * sizeof(int64_t))
    cdef int64_t* pos = <int64_t*>calloc(max(W, 1), sizeof(int64_t))
    if kp == NULL or kn == NULL or pos == NULL:
        free(kp); free(kn); free(pos)
        raise MemoryError()
    cdef uint64_t k, bk = 0
    cdef bint unsorted = False, shared = False
    for w in range(W):
        a = ks[w]
        kp[w] = <const uint64_t*>cnp.PyArray_DATA(a)
        kn[w] = a.shape[0]
        base[w] = b
        b += kn[w]
        for i in range(1, kn[w]):
            if kp[w][i] < kp[w][i - 1]:
                unsorted = True
    base[W] = b
    if not unsorted and W == 2:
        g = _merge_two(kp[0], kn[0], kp[1], kn[1], o)
        shared = g < 0
    elif not unsorted:
        while True:
            best = -1
            for w in range(W):
                if pos[w] < kn[w]:
                    k = kp[w][pos[w]]
                    if best < 0 or k < bk:
                        best, bk = w, k
                    elif k == bk:
                        shared = True
                        break
            if shared or best < 0:
                break
            i = pos[best]
            while i < kn[best] and kp[best][i] == bk:  # the key's rows, together
                o[g] = base[best] + i
                g += 1
                i += 1
            pos[best] = i
    free(kp); free(kn); free(pos)
    if unsorted:
        raise ValueError("merge_disjoint_runs: a key run is not ascending")
    return -1 if shared else g


def merge_disjoint_runs(list kruns):
    """The order merging W runs of u64 key codes, each non-decreasing, whose keys are disjoint
    (twin of ``kernels_ref.merge_disjoint_runs``): positions (int64) into the concatenation of
    the runs, ascending by code, a key's rows in their run's order; None when a key is in two
    runs. One k-way merge over the runs' heads (W: the worker count), in place of
    concatenating, sorting stably, and checking the sorted keys' runs. Keeps the GIL."""
    cdef list ks = _u64_runs(kruns, "merge_disjoint_runs")
    cdef int64_t W = len(ks), w, n = 0
    for w in range(W):
        n += (<cnp.ndarray>ks[w]).shape[0]
    cdef cnp.ndarray order = np.empty(n, dtype=np.int64)
    cdef int64_t* base = <int64_t*>malloc((W + 1) * sizeof(int64_t))
    if base == NULL:
        raise MemoryError()
    try:
        g = _disjoint_order(ks, base, <int64_t*>cnp.PyArray_DATA(order))
    finally:
        free(base)
    return None if g < 0 else order


#: the column widths of the output schemas met (``blk_schema_widths``)
cdef dict _schema_widths = {}


def gather_disjoint(list batches, list weights, schema, list plan):
    """The rows of W record batches of ``schema``'s columns (the workers' sorted parts of an
    output) and their ``weights`` merged into one ``(record batch of schema, weights)`` by the
    u64 key codes of their first ``len(plan)`` columns (``plan``: ``(byte width, signed,
    nullable)`` per key column, as ``KeyCodec._native_plan``; each batch's codes
    non-decreasing, keys disjoint between batches): the order of :func:`merge_disjoint_runs`.
    None when a key is in two batches (the rows must be summed), or a column is not
    fixed-width without nulls, or the key columns are not of the plan's widths, or ``schema``
    is not 1 to 64 such columns: the caller's path. The batches' column types must be
    ``schema``'s (not checked: a batch's export is read by ``schema``'s widths).

    One export a batch, its key codes packed from it, one merge of the codes, then each column
    gathered from the W exports into one Arrow C struct block imported once: no selection and
    encode of the keys, no concatenation of the parts, no take through the merge order, no
    numpy gather of the weights. Keeps the GIL (an output's step is small)."""
    cdef int64_t W = len(batches), w, n = 0, g, j, col, k, nb, nk = len(plan)
    if len(weights) != W:
        raise ValueError(f"gather_disjoint: {W} batches, {len(weights)} weights")
    cdef bytes wb = blk_schema_widths(_schema_widths, schema)
    if wb is None or W == 0 or W > 64 or nk == 0 or nk > len(wb):
        return None
    cdef const unsigned char* wbp = <const unsigned char*>wb
    k = len(wb)
    cdef int64_t bytes_ = 0
    for col in range(nk):
        if plan[col][0] != wbp[col]:
            return None
        bytes_ += wbp[col] + (1 if plan[col][2] else 0)
    if bytes_ > 8:   # (not a u64 code)
        return None
    cdef int widths[64]
    for col in range(k):
        widths[col] = wbp[col]
    cdef list wts = [], ks = []
    cdef cnp.ndarray wa, wout, kc
    for w in range(W):
        nb = batches[w].num_rows
        wa = np.ascontiguousarray(weights[w], dtype=np.int64)
        if wa.ndim != 1 or wa.shape[0] != nb:
            raise ValueError(f"gather_disjoint: batch {w} has {nb} rows, {len(wa)} weights")
        wts.append(wa)
        n += nb
    cdef ArrowArray src[64]
    for w in range(W):
        src[w].release = NULL
    cdef int64_t base[65]
    cdef int64_t* order = <int64_t*>malloc(max(n, 1) * sizeof(int64_t))
    cdef int32_t* run = <int32_t*>malloc(max(n, 1) * sizeof(int32_t))
    cdef const uint8_t* cols[64]
    cdef uint8_t* block = NULL
    cdef const ArrowArray* ch
    cdef uint8_t* out
    cdef int wd
    try:
        if order == NULL or run == NULL:
            raise MemoryError()
        for w in range(W):
            batches[w]._export_to_c(<uintptr_t>&src[w])
            if src[w].n_children != k or src[w].dictionary != NULL:
                return None
            for col in range(k):
                if not blk_plain(src[w].children[col]):
                    return None
            kc = np.empty(src[w].length, dtype=np.uint64)
            pack_codes(&src[w], NULL, plan, <uint64_t*>cnp.PyArray_DATA(kc), src[w].length)
            ks.append(kc)
        g = _disjoint_order(ks, base, order)
        if g < 0:
            return None
        w = 0
        for j in range(n):   # each row's part, and its row there
            while order[j] >= base[w + 1]:
                w += 1
            while order[j] < base[w]:
                w -= 1
            run[j] = <int32_t>w
            order[j] -= base[w]
        block = blk_struct(k, widths, n)
        if block == NULL:
            raise MemoryError()
        blk_set_length(block, n)
        wout = np.empty(n, dtype=np.int64)
        for col in range(k + 1):
            if col < k:
                out = <uint8_t*>(<ArrowArray*>block + 1 + col).buffers[1]
                wd = widths[col]
                for w in range(W):
                    ch = src[w].children[col]
                    cols[w] = <const uint8_t*>ch.buffers[1] + (ch.offset + src[w].offset) * wd
            else:
                out = <uint8_t*>cnp.PyArray_DATA(wout)
                wd = 8
                for w in range(W):
                    cols[w] = <const uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>wts[w])
            _gather_runs(cols, run, order, n, wd, out)
        b = <uintptr_t>block
        block = NULL   # the import owns it
        return _import_batch(b, schema), wout
    finally:
        for w in range(W):
            if src[w].release != NULL:
                src[w].release(&src[w])
        free(order)
        free(run)
        free(block)


cdef void _gather_runs(const uint8_t** cols, const int32_t* run, const int64_t* row, int64_t n,
                       int w, uint8_t* out) noexcept nogil:
    """``out[j] = cols[run[j]][row[j]]`` for values of ``w`` bytes."""
    cdef int64_t j
    if w == 8:
        for j in range(n):
            (<uint64_t*>out)[j] = (<const uint64_t*>cols[run[j]])[row[j]]
    elif w == 4:
        for j in range(n):
            (<uint32_t*>out)[j] = (<const uint32_t*>cols[run[j]])[row[j]]
    elif w == 2:
        for j in range(n):
            (<uint16_t*>out)[j] = (<const uint16_t*>cols[run[j]])[row[j]]
    else:
        for j in range(n):
            out[j] = cols[run[j]][row[j]]
