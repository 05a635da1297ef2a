"""Backend selection and behaviour (``src/dbsp/storage/backend.py``)."""
from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest
from storage_helpers import backend_or_skip, in_threads

from dbsp.storage.backend import available_backends, make_backend
from dbsp.storage.reader import LayerFile
from dbsp.storage.writer import LayerFileWriter, LayerSpec


def test_auto_picks_the_best_available():
    av = available_backends()
    be = make_backend("auto", budget=1 << 20)
    expected = next(k for k in ("uring", "pread") if av[k] is None)
    assert be.name == expected
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend("floppy")


@pytest.fixture
def file_u64(tmp_path):
    p = str(tmp_path / "f.layer")
    n = 300_000
    with LayerFileWriter(p, LayerSpec("u64", None, True), durable=False) as w:
        w.append(np.arange(n, dtype=np.uint64), weights=np.arange(n, dtype=np.int64))
    return p, n


@pytest.mark.parametrize("kind", ["pread", "uring"])
def test_direct_io_and_duplicate_extents(kind, file_u64):
    p, n = file_u64
    be = backend_or_skip(kind, direct=True, slot_size=65536, budget=4 << 20)
    with LayerFile(p, be) as f:
        assert np.array_equal(f.codes(0, n), np.arange(n, dtype=np.uint64))
        ext = [(0, 65536), (65536, 65536), (0, 65536)]
        bufs = f._fh.read(ext)
        assert bytes(memoryview(bufs[0])) == bytes(memoryview(bufs[2]))
        del bufs
        assert be.pool.stats()["pinned"] == 0
    be.shutdown()


def _takes_o_direct(path) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("kind", ["pread", "uring"])
def test_direct_by_default_buffered_where_refused(kind, file_u64, tmp_path):
    """The pooled backends open with O_DIRECT unless told otherwise; a file system that refuses
    it (tmpfs) is read buffered, and both read the same blocks."""
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    p, n = file_u64
    be = backend_or_skip(kind, slot_size=65536, budget=4 << 20)
    assert be.direct
    copies = [p]
    if os.path.isdir("/dev/shm"):
        shm = tempfile.NamedTemporaryFile(dir="/dev/shm", suffix=".layer", delete=False)
        shm.close()
        shutil.copyfile(p, shm.name)
        copies.append(shm.name)
    try:
        for path in copies:
            with LayerFile(path, be) as f:
                assert f._fh.direct == _takes_o_direct(path), path
                assert np.array_equal(f.codes(0, n), np.arange(n, dtype=np.uint64))
                assert np.array_equal(f.weights(n - 5000, n), np.arange(n - 5000, n))
    finally:
        for path in copies[1:]:
            os.unlink(path)
        be.shutdown()
    buffered = backend_or_skip(kind, direct=False, slot_size=65536, budget=4 << 20)
    with LayerFile(p, buffered) as f:
        assert not f._fh.direct
        assert np.array_equal(f.codes(0, n), np.arange(n, dtype=np.uint64))
    buffered.shutdown()


def test_storage_config_chooses_direct_io(tmp_path):
    from dbsp.storage.config import StorageConfig
    from dbsp.storage.manager import backend_for
    assert StorageConfig(str(tmp_path)).direct
    assert not StorageConfig(str(tmp_path), direct_io=False).direct
    be = backend_for(StorageConfig(str(tmp_path), backend="pread", cache_bytes=2 << 20))
    assert be.direct
    be2 = backend_for(StorageConfig(str(tmp_path), backend="pread", cache_bytes=2 << 20,
                                    direct_io=False))
    assert be2 is not be and not be2.direct


@pytest.mark.parametrize("kind", ["pread", "uring", "mmap"])
def test_threads_read_concurrently(kind, file_u64):
    p, n = file_u64
    be = backend_or_skip(kind, slot_size=65536, budget=1 << 20)   # 16 slots: lots of eviction
    f = LayerFile(p, be)

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(60):
            i = int(rng.integers(0, n - 1000))
            assert np.array_equal(f.weights(i, i + 1000), np.arange(i, i + 1000))
            assert f.lower_bound(i) == i
    errors = in_threads(work)
    f.close()
    be.shutdown()
    assert not errors, errors[0]


def test_small_pool_reads_large_ranges_and_names_itself_when_pinned(file_u64):
    from dbsp._native.slab_pool import PoolExhaustedError
    p, n = file_u64
    be = backend_or_skip("pread", slot_size=65536, budget=2 * 65536)
    with LayerFile(p, be) as f:
        # a range far larger than the pool is read group by group (copied)
        assert np.array_equal(f.codes(0, n), np.arange(n, dtype=np.uint64))
        assert be.pool.stats()["pinned"] == 0
        # zero-copy views pin their blocks: with both slots pinned, the next read fails
        j = f.boundary(0)
        v1 = f.codes(0, j)
        v2 = f.codes(j, f.boundary(j))
        with pytest.raises(PoolExhaustedError, match="2 slots"):
            f.codes(n - 10, n)
        del v1, v2
        assert np.array_equal(f.codes(n - 10, n), np.arange(n - 10, n, dtype=np.uint64))
