"""Native block kernels: CRC-32C against the crc32c package, Bloom filter, var seek.

Mirrors ``src/_native/block.pyx`` (and the CRC in ``src/_native/storage_types.pxd``)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbsp._native import block

crc32c = pytest.importorskip("crc32c")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=30000), st.integers(0, 2**32 - 1))
def test_crc32c_matches_the_package(data, start):
    assert block.crc32c(data) == crc32c.crc32c(data)
    assert block.crc32c(data, start) == crc32c.crc32c(data, start)


@pytest.mark.parametrize("n", [0, 1, 7, 767, 768, 24575, 24576, 24577, 65536 - 8, 1 << 20])
def test_crc32c_block_sizes_and_misalignment(n):
    b = np.random.default_rng(n).integers(0, 256, n + 3, dtype=np.uint8).tobytes()
    for off in range(3):
        assert block.crc32c(b[off:off + n]) == crc32c.crc32c(b[off:off + n])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=500, unique=True), st.integers(1, 16))
def test_bloom_has_no_false_negatives(keys, k):
    words = np.zeros(8 * max(1, len(keys) // 20 + 1), dtype=np.uint64)
    h = block.hash_u64(np.array(keys, dtype=np.uint64), 12345)
    block.bloom_add(words, k, h)
    assert block.bloom_query(words, k, h).all()
    assert all(block.bloom_query_one(words, k, int(x)) for x in h)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=12), max_size=60), st.binary(max_size=12), st.data())
def test_var_lower_bound(rows, probe, data):
    rows = sorted(rows)
    lens = np.array([len(r) for r in rows], dtype=np.int64)
    offs = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    d = np.frombuffer(b"".join(rows), dtype=np.uint8)
    lo = data.draw(st.integers(0, len(rows)))
    hi = data.draw(st.integers(lo, len(rows)))
    exp = lo + sum(1 for r in rows[lo:hi] if r < probe)
    assert block.var_lower_bound(offs, d, lo, hi, probe) == exp


def test_hash_var_matches_single():
    rows = [b"", b"a", b"abcdefgh", b"abcdefghi" * 3]
    offs = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
    d = np.frombuffer(b"".join(rows), dtype=np.uint8)
    h = block.hash_var(offs, d, 7)
    assert [block.hash_one_bytes(r, 7) for r in rows] == list(h)
    assert len(set(h.tolist())) == 4


# -- extents_array: the (offset, length) pairs every pooled backend's read_blocks takes -------

pairs = st.tuples(st.integers(-2**63, 2**63 - 1), st.integers(-2**63, 2**63 - 1))


@settings(max_examples=200, deadline=None)
@given(st.lists(pairs, max_size=50), st.sampled_from(["tuples", "lists", "array", "mixed"]))
def test_extents_array_matches_numpy(ext, shape):
    """The C conversion of a list of int pairs equals numpy's (the reference twin) on every
    container readers pass: tuples (the C path), lists, arrays and a mix."""
    ref = np.asarray(ext, dtype=np.int64).reshape(-1, 2)
    if shape == "lists":
        ext = [list(e) for e in ext]
    elif shape == "array":
        ext = np.asarray(ext, dtype=np.int64).reshape(-1, 2)
    elif shape == "mixed":
        ext = [list(e) if i % 2 else e for i, e in enumerate(ext)]
    got = block.extents_array(ext)
    assert got.dtype == np.int64 and got.shape == ref.shape and got.flags.c_contiguous
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("bad,err,msg", [
    ([(0, 4096), (4096, 4096, 1)], ValueError, r"extent 1 \(\(4096, 4096, 1\)\) is not an"),
    ([(0, 4096), (0, "x")], ValueError, r"extent 1 \(\(0, 'x'\)\) is not an \(offset, length\)"),
    ([(2**63, 4096)], OverflowError, r"extent 0 \(\(9223372036854775808, 4096\)\) does not fit"),
    ([None], TypeError, r"extent 0 \(None\)"),
    (np.zeros((3, 3), dtype=np.int64), ValueError, r"shape \(3, 3\)"),
])
def test_extents_array_names_the_bad_extent(bad, err, msg):
    with pytest.raises(err, match=msg):
        block.extents_array(bad)


# -- check_extents: the checks of read_blocks in one C pass -----------------------------------

def check_extents_ref(ext: np.ndarray, size: int, slot: int):
    """The numpy twin: what read_blocks computed before the C pass."""
    offs, lens = ext[:, 0], ext[:, 1]
    bad = ((offs % 4096) != 0) | ((lens % 4096) != 0) | (lens <= 0) | (offs < 0)
    past = ~bad & (offs.astype(object) + lens.astype(object) > size)
    first = np.flatnonzero(bad | past)
    if len(first):
        k = int(first[0])
        return (1 if bad[k] else 2), k, int(np.count_nonzero(lens[:k] > slot))
    return 0, -1, int(np.count_nonzero(lens > slot))


offsets = st.one_of(st.integers(-3, 40).map(lambda b: b * 4096), st.integers(-2**63, 2**63 - 1))
lengths = st.one_of(st.integers(-1, 20).map(lambda b: b * 4096), st.integers(-2**63, 2**63 - 1))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(offsets, lengths), max_size=40),
       st.one_of(st.integers(0, 64).map(lambda b: b * 4096), st.integers(0, 2**40)),
       st.sampled_from([4096, 65536]))
def test_check_extents_matches_numpy(ext, size, slot):
    a = np.asarray(ext, dtype=np.int64).reshape(-1, 2)
    assert block.check_extents(a, size, slot) == check_extents_ref(a, size, slot)
