"""Searching sorted code arrays: groups, bounds, intersection, join expansion, gather and concat
(native twins of the same functions in ``kernels_ref``).

Design
------
* ``lower_bound`` / ``upper_bound`` check in one pass whether the probes are sorted. Sorted
  probes (a cursor seeking forward, a merge join) gallop from the previous answer: cost
  ``O(log gap)`` per probe instead of ``O(log n)``, and memory is touched in order. Unsorted probes
  use a branchless binary search (u64; 32 probes descend together so that their cache misses
  overlap) or a ``memcmp`` binary search (var codes).
* ``intersect`` walks both sorted arrays branchlessly when their sizes are alike; when one side is
  much longer it gallops through the longer side for each code of the shorter one.
* ``expand_pairs`` makes two passes: count the output, then fill it.
* ``take`` and ``concat`` on var codes compute the offsets first and copy the bytes with
  ``memcpy``.

Every loop runs without the GIL.
"""
cimport numpy as cnp
from libc.stdint cimport uint8_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

from _native.types cimport var_t, codes_t
from _native.codes_cmp cimport codes_cmp, codes_eq, bytes_cmp
from _native.views cimport as_codes, as_i64, codes_view, shrink

import numpy as np

from dbsp.algebra.codes import VarCodes

cnp.import_array()

cdef enum:
    GALLOP_RATIO = 16    # intersect gallops when one side is this many times longer
    SPARSE_RATIO = 128   # ... and binary-searches the whole longer side when it is this much
    SPARSE_ROWS = 1 << 20  # longer and this long (smaller, it is cache-resident: galloping wins)


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
    cdef cnp.ndarray out = np.empty(n + 1, dtype=np.int64)
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
    cdef cnp.ndarray out = np.empty(m, dtype=np.int64)
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
    lo_a = np.ascontiguousarray(lo, dtype=np.int64)
    hi_a = np.ascontiguousarray(hi, dtype=np.int64)
    cdef const int64_t[::1] L = lo_a
    cdef const int64_t[::1] H = hi_a
    cdef int64_t m = p.n, j, a, b, pos = 0
    if L.shape[0] != m or H.shape[0] != m:
        raise ValueError("lo, hi and probes must have one entry per probe")
    for j in range(m):
        if L[j] < 0 or H[j] > s.n or L[j] > H[j]:
            raise IndexError(f"range {j} [{L[j]}, {H[j]}) outside 0..{s.n}")
    cdef cnp.ndarray out = np.empty(m, dtype=np.int64)
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

def intersect(a, b):
    """Positions of equal codes in two sorted arrays of *distinct* codes: ``(ai, bi)``,
    ascending."""
    ao = as_codes(a)
    bo = as_codes(b)
    cdef codes_t ka = codes_view(ao)
    cdef codes_t kb = codes_view(bo)
    if (ka.u64 == NULL) != (kb.u64 == NULL):
        raise TypeError("intersect needs two u64 or two var code arrays")
    cdef int64_t na = ka.n, nb = kb.n, i = 0, j = 0, o = 0, m = min(na, nb)
    cdef cnp.ndarray ai = np.empty(m, dtype=np.int64)
    cdef cnp.ndarray bi = np.empty(m, dtype=np.int64)
    cdef int64_t* pa = <int64_t*>cnp.PyArray_DATA(ai)
    cdef int64_t* pb = <int64_t*>cnp.PyArray_DATA(bi)
    cdef const uint64_t* ua = ka.u64
    cdef const uint64_t* ub = kb.u64
    cdef uint64_t x, y
    cdef int c
    with nogil:
        if na > GALLOP_RATIO * nb:
            # gallop through a for each code of b (see below for the sparse case)
            for j in range(nb):
                i = sparse_search(&ka, i, na, &kb, j,
                                  na > SPARSE_RATIO * nb and na >= SPARSE_ROWS)
                if i >= na:
                    break
                if cmp_probe(&ka, i, &kb, j) == 0:
                    pa[o] = i
                    pb[o] = j
                    o += 1
        elif nb > GALLOP_RATIO * na:
            for i in range(na):
                j = sparse_search(&kb, j, nb, &ka, i,
                                  nb > SPARSE_RATIO * na and nb >= SPARSE_ROWS)
                if j >= nb:
                    break
                if cmp_probe(&kb, j, &ka, i) == 0:
                    pa[o] = i
                    pb[o] = j
                    o += 1
        elif ua != NULL:
            while i < na and j < nb:
                x = ua[i]
                y = ub[j]
                pa[o] = i
                pb[o] = j
                o += x == y
                i += x <= y
                j += y <= x
        else:
            while i < na and j < nb:
                c = codes_cmp(&ka, i, &kb, j)
                if c == 0:
                    pa[o] = i
                    pb[o] = j
                    o += 1
                i += c <= 0
                j += c >= 0
    return shrink(ai, o), shrink(bi, o)


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
    cdef cnp.ndarray xs = np.empty(total, dtype=np.int64)
    cdef cnp.ndarray ys = np.empty(total, dtype=np.int64)
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
        out = np.empty(m, dtype=np.uint64)
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
    offs = np.empty(m + 1, dtype=np.int64)
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
    data = np.empty(total, dtype=np.uint8)
    od = <uint8_t*>cnp.PyArray_DATA(data)
    with nogil:
        for i in range(m):
            t = p[i]
            if t < 0:
                t += n
            memcpy(od + oo[i], sd + so[t], <size_t>(oo[i + 1] - oo[i]))
    return VarCodes(offs, data)


def take_runs(parts, idx):
    """``np.concatenate(parts)[idx]`` without the concatenation: ``parts`` are 1-d numpy arrays
    of one fixed-width dtype (a merge's runs: their codes, or a fixed-width column of each), ``idx``
    int64 positions in their concatenation (a merge's row index, in any order). A merge gathers
    its output this way from its inputs, without a concatenated copy of them beside the output."""
    parts = [np.ascontiguousarray(q) for q in parts]
    if not parts:
        raise ValueError("take_runs of no arrays")
    dt = parts[0].dtype
    cdef cnp.ndarray ix = as_i64(idx)
    if ix.ndim != 1:
        raise ValueError("idx must be 1-d")
    cdef int64_t k = len(parts), r, m = ix.shape[0], i, t, lo, hi, mid, total = 0
    cdef Py_ssize_t w = dt.itemsize
    for q in parts:
        if q.dtype != dt or q.ndim != 1:
            raise TypeError("take_runs: parts of one dtype, 1-d")
    cdef cnp.ndarray starts_a = np.empty(k + 1, dtype=np.int64)
    cdef cnp.ndarray base_a = np.empty(k, dtype=np.uintp)
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
            t = p[i]
            if t < 0 or t >= total:
                bad = True
                break
            if t < starts[r] or t >= starts[r + 1]:  # another run: search the run starts
                lo = 0
                hi = k
                while hi - lo > 1:
                    mid = (lo + hi) >> 1
                    if starts[mid] <= t:
                        lo = mid
                    else:
                        hi = mid
                r = lo
                while starts[r + 1] <= t:  # (skips empty runs)
                    r += 1
            t -= starts[r]
            if w == 8:
                (<uint64_t*>o)[i] = (<const uint64_t*>base[r])[t]
            elif w == 4:
                (<uint32_t*>o)[i] = (<const uint32_t*>base[r])[t]
            else:
                memcpy(o + i * w, <const char*>base[r] + t * w, w)
    if bad:
        raise IndexError(f"take_runs: index out of range for {total} rows")
    return out


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
    cdef cnp.ndarray offs = np.empty(total_rows + 1, dtype=np.int64)
    cdef cnp.ndarray data = np.empty(total_bytes, dtype=np.uint8)
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
