"""Record batches through the Arrow C data interface: small gathers without a Python object per
column (native twin of ``take_batch`` in ``kernels_ref``).

A pyarrow object costs more to make than a hundred rows cost to move: every ``pa.Array`` built or
read (``batch.column(i)``, ``batch.columns``, ``Array.from_buffers``) wraps its ``DataType`` again
(a couple of thousand instructions each in pyarrow 26), and ``RecordBatch.from_arrays(...,
schema=)`` wraps every field. A numpy gather of each column of a small batch therefore spent
most of its time making and unmaking those wrappers, not gathering.

* ``take_batch(batch, idx)``: rows ``idx`` of ``batch`` when every column is fixed-width
  (integers, floats, dates, times, timestamps, durations) without nulls, else None. The batch is
  exported once (``_export_to_c``: no Python object per column), each column gathered from its
  values buffer into one aligned allocation, and the result imported once
  (``RecordBatch._import_from_c`` with the batch's own schema object). Row indices outside
  ``0..num_rows-1`` raise IndexError. With ``extra`` numpy columns (and their null masks) and
  the output ``schema``, those columns follow the gathered ones in the same batch: an
  operator's output (gathered keys, then computed values) or a state's value batch in one
  import, without a ``pa.array`` per column and ``RecordBatch.from_arrays`` (which wraps each
  field of the schema).
* ``encode_u64(batch, plan)``: the u64 key codes of a batch of integer / temporal columns
  without nulls, read from the exported buffers (no pyarrow Array or Buffer object per column,
  no numpy temporaries per column); the twin of ``KeyCodec._encode_u64``.

* ``index_rows(batch, ...)``: the rows of a small batch indexed by u64 key codes and
  consolidated by (key, value) codes, from one export: the key batch, codes, offsets, value
  batch, value codes and weights of an indexed Z-set (``OrdIndexedZSet.from_parts``'s result
  without its encodes, sort and takes, each a pyarrow call or an export and import of its own).

Ownership: the output ``ArrowArray`` and everything it points to (children, buffer tables,
values) are one allocation, freed by the parent's ``release`` (Arrow C++ imports a record batch
whole and releases only the parent; the children's ``release`` only marks them released).
Gather loops run without the GIL.
"""
cimport numpy as cnp
from _native.arrays cimport contig, contig_any, empty1, zeros1
from _native.arrow_abi cimport ArrowArray, ArrowSchema
from _native.pack_codes cimport pack_codes as _pack_codes
from _native.arrow_blocks cimport (blk_gather as _gather, blk_gathered,
                                   blk_release_child as _release_child, blk_schema_widths,
                                   blk_head as _struct_head, blk_release_parent as _release_parent,
                                   blk_up64 as _up64, blk_width as _width)
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset
from cpython.ref cimport Py_INCREF

cdef extern from "checked_add.h" nogil:
    int dbsp_add_ovf(int64_t a, int64_t b, int64_t* r)

import numpy as np
import pyarrow as pa

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    # (numpy's .pxd leaves it out; it steals a reference to ``descr``)
    object PyArray_NewFromDescr(type subtype, cnp.dtype descr, int nd, cnp.npy_intp* dims,
                                cnp.npy_intp* strides, void* data, int flags, object obj)

cdef extern from "<stdlib.h>" nogil:
    void* aligned_alloc(size_t alignment, size_t size)


_import_batch = pa.RecordBatch._import_from_c


cdef uint8_t* _struct_block(Py_ssize_t kt, int64_t m, size_t size) except NULL:
    """One 64-byte aligned block of ``size`` bytes holding a struct array of ``kt`` children
    of ``m`` rows: the header (see :func:`_struct_head`) zeroed and linked (each child with
    two buffers, no validity yet), the values after it. Released by ``_release_parent``."""
    cdef size_t head = _struct_head(kt)
    cdef uint8_t* block = <uint8_t*>aligned_alloc(64, size)
    if block == NULL:
        raise MemoryError()
    memset(block, 0, head)
    cdef ArrowArray* out = <ArrowArray*>block
    cdef ArrowArray* kids = out + 1
    cdef ArrowArray** kidp = <ArrowArray**>(kids + kt)
    cdef const void** bufs = <const void**>(kidp + kt)
    out.length = m
    out.n_buffers = 1
    out.n_children = kt
    out.buffers = bufs
    out.children = kidp
    out.release = _release_parent
    out.private_data = block
    cdef Py_ssize_t c
    for c in range(kt):
        kidp[c] = &kids[c]
        kids[c].length = m
        kids[c].n_buffers = 2
        kids[c].buffers = bufs + 1 + 2 * c
        kids[c].release = _release_child
    return block


cdef uint8_t* _gathered_block(const ArrowArray* src, const int* cols, const int* ws,
                              Py_ssize_t nc, const int64_t* idx, int64_t m) except NULL:
    """:func:`~arrow_blocks.blk_gathered` (column ``cols[c]`` of the exported batch ``src``,
    see :func:`_check_gathered`, gathered at the rows ``idx``), MemoryError for NULL."""
    cdef uint8_t* block
    with nogil:
        block = blk_gathered(src, cols, ws, nc, idx, m)
    if block == NULL:
        raise MemoryError()
    return block


cdef int _check_gathered(ArrowArray* ch, int w):
    """Whether an exported column of width ``w`` can be gathered (one values buffer, no
    nulls, no dictionary or children)."""
    if w == 0 or ch.n_children != 0 or ch.n_buffers != 2 or ch.dictionary != NULL:
        return 0
    return ch.null_count == 0 or (ch.null_count == -1 and ch.buffers[0] == NULL)


def take_batch(batch, idx, list extra=None, schema=None, list views=None):
    """Rows ``idx`` (integers in ``0..num_rows-1``) of the record batch ``batch`` when every
    column is fixed-width without nulls, else None.

    With ``extra`` (a list of ``(values, null mask or None)`` numpy pairs, one value per output
    row) and ``schema`` (the output schema: ``batch``'s column types, then one fixed-width type
    per extra column whose byte width is its values' itemsize), the extra columns follow the
    gathered ones in the same batch (a null where the mask is true). ``batch`` may then be None
    (and ``idx`` ignored): the batch of the extra columns alone. ``batch`` may be an
    :class:`ExportedBatch` (read through its kept export when ``extra`` is given). With
    ``views`` (a list), the export of the batch built is appended there (see
    :func:`_import_kept`: a later gather or merge reads it instead of exporting it again)."""
    cdef cnp.ndarray ix
    cdef int64_t m = 0, n = 0, i, lo = 0, hi = 0, nnull
    cdef const int64_t* p = NULL
    cdef ArrowArray src
    cdef ArrowSchema ssrc
    cdef bytes wb = None
    src.release = NULL
    ssrc.release = NULL
    src.n_children = 0
    src.offset = 0
    cdef ArrowArray* sp = &src  # the batch's export: made here, or kept by an ExportedBatch
    cdef int64_t k = 0, e = 0 if extra is None else len(extra), c, kt
    cdef int widths[64]
    cdef list vals = [], masks = []
    cdef cnp.ndarray va, ma
    cdef int64_t isz
    cdef ArrowArray* ch
    cdef ArrowArray* out = NULL
    cdef ArrowArray* kids
    cdef uint8_t* block
    cdef uint8_t* data
    cdef const uint8_t* pm
    cdef uint8_t* bm
    cdef size_t head, size
    cdef int w
    if e and schema is None:
        raise ValueError("take_batch: extra columns need the output schema")
    if e > 64:
        return None
    if e:
        m = -1
        for c in range(e):
            v, mk = extra[c]
            va = np.ascontiguousarray(v)
            if va.dtype.kind not in "iufmM":
                raise TypeError(f"take_batch: extra column {c} holds {va.dtype}, not numbers")
            if va.ndim != 1 or (m >= 0 and va.shape[0] != m):
                raise ValueError("take_batch: extra columns differ in length")
            m = va.shape[0]
            vals.append(va)
            if mk is None:
                masks.append(None)
            else:
                ma = contig(mk, cnp.NPY_BOOL)
                if ma.ndim != 1 or ma.shape[0] != m:
                    raise ValueError("take_batch: a null mask differs in length from its column")
                masks.append(ma)
    try:
        if batch is not None:
            ix = contig(idx, cnp.NPY_INT64)
            if e and ix.shape[0] != m:
                raise ValueError("take_batch: extra columns differ in length from the rows taken")
            m = ix.shape[0]
            p = <const int64_t*>cnp.PyArray_DATA(ix)
            if e and type(batch) is ExportedBatch:
                sp = &(<ExportedBatch>batch).arr
            elif e:
                batch._export_to_c(<uintptr_t>&src)
            else:
                if type(batch) is ExportedBatch:  # (the schema is read from the batch)
                    batch = (<ExportedBatch>batch).batch
                batch._export_to_c(<uintptr_t>&src, <uintptr_t>&ssrc)
            k = sp.n_children
            n = sp.length
            if k > 64 or sp.dictionary != NULL:
                return None
        if e:  # the output schema's widths: one export per schema object, not per call
            if len(schema) != k + e:
                raise ValueError(f"take_batch: the output schema has {len(schema)} columns, "
                                 f"not {k} + {e}")
            wb = _widths_of(schema)
            if wb is None:
                return None
        elif k == 0:
            return None
        kt = k + e
        for c in range(kt):
            if e:
                w = (<const unsigned char*>wb)[c]
            else:
                w = _width(ssrc.children[c].format)
                if w == 0 or ssrc.children[c].dictionary != NULL:
                    return None
            if c < k and not _check_gathered(sp.children[c], w):
                return None
            if c >= k:
                va = vals[c - k]
                isz = va.itemsize
                if w != isz:
                    raise ValueError(f"take_batch: extra column {c - k} has items of {isz} "
                                     f"bytes, its type {w}")
            widths[c] = w
        if k:
            with nogil:
                for i in range(m):
                    if p[i] < 0 or p[i] >= n:
                        hi = 1
                        lo = p[i]
                        break
            if hi:
                raise IndexError(f"take: row index {lo} out of range for {n} rows")
        # one block: parent, children, child pointers, buffer tables, then each column's values
        # (and validity bitmap)
        head = _struct_head(kt)
        size = head
        for c in range(kt):
            size += _up64(<size_t>widths[c] * <size_t>m)
            if c >= k and masks[c - k] is not None:
                size += _up64(<size_t>((m + 7) >> 3))
        block = _struct_block(kt, m, size)
        out = <ArrowArray*>block
        kids = out + 1
        data = block + head
        for c in range(kt):
            w = widths[c]
            kids[c].buffers[1] = data
            if c < k:
                ch = sp.children[c]
                with nogil:
                    _gather(<const uint8_t*>ch.buffers[1] + (ch.offset + sp.offset) * w,
                            data, w, p, m)
                data += _up64(<size_t>w * <size_t>m)
                continue
            va = vals[c - k]
            memcpy(data, cnp.PyArray_DATA(va), <size_t>w * <size_t>m)
            data += _up64(<size_t>w * <size_t>m)
            if masks[c - k] is None:
                continue
            ma = masks[c - k]
            pm = <const uint8_t*>cnp.PyArray_DATA(ma)
            bm = data
            nnull = 0
            with nogil:
                memset(bm, 0, (m + 7) >> 3)
                for i in range(m):
                    if pm[i]:
                        nnull += 1
                    else:
                        bm[i >> 3] |= <uint8_t>(1 << (i & 7))
            if nnull:
                kids[c].buffers[0] = bm
            kids[c].null_count = nnull
            data += _up64(<size_t>((m + 7) >> 3))
    finally:
        if src.release != NULL:
            src.release(&src)
        if ssrc.release != NULL:
            ssrc.release(&ssrc)
    return _import_kept(<uint8_t*>out, batch.schema if not e else schema, views)


cdef class ExportedBatch:
    """A record batch exported once through the C data interface (:func:`export_batch`), for
    a batch that :func:`take_batch_runs` reads step after step (a stored batch of a join's
    trace): a run on it reads the kept export instead of exporting the batch again (an export
    makes a struct type and a field table: thousands of instructions, more than a 100-row
    gather). Holds the batch, so it pickles as a new export of it."""
    cdef ArrowArray arr
    cdef readonly object batch

    def __cinit__(self):
        self.arr.release = NULL

    def __dealloc__(self):
        if self.arr.release != NULL:
            self.arr.release(&self.arr)

    def __reduce__(self):
        return export_batch, (self.batch,)

    @property
    def num_rows(self) -> int:
        return self.arr.length

    @property
    def array_address(self) -> int:
        """The address of the kept ``ArrowArray`` (valid while this object lives), for a
        kernel of another module that reads exported batches (``merge_indexed_batches``)."""
        return <uintptr_t>&self.arr


cdef object _import_kept(uint8_t* block, schema, list views):
    """``block`` (a struct array this module built) imported as a record batch of ``schema``;
    with ``views`` (a list), an :class:`ExportedBatch` of it is appended there for free: the
    block's header stays in place after the import (Arrow moves the parent struct, reads the
    children where they are, and frees the block when the batch's last buffer goes), so a copy
    of the parent made before the import reads the same columns for as long as the view holds
    the batch. A batch a spine stores is exported again by each merge and gather that reads
    it: those exports (some 9K instructions each) are then never made."""
    cdef ExportedBatch e = None
    if views is not None:
        e = ExportedBatch.__new__(ExportedBatch)
        e.arr = (<ArrowArray*>block)[0]
        e.arr.release = NULL  # the import owns the block
    batch = _import_batch(<uintptr_t>block, schema)
    if e is not None:
        e.batch = batch
        views.append(e)
    return batch


def import_kept(uintptr_t address, schema, list views=None):
    """:func:`_import_kept` for a struct array built by another module (one block freed by
    its parent's ``release``, as ``arrow_blocks.blk_struct`` makes them)."""
    return _import_kept(<uint8_t*>address, schema, views)


def export_batch(batch):
    """``batch`` (a record batch) exported once, as an :class:`ExportedBatch` that
    :func:`take_batch_runs` accepts in place of the batch."""
    if not isinstance(batch, pa.RecordBatch):
        raise TypeError(f"export_batch: expected a pyarrow RecordBatch, got {type(batch).__name__}")
    cdef ExportedBatch e = ExportedBatch.__new__(ExportedBatch)
    batch._export_to_c(<uintptr_t>&e.arr)
    e.batch = batch
    return e


#: the column widths of the schemas met (``blk_schema_widths``)
cdef dict _schema_widths = {}


cdef inline bytes _widths_of(schema):
    return blk_schema_widths(_schema_widths, schema)


def take_batch_runs(schema, list groups):
    """One record batch of ``schema`` from column groups side by side: group ``g`` is a list of
    ``(batch, idx)`` runs, its rows the rows ``idx`` of each run's batch one after another
    (every batch of a group has the group's columns, which come next in ``schema``). Every
    group has the same number of rows. None when a column is not fixed-width without nulls (or
    a group has no column). A run's batch may be an :class:`ExportedBatch` (a stored batch
    exported once); a run on the same batch object as the run before it reuses its export. An
    index outside its batch raises IndexError."""
    cdef ArrowArray src
    src.release = NULL
    cdef ArrowArray* cur = NULL
    cdef int64_t ng = len(groups), g, r, nr, c, kg, col0 = 0, kt, m = -1, mg, i, n, lo = 0
    cdef int64_t row0
    cdef const unsigned char* widths
    cdef ArrowArray* ch
    cdef ArrowArray* out = NULL
    cdef ArrowArray* kids
    cdef uint8_t* block = NULL
    cdef uint8_t* data
    cdef size_t head, size
    cdef int w, hi = 0
    cdef cnp.ndarray ix
    cdef const int64_t* p
    cdef list runs
    cdef object prev
    # rows per group (all equal)
    for g in range(ng):
        runs = groups[g]
        mg = 0
        for r in range(len(runs)):
            mg += len(runs[r][1])
        if m >= 0 and mg != m:
            raise ValueError(f"take_batch_runs: group {g} has {mg} rows, not {m}")
        m = mg
    if m < 0:
        return None
    cdef bytes wb = _widths_of(schema)
    if wb is None:
        return None
    widths = <const unsigned char*>wb
    kt = len(wb)
    try:
        head = _struct_head(kt)
        size = head
        for c in range(kt):
            size += _up64(<size_t>widths[c] * <size_t>m)
        block = _struct_block(kt, m, size)
        out = <ArrowArray*>block
        kids = out + 1
        data = block + head
        for c in range(kt):
            kids[c].buffers[1] = data
            data += _up64(<size_t>widths[c] * <size_t>m)
        for g in range(ng):
            runs = groups[g]
            nr = len(runs)
            kg = -1
            row0 = 0
            prev = None
            for r in range(nr):
                b, idx = runs[r]
                if b is not prev:
                    if src.release != NULL:
                        src.release(&src)
                    if type(b) is ExportedBatch:
                        cur = &(<ExportedBatch>b).arr
                    else:
                        b._export_to_c(<uintptr_t>&src)
                        cur = &src
                    prev = b
                    if cur.dictionary != NULL or (kg >= 0 and cur.n_children != kg):
                        raise ValueError(f"take_batch_runs: group {g} mixes batches of different "
                                         f"columns")
                    kg = cur.n_children
                    if kg == 0 or col0 + kg > kt:
                        return None  # (a group without columns: the caller's path)
                    for c in range(kg):
                        if not _check_gathered(cur.children[c], widths[col0 + c]):
                            return None
                ix = contig(idx, cnp.NPY_INT64)
                p = <const int64_t*>cnp.PyArray_DATA(ix)
                mg = ix.shape[0]
                n = cur.length
                with nogil:
                    for i in range(mg):
                        if p[i] < 0 or p[i] >= n:
                            hi = 1
                            lo = p[i]
                            break
                    if not hi:
                        for c in range(kg):
                            w = widths[col0 + c]
                            ch = cur.children[c]
                            _gather(<const uint8_t*>ch.buffers[1] + (ch.offset + cur.offset) * w,
                                    <uint8_t*>kids[col0 + c].buffers[1] + row0 * w, w, p, mg)
                if hi:
                    raise IndexError(f"take: row index {lo} out of range for {n} rows")
                row0 += mg
            if kg < 0:
                return None  # a group without runs
            col0 += kg
        if col0 != kt:
            raise ValueError(f"take_batch_runs: the groups have {col0} columns, the schema {kt}")
        block = NULL  # the import owns it now
    finally:
        if src.release != NULL:
            src.release(&src)
        if block != NULL:
            free(block)
    return _import_batch(<uintptr_t>out, schema)


def encode_u64(batch, list plan):
    """The u64 key codes of the rows of ``batch`` (native twin of ``KeyCodec._encode_u64``,
    which is the reference): ``plan`` gives per column ``(byte width, signed, nullable)``; a
    signed value has its sign bit flipped (two's complement then sorts as unsigned), a
    nullable column puts a validity byte (1) before its value, and the columns are packed most
    significant first. None when a column has a null or is not one values buffer of that width
    (the caller's general path), or the plan does not match the batch's columns."""
    cdef ArrowArray src
    cdef ArrowSchema ssrc
    src.release = NULL
    ssrc.release = NULL
    cdef int64_t n, c, k = len(plan)
    cdef int w
    cdef cnp.ndarray out_a
    cdef uint64_t* out
    batch._export_to_c(<uintptr_t>&src, <uintptr_t>&ssrc)
    try:
        n = src.length
        if k == 0 or src.n_children != k or src.dictionary != NULL:
            return None
        for c in range(k):
            w = plan[c][0]
            # the column's own type must have the plan's width (the values buffer is read as
            # such): a batch that does not match its codec goes to the general path
            if w not in (1, 2, 4, 8) or _width(ssrc.children[c].format) != w \
                    or not _check_gathered(src.children[c], w):
                return None
        out_a = empty1(n, cnp.NPY_UINT64)
        out = <uint64_t*>cnp.PyArray_DATA(out_a)
        _pack_codes(&src, NULL, plan, out, n)
    finally:
        if src.release != NULL:
            src.release(&src)
        if ssrc.release != NULL:
            ssrc.release(&ssrc)
    return out_a


#: most rows :func:`group_rows` groups (a step's change; a larger batch takes the caller's path
#: of an encode, a radix sort and gathers)
GROUP_ROWS_MAX = 1 << 16


ctypedef uint8_t _no_second_t
ctypedef fused _second_t:
    uint64_t        # a second code array: sort the pairs (c, d)
    _no_second_t    # none (d and td NULL): sort c alone, no second compare compiled


cdef void _merge_sort(uint64_t* c, _second_t* d, int64_t* p, uint64_t* tc, _second_t* td,
                      int64_t* tp, int64_t n) noexcept nogil:
    """Sort ``c`` ascending (``_merge_sort[uint64_t]``: the pairs ``(c, d)``), stably, carrying
    ``p`` along (``tc`` / ``td`` / ``tp``: scratch of ``n``). ``group_rows`` sorts its key codes
    through ``_merge_sort[_no_second_t]`` (``d``, ``td`` NULL: Cython prunes every branch on
    ``_second_t``, so that copy is the one-array sort), ``index_rows`` its (key code, value
    code) pairs."""
    cdef int64_t i, j, w, lo, mid, hi, a, b, k
    cdef uint64_t x
    cdef _second_t x2 = 0
    cdef int64_t y
    cdef bint before
    # runs of 16 by insertion sort, then bottom-up merges
    lo = 0
    while lo < n:
        hi = lo + 16 if lo + 16 < n else n
        for i in range(lo + 1, hi):
            x = c[i]
            y = p[i]
            if _second_t is uint64_t:
                x2 = d[i]
            j = i - 1
            while j >= lo:
                if _second_t is uint64_t:
                    before = c[j] > x or (c[j] == x and d[j] > x2)
                else:
                    before = c[j] > x
                if not before:
                    break
                c[j + 1] = c[j]
                if _second_t is uint64_t:
                    d[j + 1] = d[j]
                p[j + 1] = p[j]
                j -= 1
            c[j + 1] = x
            if _second_t is uint64_t:
                d[j + 1] = x2
            p[j + 1] = y
        lo += 16
    w = 16
    while w < n:
        lo = 0
        while lo < n:
            mid = lo + w if lo + w < n else n
            hi = lo + 2 * w if lo + 2 * w < n else n
            a, b, k = lo, mid, lo
            while a < mid and b < hi:
                if c[b] < c[a] or (_second_t is uint64_t and c[b] == c[a] and d[b] < d[a]):
                    tc[k] = c[b]
                    if _second_t is uint64_t:
                        td[k] = d[b]
                    tp[k] = p[b]
                    b += 1
                else:
                    tc[k] = c[a]
                    if _second_t is uint64_t:
                        td[k] = d[a]
                    tp[k] = p[a]
                    a += 1
                k += 1
            while a < mid:
                tc[k] = c[a]
                if _second_t is uint64_t:
                    td[k] = d[a]
                tp[k] = p[a]
                a += 1
                k += 1
            while b < hi:
                tc[k] = c[b]
                if _second_t is uint64_t:
                    td[k] = d[b]
                tp[k] = p[b]
                b += 1
                k += 1
            lo += 2 * w
        memcpy(c, tc, n * sizeof(uint64_t))
        if _second_t is uint64_t:
            memcpy(d, td, n * sizeof(uint64_t))
        memcpy(p, tp, n * sizeof(int64_t))
        w *= 2


cdef int64_t* _group_table(int tbits) noexcept nogil:
    """A hash table of ``2 ** tbits`` slots for :func:`group_rows`: the codes, then the group
    numbers (-1: empty), in one allocation (NULL when out of memory)."""
    cdef int64_t size = (<int64_t>1) << tbits, i
    cdef int64_t* t = <int64_t*>malloc(2 * size * sizeof(int64_t))
    if t != NULL:
        for i in range(size):
            t[size + i] = -1
    return t


cdef void _group_rehash(int64_t* table, int tbits, const uint64_t* codes,
                        int64_t G) noexcept nogil:
    """Insert the distinct ``codes[g]`` (group ``g``) into an empty :func:`_group_table`."""
    cdef int64_t mask = ((<int64_t>1) << tbits) - 1, g, h
    cdef int64_t* gids = table + mask + 1
    for g in range(G):
        h = <int64_t>((codes[g] * <uint64_t>0x9E3779B97F4A7C15) >> (64 - tbits))
        while gids[h] >= 0:
            h = (h + 1) & mask
        gids[h] = g
        (<uint64_t*>table)[h] = codes[g]


def group_rows(batch, key_cols, list plan, val_cols, weights, key_schema, val_schema,
               list np_dtypes=None, list views=None):
    """The rows of ``batch`` grouped by the u64 codes of its columns ``key_cols`` (``plan``: per
    key column ``(byte width, signed, nullable)``, as :func:`encode_u64`), from one export of
    the batch: ``(keys, codes, bounds, vals, weights)`` with the distinct codes ascending, the
    first row of each group's key columns (a batch of ``key_schema``), group ``g``'s rows at
    ``bounds[g]:bounds[g + 1]`` of ``vals`` (the columns ``val_cols``, a batch of ``val_schema``,
    rows in input order) and of ``weights`` (``weights`` taken in that order). The schemas
    must be the batch's fields of those columns. With ``np_dtypes`` (one numpy dtype per value
    column, of its byte width), a sixth item: the value columns again, as numpy arrays of those
    dtypes (for a caller that computes on them; read-only views of ``vals``' buffers, which
    they keep alive). None when a column read is not fixed-width without nulls, a key column
    does not match its plan, or the batch has no row or more than :data:`GROUP_ROWS_MAX` (the
    caller's general path).

    Grouping costs O(n + G log G) for G distinct codes: each row's code is looked up in a hash
    table (open addressing, grown by doubling, so its size follows G), only the distinct codes
    are sorted, and the rows are scattered to their group's run in input order."""
    cdef ArrowArray src
    cdef ArrowSchema ssrc
    src.release = NULL
    ssrc.release = NULL
    cdef int64_t nk = len(key_cols), nv = len(val_cols), n, i, c, col, G, g, total = 0
    cdef int w
    cdef int kcol[64]
    cdef int vcol[64]
    cdef int kw[64]
    cdef int vw[64]
    cdef cnp.ndarray wa = contig(weights, cnp.NPY_INT64)
    cdef uint8_t* kblock = NULL
    cdef uint8_t* vblock = NULL
    cdef ArrowArray* kids
    cdef uint8_t* data
    cdef size_t head, size
    cdef uint64_t* codes
    cdef int64_t* perm
    cdef int64_t* bounds
    cdef uint64_t* kc
    cdef int64_t* ws
    cdef const int64_t* pw
    cdef int64_t* firsts
    cdef cnp.ndarray codes_a, perm_a, tc_a, tp_a, bounds_a, kc_a, ws_a, a
    cdef list nps = None
    cdef int64_t* scratch = NULL
    cdef int64_t* table = NULL
    cdef int64_t* tgid
    cdef int64_t* gid
    cdef int64_t* cnt
    cdef uint64_t* dc
    cdef int64_t* dg
    cdef int64_t h, tmask
    cdef int tbits
    cdef cnp.npy_intp dims
    if nk == 0 or nk > 64 or nv == 0 or nv > 64 or len(plan) != nk \
            or batch.num_rows > GROUP_ROWS_MAX:
        return None  # (a large step: no export)
    batch._export_to_c(<uintptr_t>&src, <uintptr_t>&ssrc)
    try:
        n = src.length
        if n == 0 or n > GROUP_ROWS_MAX or src.dictionary != NULL or wa.shape[0] != n:
            return None
        for c in range(nk):
            col = key_cols[c]
            if not 0 <= col < src.n_children:
                raise IndexError(f"group_rows: no column {col}")
            w = plan[c][0]
            if w not in (1, 2, 4, 8) or _width(ssrc.children[col].format) != w \
                    or not _check_gathered(src.children[col], w):
                return None
            kcol[c], kw[c] = col, w
            total += w + (1 if plan[c][2] else 0)
        if total > 8:
            return None  # not a u64 code
        for c in range(nv):
            col = val_cols[c]
            if not 0 <= col < src.n_children:
                raise IndexError(f"group_rows: no column {col}")
            w = _width(ssrc.children[col].format)
            if w == 0 or ssrc.children[col].dictionary != NULL \
                    or not _check_gathered(src.children[col], w):
                return None
            vcol[c], vw[c] = col, w
        codes_a = empty1(n, cnp.NPY_UINT64)
        perm_a = empty1(n, cnp.NPY_INT64)
        tc_a = empty1(n, cnp.NPY_UINT64)
        tp_a = empty1(n, cnp.NPY_INT64)
        codes = <uint64_t*>cnp.PyArray_DATA(codes_a)
        perm = <int64_t*>cnp.PyArray_DATA(perm_a)
        dc = <uint64_t*>cnp.PyArray_DATA(tc_a)
        dg = <int64_t*>cnp.PyArray_DATA(tp_a)
        # the codes (as encode_u64), then the groups: each row's distinct code found in a hash
        # table (O(n), however many rows a group has), only the G distinct codes sorted, and
        # the rows scattered to their group's run in input order (a stable grouping)
        _pack_codes(&src, kcol, plan, codes, n)
        # the table starts small and doubles when half full (its size follows the distinct
        # codes, not the rows: a step of 10K rows over 100 keys fills 256 slots)
        scratch = <int64_t*>malloc(2 * n * sizeof(int64_t))
        if scratch == NULL:
            raise MemoryError()
        gid = scratch
        cnt = scratch + n
        tbits = 6
        table = _group_table(tbits)
        if table == NULL:
            raise MemoryError()
        with nogil:
            G = 0
            for i in range(n):
                tmask = (<int64_t>1 << tbits) - 1
                tgid = table + (tmask + 1)
                h = <int64_t>((codes[i] * <uint64_t>0x9E3779B97F4A7C15) >> (64 - tbits))
                while True:
                    g = tgid[h]
                    if g < 0:
                        tgid[h] = G
                        (<uint64_t*>table)[h] = codes[i]
                        dc[G] = codes[i]
                        dg[G] = G
                        gid[i] = G
                        G += 1
                        break
                    if (<uint64_t*>table)[h] == codes[i]:
                        gid[i] = g
                        break
                    h = (h + 1) & tmask
                if 2 * G > tmask + 1:  # half full: a table twice the size, the codes again
                    free(table)
                    tbits += 1
                    table = _group_table(tbits)
                    if table == NULL:
                        break
                    _group_rehash(table, tbits, dc, G)
        if table == NULL:
            raise MemoryError()
        tgid = table  # (its first G slots: free scratch now)
        with nogil:
            # the distinct codes ascending, each carrying its group number (codes and perm
            # are the merge's scratch, free until the scatter)
            _merge_sort[_no_second_t](dc, NULL, dg, codes, NULL, perm, G)
            for g in range(G):  # group number -> rank (the table's first G slots)
                tgid[dg[g]] = g
                cnt[g] = 0
            for i in range(n):
                gid[i] = tgid[gid[i]]
                cnt[gid[i]] += 1
        bounds_a = empty1(G + 1, cnp.NPY_INT64)
        kc_a = empty1(G, cnp.NPY_UINT64)
        ws_a = empty1(n, cnp.NPY_INT64)
        bounds = <int64_t*>cnp.PyArray_DATA(bounds_a)
        kc = <uint64_t*>cnp.PyArray_DATA(kc_a)
        ws = <int64_t*>cnp.PyArray_DATA(ws_a)
        pw = <const int64_t*>cnp.PyArray_DATA(wa)
        firsts = dg  # (free again)
        with nogil:
            bounds[0] = 0
            for g in range(G):
                kc[g] = dc[g]
                bounds[g + 1] = bounds[g] + cnt[g]
                cnt[g] = bounds[g]
            for i in range(n):
                perm[cnt[gid[i]]] = i
                cnt[gid[i]] += 1
            for g in range(G):
                firsts[g] = perm[bounds[g]]
            for i in range(n):
                ws[i] = pw[perm[i]]
        free(scratch)
        scratch = NULL
        free(table)
        table = NULL
        # the keys of the groups' first rows, and the value columns in sorted order
        kblock = _gathered_block(&src, kcol, kw, nk, firsts, G)
        vblock = _gathered_block(&src, vcol, vw, nv, perm, n)
        if np_dtypes is not None:
            # the value columns as numpy: read-only views of the gathered block (no second
            # gather), each holding the imported batch (which owns the block) as its base
            nps = []
            kids = (<ArrowArray*>vblock) + 1
            for c in range(nv):
                dt = np_dtypes[c]
                if not cnp.PyArray_DescrCheck(dt):
                    dt = np.dtype(dt)
                if (<cnp.dtype>dt).itemsize != vw[c] or (<cnp.dtype>dt).kind not in b"iufmM":
                    raise ValueError(f"group_rows: numpy dtype {dt} for a column of {vw[c]} "
                                     f"bytes")
                nps.append((dt, <uintptr_t>kids[c].buffers[1]))
        keys = _import_kept(kblock, key_schema, views)
        kblock = NULL  # the import owns it now
        vals = _import_kept(vblock, val_schema, views)
        vblock = NULL
        if nps is not None:
            dims = n
            for c in range(nv):
                dt, addr = nps[c]
                Py_INCREF(dt)  # (stolen by PyArray_NewFromDescr)
                a = PyArray_NewFromDescr(np.ndarray, dt, 1, &dims, NULL, <void*><uintptr_t>addr,
                                         cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_ALIGNED,
                                         None)
                cnp.set_array_base(a, vals)
                nps[c] = a
    finally:
        if src.release != NULL:
            src.release(&src)
        if ssrc.release != NULL:
            ssrc.release(&ssrc)
        if kblock != NULL:
            free(kblock)
        if vblock != NULL:
            free(vblock)
        free(scratch)
        free(table)
    if nps is not None:
        return keys, kc_a, bounds_a, vals, ws_a, nps
    return keys, kc_a, bounds_a, vals, ws_a


cdef int _codes_of(ArrowArray* src, ArrowSchema* ssrc, list cols, list plan, uint64_t* out,
                   int64_t n) except -1:
    """The u64 codes (as :func:`encode_u64`) of the columns ``cols`` of an exported batch per
    ``plan`` into ``out``: 1 when written, 0 when a column does not match its plan or is not one
    values buffer without nulls, or the codes would not fit in 64 bits."""
    cdef int64_t c, col, k = len(cols)
    cdef int w, total = 0
    cdef int cc[8]
    if k != len(plan):
        return 0
    for c in range(k):
        col = cols[c]
        if not 0 <= col < src.n_children:
            raise IndexError(f"index_rows: no column {col}")
        w = plan[c][0]
        if w not in (1, 2, 4, 8) or _width(ssrc.children[col].format) != w \
                or not _check_gathered(src.children[col], w):
            return 0
        total += w + (1 if plan[c][2] else 0)
    if total > 8:
        return 0
    for c in range(k):  # (k <= 8: each column adds a byte or more)
        cc[c] = cols[c]
    _pack_codes(src, cc, plan, out, n)
    return 1


#: most rows :func:`index_rows` indexes (its merge sort is for small steps; larger ones take
#: the radix sort of ``dbsp._native.sort`` through the general path: on random int64 keys the
#: native pass took 0.2x the general path's time at 100 rows, 0.5x at 256, 0.7x at 512, 1.0x
#: at 1024 and 3.4x at 4096)
INDEX_ROWS_MAX = 512

#: most rows :func:`index_rows` merge-sorts itself when it is given a ``sort``; a larger batch
#: goes to that radix sort. ``index_by`` of the join's bids, merge sort against radix sort in
#: one call (thread CPU, medians of 5 alternating rounds): 11.8 / 12.6 us at 128 rows, 13.1 /
#: 12.8 at 160, 15.0 / 14.2 at 256, 21.4 / 16.9 at 500. Two launcher workers of the join +
#: average at 10K events a step index about 450 auctions each a step, one worker 900
INDEX_MERGE_ROWS = 160


def index_rows(batch, list key_cols, list key_plan, list val_cols, list val_plan, weights,
               key_schema, val_schema, list views=None, sort=None):
    """The rows of ``batch`` as a consolidated indexed Z-set, from one export of the batch:
    ``(keys, kcodes, offsets, vals, vcodes, weights)``, the rows sorted by (key code, value
    code) of the columns ``key_cols`` / ``val_cols`` (``key_plan`` / ``val_plan``: per column
    ``(byte width, signed, nullable)``, as :func:`encode_u64`), equal rows' weights summed and
    zero sums dropped; key ``g``'s values at ``offsets[g]:offsets[g + 1]``, ``keys`` a batch of
    ``key_schema`` (the first row of each key), ``vals`` one of ``val_schema`` (the schemas:
    the batch's fields of those columns). The value rows are each distinct row's first row in
    input order. None when a column is not fixed-width without nulls or does not match its
    plan, either codes would not fit in 64 bits, there are no key or no value columns, the batch
    has no row, or some partial weight sum (equal rows added in input order) leaves int64 (the
    caller's general path, which checks it exactly).

    Up to :data:`INDEX_ROWS_MAX` rows (:data:`INDEX_MERGE_ROWS` when a ``sort`` is given)
    the codes are sorted here (a merge sort); a larger batch is sorted by ``sort``
    (:func:`dbsp.algebra.kernels.sort_consolidate`, the radix sort: one call, given the codes
    packed here), and without ``sort`` it is refused (None). Either way
    the rows are exported once, their columns gathered once into one import per layer, and no
    Python object is made per column: the general path's two encodes, sort and two takes are
    five native calls with their own exports and imports (``index_by`` of 600 rows: 65 us
    that way, 34 us in this one call)."""
    cdef ArrowArray src
    cdef ArrowSchema ssrc
    src.release = NULL
    ssrc.release = NULL
    cdef int64_t nk = len(key_cols), nv = len(val_cols), n, i, c, col, G, g, m, j
    cdef int64_t s
    cdef int ovf = 0
    cdef int kw[64]
    cdef int vw[64]
    cdef ArrowArray* ch
    cdef cnp.ndarray wa = contig(weights, cnp.NPY_INT64)
    cdef uint8_t* kblock = NULL
    cdef uint8_t* vblock = NULL
    cdef ArrowArray* kids
    cdef uint8_t* data
    cdef size_t head, size
    cdef uint64_t* kc
    cdef uint64_t* vc
    cdef int64_t* perm
    cdef const int64_t* pw
    cdef int64_t* ws
    cdef int64_t* offs
    cdef uint64_t* okc
    cdef uint64_t* ovc
    cdef int64_t* firsts
    cdef cnp.ndarray kc_a, vc_a, perm_a, t1_a, t2_a, tp_a, ow_a
    cdef int64_t bound = INDEX_ROWS_MAX if sort is None else INDEX_MERGE_ROWS
    cdef bint merge_here = batch.num_rows <= bound
    if nk == 0 or nk > 64 or nv == 0 or nv > 64 or not (merge_here or sort is not None):
        return None  # (a large step and no sort given: no export)
    batch._export_to_c(<uintptr_t>&src, <uintptr_t>&ssrc)
    try:
        n = src.length
        if n == 0 or src.dictionary != NULL or wa.shape[0] != n \
                or (n > bound) == merge_here:
            return None
        kc_a = empty1(n, cnp.NPY_UINT64)
        vc_a = empty1(n, cnp.NPY_UINT64)
        kc = <uint64_t*>cnp.PyArray_DATA(kc_a)
        vc = <uint64_t*>cnp.PyArray_DATA(vc_a)
        if not _codes_of(&src, &ssrc, key_cols, key_plan, kc, n) \
                or not _codes_of(&src, &ssrc, val_cols, val_plan, vc, n):
            return None
        for c in range(nk):
            kw[c] = key_plan[c][0]
        for c in range(nv):
            vw[c] = val_plan[c][0]
        if merge_here:
            perm_a = empty1(n, cnp.NPY_INT64)
            t1_a = empty1(n, cnp.NPY_UINT64)
            t2_a = empty1(n, cnp.NPY_UINT64)
            tp_a = empty1(n, cnp.NPY_INT64)
            perm = <int64_t*>cnp.PyArray_DATA(perm_a)
            pw = <const int64_t*>cnp.PyArray_DATA(wa)
            with nogil:
                for i in range(n):
                    perm[i] = i
                _merge_sort[uint64_t](kc, vc, perm, <uint64_t*>cnp.PyArray_DATA(t1_a),
                                      <uint64_t*>cnp.PyArray_DATA(t2_a),
                                      <int64_t*>cnp.PyArray_DATA(tp_a), n)
                # consolidate in place: row m of the output is (kc, vc, perm of its first
                # row, summed weight); zero sums dropped
                ws = <int64_t*>cnp.PyArray_DATA(tp_a)  # (scratch, free again)
                m = 0
                i = 0
                while i < n:
                    s = pw[perm[i]]
                    j = i + 1
                    while j < n and kc[j] == kc[i] and vc[j] == vc[i]:
                        ovf |= dbsp_add_ovf(s, pw[perm[j]], &s)
                        j += 1
                    if s != 0:
                        kc[m] = kc[i]
                        vc[m] = vc[i]
                        perm[m] = perm[i]
                        ws[m] = s
                        m += 1
                    i = j
                G = 0
                for i in range(m):
                    G += i == 0 or kc[i] != kc[i - 1]
            if ovf:
                return None  # some weight sum wrapped: the general path checks it exactly
            offs_a = empty1(G + 1, cnp.NPY_INT64)
            okc_a = empty1(G, cnp.NPY_UINT64)
            ovc_a = empty1(m, cnp.NPY_UINT64)
            ow_a = empty1(m, cnp.NPY_INT64)
            offs = <int64_t*>cnp.PyArray_DATA(offs_a)
            okc = <uint64_t*>cnp.PyArray_DATA(okc_a)
            ovc = <uint64_t*>cnp.PyArray_DATA(ovc_a)
            firsts = <int64_t*>cnp.PyArray_DATA(t1_a)  # (scratch of n >= G int64, free again)
            with nogil:
                g = 0
                for i in range(m):
                    if i == 0 or kc[i] != kc[i - 1]:
                        offs[g] = i
                        okc[g] = kc[i]
                        firsts[g] = perm[i]
                        g += 1
                    ovc[i] = vc[i]
                offs[G] = m
                memcpy(cnp.PyArray_DATA(ow_a), ws, m * sizeof(int64_t))
        else:
            # the radix sort, consolidating: the first input row of each distinct row in
            # order, and its summed weight (OverflowError: a partial sum wrapped); the codes
            # are then read through that order, with no sorted copy of them made. (The two
            # passes below repeat the merge branch's, reading kc[perm[i]] where it reads kc[i]:
            # one shared pass cost more, by callgrind of 40 join + average steps at 10K events,
            # index_rows 12.4M instructions as written, 15.8M with a sorted copy of the key
            # codes first, 18.3M with one loop choosing its read per row)
            try:
                perm_a, ow_a = sort(kc_a, vc_a, wa)
            except OverflowError:
                return None  # the general path checks it exactly
            perm_a = contig(perm_a, cnp.NPY_INT64)
            ow_a = contig(ow_a, cnp.NPY_INT64)
            m = perm_a.shape[0]
            if ow_a.shape[0] != m or m > n:
                raise ValueError(f"index_rows: sort gave {m} rows and {ow_a.shape[0]} weights "
                                 f"for {n} rows")
            perm = <int64_t*>cnp.PyArray_DATA(perm_a)
            ovc_a = empty1(m, cnp.NPY_UINT64)
            ovc = <uint64_t*>cnp.PyArray_DATA(ovc_a)
            with nogil:
                G = 0
                for i in range(m):
                    j = perm[i]
                    if j < 0 or j >= n:
                        ovf = 1
                        break
                    ovc[i] = vc[j]
                    G += i == 0 or kc[j] != kc[perm[i - 1]]
            if ovf:
                raise ValueError("index_rows: sort gave a row out of range")
            offs_a = empty1(G + 1, cnp.NPY_INT64)
            okc_a = empty1(G, cnp.NPY_UINT64)
            offs = <int64_t*>cnp.PyArray_DATA(offs_a)
            okc = <uint64_t*>cnp.PyArray_DATA(okc_a)
            firsts = <int64_t*>vc  # (the value codes are in ovc now: n >= G slots of scratch)
            with nogil:
                g = 0
                for i in range(m):
                    j = perm[i]
                    if i == 0 or kc[j] != kc[perm[i - 1]]:
                        offs[g] = i
                        okc[g] = kc[j]
                        firsts[g] = j
                        g += 1
                offs[G] = m
        head = _struct_head(nk)
        size = head
        for c in range(nk):
            size += _up64(<size_t>kw[c] * <size_t>G)
        kblock = _struct_block(nk, G, size)
        kids = (<ArrowArray*>kblock) + 1
        data = kblock + head
        for c in range(nk):
            ch = src.children[<int64_t>key_cols[c]]
            kids[c].buffers[1] = data
            with nogil:
                _gather(<const uint8_t*>ch.buffers[1] + (ch.offset + src.offset) * kw[c], data,
                        kw[c], firsts, G)
            data += _up64(<size_t>kw[c] * <size_t>G)
        head = _struct_head(nv)
        size = head
        for c in range(nv):
            size += _up64(<size_t>vw[c] * <size_t>m)
        vblock = _struct_block(nv, m, size)
        kids = (<ArrowArray*>vblock) + 1
        data = vblock + head
        for c in range(nv):
            ch = src.children[<int64_t>val_cols[c]]
            kids[c].buffers[1] = data
            with nogil:
                _gather(<const uint8_t*>ch.buffers[1] + (ch.offset + src.offset) * vw[c], data,
                        vw[c], perm, m)
            data += _up64(<size_t>vw[c] * <size_t>m)
        keys = _import_kept(kblock, key_schema, views)
        kblock = NULL  # the import owns it now
        vals = _import_kept(vblock, val_schema, views)
        vblock = NULL
    finally:
        if src.release != NULL:
            src.release(&src)
        if ssrc.release != NULL:
            ssrc.release(&ssrc)
        if kblock != NULL:
            free(kblock)
        if vblock != NULL:
            free(vblock)
    return keys, okc_a, offs_a, vals, ovc_a, ow_a


def pick_batch(g, is_old, list olds, list news, schema, list views=None):
    """A record batch of ``schema`` whose column ``j`` row ``r`` is ``olds[j][g[r]]`` where
    ``is_old[r]``, else ``news[j][g[r]]`` (numpy arrays whose itemsize is the byte width of the
    column's fixed-width type; their bits are taken as they are, no nulls): the rows of a
    state's put (``versioned_pairs``) in one import, without a numpy array per column and a
    ``take_batch`` of them. None when a column of ``schema`` is not fixed-width. Raises
    IndexError for ``g[r]`` outside its array, ValueError for arrays that do not match."""
    cdef cnp.ndarray ga = contig(g, cnp.NPY_INT64)
    cdef cnp.ndarray oa = contig(is_old, cnp.NPY_BOOL)
    cdef int64_t m = ga.shape[0], r, k = len(olds), c, lo, ln
    cdef const int64_t* pg = <const int64_t*>cnp.PyArray_DATA(ga)
    cdef const uint8_t* po = <const uint8_t*>cnp.PyArray_DATA(oa)
    cdef int widths[64]
    cdef list xs = []
    cdef cnp.ndarray xo, xn
    cdef uint8_t* block = NULL
    cdef ArrowArray* kids
    cdef uint8_t* data
    cdef const uint8_t* so
    cdef const uint8_t* sn
    cdef size_t head, size
    cdef int w
    cdef bint bad = False
    if oa.shape[0] != m:
        raise ValueError("pick_batch: g and is_old differ in length")
    if len(news) != k or k == 0 or k > 64:
        raise ValueError(f"pick_batch: {k} old and {len(news)} new columns (1 to 64, as many)")
    if len(schema) != k:
        raise ValueError(f"pick_batch: the schema has {len(schema)} columns, not {k}")
    cdef bytes wb = _widths_of(schema)  # (one export per schema object, not per call)
    if wb is None:
        return None
    try:
        for c in range(k):
            w = (<const unsigned char*>wb)[c]
            xo = np.ascontiguousarray(olds[c])
            xn = np.ascontiguousarray(news[c])
            if xo.ndim != 1 or xn.ndim != 1 or xo.itemsize != w or xn.itemsize != w:
                raise ValueError(f"pick_batch: column {c} is {w} bytes a value, its arrays "
                                 f"{xo.itemsize} and {xn.itemsize}")
            lo, ln = xo.shape[0], xn.shape[0]
            with nogil:
                for r in range(m):
                    if pg[r] < 0 or pg[r] >= (lo if po[r] else ln):
                        bad = True
                        break
            if bad:
                raise IndexError(f"pick_batch: row index out of range in column {c}")
            widths[c] = w
            xs.append(xo)
            xs.append(xn)
        head = _struct_head(k)
        size = head
        for c in range(k):
            size += _up64(<size_t>widths[c] * <size_t>m)
        block = _struct_block(k, m, size)
        kids = (<ArrowArray*>block) + 1
        data = block + head
        for c in range(k):
            w = widths[c]
            kids[c].buffers[1] = data
            so = <const uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>xs[2 * c])
            sn = <const uint8_t*>cnp.PyArray_DATA(<cnp.ndarray>xs[2 * c + 1])
            with nogil:
                if w == 8:
                    for r in range(m):
                        (<uint64_t*>data)[r] = (<const uint64_t*>(so if po[r] else sn))[pg[r]]
                else:
                    for r in range(m):
                        memcpy(data + r * w, (so if po[r] else sn) + pg[r] * w, w)
            data += _up64(<size_t>w * <size_t>m)
        out = _import_kept(block, schema, views)
        block = NULL  # the import owns it now
    finally:
        if block != NULL:
            free(block)
    return out
