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
"""
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t

import numpy as np

cnp.import_array()

cdef enum:
    GALLOP_RATIO = 16    # gallop through a batch this many times longer than the probes


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


def live_versions(list kcodes, list offsets, list vcodes, list weights, probes):
    """The live version of each sorted distinct u64 probe code in batches of versioned rows.

    ``kcodes[b]`` (sorted distinct u64 keys), ``offsets[b]`` (int64, keys + 1), ``vcodes[b]``
    (u64 versions) and ``weights[b]`` (int64) describe batch ``b``. Returns ``None`` when a weight
    is not ±1 or a key's weights do not sum to 0 or 1 (not versioned rows: the caller falls back
    to consolidating), else ``(pos, version, batch, row, hits)``: for each probe with a live row,
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
    cdef bint bad = False, gal
    cdef int64_t m, t
    cdef cnp.ndarray mi_a = np.empty(G + 1, dtype=np.int64)
    cdef cnp.ndarray mj_a = np.empty(G + 1, dtype=np.int64)
    cdef int64_t* mi = <int64_t*>cnp.PyArray_DATA(mi_a)
    cdef int64_t* mj = <int64_t*>cnp.PyArray_DATA(mj_a)
    for b in range(nb):
        ka = np.ascontiguousarray(kcodes[b], dtype=np.uint64)
        oa = np.ascontiguousarray(offsets[b], dtype=np.int64)
        va = np.ascontiguousarray(vcodes[b], dtype=np.uint64)
        wa = np.ascontiguousarray(weights[b], dtype=np.int64)
        nk = ka.shape[0]
        if oa.shape[0] != nk + 1 or va.shape[0] != wa.shape[0] or \
                (nk and oa[nk] > va.shape[0]):
            raise ValueError(f"live_versions: batch {b} has inconsistent keys, offsets and values")
        pk = <const uint64_t*>cnp.PyArray_DATA(ka)
        po = <const int64_t*>cnp.PyArray_DATA(oa)
        pv = <const uint64_t*>cnp.PyArray_DATA(va)
        pw = <const int64_t*>cnp.PyArray_DATA(wa)
        gal = nk > GALLOP_RATIO * G
        with nogil:
            # 1. the matches (probe i, key j): branchless walk, or gallop through a long batch
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
            # 2. each matched key's value rows (independent loads: their misses overlap)
            for t in range(m):
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
                    elif w != -1:
                        bad = True
                    tot[i] += w
    if bad:
        return None
    cdef cnp.ndarray pos_a = np.empty(G, dtype=np.int64)
    cdef int64_t* pos = <int64_t*>cnp.PyArray_DATA(pos_a)
    with nogil:
        for i in range(G):
            if tot[i] == 1 and bno[i] >= 0:
                pos[o] = i
                o += 1
            elif tot[i] != 0:
                bad = True
    if bad:
        return None
    pos_a = pos_a[:o]
    return pos_a, ver_a[pos_a], bno_a[pos_a], row_a[pos_a], hits_a
