"""Searching sorted code arrays: groups, bounds, intersection, join expansion, gather and concat
(native twins of the same functions in ``kernels_ref``).

Design
------
* ``lower_bound`` / ``upper_bound`` check in one pass whether the probes are sorted. Sorted
  probes (a cursor seeking forward, a merge join) gallop from the previous answer: cost
  ``O(log gap)`` per probe instead of ``O(log n)``, and memory is touched in order. Unsorted probes
  use a branchless binary search (u64; 32 probes descend together so that their cache misses
  overlap) or a ``memcmp`` binary search (var codes).
* ``intersect`` first cuts each side to the other's code range. When one side's part holds every
  u64 code of its range (dense ids, e.g. a primary key's index of auto-numbered rows; checked
  in O(1): its last code minus its first is its length minus one), every code of the other
  side in the range matches at its distance from the first code: no search and no cache miss
  in the dense side (the join + average workload's auction batches). Otherwise it
  walks both sorted arrays branchlessly when their sizes are alike (less than
  ``SEEK_RATIO`` times apart). When one side is 2 to 128 times longer (u64 codes), each code of
  the shorter one *seeks* through it: a block of 8 codes skipped while its last code is
  smaller, then the codes smaller than the probe counted in the block without a branch (one
  mispredicted branch per probe, codes read in order); further apart it gallops. A long side
  with a code sample (every 16th code, cached) is searched in the sample first (seeking when
  the probes are at most 128 sample blocks apart), then in a 16-code window of the long side,
  as a software pipeline: the window of the probe 16 places ahead is prefetched while the
  current one is searched, so that cache misses stay in flight. Replaying the ``intersect``
  calls of four steps of the join + average workload at 10M bids (``bench_join_avg_rate``),
  interleaved old/new in one process: 0.78-0.82 of the time; one 640K-code batch, cold,
  0.81-0.88.
* ``intersect_batches`` runs ``intersect``'s body (``intersect_core``) over every batch of a
  spine in one call: a batch whose range misses the probe's costs its four binary searches and
  no allocation, and none pays a Python call. Through a rank directory (the ids of one shard
  of a hash-sharded key: what every worker of two or more stores) each probe's popcount is the
  ``popcnt`` instruction when the CPU has it (``rank_place.h``, picked at run time).
* ``expand_pairs`` makes two passes: count the output, then fill it.
* ``take`` and ``concat`` on var codes compute the offsets first and copy the bytes with
  ``memcpy``.

Every loop runs without the GIL.
"""
cimport numpy as cnp
from _native.arrays cimport contig, contig_any, empty1, zeros1
from libc.stdint cimport uint8_t, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

from _native.types cimport var_t, codes_t
from _native.codes_cmp cimport codes_cmp, codes_eq, bytes_cmp
from _native.views cimport as_codes, as_i64, codes_view, is_var, shrink

import numpy as np

from dbsp.algebra.codes import VarCodes

cnp.import_array()

cdef enum:
    GALLOP_RATIO = 16    # intersect gallops when one side is this many times longer
    SPARSE_RATIO = 128   # ... and binary-searches the whole longer side when it is this much
    SPARSE_ROWS = 1 << 20  # longer and this long (smaller, it is cache-resident: galloping wins)
    SAMPLE_STRIDE = 16   # a code sample keeps every 16th code (see code_sample)
    BLOCK = 8            # codes a seek skips at a time (seek_u64)
    SEEK_RATIO = 2       # intersect seeks through a side at least this many times longer than
    SEEK_MAX_RATIO = 128  # the other and at most this many (beyond, it gallops)
    PREFETCH = 16        # probes whose windows are in flight together (intersect, sampled;
                         # a power of 2)
    RANK_SPREAD = 8      # code_rank: a code range at most this many times the codes (<= 2 bytes
                         # of index a code: a bit per code of the range, a count per 64)


cdef extern from *:
    void prefetch "__builtin_prefetch"(const void* p) noexcept nogil

cdef extern from "rank_place.h" nogil:
    int64_t dbsp_rank_place_sw(const uint64_t* ua, int64_t a1, int64_t na, const uint64_t* rk,
                               uint64_t rlo, int64_t rnw, int64_t* pa, int64_t* pb)
    int64_t dbsp_rank_place_hw(const uint64_t* ua, int64_t a1, int64_t na, const uint64_t* rk,
                               uint64_t rlo, int64_t rnw, int64_t* pa, int64_t* pb)
    int dbsp_popcnt_supported()


cdef inline uint64_t popcount64(uint64_t x) noexcept nogil:
    """Set bits of ``x``, branch-free (``__builtin_popcountll`` is a library call of ~50
    instructions on a build without ``-mpopcnt``, as a portable wheel is)."""
    x = x - ((x >> 1) & 0x5555555555555555ULL)
    x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL
    return (x * 0x0101010101010101ULL) >> 56


cdef inline int cmp_probe(const codes_t* s, int64_t i, const codes_t* p, int64_t j) noexcept nogil:
    """Compare sorted row i with probe j."""
    cdef uint64_t x, y
    if s.u64 != NULL:
        x = s.u64[i]
        y = p.u64[j]
        return (x > y) - (x < y)
    return codes_cmp(s, i, p, j)


cdef inline bint before(const codes_t* s, int64_t i, const codes_t* p, int64_t j,
                        bint upper) noexcept nogil:
    """Row i of s lies before the answer for probe j: s[i] < p (lower) or s[i] <= p (upper)."""
    cdef int c = cmp_probe(s, i, p, j)
    return c < 0 or (upper and c == 0)


# --- group_bounds -------------------------------------------------------------------------------

def group_bounds(kcodes):
    """Offsets (int64, g + 1) of the runs of equal codes in a sorted code array."""
    ko = as_codes(kcodes)
    cdef codes_t k = codes_view(ko)
    cdef int64_t n = k.n, i, o = 0
    cdef cnp.ndarray out = empty1(n + 1, cnp.NPY_INT64)
    cdef int64_t* b = <int64_t*>cnp.PyArray_DATA(out)
    cdef const uint64_t* u = k.u64
    with nogil:
        b[0] = 0
        o = 1
        if u != NULL:
            for i in range(1, n):
                b[o] = i                 # unconditional store, conditional advance
                o += u[i] != u[i - 1]
        else:
            for i in range(1, n):
                if not codes_eq(&k, i, &k, i - 1):
                    b[o] = i
                    o += 1
        if n > 0:
            b[o] = n
            o += 1
    return shrink(out, o)


# --- lower_bound / upper_bound ------------------------------------------------------------------

cdef inline int64_t bsearch_u64(const uint64_t* k, int64_t n, uint64_t x,
                                bint upper) noexcept nogil:
    """First i with k[i] >= x (or > x when upper); branchless halving."""
    cdef int64_t base = 0, half
    if n == 0:
        return 0
    while n > 1:
        half = n >> 1
        if upper:
            base = base + half if k[base + half - 1] <= x else base
        else:
            base = base + half if k[base + half - 1] < x else base
        n -= half
    if upper:
        return base + (k[base] <= x)
    return base + (k[base] < x)


cdef enum:
    LANES = 32           # unsorted probes searched together, level by level (their loads overlap)


cdef void bsearch_u64_many(const uint64_t* k, int64_t n, const uint64_t* x, int64_t m,
                           int64_t* out, bint upper) noexcept nogil:
    """Branchless binary search of m probes, LANES at a time.

    One probe's search is a chain of dependent cache misses (about log2(n) of them); the probes
    of a group descend the same number of levels together, so the loads of a level are
    independent of each other and the memory system serves them in parallel.
    """
    cdef int64_t base[LANES]
    cdef int64_t lo, g, cnt, ln, half
    lo = 0
    while lo < m:
        cnt = m - lo if m - lo < LANES else LANES
        if n == 0:
            for g in range(cnt):
                out[lo + g] = 0
            lo += cnt
            continue
        for g in range(cnt):
            base[g] = 0
        ln = n
        while ln > 1:
            half = ln >> 1
            if upper:
                for g in range(cnt):
                    base[g] = base[g] + half if k[base[g] + half - 1] <= x[lo + g] else base[g]
            else:
                for g in range(cnt):
                    base[g] = base[g] + half if k[base[g] + half - 1] < x[lo + g] else base[g]
            ln -= half
        for g in range(cnt):
            if upper:
                out[lo + g] = base[g] + (k[base[g]] <= x[lo + g])
            else:
                out[lo + g] = base[g] + (k[base[g]] < x[lo + g])
        lo += cnt


cdef inline int64_t gallop_u64(const uint64_t* k, int64_t lo, int64_t n, uint64_t x,
                               bint upper) noexcept nogil:
    """First i in [lo, n) with k[i] >= x (> x when upper), searching outwards from lo."""
    cdef int64_t step = 1, a = lo, b
    if upper:
        if a >= n or k[a] > x:
            return a
        while a + step < n and k[a + step] <= x:
            a += step
            step <<= 1
    else:
        if a >= n or k[a] >= x:
            return a
        while a + step < n and k[a + step] < x:
            a += step
            step <<= 1
    b = a + step if a + step < n else n
    # k[a] is before x; the answer is in (a, b]
    return a + 1 + bsearch_u64(k + a + 1, b - a - 1, x, upper)


cdef inline int64_t seek_u64(const uint64_t* k, int64_t j, int64_t n, uint64_t x,
                             bint upper) noexcept nogil:
    """First i in [j, n) with k[i] >= x (> x when upper), the answer expected a few blocks past
    ``j`` (the next of sorted probes a few codes apart): skip ``BLOCK`` codes at a time while
    the block's last code is before x (codes read in order, one mispredicted branch per probe),
    then count the block's codes before x without a branch. Galloping spends about
    ``2 log2(gap)`` dependent, often mispredicted compares on the same answer."""
    cdef int64_t t, c = 0
    if upper:
        while j + BLOCK <= n and k[j + BLOCK - 1] <= x:
            j += BLOCK
    else:
        while j + BLOCK <= n and k[j + BLOCK - 1] < x:
            j += BLOCK
    if j + BLOCK <= n:
        if upper:
            for t in range(BLOCK):
                c += k[j + t] <= x
        else:
            for t in range(BLOCK):
                c += k[j + t] < x
        return j + c
    if upper:
        for t in range(j, n):
            c += k[t] <= x
    else:
        for t in range(j, n):
            c += k[t] < x
    return j + c


cdef inline int64_t bsearch(const codes_t* s, int64_t lo, int64_t hi, const codes_t* p,
                            int64_t j, bint upper) noexcept nogil:
    """First i in [lo, hi) not before probe j (hi if none)."""
    cdef int64_t m
    while lo < hi:
        m = lo + ((hi - lo) >> 1)
        if before(s, m, p, j, upper):
            lo = m + 1
        else:
            hi = m
    return lo


cdef inline int64_t gallop(const codes_t* s, int64_t lo, int64_t n, const codes_t* p, int64_t j,
                           bint upper) noexcept nogil:
    """First i in [lo, n) not before probe j, searching outwards from lo."""
    cdef int64_t step = 1, a = lo, b
    if a >= n or not before(s, a, p, j, upper):
        return a
    # s[a] is before the probe: widen until s[a + step] is not
    while a + step < n and before(s, a + step, p, j, upper):
        a += step
        step <<= 1
    b = a + step if a + step < n else n
    return bsearch(s, a + 1, b, p, j, upper)


cdef inline int64_t sparse_search(const codes_t* s, int64_t lo, int64_t n, const codes_t* p,
                                  int64_t j, bint sparse) noexcept nogil:
    """First i in [lo, n) with s[i] >= probe j: galloping from ``lo``, or, when the probes are
    ``sparse`` (thousands of rows apart), a binary search over the whole of ``s``. Galloping
    touches about 2 log2(gap) rows, all far from the last probe's and so cold in the cache; the
    whole-range search visits the same top rows for every probe, which stay cached, and only
    about log2(gap) cold ones (measured: 2K probes into 2M rows 4.5 -> 3.7 ms, into 10M 6.6 ->
    4.6-5.1 ms; into 250K rows, which the cache holds, galloping stays faster: 0.7 vs 1.9 ms).
    On a 10M-row batch probed by 2K sorted codes this is what makes
    a probe's cost grow with the log of the history instead of twice that (issue 14: distinct
    at 1M vs 10M rows of history)."""
    cdef int64_t i
    if not sparse:
        return gallop(s, lo, n, p, j, False)
    i = bsearch(s, 0, n, p, j, False)
    return i if i > lo else lo


cdef bint probes_sorted(const codes_t* p) noexcept nogil:
    cdef int64_t i
    if p.u64 != NULL:
        for i in range(1, p.n):
            if p.u64[i] < p.u64[i - 1]:
                return False
        return True
    for i in range(1, p.n):
        if codes_cmp(p, i, p, i - 1) < 0:
            return False
    return True


cdef tuple probe_views(object sorted_codes, object probes, codes_t* s, codes_t* p):
    """Borrow C views of ``sorted_codes`` into ``s`` and of ``probes`` into ``p`` (both u64 or
    both var codes, else TypeError); returns the objects the views point into, which the
    caller must hold as long as it uses them."""
    owners = (as_codes(sorted_codes), as_codes(probes))
    s[0] = codes_view(owners[0])
    p[0] = codes_view(owners[1])
    if (s.u64 == NULL) != (p.u64 == NULL):
        raise TypeError("sorted_codes and probes must both be u64 or both var codes")
    return owners


cdef object bounds(object sorted_codes, object probes, bint upper):
    cdef codes_t s, p
    owners = probe_views(sorted_codes, probes, &s, &p)
    cdef int64_t n = s.n, m = p.n, j, pos = 0
    cdef cnp.ndarray out = empty1(m, cnp.NPY_INT64)
    cdef int64_t* r = <int64_t*>cnp.PyArray_DATA(out)
    with nogil:
        if probes_sorted(&p):
            if s.u64 != NULL:
                for j in range(m):
                    pos = gallop_u64(s.u64, pos, n, p.u64[j], upper)
                    r[j] = pos
            else:
                for j in range(m):
                    pos = gallop(&s, pos, n, &p, j, upper)
                    r[j] = pos
        elif s.u64 != NULL:
            bsearch_u64_many(s.u64, n, p.u64, m, r, upper)
        else:
            for j in range(m):
                r[j] = bsearch(&s, 0, n, &p, j, upper)
    return out


def lower_bound(sorted_codes, probes):
    """For each probe, the first position in ``sorted_codes`` whose code is ``>=`` the probe."""
    return bounds(sorted_codes, probes, False)


def upper_bound(sorted_codes, probes):
    """For each probe, the first position in ``sorted_codes`` whose code is ``>`` the probe."""
    return bounds(sorted_codes, probes, True)


def range_lower_bound(sorted_codes, lo, hi, probes):
    """For each ``i``: the first position in ``[lo[i], hi[i])`` of ``sorted_codes`` whose code
    is ``>=`` probe ``i`` (``hi[i]`` if none); each range sorted. A probe in the same range as
    the one before it and not smaller gallops from that one's answer (the ``(key, value)`` pairs
    of a delta probe their keys' value ranges in order), any other searches its whole range."""
    cdef codes_t s, p
    owners = probe_views(sorted_codes, probes, &s, &p)
    lo_a = contig(lo, cnp.NPY_INT64)
    hi_a = contig(hi, cnp.NPY_INT64)
    cdef const int64_t[::1] L = lo_a
    cdef const int64_t[::1] H = hi_a
    cdef int64_t m = p.n, j, a, b, pos = 0
    if L.shape[0] != m or H.shape[0] != m:
        raise ValueError("lo, hi and probes must have one entry per probe")
    for j in range(m):
        if L[j] < 0 or H[j] > s.n or L[j] > H[j]:
            raise IndexError(f"range {j} [{L[j]}, {H[j]}) outside 0..{s.n}")
    cdef cnp.ndarray out = empty1(m, cnp.NPY_INT64)
    cdef int64_t* r = <int64_t*>cnp.PyArray_DATA(out)
    with nogil:
        for j in range(m):
            a = L[j]
            b = H[j]
            if j > 0 and a == L[j - 1] and b == H[j - 1] and cmp_probe(&p, j, &p, j - 1) >= 0:
                pos = gallop(&s, pos, b, &p, j, False)
            elif s.u64 != NULL:
                pos = a + bsearch_u64(s.u64 + a, b - a, p.u64[j], False)
            else:
                pos = bsearch(&s, a, b, &p, j, False)
            r[j] = pos
    return out


# --- intersect ----------------------------------------------------------------------------------

def code_sample(codes):
    """Every ``SAMPLE_STRIDE``-th code of a sorted u64 code array (a copy, 1/16 of its size),
    or None for var codes: the index :func:`intersect` searches first when the array is the
    long side. A batch of a million keys (8 MB of codes) is larger than the cache; its sample
    (512 KB) stays cached, so each probe then misses the cache once (its 16-code window)
    instead of on most steps of a gallop."""
    co = as_codes(codes)
    if is_var(co):
        return None
    return np.ascontiguousarray(co[::SAMPLE_STRIDE])


def code_runs(codes, int64_t max_runs=-1):
    """Where the runs of consecutive codes of a sorted distinct u64 code array start: int64
    positions ``starts`` (``starts[0] == 0``, the last entry ``n``; run ``r`` is
    ``codes[starts[r]:starts[r + 1]]``, its codes ``codes[starts[r]] + 0, 1, ...``), or None for
    var codes, no codes, or more than ``max_runs`` runs (when not negative: the scan stops
    there and allocates no more): the index :func:`intersect` maps a code to its position
    with, without reading the array (a batch of ids numbered in order is a few runs)."""
    co = as_codes(codes)
    if is_var(co):
        return None
    cdef codes_t k = codes_view(co)
    cdef int64_t n = k.n, i, o = 1, cap
    if n == 0:
        return None
    cap = n if max_runs < 0 or max_runs > n else max_runs
    if cap < 1:  # (n codes are at least one run)
        return None
    cdef const uint64_t* u = k.u64
    cdef cnp.ndarray out = empty1(cap + 1, cnp.NPY_INT64)
    cdef int64_t* r = <int64_t*>cnp.PyArray_DATA(out)
    with nogil:
        r[0] = 0
        for i in range(1, n):
            if u[i] != u[i - 1] + 1:
                if o == cap:
                    o = -1
                    break
                r[o] = i
                o += 1
        if o > 0:
            r[o] = n
    if o < 0:
        return None
    return shrink(out, o + 1)


def code_rank(codes, int64_t max_spread=RANK_SPREAD):
    """A rank directory of a sorted distinct u64 code array whose codes are a dense part of
    their range (the ids of one shard of a hash-sharded id key: every W-th id, at random): a
    uint64 array ``[lo, nw, bits[0..nw-1], counts[0..nw-1]]`` where bit ``d`` of the bitmap is
    set when ``lo + d`` is a code and ``counts[w]`` is the number of codes below ``lo + 64 w``.
    The position of code ``x`` is then ``counts[w] + popcount(bits[w] & (2^r - 1))`` (``d =
    x - lo = 64 w + r``): :func:`intersect` places each probe without reading the codes. None for
    var codes, no codes, a range more than ``max_spread`` times the number of codes, or every
    code of the range (intersect's dense case places those without an index)."""
    co = as_codes(codes)
    if is_var(co):
        return None
    cdef codes_t k = codes_view(co)
    cdef int64_t n = k.n, nw, i
    if n == 0:
        return None
    cdef const uint64_t* u = k.u64
    cdef uint64_t span = u[n - 1] - u[0], d
    if span / <uint64_t>max(max_spread, 1) >= <uint64_t>n or span == <uint64_t>(n - 1):
        return None  # (too sparse; or every code of the range: intersect's dense case)
    nw = <int64_t>(span >> 6) + 1
    cdef cnp.ndarray out = zeros1(2 + 2 * nw, cnp.NPY_UINT64)
    cdef uint64_t* r = <uint64_t*>cnp.PyArray_DATA(out)
    cdef uint64_t* bits = r + 2
    cdef uint64_t* cnt = r + 2 + nw
    cdef uint64_t c = 0
    r[0] = u[0]
    r[1] = <uint64_t>nw
    with nogil:
        for i in range(n):
            d = u[i] - u[0]
            bits[d >> 6] |= (<uint64_t>1) << (d & 63)
        for i in range(nw):
            cnt[i] = c
            c += popcount64(bits[i])
    return out


cdef struct aux_t:
    # the optional indexes of intersect's b side (borrowed from their arrays)
    const uint64_t* us   # code_sample(b), or NULL
    int64_t ns
    const int64_t* rs    # code_runs(b), or NULL
    int64_t nr
    const uint64_t* rk   # code_rank(b), or NULL
    int64_t rnw


cdef object aux_views(const codes_t* kb, object b_sample, object b_runs, object b_rank,
                      aux_t* x):
    """Check ``b``'s optional indexes and borrow them into ``x``; returns the arrays that own
    them (keep them referenced while ``x`` is used)."""
    x.us = NULL
    x.ns = 0
    x.rs = NULL
    x.nr = 0
    x.rk = NULL
    x.rnw = 0
    if b_sample is None and b_runs is None and b_rank is None:
        return None
    so = ro = ko = None
    if b_sample is not None:
        so = as_codes(b_sample)
        if is_var(so) or kb.u64 == NULL:
            raise TypeError("intersect: a code sample needs u64 codes")
        x.ns = (<cnp.ndarray>so).shape[0]
        if x.ns != (kb.n + SAMPLE_STRIDE - 1) // SAMPLE_STRIDE:
            raise ValueError(f"intersect: b_sample has {x.ns} codes, not every "
                             f"{SAMPLE_STRIDE}th of b's {kb.n}")
        x.us = <const uint64_t*>cnp.PyArray_DATA(<cnp.ndarray>so)
    if b_runs is not None:
        ro = contig(b_runs, cnp.NPY_INT64)
        if kb.u64 == NULL:
            raise TypeError("intersect: code runs need u64 codes")
        x.nr = (<cnp.ndarray>ro).shape[0] - 1
        x.rs = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>ro)
        if x.nr < 1 or x.rs[0] != 0 or x.rs[x.nr] != kb.n:
            raise ValueError(f"intersect: b_runs do not describe the runs of b's {kb.n} codes")
    if b_rank is not None:
        ko = contig(b_rank, cnp.NPY_UINT64)
        if kb.u64 == NULL:
            raise TypeError("intersect: a rank directory needs u64 codes")
        x.rk = <const uint64_t*>cnp.PyArray_DATA(<cnp.ndarray>ko)
        if (<cnp.ndarray>ko).shape[0] < 2 or kb.n == 0 or x.rk[0] != kb.u64[0] \
                or (<cnp.ndarray>ko).shape[0] != 2 + 2 * <int64_t>x.rk[1] \
                or ((kb.u64[kb.n - 1] - x.rk[0]) >> 6) >= x.rk[1]:
            raise ValueError(f"intersect: b_rank is not the rank directory of b's {kb.n} codes")
        x.rnw = <int64_t>x.rk[1]
    return (so, ro, ko)


#: whether intersect's rank loop uses the popcnt instruction (rank_place.h): the CPU has it
cdef bint has_popcnt = dbsp_popcnt_supported()


def set_popcnt(bint on):
    """Use the hardware popcount in intersect's rank loop when the CPU has it (``on``), else the
    portable one (for comparisons and tests); returns whether the hardware one is in use."""
    global has_popcnt
    has_popcnt = on and dbsp_popcnt_supported()
    return has_popcnt


cdef int64_t intersect_core(const codes_t* ka, const codes_t* kb, const aux_t* x,
                            int64_t* pa, int64_t* pb) noexcept nogil:
    """The body of :func:`intersect`: the matches of ``ka`` and ``kb`` into ``pa`` / ``pb``
    (room for ``min(na, nb) + 1`` entries); returns their number."""
    cdef const uint64_t* us = x.us
    cdef int64_t ns = x.ns, s = 0, w0, w1, h
    cdef bint near
    cdef int64_t wins[PREFETCH]
    cdef const int64_t* rs = x.rs
    cdef int64_t nr = x.nr, r = 0
    cdef const uint64_t* rk = x.rk
    cdef int64_t rnw = x.rnw
    cdef int64_t na = ka.n, nb = kb.n, i = 0, j = 0, o = 0, m = min(na, nb), a0, b0, a1, b1
    cdef const uint64_t* ua = ka.u64
    cdef const uint64_t* ub = kb.u64
    cdef uint64_t x_, y
    cdef int c
    if m > 0:
        # the overlap of the two code ranges: a[i:na] and b[j:nb]
        i = bsearch(ka, 0, na, kb, 0, False)
        na = bsearch(ka, i, na, kb, nb - 1, True)
        j = bsearch(kb, 0, nb, ka, i, False) if i < na else nb
        nb = bsearch(kb, j, nb, ka, na - 1, True) if i < na else nb
    a0, b0 = na - i, nb - j
    a1, b1 = i, j
    if a0 <= 0 or b0 <= 0:
        pass
    elif ua != NULL and ub[nb - 1] - ub[j] == <uint64_t>(b0 - 1):
        # b's overlap holds every code of its range (dense ids: a primary key's index):
        # every code of a in that range is there, at its distance from the first
        x_, y = ub[b1], ub[nb - 1]
        for i in range(a1, na):
            pa[o] = i
            pb[o] = b1 + <int64_t>(ua[i] - x_)
            o += (ua[i] >= x_) & (ua[i] <= y)
    elif ua != NULL and ua[na - 1] - ua[i] == <uint64_t>(a0 - 1):
        x_, y = ua[a1], ua[na - 1]
        for j in range(b1, nb):  # the same, a dense
            pa[o] = a1 + <int64_t>(ub[j] - x_)
            pb[o] = j
            o += (ub[j] >= x_) & (ub[j] <= y)
    elif rk != NULL and a0 <= GALLOP_RATIO * b0:
        # b a dense part of its range: each code of a (all inside b's range, see the cut
        # above) placed through the rank directory, b never read
        # (rank_place.h: the same loop with a hardware popcount when the CPU has one)
        if has_popcnt:
            o = dbsp_rank_place_hw(ua, a1, na, rk, rk[0], rnw, pa, pb)
        else:
            o = dbsp_rank_place_sw(ua, a1, na, rk, rk[0], rnw, pa, pb)
    elif rs != NULL and nr <= 4 * a0 + 64:
        # b is a few runs of consecutive codes: walk the runs in order beside the codes of
        # a; a code inside its run is at its distance from the run's first code
        for i in range(a1, na):
            x_ = ua[i]
            while r < nr and ub[rs[r + 1] - 1] < x_:
                r += 1
            if r >= nr:
                break
            y = ub[rs[r]]
            pa[o] = i
            pb[o] = rs[r] + <int64_t>(x_ - y)
            o += x_ >= y
    elif ua != NULL and (us == NULL or b0 <= GALLOP_RATIO * a0) and \
            SEEK_RATIO * a0 <= b0 <= SEEK_MAX_RATIO * a0:
        # b a few codes longer per code of a (and no sample to search first): seek
        # through b for each code of a
        for i in range(a1, na):
            x_ = ua[i]
            j = seek_u64(ub, j, nb, x_, False)
            if j >= nb:
                break
            pa[o] = i
            pb[o] = j
            o += ub[j] == x_
    elif ua != NULL and SEEK_RATIO * b0 <= a0 <= SEEK_MAX_RATIO * b0:
        for j in range(b1, nb):  # the same, a the longer side
            y = ub[j]
            i = seek_u64(ua, i, na, y, False)
            if i >= na:
                break
            pa[o] = i
            pb[o] = j
            o += ua[i] == y
    elif a0 > GALLOP_RATIO * b0:
        # gallop through a for each code of b (see below for the sparse case)
        for j in range(b1, nb):
            i = sparse_search(ka, i, na, kb, j,
                              a0 > SPARSE_RATIO * b0 and a0 >= SPARSE_ROWS)
            if i >= na:
                break
            if cmp_probe(ka, i, kb, j) == 0:
                pa[o] = i
                pb[o] = j
                o += 1
    elif b0 > GALLOP_RATIO * a0 and us != NULL:
        # each code of a in the (cached) sample, then in its window of b, as a software
        # pipeline: the window of the code PREFETCH places ahead is found in the sample and
        # prefetched while the current code's window is searched, so that about PREFETCH
        # cache misses are always in flight (placing a group, then searching it, left
        # none in flight while the next group was placed)
        i = a1
        h = a1  # the next code of a to place
        near = b0 <= SEEK_MAX_RATIO * SAMPLE_STRIDE * a0  # a few sample blocks apart
        while i < na:
            while h < na and h < i + PREFETCH:
                if near:  # us[s - 1] <= x_ < us[s]
                    s = seek_u64(us, s, ns, ua[h], True)
                else:
                    s = gallop_u64(us, s, ns, ua[h], True)
                w0 = (s - 1) * SAMPLE_STRIDE
                wins[h & (PREFETCH - 1)] = w0
                if s > 0:
                    prefetch(ub + w0)
                    prefetch(ub + (w0 + SAMPLE_STRIDE - 1 if
                                   w0 + SAMPLE_STRIDE <= kb.n else kb.n - 1))
                h += 1
            w0 = wins[i & (PREFETCH - 1)]
            if w0 >= 0:
                x_ = ua[i]
                w1 = w0 + SAMPLE_STRIDE if w0 + SAMPLE_STRIDE < kb.n else kb.n
                j = w0 + bsearch_u64(ub + w0, w1 - w0, x_, False)
                if j < w1 and ub[j] == x_:
                    pa[o] = i
                    pb[o] = j
                    o += 1
            i += 1
    elif b0 > GALLOP_RATIO * a0:
        for i in range(a1, na):
            j = sparse_search(kb, j, nb, ka, i,
                              b0 > SPARSE_RATIO * a0 and b0 >= SPARSE_ROWS)
            if j >= nb:
                break
            if cmp_probe(kb, j, ka, i) == 0:
                pa[o] = i
                pb[o] = j
                o += 1
    elif ua != NULL:
        while i < na and j < nb:
            x_ = ua[i]
            y = ub[j]
            pa[o] = i
            pb[o] = j
            o += x_ == y
            i += x_ <= y
            j += y <= x_
    else:
        while i < na and j < nb:
            c = codes_cmp(ka, i, kb, j)
            if c == 0:
                pa[o] = i
                pb[o] = j
                o += 1
            i += c <= 0
            j += c >= 0
    return o


def intersect(a, b, b_sample=None, b_runs=None, b_rank=None):
    """Positions of equal codes in two sorted arrays of *distinct* codes: ``(ai, bi)``,
    ascending.

    Each side is first cut to the other's code range (four binary searches): a batch of a
    trace whose keys grow with time (ids, event times) covers a narrow range, and only the
    probes inside it are walked; the algorithm (merge walk or gallop) is then chosen by the
    sizes of the overlap. ``b_sample``: ``code_sample(b)`` (u64 codes), or None; when ``b``
    is much the longer side each code of ``a`` is first placed in the sample (galloping in
    the cache), then searched in its window of ``SAMPLE_STRIDE`` codes of ``b``. ``b_runs``:
    ``code_runs(b)`` (u64 codes), or None; when ``b`` is a few runs of consecutive codes (at
    most 4 per code of ``a`` in the overlap, plus 64), each code of ``a`` is placed in its run
    (the runs walked in order) and its position computed: ``b`` is read at run ends only.
    ``b_rank``: ``code_rank(b)``, or None; when ``b`` is not much the shorter side each code of
    ``a`` is placed through it (a bit test and a popcount, no search: the ids of a hash shard,
    which the dense case above no longer covers)."""
    ao = as_codes(a)
    bo = as_codes(b)
    cdef codes_t ka = codes_view(ao)
    cdef codes_t kb = codes_view(bo)
    if (ka.u64 == NULL) != (kb.u64 == NULL):
        raise TypeError("intersect needs two u64 or two var code arrays")
    cdef aux_t x
    keep = aux_views(&kb, b_sample, b_runs, b_rank, &x)
    cdef int64_t m = min(ka.n, kb.n), o
    cdef cnp.ndarray ai = empty1(m + 1, cnp.NPY_INT64)  # (+1: room for an unconditional
    cdef cnp.ndarray bi = empty1(m + 1, cnp.NPY_INT64)  # store after the last match)
    cdef int64_t* pa = <int64_t*>cnp.PyArray_DATA(ai)
    cdef int64_t* pb = <int64_t*>cnp.PyArray_DATA(bi)
    with nogil:
        o = intersect_core(&ka, &kb, &x, pa, pb)
    return shrink(ai, o), shrink(bi, o)


def intersect_batches(a, parts):
    """:func:`intersect` of the sorted distinct codes ``a`` with each of several sorted code
    arrays in one call (the batches of a spine probed with one delta's keys): ``parts`` a
    sequence of ``(b, b_sample, b_runs, b_rank)`` (:func:`intersect`'s arguments); returns the
    list of ``(part number, ai, bi)`` of the parts with matches, in order.

    One call for the whole spine: a part whose range misses ``a``'s (an older batch of a trace
    whose keys grow with time) costs its four binary searches and no allocation, and no part
    pays a Python call, an argument parse and two arrays of its own."""
    ao = as_codes(a)
    cdef codes_t ka = codes_view(ao)
    cdef codes_t kb
    cdef aux_t x
    cdef int64_t na = ka.n, o, m, k = 0
    out = []
    if na == 0:
        return out
    # the outputs of a part, sized for its matches (+1: the unconditional store after the
    # last); a part without matches leaves them to the next part (no allocation of its own)
    cdef cnp.ndarray ai = None, bi = None
    cdef int64_t* pa = NULL
    cdef int64_t* pb = NULL
    for part in parts:
        b, b_sample, b_runs, b_rank = part
        bo = as_codes(b)
        kb = codes_view(bo)
        if (ka.u64 == NULL) != (kb.u64 == NULL):
            raise TypeError("intersect needs two u64 or two var code arrays")
        keep = aux_views(&kb, b_sample, b_runs, b_rank, &x)
        m = min(na, kb.n)
        if ai is None or ai.shape[0] < m + 1:
            ai = empty1(m + 1, cnp.NPY_INT64)
            bi = empty1(m + 1, cnp.NPY_INT64)
            pa = <int64_t*>cnp.PyArray_DATA(ai)
            pb = <int64_t*>cnp.PyArray_DATA(bi)
        with nogil:
            o = intersect_core(&ka, &kb, &x, pa, pb)
        if o:
            out.append((k, shrink(ai, o), shrink(bi, o)))
            ai = bi = None
        k += 1
    return out


# --- expand_pairs -------------------------------------------------------------------------------

def expand_pairs(a_offsets, ai, b_offsets, bi):
    """Cross product of the value ranges of matched keys.

    For each match ``m`` (key ``ai[m]`` of A with key ``bi[m]`` of B), emit every pair of value
    rows ``(x, y)`` with ``x`` in ``a_offsets[ai[m]]..a_offsets[ai[m]+1]`` and ``y`` likewise in
    B, ``x``-major. Returns ``(xs, ys)`` (int64).
    """
    cdef cnp.ndarray aoff = as_i64(a_offsets), boff = as_i64(b_offsets)
    cdef cnp.ndarray am = as_i64(ai), bm = as_i64(bi)
    cdef int64_t nm = am.shape[0], nka = aoff.shape[0] - 1, nkb = boff.shape[0] - 1
    if bm.shape[0] != nm:
        raise ValueError("ai and bi must have the same length")
    cdef const int64_t* oa = <const int64_t*>cnp.PyArray_DATA(aoff)
    cdef const int64_t* ob = <const int64_t*>cnp.PyArray_DATA(boff)
    cdef const int64_t* ma = <const int64_t*>cnp.PyArray_DATA(am)
    cdef const int64_t* mb = <const int64_t*>cnp.PyArray_DATA(bm)
    cdef int64_t m, x, y, la, lb, total = 0, o = 0, x0, x1, y0, y1
    cdef bint bad = False
    with nogil:
        for m in range(nm):
            if ma[m] < 0 or ma[m] >= nka or mb[m] < 0 or mb[m] >= nkb:
                bad = True
                break
            la = oa[ma[m] + 1] - oa[ma[m]]
            lb = ob[mb[m] + 1] - ob[mb[m]]
            if la < 0 or lb < 0:
                bad = True
                break
            total += la * lb
    if bad:
        raise IndexError("expand_pairs: a match indexes outside the offsets, or offsets decrease")
    cdef cnp.ndarray xs = empty1(total, cnp.NPY_INT64)
    cdef cnp.ndarray ys = empty1(total, cnp.NPY_INT64)
    cdef int64_t* px = <int64_t*>cnp.PyArray_DATA(xs)
    cdef int64_t* py = <int64_t*>cnp.PyArray_DATA(ys)
    with nogil:
        for m in range(nm):
            x0 = oa[ma[m]]
            x1 = oa[ma[m] + 1]
            y0 = ob[mb[m]]
            y1 = ob[mb[m] + 1]
            for x in range(x0, x1):
                for y in range(y0, y1):
                    px[o] = x
                    py[o] = y
                    o += 1
    return xs, ys


# --- take / concat ------------------------------------------------------------------------------

def take(codes, idx):
    """Rows ``idx`` of a code array (negative indices count from the end, as in numpy)."""
    co = as_codes(codes)
    cdef codes_t c = codes_view(co)
    cdef cnp.ndarray ix = as_i64(idx)
    if ix.ndim != 1:
        raise ValueError("idx must be 1-d")
    cdef int64_t n = c.n, m = ix.shape[0], i, t, total = 0
    cdef const int64_t* p = <const int64_t*>cnp.PyArray_DATA(ix)
    cdef bint bad = False
    cdef cnp.ndarray out, offs, data
    cdef uint64_t* ou
    cdef int64_t* oo
    cdef uint8_t* od
    cdef const int64_t* so = c.var.offsets
    cdef const uint8_t* sd = c.var.data
    if c.u64 != NULL:
        out = empty1(m, cnp.NPY_UINT64)
        ou = <uint64_t*>cnp.PyArray_DATA(out)
        with nogil:
            for i in range(m):
                t = p[i]
                if t < 0:
                    t += n
                if t < 0 or t >= n:
                    bad = True
                    break
                ou[i] = c.u64[t]
        if bad:
            raise IndexError(f"take: index out of range for {n} rows")
        return out
    offs = empty1(m + 1, cnp.NPY_INT64)
    oo = <int64_t*>cnp.PyArray_DATA(offs)
    with nogil:
        oo[0] = 0
        for i in range(m):
            t = p[i]
            if t < 0:
                t += n
            if t < 0 or t >= n:
                bad = True
                break
            total += so[t + 1] - so[t]
            oo[i + 1] = total
    if bad:
        raise IndexError(f"take: index out of range for {n} rows")
    data = empty1(total, cnp.NPY_UINT8)
    od = <uint8_t*>cnp.PyArray_DATA(data)
    with nogil:
        for i in range(m):
            t = p[i]
            if t < 0:
                t += n
            memcpy(od + oo[i], sd + so[t], <size_t>(oo[i + 1] - oo[i]))
    return VarCodes(offs, data)


cdef inline int64_t run_of(const int64_t* starts, int64_t k, int64_t t,
                           int64_t r) noexcept nogil:
    """The run holding row ``t`` of a concatenation whose run ``i`` starts at ``starts[i]``
    (``starts[k]``: the total; ``0 <= t < total``): ``r`` again if it holds ``t`` (rows taken in
    order stay in their run), else a binary search of the starts, skipping empty runs."""
    cdef int64_t lo, hi, mid
    if starts[r] <= t < starts[r + 1]:
        return r
    lo = 0
    hi = k
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if starts[mid] <= t:
            lo = mid
        else:
            hi = mid
    while starts[lo + 1] <= t:
        lo += 1
    return lo


cdef inline int64_t run_row(const int64_t* starts, int64_t k, int64_t total, int64_t t,
                            int64_t* r) noexcept nogil:
    """Position ``t`` of a concatenation of ``k`` runs (see :func:`run_of`; ``total``: its
    rows) as a row of its run: the run in ``r[0]`` (on entry the previous position's run), the
    row returned; -1 when ``t`` is outside ``0..total-1``. The head of the gather loops of
    :func:`take_runs` and :func:`take_var_runs`."""
    cdef int64_t j, q
    if t < 0 or t >= total:
        return -1
    if k <= 8:  # a few runs (a gather of W workers' parts): a branchless count of the starts
        # at or below t; the search mispredicts at every change of run, which a merge's row
        # index makes at about every other row (an empty run shares its start with the next:
        # the last one counts)
        q = 0
        for j in range(1, k):
            q += starts[j] <= t
        r[0] = q
    else:
        r[0] = run_of(starts, k, t, r[0])
    return t - starts[r[0]]


def take_runs(parts, idx):
    """``np.concatenate(parts)[idx]`` without the concatenation: ``parts`` are 1-d numpy arrays
    of one fixed-width dtype (a merge's runs: their codes, or a fixed-width column of each), ``idx``
    int64 positions in their concatenation (a merge's row index, in any order). A merge gathers
    its output this way from its inputs, without a concatenated copy of them beside the output.
    ``parts`` may also be :class:`VarCodes` (all of them): rows ``idx`` of their concatenation,
    gathered by :func:`take_var_runs`."""
    parts = list(parts)
    if not parts:
        raise ValueError("take_runs of no arrays")
    if isinstance(parts[0], VarCodes):
        if not all(isinstance(q, VarCodes) for q in parts):
            raise TypeError("take_runs of u64 and var code arrays")
        offs, data = take_var_runs([(q.offsets, q.data) for q in parts], idx)
        return VarCodes(offs, data)
    parts = [np.ascontiguousarray(q) for q in parts]
    dt = parts[0].dtype
    cdef cnp.ndarray ix = as_i64(idx)
    if ix.ndim != 1:
        raise ValueError("idx must be 1-d")
    cdef int64_t k = len(parts), r, m = ix.shape[0], i, t, total = 0
    cdef Py_ssize_t w = dt.itemsize
    for q in parts:
        if q.dtype != dt or q.ndim != 1:
            raise TypeError("take_runs: parts of one dtype, 1-d")
    cdef cnp.ndarray starts_a = empty1(k + 1, cnp.NPY_INT64)
    cdef cnp.ndarray base_a = empty1(k, cnp.NPY_UINTP)
    cdef int64_t* starts = <int64_t*>cnp.PyArray_DATA(starts_a)
    cdef size_t* base = <size_t*>cnp.PyArray_DATA(base_a)
    cdef cnp.ndarray q_
    for r in range(k):
        q_ = parts[r]
        starts[r] = total
        base[r] = <size_t>cnp.PyArray_DATA(q_)
        total += q_.shape[0]
    starts[k] = total
    cdef cnp.ndarray out = np.empty(m, dtype=dt)
    cdef char* o = <char*>cnp.PyArray_DATA(out)
    cdef const int64_t* p = <const int64_t*>cnp.PyArray_DATA(ix)
    cdef bint bad = False
    with nogil:
        r = 0
        for i in range(m):
            t = run_row(starts, k, total, p[i], &r)
            if t < 0:
                bad = True
                break
            if w == 8:
                (<uint64_t*>o)[i] = (<const uint64_t*>base[r])[t]
            elif w == 4:
                (<uint32_t*>o)[i] = (<const uint32_t*>base[r])[t]
            else:
                memcpy(o + i * w, <const char*>base[r] + t * w, w)
    if bad:
        raise IndexError(f"take_runs: index out of range for {total} rows")
    return out


cdef inline int64_t _off(const void* o, bint wide, int64_t i) noexcept nogil:
    return (<const int64_t*>o)[i] if wide else <int64_t>(<const int32_t*>o)[i]


def take_var_runs(parts, idx):
    """Rows ``idx`` of the concatenation of variable-length runs, without the concatenation.
    ``parts``: ``(offsets, data)`` pairs in Arrow binary layout (row ``i`` of a run is
    ``data[offsets[i]:offsets[i + 1]]``; ``offsets`` int32 or int64, the same for every run, may
    start above 0 for a slice; ``data`` uint8); ``idx``: int64 positions in the concatenation.
    Returns ``(offsets, data)`` of the rows taken, offsets from 0 and of the runs' offset dtype
    (int32 offsets past 2**31 - 1 bytes raise OverflowError). Two passes: the offsets, then one
    ``memcpy`` per row. A merge gathers its string columns and var codes this way."""
    parts = list(parts)
    if not parts:
        raise ValueError("take_var_runs of no runs")
    cdef cnp.ndarray ix = as_i64(idx)
    if ix.ndim != 1:
        raise ValueError("idx must be 1-d")
    odt = np.asarray(parts[0][0]).dtype
    if odt != np.int32 and odt != np.int64:
        raise TypeError(f"take_var_runs: offsets must be int32 or int64, not {odt}")
    cdef bint wide = odt == np.int64
    cdef int64_t k = len(parts), r, m = ix.shape[0], i, t, total = 0, nbytes = 0, n
    cdef cnp.ndarray starts_a = empty1(k + 1, cnp.NPY_INT64)
    cdef cnp.ndarray offp_a = empty1(k, cnp.NPY_UINTP)
    cdef cnp.ndarray datp_a = empty1(k, cnp.NPY_UINTP)
    cdef int64_t* starts = <int64_t*>cnp.PyArray_DATA(starts_a)
    cdef size_t* offp = <size_t*>cnp.PyArray_DATA(offp_a)
    cdef size_t* datp = <size_t*>cnp.PyArray_DATA(datp_a)
    cdef cnp.ndarray q_o, q_d
    keep = []
    for r in range(k):
        o, d = parts[r]
        q_o = np.ascontiguousarray(o)
        q_d = np.ascontiguousarray(d)
        if q_o.dtype != odt or q_o.ndim != 1 or q_o.shape[0] < 1:
            raise TypeError("take_var_runs: every run's offsets of one dtype, 1-d, n + 1 long")
        if q_d.dtype != np.uint8 or q_d.ndim != 1:
            raise TypeError("take_var_runs: data must be 1-d uint8")
        n = q_o.shape[0] - 1
        if n and (_off(cnp.PyArray_DATA(q_o), wide, 0) < 0
                  or _off(cnp.PyArray_DATA(q_o), wide, n) > q_d.shape[0]):
            raise IndexError(f"take_var_runs: run {r}'s offsets point outside its data")
        keep.append((q_o, q_d))
        starts[r] = total
        offp[r] = <size_t>cnp.PyArray_DATA(q_o)
        datp[r] = <size_t>cnp.PyArray_DATA(q_d)
        total += n
    starts[k] = total
    cdef cnp.ndarray src_a = empty1(m, cnp.NPY_INT64)  # each row's run, then its row in it
    cdef cnp.ndarray row_a = empty1(m, cnp.NPY_INT64)
    cdef int64_t* src = <int64_t*>cnp.PyArray_DATA(src_a)
    cdef int64_t* row = <int64_t*>cnp.PyArray_DATA(row_a)
    cdef cnp.ndarray out_o = empty1(m + 1, cnp.NPY_INT64 if wide else cnp.NPY_INT32)
    cdef void* oo = cnp.PyArray_DATA(out_o)
    cdef const int64_t* p = <const int64_t*>cnp.PyArray_DATA(ix)
    cdef const void* so
    cdef int64_t a, b, ln
    cdef bint bad = False, ovf = False
    with nogil:
        r = 0
        for i in range(m):
            t = run_row(starts, k, total, p[i], &r)
            if t < 0:
                bad = True
                break
            so = <const void*>offp[r]
            a = _off(so, wide, t)
            b = _off(so, wide, t + 1)
            if b < a:
                bad = True
                break
            src[i] = r
            row[i] = a
            nbytes += b - a
            if wide:
                (<int64_t*>oo)[i + 1] = nbytes
            elif nbytes > 2147483647:
                ovf = True
                break
            else:
                (<int32_t*>oo)[i + 1] = <int32_t>nbytes
        if wide:
            (<int64_t*>oo)[0] = 0
        else:
            (<int32_t*>oo)[0] = 0
    if bad:
        raise IndexError(f"take_var_runs: index out of range for {total} rows, or offsets "
                         f"decrease")
    if ovf:
        raise OverflowError("take_var_runs: more than 2**31 - 1 bytes for int32 offsets")
    cdef cnp.ndarray out_d = empty1(nbytes, cnp.NPY_UINT8)
    cdef uint8_t* od = <uint8_t*>cnp.PyArray_DATA(out_d)
    with nogil:
        for i in range(m):
            a = _off(oo, wide, i)
            ln = _off(oo, wide, i + 1) - a
            memcpy(od + a, <const uint8_t*>datp[src[i]] + row[i], <size_t>ln)
    return out_o, out_d


def concat(parts):
    """Concatenate code arrays of the same kind."""
    parts = list(parts)
    if not parts:
        raise ValueError("concat of no code arrays")
    cdef bint u64 = isinstance(parts[0], np.ndarray)
    for q in parts:
        if isinstance(q, np.ndarray) != u64:
            raise TypeError("concat of u64 and var code arrays")
    if u64:
        return np.concatenate(parts).astype(np.uint64, copy=False)
    owners = [as_codes(q) for q in parts]
    cdef int64_t total_rows = 0, total_bytes = 0, i, n, shift, at_row = 0, at_byte = 0
    cdef codes_t v
    for ow in owners:
        v = codes_view(ow)
        total_rows += v.n
        total_bytes += v.var.offsets[v.n] - v.var.offsets[0]
    cdef cnp.ndarray offs = empty1(total_rows + 1, cnp.NPY_INT64)
    cdef cnp.ndarray data = empty1(total_bytes, cnp.NPY_UINT8)
    cdef int64_t* oo = <int64_t*>cnp.PyArray_DATA(offs)
    cdef uint8_t* od = <uint8_t*>cnp.PyArray_DATA(data)
    oo[0] = 0
    for ow in owners:
        v = codes_view(ow)
        n = v.n
        with nogil:
            shift = at_byte - v.var.offsets[0]
            for i in range(n):
                oo[at_row + i + 1] = v.var.offsets[i + 1] + shift
            memcpy(od + at_byte, v.var.data + v.var.offsets[0],
                   <size_t>(v.var.offsets[n] - v.var.offsets[0]))
        at_row += n
        at_byte += v.var.offsets[n] - v.var.offsets[0]
    return VarCodes(offs, data)
