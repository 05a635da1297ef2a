"""k-way merge of sorted, consolidated runs with inline consolidation (native twin of
``kernels_ref.merge_consolidate``).

Design
------
A run is ``(kcodes, vcodes_or_None, weights)``, sorted by ``(k, v)`` and consolidated. The
output indexes the virtual concatenation of the runs (run 0's rows first): ``gidx[i]`` is the
first run's row holding the ``i``-th distinct ``(k, v)`` and ``w[i]`` the sum of its weights;
zero sums are dropped. Nothing is re-sorted:

* two u64 runs (the spine's common case): a branchless merge (both heads are loaded and the
  taken one is selected with masks, not branches, so random keys cost no mispredictions); where
  one run lies below the other's head for a stretch, the stretch is found by galloping and copied
  in bulk. On CPUs with AVX-512F the branchless merge takes 8 rows per step instead
  (``merge_simd.h``: merge path + bitonic network, picked at run time; ``set_simd(False)`` or
  ``DBSP_MERGE_SIMD=0`` in the environment keeps the scalar loop), with the scalar loop for the
  last rows of either side;
* more runs, or var codes, or ``(k, v)`` pairs: a loser tree over the run heads, ties broken by
  run number (stable), comparisons by value for u64 and by ``memcmp`` for var codes.

Consolidation is inline and tolerates runs that are sorted but not consolidated: the open
output group (its code, first row and running sum) is kept in registers and the output position
advances when a group with a non-zero sum closes.

Weight sums are checked (``checked_add.h``: one flag per call, OR-ed in registers; the entry
point raises ``OverflowError`` when it is set, and the caller checks the final sums exactly).

Every loop runs without the GIL.
"""
cimport numpy as cnp
from libc.stdint cimport uint8_t, int64_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset

from _native.types cimport var_t, codes_t
from _native.codes_cmp cimport codes_cmp
from _native.views cimport as_codes, as_i64, codes_view, shrink

import os

import numpy as np

cnp.import_array()


cdef extern from "merge_simd.h" nogil:
    int dbsp_merge_avx512_supported()
    void dbsp_merge2_avx512(const uint64_t* a, const int64_t* wa, const uint64_t* b,
                            const int64_t* wb, int64_t* ip, int64_t* jp, int64_t steps,
                            int64_t ba, int64_t bb, int64_t* og, int64_t* ow, int64_t* op,
                            uint64_t* key, int64_t* first, int64_t* s, int* ovf)

cdef extern from "checked_add.h" nogil:
    bint dbsp_add_ovf(int64_t a, int64_t b, int64_t* r)

cdef bint _simd_available = dbsp_merge_avx512_supported() != 0
cdef bint _simd = _simd_available and os.environ.get("DBSP_MERGE_SIMD", "1") != "0"


def simd_available():
    """Whether this CPU runs the AVX-512 two-run merge."""
    return bool(_simd_available)


def simd_enabled():
    """Whether two-run u64 merges use the AVX-512 kernel (available and not switched off)."""
    return bool(_simd)


def set_simd(enabled):
    """Use the AVX-512 two-run merge when available (``False``: the scalar loop everywhere, as
    ``DBSP_MERGE_SIMD=0`` does at import). Returns the previous setting."""
    global _simd
    prev = bool(_simd)
    _simd = bool(enabled) and _simd_available
    return prev


# --- runs and the open output group -------------------------------------------------------------

ctypedef struct run_t:
    codes_t k
    codes_t v          # v.n < 0: no v codes
    const int64_t* w
    int64_t n
    int64_t pos
    int64_t base       # global row of the run's row 0


ctypedef struct out_t:
    int64_t* g        # output rows (global index)
    int64_t* w        # output weights
    int64_t o         # rows closed so far
    int64_t first     # open group: its first row and running sum
    int64_t s
    uint64_t key      # open group's code (u64 paths)
    bint open
    int ovf           # some partial weight sum wrapped (checked_add.h)


cdef inline void close_group(out_t* out) noexcept nogil:
    if out.open:
        out.g[out.o] = out.first
        out.w[out.o] = out.s
        out.o += out.s != 0
        out.open = False


cdef void copy_u64(const uint64_t* k, const int64_t* w, int64_t lo, int64_t hi, int64_t base,
                   out_t* out) noexcept nogil:
    """Append rows [lo, hi) of one run (global row = base + i), consolidating."""
    cdef int64_t i, o, first, s
    cdef uint64_t key, c
    cdef bint same
    cdef int ovf = 0
    if hi <= lo:
        return
    if not out.open:
        out.key = k[lo]
        out.first = base + lo
        out.s = w[lo]
        out.open = True
        lo += 1
    o = out.o
    key = out.key
    first = out.first
    s = out.s
    for i in range(lo, hi):
        c = k[i]
        same = c == key
        out.g[o] = first
        out.w[o] = s
        o += (not same) & (s != 0)
        first = first if same else base + i
        ovf |= dbsp_add_ovf(s if same else 0, w[i], &s)
        key = c
    out.ovf |= ovf
    out.o = o
    out.key = key
    out.first = first
    out.s = s


cdef inline int64_t gallop_lt(const uint64_t* k, int64_t lo, int64_t hi, uint64_t x) noexcept nogil:
    """First i in [lo, hi) with k[i] >= x (k sorted), searching from lo outwards."""
    cdef int64_t step = 1, a = lo, b, m
    while a + step < hi and k[a + step] < x:
        a += step
        step <<= 1
    b = a + step if a + step < hi else hi
    # k[a] < x or a == lo; answer in (a, b] or lo
    if a < hi and k[a] >= x:
        return a
    while a + 1 < b:
        m = a + (b - a) // 2
        if k[m] < x:
            a = m
        else:
            b = m
    return b


cdef inline int64_t gallop_le(const uint64_t* k, int64_t lo, int64_t hi, uint64_t x) noexcept nogil:
    """First i in [lo, hi) with k[i] > x (k sorted), searching from lo outwards."""
    cdef int64_t step = 1, a = lo, b, m
    while a + step < hi and k[a + step] <= x:
        a += step
        step <<= 1
    b = a + step if a + step < hi else hi
    if a < hi and k[a] > x:
        return a
    while a + 1 < b:
        m = a + (b - a) // 2
        if k[m] <= x:
            a = m
        else:
            b = m
    return b


cdef enum:
    BULK_MIN = 64      # a stretch of one run below the other's head worth a bulk copy
    BLOCK = 256        # rows merged branchlessly between checks for bulk stretches
    SIMD_STEPS = 32    # 8-row AVX-512 steps between those checks (as many rows as BLOCK)


cdef void merge_block(const uint64_t* a, const int64_t* wa, const uint64_t* b,
                      const int64_t* wb, int64_t* ip, int64_t* jp, int64_t stop, int64_t ba,
                      int64_t bb, out_t* out) noexcept nogil:
    """``stop`` steps of the branchless merge; neither side may run out within them.

    The state lives in locals (registers) and is written back once.
    """
    cdef int64_t i = ip[0], j = jp[0], o = out.o, first = out.first, s = out.s
    cdef int64_t g, wv, wx, wy, m, ms, _
    cdef int64_t* og = out.g
    cdef int64_t* ow = out.w
    cdef uint64_t key = out.key, x, y, c
    cdef bint ta, same
    cdef int ovf = 0
    for _ in range(stop):
        # Both sides are loaded and the taken one is selected with masks: written as ternaries,
        # gcc turned some selections into (unpredictable) branches.
        x = a[i]
        y = b[j]
        wx = wa[i]
        wy = wb[j]
        ta = x <= y
        m = -<int64_t>ta                  # all ones when a's row is taken
        c = (x & <uint64_t>m) | (y & ~<uint64_t>m)
        g = ((ba + i) & m) | ((bb + j) & ~m)
        wv = (wx & m) | (wy & ~m)
        i += ta
        j += 1 - ta
        same = c == key
        ms = -<int64_t>same               # all ones when the row joins the open group
        og[o] = first
        ow[o] = s
        o += (1 - same) & (s != 0)
        first = (first & ms) | (g & ~ms)
        ovf |= dbsp_add_ovf(s & ms, wv, &s)
        key = c
    out.ovf |= ovf
    ip[0] = i
    jp[0] = j
    out.o = o
    out.first = first
    out.s = s
    out.key = key


cdef void merge2_u64(const run_t* ra, const run_t* rb, out_t* out, bint simd) noexcept nogil:
    """Stable merge of two sorted u64 runs, consolidating (``simd``: AVX-512 steps while both
    sides have 8 rows left)."""
    cdef const uint64_t* a = ra.k.u64
    cdef const uint64_t* b = rb.k.u64
    cdef const int64_t* wa = ra.w
    cdef const int64_t* wb = rb.w
    cdef int64_t na = ra.n, nb = rb.n, ba = ra.base, bb = rb.base
    cdef int64_t i = 0, j = 0, e, stop
    cdef bint ta
    while i < na and j < nb:
        # bulk stretches: rows of a below b's head (ties go to a), then rows of b below a's head
        if a[i] <= b[j]:
            e = gallop_le(a, i, na, b[j])
            if e - i >= BULK_MIN or e == na:
                copy_u64(a, wa, i, e, ba, out)
                i = e
                continue
        else:
            e = gallop_lt(b, j, nb, a[i])
            if e - j >= BULK_MIN or e == nb:
                copy_u64(b, wb, j, e, bb, out)
                j = e
                continue
        # a block of branchless merging: stop while both sides have rows left
        stop = BLOCK
        if na - i < stop:
            stop = na - i
        if nb - j < stop:
            stop = nb - j
        if not out.open:
            ta = a[i] <= b[j]
            out.key = a[i] if ta else b[j]
            out.first = ba + i if ta else bb + j
            out.s = wa[i] if ta else wb[j]
            out.open = True
            i += ta
            j += not ta
            stop -= 1
        if simd and na - i >= 8 and nb - j >= 8:
            # 8-row steps (the group is open): each needs 8 rows left on both sides, so the
            # scalar loop below takes the last rows of either side
            stop = (na - i) // 8
            if (nb - j) // 8 < stop:
                stop = (nb - j) // 8
            if stop > SIMD_STEPS:
                stop = SIMD_STEPS
            dbsp_merge2_avx512(a, wa, b, wb, &i, &j, stop, ba, bb, out.g, out.w, &out.o,
                               &out.key, &out.first, &out.s, &out.ovf)
            continue
        merge_block(a, wa, b, wb, &i, &j, stop, ba, bb, out)
    copy_u64(a, wa, i, na, ba, out)
    copy_u64(b, wb, j, nb, bb, out)


# --- loser tree over k runs ---------------------------------------------------------------------

cdef inline int row_cmp(const run_t* r1, const run_t* r2) noexcept nogil:
    """Compare the heads of two non-exhausted runs by (k, v)."""
    cdef int c = codes_cmp(&r1.k, r1.pos, &r2.k, r2.pos)
    if c != 0 or r1.v.n < 0:
        return c
    return codes_cmp(&r1.v, r1.pos, &r2.v, r2.pos)


cdef inline bint beats(const run_t* runs, int64_t x, int64_t y) noexcept nogil:
    """Run x's head comes before run y's: exhausted runs last, ties by run number."""
    cdef const run_t* rx = &runs[x]
    cdef const run_t* ry = &runs[y]
    cdef int c
    if rx.pos >= rx.n:
        return False
    if ry.pos >= ry.n:
        return True
    if rx.k.u64 != NULL and ry.v.n < 0:
        if rx.k.u64[rx.pos] != ry.k.u64[ry.pos]:
            return rx.k.u64[rx.pos] < ry.k.u64[ry.pos]
        return x < y
    c = row_cmp(rx, ry)
    if c != 0:
        return c < 0
    return x < y


cdef int64_t build(const run_t* runs, int64_t* tree, int64_t k, int64_t node) noexcept nogil:
    """Fill the subtree at ``node`` (leaves are nodes k..2k-1): store losers, return the winner."""
    cdef int64_t l, r
    if node >= k:
        return node - k
    l = build(runs, tree, k, 2 * node)
    r = build(runs, tree, k, 2 * node + 1)
    if beats(runs, l, r):
        tree[node] = r
        return l
    tree[node] = l
    return r


cdef inline bint rows_equal(const run_t* f, int64_t fp, const run_t* r, int64_t t) noexcept nogil:
    """Row fp of run f equals row t of run r in (k, v)."""
    if f.k.u64 != NULL and f.v.n < 0:
        return f.k.u64[fp] == r.k.u64[t]
    if codes_cmp(&f.k, fp, &r.k, t) != 0:
        return False
    return f.v.n < 0 or codes_cmp(&f.v, fp, &r.v, t) == 0


cdef void merge_tree(run_t* runs, int64_t k, int64_t* tree, out_t* out) noexcept nogil:
    """k-way merge through a loser tree, consolidating equal (k, v) rows.

    ``tree[1..k-1]`` hold the losers of the internal nodes; leaf ``k + r`` is run r.
    """
    cdef int64_t win, node, t, total = 0, _
    cdef int64_t frun = -1, fpos = 0     # the open group's first row (run, position)
    cdef run_t* r
    for t in range(k):
        total += runs[t].n - runs[t].pos
    win = build(runs, tree, k, 1)
    for _ in range(total):
        r = &runs[win]
        t = r.pos
        if out.open and rows_equal(&runs[frun], fpos, r, t):
            out.ovf |= dbsp_add_ovf(out.s, r.w[t], &out.s)
        else:
            close_group(out)
            out.first = r.base + t
            out.s = r.w[t]
            out.open = True
            frun = win
            fpos = t
        r.pos = t + 1
        node = (win + k) >> 1
        while node >= 1:
            if beats(runs, tree[node], win):
                t = tree[node]
                tree[node] = win
                win = t
            node >>= 1
    close_group(out)


# --- loser tree specialised to u64 keys -------------------------------------------------------

ctypedef struct head_t:
    uint64_t key      # the run's current code (UINT64_MAX once exhausted)
    int64_t tag       # run number, + k once exhausted: ties (and exhausted runs) order by it


cdef inline bint head_lt(const head_t* h, int64_t x, int64_t y) noexcept nogil:
    # bitwise, not short-circuit: random heads would mispredict the branches
    cdef uint64_t kx = h[x].key, ky = h[y].key
    return (kx < ky) | ((kx == ky) & (h[x].tag < h[y].tag))


cdef void merge_tree_u64(run_t* runs, int64_t k, int64_t* tree, head_t* h,
                         out_t* out) noexcept nogil:
    """k-way merge of u64 runs through a loser tree over (code, run) heads kept in one small
    array, so a replay step is two L1 loads and a compare."""
    cdef int64_t r, node, t, other, total = 0, _, g, wv, m
    cdef uint64_t c
    cdef bint same, lt
    cdef run_t* rr
    for r in range(k):
        total += runs[r].n
        h[r].key = runs[r].k.u64[0]      # every run here is non-empty
        h[r].tag = r
    # build: the same recursion as the generic tree, on the heads
    r = build_u64(h, tree, k, 1)
    for _ in range(total):
        rr = &runs[r]
        t = rr.pos
        c = h[r].key
        g = rr.base + t
        wv = rr.w[t]
        same = out.open and c == out.key
        if same:
            out.ovf |= dbsp_add_ovf(out.s, wv, &out.s)
        else:
            close_group(out)
            out.key = c
            out.first = g
            out.s = wv
            out.open = True
        t += 1
        rr.pos = t
        if t < rr.n:
            h[r].key = rr.k.u64[t]
        else:
            h[r].key = <uint64_t>-1
            h[r].tag = r + k
        node = (r + k) >> 1
        while node >= 1:
            other = tree[node]
            lt = head_lt(h, other, r)
            m = -<int64_t>lt             # select by mask (ternaries became branches)
            tree[node] = (r & m) | (other & ~m)
            r = (other & m) | (r & ~m)
            node >>= 1
    close_group(out)


cdef int64_t build_u64(const head_t* h, int64_t* tree, int64_t k, int64_t node) noexcept nogil:
    cdef int64_t l, r
    if node >= k:
        return node - k
    l = build_u64(h, tree, k, 2 * node)
    r = build_u64(h, tree, k, 2 * node + 1)
    if head_lt(h, l, r):
        tree[node] = r
        return l
    tree[node] = l
    return r


# --- entry point --------------------------------------------------------------------------------

def merge_consolidate(runs, bint check=True):
    """k-way merge of consolidated runs ``(kcodes, vcodes_or_None, weights)``.

    Returns ``(gidx, w)`` (int64): ``gidx`` indexes the virtual concatenation of the runs (run 0's
    rows first); output row i is input row ``gidx[i]`` (the first run holding it) with the summed
    weight ``w[i]``; zero sums are dropped. The output is consolidated.

    ``check``: raise ``OverflowError`` when some partial weight sum wrapped (the caller then
    checks the final sums exactly, see ``checked_add.h``); ``False``: return the sums modulo
    2**64.
    """
    runs = list(runs)
    cdef int64_t k = len(runs), i, total = 0, nz = 0, n
    if k == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    owners = []
    cdef bint has_v = runs[0][1] is not None
    cdef bint u64 = isinstance(runs[0][0], np.ndarray)
    cdef run_t* rs = <run_t*>malloc(k * sizeof(run_t))
    cdef int64_t* tree = <int64_t*>malloc((k + 1) * sizeof(int64_t))
    cdef int64_t* live = <int64_t*>malloc((k + 1) * sizeof(int64_t))
    cdef head_t* heads = <head_t*>malloc((k + 1) * sizeof(head_t))
    if rs == NULL or tree == NULL or live == NULL or heads == NULL:
        free(rs)
        free(tree)
        free(live)
        free(heads)
        raise MemoryError()
    cdef out_t out
    cdef cnp.ndarray gidx, wout
    try:
        memset(rs, 0, k * sizeof(run_t))
        for i in range(k):
            run = runs[i]
            if len(run) != 3:
                raise ValueError("a run is (kcodes, vcodes_or_None, weights)")
            kc, vc, wc = run
            if isinstance(kc, np.ndarray) != u64:
                raise TypeError("runs mix u64 and var key codes")
            if (vc is not None) != has_v:
                raise ValueError("runs mix rows with and without vcodes")
            ko = as_codes(kc)
            wo = as_i64(wc)
            owners.append((ko, wo))
            rs[i].k = codes_view(ko)
            n = rs[i].k.n
            if wo.shape[0] != n:
                raise ValueError(f"run {i}: {wo.shape[0]} weights for {n} rows")
            rs[i].v.n = -1
            if has_v:
                vo = as_codes(vc)
                owners.append(vo)
                rs[i].v = codes_view(vo)
                if rs[i].v.n != n:
                    raise ValueError(f"run {i}: {rs[i].v.n} vcodes for {n} rows")
                if isinstance(vc, np.ndarray) != isinstance(runs[0][1], np.ndarray):
                    raise TypeError("runs mix u64 and var value codes")
            rs[i].w = <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>wo)
            rs[i].n = n
            rs[i].base = total
            total += n
            if n > 0:
                live[nz] = i
                nz += 1
        gidx = np.empty(max(total, 1), dtype=np.int64)
        wout = np.empty(max(total, 1), dtype=np.int64)
        memset(&out, 0, sizeof(out_t))
        out.g = <int64_t*>cnp.PyArray_DATA(gidx)
        out.w = <int64_t*>cnp.PyArray_DATA(wout)
        with nogil:
            if nz == 0:
                pass
            elif u64 and not has_v and nz <= 2:
                if nz == 1:
                    copy_u64(rs[live[0]].k.u64, rs[live[0]].w, 0, rs[live[0]].n, rs[live[0]].base,
                             &out)
                else:
                    merge2_u64(&rs[live[0]], &rs[live[1]], &out, _simd)
                close_group(&out)
            else:
                # the tree holds only the non-empty runs
                for i in range(nz):
                    rs[i] = rs[live[i]]
                if u64 and not has_v:
                    merge_tree_u64(rs, nz, tree, heads, &out)
                else:
                    merge_tree(rs, nz, tree, &out)
    finally:
        free(rs)
        free(tree)
        free(live)
        free(heads)
    if check and out.ovf:
        raise OverflowError("an int64 weight sum wrapped in merge_consolidate")
    return shrink(gidx, out.o), shrink(wout, out.o)

