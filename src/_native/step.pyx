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
* ``StepPlan``: the scheduler's step loop (:mod:`dbsp.circuit.scheduler`, whose ``_step_ref`` is
  its Python twin): the strict outputs, every other operator's ``eval`` on its inputs' values in
  a precomputed order (an idle operator that passes empty inputs is skipped and its cached empty
  value reused, known empty to its readers' idle checks without a ``len()`` call), each
  evaluation's time added to its node's slot, then the strict consumers. Worked out once into
  flat C arrays, it costs a C loop a node where the Python loop paid a few thousand
  instructions of bytecode, attribute look-ups and clock calls.

Every loop of the kernels runs without the GIL.
"""
cimport numpy as cnp
from _native.arrays cimport contig, contig_any, empty1, is_contig, zeros1
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int64_t, uint8_t
from posix.time cimport clock_gettime, timespec

import numpy as np

cnp.import_array()

cdef extern from "<time.h>" nogil:
    int CLOCK_MONOTONIC
    int CLOCK_THREAD_CPUTIME_ID

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


cdef inline double _now(int clock) noexcept nogil:
    cdef timespec ts
    clock_gettime(clock, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


#: the clocks a :class:`StepPlan` can time operators by
CLOCKS = ("wall", "thread")


cdef class StepPlan:
    """One worker's step loop over a scheduler's precomputed plan (see the module doc).

    ``strict``: ``(node, output, consume, input node)`` of each strict node (bound methods);
    ``order``: ``(node, eval, input nodes)`` of each evaluated node in evaluation order;
    ``empty_out``: per node None (always evaluate) or its cached empty value (False until the
    first step whose inputs were all empty; the plan fills it in); ``names``: per node its name
    (for errors); ``timing``: the float64 array of seconds per node, added to in place;
    ``clock``: ``"wall"`` (monotonic) or ``"thread"`` (the thread's CPU clock). After an
    ``eval`` raised, :attr:`at` is its node (else -1)."""

    cdef int n_order, n_strict, n_values, clock
    cdef int* node
    cdef int* nin
    cdef int* ins       # 2 a node of ``order``: its first two inputs (-1: none)
    cdef int* strict_node
    cdef int* strict_in
    cdef char* known_empty  # per node, this step: its value is its cached empty value
    cdef list evals, outputs, consumes, empty_out, names, wide
    cdef cnp.ndarray timing
    cdef public int at

    def __cinit__(self):
        self.node = self.nin = self.ins = self.strict_node = self.strict_in = NULL
        self.known_empty = NULL

    def __init__(self, list strict, list order, list empty_out, list names,
                 cnp.ndarray timing, str clock="wall"):
        cdef int k, m
        if clock not in CLOCKS:
            raise ValueError(f"StepPlan: clock must be one of {CLOCKS}, got {clock!r}")
        self.clock = CLOCK_MONOTONIC if clock == "wall" else CLOCK_THREAD_CPUTIME_ID
        self.n_values = len(empty_out)
        if len(names) != self.n_values:
            raise ValueError(f"StepPlan: {len(names)} names for {self.n_values} nodes")
        if not is_contig(timing, cnp.NPY_FLOAT64) or timing.shape[0] != self.n_values:
            raise ValueError(f"StepPlan: timing must be a contiguous float64 array of "
                             f"{self.n_values} (the scheduler's own, added to in place)")
        self.timing = timing
        self.n_order, self.n_strict = len(order), len(strict)
        self.node = <int*>PyMem_Malloc(max(1, self.n_order) * sizeof(int))
        self.nin = <int*>PyMem_Malloc(max(1, self.n_order) * sizeof(int))
        self.ins = <int*>PyMem_Malloc(max(1, 2 * self.n_order) * sizeof(int))
        self.strict_node = <int*>PyMem_Malloc(max(1, self.n_strict) * sizeof(int))
        self.strict_in = <int*>PyMem_Malloc(max(1, self.n_strict) * sizeof(int))
        self.known_empty = <char*>PyMem_Malloc(max(1, self.n_values))
        if not (self.node and self.nin and self.ins and self.strict_node and self.strict_in
                and self.known_empty):
            raise MemoryError()
        self.evals, self.wide = [], []
        for k, (i, ev, inputs) in enumerate(order):
            self.node[k] = self._node(i, "evaluated node")
            self.nin[k] = len(inputs)
            self.ins[2 * k] = self.ins[2 * k + 1] = -1
            for m, j in enumerate(inputs):
                j = self._node(j, f"input of node {i}")
                if m < 2:
                    self.ins[2 * k + m] = j
            self.evals.append(ev)
            self.wide.append(tuple(inputs))
        self.outputs, self.consumes = [], []
        for k, (i, out, cons, j) in enumerate(strict):
            self.strict_node[k] = self._node(i, "strict node")
            self.strict_in[k] = self._node(j, f"input of strict node {i}")
            self.outputs.append(out)
            self.consumes.append(cons)
        self.empty_out = empty_out
        self.names = names
        self.at = -1

    cdef int _node(self, object i, str what) except -1:
        if not (0 <= i < self.n_values):
            raise ValueError(f"StepPlan: {what} {i} is not a node (0..{self.n_values - 1})")
        return i

    def __dealloc__(self):
        PyMem_Free(self.node)
        PyMem_Free(self.nin)
        PyMem_Free(self.ins)
        PyMem_Free(self.strict_node)
        PyMem_Free(self.strict_in)
        PyMem_Free(self.known_empty)

    def run(self, list values):
        """One step over ``values`` (the scheduler's list of node values, all None before and
        after): the strict outputs, the evaluations, the strict consumers."""
        cdef int k, i, m, nin, j
        cdef object v, a, eo, ev
        cdef bint idle
        cdef double t0, t1
        cdef double* timing = <double*>cnp.PyArray_DATA(self.timing)
        cdef list evals = self.evals, empty_out = self.empty_out
        if len(values) != self.n_values:
            raise ValueError(f"StepPlan.run: {len(values)} values for {self.n_values} nodes")
        self.at = -1
        cdef char* known = self.known_empty
        for k in range(self.n_values):
            known[k] = 0
        try:
            for k in range(self.n_strict):
                values[self.strict_node[k]] = self.outputs[k]()
            t0 = _now(self.clock)
            for k in range(self.n_order):
                i = self.node[k]
                nin = self.nin[k]
                eo = empty_out[i]
                idle = eo is not None
                if idle:
                    for m in range(nin):
                        j = self.ins[2 * k + m] if m < 2 else self.wide[k][m]
                        if known[j]:  # an idle operator's cached empty value: no len() call
                            continue
                        a = values[j]
                        if a is not None and len(a):
                            idle = False
                            break
                    if idle and eo is not False:
                        values[i] = eo
                        known[i] = 1
                        continue
                self.at = i
                ev = evals[k]
                if nin == 0:
                    v = ev()
                elif nin == 1:
                    v = ev(values[self.ins[2 * k]])
                elif nin == 2:
                    v = ev(values[self.ins[2 * k]], values[self.ins[2 * k + 1]])
                else:
                    v = ev(*[values[j] for j in self.wide[k]])
                self.at = -1
                values[i] = v
                t1 = _now(self.clock)
                timing[i] += t1 - t0
                t0 = t1
                if idle:
                    if len(v):
                        raise RuntimeError(f"operator #{i} '{self.names[i]}' declares "
                                           f"passes_empty but returned {len(v)} rows for empty "
                                           f"inputs")
                    empty_out[i] = v
            for k in range(self.n_strict):
                self.consumes[k](values[self.strict_in[k]])
        finally:
            for k in range(self.n_values):
                values[k] = None  # release this step's batches
