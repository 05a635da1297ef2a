"""Stable sorting and consolidation of code arrays (native twin of ``kernels_ref.argsort`` and
``kernels_ref.sort_consolidate``).

Design
------
Rows are sorted as 16-byte ``kv_t`` (u64 sort key, row index) -- or ``kw_t`` (key, 32-bit row,
32-bit weight) when consolidating rows whose index and weight fit, so that the weight travels with
the key instead of being gathered at random afterwards. The sort is a *stable* radix sort, most
significant digit first, whose first pass is the only one that leaves the cache:

* the varying bits of the keys are found first (OR of ``key ^ key[0]``), so a key range of
  ``2^b`` costs about ``b / 12`` digits whatever the key values are;
* the first pass reads the codes (and weights) straight from the input arrays and scatters rows
  into up to 4096 buckets by their top 12 varying bits. Rows are staged per bucket in a cache
  line and written a line at a time with streaming stores (no read for ownership, no pollution):
  10-15% less CPU time than plain stores for 10M rows, measured A/B in one process;
* each bucket (about ``n / 4096`` rows) is then finished while it sits in L2, by the same
  procedure on the remaining bits with a digit about as wide as the bucket is large (so buckets
  of one or two rows remain), then a single insertion sort over the bucket orders what is left
  (few moves, no per-bucket branches); digits constant over a bucket are skipped;
* the sorted bucket is emitted at once, still in cache: the permutation, or the consolidation
  (first row and summed weight per distinct key, branchless), written in place over the part of
  the buffer already consumed. So the whole sort allocates one 16-byte row per input row, plus
  the weights of a consolidation.

Why not plain LSD (one histogram pass, then one scatter pass per varying 11-bit digit)? Every
LSD pass scatters the whole array out of cache. A straightforward LSD in C on this machine (all
histograms in one pass, constant digits skipped, buffers already faulted in) took 173 ms for 10M
rows of 20-bit keys and 422 ms for 62-bit keys; this sort's ``argsort`` takes about 120 ms and
155 ms, fresh memory included (``bench/micro/bench_consolidate.py``).

Var codes are sorted by the big-endian u64 of their first 8 bytes; each group of rows with equal
prefixes is then ordered by the next 8 bytes (radix again) or, when small, by insertion sort with
``memcmp``; groups whose codes all end within the bytes seen so far are ordered by length (a code
that is a zero-padded prefix of another sorts first).

Sorting by ``(k, v)``: when both are u64 and their varying bits fit 64 together, the pair is
packed into one u64 code and takes the u64 path; when they do not, into one 128-bit key (32-byte
``kk_t`` rows, same procedure); var codes take a stable sort by ``v`` followed by a stable sort
by ``k``.

Every loop runs without the GIL.
"""
cimport numpy as cnp
from _native.arrays cimport contig, contig_any, empty1, zeros1
from libc.stdint cimport uint8_t, int32_t, uint32_t, int64_t, uint64_t
from libc.string cimport memcpy, memset

from _native.types cimport kv_t, kw_t, var_t, codes_t
from _native.codes_cmp cimport dbsp_clz64, var_cmp, var_prefix, codes_eq
from _native.views cimport as_codes, as_i64, codes_view, shrink

cdef extern from "checked_add.h" nogil:
    bint dbsp_add_ovf(int64_t a, int64_t b, int64_t* r)

import numpy as np

cnp.import_array()

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if defined(__SSE2__)
    #include <emmintrin.h>
    /* Write one 64-byte line (4 rows of 16 bytes) around the cache: no read for ownership. */
    static inline void dbsp_stream_line(void* dst, const void* src) {
        __m128i* d = (__m128i*)dst;
        const __m128i* s = (const __m128i*)src;
        _mm_stream_si128(d, _mm_loadu_si128(s));
        _mm_stream_si128(d + 1, _mm_loadu_si128(s + 1));
        _mm_stream_si128(d + 2, _mm_loadu_si128(s + 2));
        _mm_stream_si128(d + 3, _mm_loadu_si128(s + 3));
    }
    /* The same, the last row given by value: it was just built, and reloading it as 16 bytes
       from the two smaller stores that wrote it would stall on store forwarding. */
    static inline void dbsp_stream_line_last(void* dst, const void* src, uint64_t lo, uint64_t hi) {
        __m128i* d = (__m128i*)dst;
        const __m128i* s = (const __m128i*)src;
        _mm_stream_si128(d, _mm_loadu_si128(s));
        _mm_stream_si128(d + 1, _mm_loadu_si128(s + 1));
        _mm_stream_si128(d + 2, _mm_loadu_si128(s + 2));
        _mm_stream_si128(d + 3, _mm_set_epi64x((long long)hi, (long long)lo));
    }
    static inline void dbsp_sfence(void) { _mm_sfence(); }
    #else
    static inline void dbsp_stream_line_last(void* dst, const void* src, uint64_t lo, uint64_t hi) {
        memcpy(dst, src, 48);
        memcpy((char*)dst + 48, &lo, 8);
        memcpy((char*)dst + 56, &hi, 8);
    }
    static inline void dbsp_stream_line(void* dst, const void* src) { memcpy(dst, src, 64); }
    static inline void dbsp_sfence(void) { }
    #endif
    """
    void dbsp_stream_line(void* dst, const void* src) nogil
    void dbsp_stream_line_last(void* dst, const void* src, uint64_t lo, uint64_t hi) nogil
    void dbsp_sfence() nogil

cdef extern from *:
    """
    #if defined(__SIZEOF_INT128__)
    typedef unsigned __int128 dbsp_u128;
    #define DBSP_HAVE_U128 1
    #else
    typedef uint64_t dbsp_u128;        /* wide (k, v) pairs then take the two-sort path */
    #define DBSP_HAVE_U128 0
    #endif
    """
    ctypedef unsigned long long u128_t "dbsp_u128"
    int DBSP_HAVE_U128

# A (k, v) pair of u64 codes packed into one 128-bit key (k's varying bits above v's), its row
# and weight: the row the radix sort moves for wide pairs.
ctypedef struct kk_t:
    u128_t key
    int64_t idx
    int64_t w

cdef enum:
    TOP_DIGIT = 12                 # digit of the first pass (4096 buckets; out of cache)
    TOP_RADIX = 1 << TOP_DIGIT
    MAX_DIGIT = 12                 # widest digit of the passes in cache
    RADIX = 1 << MAX_DIGIT
    MAX_LEVELS = 36                # radix recursion levels (128 bits / 4-bit digits + 4)
    SMALL = 16                     # insertion sort at or below this many rows
    LINE_ROWS = 4                  # 16-byte rows per 64-byte cache line
    STREAM_MIN = 1 << 18           # rows from which the first scatter streams around the cache

ctypedef fused row_t:
    kv_t
    kw_t
    kk_t


# --- the u64 radix sort on (key, row) pairs ---------------------------------------------------

cdef inline void insertion_rows(row_t* a, int64_t n) noexcept nogil:
    """Stable insertion sort of a[0:n] by key."""
    cdef int64_t i, j
    cdef row_t x
    for i in range(1, n):
        x = a[i]
        j = i
        while j > 0 and a[j - 1].key > x.key:
            a[j] = a[j - 1]
            j -= 1
        a[j] = x


cdef inline int sig_bits(const kv_t* a, int64_t n) noexcept nogil:
    """Number of low bits on which the keys of a[0:n] differ (0 if all are equal)."""
    cdef uint64_t k0, d = 0
    cdef int64_t i
    if n == 0:
        return 0
    k0 = a[0].key
    for i in range(n):
        d |= a[i].key ^ k0
    return 64 - dbsp_clz64(d)


cdef inline int digit_bits(int64_t n, int cap) noexcept nogil:
    """Digit width for a bucket of n rows: about one bucket per row, between 4 and cap bits.

    Wide digits leave tiny buckets, which the final insertion sort orders with few moves.
    """
    cdef int b = 63 - dbsp_clz64(<uint64_t>n)
    if b > cap:
        return cap
    if b < 4:
        return 4
    return b



cdef row_t* radix_rows(row_t* a, row_t* t, int64_t n, int bits, int64_t* cnt) noexcept nogil:
    """Stable sort of a[0:n] by key, keys equal on all bits >= ``bits``; t[0:n] is scratch.

    Returns the buffer that holds the result: ``a`` or ``t``. ``cnt`` holds
    ``RADIX * MAX_LEVELS`` counters (one block per recursion level).
    """
    cdef int db, shift
    cdef uint64_t mask, d, d0
    cdef int64_t nb, i, s, c, start, end
    cdef row_t* r
    while True:
        if n <= SMALL:
            insertion_rows(a, n)
            return a
        if bits <= 0:
            return a
        db = digit_bits(n, MAX_DIGIT)
        if db > bits:
            db = bits
        shift = bits - db
        mask = (<uint64_t>1 << db) - 1
        nb = <int64_t>1 << db
        memset(cnt, 0, nb * sizeof(int64_t))
        for i in range(n):
            cnt[(a[i].key >> shift) & mask] += 1
        d0 = (a[0].key >> shift) & mask
        if cnt[d0] == n:           # constant digit: nothing to move
            bits = shift
            continue
        s = 0
        for i in range(nb):
            c = cnt[i]
            cnt[i] = s
            s += c
        for i in range(n):
            d = (a[i].key >> shift) & mask
            t[cnt[d]] = a[i]
            cnt[d] += 1
        if shift == 0:
            return t
        # big buckets recurse; one insertion sort over the whole range then finishes the small
        # ones (rows are out of order only inside their bucket, so it moves few rows and runs
        # without the mispredicted per-bucket branches)
        start = 0
        for i in range(nb):
            end = cnt[i]
            c = end - start
            if c > SMALL:
                r = radix_rows(t + start, a + start, c, shift, cnt + RADIX)
                if r != t + start:
                    memcpy(t + start, r, c * sizeof(row_t))
            start = end
        insertion_rows(t, n)
        return t


cdef inline kv_t* sort_kv(kv_t* a, kv_t* t, int64_t n, int64_t* cnt) noexcept nogil:
    return radix_rows(a, t, n, sig_bits(a, n), cnt)


cdef inline void make_row(row_t* r, const uint64_t* k, const int64_t* w, int64_t i) noexcept nogil:
    r.key = k[i]
    if row_t is kv_t:
        r.idx = i
    elif row_t is kw_t:
        r.idx = <uint32_t>i
        r.w = <int32_t>w[i]
    else:
        r.idx = i
        r.w = w[i] if w != NULL else 0


cdef inline uint64_t row_hi(const row_t* r) noexcept nogil:
    """The second 8 bytes of a 16-byte row, as stored (little-endian)."""
    if row_t is kv_t:
        return <uint64_t>r.idx
    elif row_t is kw_t:
        return <uint64_t>r.idx | ((<uint64_t><uint32_t>r.w) << 32)
    else:
        return 0


cdef void scatter_top(row_t* t, const uint64_t* k, const int64_t* w, int64_t n, int shift,
                      uint64_t mask, int64_t nb, int64_t* pos, int64_t* bstart,
                      row_t* wc) noexcept nogil:
    """Scatter rows 0..n-1 (built from k, w) to t by digit ``(k >> shift) & mask``.

    ``pos[d]`` is the first row of bucket d on entry. When ``wc`` is not NULL, rows are staged per
    bucket in a line-sized buffer (``wc[4 * d ..]``) and written a full cache line at a time with
    streaming stores (no read for ownership of the destination, no cache pollution); the partial
    lines at the ends of each bucket are written with plain stores.
    """
    cdef int64_t i, p, q, line, b, off
    cdef uint64_t d
    cdef row_t* slot
    cdef row_t x
    if wc == NULL:
        for i in range(n):
            d = (k[i] >> shift) & mask
            make_row(&t[pos[d]], k, w, i)
            pos[d] += 1
        return
    off = <int64_t>((<size_t>t // sizeof(row_t)) & (LINE_ROWS - 1))
    for d in range(<uint64_t>nb):
        bstart[d] = pos[d]
    for i in range(n):
        d = (k[i] >> shift) & mask
        p = pos[d]
        slot = wc + d * LINE_ROWS
        make_row(&x, k, w, i)
        slot[(p + off) & (LINE_ROWS - 1)] = x
        p += 1
        pos[d] = p
        if ((p + off) & (LINE_ROWS - 1)) == 0:
            line = p - LINE_ROWS
            if line >= bstart[d]:
                dbsp_stream_line_last(t + line, slot, x.key, row_hi(&x))
            else:
                for q in range(bstart[d], p):
                    t[q] = slot[(q + off) & (LINE_ROWS - 1)]
    for d in range(<uint64_t>nb):
        p = pos[d]
        b = p - ((p + off) & (LINE_ROWS - 1))
        if b < bstart[d]:
            b = bstart[d]
        slot = wc + d * LINE_ROWS
        for q in range(b, p):
            t[q] = slot[(q + off) & (LINE_ROWS - 1)]
    dbsp_sfence()


# --- var codes: prefix radix, then tie groups ---------------------------------------------------

cdef void var_group(const var_t* v, kv_t* g, kv_t* s, int64_t n, int64_t depth,
                    int64_t* cnt) noexcept nogil:
    """Order g[0:n], rows that agree on their first 8 * (depth + 1) bytes (zero padded)."""
    cdef int64_t seen = 8 * (depth + 1)
    cdef int64_t i, j, ln, l0, maxlen = 0
    cdef bint ended = True, same_len = True
    cdef kv_t x
    cdef kv_t* r
    l0 = v.offsets[g[0].idx + 1] - v.offsets[g[0].idx]
    for i in range(n):
        ln = v.offsets[g[i].idx + 1] - v.offsets[g[i].idx]
        if ln > seen:
            ended = False
            break
        if ln != l0:
            same_len = False
        if ln > maxlen:
            maxlen = ln
    if ended:
        # each code is a zero-padded prefix of the longer ones: shorter first
        if same_len:
            return
        for i in range(n):
            g[i].key = <uint64_t>(v.offsets[g[i].idx + 1] - v.offsets[g[i].idx])
        r = radix_rows(g, s, n, 64 - dbsp_clz64(<uint64_t>maxlen), cnt)
        if r != g:
            memcpy(g, r, n * sizeof(kv_t))
        return
    if n <= SMALL:
        for i in range(1, n):
            x = g[i]
            j = i
            while j > 0 and var_cmp(v, g[j - 1].idx, v, x.idx) > 0:
                g[j] = g[j - 1]
                j -= 1
            g[j] = x
        return
    for i in range(n):
        g[i].key = var_prefix(v, g[i].idx, seen)
    r = sort_kv(g, s, n, cnt)
    if r != g:
        memcpy(g, r, n * sizeof(kv_t))
    var_ties(v, g, s, n, depth + 1, cnt)


cdef void var_ties(const var_t* v, kv_t* g, kv_t* s, int64_t n, int64_t depth,
                   int64_t* cnt) noexcept nogil:
    """Order the runs of equal keys of g[0:n] (keys = prefixes at ``depth``)."""
    cdef int64_t i = 0, j
    while i < n:
        j = i + 1
        while j < n and g[j].key == g[i].key:
            j += 1
        if j - i > 1:
            var_group(v, g + i, s + i, j - i, depth, cnt)
        i = j


cdef kv_t* sort_by(const codes_t* c, kv_t* a, kv_t* t, int64_t n, int64_t* cnt) noexcept nogil:
    """Stable sort of the rows a[0:n].idx by their codes in ``c``; returns a or t."""
    cdef int64_t i
    cdef kv_t* r
    if c.u64 != NULL:
        for i in range(n):
            a[i].key = c.u64[a[i].idx]
        return sort_kv(a, t, n, cnt)
    for i in range(n):
        a[i].key = var_prefix(&c.var, a[i].idx, 0)
    r = sort_kv(a, t, n, cnt)
    var_ties(&c.var, r, t if r == a else a, n, 0, cnt)
    return r


# --- emitting sorted rows: a permutation, or consolidated (first row, summed weight) -----------

ctypedef struct emit_t:
    int64_t* p            # output rows (written in place over the sorted buffer, behind the reads)
    int64_t* q            # output weights (consolidation)
    const int64_t* w      # input weights, gathered by row for kv_t rows
    int64_t o             # rows emitted
    u128_t key            # the key of the last row emitted (consolidation)
    int64_t first
    int64_t s
    bint started
    bint consolidate
    int ovf               # a weight sum wrapped (checked_add.h)


cdef inline void emit_rows(const row_t* t, int64_t n, emit_t* e) noexcept nogil:
    """Emit the sorted rows t[0:n] (in order, after all earlier rows).

    ``e.p`` may point into the sorted buffer: writing ``p[o]`` (bytes 8o..) never overtakes the
    unread rows (bytes 16i.., o <= i).
    Consolidation is branchless: the open group lives in (first, s), the stores are
    unconditional, and the output position advances when a group with a non-zero sum closes.
    A row belongs to the open group when its key equals the previous row's.
    """
    cdef int64_t i, o, first, s, wi
    cdef bint same
    cdef int ovf = 0
    if not e.consolidate:
        o = e.o
        for i in range(n):
            e.p[o + i] = t[i].idx
        e.o = o + n
        return
    if n <= 0:
        return
    if row_t is kv_t:
        wi = e.w[t[0].idx]
    else:
        wi = t[0].w
    if e.started and <u128_t>t[0].key == e.key:
        e.ovf |= dbsp_add_ovf(e.s, wi, &e.s)
    else:
        if e.started:
            e.p[e.o] = e.first
            e.q[e.o] = e.s
            e.o += e.s != 0
        e.first = t[0].idx
        e.s = wi
        e.started = True
    o = e.o
    first = e.first
    s = e.s
    for i in range(1, n):
        same = t[i].key == t[i - 1].key
        if row_t is kv_t:
            wi = e.w[t[i].idx]
        else:
            wi = t[i].w
        e.p[o] = first
        e.q[o] = s
        o += (not same) & (s != 0)
        first = first if same else <int64_t>t[i].idx
        ovf |= dbsp_add_ovf(s if same else 0, wi, &s)
    e.ovf |= ovf
    e.o = o
    e.key = t[n - 1].key
    e.first = first
    e.s = s


cdef inline void emit_close(emit_t* e) noexcept nogil:
    if e.consolidate and e.started:
        e.p[e.o] = e.first
        e.q[e.o] = e.s
        e.o += e.s != 0


cdef void finish_buckets(row_t* t, row_t* a, const int64_t* ends, int64_t nb, int bits,
                         int64_t* cnt, emit_t* e) noexcept nogil:
    """Sort each bucket t[ends[i-1]:ends[i]] (keys equal on bits >= ``bits``) with scratch a,
    then emit it while it is still in cache (from the scratch if it ended there: the bucket's
    rows in t are consumed, so the in-place output may overwrite them)."""
    cdef int64_t i, c, start = 0, end
    cdef row_t* r
    for i in range(nb):
        end = ends[i]
        c = end - start
        r = t + start
        if c > 1 and bits > 0:
            if c <= SMALL:
                insertion_rows(r, c)
            else:
                r = radix_rows(r, a, c, bits, cnt)
        emit_rows(r, c, e)
        start = end


# --- the plain u64 path: first pass straight from the codes ------------------------------------

cdef cnp.ndarray kv_array(int64_t n):
    """A fresh numpy buffer for n 16-byte rows.

    numpy's allocator asks the kernel for transparent huge pages: with 4 KiB pages, faulting in
    fresh scratch costs more than the sort itself.
    """
    return empty1(2 * max(n, 1), cnp.NPY_INT64)


cdef inline kv_t* kv_ptr(cnp.ndarray a):
    return <kv_t*>cnp.PyArray_DATA(a)


cdef int64_t sort_plain_u64(const uint64_t* k, const int64_t* w, int64_t n, emit_t* e,
                            cnp.ndarray out) except -1:
    """Stable sort of rows 0..n-1 by the u64 codes ``k`` into ``out`` (n 16-byte rows), emitting
    through ``e`` (``e.p`` points into ``out``).

    With ``e.consolidate`` and rows and weights that fit 32 bits, the rows are ``kw_t`` and carry
    their weight; otherwise ``kv_t`` and weights are gathered by row. The first radix pass reads
    the codes straight from ``k`` and scatters rows into ``out``; each bucket is then finished
    and emitted in cache, with scratch the size of the largest bucket.
    """
    cdef int64_t i, c, start, nb = 0, maxc = 0, lo = 0, hi = 0
    cdef uint64_t k0 = k[0], diff = 0, mask = 0
    cdef int bits, db = 0, shift = 0
    cdef bint narrow = False
    cdef kv_t* tv = kv_ptr(out)
    cdef kw_t* tw = <kw_t*>tv
    cdef cnp.ndarray small = np.empty(2 * TOP_RADIX + TOP_RADIX * LINE_ROWS * 2 + 8,
                                      dtype=np.int64)
    cdef int64_t* cnt0 = <int64_t*>cnp.PyArray_DATA(small)
    cdef int64_t* bstart = cnt0 + TOP_RADIX
    cdef kv_t* wc = <kv_t*>((<size_t>(bstart + TOP_RADIX) + 63) & ~(<size_t>63))
    if n < STREAM_MIN:
        wc = NULL
    with nogil:
        if e.consolidate:
            for i in range(n):
                diff |= k[i] ^ k0
                lo = w[i] if w[i] < lo else lo
                hi = w[i] if w[i] > hi else hi
            narrow = n < (<int64_t>1 << 32) and lo >= -(<int64_t>1 << 31) \
                and hi < (<int64_t>1 << 31)
        else:
            for i in range(n):
                diff |= k[i] ^ k0
        bits = 64 - dbsp_clz64(diff)
        if bits > 0 and n > SMALL:
            db = digit_bits(n, TOP_DIGIT)
            if db > bits:
                db = bits
            shift = bits - db
            mask = (<uint64_t>1 << db) - 1
            nb = <int64_t>1 << db
            memset(cnt0, 0, nb * sizeof(int64_t))
            for i in range(n):
                cnt0[(k[i] >> shift) & mask] += 1
            start = 0
            for i in range(nb):
                c = cnt0[i]
                maxc = c if c > maxc else maxc
                cnt0[i] = start
                start += c
            if narrow:
                scatter_top(tw, k, w, n, shift, mask, nb, cnt0, bstart, <kw_t*>wc)
            else:
                scatter_top(tv, k, w, n, shift, mask, nb, cnt0, bstart, wc)
        else:
            # one bucket of all rows: bits == 0 (all codes equal) or few rows
            nb = 1
            cnt0[0] = n
            maxc = n if bits > 0 else 0
            shift = bits
            if narrow:
                for i in range(n):
                    make_row(&tw[i], k, w, i)
            else:
                for i in range(n):
                    make_row(&tv[i], k, w, i)
    cdef cnp.ndarray scratch = None
    cdef kv_t* a = NULL
    cdef int64_t* cnt = NULL
    if maxc > SMALL and shift > 0:
        scratch = kv_array(maxc + RADIX * MAX_LEVELS // 2)
        a = kv_ptr(scratch)
        cnt = <int64_t*>(a + maxc)
    with nogil:
        if narrow:
            finish_buckets(tw, <kw_t*>a, cnt0, nb, shift, cnt, e)
        else:
            finish_buckets(tv, a, cnt0, nb, shift, cnt, e)
        emit_close(e)
    return 0


# --- wide (k, v) u64 pairs: one 128-bit key ----------------------------------------------------

cdef inline u128_t pair_key(const uint64_t* k, const uint64_t* v, int64_t i, uint64_t mk, int bv,
                            uint64_t mv) noexcept nogil:
    return ((<u128_t>(k[i] & mk)) << bv) | (v[i] & mv)


cdef int64_t sort_pairs_u128(const uint64_t* k, const uint64_t* v, const int64_t* w, int64_t n,
                             int bk, int bv, emit_t* e, cnp.ndarray out) except -1:
    """Stable sort of rows 0..n-1 by (k, v) u64 pairs whose varying bits exceed 64 in total:
    ``kk_t`` rows keyed by ``k' << bv | v'`` (128 bits), first pass straight from k and v into
    ``out`` (n 32-byte rows), buckets finished and emitted in cache like the u64 path."""
    cdef int64_t i, c, start, nb, maxc = 0
    cdef uint64_t mk = (<uint64_t>1 << bk) - 1 if bk < 64 else <uint64_t>-1
    cdef uint64_t mv = (<uint64_t>1 << bv) - 1 if bv < 64 else <uint64_t>-1
    cdef uint64_t mask, d
    cdef int bits = bk + bv, db, shift
    cdef kk_t* t = <kk_t*>cnp.PyArray_DATA(out)
    cdef cnp.ndarray small = empty1(TOP_RADIX, cnp.NPY_INT64)
    cdef int64_t* cnt0 = <int64_t*>cnp.PyArray_DATA(small)
    db = digit_bits(n, TOP_DIGIT)
    shift = bits - db
    mask = (<uint64_t>1 << db) - 1
    nb = <int64_t>1 << db
    with nogil:
        memset(cnt0, 0, nb * sizeof(int64_t))
        for i in range(n):
            cnt0[<uint64_t>(pair_key(k, v, i, mk, bv, mv) >> shift) & mask] += 1
        start = 0
        for i in range(nb):
            c = cnt0[i]
            maxc = c if c > maxc else maxc
            cnt0[i] = start
            start += c
        for i in range(n):
            d = <uint64_t>(pair_key(k, v, i, mk, bv, mv) >> shift) & mask
            c = cnt0[d]
            t[c].key = pair_key(k, v, i, mk, bv, mv)
            t[c].idx = i
            t[c].w = w[i] if w != NULL else 0
            cnt0[d] = c + 1
    cdef cnp.ndarray scratch = empty1(4 * (maxc + 1) + RADIX * MAX_LEVELS, cnp.NPY_INT64)
    cdef kk_t* a = <kk_t*>cnp.PyArray_DATA(scratch)
    cdef int64_t* cnt = <int64_t*>(a + maxc + 1)
    with nogil:
        finish_buckets(t, a, cnt0, nb, shift, cnt, e)
        emit_close(e)
    return 0


# --- the general path: var codes, (k, v) pairs --------------------------------------------------

cdef cnp.ndarray sort_rows(const codes_t* k, const codes_t* v, int64_t n):
    """Stable sort of rows 0..n-1 by (k, v) (v may be NULL): a buffer of n sorted ``kv_t``
    whose ``key`` fields are scratch."""
    cdef cnp.ndarray out = kv_array(n)
    cdef cnp.ndarray scratch = kv_array(n + RADIX * MAX_LEVELS // 2)
    cdef kv_t* a = kv_ptr(out)
    cdef kv_t* t = kv_ptr(scratch)
    cdef int64_t* cnt = <int64_t*>(t + n)
    cdef int64_t i
    cdef kv_t* r
    with nogil:
        for i in range(n):
            a[i].idx = i
        if v != NULL:
            r = sort_by(v, a, t, n, cnt)
            if r != a:
                memcpy(a, r, n * sizeof(kv_t))
        r = sort_by(k, a, t, n, cnt)
        if r != a:
            memcpy(a, r, n * sizeof(kv_t))
    return out


cdef void emit_general(const kv_t* r, int64_t n, const codes_t* k, const codes_t* v,
                       emit_t* e) noexcept nogil:
    """Emit rows sorted by (k, v), comparing codes to find the groups."""
    cdef int64_t i = 0, o = 0, first, s
    if not e.consolidate:
        for i in range(n):
            e.p[i] = r[i].idx
        return
    while i < n:
        first = r[i].idx
        s = e.w[first]
        i += 1
        while i < n and codes_eq(k, first, k, r[i].idx) and (
                v == NULL or codes_eq(v, first, v, r[i].idx)):
            e.ovf |= dbsp_add_ovf(s, e.w[r[i].idx], &s)
            i += 1
        e.p[o] = first
        e.q[o] = s
        o += s != 0
    e.o = o


# --- entry points -------------------------------------------------------------------------------

cdef inline int varying_bits(const uint64_t* c, int64_t n) noexcept nogil:
    """Low bits on which the codes c[0:n] differ (the bits above are the same in every row)."""
    cdef uint64_t c0 = c[0], d = 0
    cdef int64_t i
    for i in range(n):
        d |= c[i] ^ c0
    return 64 - dbsp_clz64(d)


cdef object pack_pairs(const uint64_t* k, const uint64_t* v, int64_t n, int bk, int bv):
    """(k, v) u64 pairs as one u64 code ``k' << bv | v'`` (k', v': the ``bk``/``bv`` varying low
    bits; ``bk + bv <= 64``). The packed code orders and equates rows like the pair, so these
    (k, v) sorts take the plain u64 path."""
    cdef int64_t i
    cdef uint64_t mk = (<uint64_t>1 << bk) - 1 if bk < 64 else <uint64_t>-1
    cdef uint64_t mv = (<uint64_t>1 << bv) - 1 if bv < 64 else <uint64_t>-1
    cdef cnp.ndarray out = empty1(n, cnp.NPY_UINT64)
    cdef uint64_t* c = <uint64_t*>cnp.PyArray_DATA(out)
    with nogil:
        if bv == 64:                     # then k is constant
            for i in range(n):
                c[i] = v[i]
        else:
            for i in range(n):
                c[i] = ((k[i] & mk) << bv) | (v[i] & mv)
    return out


cdef int64_t check_len(object codes, int64_t n, str what) except -1:
    if len(codes) != n:
        raise ValueError(f"{what} has {len(codes)} rows, expected {n}")
    return 0


cdef object run(object kcodes, object vcodes, object weights, bint check=True):
    ko = as_codes(kcodes)
    cdef codes_t k = codes_view(ko)
    cdef codes_t v
    cdef const codes_t* vp = NULL
    cdef int64_t n = k.n
    cdef emit_t e
    cdef cnp.ndarray buf, wout = None
    cdef const kv_t* r
    vo = wo = None
    if vcodes is not None:
        vo = as_codes(vcodes)
        v = codes_view(vo)
        vp = &v
        check_len(vcodes, n, "vcodes")
    memset(&e, 0, sizeof(emit_t))
    e.consolidate = weights is not None
    if e.consolidate:
        wo = as_i64(weights)
        check_len(wo, n, "weights")
        e.w = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>wo)
    if n == 0:
        empty = empty1(0, cnp.NPY_INT64)
        return (empty, empty.copy()) if e.consolidate else empty
    if e.consolidate:
        wout = empty1(n, cnp.NPY_INT64)
        e.q = <int64_t*>cnp.PyArray_DATA(wout)
    packed = None
    cdef int bk = 0, bv = 0
    if k.u64 != NULL and vp != NULL and v.u64 != NULL:
        with nogil:
            bk = varying_bits(k.u64, n)
            bv = varying_bits(v.u64, n)
        if bk + bv <= 64:
            packed = pack_pairs(k.u64, v.u64, n, bk, bv)
    if bk + bv > 64 and DBSP_HAVE_U128 and n > SMALL:
        buf = empty1(4 * n, cnp.NPY_INT64)
        e.p = <int64_t*>cnp.PyArray_DATA(buf)
        sort_pairs_u128(k.u64, v.u64, e.w, n, bk, bv, &e, buf)
    elif packed is not None:
        buf = kv_array(n)
        e.p = <int64_t*>cnp.PyArray_DATA(buf)
        sort_plain_u64(<const uint64_t*>cnp.PyArray_DATA(<cnp.ndarray>packed), e.w, n, &e, buf)
        del packed
    elif k.u64 != NULL and vp == NULL:
        buf = kv_array(n)
        e.p = <int64_t*>cnp.PyArray_DATA(buf)
        sort_plain_u64(k.u64, e.w, n, &e, buf)
    else:
        buf = sort_rows(&k, vp, n)
        e.p = <int64_t*>cnp.PyArray_DATA(buf)
        r = kv_ptr(buf)
        with nogil:
            emit_general(r, n, &k, vp, &e)
    if not e.consolidate:
        return shrink(buf, n)
    if check and e.ovf:
        raise OverflowError("an int64 weight sum wrapped in sort_consolidate")
    return shrink(buf, e.o), shrink(wout, e.o)


def argsort(kcodes, vcodes=None):
    """Stable permutation (int64) that sorts rows by ``(kcodes, vcodes)``.

    ``kcodes``/``vcodes``: u64 code arrays or :class:`~dbsp.algebra.codes.VarCodes` (the two may
    differ in kind).
    """
    return run(kcodes, vcodes, None)


def sort_consolidate(kcodes, vcodes, weights, bint check=True):
    """Sort rows by ``(kcodes, vcodes)`` and sum the weights of equal rows, dropping zero sums.

    Returns ``(perm, w)`` (int64): ``perm[i]`` is the first input row (stable order) of the
    ``i``-th distinct row and ``w[i]`` its summed weight.
    """
    if weights is None:
        raise TypeError("sort_consolidate needs weights")
    return run(kcodes, vcodes, weights, check)
