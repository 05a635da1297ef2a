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
``uring``     Cython + liburing (static), ``nogil`` refill loop, ~1-2 MiB in flight, CRC
              checked in C as reads complete. Reads into slab pool slots; optional O_DIRECT.
``liburing``  python-liburing: ``prep_readv`` into one pre-built ``Iovec`` per slab slot,
              batches of 32, completions signalled on a registered eventfd that is waited on
              with ``select`` (so the GIL is *not* held while waiting, unlike the binding's
              own wait calls).
``pread``     ``os.preadv`` into slab slots from a small thread pool (GIL released in the
              syscall); portable fallback when io_uring is disabled (sysctl, seccomp).
============  ==========================================================================

``make_backend("auto")`` picks ``uring`` when the Cython module is built and io_uring works
here (``kernel.io_uring_disabled``, EPERM/ENOSYS from setup), then ``liburing``, then ``pread``.

Every pooled backend keys the pool by ``(file_id, offset // 4096)``, pins what it returns
(:class:`~dbsp._native.slab_pool.BlockRef`), verifies the checksum of every block it reads
before the block becomes visible to anyone, and frees the slot of a block that fails. Blocks
larger than a slot are read into a private aligned buffer (not cached).
"""
from __future__ import annotations

import mmap as _mmap
import os
import queue
import select
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Optional, Sequence

import numpy as np

from . import format as F
from .format import HEADER, HEADER_SIZE, CorruptBlockError

__all__ = ["Backend", "FileHandle", "MmapBackend", "PreadBackend", "LiburingBackend",
           "UringBackend", "make_backend", "available_backends", "default_backend",
           "aligned_empty"]

Extent = tuple  # (offset, length)


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

class _Miss:
    __slots__ = ("i", "offset", "extent", "slot")

    def __init__(self, i, offset, extent, slot):
        self.i, self.offset, self.extent, self.slot = i, offset, extent, slot


class _PooledBackend(Backend):
    """Shared logic of the backends that read into slab pool slots."""

    def __init__(self, pool=None, *, budget: int = 256 << 20, slot_size: int = 65536,
                 policy: str = "s3fifo", direct: bool = False, queue_depth: Optional[int] = None):
        from dbsp._native.slab_pool import SlabPool
        self.pool = pool if pool is not None else SlabPool(budget, slot_size, policy)
        self.slot_size = self.pool.slot_size
        self.direct = direct
        self.queue_depth = queue_depth
        self._prefetch_q: Optional[queue.Queue] = None
        self._prefetch_thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self.big_reads = 0

    def _qd(self, extent: int) -> int:
        if self.queue_depth:
            return self.queue_depth
        return int(min(128, max(16, (2 << 20) // max(extent, 4096))))

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
        size = os.fstat(fd).st_size
        return FileHandle(self, path, fd, size, direct, self.pool.register_file())

    def close(self, fh) -> None:
        self.pool.drop_file(fh.file_id)
        os.close(fh.fd)

    # subclasses: read each miss into its slot; return one result per miss (bytes read, or
    # -errno, or uring.VERIFY_FAILED - reason), verifying in native code when they can
    def _load(self, fh, misses: list) -> tuple[list, bool]:
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
        extents = list(extents)
        n = len(extents)
        out: list = [None] * n
        small = []
        for i, (off, ln) in enumerate(extents):
            if off % 4096 or ln % 4096 or ln <= 0:
                raise ValueError(f"block extent ({off}, {ln}) is not 4 KiB aligned")
            if off + ln > fh.size:
                raise CorruptBlockError(fh.path, off, f"block [{off}, {off + ln}) lies beyond "
                                        f"the end of the file ({fh.size} B)")
            if ln > self.slot_size:
                out[i] = self._read_big(fh, off, ln)
            else:
                small.append(i)
        if small:
            self._read_pooled(fh, extents, small, out)
        return out

    def _read_pooled(self, fh, extents, idx: list, out: list):
        pool = self.pool
        todo = idx
        error = None
        for _attempt in range(8):
            blocks = np.fromiter((extents[i][0] >> 12 for i in todo), dtype=np.uint64,
                                 count=len(todo))
            refs, status, slots = pool.acquire_many(fh.file_id, blocks)
            misses = []
            waits = []
            for k, i in enumerate(todo):
                st = status[k]
                if st == 0:
                    out[i] = refs[k]
                elif st == 1:
                    misses.append(_Miss(i, extents[i][0], extents[i][1], int(slots[k])))
                else:
                    waits.append((i, int(slots[k])))
            if misses:
                err = self._finish_misses(fh, misses, out)
                if err is not None and error is None:
                    error = err
            retry = []
            for i, slot in waits:
                r = pool.wait(fh.file_id, extents[i][0] >> 12, slot)
                if r is None:
                    retry.append(i)
                else:
                    out[i] = r
            if error is not None:
                raise error
            if not retry:
                return
            todo = retry
        raise OSError(f"{fh.path}: could not load blocks {[extents[i] for i in todo]}")

    def _finish_misses(self, fh, misses, out):
        """Read, verify, decompress and publish the misses; returns the first error."""
        pool = self.pool
        try:
            results, verified = self._load(fh, misses)
        except BaseException:
            for m in misses:
                pool.fail(m.slot)
            raise
        error = None
        for m, res in zip(misses, results):
            err = None
            if res < 0:
                if res <= -1000:
                    err = CorruptBlockError(fh.path, m.offset, F.verify_reason(-1000 - res))
                else:
                    err = OSError(-res, f"{fh.path}: read of block at offset {m.offset} "
                                        f"failed: {os.strerror(-res)}")
            elif res < m.extent:
                err = CorruptBlockError(fh.path, m.offset, "short read: file truncated?")
            length = m.extent
            if err is None:
                view = pool.slot_view(m.slot)
                try:
                    if not verified:
                        F.verify_block(view[:m.extent], m.extent, fh.path, m.offset)
                    if view[9] & F.FLAG_LZ4:
                        h, raw = _decompress(view[:m.extent], fh.path, m.offset)
                        if HEADER_SIZE + h.raw > self.slot_size:
                            raise CorruptBlockError(fh.path, m.offset,
                                                    "decompressed block exceeds the slot size")
                        view[HEADER_SIZE:HEADER_SIZE + h.raw] = raw
                        length = HEADER_SIZE + h.raw
                except CorruptBlockError as e:
                    err = e
                finally:
                    view.release()
            if err is None:
                out[m.i] = pool.complete(m.slot, length)
            else:
                pool.fail(m.slot)
                if error is None:
                    error = err
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
        self._slab = memoryview(self.pool)

    def _read_some(self, fd: int, misses: list) -> list:
        from dbsp._native import block as _nb
        slab = self._slab
        ss = self.slot_size
        res = []
        for m in misses:
            base = m.slot * ss
            got = 0
            r = 0
            while got < m.extent:
                try:
                    n = os.preadv(fd, [slab[base + got:base + m.extent]], m.offset + got)
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
                if got == m.extent:
                    code = _nb.verify_block(slab[base:base + m.extent], m.extent)
                    if code:
                        r = -1000 - code
            res.append(r)
        return res

    def _load(self, fh, misses):
        if len(misses) <= 2 or self.threads <= 1:
            return self._read_some(fh.fd, misses), True
        if self._exec is None:
            with self._lock:
                if self._exec is None:
                    self._exec = ThreadPoolExecutor(self.threads, thread_name_prefix="dbsp-pread")
        t = min(self.threads, len(misses))
        parts = [misses[k::t] for k in range(t)]
        futs = [self._exec.submit(self._read_some, fh.fd, p) for p in parts]
        res = [0] * len(misses)
        for k, f in enumerate(futs):
            for j, r in enumerate(f.result()):
                res[k + j * t] = r
        return res, True

    def shutdown(self):
        super().shutdown()
        if self._exec is not None:
            self._exec.shutdown(wait=True)
            self._exec = None


class LiburingBackend(_PooledBackend):
    """python-liburing: ``prep_readv`` into pre-built per-slot ``Iovec``s (module doc)."""

    name = "liburing"

    def __init__(self, pool=None, *, batch: int = 32, **kw):
        super().__init__(pool, **kw)
        import liburing  # noqa: F401  (ImportError tells make_backend it is not there)
        self.batch = batch
        self._tls = threading.local()
        self._iov: dict = {}
        self._iov_lock = threading.Lock()
        self._slab = memoryview(self.pool)

    def _ring(self):
        r = getattr(self._tls, "ring", None)
        if r is None:
            import liburing
            ring = liburing.Ring()
            liburing.io_uring_queue_init(max(2 * self.batch, 8), ring)
            efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            liburing.io_uring_register_eventfd(ring, efd)
            r = self._tls.ring = (ring, efd, liburing.Cqe())
        return r

    def _iovec(self, slot: int):
        # one Iovec per slot, built once: python-liburing's Iovec leaks the buffer export it
        # takes, so building one per read would leak memory
        iov = self._iov.get(slot)
        if iov is None:
            import liburing
            with self._iov_lock:
                iov = self._iov.get(slot)
                if iov is None:
                    ss = self.slot_size
                    iov = self._iov[slot] = liburing.Iovec([self._slab[slot * ss:(slot + 1) * ss]])
        return iov

    def _load(self, fh, misses):
        import liburing
        ring, efd, cqe = self._ring()
        res = [0] * len(misses)
        n = len(misses)
        nxt = 0
        inflight = 0
        done = 0
        while done < n:
            while inflight < self.batch and nxt < n:
                sqe = liburing.io_uring_get_sqe(ring)
                if sqe is None:
                    break
                m = misses[nxt]
                liburing.io_uring_prep_readv(sqe, fh.fd, self._iovec(m.slot), m.offset)
                sqe.user_data = nxt
                nxt += 1
                inflight += 1
            liburing.io_uring_submit(ring)
            # wait on the eventfd with select: releases the GIL, unlike io_uring_wait_cqe
            got_any = False
            while not got_any:
                try:
                    liburing.io_uring_peek_cqe(ring, cqe)
                    got_any = True
                except BlockingIOError:
                    try:
                        select.select([efd], [], [], 1.0)
                    except InterruptedError:
                        pass
                    try:
                        os.eventfd_read(efd)
                    except BlockingIOError:
                        pass
            while True:
                c = cqe[0]
                k = c.user_data
                try:
                    r = c.res
                except OSError as e:
                    r = -(e.errno or 5)
                liburing.io_uring_cqe_seen(ring, c)
                inflight -= 1
                m = misses[k]
                if 0 <= r < m.extent and r > 0:
                    # short read (end of file inside the slot is fine past the extent)
                    r = self._finish_short(fh, m, r)
                res[k] = r
                done += 1
                try:
                    liburing.io_uring_peek_cqe(ring, cqe)
                except BlockingIOError:
                    break
        return res, False

    def _finish_short(self, fh, m, got):
        ss = self.slot_size
        base = m.slot * ss
        while got < m.extent:
            n = os.preadv(fh.fd, [self._slab[base + got:base + m.extent]], m.offset + got)
            if n <= 0:
                return got
            got += n
        return got


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

    def _load(self, fh, misses):
        n = len(misses)
        fds = np.full(n, fh.fd, dtype=np.int32)
        offs = np.fromiter((m.offset for m in misses), dtype=np.int64, count=n)
        lens = np.fromiter((m.extent for m in misses), dtype=np.uint32, count=n)
        slots = np.fromiter((m.slot for m in misses), dtype=np.uint64, count=n)
        addrs = slots * np.uint64(self.slot_size) + np.uint64(self._base)
        results = np.empty(n, dtype=np.int32)
        self._ring().read(fds, offs, lens, addrs, results, self._qd(int(lens.max())), True)
        return results.tolist(), True


# --------------------------------------------------------------------------- choosing

def _uring_problem() -> Optional[str]:
    try:
        from dbsp._native import uring as _u
    except ImportError:
        return "dbsp._native.uring is not built (install liburing-dev: ci/install-system.sh)"
    return _u.probe()


def _liburing_problem() -> Optional[str]:
    try:
        import liburing
    except ImportError:
        return "python-liburing is not installed"
    try:
        with open("/proc/sys/kernel/io_uring_disabled") as f:
            if f.read().strip() == "2":
                return "io_uring disabled by sysctl kernel.io_uring_disabled=2"
    except OSError:
        pass
    try:
        ring = liburing.Ring()
        liburing.io_uring_queue_init(8, ring)
        liburing.io_uring_queue_exit(ring)
    except OSError as e:
        return f"io_uring setup failed: {e}"
    return None


def available_backends() -> dict:
    """name -> None if usable here, else why not."""
    return {"uring": _uring_problem(), "liburing": _liburing_problem(), "pread": None,
            "mmap": None}


def make_backend(kind: str = "auto", pool=None, **kw) -> Backend:
    """A backend by name: ``auto``, ``uring``, ``liburing``, ``pread`` or ``mmap``.

    Keyword arguments go to the backend (``budget``, ``slot_size``, ``policy``, ``direct``,
    ``queue_depth``, ``threads`` ...). ``auto`` takes the first usable of uring, liburing,
    pread."""
    if kind == "mmap":
        return MmapBackend()
    if kind == "auto":
        for k in ("uring", "liburing"):
            if (_uring_problem() if k == "uring" else _liburing_problem()) is None:
                return make_backend(k, pool, **kw)
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
    if kind == "liburing":
        p = _liburing_problem()
        if p:
            raise OSError(f"liburing backend unavailable: {p}")
        kw.pop("threads", None)
        kw.pop("ring_entries", None)
        return LiburingBackend(pool, **kw)
    if kind == "pread":
        kw.pop("batch", None)
        kw.pop("ring_entries", None)
        return PreadBackend(pool, **kw)
    raise ValueError(f"unknown backend {kind!r}; choose auto, uring, liburing, pread or mmap")


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
