# cython: language_level=3
"""Native kernels of the layer file format (:mod:`dbsp.storage.format`).

* ``crc32c`` / ``verify_block``: the block checksum (CRC-32C, hardware instruction, GIL
  released for large buffers) and the check every reader runs on a block it has just read.
* Bloom filter over key codes: ``hash_u64`` / ``hash_var`` turn codes into 64-bit hashes,
  ``bloom_add`` sets them in a cache-line-blocked filter (one 512-bit block per key, so a probe
  costs one cache miss), ``bloom_query`` / ``bloom_query_one`` test them.
* ``extents_array``: a list of ``(offset, length)`` pairs as an ``(n, 2)`` int64 array, the
  shape every pooled backend's ``read_blocks`` takes; about 20x cheaper than ``np.asarray`` on a
  list of tuples (which looked up each int's type in a dict: 2,100 instructions a block, the
  largest user-space cost of a cold 4 KiB read, counted with callgrind).
* ``var_lower_bound``: binary search of a byte-string probe among Arrow-layout var codes
  (``memcmp`` then length, the order of :mod:`dbsp.algebra.codes`), for seeks inside data and
  index blocks of var-coded layers.

Everything here works on raw buffers; the file layout itself is described in
``dbsp.storage.format``.
"""
cimport cython
from libc.stdint cimport uint8_t, uint32_t, int64_t, uint64_t
from libc.string cimport memcmp
from cpython.list cimport PyList_GET_SIZE, PyList_GET_ITEM
from cpython.tuple cimport PyTuple_GET_SIZE, PyTuple_GET_ITEM
from cpython.long cimport PyLong_AsLongLong

import numpy as np
cimport numpy as cnp

from _native.storage_types cimport dbsp_crc32c, dbsp_fmix64, dbsp_hash_bytes

cnp.import_array()

__all__ = ["crc32c", "verify_block", "extents_array", "hash_u64", "hash_var", "bloom_add", "bloom_query",
           "bloom_query_one", "var_lower_bound", "BLOOM_BLOCK_BITS"]

BLOOM_BLOCK_BITS = 512
cdef enum:
    _GIL_FREE_BYTES = 16384

cdef uint64_t _BLOOM_SEED2 = 0xA0761D6478BD642F


def crc32c(const uint8_t[::1] buf, uint32_t crc=0):
    """CRC-32C of ``buf`` continuing from ``crc``: the same value as ``crc32c.crc32c``."""
    cdef size_t n = buf.shape[0]
    cdef const uint8_t *p = &buf[0] if n else NULL
    cdef uint32_t r
    if n >= _GIL_FREE_BYTES:
        with nogil:
            r = dbsp_crc32c(crc, p, n)
    else:
        r = dbsp_crc32c(crc, p, n)
    return r


def verify_block(const uint8_t[::1] buf, size_t extent):
    """Check the stored checksum of one block: 0 if good, else a reason code.

    1: too short, 2: bad magic, 3: extent field differs from ``extent``, 4: checksum mismatch.
    The checksum covers bytes [8, extent): the whole block after the checksum itself, padding
    included, so a flipped bit anywhere in the block is caught."""
    cdef const uint8_t *p
    cdef uint32_t stored, ext, r
    if buf.shape[0] < 64 or buf.shape[0] < <Py_ssize_t>extent or extent < 64:
        return 1
    p = &buf[0]
    if not (p[0] == b'D' and p[1] == b'B' and p[2] == b'S' and p[3] == b'B'):
        return 2
    ext = (<const uint32_t *>(p + 12))[0]
    if ext != extent:
        return 3
    stored = (<const uint32_t *>(p + 4))[0]
    if extent >= _GIL_FREE_BYTES:
        with nogil:
            r = dbsp_crc32c(0, p + 8, extent - 8)
    else:
        r = dbsp_crc32c(0, p + 8, extent - 8)
    return 0 if r == stored else 4


def extents_array(extents):
    """``extents`` (a sequence of ``(offset, length)`` pairs) as a C-contiguous ``(n, 2)`` int64
    array: the same array as ``np.asarray(extents, dtype=np.int64).reshape(-1, 2)``.

    A list of 2-tuples of ints (what readers pass) is converted in C; anything else (arrays,
    lists of lists) goes through numpy. An item that is not a pair raises ValueError naming
    its position; an int that does not fit int64 raises OverflowError."""
    cdef Py_ssize_t i, n
    cdef object item
    cdef cnp.ndarray[int64_t, ndim=2] out
    cdef int64_t *o
    if type(extents) is not list:
        a = np.asarray(extents, dtype=np.int64)
        if a.size and (a.ndim != 2 or a.shape[1] != 2):
            raise ValueError(f"extents must be (offset, length) pairs, got shape {a.shape}")
        return np.ascontiguousarray(a.reshape(-1, 2))
    n = PyList_GET_SIZE(extents)
    out = np.empty((n, 2), dtype=np.int64)
    o = <int64_t *>out.data
    for i in range(n):
        item = <object>PyList_GET_ITEM(extents, i)
        if type(item) is tuple and PyTuple_GET_SIZE(item) == 2 \
                and type(<object>PyTuple_GET_ITEM(item, 0)) is int \
                and type(<object>PyTuple_GET_ITEM(item, 1)) is int:
            try:
                o[2 * i] = PyLong_AsLongLong(<object>PyTuple_GET_ITEM(item, 0))
                o[2 * i + 1] = PyLong_AsLongLong(<object>PyTuple_GET_ITEM(item, 1))
            except OverflowError:
                raise OverflowError(f"extent {i} ({item!r}) does not fit int64") from None
        else:
            try:
                pair = np.asarray(item, dtype=np.int64)
            except (TypeError, ValueError, OverflowError) as e:
                raise type(e)(f"extent {i} ({item!r}) is not an (offset, length) pair of "
                              f"ints: {e}") from None
            if pair.shape != (2,):
                raise ValueError(f"extent {i} ({item!r}) is not an (offset, length) pair")
            o[2 * i] = pair[0]
            o[2 * i + 1] = pair[1]
    return out


def check_extents(const int64_t[:, ::1] extents, int64_t file_size, int64_t slot_size):
    """Check the ``(offset, length)`` rows of an ``extents_array`` before a pooled read.

    Returns ``(problem, k, n_big)``: ``problem`` 0 when every extent is fine, 1 when extent
    ``k`` (the first bad one) is not 4 KiB aligned, has a length <= 0 or a negative offset, 2
    when it reaches past ``file_size``; ``n_big`` counts the extents longer than ``slot_size`` (read outside the
    pool). One pass in C: the numpy version (``offs % 4096`` and ``np.any`` over int64 arrays,
    the reference twin in ``tests/storage/test_block_native.py``) cost ~45 ns a block."""
    cdef Py_ssize_t i, n = extents.shape[0]
    cdef int64_t off, ln
    cdef Py_ssize_t nbig = 0
    if n and extents.shape[1] != 2:
        raise ValueError(f"extents must be (offset, length) pairs, got {extents.shape[1]} columns")
    for i in range(n):
        off = extents[i, 0]
        ln = extents[i, 1]
        if (off & 4095) or (ln & 4095) or ln <= 0 or off < 0:
            return 1, i, nbig
        if off > file_size - ln:
            return 2, i, nbig
        if ln > slot_size:
            nbig += 1
    return 0, -1, nbig


def hash_u64(const uint64_t[::1] codes, uint64_t seed):
    """64-bit hashes of uint64 codes (the filter's key hash)."""
    cdef Py_ssize_t i, n = codes.shape[0]
    cdef cnp.ndarray[uint64_t] out = np.empty(n, dtype=np.uint64)
    cdef uint64_t *o = <uint64_t *>out.data
    with nogil:
        for i in range(n):
            o[i] = dbsp_fmix64(codes[i], seed)
    return out


def hash_var(const int64_t[::1] offsets, const uint8_t[::1] data, uint64_t seed):
    """64-bit hashes of var codes ``data[offsets[i]:offsets[i+1]]``."""
    cdef Py_ssize_t i, n = offsets.shape[0] - 1
    cdef cnp.ndarray[uint64_t] out = np.empty(max(n, 0), dtype=np.uint64)
    cdef uint64_t *o = <uint64_t *>out.data
    cdef const uint8_t *d = &data[0] if data.shape[0] else NULL
    if n > 0 and (offsets[0] < 0 or offsets[n] > data.shape[0]):
        raise ValueError("var code offsets out of the data's range")
    with nogil:
        for i in range(n):
            o[i] = dbsp_hash_bytes(d + offsets[i], <size_t>(offsets[i + 1] - offsets[i]), seed)
    return out


cdef inline void _bloom_bits(uint64_t h, uint64_t nblocks, int k, uint64_t *blk,
                             uint64_t *pos) noexcept nogil:
    """Block index and k bit positions (0..511) of hash h."""
    cdef uint64_t g
    cdef int i
    blk[0] = ((h >> 32) * nblocks) >> 32
    g = dbsp_fmix64(h, _BLOOM_SEED2)
    for i in range(k):
        if i and i % 7 == 0:
            g = dbsp_fmix64(g, <uint64_t>i)
        pos[i] = g & 511
        g >>= 9


def bloom_add(uint64_t[::1] words, int k, const uint64_t[::1] hashes):
    """Set the bits of ``hashes`` in a blocked filter of ``len(words) // 8`` 512-bit blocks."""
    cdef uint64_t nblocks = words.shape[0] // 8, b
    cdef uint64_t pos[32]
    cdef Py_ssize_t i, n = hashes.shape[0]
    cdef int j
    if k < 1 or k > 32:
        raise ValueError(f"k must be in [1, 32], got {k}")
    if nblocks == 0 or nblocks >= (<uint64_t>1 << 32):
        raise ValueError(f"bad filter size: {words.shape[0]} words")
    with nogil:
        for i in range(n):
            _bloom_bits(hashes[i], nblocks, k, &b, pos)
            for j in range(k):
                words[b * 8 + (pos[j] >> 6)] |= (<uint64_t>1) << (pos[j] & 63)


def bloom_query(const uint64_t[::1] words, int k, const uint64_t[::1] hashes):
    """Bool array: may each hash be in the filter (False = certainly not)."""
    cdef uint64_t nblocks = words.shape[0] // 8, b
    cdef uint64_t pos[32]
    cdef Py_ssize_t i, n = hashes.shape[0]
    cdef int j
    cdef cnp.ndarray[uint8_t, cast=True] out = np.empty(n, dtype=np.bool_)
    cdef uint8_t *o = <uint8_t *>out.data
    cdef uint8_t ok
    if k < 1 or k > 32 or nblocks == 0:
        raise ValueError("bad filter parameters")
    with nogil:
        for i in range(n):
            _bloom_bits(hashes[i], nblocks, k, &b, pos)
            ok = 1
            for j in range(k):
                if not (words[b * 8 + (pos[j] >> 6)] >> (pos[j] & 63)) & 1:
                    ok = 0
                    break
            o[i] = ok
    return out


def bloom_query_one(const uint64_t[::1] words, int k, uint64_t h):
    """``bloom_query`` for one hash."""
    cdef uint64_t nblocks = words.shape[0] // 8, b
    cdef uint64_t pos[32]
    cdef int j
    if k < 1 or k > 32 or nblocks == 0:
        raise ValueError("bad filter parameters")
    _bloom_bits(h, nblocks, k, &b, pos)
    for j in range(k):
        if not (words[b * 8 + (pos[j] >> 6)] >> (pos[j] & 63)) & 1:
            return False
    return True


def hash_one_u64(uint64_t code, uint64_t seed):
    return dbsp_fmix64(code, seed)


def hash_one_bytes(const uint8_t[::1] code, uint64_t seed):
    cdef size_t n = code.shape[0]
    return dbsp_hash_bytes(&code[0] if n else NULL, n, seed)


cdef inline int _cmp(const uint8_t *a, size_t na, const uint8_t *b, size_t nb) noexcept nogil:
    cdef int c = memcmp(a, b, na if na < nb else nb) if (na and nb) else 0
    if c:
        return c
    return (na > nb) - (na < nb)


def var_lower_bound(const int64_t[::1] offsets, const uint8_t[::1] data, Py_ssize_t lo,
                    Py_ssize_t hi, const uint8_t[::1] probe):
    """First i in [lo, hi) with ``code[i] >= probe`` (hi if none); codes sorted in [lo, hi)."""
    cdef const uint8_t *d = &data[0] if data.shape[0] else NULL
    cdef const uint8_t *p = &probe[0] if probe.shape[0] else NULL
    cdef size_t np_ = probe.shape[0]
    cdef Py_ssize_t mid
    if lo < 0 or hi > offsets.shape[0] - 1 or lo > hi:
        raise IndexError(f"range [{lo}, {hi}) out of [0, {offsets.shape[0] - 1}]")
    with nogil:
        while lo < hi:
            mid = lo + (hi - lo) // 2
            if _cmp(d + offsets[mid], <size_t>(offsets[mid + 1] - offsets[mid]), p, np_) < 0:
                lo = mid + 1
            else:
                hi = mid
    return lo
