"""Kernels of the linear aggregate's per-step path (native twins of the same functions in
``kernels_ref``).

A linear aggregate (count / sum / avg) keeps one row of *partials* per key (row count, non-null
counts, weighted sums: int64 or float64 columns) and each step adds the delta's partials to the
touched keys' old ones. With a hundred keys a step, the numpy version of that bookkeeping costs
some fifty calls (an add, an overflow check, a comparison per column, masks, where, repeat ...),
each a microsecond or more, for loops of a hundred iterations. These are those loops as three
calls, every loop without the GIL:

* ``combine_partials(old, delta, has_old, is_int, positive)``: ``new = old + delta`` column by
  column, with which keys changed, which keep a partial row (not all zero) and the rows to emit
  (``-old`` then ``+new``); None when an int64 sum leaves int64 or (``positive``) a row count
  goes negative: the caller then takes the checked path that names the key.
* ``versioned_put(changed, has_old, keep, old_ver, next_ver)``: the entries that replace the
  changed keys' partial rows in the versioned-rows spine (the old row retracted under its
  version, the new one inserted under a fresh version, old before new within a key).
* ``pick_partials(src_old, idx, old, new)``: per column, ``old[idx[k]]`` where ``src_old[k]`` else
  ``new[idx[k]]`` (the values of those entries, and of the emitted rows).

Columns are lists of 1-d contiguous ``int64`` or ``float64`` arrays of one length.
"""
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t, uint8_t

import numpy as np

cnp.import_array()

cdef extern from *:
    bint add_overflow "__builtin_add_overflow"(int64_t a, int64_t b, int64_t* out) noexcept nogil


cdef inline cnp.ndarray _col(object a, object dtype, int64_t n, str what):
    cdef cnp.ndarray x = np.ascontiguousarray(a, dtype=dtype)
    if x.ndim != 1 or x.shape[0] != n:
        raise ValueError(f"{what}: expected {n} values, got shape {np.shape(a)}")
    return x


def combine_partials(old, delta, has_old, is_int, bint positive=False):
    """``(new columns, changed, keep, emit_old, emit_new)`` or None (see the module doc).

    ``old`` / ``delta``: lists of partial columns (column 0 is the row count), ``is_int[j]``
    whether column ``j`` is int64 (else float64); ``has_old``: bool per key. ``changed``: no old
    row, or some column differs; ``keep``: some new column is non-zero; ``emit_old``: the keys
    whose old row is retracted (had one with a non-zero row count, and changed); ``emit_new``:
    the keys whose new row is inserted (non-zero row count, changed), both ascending int64."""
    cdef Py_ssize_t ncols = len(old), j
    if len(delta) != ncols or len(is_int) != ncols or ncols == 0:
        raise ValueError("combine_partials: old, delta and is_int need one entry per column")
    cdef cnp.ndarray h = np.ascontiguousarray(has_old, dtype=np.bool_)
    cdef int64_t G = h.shape[0], g, n_old = 0, n_new = 0
    cdef const uint8_t* ph = <const uint8_t*>cnp.PyArray_DATA(h)
    cdef cnp.ndarray changed = np.zeros(G, dtype=np.bool_)
    cdef cnp.ndarray keep = np.zeros(G, dtype=np.bool_)
    cdef uint8_t* pc = <uint8_t*>cnp.PyArray_DATA(changed)
    cdef uint8_t* pk = <uint8_t*>cnp.PyArray_DATA(keep)
    cdef bint bad = False
    cdef int64_t* io
    cdef int64_t* ii
    cdef int64_t* inew
    cdef double* fo
    cdef double* fd
    cdef double* fn
    news = []
    for g in range(G):
        pc[g] = not ph[g]
    for j in range(ncols):
        if is_int[j]:
            o = _col(old[j], np.int64, G, "combine_partials")
            d = _col(delta[j], np.int64, G, "combine_partials")
            out = np.empty(G, dtype=np.int64)
            io = <int64_t*>cnp.PyArray_DATA(o)
            ii = <int64_t*>cnp.PyArray_DATA(d)
            inew = <int64_t*>cnp.PyArray_DATA(out)
            with nogil:
                for g in range(G):
                    bad |= add_overflow(io[g], ii[g], &inew[g])
                    pc[g] |= inew[g] != io[g]
                    pk[g] |= inew[g] != 0
                if j == 0 and positive:
                    for g in range(G):
                        bad |= inew[g] < 0
        else:
            o = _col(old[j], np.float64, G, "combine_partials")
            d = _col(delta[j], np.float64, G, "combine_partials")
            out = np.empty(G, dtype=np.float64)
            fo = <double*>cnp.PyArray_DATA(o)
            fd = <double*>cnp.PyArray_DATA(d)
            fn = <double*>cnp.PyArray_DATA(out)
            with nogil:
                for g in range(G):
                    fn[g] = fo[g] + fd[g]
                    pc[g] |= not (fn[g] == fo[g])
                    pk[g] |= fn[g] != 0.0
        news.append(out)
        if bad:
            return None
    if not is_int[0]:
        raise ValueError("combine_partials: column 0 (the row count) must be int64")
    cdef cnp.ndarray r0 = news[0]
    cdef cnp.ndarray o0 = np.ascontiguousarray(old[0], dtype=np.int64)
    cdef const int64_t* pr = <const int64_t*>cnp.PyArray_DATA(r0)
    cdef const int64_t* po = <const int64_t*>cnp.PyArray_DATA(o0)
    cdef cnp.ndarray eo = np.empty(G, dtype=np.int64)
    cdef cnp.ndarray en = np.empty(G, dtype=np.int64)
    cdef int64_t* peo = <int64_t*>cnp.PyArray_DATA(eo)
    cdef int64_t* pen = <int64_t*>cnp.PyArray_DATA(en)
    with nogil:
        for g in range(G):
            if pc[g]:
                if ph[g] and po[g] != 0:
                    peo[n_old] = g
                    n_old += 1
                if pr[g] != 0:
                    pen[n_new] = g
                    n_new += 1
    return news, changed, keep, eo[:n_old], en[:n_new]


def versioned_put(changed, has_old, keep, old_ver, uint64_t next_ver):
    """``(kk, offsets, src_old, idx, weights, vcodes, versions used)``: the entries replacing the
    partial rows of the ``changed`` keys. Per such key ``kk[i]`` (ascending), entries
    ``offsets[i]:offsets[i+1]``: its old row (if it had one: weight -1 under ``old_ver``), then
    its new row (if ``keep``: weight +1 under the next fresh version from ``next_ver``). Keys with
    neither get no entry. ``src_old`` / ``idx``: where each entry's values come from (old or new
    partials of key ``idx``)."""
    cdef cnp.ndarray c = np.ascontiguousarray(changed, dtype=np.bool_)
    cdef int64_t G = c.shape[0], g, k = 0, e = 0
    cdef cnp.ndarray h = _col(has_old, np.bool_, G, "versioned_put")
    cdef cnp.ndarray kp = _col(keep, np.bool_, G, "versioned_put")
    cdef cnp.ndarray ov = _col(old_ver, np.uint64, G, "versioned_put")
    cdef const uint8_t* pc = <const uint8_t*>cnp.PyArray_DATA(c)
    cdef const uint8_t* ph = <const uint8_t*>cnp.PyArray_DATA(h)
    cdef const uint8_t* pk = <const uint8_t*>cnp.PyArray_DATA(kp)
    cdef const uint64_t* pv = <const uint64_t*>cnp.PyArray_DATA(ov)
    cdef cnp.ndarray kk = np.empty(G, dtype=np.int64)
    cdef cnp.ndarray offsets = np.empty(G + 1, dtype=np.int64)
    cdef cnp.ndarray src_old = np.empty(2 * G, dtype=np.bool_)
    cdef cnp.ndarray idx = np.empty(2 * G, dtype=np.int64)
    cdef cnp.ndarray w = np.empty(2 * G, dtype=np.int64)
    cdef cnp.ndarray vc = np.empty(2 * G, dtype=np.uint64)
    cdef int64_t* pkk = <int64_t*>cnp.PyArray_DATA(kk)
    cdef int64_t* pof = <int64_t*>cnp.PyArray_DATA(offsets)
    cdef uint8_t* pso = <uint8_t*>cnp.PyArray_DATA(src_old)
    cdef int64_t* pidx = <int64_t*>cnp.PyArray_DATA(idx)
    cdef int64_t* pw = <int64_t*>cnp.PyArray_DATA(w)
    cdef uint64_t* pvc = <uint64_t*>cnp.PyArray_DATA(vc)
    cdef uint64_t nv = next_ver
    with nogil:
        pof[0] = 0
        for g in range(G):
            if not pc[g] or not (ph[g] or pk[g]):
                continue
            if ph[g]:
                pso[e] = 1
                pidx[e] = g
                pw[e] = -1
                pvc[e] = pv[g]
                e += 1
            if pk[g]:
                pso[e] = 0
                pidx[e] = g
                pw[e] = 1
                pvc[e] = nv
                nv += 1
                e += 1
            pkk[k] = g
            k += 1
            pof[k] = e
    return (kk[:k], offsets[:k + 1], src_old[:e], idx[:e], w[:e], vc[:e],
            int(nv - next_ver))


def pick_partials(src_old, idx, old, new):
    """Per column ``j``: ``old[j][idx[k]]`` where ``src_old[k]``, else ``new[j][idx[k]]``
    (``idx`` must index both; columns int64 or float64, ``old[j]`` and ``new[j]`` alike)."""
    cdef cnp.ndarray s = np.ascontiguousarray(src_old, dtype=np.bool_)
    cdef int64_t n = s.shape[0], k, i, G
    cdef cnp.ndarray ix = _col(idx, np.int64, n, "pick_partials")
    cdef const uint8_t* ps = <const uint8_t*>cnp.PyArray_DATA(s)
    cdef const int64_t* pi = <const int64_t*>cnp.PyArray_DATA(ix)
    cdef const int64_t* ao
    cdef const int64_t* an
    cdef int64_t* ar
    cdef const double* do
    cdef const double* dn
    cdef double* dr
    if len(old) != len(new):
        raise ValueError("pick_partials: old and new need one entry per column")
    out = []
    for o, nw in zip(old, new):
        dt = np.float64 if np.asarray(o).dtype.kind == "f" else np.int64
        oa = np.ascontiguousarray(o, dtype=dt)
        G = oa.shape[0]
        na = _col(nw, dt, G, "pick_partials")
        i = 0
        with nogil:
            for k in range(n):
                if pi[k] < 0 or pi[k] >= G:
                    i = 1
        if i:
            raise IndexError(f"pick_partials: an index is out of the {G} rows")
        r = np.empty(n, dtype=dt)
        if dt is np.int64:
            ao = <const int64_t*>cnp.PyArray_DATA(oa)
            an = <const int64_t*>cnp.PyArray_DATA(na)
            ar = <int64_t*>cnp.PyArray_DATA(r)
            with nogil:
                for k in range(n):
                    i = pi[k]
                    ar[k] = ao[i] if ps[k] else an[i]
        else:
            do = <const double*>cnp.PyArray_DATA(oa)
            dn = <const double*>cnp.PyArray_DATA(na)
            dr = <double*>cnp.PyArray_DATA(r)
            with nogil:
                for k in range(n):
                    i = pi[k]
                    dr[k] = do[i] if ps[k] else dn[i]
        out.append(r)
    return out


cdef extern from *:
    bint mul_overflow "__builtin_mul_overflow"(int64_t a, int64_t b, int64_t* out) noexcept nogil


def delta_partials(bounds, weights, kinds, cols, values, valids):
    """The partials of a delta grouped by key (group ``g``: rows ``bounds[g]:bounds[g+1]``),
    one int64 / float64 array per partial column ``j`` by ``kinds[j]``: 0 ``Σ w`` (the row
    count), 1 ``Σ w`` over the rows where ``values[cols[j]]`` is valid, 2 ``Σ w·x`` of that int64
    column over its valid rows, 3 ``Σ w·x`` of that float64 column (nulls as 0, summed from the
    group's first row on, as ``np.add.reduceat``). ``valids[c]``: bool array, or None when
    column ``c`` has no null. None when an int64 product or sum leaves int64 (the caller's
    checked path then names the key)."""
    cdef cnp.ndarray b = np.ascontiguousarray(bounds, dtype=np.int64)
    cdef cnp.ndarray w = np.ascontiguousarray(weights, dtype=np.int64)
    cdef int64_t G = b.shape[0] - 1, n = w.shape[0], g, r, acc, p
    cdef const int64_t* pb = <const int64_t*>cnp.PyArray_DATA(b)
    cdef const int64_t* pw = <const int64_t*>cnp.PyArray_DATA(w)
    cdef const int64_t* xi
    cdef const double* xf
    cdef const uint8_t* ok
    cdef int64_t* oi
    cdef double* of
    cdef double facc
    cdef int kind
    cdef bint bad = False
    if G < 0 or (G > 0 and (pb[0] != 0 or pb[G] != n)):
        raise ValueError("delta_partials: bounds must run from 0 to the number of rows")
    out = []
    for j in range(len(kinds)):
        kind = kinds[j]
        ok = NULL
        xi = NULL
        xf = NULL
        if kind != 0:
            c = cols[j]
            v = valids[c]
            if v is not None:
                va = _col(v, np.bool_, n, "delta_partials")
                ok = <const uint8_t*>cnp.PyArray_DATA(va)
            if kind == 2:
                xa = _col(values[c], np.int64, n, "delta_partials")
                xi = <const int64_t*>cnp.PyArray_DATA(xa)
            elif kind == 3:
                xa = _col(values[c], np.float64, n, "delta_partials")
                xf = <const double*>cnp.PyArray_DATA(xa)
        if kind == 3:
            res = np.empty(G, dtype=np.float64)
            of = <double*>cnp.PyArray_DATA(res)
            with nogil:
                for g in range(G):
                    facc = 0.0
                    for r in range(pb[g], pb[g + 1]):
                        if r == pb[g]:
                            facc = (xf[r] if ok == NULL or ok[r] else 0.0) * <double>pw[r]
                        else:
                            facc = facc + (xf[r] if ok == NULL or ok[r] else 0.0) * <double>pw[r]
                    of[g] = facc
        else:
            res = np.empty(G, dtype=np.int64)
            oi = <int64_t*>cnp.PyArray_DATA(res)
            with nogil:
                for g in range(G):
                    acc = 0
                    for r in range(pb[g], pb[g + 1]):
                        if ok != NULL and not ok[r]:
                            continue
                        if kind == 2:
                            bad |= mul_overflow(xi[r], pw[r], &p)
                        else:
                            p = pw[r]
                        bad |= add_overflow(acc, p, &acc)
                    oi[g] = acc
            if bad:
                return None
        out.append(res)
    return out
