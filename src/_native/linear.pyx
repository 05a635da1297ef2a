"""Kernels of the linear aggregate's per-step path (native twins of the same functions in
``kernels_ref``).

A linear aggregate (count / sum / avg) keeps one row of *partials* per key (row count, non-null
counts, weighted sums: int64 or float64 columns) and each step adds the delta's partials to the
touched keys' old ones. With a hundred keys a step, the numpy version of that bookkeeping costs
some fifty calls (an add, an overflow check, a comparison per column, masks, where, repeat ...),
each a microsecond or more, for loops of a hundred iterations. These are those loops as native
calls, every loop without the GIL:

* ``combine_partials(old, delta, has_old, is_int, positive)``: ``new = old + delta`` column by
  column, with which keys changed, which keep a partial row (not all zero) and the rows to emit
  (``-old`` then ``+new``); None when an int64 sum leaves int64 or (``positive``) a row count
  goes negative: the caller then takes the checked path that names the key.
* ``delta_partials``: a delta's partials grouped by key, in one pass.

The rows that replace the changed keys' partials in the versioned-rows spine, and their values,
come from the versioned state's own kernels (``dbsp._native.state``: ``versioned_pairs``,
``pick_rows``), which the general aggregate uses too.

Columns are lists of 1-d contiguous ``int64`` or ``float64`` arrays of one length.
"""
cimport numpy as cnp
from _native.arrays cimport contig, contig_any, empty1, zeros1
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
    cdef cnp.ndarray h = contig(has_old, cnp.NPY_BOOL)
    cdef int64_t G = h.shape[0], g, n_old = 0, n_new = 0
    cdef const uint8_t* ph = <const uint8_t*>cnp.PyArray_DATA(h)
    cdef cnp.ndarray changed = zeros1(G, cnp.NPY_BOOL)
    cdef cnp.ndarray keep = zeros1(G, cnp.NPY_BOOL)
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
            out = empty1(G, cnp.NPY_INT64)
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
            out = empty1(G, cnp.NPY_FLOAT64)
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
    cdef cnp.ndarray o0 = contig(old[0], cnp.NPY_INT64)
    cdef const int64_t* pr = <const int64_t*>cnp.PyArray_DATA(r0)
    cdef const int64_t* po = <const int64_t*>cnp.PyArray_DATA(o0)
    cdef cnp.ndarray eo = empty1(G, cnp.NPY_INT64)
    cdef cnp.ndarray en = empty1(G, cnp.NPY_INT64)
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
    cdef cnp.ndarray b = contig(bounds, cnp.NPY_INT64)
    cdef cnp.ndarray w = contig(weights, cnp.NPY_INT64)
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
            res = empty1(G, cnp.NPY_FLOAT64)
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
            res = empty1(G, cnp.NPY_INT64)
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
