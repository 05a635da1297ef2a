"""k-way merge of runs of ``(u64 key code, u64 value code)`` rows: the indexed batches of the
engine whose keys and values each fit one fixed-width code (join and aggregate state keyed by an
integer, date or timestamp column, valued by another).

``merge_consolidate`` here is the kernel the engine calls (``dbsp.algebra.kernels``): runs of
that shape take the loser tree below, every other shape goes on to
:func:`dbsp._native.merge.merge_consolidate`. Inputs and outputs are those of
``kernels_ref.merge_consolidate``.

Design
------
The generic loser tree of :mod:`dbsp._native.merge` compares run heads through ``codes_cmp``
(a call per code, var-width aware), which measured 35 ns a row on 4 runs of 160K
``(key, value)`` rows. Here a run's head is copied into a 24-byte slot ``(k, v, tag)`` of one
small array, so a replay step is three L1 loads and a branch-free lexicographic compare
(selects by mask, as in ``merge_tree_u64``). ``tag`` is the run number, plus ``K`` once the run
is exhausted (its codes set to ``UINT64_MAX``), so ties go to the lower run (the output row is the
first run's row, as the reference says) and exhausted runs lose to every real row, even one whose
codes are all ones. Consolidation is inline: the open group (codes, first row, running sum) sits
in locals and is written when the next group starts; zero sums are dropped.

Every loop runs without the GIL.
"""
cimport numpy as cnp
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy
from libc.stdlib cimport malloc, free

import numpy as np

from _native.views cimport shrink

from . import merge as _merge

cnp.import_array()


cdef extern from "checked_add.h" nogil:
    bint dbsp_add_ovf(int64_t a, int64_t b, int64_t* r)

cdef extern from *:
    """typedef unsigned __int128 dbsp_u128;"""
    ctypedef unsigned long long u128 "dbsp_u128"


ctypedef struct head_t:
    u128 kv           # key code in the high half, value code in the low half
    int64_t tag


ctypedef struct prun_t:
    const uint64_t* k
    const uint64_t* v
    const int64_t* w
    int64_t n
    int64_t pos
    int64_t base


cdef inline bint head_lt(const head_t* h, int64_t x, int64_t y) noexcept nogil:
    cdef u128 a = h[x].kv, b = h[y].kv
    return (a < b) | ((a == b) & (h[x].tag < h[y].tag))


cdef int64_t build(const head_t* h, int64_t* tree, int64_t k, int64_t node) noexcept nogil:
    """Fill the subtree at ``node`` (leaves are nodes k..2k-1) with losers; return the winner."""
    cdef int64_t l, r
    if node >= k:
        return node - k
    l = build(h, tree, k, 2 * node)
    r = build(h, tree, k, 2 * node + 1)
    if head_lt(h, l, r):
        tree[node] = r
        return l
    tree[node] = l
    return r


cdef int64_t merge_pairs(prun_t* runs, int64_t k, int64_t* tree, head_t* h, int64_t* g,
                         int64_t* wout, int* ovf) noexcept nogil:
    """Merge ``k`` non-empty runs into ``g``/``wout``; returns the number of output rows
    (``ovf``: set when a weight sum wrapped)."""
    cdef int64_t r, node, t, other, total = 0, _, m, o = 0, first = 0, s = 0
    cdef u128 c, gc = 0
    cdef bint lt, opened = False
    cdef prun_t* rr
    for r in range(k):
        total += runs[r].n
        h[r].kv = ((<u128>runs[r].k[0]) << 64) | runs[r].v[0]
        h[r].tag = r
    r = build(h, tree, k, 1)
    for _ in range(total):
        rr = &runs[r]
        t = rr.pos
        c = h[r].kv
        if opened and c == gc:
            ovf[0] |= dbsp_add_ovf(s, rr.w[t], &s)
        else:
            if opened:
                g[o] = first
                wout[o] = s
                o += s != 0
            gc = c
            first = rr.base + t
            s = rr.w[t]
            opened = True
        t += 1
        rr.pos = t
        if t < rr.n:
            h[r].kv = ((<u128>rr.k[t]) << 64) | rr.v[t]
        else:
            h[r].kv = ~(<u128>0)
            h[r].tag = r + k
        node = (r + k) >> 1
        while node >= 1:
            other = tree[node]
            lt = head_lt(h, other, r)
            m = -<int64_t>lt
            tree[node] = (r & m) | (other & ~m)
            r = (other & m) | (r & ~m)
            node >>= 1
    if opened:
        g[o] = first
        wout[o] = s
        o += s != 0
    return o


cdef bint _is_u64(x):
    return isinstance(x, np.ndarray) and (<cnp.ndarray>x).dtype == np.uint64


def merge_consolidate(runs, bint check=True):
    """k-way merge of consolidated runs ``(kcodes, vcodes_or_None, weights)`` (see
    ``kernels_ref.merge_consolidate``): ``(gidx, w)``, int64. ``check``: raise ``OverflowError``
    when a weight sum wrapped (see ``checked_add.h``)."""
    runs = list(runs)
    cdef int64_t k = len(runs), i, nz = 0, total = 0, n, o
    cdef int ovf = 0
    cdef bint pairs = k >= 2
    for run in runs:
        if not pairs:
            break
        if len(run) != 3 or not (_is_u64(run[0]) and _is_u64(run[1])):
            pairs = False
    if not pairs:
        return _merge.merge_consolidate(runs, check)
    owners = []
    cdef prun_t* rs = <prun_t*>malloc(k * sizeof(prun_t))
    cdef int64_t* tree = <int64_t*>malloc((k + 1) * sizeof(int64_t))
    cdef head_t* heads = <head_t*>malloc((k + 1) * sizeof(head_t))
    cdef cnp.ndarray kc, vc, wc, gidx, wout
    if rs == NULL or tree == NULL or heads == NULL:
        free(rs)
        free(tree)
        free(heads)
        raise MemoryError()
    try:
        for i in range(k):
            kc = np.ascontiguousarray(runs[i][0])
            vc = np.ascontiguousarray(runs[i][1])
            wc = np.ascontiguousarray(runs[i][2], dtype=np.int64)
            n = kc.shape[0]
            if vc.shape[0] != n:
                raise ValueError(f"run {i}: {vc.shape[0]} vcodes for {n} rows")
            if wc.shape[0] != n:
                raise ValueError(f"run {i}: {wc.shape[0]} weights for {n} rows")
            owners.append((kc, vc, wc))
            if n > 0:
                rs[nz].k = <const uint64_t*>cnp.PyArray_DATA(kc)
                rs[nz].v = <const uint64_t*>cnp.PyArray_DATA(vc)
                rs[nz].w = <const int64_t*>cnp.PyArray_DATA(wc)
                rs[nz].n = n
                rs[nz].pos = 0
                rs[nz].base = total
                nz += 1
            total += n
        gidx = np.empty(max(total, 1), dtype=np.int64)
        wout = np.empty(max(total, 1), dtype=np.int64)
        o = 0
        if nz:
            with nogil:
                o = merge_pairs(rs, nz, tree, heads, <int64_t*>cnp.PyArray_DATA(gidx),
                                <int64_t*>cnp.PyArray_DATA(wout), &ovf)
    finally:
        free(rs)
        free(tree)
        free(heads)
    if check and ovf:
        raise OverflowError("an int64 weight sum wrapped in merge_consolidate")
    return shrink(gidx, o), shrink(wout, o)


# --- indexed batches: merge and regroup in one pass ---------------------------------------------

ctypedef struct irun_t:
    const uint64_t* kc      # distinct key codes
    const int64_t* off      # value rows of key i: off[i]..off[i+1]
    const uint64_t* v
    const int64_t* w
    int64_t n               # value rows
    int64_t pos             # current value row
    int64_t kpos            # its key
    int64_t base            # global value row of row 0
    int64_t kbase           # global key of key 0


ctypedef struct iout_t:
    int64_t* g              # per output row: global value row (NULL: gather columns instead)
    int64_t ncols           # fixed-width value columns gathered (when g is NULL)
    bint one8               # ... exactly one, of 8 bytes
    const char** src        # column j of run r: src[r * ncols + j]
    char** dst              # column j of the output
    const int64_t* width    # bytes per value of column j
    int64_t* w
    uint64_t* vc
    uint64_t* kc            # per output key: code, first output row, global key row
    int64_t* off
    int64_t* ksrc
    int64_t o               # output rows
    int64_t nk              # output keys
    int ovf                 # a weight sum wrapped


cdef inline void copy_row(iout_t* out, int64_t o, int64_t frun, int64_t frow) noexcept nogil:
    """Output row ``o`` of every gathered column is row ``frow`` of run ``frun``."""
    cdef int64_t j, wd
    cdef const char* a
    cdef char* b
    for j in range(out.ncols):
        wd = out.width[j]
        a = out.src[frun * out.ncols + j] + frow * wd
        b = out.dst[j] + o * wd
        if wd == 8:
            (<uint64_t*>b)[0] = (<const uint64_t*>a)[0]
        elif wd == 4:
            (<uint32_t*>b)[0] = (<const uint32_t*>a)[0]
        else:
            memcpy(b, a, wd)


cdef inline void emit(iout_t* out, u128 c, int64_t first, int64_t kfirst, int64_t s,
                      int64_t frun, int64_t frow) noexcept nogil:
    """Close the group ``c`` (key code high, value code low): written when its sum is not 0,
    opening a new output key when its key differs from the last one written. Its first row is
    global row ``first``, row ``frow`` of run ``frun``."""
    cdef uint64_t key = <uint64_t>(c >> 64)
    cdef int64_t o = out.o
    if s == 0:
        return
    if out.nk == 0 or out.kc[out.nk - 1] != key:
        out.kc[out.nk] = key
        out.off[out.nk] = o
        out.ksrc[out.nk] = kfirst
        out.nk += 1
    if out.g != NULL:
        out.g[o] = first
    elif out.one8:  # one 8-byte value column (the common shape): a single load and store
        (<uint64_t*>out.dst[0])[o] = (<const uint64_t*>out.src[frun])[frow]
    else:
        copy_row(out, o, frun, frow)
    out.w[o] = s
    out.vc[o] = <uint64_t>c
    out.o = o + 1


cdef void merge_indexed_runs(irun_t* runs, int64_t k, int64_t* tree, head_t* h,
                             iout_t* out) noexcept nogil:
    cdef int64_t r, node, t, other, total = 0, _, m, first = 0, kfirst = 0, s = 0
    cdef int64_t frun = 0, frow = 0
    cdef u128 c, gc = 0
    cdef bint opened = False
    cdef irun_t* rr
    for r in range(k):
        total += runs[r].n
        h[r].kv = ((<u128>runs[r].kc[0]) << 64) | runs[r].v[0]
        h[r].tag = r
    r = build(h, tree, k, 1)
    for _ in range(total):
        rr = &runs[r]
        t = rr.pos
        c = h[r].kv
        if opened and c == gc:
            out.ovf |= dbsp_add_ovf(s, rr.w[t], &s)
        else:
            if opened:
                emit(out, gc, first, kfirst, s, frun, frow)
            gc = c
            first = rr.base + t
            frun = r
            frow = t
            kfirst = rr.kbase + rr.kpos
            s = rr.w[t]
            opened = True
        t += 1
        rr.pos = t
        if t < rr.n:
            while t == rr.off[rr.kpos + 1]:  # (a key without rows is skipped)
                rr.kpos += 1
            h[r].kv = ((<u128>rr.kc[rr.kpos]) << 64) | rr.v[t]
        else:
            h[r].kv = ~(<u128>0)
            h[r].tag = r + k
        node = (r + k) >> 1
        while node >= 1:
            other = tree[node]
            m = -<int64_t>head_lt(h, other, r)
            tree[node] = (r & m) | (other & ~m)
            r = (other & m) | (r & ~m)
            node >>= 1
    if opened:
        emit(out, gc, first, kfirst, s, frun, frow)
    out.off[out.nk] = out.o


def merge_indexed(runs, bint check=True):
    """The sum of consolidated indexed batches with u64 key and value codes, regrouped by key in
    the same pass. ``runs``: ``(kcodes, offsets, vcodes, weights)`` per batch (distinct ascending
    key codes, ``offsets`` of length keys + 1, values ascending within a key).

    Returns ``(gidx, w, vcodes, kcodes, offsets, ksrc)``: output row i is global value row
    ``gidx[i]`` of the concatenated inputs (the first batch holding it) with weight ``w[i]`` and
    code ``vcodes[i]``; output key j has code ``kcodes[j]``, rows ``offsets[j]:offsets[j+1]`` and
    is global key row ``ksrc[j]`` of the concatenated inputs' keys. Zero sums are dropped, and a
    key left with no rows with them. Equal to ``merge_consolidate`` over the rows then
    ``group_bounds`` over their keys (the Python path it replaces)."""
    return _merge_indexed(list(runs), check, False)


def merge_indexed_cols(runs, bint check=True):
    """:func:`merge_indexed` that gathers the value columns itself: ``runs`` are
    ``(kcodes, offsets, vcodes, weights, cols)``, ``cols`` a tuple of 1-d contiguous numpy arrays
    of fixed-width values, one per value row (the same number of columns and dtypes in every
    run). Returns ``(cols, w, vcodes, kcodes, offsets, ksrc)``: ``cols`` the output's columns
    (row i is the row ``gidx[i]`` of :func:`merge_indexed` names), the rest as there. No global
    row index and no concatenation of the inputs' columns is made: of a merge's memory only its
    inputs and its output remain (the spine's top-level merges are the process's peak)."""
    return _merge_indexed(list(runs), check, True)


cdef _merge_indexed(list runs, bint check, bint gather):
    cdef int64_t k = len(runs), i, j, nz = 0, total = 0, ktotal = 0, n, nk, ncols = 0
    owners = []
    dtypes = []
    outs = []
    cdef irun_t* rs = <irun_t*>malloc(max(k, 1) * sizeof(irun_t))
    cdef int64_t* tree = <int64_t*>malloc((k + 1) * sizeof(int64_t))
    cdef head_t* heads = <head_t*>malloc((k + 1) * sizeof(head_t))
    cdef const char** src = NULL
    cdef char** dst = NULL
    cdef int64_t* width = NULL
    cdef cnp.ndarray kc, off, vc, wc, gidx, wout, vout, kout, offout, ksrc, col
    cdef iout_t out
    if rs == NULL or tree == NULL or heads == NULL:
        free(rs)
        free(tree)
        free(heads)
        raise MemoryError()
    try:
        if gather and k:
            if len(runs[0]) != 5:
                raise ValueError("a run is (kcodes, offsets, vcodes, weights, cols)")
            ncols = len(runs[0][4])
            for j in range(ncols):
                dtypes.append(np.asarray(runs[0][4][j]).dtype)
            src = <const char**>malloc(max(k * ncols, 1) * sizeof(char*))
            dst = <char**>malloc(max(ncols, 1) * sizeof(char*))
            width = <int64_t*>malloc(max(ncols, 1) * sizeof(int64_t))
            if src == NULL or dst == NULL or width == NULL:
                raise MemoryError()
        for i in range(k):
            if len(runs[i]) != (5 if gather else 4):
                raise ValueError("a run is (kcodes, offsets, vcodes, weights"
                                 + (", cols)" if gather else ")"))
            kc = np.ascontiguousarray(runs[i][0])
            off = np.ascontiguousarray(runs[i][1], dtype=np.int64)
            vc = np.ascontiguousarray(runs[i][2])
            wc = np.ascontiguousarray(runs[i][3], dtype=np.int64)
            if kc.dtype != np.uint64 or vc.dtype != np.uint64:
                raise TypeError("merge_indexed takes u64 key and value codes")
            n = vc.shape[0]
            nk = kc.shape[0]
            if off.shape[0] != nk + 1 or off[0] != 0 or off[nk] != n:
                raise ValueError(f"run {i}: offsets do not describe {nk} keys over {n} rows")
            if wc.shape[0] != n:
                raise ValueError(f"run {i}: {wc.shape[0]} weights for {n} rows")
            owners.append((kc, off, vc, wc))
            if gather:
                if len(runs[i][4]) != ncols:
                    raise ValueError(f"run {i}: {len(runs[i][4])} value columns, not {ncols}")
                for j in range(ncols):
                    col = np.ascontiguousarray(runs[i][4][j])
                    if col.ndim != 1 or col.dtype != dtypes[j] or col.shape[0] != n:
                        raise ValueError(f"run {i}: value column {j} is not {n} values of "
                                         f"{dtypes[j]}")
                    owners.append(col)
                    if n > 0:
                        src[nz * ncols + j] = <const char*>cnp.PyArray_DATA(col)
            if n > 0:
                rs[nz].kc = <const uint64_t*>cnp.PyArray_DATA(kc)
                rs[nz].off = <const int64_t*>cnp.PyArray_DATA(off)
                rs[nz].v = <const uint64_t*>cnp.PyArray_DATA(vc)
                rs[nz].w = <const int64_t*>cnp.PyArray_DATA(wc)
                rs[nz].n = n
                rs[nz].pos = 0
                rs[nz].kpos = 0
                rs[nz].base = total
                rs[nz].kbase = ktotal
                # a key with no rows would desynchronise the key cursor
                while rs[nz].off[rs[nz].kpos + 1] == 0:
                    rs[nz].kpos += 1
                nz += 1
            total += n
            ktotal += nk
        if gather:
            out.g = NULL
            for j in range(ncols):
                col = np.empty(max(total, 1), dtype=dtypes[j])
                outs.append(col)
                dst[j] = <char*>cnp.PyArray_DATA(col)
                width[j] = col.itemsize
        else:
            gidx = np.empty(max(total, 1), dtype=np.int64)
            out.g = <int64_t*>cnp.PyArray_DATA(gidx)
        out.ncols = ncols
        out.one8 = gather and ncols == 1 and width[0] == 8
        out.src = src
        out.dst = dst
        out.width = width
        # distinct keys: at most the total of the inputs' keys (not of their rows)
        wout = np.empty(max(total, 1), dtype=np.int64)
        vout = np.empty(max(total, 1), dtype=np.uint64)
        kout = np.empty(max(min(ktotal, total), 1), dtype=np.uint64)
        offout = np.empty(max(min(ktotal, total), 1) + 1, dtype=np.int64)
        ksrc = np.empty(max(min(ktotal, total), 1), dtype=np.int64)
        out.w = <int64_t*>cnp.PyArray_DATA(wout)
        out.vc = <uint64_t*>cnp.PyArray_DATA(vout)
        out.kc = <uint64_t*>cnp.PyArray_DATA(kout)
        out.off = <int64_t*>cnp.PyArray_DATA(offout)
        out.ksrc = <int64_t*>cnp.PyArray_DATA(ksrc)
        out.o = 0
        out.nk = 0
        out.ovf = 0
        out.off[0] = 0
        if nz:
            with nogil:
                merge_indexed_runs(rs, nz, tree, heads, &out)
    finally:
        free(rs)
        free(tree)
        free(heads)
        free(src)
        free(dst)
        free(width)
    if check and out.ovf:
        raise OverflowError("an int64 weight sum wrapped in merge_indexed")
    first = [shrink(c, out.o) for c in outs] if gather else shrink(gidx, out.o)
    return (first, shrink(wout, out.o), shrink(vout, out.o),
            shrink(kout, out.nk), shrink(offout, out.nk + 1), shrink(ksrc, out.nk))
