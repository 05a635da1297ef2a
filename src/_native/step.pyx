"""Kernels of the small-step path (native twins of the same functions in ``kernels_ref``).

A step of a hundred rows spends more in Python-level calls than in work: a check written with
numpy (``np.diff``, ``np.all``, ``abs(float(a.max()))`` ...) costs five to twenty calls, each a
microsecond or more, for a loop of a hundred iterations. These are those checks as one call.

* ``is_identity(idx)``: whether ``idx`` is ``0, 1, ..., n-1`` (a take that changes nothing).
* ``mul_checked(a, b)``: the element-wise product of int64 weights, wrapped, and the mask of the
  products out of int64 (None when there is none), with the compiler's overflow-checked multiply.

Every loop runs without the GIL.
"""
cimport numpy as cnp
from libc.stdint cimport int64_t, uint8_t

import numpy as np

cnp.import_array()

cdef extern from *:
    bint mul_overflow "__builtin_mul_overflow"(int64_t a, int64_t b, int64_t* out) noexcept nogil


def is_identity(idx):
    """Whether the integer array ``idx`` is ``0, 1, ..., len(idx) - 1``."""
    cdef cnp.ndarray a = np.ascontiguousarray(idx, dtype=np.int64)
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
    cdef cnp.ndarray x = np.ascontiguousarray(a, dtype=np.int64)
    cdef cnp.ndarray y = np.ascontiguousarray(b, dtype=np.int64)
    cdef int64_t n = x.shape[0], i, bad = 0
    if y.shape[0] != n:
        raise ValueError(f"mul_checked: {n} and {y.shape[0]} weights")
    cdef cnp.ndarray out = np.empty(n, dtype=np.int64)
    cdef const int64_t* px = <const int64_t*>cnp.PyArray_DATA(x)
    cdef const int64_t* py = <const int64_t*>cnp.PyArray_DATA(y)
    cdef int64_t* po = <int64_t*>cnp.PyArray_DATA(out)
    with nogil:
        for i in range(n):
            bad += mul_overflow(px[i], py[i], &po[i])
    if bad == 0:
        return out, None
    cdef cnp.ndarray over = np.zeros(n, dtype=bool)
    cdef uint8_t* pm = <uint8_t*>cnp.PyArray_DATA(over)
    cdef int64_t r
    with nogil:
        for i in range(n):
            pm[i] = mul_overflow(px[i], py[i], &r)
    return out, over
