"""The io_uring refill loop (``src/_native/uring.pyx``) against ``os.pread`` + ``verify_block``.

Every queue depth, completion batch (``wait_batch``) and submission group (``submit_batch``;
the refill of each completion is queued before that block is verified) must read the same bytes as plain
``pread`` of the same extents (the reference twin), flag exactly the blocks whose checksum fails,
and the default backend must name the file and block of a corrupt block in a large cold batch."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbsp._native import block as nb
from dbsp.storage.backend import aligned_empty, available_backends, make_backend
from dbsp.storage.format import CorruptBlockError
from dbsp.storage.reader import LayerFile
from dbsp.storage.writer import LayerFileWriter, LayerSpec

if available_backends()["uring"]:
    pytest.skip(f"uring unavailable: {available_backends()['uring']}", allow_module_level=True)

from dbsp._native import uring  # noqa: E402

BLOCK = 4096
ROWS = 200_000


@pytest.fixture(scope="module")
def layer(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("uring") / "f.layer")
    with LayerFileWriter(p, LayerSpec("u64", None, True), block_size=BLOCK, bloom_fpr=None,
                         durable=False) as w:
        c = np.arange(ROWS, dtype=np.uint64)
        w.append(c * np.uint64(7), weights=c.view(np.int64))
    with LayerFile(p, make_backend("mmap")) as f:
        ext = [(b[2], b[3]) for s in f.streams for b in f._data_blocks(s, 0, s.rows)]
    return p, np.array([e for e in ext if e[1] == BLOCK], dtype=np.int64)


def _reference(path, offs, lens):
    """(bytes, verify code) of each extent by os.pread: the twin of Ring.read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        out = []
        for o, n in zip(offs.tolist(), lens.tolist()):
            b = os.pread(fd, n, o)
            out.append((b, nb.verify_block(b, n) if len(b) == n else 1))
        return out
    finally:
        os.close(fd)


def _ring_read(path, offs, lens, qd, wait_batch, direct, submit_batch=0):
    n = len(offs)
    buf = aligned_empty(max(n, 1) * BLOCK)
    addrs = (np.arange(n, dtype=np.uint64) * np.uint64(BLOCK)) + np.uint64(buf.ctypes.data)
    results = np.empty(n, dtype=np.int32)
    flags = os.O_RDONLY | (os.O_DIRECT if direct and hasattr(os, "O_DIRECT") else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        fd = os.open(path, os.O_RDONLY)      # a file system without O_DIRECT
    try:
        r = uring.Ring(64)
        failed = r.read(np.full(n, fd, dtype=np.int32), offs, lens.astype(np.uint32), addrs,
                        results, qd, True, wait_batch, submit_batch)
        r.close()
    finally:
        os.close(fd)
    return failed, results, buf


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data(), qd=st.integers(1, 80), wait_batch=st.integers(0, 70),
       submit_batch=st.integers(0, 20), direct=st.booleans())
def test_ring_reads_what_pread_reads(layer, tmp_path, data, qd, wait_batch, submit_batch,
                                     direct):
    path, ext = layer
    pick = data.draw(st.lists(st.integers(0, len(ext) - 1), min_size=0, max_size=300))
    corrupt = data.draw(st.sets(st.sampled_from(pick), max_size=3) if pick else st.just(set()))
    p = path
    if corrupt:
        p = str(tmp_path / f"c{qd}-{wait_batch}.layer")
        shutil.copyfile(path, p)
        with open(p, "r+b") as fh:
            for k in corrupt:
                fh.seek(int(ext[k, 0]) + 100)
                b = fh.read(1)
                fh.seek(int(ext[k, 0]) + 100)
                fh.write(bytes([b[0] ^ 0x10]))
    offs = np.ascontiguousarray(ext[pick, 0]) if pick else np.empty(0, np.int64)
    lens = np.ascontiguousarray(ext[pick, 1]) if pick else np.empty(0, np.int64)
    failed, results, buf = _ring_read(p, offs, lens, qd, wait_batch, direct, submit_batch)
    ref = _reference(p, offs, lens)
    assert failed == sum(1 for _, v in ref if v)
    for i, (b, v) in enumerate(ref):
        if v:
            assert results[i] == uring.VERIFY_FAILED - v, (i, results[i], v)
        else:
            assert results[i] == lens[i]
            assert bytes(buf[i * BLOCK:i * BLOCK + lens[i]]) == b
    if p != path:
        os.unlink(p)


def test_corrupt_block_in_a_large_cold_batch_names_file_and_block(layer, tmp_path):
    """A bad block among 1,000 read at once by the default backend (direct where the file
    system takes it, as the benchmark reads) raises a CorruptBlockError naming the file and the
    block's offset; the other blocks of the batch stay good and the bad one is not cached."""
    path, ext = layer
    p = str(tmp_path / "bad.layer")
    shutil.copyfile(path, p)
    rng = np.random.default_rng(3)
    pick = ext[rng.choice(len(ext), min(1000, len(ext)), replace=False)]
    bad = int(pick[500, 0])
    with open(p, "r+b") as fh:
        fh.seek(bad + 2000)
        fh.write(b"\xff\xfe")
    be = make_backend("auto", budget=8 << 20, slot_size=BLOCK)
    fh = be.open(p)
    try:
        extents = [tuple(map(int, e)) for e in pick]
        with pytest.raises(CorruptBlockError) as ei:
            fh.read(extents)
        assert ei.value.path == p and ei.value.offset == bad
        assert f"{p}: corrupt block at offset {bad}: " in str(ei.value)
        assert "checksum" in ei.value.reason
        assert be.pool.stats()["pinned"] == 0       # the failed batch pins nothing
        good = [e for e in extents if e[0] != bad]
        bufs = fh.read(good)
        ref = _reference(p, np.array([e[0] for e in good]), np.array([e[1] for e in good]))
        assert all(bytes(memoryview(b)) == r for b, (r, _) in zip(bufs, ref))
        del bufs
        with pytest.raises(CorruptBlockError):
            fh.read([(bad, BLOCK)])
        assert be.pool.stats()["pinned"] == 0
    finally:
        fh.close()
        be.shutdown()
