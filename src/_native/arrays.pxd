# Inline helpers that make and check the numpy arrays of the kernels through numpy's C API.
#
# A kernel's set-up is paid on every call, and a small step calls a few dozen kernels: each
# ``np.empty(n, dtype=np.int64)`` written in Cython is two module attribute lookups plus numpy's
# argument parsing (~1.6K instructions), each ``np.ascontiguousarray(x, dtype=np.int64)`` on an
# array that already is one ~400, each ``np.int64`` alone ~250. These do the same through the C
# API (tens of instructions) and fall back to numpy's Python functions only to convert.
# Each module that cimports this must call ``cnp.import_array()`` once.
cimport numpy as cnp

import numpy as np


cdef inline bint is_contig(object x, int typenum) noexcept:
    """Whether ``x`` is an exact 1-d, C-contiguous, native-order ndarray of ``typenum``."""
    cdef cnp.ndarray a
    if not cnp.PyArray_CheckExact(x):
        return False
    a = <cnp.ndarray>x
    return (cnp.PyArray_NDIM(a) == 1 and cnp.PyArray_TYPE(a) == typenum
            and cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISNOTSWAPPED(a))


cdef inline cnp.ndarray contig(object x, int typenum):
    """``np.ascontiguousarray(x, dtype=<typenum>)``: ``x`` itself, without a Python call, when it
    already is such a 1-d array."""
    if is_contig(x, typenum):
        return <cnp.ndarray>x
    return np.ascontiguousarray(x, dtype=cnp.PyArray_DescrFromType(typenum))


cdef inline cnp.ndarray contig_any(object x):
    """``np.ascontiguousarray(x)``: ``x`` itself when it is an exact C-contiguous 1-d ndarray."""
    if cnp.PyArray_CheckExact(x) and cnp.PyArray_NDIM(<cnp.ndarray>x) == 1 \
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>x):
        return <cnp.ndarray>x
    return np.ascontiguousarray(x)


cdef inline cnp.ndarray empty1(cnp.npy_intp n, int typenum):
    """``np.empty(n, dtype=<typenum>)``."""
    return cnp.PyArray_EMPTY(1, &n, typenum, 0)


cdef inline cnp.ndarray zeros1(cnp.npy_intp n, int typenum):
    """``np.zeros(n, dtype=<typenum>)``."""
    return cnp.PyArray_ZEROS(1, &n, typenum, 0)
