"""Kernels of the small-step path (native twins of the same functions in ``kernels_ref``).

A step of a hundred rows spends more in Python-level calls than in work: a check written with
numpy (``np.diff``, ``np.all``, ``abs(float(a.max()))`` ...) costs five to twenty calls, each a
microsecond or more, for a loop of a hundred iterations. These are those checks as one call.

* ``is_identity(idx)``: whether ``idx`` is ``0, 1, ..., n-1`` (a take that changes nothing).
* ``mul_checked(a, b)``: the element-wise product of int64 weights, wrapped, and the mask of the
  products out of int64 (None when there is none), with the compiler's overflow-checked multiply.
* ``join_matched_pairs(xo, ai, yo, bi, xw, yw)``: a join's matched value pairs, their key and
  their checked weight products in one pass (``expand_pairs``, a repeat and ``mul_checked``, which
  cost a dozen numpy calls per probed batch); a side known to hold one value of weight 1 per
  key is read through its keys only.

Every loop runs without the GIL.
"""
cimport numpy as cnp
from _native.arrays cimport contig, contig_any, empty1, zeros1
from libc.stdint cimport int64_t, uint8_t

import numpy as np

cnp.import_array()

cdef extern from *:
    bint mul_overflow "__builtin_mul_overflow"(int64_t a, int64_t b, int64_t* out) noexcept nogil


def is_identity(idx):
    """Whether the integer array ``idx`` is ``0, 1, ..., len(idx) - 1``."""
    cdef cnp.ndarray a = contig(idx, cnp.NPY_INT64)
    cdef int64_t n = a.shape[0], i
    cdef const int64_t* p = <const int64_t*>cnp.PyArray_DATA(a)
    cdef bint same = True
    with nogil:
        for i in range(n):
            if p[i] != i:
                same = False
                break
    return same


def mul_checked(a, b):
    """``(a * b wrapped, None when no product leaves int64 else the bool mask of those that
    do)`` for int64 arrays of one length."""
    cdef cnp.ndarray x = contig(a, cnp.NPY_INT64)
    cdef cnp.ndarray y = contig(b, cnp.NPY_INT64)
    cdef int64_t n = x.shape[0], i, bad = 0
    if y.shape[0] != n:
        raise ValueError(f"mul_checked: {n} and {y.shape[0]} weights")
    cdef cnp.ndarray out = empty1(n, cnp.NPY_INT64)
    cdef const int64_t* px = <const int64_t*>cnp.PyArray_DATA(x)
    cdef const int64_t* py = <const int64_t*>cnp.PyArray_DATA(y)
    cdef int64_t* po = <int64_t*>cnp.PyArray_DATA(out)
    with nogil:
        for i in range(n):
            bad += mul_overflow(px[i], py[i], &po[i])
    if bad == 0:
        return out, None
    cdef cnp.ndarray over = zeros1(n, cnp.NPY_BOOL)
    cdef uint8_t* pm = <uint8_t*>cnp.PyArray_DATA(over)
    cdef int64_t r
    with nogil:
        for i in range(n):
            pm[i] = mul_overflow(px[i], py[i], &r)
    return out, over


def join_matched_pairs(xo, ai, yo, bi, xw, yw, bint x_unit=False, bint y_unit=False):
    """The matched value pairs of two indexed batches in one pass: ``(kidx, xs, ys, w, over)``.

    Key ``ai[m]`` of X matches key ``bi[m]`` of Y (``xo`` / ``yo``: their offsets, ``xw`` /
    ``yw``: their value weights). For each match, every pair of value rows ``(x, y)``, x-major
    (as ``expand_pairs``): ``kidx`` the X key of the pair, ``w = xw[x] * yw[y]`` wrapped, and
    ``over`` None when no product leaves int64, else the bool mask of those that do (as
    ``mul_checked``).

    ``x_unit`` / ``y_unit``: the caller knows that every key of that side holds one value of
    weight 1 (``offsets == 0..n``, weights all 1: a primary key's index of inserts); its offsets
    and weights are then not read. On a stored batch of a million keys those are two cache
    misses per matched pair."""
    cdef cnp.ndarray axo = contig(xo, cnp.NPY_INT64)
    cdef cnp.ndarray ayo = contig(yo, cnp.NPY_INT64)
    cdef cnp.ndarray aai = contig(ai, cnp.NPY_INT64)
    cdef cnp.ndarray abi = contig(bi, cnp.NPY_INT64)
    cdef cnp.ndarray axw = contig(xw, cnp.NPY_INT64)
    cdef cnp.ndarray ayw = contig(yw, cnp.NPY_INT64)
    cdef int64_t M = aai.shape[0], nxk = axo.shape[0] - 1, nyk = ayo.shape[0] - 1
    cdef int64_t m, x, y, i, j, total = 0, o = 0, bad = 0, nxv = axw.shape[0], nyv = ayw.shape[0]
    cdef int64_t x0, x1, y0, y1
    if abi.shape[0] != M:
        raise ValueError(f"join_matched_pairs: {M} and {abi.shape[0]} matched keys")
    if (x_unit and nxk != nxv) or (y_unit and nyk != nyv):
        raise ValueError("join_matched_pairs: a side said to hold one value per key has "
                         f"{nxk} keys and {nxv} values (X) / {nyk} keys and {nyv} values (Y)")
    cdef const int64_t* pxo = <const int64_t*>cnp.PyArray_DATA(axo)
    cdef const int64_t* pyo = <const int64_t*>cnp.PyArray_DATA(ayo)
    cdef const int64_t* pai = <const int64_t*>cnp.PyArray_DATA(aai)
    cdef const int64_t* pbi = <const int64_t*>cnp.PyArray_DATA(abi)
    cdef const int64_t* pxw = <const int64_t*>cnp.PyArray_DATA(axw)
    cdef const int64_t* pyw = <const int64_t*>cnp.PyArray_DATA(ayw)
    with nogil:
        for m in range(M):
            i = pai[m]
            j = pbi[m]
            if i < 0 or i >= nxk or j < 0 or j >= nyk:
                bad = 1
                break
            if not x_unit and (pxo[i] < 0 or pxo[i + 1] > nxv):
                bad = 1
                break
            if not y_unit and (pyo[j] < 0 or pyo[j + 1] > nyv):
                bad = 1
                break
            total += (1 if x_unit else pxo[i + 1] - pxo[i]) * \
                (1 if y_unit else pyo[j + 1] - pyo[j])
    if bad:
        raise IndexError("join_matched_pairs: a matched key or its values are out of range")
    cdef cnp.ndarray kidx = empty1(total, cnp.NPY_INT64)
    cdef cnp.ndarray xs = empty1(total, cnp.NPY_INT64)
    cdef cnp.ndarray ys = empty1(total, cnp.NPY_INT64)
    cdef cnp.ndarray w = empty1(total, cnp.NPY_INT64)
    cdef int64_t* pk = <int64_t*>cnp.PyArray_DATA(kidx)
    cdef int64_t* px = <int64_t*>cnp.PyArray_DATA(xs)
    cdef int64_t* py = <int64_t*>cnp.PyArray_DATA(ys)
    cdef int64_t* pw = <int64_t*>cnp.PyArray_DATA(w)
    with nogil:
        if y_unit:  # the stored side of a primary key: w = xw[x]
            for m in range(M):
                i = pai[m]
                j = pbi[m]
                x0 = i if x_unit else pxo[i]
                x1 = i + 1 if x_unit else pxo[i + 1]
                for x in range(x0, x1):
                    pk[o] = i
                    px[o] = x
                    py[o] = j
                    pw[o] = 1 if x_unit else pxw[x]
                    o += 1
        elif x_unit:  # w = yw[y]
            for m in range(M):
                i = pai[m]
                j = pbi[m]
                for y in range(pyo[j], pyo[j + 1]):
                    pk[o] = i
                    px[o] = i
                    py[o] = y
                    pw[o] = pyw[y]
                    o += 1
        else:
            for m in range(M):
                i = pai[m]
                j = pbi[m]
                for x in range(pxo[i], pxo[i + 1]):
                    for y in range(pyo[j], pyo[j + 1]):
                        pk[o] = i
                        px[o] = x
                        py[o] = y
                        bad += mul_overflow(pxw[x], pyw[y], &pw[o])
                        o += 1
    if bad == 0:
        return kidx, xs, ys, w, None
    cdef cnp.ndarray over = zeros1(total, cnp.NPY_BOOL)
    cdef uint8_t* pm = <uint8_t*>cnp.PyArray_DATA(over)
    cdef int64_t r
    with nogil:
        for o in range(total):
            pm[o] = mul_overflow(pxw[px[o]], pyw[py[o]], &r)
    return kidx, xs, ys, w, over
