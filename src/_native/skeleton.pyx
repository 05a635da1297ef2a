# cython: language_level=3
"""The walk of a wire message's skeleton (:mod:`dbsp.storage.wire`), compiled.

A data message's skeleton is its tree of tuples, lists, dicts and scalars, where every object
that travels by its buffers (a record batch, a numpy array, a registered batch of the layers
above) is a node ``(Ellipsis, kind, ...)``. The Python walk cost a function call a node (about
1 us each, 10-20 nodes a step's message); this is the same walk, with the same result, in C:

* :func:`encode` ``(obj, raws, other)``: atoms as they are, containers walked, a tuple that
  starts with ``Ellipsis`` escaped as ``(..., "t", items...)``, a container longer than ``big``
  (or a dict keyed by anything but atoms) and every other object handed to
  ``other(obj, raws)`` (the Python side: arrays, batches, registered objects, pickle);
* :func:`decode` ``(skeleton, bufs, kinds)``: the inverse, a node handed to
  ``kinds[kind](node, bufs)``;
* :func:`frames` and :func:`split_body`: the message layout (header, buffer lengths, skeleton,
  buffers, each part padded to 8 bytes) without a Python loop over the parts.

No GIL release: every step here touches Python objects.
"""
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

import numpy as np
cimport numpy as cnp

cnp.import_array()

cdef object _Ellipsis = Ellipsis
#: containers nested deeper than this are refused (the Python walk hit the recursion limit; a
#: C walk would overflow the stack instead)
cdef int _DEPTH = 1000
cdef type _NoneType = type(None)
cdef tuple _TAG_T = (Ellipsis, "t")
cdef list _PADS = [b""] + [bytes(8 - i) for i in range(1, 8)]



cdef object _enc(object o, list raws, object other, Py_ssize_t big, int depth, Walker w):
    cdef type t = type(o)
    cdef Py_ssize_t i, n
    cdef tuple tup, out
    cdef list lst, lout
    cdef dict d, dout
    if t is _NoneType or t is bool or t is int or t is float or t is str or t is bytes:
        return o
    if depth > _DEPTH and (t is tuple or t is dict or t is list):
        raise RecursionError(f"a message nested deeper than {_DEPTH} containers")
    if t is tuple:
        tup = <tuple>o
        n = len(tup)
        if n > big:
            return other(o, raws)
        out = tuple([_enc(tup[i], raws, other, big, depth + 1, w) for i in range(n)])
        if n and tup[0] is _Ellipsis:
            return _TAG_T + out
        return out
    if t is dict:
        d = <dict>o
        for k in d:
            tk = type(k)
            if not (tk is _NoneType or tk is bool or tk is int or tk is float or tk is str
                    or tk is bytes):
                return other(o, raws)
        dout = {}
        for k, v in d.items():
            dout[k] = _enc(v, raws, other, big, depth + 1, w)
        return dout
    if t is list:
        lst = <list>o
        n = len(lst)
        if n > big:
            return other(o, raws)
        lout = [None] * n
        for i in range(n):
            lout[i] = _enc(lst[i], raws, other, big, depth + 1, w)
        return lout
    if w is not None and t is np.ndarray:
        return w.array_node(<cnp.ndarray>o, raws)
    return other(o, raws)


def encode(object obj, list raws, object other, Py_ssize_t big):
    """The skeleton of ``obj`` (see the module doc); buffers are appended to ``raws``."""
    return _enc(obj, raws, other, big, 0, None)


cdef class Walker:
    """:func:`encode` and :func:`decode` with their settings bound, and the commonest node
    walked in C too: a C-contiguous numpy array (one dimension or more, native byte order) of a
    dtype in ``dtypes_out`` (``dtype -> (dtype.str, its buffer can be exported)``, the Python
    side's cache, which fills it) is the node ``(..., "a", dtype.str, shape, i)`` with its
    bytes as buffer ``i``, as the Python side would make it; an ``"a"`` node of a dtype in
    ``dtypes_in`` (``dtype.str -> dtype``) comes back as ``frombuffer(buffer, dtype)``,
    reshaped if it has more than one dimension. Every other array goes to ``other`` /
    ``kinds["a"]``."""

    cdef object other, frombuffer
    cdef Py_ssize_t big
    cdef dict dtypes_out, dtypes_in, kinds

    def __init__(self, object other, Py_ssize_t big, dict dtypes_out, dict dtypes_in,
                 dict kinds):
        self.other = other
        self.big = big
        self.dtypes_out = dtypes_out
        self.dtypes_in = dtypes_in
        self.kinds = kinds
        self.frombuffer = np.frombuffer

    def encode(self, object obj, list raws):
        return _enc(obj, raws, self.other, self.big, 0, self)

    cdef object array_node(self, cnp.ndarray a, list raws):
        cdef PyObject* got = PyDict_GetItem(self.dtypes_out, <object>cnp.PyArray_DESCR(a))
        cdef int nd = cnp.PyArray_NDIM(a)
        if (got != NULL and nd >= 1 and cnp.PyArray_IS_C_CONTIGUOUS(a)
                and cnp.PyArray_ISNOTSWAPPED(a) and (<tuple>got)[1]
                and (nd == 1 or cnp.PyArray_SIZE(a) > 0)):  # (no view casts a 0 in a shape)
            raws.append(memoryview(a).cast("B"))
            return (_Ellipsis, "a", (<tuple>got)[0],
                    (cnp.PyArray_DIM(a, 0),) if nd == 1 else (<object>a).shape,
                    len(raws) - 1)
        return self.other(a, raws)

    def decode(self, object skeleton, list bufs):
        return _dec(skeleton, bufs, self.kinds, 0, self)

    cdef object array(self, tuple s, list bufs):
        cdef PyObject* dt
        if len(s) == 5 and type(s[3]) is tuple:
            dt = PyDict_GetItem(self.dtypes_in, s[2])
            if dt != NULL:
                a = self.frombuffer(bufs[s[4]], dtype=<object>dt)
                return a if len(<tuple>s[3]) == 1 else a.reshape(s[3])
        return self.kinds["a"](s, bufs)


cdef object _dec(object s, list bufs, dict kinds, int depth, Walker w):
    cdef type t = type(s)
    cdef tuple tup
    cdef Py_ssize_t i, n
    cdef list lst, lout
    cdef dict dout
    if depth > 4 * _DEPTH and (t is tuple or t is dict or t is list):
        raise ValueError(f"a message skeleton nested deeper than {4 * _DEPTH} containers")
    if t is tuple:
        tup = <tuple>s
        n = len(tup)
        if n and tup[0] is _Ellipsis:
            if w is not None and n > 1 and tup[1] == "a":
                return w.array(tup, bufs)
            return kinds[tup[1]](s, bufs)
        return tuple([_dec(tup[i], bufs, kinds, depth + 1, w) for i in range(n)])
    if t is dict:
        dout = {}
        for k, v in (<dict>s).items():
            dout[k] = _dec(v, bufs, kinds, depth + 1, w)
        return dout
    if t is list:
        lst = <list>s
        n = len(lst)
        lout = [None] * n
        for i in range(n):
            lout[i] = _dec(lst[i], bufs, kinds, depth + 1, w)
        return lout
    return s


def decode(object skeleton, list bufs, dict kinds):
    """The object of ``skeleton`` (see the module doc) over the message's ``bufs``."""
    return _dec(skeleton, bufs, kinds, 0, None)


def frames(uint32_t magic, object meta, list raws):
    """The frames of a message: header (``magic u32, nbuf u32, nmeta u64, body u64``), buffer
    lengths (u64 each), ``meta`` (bytes-like), the buffers, each part padded to 8 bytes. Every
    frame is a bytes object or a flat memoryview of bytes (format ``B``), ready for
    ``sendmsg``."""
    cdef Py_ssize_t nbuf = len(raws), nmeta = len(meta), n, i
    cdef uint64_t body, v
    cdef list out = [None, None, meta]
    cdef bytes lens = PyBytes_FromStringAndSize(NULL, 8 * nbuf)
    cdef char* lp = PyBytes_AS_STRING(lens)
    cdef bytes head = PyBytes_FromStringAndSize(NULL, 24)
    cdef char* hp = PyBytes_AS_STRING(head)
    body = 8 * nbuf + nmeta
    if nmeta & 7:
        out.append(_PADS[nmeta & 7])
        body += 8 - (nmeta & 7)
    for i in range(nbuf):
        r = raws[i]
        if type(r) is not memoryview or (<object>r).format != "B" or (<object>r).ndim != 1:
            r = memoryview(r).cast("B")
        n = len(r)
        v = n
        memcpy(lp + 8 * i, &v, 8)
        out.append(r)
        body += n
        if n & 7:
            out.append(_PADS[n & 7])
            body += 8 - (n & 7)
    memcpy(hp, &magic, 4)
    v = nbuf
    memcpy(hp + 4, &v, 4)
    v = nmeta
    memcpy(hp + 8, &v, 8)
    memcpy(hp + 16, &body, 8)
    out[0] = head
    out[1] = lens
    return out


def split_body(object body, Py_ssize_t nbuf, Py_ssize_t nmeta):
    """``(skeleton view, [buffer views])`` of a message body (after its header) of ``nbuf``
    buffers and an ``nmeta``-byte skeleton; raises ``ValueError`` when the lengths do not add
    up to the body's size."""
    cdef Py_buffer view
    cdef Py_ssize_t size, at, i
    cdef uint64_t n
    cdef list bufs = [None] * nbuf
    mv = memoryview(body)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    PyObject_GetBuffer(mv, &view, PyBUF_SIMPLE)
    try:
        size = view.len
        if 8 * nbuf > size:
            raise ValueError(f"message body of {size} bytes cannot hold {nbuf} buffer lengths")
        at = 8 * nbuf
        meta = mv[at:at + nmeta]
        at += (nmeta + 7) & ~7
        for i in range(nbuf):
            memcpy(&n, <char*>view.buf + 8 * i, 8)
            if n > <uint64_t>size:
                raise ValueError(f"message body of {size} bytes does not match its layout "
                                 f"(a buffer of {n} bytes)")
            bufs[i] = mv[at:at + <Py_ssize_t>n]
            at += (<Py_ssize_t>n + 7) & ~7
    finally:
        PyBuffer_Release(&view)
    if at != size:
        raise ValueError(f"message body of {size} bytes does not match its layout ({at})")
    return meta, bufs
