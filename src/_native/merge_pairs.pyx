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

from _native.arrays cimport contig, empty1
from _native.views cimport shrink
from _native.arrow_abi cimport ArrowArray, ArrowSchema
from _native.arrow_blocks cimport blk_width, blk_plain, blk_struct, blk_set_length
from libc.stdint cimport uintptr_t, uint8_t

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


cdef inline bint _is_u64(x) noexcept:
    """Whether ``x`` is an ndarray of native-order u64 codes (through the C API: ``isinstance``
    and a dtype comparison cost a thousand instructions, and a merge asks twice per input)."""
    if not cnp.PyArray_Check(x):
        return False
    cdef cnp.ndarray a = <cnp.ndarray>x
    cdef int t = cnp.PyArray_TYPE(a)
    return (t == cnp.NPY_ULONG or t == cnp.NPY_ULONGLONG) and cnp.PyArray_ITEMSIZE(a) == 8 \
        and cnp.PyArray_ISNOTSWAPPED(a)


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
            kc = contig(runs[i][0], cnp.NPY_UINT64)
            vc = contig(runs[i][1], cnp.NPY_UINT64)
            wc = contig(runs[i][2], cnp.NPY_INT64)
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
    int64_t kncols          # fixed-width key columns gathered (0: none)
    bint kone8              # ... exactly one, of 8 bytes
    const char** ksrcc      # key column j of run r: ksrcc[r * kncols + j]
    char** kdst             # key column j of the output
    const int64_t* kwidth   # bytes per key of column j
    int64_t o               # output rows
    int64_t nk              # output keys
    int ovf                 # a weight sum wrapped


cdef inline void copy_cols(const char** src, char** dst, const int64_t* width, int64_t ncols,
                           int64_t o, int64_t run, int64_t row) noexcept nogil:
    """Output row ``o`` of each of ``ncols`` gathered columns (``dst``, bytes per value
    ``width``) is row ``row`` of run ``run`` (column ``j`` of run ``r``: ``src[r * ncols + j]``).
    The value columns and the key columns of an indexed merge both copy through it."""
    cdef int64_t j, wd
    cdef const char* a
    cdef char* b
    for j in range(ncols):
        wd = width[j]
        a = src[run * ncols + j] + row * wd
        b = dst[j] + o * wd
        if wd == 8:
            (<uint64_t*>b)[0] = (<const uint64_t*>a)[0]
        elif wd == 4:
            (<uint32_t*>b)[0] = (<const uint32_t*>a)[0]
        else:
            memcpy(b, a, wd)


cdef inline void emit(iout_t* out, u128 c, int64_t first, int64_t kfirst, int64_t s,
                      int64_t frun, int64_t frow, int64_t fkrow) noexcept nogil:
    """Close the group ``c`` (key code high, value code low): written when its sum is not 0,
    opening a new output key when its key differs from the last one written. Its first row is
    global row ``first``, row ``frow`` of run ``frun``, whose key is key row ``fkrow`` of that
    run."""
    cdef uint64_t key = <uint64_t>(c >> 64)
    cdef int64_t o = out.o
    if s == 0:
        return
    if out.nk == 0 or out.kc[out.nk - 1] != key:
        out.kc[out.nk] = key
        out.off[out.nk] = o
        out.ksrc[out.nk] = kfirst
        if out.kone8:  # one 8-byte key column (the common shape): a single load and store
            (<uint64_t*>out.kdst[0])[out.nk] = (<const uint64_t*>out.ksrcc[frun])[fkrow]
        elif out.kncols:
            copy_cols(out.ksrcc, out.kdst, out.kwidth, out.kncols, out.nk, frun, fkrow)
        out.nk += 1
    if out.g != NULL:
        out.g[o] = first
    elif out.one8:  # one 8-byte value column (the common shape): a single load and store
        (<uint64_t*>out.dst[0])[o] = (<const uint64_t*>out.src[frun])[frow]
    else:
        copy_cols(out.src, out.dst, out.width, out.ncols, o, frun, frow)
    out.w[o] = s
    out.vc[o] = <uint64_t>c
    out.o = o + 1


cdef void merge_indexed_runs(irun_t* runs, int64_t k, int64_t* tree, head_t* h,
                             iout_t* out) noexcept nogil:
    cdef int64_t r, node, t, other, total = 0, _, m, first = 0, kfirst = 0, s = 0
    cdef int64_t frun = 0, frow = 0, fkrow = 0
    cdef u128 c, gc = 0
    cdef bint opened = False
    cdef irun_t* rr
    if k == 2:  # (two cursors, no tree: merge_indexed_two)
        merge_indexed_two(runs, out)
        return
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
                emit(out, gc, first, kfirst, s, frun, frow, fkrow)
            gc = c
            first = rr.base + t
            frun = r
            frow = t
            fkrow = rr.kpos
            kfirst = rr.kbase + fkrow
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
        emit(out, gc, first, kfirst, s, frun, frow, fkrow)
    out.off[out.nk] = out.o


cdef void merge_indexed_two(irun_t* runs, iout_t* out) noexcept nogil:
    """:func:`merge_indexed_runs` of two runs: two cursors, no tree (the merge of an exchange's
    two parts, and of a spine's pairs of batches). The same output: rows ascending by (key
    code, value code), equal rows summed with run 0's row first, zero sums dropped. One
    :func:`emit` call site, so that it is inlined."""
    cdef irun_t* a = &runs[0]
    cdef irun_t* b = &runs[1]
    cdef int64_t i = a.pos, j = b.pos, ka = a.kpos, kb = b.kpos, na = a.n, nb = b.n, s
    cdef uint64_t xa = 0, xb = 0, va = 0, vb = 0
    cdef int take   # 0: a's row, 1: b's row, 2: both (equal codes)
    while i < na or j < nb:
        if i < na:
            xa = a.kc[ka]
            va = a.v[i]
        if j < nb:
            xb = b.kc[kb]
            vb = b.v[j]
        if j >= nb:
            take = 0
        elif i >= na:
            take = 1
        elif xa < xb or (xa == xb and va < vb):
            take = 0
        elif xa == xb and va == vb:
            take = 2
        else:
            take = 1
        if take == 1:
            emit(out, ((<u128>xb) << 64) | vb, b.base + j, b.kbase + kb, b.w[j], 1, j, kb)
        else:
            s = a.w[i]
            if take == 2:
                out.ovf |= dbsp_add_ovf(s, b.w[j], &s)
            emit(out, ((<u128>xa) << 64) | va, a.base + i, a.kbase + ka, s, 0, i, ka)
        if take != 1:
            i += 1
            if i < na:
                while i == a.off[ka + 1]:
                    ka += 1
        if take != 0:
            j += 1
            if j < nb:
                while j == b.off[kb + 1]:
                    kb += 1
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
            if not (_is_u64(runs[i][0]) and _is_u64(runs[i][2])):
                raise TypeError("merge_indexed takes u64 key and value codes")
            kc = contig(runs[i][0], cnp.NPY_UINT64)
            off = contig(runs[i][1], cnp.NPY_INT64)
            vc = contig(runs[i][2], cnp.NPY_UINT64)
            wc = contig(runs[i][3], cnp.NPY_INT64)
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
        out.kncols = 0
        out.kone8 = False
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


# --- indexed batches of fixed-width columns: the whole merge in one call ------------------------

_import_kept = None  # (arrow_c.import_kept, imported on first use)
_RecordBatch = None


cdef ArrowArray* _exported(x, ArrowArray* slot) except NULL:
    """The exported struct of ``x``: a record batch exported into ``slot`` (released by the
    caller), or the kept export of an ``arrow_c.ExportedBatch`` (not released)."""
    if type(x) is _RecordBatch:
        x._export_to_c(<uintptr_t>slot)
        return slot
    return <ArrowArray*><uintptr_t>x.array_address


cdef int _schema_widths(schema, int* widths, int64_t cap) except -2:
    """The byte widths of ``schema``'s columns into ``widths``; their number, or -1 when a
    column is not fixed-width (or there are more than ``cap``)."""
    cdef ArrowSchema s
    cdef int64_t c, n
    s.release = NULL
    schema._export_to_c(<uintptr_t>&s)
    try:
        n = s.n_children
        if n > cap:
            return -1
        for c in range(n):
            if s.children[c].dictionary != NULL:
                return -1
            widths[c] = blk_width(s.children[c].format)
            if widths[c] == 0:
                return -1
        return <int>n
    finally:
        if s.release != NULL:
            s.release(&s)


cdef bint _columns(ArrowArray* a, int64_t n, int ncols, const int* widths,
                   const char** dst) noexcept:
    """The values buffer of each column of an exported batch of ``n`` rows into ``dst``; False
    when the batch does not have that shape (a column with nulls, another row count)."""
    cdef int64_t c
    cdef ArrowArray* ch
    if a.length != n or a.n_children != ncols or a.dictionary != NULL:
        return False
    for c in range(ncols):
        ch = a.children[c]
        if not blk_plain(ch):
            return False
        dst[c] = <const char*>ch.buffers[1] + (ch.offset + a.offset) * widths[c]
    return True


cdef enum:
    MAX_COLS = 64


def merge_indexed_batches(list runs, key_schema, val_schema, bint check=True, list views=None):
    """The sum of consolidated indexed batches whose key and value codes are u64 (numpy) and
    whose key and value columns are fixed-width without nulls, made in one call: merged, regrouped by key,
    and its key and value record batches built natively (no pyarrow or numpy object per column
    or per input: a small merge's cost was those, not its rows).

    ``runs``: ``(kcodes, offsets, vcodes, weights, keys, vals)`` per batch, ``keys`` / ``vals``
    pyarrow record batches of ``key_schema`` / ``val_schema`` (one row per key / per value row),
    or ``arrow_c.ExportedBatch`` exports of them (read as they are: no export per merge). With
    ``views`` (a list), exports of the two batches built are appended there (``import_kept``).
    Returns ``(keys, kcodes, offsets, vals, vcodes, weights)``, the parts of the merged batch
    (the reference: :func:`merge_indexed` then taking the keys at ``ksrc`` and the values at
    ``gidx``), or None when a column is not fixed-width without nulls (the caller's general
    path; also without key or value columns, or with var codes). Zero sums are dropped, and a key left without rows with them. ``check``: raise
    ``OverflowError`` when a weight sum wrapped."""
    global _import_kept, _RecordBatch
    if _import_kept is None:
        import pyarrow as pa
        from .arrow_c import import_kept
        _import_kept, _RecordBatch = import_kept, pa.RecordBatch
    cdef int kw[MAX_COLS]
    cdef int vw[MAX_COLS]
    cdef int nkc = _schema_widths(key_schema, kw, MAX_COLS)
    cdef int nvc = _schema_widths(val_schema, vw, MAX_COLS) if nkc > 0 else -1
    if nkc <= 0 or nvc <= 0:  # (no value column: the general path sizes such batches)
        return None
    cdef int64_t k = len(runs), i, j, nz = 0, total = 0, ktotal = 0, n, nk, kcap
    cdef ArrowArray* exp = <ArrowArray*>malloc(max(2 * k, 1) * sizeof(ArrowArray))
    cdef irun_t* rs = <irun_t*>malloc(max(k, 1) * sizeof(irun_t))
    cdef int64_t* tree = <int64_t*>malloc((k + 1) * sizeof(int64_t))
    cdef head_t* heads = <head_t*>malloc((k + 1) * sizeof(head_t))
    cdef const char** vsrc = <const char**>malloc(max(k * nvc, 1) * sizeof(char*))
    cdef const char** ksrc_c = <const char**>malloc(max(k * nkc, 1) * sizeof(char*))
    cdef char* vdst[MAX_COLS]
    cdef char* kdst[MAX_COLS]
    cdef int64_t vwidth[MAX_COLS]
    cdef int64_t kwidth[MAX_COLS]
    cdef uint8_t* kblock = NULL
    cdef uint8_t* vblock = NULL
    cdef ArrowArray* ka
    cdef ArrowArray* va
    cdef cnp.ndarray kc, off, vc, wc, wout, vout, kout, offout, ksrc
    cdef iout_t out
    cdef bint shape_ok = True
    owners = []
    if exp != NULL:
        for i in range(2 * k):
            exp[i].release = NULL
    try:
        if exp == NULL or rs == NULL or tree == NULL or heads == NULL or vsrc == NULL \
                or ksrc_c == NULL:
            raise MemoryError()
        for i in range(k):
            run = runs[i]
            if len(run) != 6:
                raise ValueError("a run is (kcodes, offsets, vcodes, weights, keys, vals)")
            if not (_is_u64(run[0]) and _is_u64(run[2])):
                shape_ok = False  # var codes: the general path
                break
            kc = contig(run[0], cnp.NPY_UINT64)
            off = contig(run[1], cnp.NPY_INT64)
            vc = contig(run[2], cnp.NPY_UINT64)
            wc = contig(run[3], cnp.NPY_INT64)
            n = vc.shape[0]
            nk = kc.shape[0]
            if off.shape[0] != nk + 1 or (<const int64_t*>cnp.PyArray_DATA(off))[0] != 0 \
                    or (<const int64_t*>cnp.PyArray_DATA(off))[nk] != n:
                raise ValueError(f"run {i}: offsets do not describe {nk} keys over {n} rows")
            if wc.shape[0] != n:
                raise ValueError(f"run {i}: {wc.shape[0]} weights for {n} rows")
            owners.append((kc, off, vc, wc))
            if n == 0:
                continue
            ka = _exported(run[4], &exp[2 * nz])
            va = _exported(run[5], &exp[2 * nz + 1])
            if not (_columns(ka, nk, nkc, kw, &ksrc_c[nz * nkc])
                    and _columns(va, n, nvc, vw, &vsrc[nz * nvc])):
                shape_ok = False
                break
            rs[nz].kc = <const uint64_t*>cnp.PyArray_DATA(kc)
            rs[nz].off = <const int64_t*>cnp.PyArray_DATA(off)
            rs[nz].v = <const uint64_t*>cnp.PyArray_DATA(vc)
            rs[nz].w = <const int64_t*>cnp.PyArray_DATA(wc)
            rs[nz].n = n
            rs[nz].pos = 0
            rs[nz].kpos = 0
            rs[nz].base = total
            rs[nz].kbase = ktotal
            while rs[nz].off[rs[nz].kpos + 1] == 0:  # (a key without rows: skipped)
                rs[nz].kpos += 1
            nz += 1
            total += n
            ktotal += nk
        if not shape_ok:
            return None
        kcap = min(ktotal, total)
        kblock = blk_struct(nkc, kw, max(kcap, 1))
        vblock = blk_struct(nvc, vw, max(total, 1))
        if kblock == NULL or vblock == NULL:
            raise MemoryError()
        for j in range(nkc):
            kdst[j] = <char*>(<ArrowArray*>kblock).children[j].buffers[1]
            kwidth[j] = kw[j]
        for j in range(nvc):
            vdst[j] = <char*>(<ArrowArray*>vblock).children[j].buffers[1]
            vwidth[j] = vw[j]
        wout = empty1(max(total, 1), cnp.NPY_INT64)
        vout = empty1(max(total, 1), cnp.NPY_UINT64)
        kout = empty1(max(kcap, 1), cnp.NPY_UINT64)
        offout = empty1(max(kcap, 1) + 1, cnp.NPY_INT64)
        ksrc = empty1(max(kcap, 1), cnp.NPY_INT64)
        out.g = NULL
        out.ncols = nvc
        out.one8 = nvc == 1 and vw[0] == 8
        out.src = vsrc
        out.dst = vdst
        out.width = vwidth
        out.kncols = nkc
        out.kone8 = nkc == 1 and kw[0] == 8
        out.ksrcc = ksrc_c
        out.kdst = kdst
        out.kwidth = kwidth
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
        blk_set_length(kblock, out.nk)
        blk_set_length(vblock, out.o)
    except BaseException:
        free(kblock)
        free(vblock)
        raise
    finally:
        if exp != NULL:
            for i in range(2 * k):
                if exp[i].release != NULL:
                    exp[i].release(&exp[i])
        free(exp)
        free(rs)
        free(tree)
        free(heads)
        free(vsrc)
        free(ksrc_c)
    if check and out.ovf:
        free(kblock)
        free(vblock)
        raise OverflowError("an int64 weight sum wrapped in merge_indexed_batches")
    keys = _import_kept(<uintptr_t>kblock, key_schema, views)  # owns the block from here
    vals = _import_kept(<uintptr_t>vblock, val_schema, views)
    return (keys, shrink(kout, out.nk), shrink(offout, out.nk + 1),
            vals, shrink(vout, out.o), shrink(wout, out.o))
