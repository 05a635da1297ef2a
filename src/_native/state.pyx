"""Kernels of the operators' per-key state (native twins of the same functions in
``kernels_ref``).

``live_versions``: the live row of each probed key in a spine of *versioned rows* (the aggregate's
state: at most one row per key, whose value code is a version number that only grows; replacing
a row inserts ``(old, v, -1)`` and ``(new, v', +1)`` with ``v' > v``). Over all batches, a key's
weights sum to 1 when it has a live row, 0 when not, and the live row is the key's largest
version of positive weight. Per batch: the sorted probes walk the batch's sorted keys (branchless, or galloping when the
batch is much longer) into a list of matches, then each matched key's value rows update the
probe's running weight sum and best version in place (the loads of the second loop are
independent, so their cache misses overlap). No sort, no GIL.

``gather_rows``: the state columns of those live rows, written in place into one array per
column (a copy of ``itemsize`` bytes a row, whatever the column's type), in one pass instead of
a selection and a fancy index per batch and column.

``versioned_pairs`` and ``pick_rows``: the rows a put inserts (``(old, v, -1)`` before
``(new, v', +1)`` for each changed key) in one pass each: which keys, their offsets, the
versions and weights, and each column's value taken from the old or the new side.

``LiveTable``: the live rows of a spine of versioned rows kept a second time, flat, for point
reads whose cost does not grow with the history: an open-addressing hash table over u64 key codes
(linear probing, at most 7/10 full, deletions by backward shift), one row per key holding the
key, its version, each fixed-width column and each column's validity byte side by side, so a read
is one cache miss (the home rows of the reads 16 ahead are prefetched). Read and written in place
by ``get`` / ``put``, which keep the GIL (a step's keys take about a millisecond; released, the
GIL went to a merger thread and came back tens of milliseconds later); never a source of truth (its owner rebuilds it from the spine whenever the
spine changed behind its back).
"""
cimport numpy as cnp
from _native.arrays cimport contig, contig_any, empty1, zeros1
from libc.stdint cimport int64_t, uint64_t, uint8_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset

import numpy as np

cnp.import_array()

cdef extern from *:
    void prefetch "__builtin_prefetch"(const void* p) noexcept nogil


cdef enum:
    GALLOP_RATIO = 16    # gallop through a batch this many times longer than the probes
    SKIP_RATIO = 1       # skip blocks of 8 keys through a batch longer than the probes


cdef inline int64_t skip_ge(const uint64_t* k, int64_t j, int64_t n, uint64_t x) noexcept nogil:
    """First i in [j, n) with k[i] >= x: whole blocks of 8 keys at a time (the count of keys
    below x in a block, branch-free, is how far to move), then key by key for the tail."""
    cdef int64_t c, t
    while j + 8 <= n:
        c = 0
        for t in range(8):
            c += k[j + t] < x
        j += c
        if c < 8:
            return j
    while j < n and k[j] < x:
        j += 1
    return j


cdef inline int64_t gallop_ge(const uint64_t* k, int64_t lo, int64_t n, uint64_t x) noexcept nogil:
    """First i in [lo, n) with k[i] >= x, searching outwards from lo."""
    cdef int64_t step = 1, a = lo, b, half, m
    if a >= n or k[a] >= x:
        return a
    while a + step < n and k[a + step] < x:
        a += step
        step <<= 1
    b = a + step if a + step < n else n
    # k[a] < x; the answer is in (a, b]
    a += 1
    m = b - a
    while m > 0:
        half = m >> 1
        if k[a + half] < x:
            a += half + 1
            m -= half + 1
        else:
            m = half
    return a


cdef inline cnp.ndarray _contiguous(object x, int typenum, dtype):
    """``x`` itself when it is already a contiguous 1-d array of ``typenum`` (a stored batch's
    codes, offsets and weights always are: no ``np.ascontiguousarray`` call per batch and
    step), else ``np.ascontiguousarray(x, dtype)``."""
    return contig(x, typenum)  # (``dtype``: the same type, as numpy names it)


def live_versions(list kcodes, list offsets, list vcodes, list weights, probes):
    """The live version of each sorted distinct u64 probe code in batches of versioned rows.

    ``kcodes[b]`` (sorted distinct u64 keys), ``offsets[b]`` (int64, keys + 1), ``vcodes[b]``
    (u64 versions) and ``weights[b]`` (int64) describe batch ``b``. Returns ``None`` when a weight
    is not ±1, a key's weights do not sum to 0 or 1 (not versioned rows), or a live key has a
    retraction of a version at least as large as its largest added one (a rolled-back put
    re-inserts the older version after the newer one) — the caller falls back to
    consolidating — else ``(pos, version, batch, row, hits)``: for each probe with a live row,
    its position among the probes, its version, the batch and value row holding it (ascending
    ``pos``), and per batch the number of probes it matched.
    """
    cdef cnp.ndarray q = np.ascontiguousarray(probes, dtype=np.uint64)
    cdef int64_t G = q.shape[0], nb = len(kcodes), b, i, j, nk, r, r1, w, o = 0
    cdef const uint64_t* pq = <const uint64_t*>cnp.PyArray_DATA(q)
    cdef cnp.ndarray tot_a = np.zeros(G, dtype=np.int64)
    cdef cnp.ndarray ver_a = np.zeros(G, dtype=np.uint64)
    cdef cnp.ndarray bno_a = np.full(G, -1, dtype=np.int64)
    cdef cnp.ndarray row_a = np.zeros(G, dtype=np.int64)
    cdef cnp.ndarray hits_a = np.zeros(nb, dtype=np.int64)
    cdef cnp.ndarray neg_a = np.zeros(G, dtype=np.uint64)  # largest retracted version + 1
    cdef uint64_t* neg = <uint64_t*>cnp.PyArray_DATA(neg_a)
    cdef int64_t* tot = <int64_t*>cnp.PyArray_DATA(tot_a)
    cdef uint64_t* ver = <uint64_t*>cnp.PyArray_DATA(ver_a)
    cdef int64_t* bno = <int64_t*>cnp.PyArray_DATA(bno_a)
    cdef int64_t* row = <int64_t*>cnp.PyArray_DATA(row_a)
    cdef int64_t* hits = <int64_t*>cnp.PyArray_DATA(hits_a)
    cdef cnp.ndarray ka, oa, va, wa
    cdef const uint64_t* pk
    cdef const int64_t* po
    cdef const uint64_t* pv
    cdef const int64_t* pw
    cdef uint64_t x, y, v
    cdef bint bad = False, gal, skip
    cdef int64_t m, t
    cdef cnp.ndarray mi_a = np.empty(G + 1, dtype=np.int64)
    cdef cnp.ndarray mj_a = np.empty(G + 1, dtype=np.int64)
    cdef int64_t* mi = <int64_t*>cnp.PyArray_DATA(mi_a)
    cdef int64_t* mj = <int64_t*>cnp.PyArray_DATA(mj_a)
    for b in range(nb):
        ka = _contiguous(kcodes[b], cnp.NPY_UINT64, np.uint64)
        oa = _contiguous(offsets[b], cnp.NPY_INT64, np.int64)
        va = _contiguous(vcodes[b], cnp.NPY_UINT64, np.uint64)
        wa = _contiguous(weights[b], cnp.NPY_INT64, np.int64)
        nk = ka.shape[0]
        pk = <const uint64_t*>cnp.PyArray_DATA(ka)
        po = <const int64_t*>cnp.PyArray_DATA(oa)
        pv = <const uint64_t*>cnp.PyArray_DATA(va)
        pw = <const int64_t*>cnp.PyArray_DATA(wa)
        if oa.shape[0] != nk + 1 or va.shape[0] != wa.shape[0] or \
                (nk and po[nk] > va.shape[0]):
            raise ValueError(f"live_versions: batch {b} has inconsistent keys, offsets and values")
        gal = nk > GALLOP_RATIO * G
        skip = not gal and nk > SKIP_RATIO * G
        with nogil:
            # 1. the matches (probe i, key j): branchless walk, skips of 8 keys through a
            #    longer batch, or gallop through a much longer one
            m = 0
            i = 0
            j = 0
            if gal:
                while i < G:
                    j = gallop_ge(pk, j, nk, pq[i])
                    if j >= nk:
                        break
                    mi[m] = i
                    mj[m] = j
                    m += pk[j] == pq[i]
                    i += 1
            elif skip:
                while i < G:
                    j = skip_ge(pk, j, nk, pq[i])
                    if j >= nk:
                        break
                    mi[m] = i
                    mj[m] = j
                    m += pk[j] == pq[i]
                    i += 1
            else:
                while i < G and j < nk:
                    x = pq[i]
                    y = pk[j]
                    mi[m] = i
                    mj[m] = j
                    m += x == y
                    i += x <= y
                    j += y <= x
            hits[b] = m
            # 2. each matched key's value rows (independent loads: their misses overlap,
            #    helped by prefetching a match's offsets 16 matches ahead and its rows 8 ahead)
            for t in range(m):
                if t + 16 < m:
                    prefetch(&po[mj[t + 16]])
                if t + 8 < m:
                    r = po[mj[t + 8]]
                    prefetch(&pw[r])
                    prefetch(&pv[r])
                i = mi[t]
                j = mj[t]
                r1 = po[j + 1]
                for r in range(po[j], r1):
                    w = pw[r]
                    v = pv[r]
                    if w == 1:
                        if bno[i] < 0 or v > ver[i]:
                            ver[i] = v
                            bno[i] = b
                            row[i] = r
                    elif w == -1:
                        if v + 1 > neg[i]:
                            neg[i] = v + 1
                    else:
                        bad = True
                    tot[i] += w
    if bad:
        return None
    cdef cnp.ndarray pos_a = np.empty(G, dtype=np.int64)
    cdef int64_t* pos = <int64_t*>cnp.PyArray_DATA(pos_a)
    with nogil:
        for i in range(G):
            if tot[i] == 1 and bno[i] >= 0:
                if neg[i] > ver[i]:  # a retracted version >= the largest added one
                    bad = True
                pos[o] = i
                o += 1
            elif tot[i] != 0:
                bad = True
    if bad:
        return None
    pos_a = pos_a[:o]
    return pos_a, ver_a[pos_a], bno_a[pos_a], row_a[pos_a], hits_a


def gather_rows(pos, bno, row, list sources, cnp.ndarray out, fill=None):
    """``out[pos[i]] = sources[bno[i]][row[i]]`` in place (the state of the live rows found by
    :func:`live_versions`). ``sources``: one contiguous array per batch, each of ``out``'s
    itemsize (the column of that batch), or None: then ``fill`` is written (a batch whose
    validity column is all true, say). One pass over the rows through a table of the sources'
    base addresses (a None source reads its one fill item with stride 0)."""
    cdef cnp.ndarray p = contig(pos, cnp.NPY_INT64)
    cdef cnp.ndarray bq = contig(bno, cnp.NPY_INT64)
    cdef cnp.ndarray rq = contig(row, cnp.NPY_INT64)
    cdef int64_t n = p.shape[0], b, i, nb = len(sources)
    cdef int64_t lim = out.shape[0] if out.ndim == 1 else 0
    if bq.shape[0] != n or rq.shape[0] != n:
        raise ValueError("gather_rows: pos, bno and row differ in length")
    if out.ndim != 1 or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("gather_rows: out must be a writable contiguous 1-d array")
    cdef Py_ssize_t size = out.itemsize
    keep = []  # the arrays whose addresses the table holds
    cdef cnp.ndarray base_a = zeros1(nb, cnp.NPY_UINTP)
    cdef cnp.ndarray len_a = zeros1(nb, cnp.NPY_INT64)
    cdef cnp.ndarray stride_a = zeros1(nb, cnp.NPY_INT64)
    cdef size_t* base = <size_t*>cnp.PyArray_DATA(base_a)
    cdef int64_t* blen = <int64_t*>cnp.PyArray_DATA(len_a)
    cdef int64_t* stride = <int64_t*>cnp.PyArray_DATA(stride_a)
    cdef cnp.ndarray src
    for b in range(nb):
        if sources[b] is None:
            src = np.full(1, fill, dtype=out.dtype)
            blen[b] = -1  # any row
        else:
            src = contig_any(sources[b])
            if src.itemsize != size:
                raise ValueError(f"gather_rows: source {b} has items of {src.itemsize} bytes, "
                                 f"out of {size}")
            blen[b] = src.shape[0]
            stride[b] = size
        keep.append(src)
        base[b] = <size_t>cnp.PyArray_DATA(src)
    cdef const int64_t* pp = <const int64_t*>cnp.PyArray_DATA(p)
    cdef const int64_t* pb = <const int64_t*>cnp.PyArray_DATA(bq)
    cdef const int64_t* pr = <const int64_t*>cnp.PyArray_DATA(rq)
    cdef char* po = <char*>cnp.PyArray_DATA(out)
    cdef bint bad = False
    with nogil:
        for i in range(n):
            b = pb[i]
            if pp[i] < 0 or pp[i] >= lim or b < 0 or b >= nb or pr[i] < 0 or \
                    (blen[b] >= 0 and pr[i] >= blen[b]):
                bad = True
                break
        if not bad:
            if size == 8:
                for i in range(n):
                    b = pb[i]
                    memcpy(po + pp[i] * 8, <const char*>base[b] + pr[i] * stride[b], 8)
            elif size == 1:
                for i in range(n):
                    b = pb[i]
                    po[pp[i]] = (<const char*>base[b])[pr[i] * stride[b]]
            else:
                for i in range(n):
                    b = pb[i]
                    memcpy(po + pp[i] * size, <const char*>base[b] + pr[i] * stride[b], size)
    if bad:
        raise IndexError("gather_rows: a position, batch number or row is out of range")
    return out


def versioned_pairs(rm, add, old_ver, uint64_t next_version):
    """The rows of a put of versioned rows: key ``i`` retracts its old row (version
    ``old_ver[i]``, weight -1) where ``rm[i]`` and adds a new one (the next version, weight +1)
    where ``add[i]``, the old before the new. Returns ``(keys, offsets, g, is_old, versions,
    weights)``: the keys with a row (ascending), their row offsets, each row's key and whether
    it is the old row; new versions are ``next_version, next_version + 1, ...`` in key order."""
    cdef cnp.ndarray ra = contig(rm, cnp.NPY_BOOL)
    cdef cnp.ndarray aa = contig(add, cnp.NPY_BOOL)
    cdef cnp.ndarray va = contig(old_ver, cnp.NPY_UINT64)
    cdef int64_t G = ra.shape[0], i, k = 0, o = 0
    if aa.shape[0] != G or va.shape[0] != G:
        raise ValueError("versioned_pairs: rm, add and old_ver differ in length")
    cdef const uint8_t* pr = <const uint8_t*>cnp.PyArray_DATA(ra)
    cdef const uint8_t* pa_ = <const uint8_t*>cnp.PyArray_DATA(aa)
    cdef const uint64_t* pv = <const uint64_t*>cnp.PyArray_DATA(va)
    cdef int64_t nk = 0, nr = 0
    with nogil:
        for i in range(G):
            nk += (pr[i] | pa_[i]) != 0
            nr += (pr[i] != 0) + (pa_[i] != 0)
    cdef cnp.ndarray keys_a = empty1(nk, cnp.NPY_INT64)
    cdef cnp.ndarray off_a = empty1(nk + 1, cnp.NPY_INT64)
    cdef cnp.ndarray g_a = empty1(nr, cnp.NPY_INT64)
    cdef cnp.ndarray old_a = empty1(nr, cnp.NPY_BOOL)
    cdef cnp.ndarray ver_a = empty1(nr, cnp.NPY_UINT64)
    cdef cnp.ndarray w_a = empty1(nr, cnp.NPY_INT64)
    cdef int64_t* pk = <int64_t*>cnp.PyArray_DATA(keys_a)
    cdef int64_t* po = <int64_t*>cnp.PyArray_DATA(off_a)
    cdef int64_t* pg = <int64_t*>cnp.PyArray_DATA(g_a)
    cdef uint8_t* pold = <uint8_t*>cnp.PyArray_DATA(old_a)
    cdef uint64_t* pver = <uint64_t*>cnp.PyArray_DATA(ver_a)
    cdef int64_t* pw = <int64_t*>cnp.PyArray_DATA(w_a)
    cdef uint64_t nxt = next_version
    with nogil:
        po[0] = 0
        for i in range(G):
            if pr[i]:
                pg[o] = i
                pold[o] = 1
                pver[o] = pv[i]
                pw[o] = -1
                o += 1
            if pa_[i]:
                pg[o] = i
                pold[o] = 0
                pver[o] = nxt
                nxt += 1
                pw[o] = 1
                o += 1
            if pr[i] or pa_[i]:
                pk[k] = i
                k += 1
                po[k] = o
    return keys_a, off_a, g_a, old_a, ver_a, w_a


def pick_rows(g, is_old, cnp.ndarray old, cnp.ndarray new):
    """``old[g[r]] if is_old[r] else new[g[r]]`` for every row ``r`` (arrays of one itemsize;
    the result has ``new``'s dtype)."""
    cdef cnp.ndarray ga = contig(g, cnp.NPY_INT64)
    cdef cnp.ndarray oa = contig(is_old, cnp.NPY_BOOL)
    cdef cnp.ndarray xo = np.ascontiguousarray(old)
    cdef cnp.ndarray xn = np.ascontiguousarray(new)
    cdef int64_t n = ga.shape[0], r, lo = xo.shape[0], ln = xn.shape[0]
    cdef Py_ssize_t size = xn.itemsize
    if oa.shape[0] != n or xo.itemsize != size:
        raise ValueError("pick_rows: g and is_old differ in length, or old and new in itemsize")
    cdef const int64_t* pg = <const int64_t*>cnp.PyArray_DATA(ga)
    cdef const uint8_t* po = <const uint8_t*>cnp.PyArray_DATA(oa)
    cdef cnp.npy_intp nn = n
    cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, &nn, cnp.PyArray_TYPE(xn), 0)  # (new's dtype)
    cdef char* pout = <char*>cnp.PyArray_DATA(out)
    cdef const char* so = <const char*>cnp.PyArray_DATA(xo)
    cdef const char* sn = <const char*>cnp.PyArray_DATA(xn)
    cdef const char* src
    cdef bint bad = False
    with nogil:
        for r in range(n):
            if pg[r] < 0 or pg[r] >= (lo if po[r] else ln):
                bad = True
                break
        if not bad:
            if size == 8:
                for r in range(n):
                    src = so if po[r] else sn
                    memcpy(pout + r * 8, src + pg[r] * 8, 8)
            else:
                for r in range(n):
                    src = so if po[r] else sn
                    memcpy(pout + r * size, src + pg[r] * size, size)
    if bad:
        raise IndexError("pick_rows: a key position is out of range")
    return out



cdef extern from "<stdlib.h>" nogil:
    int posix_memalign(void** p, size_t alignment, size_t size)

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void* addr, size_t length, int advice)
    int MADV_HUGEPAGE


cdef enum:
    HUGE = 2 << 20  # tables of at least this many bytes sit on (transparent) huge pages


cdef char* _zeroed(size_t nbytes) noexcept nogil:
    """``nbytes`` of zeros, touched now (no page fault later in a step); a large block aligned to
    and advised onto huge pages (a read of a random row then costs a cache miss, not also a TLB
    miss and a page walk). NULL when out of memory."""
    cdef void* p = NULL
    if nbytes < HUGE:
        return <char*>calloc(nbytes, 1)
    if posix_memalign(&p, HUGE, nbytes) != 0:
        return NULL
    madvise(p, nbytes, MADV_HUGEPAGE)  # advice only: its failure is no error
    memset(p, 0, nbytes)
    return <char*>p


cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    """A u64 finaliser (murmur3's): dense or strided key codes spread over the whole table."""
    x ^= x >> 33
    x *= <uint64_t>0xff51afd7ed558ccd
    x ^= x >> 33
    x *= <uint64_t>0xc4ceb9fe1a85ec53
    x ^= x >> 33
    return x


cdef class LiveTable:
    """Key code -> ``(version, one fixed-width value and one validity flag per column)``, one
    flat row per key (see the module doc). ``itemsizes``: the byte width of each column (1, 2, 4
    or 8, as numpy arrays of the columns have)."""

    cdef char* rows
    cdef int64_t cap, mask, n, rowsize, ncols, occ, voff
    cdef int64_t* isz
    cdef int64_t* coff
    cdef readonly tuple itemsizes
    cdef object _read_dtypes  # the dtypes list read() last converted, and its type numbers
    cdef list _read_nums

    def __cinit__(self, itemsizes):
        self.rows = NULL
        self.isz = NULL
        self.coff = NULL

    def __init__(self, itemsizes):
        cdef int64_t j, off = 16, s
        self.itemsizes = tuple(int(x) for x in itemsizes)
        self.ncols = len(self.itemsizes)
        self.isz = <int64_t*>calloc(self.ncols + 1, sizeof(int64_t))
        self.coff = <int64_t*>calloc(self.ncols + 1, sizeof(int64_t))
        if self.isz == NULL or self.coff == NULL:
            raise MemoryError()
        for j in range(self.ncols):
            s = self.itemsizes[j]
            if s not in (1, 2, 4, 8):
                raise ValueError(f"LiveTable: column {j} has items of {s} bytes "
                                 f"(1, 2, 4 or 8 expected)")
            self.isz[j] = s
            self.coff[j] = off
            off += s
        self.voff = off            # validity bytes, one per column
        self.occ = off + self.ncols  # the row's occupied flag
        self.rowsize = (self.occ + 1 + 7) & ~7
        self.n = 0
        self._alloc(1024)

    def __dealloc__(self):
        free(self.rows)
        free(self.isz)
        free(self.coff)

    cdef _alloc(self, int64_t cap):
        cdef char* r = _zeroed(cap * self.rowsize)
        if r == NULL:
            raise MemoryError(f"LiveTable: {cap} rows of {self.rowsize} bytes")
        free(self.rows)
        self.rows = r
        self.cap = cap
        self.mask = cap - 1

    def __len__(self):
        return self.n

    @property
    def nbytes(self) -> int:
        """Bytes the table holds (its rows, empty ones included)."""
        return self.cap * self.rowsize

    def clear(self):
        memset(self.rows, 0, self.cap * self.rowsize)
        self.n = 0

    cdef inline int64_t _find(self, uint64_t k) noexcept nogil:
        """The row of ``k``, or ``-1 - (the empty row where it would go)``."""
        cdef int64_t i = <int64_t>(_mix(k) & <uint64_t>self.mask)
        cdef char* r
        while True:
            r = self.rows + i * self.rowsize
            if not r[self.occ]:
                return -1 - i
            if (<uint64_t*>r)[0] == k:
                return i
            i = (i + 1) & self.mask

    cdef _grow(self, int64_t need):
        """Room for ``need`` rows at most 7/10 full (rehashes every row)."""
        cdef int64_t cap = self.cap, old_cap = self.cap, i, at
        cdef char* old
        cdef char* r
        while need * 10 > cap * 7:
            cap *= 2
        if cap == old_cap:
            return
        old = self.rows
        self.rows = NULL
        try:
            self._alloc(cap)
        except MemoryError:
            self.rows = old
            raise
        for i in range(old_cap):
            r = old + i * self.rowsize
            if r[self.occ]:
                at = -1 - self._find((<uint64_t*>r)[0])
                memcpy(self.rows + at * self.rowsize, r, self.rowsize)
        free(old)

    cdef void _delete(self, int64_t i) noexcept nogil:
        """Empty row ``i``, shifting back the rows of its probe run that may move."""
        cdef int64_t j = i, h
        cdef char* r
        while True:
            j = (j + 1) & self.mask
            r = self.rows + j * self.rowsize
            if not r[self.occ]:
                break
            h = <int64_t>(_mix((<uint64_t*>r)[0]) & <uint64_t>self.mask)
            # the row at j may move to i unless its home lies cyclically in (i, j]
            if (i <= j and i < h and h <= j) or (i > j and (i < h or h <= j)):
                continue
            memcpy(self.rows + i * self.rowsize, r, self.rowsize)
            i = j
        memset(self.rows + i * self.rowsize, 0, self.rowsize)
        self.n -= 1

    cdef cnp.ndarray _pointers(self, list cols, list valids, int64_t G, str what,
                               bint optional_valid, list keep):
        """The data pointers of ``cols`` then of ``valids`` (0 for a None validity where
        ``optional_valid``), checked against the table's columns, in one uintp array of
        ``2 * (ncols + 1)``: columns at ``[0, ncols)``, validities from ``ncols + 1``. The arrays
        pointed into are appended to ``keep``, which the caller holds while it uses them."""
        cdef int64_t j
        cdef cnp.ndarray a
        cdef bint writing = what == "get"
        cdef cnp.ndarray ptrs = zeros1(2 * (self.ncols + 1), cnp.NPY_UINTP)
        cdef size_t* pc = <size_t*>cnp.PyArray_DATA(ptrs)
        cdef size_t* pv = pc + self.ncols + 1
        if len(cols) != self.ncols or len(valids) != self.ncols:
            raise ValueError(f"LiveTable.{what}: {len(cols)} columns and {len(valids)} "
                             f"validity arrays for a table of {self.ncols} columns")
        for j in range(self.ncols):
            a = cols[j]
            # (the flags through numpy's C macros: ``a.flags`` makes an object a read)
            if a.ndim != 1 or a.shape[0] != G or a.itemsize != self.isz[j] \
                    or not cnp.PyArray_IS_C_CONTIGUOUS(a):
                raise ValueError(f"LiveTable.{what}: column {j} must be a contiguous 1-d array "
                                 f"of {G} items of {self.isz[j]} bytes")
            if writing and not cnp.PyArray_ISWRITEABLE(a):
                raise ValueError(f"LiveTable.get: column {j} is not writable")
            pc[j] = <size_t>cnp.PyArray_DATA(a)
            keep.append(a)
            if valids[j] is None and optional_valid:
                pv[j] = 0
                continue
            a = valids[j]
            if a.ndim != 1 or a.shape[0] != G or a.itemsize != 1 \
                    or not cnp.PyArray_IS_C_CONTIGUOUS(a):
                raise ValueError(f"LiveTable.{what}: validity {j} must be a contiguous 1-d "
                                 f"array of {G} bools")
            if writing and not cnp.PyArray_ISWRITEABLE(a):
                raise ValueError(f"LiveTable.get: validity {j} is not writable")
            pv[j] = <size_t>cnp.PyArray_DATA(a)
            keep.append(a)
        return ptrs

    def get(self, kcodes, cnp.ndarray has, cnp.ndarray ver, list cols, list valids):
        """For each key code ``kcodes[i]`` with a row: ``has[i] = True``, ``ver[i]``, each
        ``cols[j][i]`` and ``valids[j][i]`` written in place (left as they are for a key without
        a row: the caller passes zeros; a None validity array: not read back). Returns the
        number of keys found."""
        cdef cnp.ndarray q = _contiguous(kcodes, cnp.NPY_UINT64, np.uint64)
        cdef int64_t G = q.shape[0], i, j, at, found = 0, nc = self.ncols
        if has.ndim != 1 or has.shape[0] != G or has.itemsize != 1 or \
                not cnp.PyArray_IS_C_CONTIGUOUS(has) or not cnp.PyArray_ISWRITEABLE(has):
            raise ValueError(f"LiveTable.get: has must be a writable array of {G} bools")
        if ver.ndim != 1 or ver.shape[0] != G or ver.itemsize != 8 or \
                not cnp.PyArray_IS_C_CONTIGUOUS(ver) or not cnp.PyArray_ISWRITEABLE(ver):
            raise ValueError(f"LiveTable.get: ver must be a writable array of {G} u64")
        keep = []
        cdef cnp.ndarray ptrs = self._pointers(cols, valids, G, "get", True, keep)
        cdef size_t* pc = <size_t*>cnp.PyArray_DATA(ptrs)
        cdef size_t* pv = pc + nc + 1
        cdef const uint64_t* pq = <const uint64_t*>cnp.PyArray_DATA(q)
        cdef uint8_t* ph = <uint8_t*>cnp.PyArray_DATA(has)
        cdef uint64_t* pver = <uint64_t*>cnp.PyArray_DATA(ver)
        return self._probe(pq, G, ph, pver, pc, pv)

    cdef int64_t _probe(self, const uint64_t* pq, int64_t G, uint8_t* ph, uint64_t* pver,
                        const size_t* pc, const size_t* pv) noexcept nogil:
        """The loop of :meth:`get` / :meth:`read`: for each key of ``pq`` with a row, ``ph[i]``
        set, its version in ``pver[i]``, column ``j``'s value at ``pc[j]`` and (where ``pv`` is
        not NULL and ``pv[j]`` not 0) its validity at ``pv[j]``. Returns the keys found."""
        cdef int64_t i, j, at, s, found = 0
        cdef char* r
        for i in range(G):
            if i + 16 < G:
                prefetch(self.rows + <int64_t>(_mix(pq[i + 16]) & <uint64_t>self.mask)
                         * self.rowsize)
            at = self._find(pq[i])
            if at < 0:
                continue
            found += 1
            r = self.rows + at * self.rowsize
            ph[i] = 1
            pver[i] = (<uint64_t*>r)[1]
            for j in range(self.ncols):
                s = self.isz[j]
                memcpy(<char*>pc[j] + i * s, r + self.coff[j], s)
                if pv != NULL and pv[j]:
                    (<uint8_t*>pv[j])[i] = r[self.voff + j]
        return found

    def read(self, kcodes, list dtypes):
        """:meth:`get` into fresh arrays: ``(has, [one array of dtypes[j] per column, 0 where a
        key has no row or a null], versions)`` (no validity read back). The arrays are made
        here through numpy's C API, not by a ``np.zeros`` call each from Python: a step of a
        few dozen keys pays for the calls, not the loop."""
        cdef cnp.ndarray q = _contiguous(kcodes, cnp.NPY_UINT64, np.uint64)
        cdef int64_t G = q.shape[0], j, nc = self.ncols
        cdef int typenum
        if len(dtypes) != nc:
            raise ValueError(f"LiveTable.read: {len(dtypes)} dtypes for a table of {nc} columns")
        if dtypes is not self._read_dtypes:  # (one conversion per dtypes list)
            nums = []
            for j in range(nc):
                d = np.dtype(dtypes[j])
                if d.itemsize != self.isz[j]:
                    raise ValueError(f"LiveTable.read: column {j} has items of {self.isz[j]} "
                                     f"bytes, not {d.itemsize}")
                nums.append(d.num)
            self._read_nums = nums
            self._read_dtypes = dtypes
        cdef cnp.ndarray has = zeros1(G, cnp.NPY_BOOL)
        cdef cnp.ndarray ver = zeros1(G, cnp.NPY_UINT64)
        cdef list cols = []
        cdef size_t pc[64]
        if nc > 64:
            raise ValueError("LiveTable.read: at most 64 columns")
        for j in range(nc):
            typenum = self._read_nums[j]
            a = zeros1(G, typenum)
            cols.append(a)
            pc[j] = <size_t>cnp.PyArray_DATA(<cnp.ndarray>a)
        with nogil:
            self._probe(<const uint64_t*>cnp.PyArray_DATA(q), G,
                        <uint8_t*>cnp.PyArray_DATA(has), <uint64_t*>cnp.PyArray_DATA(ver),
                        pc, NULL)
        return has, cols, ver

    def put(self, kcodes, rm, add, versions, list cols, list valids):
        """Row ``i`` of the arrays is the new state of key ``kcodes[i]`` (distinct codes):
        where ``add[i]`` the key's row becomes ``(versions[i], cols[j][i], valids[j][i])``
        (inserted or overwritten; a None validity array: all valid; a null value is stored
        as 0), else where ``rm[i]`` the
        key's row is deleted; other keys are left as they are. ``versions`` may be an int
        ``v``: the added keys' versions are then ``v, v + 1, ...`` in order (those of
        ``versioned_pairs(..., v)``), without an array of them."""
        cdef cnp.ndarray q = _contiguous(kcodes, cnp.NPY_UINT64, np.uint64)
        cdef cnp.ndarray ra = contig(rm, cnp.NPY_BOOL)
        cdef cnp.ndarray aa = contig(add, cnp.NPY_BOOL)
        cdef cnp.ndarray va = None
        cdef bint counted = isinstance(versions, int)
        cdef uint64_t nxt = 0
        cdef int64_t G = q.shape[0], i, j, at, nadd = 0, nc = self.ncols, s
        if counted:
            nxt = versions  # (OverflowError below 0 or past 2**64 - 1)
        else:
            va = contig(versions, cnp.NPY_UINT64)
        if ra.shape[0] != G or aa.shape[0] != G or (not counted and va.shape[0] != G):
            raise ValueError("LiveTable.put: kcodes, rm, add and versions differ in length")
        keep = []
        cdef cnp.ndarray ptrs = self._pointers(cols, valids, G, "put", True, keep)
        cdef size_t* pc = <size_t*>cnp.PyArray_DATA(ptrs)
        cdef size_t* pv = pc + nc + 1
        cdef const uint64_t* pq = <const uint64_t*>cnp.PyArray_DATA(q)
        cdef const uint8_t* pr = <const uint8_t*>cnp.PyArray_DATA(ra)
        cdef const uint8_t* pa_ = <const uint8_t*>cnp.PyArray_DATA(aa)
        cdef const uint64_t* pver = NULL if counted else <const uint64_t*>cnp.PyArray_DATA(va)
        cdef char* r
        for i in range(G):
            nadd += pa_[i] != 0
        self._grow(self.n + nadd)
        for i in range(G):
            if i + 16 < G:
                prefetch(self.rows + <int64_t>(_mix(pq[i + 16]) & <uint64_t>self.mask)
                         * self.rowsize)
            if pa_[i]:
                at = self._find(pq[i])
                if at < 0:
                    at = -1 - at
                    self.n += 1
                r = self.rows + at * self.rowsize
                (<uint64_t*>r)[0] = pq[i]
                if counted:
                    (<uint64_t*>r)[1] = nxt
                    nxt += 1
                else:
                    (<uint64_t*>r)[1] = pver[i]
                for j in range(nc):
                    s = self.isz[j]
                    if pv[j] and not (<const uint8_t*>pv[j])[i]:
                        memset(r + self.coff[j], 0, s)  # a null reads as 0
                        r[self.voff + j] = 0
                    else:
                        memcpy(r + self.coff[j], <const char*>pc[j] + i * s, s)
                        r[self.voff + j] = 1
                r[self.occ] = 1
            elif pr[i]:
                at = self._find(pq[i])
                if at >= 0:
                    self._delete(at)
