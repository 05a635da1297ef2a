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
from _native.codes_cmp cimport min_head
from libc.stdint cimport int64_t, uint64_t, uint32_t, uint16_t, uint8_t, INT64_MIN, INT64_MAX
from libc.string cimport memcpy, memmove

import numpy as np

cnp.import_array()

cdef extern from *:
    bint add_overflow "__builtin_add_overflow"(int64_t a, int64_t b, int64_t* out) noexcept nogil


cdef inline cnp.ndarray _col(object a, int typenum, int64_t n, str what):
    cdef cnp.ndarray x = contig(a, typenum)  # (no numpy call when it is one already)
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
            o = _col(old[j], cnp.NPY_INT64, G, "combine_partials")
            d = _col(delta[j], cnp.NPY_INT64, G, "combine_partials")
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
            o = _col(old[j], cnp.NPY_FLOAT64, G, "combine_partials")
            d = _col(delta[j], cnp.NPY_FLOAT64, G, "combine_partials")
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
                va = _col(v, cnp.NPY_BOOL, n, "delta_partials")
                ok = <const uint8_t*>cnp.PyArray_DATA(va)
            if kind == 2:
                xa = _col(values[c], cnp.NPY_INT64, n, "delta_partials")
                xi = <const int64_t*>cnp.PyArray_DATA(xa)
            elif kind == 3:
                xa = _col(values[c], cnp.NPY_FLOAT64, n, "delta_partials")
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


cdef inline int _cmp_f64(double a, double b) noexcept nogil:
    """-1, 0, 1 in the key-code order of float64: ``-0.0`` equals ``0.0``, every NaN equals
    every NaN and sorts after every number."""
    cdef bint na = a != a, nb = b != b
    if na or nb:
        return 0 if (na and nb) else (1 if na else -1)
    return -1 if a < b else (1 if a > b else 0)


cdef inline int _cmp_i64(int64_t a, int64_t b) noexcept nogil:
    return -1 if a < b else (1 if a > b else 0)


cdef inline int64_t _row_count(const void* o_c, const void* n_c, const void* o_s,
                               const void* n_s, int64_t w, int64_t k,
                               const void** sums) noexcept nogil:
    """The count partial of key ``k``'s output row of weight ``w`` (:func:`finish_emit`): the
    old partials' (count column ``o_c``, sum column ``o_s``) for a retraction, the new ones'
    (``n_c``, ``n_s``) for an insertion; the sum column in ``sums[0]``."""
    if w < 0:
        sums[0] = o_s
        return (<const int64_t*>o_c)[k]
    sums[0] = n_s
    return (<const int64_t*>n_c)[k]


def finish_emit(old, new, eo, en, plan, is_int):
    """The output rows of a linear aggregate's step, in row order and consolidated.

    ``old`` / ``new``: the touched keys' partial columns (int64 where ``is_int[j]``, else
    float64); ``eo`` / ``en``: the keys (ascending) whose old row is retracted / new row
    inserted (:func:`combine_partials`). ``plan``: per output column ``(kind, c, s)``: kind 0
    the count in partial column ``c``; 1 the sum in column ``s``, null where the count in ``c``
    is 0; 2 the average ``float(s) / float(c)``, null where ``c`` is 0.

    Returns ``(rows, weights, columns)``: ``rows`` the key of each output row (ascending; a key
    in both ``eo`` and ``en`` gives its two rows in the key-code order of their values: nulls
    first, ``-0.0 == 0.0``, NaN last; none when the two finished rows are equal), ``weights``
    -1 (old) / +1 (new), and per output column ``(values, null mask or None)`` (values 0 where
    null): rows in the order of the row codes of ``key ++ values``, each row once."""
    cdef Py_ssize_t ncol = len(plan), nparts = len(old), j
    if len(new) != nparts or len(is_int) != nparts or nparts == 0:
        raise ValueError("finish_emit: old, new and is_int need one entry per partial column")
    if nparts > 64:
        raise ValueError("finish_emit: at most 64 partial columns")
    cdef cnp.ndarray ea = contig(eo, cnp.NPY_INT64)
    cdef cnp.ndarray na_ = contig(en, cnp.NPY_INT64)
    cdef int64_t no = ea.shape[0], nn = na_.shape[0], G = len(old[0]), i, a, b, m
    cdef const int64_t* peo = <const int64_t*>cnp.PyArray_DATA(ea)
    cdef const int64_t* pen = <const int64_t*>cnp.PyArray_DATA(na_)
    # per output column: kind, count column, sum column, whether the sum is a float
    cdef int64_t kinds[64]
    cdef int64_t ccol[64]
    cdef int64_t scol[64]
    cdef bint sflt[64]
    if ncol > 64:
        raise ValueError("finish_emit: at most 64 output columns")
    cdef const void* po[64]
    cdef const void* pn[64]
    keep = []
    for j in range(nparts):
        o = contig(old[j], cnp.NPY_INT64 if is_int[j] else cnp.NPY_FLOAT64)
        n = contig(new[j], cnp.NPY_INT64 if is_int[j] else cnp.NPY_FLOAT64)
        if o.shape[0] != G or n.shape[0] != G:
            raise ValueError("finish_emit: partial columns differ in length")
        keep.append((o, n))
        po[j] = cnp.PyArray_DATA(o)
        pn[j] = cnp.PyArray_DATA(n)
    for j in range(ncol):
        kinds[j], ccol[j], scol[j] = plan[j]
        if kinds[j] < 0 or kinds[j] > 2 or not 0 <= ccol[j] < nparts or not is_int[ccol[j]] \
                or (kinds[j] > 0 and not 0 <= scol[j] < nparts):
            raise ValueError(f"finish_emit: bad plan entry {plan[j]!r}")
        sflt[j] = kinds[j] > 0 and not is_int[scol[j]]
    for i in range(no):
        if peo[i] < 0 or peo[i] >= G or (i and peo[i] <= peo[i - 1]):
            raise ValueError("finish_emit: eo must be ascending keys below the key count")
    for i in range(nn):
        if pen[i] < 0 or pen[i] >= G or (i and pen[i] <= pen[i - 1]):
            raise ValueError("finish_emit: en must be ascending keys below the key count")
    cdef cnp.ndarray rows_a = empty1(no + nn, cnp.NPY_INT64)
    cdef cnp.ndarray w_a = empty1(no + nn, cnp.NPY_INT64)
    cdef int64_t* prow = <int64_t*>cnp.PyArray_DATA(rows_a)
    cdef int64_t* pw = <int64_t*>cnp.PyArray_DATA(w_a)
    cdef int c
    cdef int64_t k, cnt_o, cnt_n
    cdef double fo, fn_
    cdef bint nul_o, nul_n
    with nogil:
        a = b = m = 0
        while a < no or b < nn:
            if b >= nn or (a < no and peo[a] < pen[b]):
                prow[m] = peo[a]
                pw[m] = -1
                m += 1
                a += 1
                continue
            if a >= no or pen[b] < peo[a]:
                prow[m] = pen[b]
                pw[m] = 1
                m += 1
                b += 1
                continue
            # the key has both rows: compare the finished rows column by column
            k = peo[a]
            c = 0
            for j in range(ncol):
                cnt_o = (<const int64_t*>po[ccol[j]])[k]
                cnt_n = (<const int64_t*>pn[ccol[j]])[k]
                if kinds[j] == 0:
                    c = _cmp_i64(cnt_o, cnt_n)
                else:
                    nul_o = cnt_o == 0
                    nul_n = cnt_n == 0
                    if nul_o or nul_n:
                        c = 0 if (nul_o and nul_n) else (-1 if nul_o else 1)
                    elif kinds[j] == 1 and not sflt[j]:
                        c = _cmp_i64((<const int64_t*>po[scol[j]])[k],
                                     (<const int64_t*>pn[scol[j]])[k])
                    else:
                        if sflt[j]:
                            fo = (<const double*>po[scol[j]])[k]
                            fn_ = (<const double*>pn[scol[j]])[k]
                        else:
                            fo = <double>(<const int64_t*>po[scol[j]])[k]
                            fn_ = <double>(<const int64_t*>pn[scol[j]])[k]
                        if kinds[j] == 2:
                            fo = fo / <double>cnt_o
                            fn_ = fn_ / <double>cnt_n
                        c = _cmp_f64(fo, fn_)
                if c != 0:
                    break
            a += 1
            b += 1
            if c == 0:
                continue  # the same output row: -1 and +1 cancel
            prow[m] = k
            pw[m] = -1 if c < 0 else 1
            prow[m + 1] = k
            pw[m + 1] = -pw[m]
            m += 2
    # the finished values of the output rows
    cols = []
    cdef cnp.ndarray va, ma
    cdef int64_t* vi
    cdef double* vf
    cdef uint8_t* pm
    cdef int64_t nnull
    cdef const void* src_s
    cdef const void* o_c
    cdef const void* n_c
    cdef const void* o_s
    cdef const void* n_s
    for j in range(ncol):
        ma = empty1(m, cnp.NPY_BOOL)
        pm = <uint8_t*>cnp.PyArray_DATA(ma)
        nnull = 0
        # the column's count and sum partials, old and new (no sum column for a count)
        o_c = po[ccol[j]]
        n_c = pn[ccol[j]]
        o_s = po[scol[j]] if kinds[j] else NULL
        n_s = pn[scol[j]] if kinds[j] else NULL
        if kinds[j] == 2 or sflt[j]:
            va = empty1(m, cnp.NPY_FLOAT64)
            vf = <double*>cnp.PyArray_DATA(va)
            with nogil:
                for i in range(m):
                    k = prow[i]
                    cnt_o = _row_count(o_c, n_c, o_s, n_s, pw[i], k, &src_s)
                    pm[i] = cnt_o == 0
                    if cnt_o == 0:
                        nnull += 1
                        vf[i] = 0.0
                        continue
                    fo = (<const double*>src_s)[k] if sflt[j] else \
                        <double>(<const int64_t*>src_s)[k]
                    vf[i] = fo / <double>cnt_o if kinds[j] == 2 else fo
        else:
            va = empty1(m, cnp.NPY_INT64)
            vi = <int64_t*>cnp.PyArray_DATA(va)
            with nogil:
                for i in range(m):
                    k = prow[i]
                    cnt_o = _row_count(o_c, n_c, o_s, n_s, pw[i], k, &src_s)
                    if kinds[j] == 0:
                        pm[i] = 0
                        vi[i] = cnt_o
                    elif cnt_o == 0:
                        pm[i] = 1
                        nnull += 1
                        vi[i] = 0
                    else:
                        pm[i] = 0
                        vi[i] = (<const int64_t*>src_s)[k]
        cols.append((va, ma if nnull else None))
    return rows_a[:m], w_a[:m], cols


cdef int _int_type(int w, bint signed) noexcept:
    if w == 8:
        return cnp.NPY_INT64 if signed else cnp.NPY_UINT64
    if w == 4:
        return cnp.NPY_INT32 if signed else cnp.NPY_UINT32
    if w == 2:
        return cnp.NPY_INT16 if signed else cnp.NPY_UINT16
    return cnp.NPY_INT8 if signed else cnp.NPY_UINT8


def decode_u64(codes, list plan):
    """The key columns of u64 key codes (twin of ``kernels_ref.decode_u64``, the inverse of
    ``arrow_c.encode_u64``): ``plan`` per column ``(byte width, signed, nullable)``, columns
    packed most significant first, a nullable column's validity byte before its value, a signed
    value's sign bit flipped. Per column ``(values, null mask or None)``: values as the signed
    (else unsigned) integers of that width, 0 where null; a mask only for a nullable column
    with a null. A linear aggregate's combiner sends a key's code, not its columns, and reads
    the columns back from the code (one pass a column, no Arrow call)."""
    cdef cnp.ndarray ca = contig(codes, cnp.NPY_UINT64)
    cdef int64_t n = ca.shape[0], i
    cdef Py_ssize_t k = len(plan), c
    cdef int w, shift = 0, vshift, fshift, bits = 0
    cdef bint signed, nullable, anynull
    cdef uint64_t vmask, flip, v
    cdef const uint64_t* pc = <const uint64_t*>cnp.PyArray_DATA(ca)
    cdef cnp.ndarray va, ma
    cdef uint8_t* pm
    cdef void* pv
    for c in range(k):
        w, signed, nullable = plan[c]
        if w not in (1, 2, 4, 8):
            raise ValueError(f"decode_u64: plan {plan} is not a u64 code")
        bits += 8 * w + (8 if nullable else 0)
    if bits > 64:
        raise ValueError(f"decode_u64: plan {plan} is not a u64 code")
    cdef list out = [None] * k
    for c in range(k - 1, -1, -1):
        w, signed, nullable = plan[c]
        vshift = shift
        shift += 8 * w
        fshift = shift
        if nullable:
            shift += 8
        vmask = 0xFFFFFFFFFFFFFFFF if w == 8 else ((<uint64_t>1) << (8 * w)) - 1
        flip = (<uint64_t>1) << (8 * w - 1) if signed else 0
        va = empty1(n, _int_type(w, signed))
        pv = cnp.PyArray_DATA(va)
        ma = None
        anynull = False
        if nullable:
            ma = empty1(n, cnp.NPY_BOOL)
            pm = <uint8_t*>cnp.PyArray_DATA(ma)
        with nogil:
            for i in range(n):
                v = ((pc[i] >> vshift) & vmask) ^ flip
                if nullable:
                    if ((pc[i] >> fshift) & 0xFF) == 0:
                        pm[i] = 1
                        anynull = True
                        v = 0
                    else:
                        pm[i] = 0
                if w == 8:
                    (<uint64_t*>pv)[i] = v
                elif w == 4:
                    (<uint32_t*>pv)[i] = <uint32_t>v
                elif w == 2:
                    (<uint16_t*>pv)[i] = <uint16_t>v
                else:
                    (<uint8_t*>pv)[i] = <uint8_t>v
        out[c] = (va, ma if anynull else None)
    return out


cdef extern from *:
    """
    typedef __int128 agg_i128;   /* exact sums of int64 partials */
    """
    ctypedef long long agg_i128


cdef struct _parts_t:
    # W packed parts as the merge reads them: part w's data and key count, whether column c
    # is int64 (else float64)
    const uint64_t* base[64]
    int64_t kn[64]
    uint8_t isi[64]
    Py_ssize_t W, C


cdef int64_t _check_parts(list parts, list is_int, _parts_t* P, list keep,
                          str what) except -1:
    """Point ``P.base[w]`` at packed part ``w`` (``P.kn[w]`` keys): 2-d ``uint64`` arrays of
    ``1 + C`` rows (``C = len(is_int)``, ``P.isi[c]`` set from ``is_int[c]``) whose row 0 is
    ascending and distinct (a C-contiguous copy, kept alive in ``keep``, of one that is not).
    Returns the total number of keys."""
    cdef Py_ssize_t W = len(parts), C = len(is_int), w, c
    cdef int64_t n = 0, i
    cdef cnp.ndarray a
    cdef const uint64_t** base = P.base
    cdef int64_t* kn = P.kn
    if W == 0 or W > 64 or C > 64:
        raise ValueError(f"{what}: {W} parts (1 to 64), {C} columns (at most 64)")
    P.W, P.C = W, C
    for c in range(C):
        P.isi[c] = 1 if is_int[c] else 0
    for w in range(W):
        x = parts[w]
        if not cnp.PyArray_Check(x):
            raise ValueError(f"{what}: part {w} is not a uint64 array of {1 + C} rows")
        a = <cnp.ndarray>x
        if a.ndim != 2 or a.shape[0] != 1 + C or cnp.PyArray_TYPE(a) != cnp.NPY_UINT64 \
                or not cnp.PyArray_ISNOTSWAPPED(a):
            raise ValueError(f"{what}: part {w} is not a uint64 array of {1 + C} rows")
        if not cnp.PyArray_IS_C_CONTIGUOUS(a):
            a = np.ascontiguousarray(a)
            keep.append(a)
        base[w] = <const uint64_t*>cnp.PyArray_DATA(a)
        kn[w] = a.shape[1]
        n += kn[w]
        for i in range(1, kn[w]):
            if base[w][i] <= base[w][i - 1]:
                raise ValueError(f"{what}: a key run is not ascending and distinct")
    return n


cdef int64_t _count_keys(const uint64_t** base, const int64_t* kn, Py_ssize_t W) noexcept nogil:
    """The number of distinct codes over the ascending runs ``base[w][:kn[w]]``."""
    cdef int64_t pos[64]
    cdef int64_t g = 0, best
    cdef Py_ssize_t w
    cdef uint64_t bk = 0
    for w in range(W):
        pos[w] = 0
    while True:
        best = min_head(base, pos, kn, W, &bk)
        if best < 0:
            return g
        for w in range(best, W):
            if pos[w] < kn[w] and base[w][pos[w]] == bk:
                pos[w] += 1
        g += 1


cdef bint _merge_sum(const uint64_t** base, const int64_t* kn, Py_ssize_t W, Py_ssize_t C,
                     const uint8_t* isi, uint64_t** out, uint8_t* over) noexcept nogil:
    """The k-way merge of :func:`merge_sum_packed`: the distinct codes into ``out[0]``, column
    ``c`` summed per key into ``out[1 + c]`` (the bits of int64 / float64 values), ``over[g]``
    set where an int64 sum of key ``g`` leaves int64. Returns whether one did."""
    cdef int64_t pos[64]
    cdef int64_t g = 0, best
    cdef Py_ssize_t w, c
    cdef uint64_t bk = 0
    cdef agg_i128 acc
    cdef double facc, fadd
    cdef uint64_t bits
    cdef bint any_over = False
    for w in range(W):
        pos[w] = 0
    while True:
        best = min_head(base, pos, kn, W, &bk)  # the run of the smallest head
        if best < 0:
            return any_over
        out[0][g] = bk
        for c in range(C):
            if isi[c]:
                acc = <int64_t>base[best][(1 + c) * kn[best] + pos[best]]
                for w in range(best + 1, W):
                    if pos[w] < kn[w] and base[w][pos[w]] == bk:
                        acc += <int64_t>base[w][(1 + c) * kn[w] + pos[w]]
                if acc < <agg_i128>INT64_MIN or acc > <agg_i128>INT64_MAX:
                    over[g] = 1
                    any_over = True
                out[1 + c][g] = <uint64_t><int64_t>acc
            else:
                bits = base[best][(1 + c) * kn[best] + pos[best]]
                memcpy(&facc, &bits, 8)
                for w in range(best + 1, W):
                    if pos[w] < kn[w] and base[w][pos[w]] == bk:
                        memcpy(&fadd, &base[w][(1 + c) * kn[w] + pos[w]], 8)
                        facc = facc + fadd
                memcpy(&out[1 + c][g], &facc, 8)
        pos[best] += 1
        for w in range(best + 1, W):
            if pos[w] < kn[w] and base[w][pos[w]] == bk:
                pos[w] += 1
        g += 1


def merge_sum_packed(list parts, list is_int):
    """A combiner's packed parts merged and summed per key (twin of
    ``kernels_ref.merge_sum_packed``): ``parts`` are W 2-d ``uint64`` arrays of
    ``1 + C`` rows, row 0 a run of key codes (ascending, distinct), row ``1 + c`` the bits of
    partial column ``c`` (int64 where ``is_int[c]``, else float64). Returns ``(out, over)``:
    ``out`` of ``1 + C`` rows, row 0 the distinct codes ascending, row ``1 + c`` column ``c``
    summed per key (int64 sums exact, stored wrapped; floats added in part order from the
    first value), and a bool mask of the keys some int64 sum of which leaves int64 (None when
    none does).

    One k-way merge over the W heads into one allocation: the parts stay as they crossed the
    exchange (no array per column and part, no output array per column)."""
    cdef _parts_t P
    cdef uint64_t* outp[65]
    cdef list keep = []
    _check_parts(parts, is_int, &P, keep, "merge_sum_packed")
    cdef Py_ssize_t W = P.W, C = P.C, c
    cdef int64_t g = _count_keys(P.base, P.kn, W)
    cdef cnp.npy_intp dims[2]
    dims[0] = 1 + C
    dims[1] = g
    cdef cnp.ndarray out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_UINT64, 0)
    cdef uint64_t* po = <uint64_t*>cnp.PyArray_DATA(out)
    cdef cnp.ndarray overm = zeros1(g, cnp.NPY_BOOL)
    for c in range(1 + C):
        outp[c] = po + c * g
    cdef bint any_over
    with nogil:
        any_over = _merge_sum(P.base, P.kn, W, C, P.isi, outp, <uint8_t*>cnp.PyArray_DATA(overm))
    return out, (overm if any_over else None)


def pack_parts(kcodes, list cols, order, bounds):
    """A combiner's partials packed for each worker (twin of ``kernels_ref.pack_parts``):
    ``order[bounds[w]:bounds[w + 1]]`` are the rows of worker ``w`` (a shard map's ``order``);
    per worker None when it has no row, else a 2-d ``uint64`` array of ``1 + C`` rows (``C =
    len(cols)``): row 0 the codes ``kcodes[order[r]]``, row ``1 + c`` the bits of ``cols[c]``
    (8-byte items) at the same rows. With the rows of each worker ascending in ``order`` and
    ``kcodes`` ascending and distinct, each part is a run as :func:`merge_sum_packed` reads it.

    One allocation a worker, filled in one pass: no packed array of every row, no fancy-index
    take of it per worker."""
    cdef cnp.ndarray kc = contig(kcodes, cnp.NPY_UINT64)
    cdef cnp.ndarray oa = contig(order, cnp.NPY_INT64)
    cdef cnp.ndarray ba = contig(bounds, cnp.NPY_INT64)
    cdef int64_t n = kc.shape[0], W = ba.shape[0] - 1, w, r, m, i
    cdef Py_ssize_t C = len(cols), c
    cdef cnp.ndarray a
    cdef list keep = []
    cdef const uint64_t* src[64]
    if C > 63:
        raise ValueError(f"pack_parts: {C} columns (at most 63)")
    if W < 1:
        raise ValueError("pack_parts: bounds need at least two entries")
    for c in range(C):
        a = contig_any(cols[c])
        if a.ndim != 1 or a.shape[0] != n or a.itemsize != 8:
            raise ValueError(f"pack_parts: column {c} is not {n} items of 8 bytes")
        keep.append(a)
        src[c] = <const uint64_t*>cnp.PyArray_DATA(a)
    cdef const uint64_t* pk = <const uint64_t*>cnp.PyArray_DATA(kc)
    cdef const int64_t* po = <const int64_t*>cnp.PyArray_DATA(oa)
    cdef const int64_t* pb = <const int64_t*>cnp.PyArray_DATA(ba)
    if pb[0] != 0 or pb[W] != oa.shape[0]:
        raise ValueError("pack_parts: bounds must run from 0 to the length of order")
    for w in range(W):
        if pb[w + 1] < pb[w]:
            raise ValueError("pack_parts: bounds must not decrease")
    for i in range(oa.shape[0]):
        if po[i] < 0 or po[i] >= n:
            raise IndexError("pack_parts: a row of order is out of range")
    cdef list out = [None] * W
    cdef cnp.npy_intp dims[2]
    cdef uint64_t* pd
    dims[0] = 1 + C
    for w in range(W):
        m = pb[w + 1] - pb[w]
        if m == 0:
            continue
        dims[1] = m
        a = cnp.PyArray_EMPTY(2, dims, cnp.NPY_UINT64, 0)
        pd = <uint64_t*>cnp.PyArray_DATA(a)
        with nogil:
            for i in range(m):
                r = po[pb[w] + i]
                pd[i] = pk[r]
                for c in range(C):
                    pd[(1 + c) * m + i] = src[c][r]
        out[w] = a
    return out


def sum_unpack(list parts, list is_int, list plan):
    """A combiner's received packed parts summed per key and taken apart (twin of
    ``kernels_ref.sum_unpack``): ``(codes, columns, key columns)`` where ``codes`` are the
    distinct key codes ascending, ``columns`` the summed partial columns (int64 where
    ``is_int[c]``, else float64) and ``key columns`` the :func:`decode_u64` of the codes by
    ``plan``; None when some int64 sum leaves int64 (the caller's checked path names the key).
    The parts are :func:`merge_sum_packed`'s; the sums are written straight into one array per
    column (no packed result to take apart)."""
    cdef _parts_t P
    cdef uint64_t* outp[65]
    cdef list keep = []
    _check_parts(parts, is_int, &P, keep, "sum_unpack")
    cdef Py_ssize_t W = P.W, C = P.C, c
    cdef int64_t g = _count_keys(P.base, P.kn, W) if W > 1 else P.kn[0]
    cdef cnp.ndarray kc = empty1(g, cnp.NPY_UINT64)
    cdef cnp.ndarray overm = zeros1(g, cnp.NPY_BOOL)
    cdef list cols = []
    outp[0] = <uint64_t*>cnp.PyArray_DATA(kc)
    for c in range(C):
        a = empty1(g, cnp.NPY_INT64 if P.isi[c] else cnp.NPY_FLOAT64)
        cols.append(a)
        outp[1 + c] = <uint64_t*>cnp.PyArray_DATA(<cnp.ndarray>a)
    cdef bint any_over
    with nogil:
        any_over = _merge_sum(P.base, P.kn, W, C, P.isi, outp, <uint8_t*>cnp.PyArray_DATA(overm))
    if any_over:
        return None
    return kc, cols, decode_u64(kc, plan)
