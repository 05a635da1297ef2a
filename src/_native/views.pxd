# Inline helpers that turn the Python-level code arrays of ``dbsp.algebra.codes`` into borrowed
# C views (``codes_t``), and back.
#
# Usage: ``owner = as_codes(obj)`` normalizes (uint64 C-contiguous ndarray, or a VarCodes whose
# offsets/data are contiguous int64/uint8) and validates; ``v = codes_view(owner)`` borrows
# pointers that stay valid while ``owner`` is referenced. Each module that cimports this must call
# ``cnp.import_array()`` once.
cimport numpy as cnp
from libc.stdint cimport uint8_t, int64_t, uint64_t

from _native.types cimport var_t, codes_t

import numpy as np


cdef inline object as_u64(object a):
    """A C-contiguous uint64 ndarray with the values of ``a`` (no copy when it already is one)."""
    if cnp.PyArray_Check(a) and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.NPY_UINT64 \
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a) \
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a):
        return a  # (C-level checks: no module attribute lookup or dtype comparison per call)
    return np.ascontiguousarray(a, dtype=np.uint64)


cdef inline object as_i64(object a):
    """A C-contiguous int64 ndarray with the values of ``a`` (no copy when it already is one)."""
    if cnp.PyArray_Check(a) and cnp.PyArray_TYPE(<cnp.ndarray>a) == cnp.NPY_INT64 \
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a) \
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a):
        return a
    return np.ascontiguousarray(a, dtype=np.int64)


cdef inline bint is_var(object codes):
    return not cnp.PyArray_Check(codes)


cdef inline tuple as_var(object codes):
    """(offsets int64, data uint8) of a VarCodes-like object, contiguous and checked.

    The bounds are checked on every call; that the offsets never decrease is checked once per
    code array and remembered on it (``_monotone``): code arrays are immutable, and scanning the
    offsets of a 10M-row batch on every probe made each probe cost time proportional to the
    history (issue 14: distinct, top-k, rank, left join)."""
    cdef cnp.ndarray off = as_i64(codes.offsets)
    cdef object d = codes.data
    if not (cnp.PyArray_Check(d) and cnp.PyArray_TYPE(<cnp.ndarray>d) == cnp.NPY_UINT8
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>d)):
        if isinstance(d, (bytes, bytearray)):
            d = np.frombuffer(d, dtype=np.uint8)
        d = np.ascontiguousarray(d, dtype=np.uint8).reshape(-1)
    cdef cnp.ndarray data = d
    if off.ndim != 1 or data.ndim != 1 or off.shape[0] < 1:
        raise ValueError("VarCodes needs 1-d offsets (n + 1 entries) and 1-d data")
    cdef const int64_t* o = <const int64_t*>cnp.PyArray_DATA(off)
    cdef int64_t n = off.shape[0] - 1
    cdef int64_t nd = data.shape[0]
    cdef int64_t i
    cdef bint ok = True
    if o[0] < 0 or o[n] > nd:
        raise ValueError("VarCodes offsets must be non-decreasing and within the data")
    if off is codes.offsets and getattr(codes, "_monotone", False):
        return off, data
    with nogil:
        for i in range(n):
            if o[i + 1] < o[i]:
                ok = False
                break
    if not ok:
        raise ValueError("VarCodes offsets must be non-decreasing and within the data")
    if off is codes.offsets:
        try:
            object.__setattr__(codes, "_monotone", True)
        except (AttributeError, TypeError):  # an object that takes no attribute: check each time
            pass
    return off, data


cdef inline object as_codes(object codes):
    """Normalize a code array: a uint64 ndarray, or an (offsets, data) tuple for var codes."""
    if cnp.PyArray_Check(codes):
        if (<cnp.ndarray>codes).ndim != 1:
            raise ValueError("u64 codes must be a 1-d array")
        return as_u64(codes)
    return as_var(codes)


cdef inline codes_t codes_view(object owner):
    """Borrow pointers from a result of ``as_codes`` (valid while ``owner`` lives)."""
    cdef codes_t v
    cdef cnp.ndarray a
    v.u64 = NULL
    v.var.offsets = NULL
    v.var.data = NULL
    v.var.n = 0
    if cnp.PyArray_Check(owner):
        a = owner
        v.u64 = <const uint64_t*>cnp.PyArray_DATA(a)
        v.n = a.shape[0]
    else:
        a = owner[0]
        v.var.offsets = <const int64_t*>cnp.PyArray_DATA(a)
        v.var.n = a.shape[0] - 1
        a = owner[1]
        v.var.data = <const uint8_t*>cnp.PyArray_DATA(a)
        v.n = v.var.n
    return v


cdef inline cnp.ndarray shrink(cnp.ndarray a, int64_t n):
    """``a[:n]`` without keeping the unused tail alive (a fresh, unshared 1-d array)."""
    cdef cnp.npy_intp d = n
    cdef cnp.PyArray_Dims dims
    if n != a.shape[0]:
        # numpy's C call, not the ``resize`` method (its lookup and keyword parsing cost ~2.5K
        # instructions, more than the realloc; a 100-row step made dozens of these)
        dims.ptr = &d
        dims.len = 1
        cnp.PyArray_Resize(a, &dims, 0, cnp.NPY_ANYORDER)
    return a
