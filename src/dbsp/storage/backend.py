"""Storage backends: how layer-file blocks get from disk into memory.

One small interface (:class:`Backend`): ``open`` a file, ``read_blocks(fh, [(offset, length)])``
returning one buffer per block (verified, decompressed, ready for ``np.frombuffer``),
``prefetch`` (start reading blocks a cursor will need next), ``write`` and ``sync``.

============  ==========================================================================
``mmap``      The file is mapped; blocks are zero-copy views of the page cache. Fastest
              when data is hot. Cold blocks are never left to page faults (64 KiB faulted
              4 KiB at a time runs at 0.06 GB/s here): every read and prefetch first issues
              ``madvise(MADV_WILLNEED)`` for all its blocks (asynchronous readahead, ~0.9 GB/s)
              and the mapping is ``MADV_RANDOM``. No pool: the OS page cache is the cache.
``uring``     Cython + liburing (static), ``nogil`` refill loop, ~8 MiB in flight (at most
              128 reads; 64 of 4 KiB), each completion's refill queued before its CRC is
              checked (in C) and handed to the kernel 4 at a time. Reads into slab pool slots.
``pread``     ``os.preadv`` into slab slots from a small thread pool (GIL released in the
              syscall); portable fallback when io_uring is disabled (sysctl, seccomp).
============  ==========================================================================

``make_backend("auto")`` picks ``uring`` when the Cython module is built and io_uring works
here (``kernel.io_uring_disabled``, EPERM/ENOSYS from setup), else ``pread``.

There is one io_uring backend: the Cython one. A second one over python-liburing was removed:
its wheel (a Zig build) dies with SIGILL at ring set-up on CPUs without the instructions it was
built for (an AMD EPYC here), taking the process down with it, and where it ran it was no
faster than the Cython path (0.58 against 0.51-0.61 of in-memory speed on the storage workload,
within noise) while holding the GIL for every submission.

The pooled backends read with ``O_DIRECT`` by default (``direct=True``): the slab pool is
the block cache, so the page cache would only hold every block a second time, and cold random
reads ran faster direct (``bench/micro/bench_block_io.py``, fio in the same session: 64 KiB
0.69-1.9x of fio direct against 0.42-0.56x buffered; 4 KiB 0.55-1.5x against 0.40-0.54x).
Measured again with the reader's per-block work cut (extents converted in C, no GC tracking of
block refs, completions reaped a quarter-queue at a time): buffered cold reads cost 5.0 against
3.0 us of CPU a 4 KiB block and 36 against 11 us a 64 KiB block (page-cache insertion and
eviction in the kernel), and read 0.68x of fio at 64 KiB against 1.27x direct (medians of 6-8
alternating rounds beside fio, load 6-15 on 2 cores); at 4 KiB the two
were within the noise of that load (0.92x against 0.81x, ranges 0.47-1.72 and 0.62-1.82). So
direct stays the default at every block size: it never lost by more than the noise, costs less
CPU, and keeps blocks out of a second cache.
Where the file system refuses ``O_DIRECT`` (tmpfs) the file is read buffered, with the kernel's
readahead turned off (``POSIX_FADV_RANDOM``): reads are exact block extents, and readahead made
each cold 64 KiB read fetch 256 KiB. ``direct=False`` asks for buffered reads.

Every pooled backend keys the pool by ``(file_id, offset // 4096)``, pins what it returns
(:class:`~dbsp._native.slab_pool.BlockRef`), verifies the checksum of every block it reads
before the block becomes visible to anyone, and frees the slot of a block that fails. Blocks
larger than a slot are read into a private aligned buffer (not cached).
"""
from __future__ import annotations

import mmap as _mmap
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence

import numpy as np

from . import format as F
from .format import HEADER_SIZE, CorruptBlockError
from .osthreads import name_os_thread
from .._native import block as _nb
from .._native.slab_pool import SlabPool

__all__ = ["Backend", "FileHandle", "MmapBackend", "PreadBackend",
           "UringBackend", "make_backend", "available_backends", "default_backend",
           "aligned_empty"]

Extent = tuple  # (offset, length)
_ALL = np.empty(0, dtype=np.int64)     # an empty index: every row


def aligned_empty(n: int, align: int = 4096) -> np.ndarray:
    """A uint8 array of n bytes whose data is ``align``-aligned (O_DIRECT, fast copies)."""
    raw = np.empty(n + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + n]


def _decompress(buf, path: str, offset: int):
    """(header, decompressed bytes) of an lz4 block whose checksum was verified."""
    import lz4.block
    h = F.BlockHeader.parse(buf)
    try:
        raw = lz4.block.decompress(bytes(memoryview(buf)[HEADER_SIZE:HEADER_SIZE + h.stored]),
                                   uncompressed_size=h.raw)
    except Exception as e:  # lz4.block.LZ4BlockError
        raise CorruptBlockError(path, offset, f"lz4 payload does not decompress: {e}") from None
    if len(raw) != h.raw:
        raise CorruptBlockError(path, offset, "lz4 payload has the wrong size")
    return h, raw


def _no_readahead(fd: int) -> None:
    """Turn off the kernel's readahead for a buffered descriptor that reads whole blocks.

    Without it a cold random read of one block makes the kernel read 4x the request (its
    initial readahead window: 64 KiB -> 256 KiB, 4 KiB -> 16 KiB), so buffered random block
    reads ran at 0.45x (64 KiB) and 0.75x (4 KiB) of fio's O_DIRECT figure. Our reads are
    exact extents (a cursor's next blocks are asked for by ``prefetch``), so readahead only
    wastes the device's bandwidth and page cache."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    except (AttributeError, OSError):
        pass     # advisory


def _is_lz4(buf) -> bool:
    return bool(memoryview(buf)[9] & F.FLAG_LZ4)


class FileHandle:
    """An open layer file as a backend sees it."""

    def __init__(self, backend: "Backend", path: str, fd: int, size: int, direct: bool,
                 file_id: int = 0):
        self.backend, self.path, self.fd, self.size = backend, path, fd, size
        self.direct, self.file_id = direct, file_id
        self.closed = False

    def read(self, extents: Sequence[Extent]) -> list:
        return self.backend.read_blocks(self, extents)

    def prefetch(self, extents: Sequence[Extent]) -> None:
        self.backend.prefetch(self, extents)

    def close(self) -> None:
        if not self.closed:
            self.backend.close(self)
            self.closed = True

    def __repr__(self):
        return f"<FileHandle {self.path} via {self.backend.name}>"


class Backend:
    """Interface every backend implements (see the module doc)."""

    name = "base"
    pool = None

    def open(self, path) -> FileHandle:
        raise NotImplementedError

    def close(self, fh: FileHandle) -> None:
        os.close(fh.fd)

    def read_blocks(self, fh: FileHandle, extents: Sequence[Extent]) -> list:
        raise NotImplementedError

    def prefetch(self, fh: FileHandle, extents: Sequence[Extent]) -> None:
        pass

    # writes are plain POSIX for every backend: files are written once, sequentially
    def open_write(self, path) -> int:
        return os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                       0o644)

    def write(self, fd: int, offset: int, data) -> None:
        mv = memoryview(data).cast("B")
        while len(mv):
            n = os.pwrite(fd, mv, offset)
            mv = mv[n:]
            offset += n

    def sync(self, fd: int) -> None:
        os.fsync(fd)

    def stats(self) -> dict:
        return {"backend": self.name}

    def shutdown(self) -> None:
        pass


# --------------------------------------------------------------------------- mmap

class _MmapHandle(FileHandle):
    def __init__(self, backend, path, fd, size):
        super().__init__(backend, path, fd, size, False)
        self.mm = _mmap.mmap(fd, size, prot=_mmap.PROT_READ) if size else None
        if self.mm is not None:
            try:
                self.mm.madvise(_mmap.MADV_RANDOM)
            except (AttributeError, OSError):
                pass
        self.mv = memoryview(self.mm) if self.mm is not None else memoryview(b"")
        self.verified = bytearray((size + 4095) // 4096)


class MmapBackend(Backend):
    """Zero-copy views of a read-only mapping (see the module doc)."""

    name = "mmap"

    def __init__(self):
        self.bytes_verified = 0

    def open(self, path) -> FileHandle:
        path = os.fspath(path)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        size = os.fstat(fd).st_size
        return _MmapHandle(self, path, fd, size)

    def close(self, fh) -> None:
        try:
            fh.mv.release()
            if fh.mm is not None:
                fh.mm.close()
        except BufferError:
            pass   # views of it are alive: the mapping goes when they do
        os.close(fh.fd)

    def _willneed(self, fh, extents):
        mm = fh.mm
        for off, ln in extents:
            if not fh.verified[off >> 12] and off + ln <= fh.size:
                try:
                    mm.madvise(_mmap.MADV_WILLNEED, off, ln)
                except (OSError, ValueError):
                    pass

    def read_blocks(self, fh, extents):
        extents = list(extents)
        self._willneed(fh, extents)
        out = []
        for off, ln in extents:
            if off < 0 or off + ln > fh.size:
                raise CorruptBlockError(fh.path, off, f"block [{off}, {off + ln}) lies beyond "
                                        f"the end of the file ({fh.size} B)")
            mv = fh.mv[off:off + ln]
            if not fh.verified[off >> 12]:
                F.verify_block(mv, ln, fh.path, off)
                fh.verified[off >> 12] = 1
                self.bytes_verified += ln
            if _is_lz4(mv):
                h, raw = _decompress(mv, fh.path, off)
                buf = aligned_empty(HEADER_SIZE + h.raw)
                buf[:HEADER_SIZE] = np.frombuffer(mv[:HEADER_SIZE], dtype=np.uint8)
                buf[HEADER_SIZE:] = np.frombuffer(raw, dtype=np.uint8)
                out.append(buf)
            else:
                out.append(mv)
        return out

    def prefetch(self, fh, extents):
        self._willneed(fh, extents)


# --------------------------------------------------------------------------- pooled backends

class _PooledBackend(Backend):
    """Shared logic of the backends that read into slab pool slots."""

    def __init__(self, pool=None, *, budget: int = 256 << 20, slot_size: int = 65536,
                 policy: str = "s3fifo", direct: bool = True, queue_depth: Optional[int] = None,
                 populate: bool = False):
        self.pool = pool if pool is not None else SlabPool(budget, slot_size, policy,
                                                           populate=populate)
        self.slot_size = self.pool.slot_size
        self.direct = direct
        self.queue_depth = queue_depth
        self._prefetch_q: Optional[queue.Queue] = None
        self._prefetch_thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._slab = memoryview(self.pool)      # the whole slab, writable (for loaders)
        self._slab_np = np.frombuffer(self.pool, dtype=np.uint8)
        self.big_reads = 0

    def _qd(self, extent: int) -> int:
        if self.queue_depth:
            return self.queue_depth
        # ~8 MiB in flight: 128 reads of 64 KiB, 128 of 4 KiB. A batch's reads drain at its end
        # (the refill loop stops refilling), so a queue deeper than fio's best (QD32 at 64 KiB)
        # keeps the device busier. On a device of 1.4-1.8 GB/s, 64 KiB direct reads at QD64 gave
        # 0.66-0.74x fio and at QD128 0.80-0.89x (bench_block_io.py, alternating runs)
        # 4 KiB reads: 64 in flight. At 128 the small reads queue below the device (virtio-blk,
        # one hardware queue): fio itself read 44-54K 4 KiB blocks/s at QD128 against 52-107K
        # at QD64 in one sweep, and this reader (batches of 1,024) 0.83x against 1.02x of fio
        # QD128 (medians of 8 alternating rounds, in-process, CPU pressure ~95%)
        if extent <= 4096:
            return 64
        return int(min(128, max(16, (8 << 20) // max(extent, 4096))))

    def open(self, path) -> FileHandle:
        path = os.fspath(path)
        direct = False
        fd = -1
        if self.direct and hasattr(os, "O_DIRECT"):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
                direct = True
            except OSError:
                fd = -1      # e.g. tmpfs: no O_DIRECT; fall back to buffered reads
        if fd < 0:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            _no_readahead(fd)
        size = os.fstat(fd).st_size
        return FileHandle(self, path, fd, size, direct, self.pool.register_file())

    def close(self, fh) -> None:
        self.pool.drop_file(fh.file_id)
        os.close(fh.fd)

    # subclasses: read block k (file offset offs[k], lens[k] bytes) into slot slots[k]; return
    # (results, verified): bytes read, -errno, or uring.VERIFY_FAILED - reason per block, and
    # whether the checksums were already checked (natively)
    def _load(self, fh, offs, lens, slots) -> tuple:
        raise NotImplementedError

    def _read_big(self, fh, off: int, ln: int):
        buf = aligned_empty(ln)
        got = 0
        while got < ln:
            n = os.preadv(fh.fd, [memoryview(buf)[got:]], off + got)
            if n <= 0:
                raise CorruptBlockError(fh.path, off, f"block [{off}, {off + ln}) lies beyond "
                                        f"the end of the file ({fh.size} B)")
            got += n
        F.verify_block(buf, ln, fh.path, off)
        self.big_reads += 1
        if _is_lz4(buf):
            h, raw = _decompress(buf, fh.path, off)
            out = aligned_empty(HEADER_SIZE + h.raw)
            out[:HEADER_SIZE] = buf[:HEADER_SIZE]
            out[HEADER_SIZE:] = np.frombuffer(raw, dtype=np.uint8)
            return out
        return buf

    def read_blocks(self, fh, extents):
        # per batch, a handful of native calls (extents converted and checked in C, hits and
        # published misses written into ``out`` by the pool): ~40 small numpy calls per batch
        # cost ~0.3 us a 4 KiB block, time in which no read was in flight
        ext = _nb.extents_array(extents)
        n = len(ext)
        out: list = [None] * n
        if n == 0:
            return out
        problem, k, nbig = _nb.check_extents(ext, fh.size, self.slot_size)
        if problem:
            off, ln = int(ext[k, 0]), int(ext[k, 1])
            if problem == 1:
                raise ValueError(f"block extent ({off}, {ln}) is not 4 KiB aligned (or its "
                                 f"length is not positive, or its offset is negative)")
            raise CorruptBlockError(fh.path, off, f"block [{off}, {off + ln}) lies beyond the "
                                    f"end of the file ({fh.size} B)")
        if nbig:
            big = ext[:, 1] > self.slot_size
            for k in np.flatnonzero(big).tolist():
                out[k] = self._read_big(fh, int(ext[k, 0]), int(ext[k, 1]))
            small = np.flatnonzero(~big)
            if len(small):
                self._read_pooled(fh, np.ascontiguousarray(ext[small]), small, out)
        else:
            self._read_pooled(fh, ext, None, out)
        return out

    def _read_pooled(self, fh, ext, idx, out: list):
        """Read the blocks ``ext`` (an ``(m, 2)`` int64 array) through the pool into
        ``out[idx[k]]`` (``idx`` None: ``out[k]``)."""
        pool = self.pool
        error = None
        for _attempt in range(8):
            loc = out if idx is None else [None] * len(ext)
            status, slots, nres = pool.acquire_extents(fh.file_id, ext, loc)
            if nres:
                miss = _ALL if nres == len(ext) else np.flatnonzero(status == 1)
                err = self._finish_misses(fh, ext, slots, miss, loc)
                if err is not None and error is None:
                    error = err
            retry = []
            if error is None:
                # blocks another thread is loading: wait for them (GIL released)
                for k in np.flatnonzero(status == 2).tolist():
                    r = pool.wait(fh.file_id, int(ext[k, 0]) >> 12, int(slots[k]))
                    if r is None:
                        retry.append(k)
                    else:
                        loc[k] = r
            if idx is not None:
                for k, i in enumerate(idx.tolist()):
                    if loc[k] is not None:
                        out[i] = loc[k]
            if error is not None:
                # unpin the good blocks of the failed batch now: the traceback keeps this frame
                # (and ``out``, shared with read_blocks) alive for as long as the error lives
                out[:] = [None] * len(out)
                loc = None
                raise error
            if not retry:
                return
            r = np.array(retry, dtype=np.int64)
            idx = r if idx is None else idx[r]
            ext = np.ascontiguousarray(ext[r])
        raise OSError(f"{fh.path}: could not load blocks at offsets {ext[:, 0].tolist()}")

    def _finish_misses(self, fh, ext, slots, miss, out):
        """Read, verify, decompress and publish the reserved slots ``slots[miss]`` (``miss``
        empty: all of them) for ``ext[miss]`` into ``out[miss]``; returns the first error."""
        pool = self.pool
        if len(miss):
            m_slots, m_offs, m_lens = slots[miss], ext[miss, 0], ext[miss, 1]
        else:
            m_slots, m_offs, m_lens = slots, np.ascontiguousarray(ext[:, 0]), ext[:, 1]
        try:
            results, verified = self._load(fh, m_offs, m_lens, m_slots)
        except BaseException:
            for s_ in m_slots.tolist():
                pool.fail(s_)
            raise
        results = np.ascontiguousarray(results, dtype=np.int32)
        if verified:
            # publishes every whole, unflagged block into out; left: failures and lz4 blocks
            slow = pool.complete_reads(m_slots, ext, results, miss, out, 9, F.FLAG_LZ4)
        else:
            slow = np.arange(len(results))
        error = None
        ss = self.slot_size
        for k in slow.tolist():
            off, ext_, slot, res = int(m_offs[k]), int(m_lens[k]), int(m_slots[k]), int(results[k])
            i = int(miss[k]) if len(miss) else k
            err = None
            length = ext_
            if res < 0:
                if res <= -1000:
                    err = CorruptBlockError(fh.path, off, F.verify_reason(-1000 - res))
                else:
                    err = OSError(-res, f"{fh.path}: read of block at offset {off} failed: "
                                        f"{os.strerror(-res)}")
            elif res < ext_:
                err = CorruptBlockError(fh.path, off, "short read: file truncated?")
            else:
                view = self._slab[slot * ss:(slot + 1) * ss]
                try:
                    if not verified:
                        F.verify_block(view[:ext_], ext_, fh.path, off)
                    if view[9] & F.FLAG_LZ4:
                        h, raw = _decompress(view[:ext_], fh.path, off)
                        if HEADER_SIZE + h.raw > ss:
                            raise CorruptBlockError(fh.path, off,
                                                    "decompressed block exceeds the slot size")
                        view[HEADER_SIZE:HEADER_SIZE + h.raw] = raw
                        length = HEADER_SIZE + h.raw
                except CorruptBlockError as e:
                    err = e
                finally:
                    view.release()
            if err is not None:
                pool.fail(slot)
                if error is None:
                    error = err
            else:
                out[i] = pool.complete(slot, length)
        return error

    # -- prefetch: a background thread loads blocks into the pool ----------------------------

    def prefetch(self, fh, extents):
        extents = [e for e in extents if e[1] <= self.slot_size]
        if not extents:
            return
        with self._lock:
            if self._prefetch_thread is None:
                self._prefetch_q = queue.Queue(maxsize=64)
                self._prefetch_thread = threading.Thread(
                    target=self._prefetch_loop, name=f"dbsp-prefetch-{self.name}", daemon=True)
                self._prefetch_thread.start()
        # skip what is already resident; the loader thread re-checks
        try:
            self._prefetch_q.put_nowait((fh, extents))
        except queue.Full:
            pass     # prefetch is advisory

    def _prefetch_loop(self):
        name_os_thread()
        q = self._prefetch_q
        while True:
            item = q.get()
            if item is None:
                return
            fh, extents = item
            if fh.closed:
                continue
            try:
                step = max(1, min(len(extents), self.pool.nslots // 4))
                for a in range(0, len(extents), step):
                    refs = self.read_blocks(fh, extents[a:a + step])
                    del refs
            except Exception:
                pass     # a reader that needs the block will see (and raise) the error

    def shutdown(self):
        with self._lock:
            if self._prefetch_thread is not None:
                self._prefetch_q.put(None)
                self._prefetch_thread.join(timeout=5)
                self._prefetch_thread = None

    def stats(self) -> dict:
        d = dict(self.pool.stats())
        d["backend"] = self.name
        d["direct"] = self.direct
        d["big_reads"] = self.big_reads
        return d


class PreadBackend(_PooledBackend):
    """``os.preadv`` into slab slots from a thread pool (see the module doc)."""

    name = "pread"

    def __init__(self, pool=None, *, threads: int = 16, **kw):
        super().__init__(pool, **kw)
        self.threads = threads
        self._exec: Optional[ThreadPoolExecutor] = None

    def _read_some(self, fd: int, jobs: list) -> list:
        slab = self._slab
        ss = self.slot_size
        res = []
        for off, ext, slot in jobs:
            base = slot * ss
            got = 0
            r = 0
            while got < ext:
                try:
                    n = os.preadv(fd, [slab[base + got:base + ext]], off + got)
                except InterruptedError:
                    continue
                except OSError as e:
                    r = -(e.errno or 5)
                    break
                if n == 0:
                    break
                got += n
            if r == 0:
                r = got
                if got == ext:
                    code = _nb.verify_block(slab[base:base + ext], ext)
                    if code:
                        r = -1000 - code
            res.append(r)
        return res

    def _load(self, fh, offs, lens, slots):
        jobs = list(zip(offs.tolist(), lens.tolist(), slots.tolist()))
        if len(jobs) <= 2 or self.threads <= 1:
            return self._read_some(fh.fd, jobs), True
        if self._exec is None:
            with self._lock:
                if self._exec is None:
                    self._exec = ThreadPoolExecutor(self.threads, thread_name_prefix="dbsp-pread")
        t = min(self.threads, len(jobs))
        futs = [self._exec.submit(self._read_some, fh.fd, jobs[k::t]) for k in range(t)]
        res = [0] * len(jobs)
        for k, f in enumerate(futs):
            res[k::t] = f.result()
        return res, True

    def shutdown(self):
        super().shutdown()
        if self._exec is not None:
            self._exec.shutdown(wait=True)
            self._exec = None


class UringBackend(_PooledBackend):
    """Cython + liburing, ``nogil`` refill loop with CRC checks in C (module doc)."""

    name = "uring"

    def __init__(self, pool=None, *, ring_entries: int = 256, **kw):
        super().__init__(pool, **kw)
        from dbsp._native import uring as _u
        self._u = _u
        self.ring_entries = ring_entries
        self._tls = threading.local()
        self._base = int(self.pool.address(0))

    def _ring(self):
        r = getattr(self._tls, "ring", None)
        if r is None:
            r = self._tls.ring = self._u.Ring(self.ring_entries)
        return r

    def _load(self, fh, offs, lens, slots):
        n = len(offs)
        fds = np.full(n, fh.fd, dtype=np.int32)
        addrs = slots.astype(np.uint64) * np.uint64(self.slot_size) + np.uint64(self._base)
        results = np.empty(n, dtype=np.int32)
        self._ring().read(fds, np.ascontiguousarray(offs, dtype=np.int64),
                          lens.astype(np.uint32), addrs, results, self._qd(int(lens.max())), True)
        return results, True


# --------------------------------------------------------------------------- choosing

def _uring_problem() -> Optional[str]:
    try:
        from dbsp._native import uring as _u
    except ImportError:
        return "dbsp._native.uring is not built (install liburing-dev: ci/install-system.sh)"
    return _u.probe()


def available_backends() -> dict:
    """name -> None if usable here, else why not."""
    return {"uring": _uring_problem(), "pread": None, "mmap": None}


def make_backend(kind: str = "auto", pool=None, **kw) -> Backend:
    """A backend by name: ``auto``, ``uring``, ``pread`` or ``mmap``.

    Keyword arguments go to the backend (``budget``, ``slot_size``, ``policy``, ``direct``,
    ``queue_depth``, ``threads`` ...). ``auto`` takes ``uring`` where it works here, else
    ``pread``."""
    if kind == "mmap":
        return MmapBackend()
    if kind == "auto":
        if _uring_problem() is None:
            return make_backend("uring", pool, **kw)
        kw.pop("batch", None)
        kw.pop("ring_entries", None)
        return PreadBackend(pool, **kw)
    if kind == "uring":
        p = _uring_problem()
        if p:
            raise OSError(f"uring backend unavailable: {p}")
        kw.pop("threads", None)
        kw.pop("batch", None)
        return UringBackend(pool, **kw)
    if kind == "pread":
        kw.pop("batch", None)
        kw.pop("ring_entries", None)
        return PreadBackend(pool, **kw)
    raise ValueError(f"unknown backend {kind!r}; choose auto, uring, pread or mmap")


_DEFAULT: Optional[Backend] = None
_DEFAULT_LOCK = threading.Lock()


def default_backend() -> Backend:
    """The process-wide backend readers use when given none: ``DBSP_STORAGE_BACKEND``
    (default ``auto``) with a ``DBSP_STORAGE_CACHE_MIB`` (default 256) MiB slab pool."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            kind = os.environ.get("DBSP_STORAGE_BACKEND", "auto")
            mib = int(os.environ.get("DBSP_STORAGE_CACHE_MIB", "256"))
            _DEFAULT = make_backend(kind, budget=mib << 20) if kind != "mmap" else MmapBackend()
        return _DEFAULT
