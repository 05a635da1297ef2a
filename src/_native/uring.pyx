# cython: language_level=3
"""io_uring block reader running without the GIL (liburing, linked statically).

This is the fast path of :mod:`dbsp.storage.backend` for reading layer-file blocks into slab
pool slots. One :class:`Ring` per thread; :meth:`Ring.read` takes a batch of reads (fd, file
offset, length, destination address) and runs a refill loop entirely ``nogil``: it keeps ``qd``
reads in flight, resubmits short or interrupted reads, and as each read completes it checks the
block header and CRC-32C (so a corrupt block is flagged while other reads are still in flight,
and never reaches a caller as data).

Why here and not python-liburing: that binding holds the GIL while it waits for the kernel
(every cold read stalls all Python threads) and costs about 0.6 µs of Python per read; this
loop costs neither (see ``shared/research/io-limits.md`` §3-4). No SQPOLL (it halves IOPS on a
2-vCPU machine); ``SINGLE_ISSUER | DEFER_TASKRUN`` (else ``COOP_TASKRUN``) when the kernel
accepts them, so completions are run when this thread waits rather than by interrupting it.
The loop keeps the queue full the way fio does: it wakes for the first completion, and
queues each completion's refill *before* checking that block's CRC, handing refills to the kernel
a few at a time (``submit_batch``, 4) rather than all at once. On this virtio disk the host served
bursts slower: fio itself read 78K against 88K 4 KiB blocks/s when it submitted 16 at a time, and
43K against 60K when it also waited for 16 completions, the pattern this loop had (a quarter of
QD64 per wake, refills submitted together after the batch's CRCs): the reads then spent 0.61
against 0.54 ms in the device queue at the same depth (``/proc/diskstats``). In
``bench_block_io.py`` (5 sessions of each, alternating) the old loop read 0.87x of fio at 4 KiB
(rounds 0.71-1.01, one in five below 0.8x) and this one 0.92x (0.62-1.15, one in 25 below);
submitting one at a time read no faster than 4 and cost 1.5 us more system CPU a read.

Result codes (``results[i]``): the number of bytes read (== length) on success, ``-errno`` on an
I/O error, ``-1000 - reason`` when the block fails verification (reason as in
``dbsp._native.block.verify_block``: 1 short, 2 magic, 3 extent, 4 checksum).
"""
cimport cython
from libc.errno cimport EINTR, EAGAIN, EIO
from libc.stdint cimport uint8_t, int32_t, uint32_t, int64_t, uint64_t
from libc.stdlib cimport malloc, free

from _native.storage_types cimport dbsp_crc32c

import os

__all__ = ["Ring", "probe", "VERIFY_FAILED"]

VERIFY_FAILED = -1000

cdef extern from "liburing.h" nogil:
    struct io_uring:
        pass
    struct io_uring_sqe:
        pass
    struct io_uring_cqe:
        unsigned long long user_data
        int res
        unsigned flags
    int io_uring_queue_init(unsigned entries, io_uring *ring, unsigned flags)
    void io_uring_queue_exit(io_uring *ring)
    io_uring_sqe *io_uring_get_sqe(io_uring *ring)
    void io_uring_prep_read(io_uring_sqe *sqe, int fd, void *buf, unsigned nbytes,
                            unsigned long long offset)
    void io_uring_sqe_set_data64(io_uring_sqe *sqe, unsigned long long data)
    int io_uring_submit(io_uring *ring)
    int io_uring_submit_and_wait(io_uring *ring, unsigned wait_nr)
    unsigned io_uring_peek_batch_cqe(io_uring *ring, io_uring_cqe **cqes, unsigned count)
    void io_uring_cq_advance(io_uring *ring, unsigned nr)
    unsigned IORING_SETUP_SINGLE_ISSUER
    unsigned IORING_SETUP_COOP_TASKRUN
    unsigned IORING_SETUP_DEFER_TASKRUN

cdef enum:
    MAX_CQES = 256
    C_VERIFY_FAILED = -1000


cdef inline int _verify(const uint8_t *p, uint32_t extent) noexcept nogil:
    cdef uint32_t stored
    if extent < 64:
        return 1
    if not (p[0] == 68 and p[1] == 66 and p[2] == 83 and p[3] == 66):   # b"DBSB"
        return 2
    if (<const uint32_t *>(p + 12))[0] != extent:
        return 3
    stored = (<const uint32_t *>(p + 4))[0]
    if dbsp_crc32c(0, p + 8, extent - 8) != stored:
        return 4
    return 0


@cython.final
cdef class Ring:
    """One io_uring instance (use one per thread; not thread-safe).

    ``entries``: submission queue size (also the largest useful ``qd``)."""
    cdef io_uring ring
    cdef readonly unsigned entries
    cdef readonly unsigned setup_flags
    cdef bint ok
    cdef int owner_tid

    def __cinit__(self, unsigned entries=128, bint single_issuer=True):
        cdef int ret
        cdef unsigned flags = 0
        self.ok = False
        if single_issuer:
            # DEFER_TASKRUN (6.1+): completions are run when this thread waits, not by
            # interrupting it; else COOP_TASKRUN (5.19+); else nothing (EINVAL from older kernels)
            flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN
            ret = io_uring_queue_init(entries, &self.ring, flags)
            if ret == -22:
                flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN
                ret = io_uring_queue_init(entries, &self.ring, flags)
            if ret == -22:
                flags = 0
                ret = io_uring_queue_init(entries, &self.ring, flags)
        else:
            ret = io_uring_queue_init(entries, &self.ring, flags)
        if ret < 0:
            raise OSError(-ret, f"io_uring_queue_init({entries}): {os.strerror(-ret)}")
        self.entries = entries
        self.setup_flags = flags
        self.ok = True

    def __dealloc__(self):
        if self.ok:
            io_uring_queue_exit(&self.ring)
            self.ok = False

    def close(self):
        if self.ok:
            io_uring_queue_exit(&self.ring)
            self.ok = False

    cdef inline int _push(self, const int32_t[::1] fds, const int64_t[::1] offsets,
                          const uint32_t[::1] lengths, const uint64_t[::1] addrs,
                          const int64_t *done_b, uint64_t k, int *queued,
                          int submit_batch) noexcept nogil:
        """Queue the (rest of the) read of block ``k``, handing the queue to the kernel once
        ``submit_batch`` reads wait in it; 0 when the submission queue is full."""
        cdef io_uring_sqe *sqe = io_uring_get_sqe(&self.ring)
        if sqe == NULL:
            return 0
        io_uring_prep_read(sqe, fds[k], <void *>(<size_t>addrs[k] + <size_t>done_b[k]),
                           lengths[k] - <uint32_t>done_b[k],
                           <unsigned long long>(offsets[k] + done_b[k]))
        io_uring_sqe_set_data64(sqe, k)
        queued[0] += 1
        if queued[0] >= submit_batch:
            io_uring_submit(&self.ring)
            queued[0] = 0
        return 1

    def read(self, const int32_t[::1] fds, const int64_t[::1] offsets,
             const uint32_t[::1] lengths, const uint64_t[::1] addrs, int32_t[::1] results,
             int qd=32, bint verify=True, int wait_batch=0, int submit_batch=4):
        """Read ``lengths[i]`` bytes at ``offsets[i]`` of ``fds[i]`` into ``addrs[i]``.

        Keeps ``qd`` reads in flight; fills ``results`` (see the module doc) and returns the
        number of reads that did not succeed. The GIL is released for the whole batch.

        ``wait_batch``: how many completions to wait for before refilling (capped by what is in
        flight); 0 means 1.
        ``submit_batch``: how many refills to queue before handing them to the kernel (below 1:
        1); each completion's refill is queued before its block is verified (module doc)."""
        cdef Py_ssize_t n = offsets.shape[0]
        cdef Py_ssize_t i
        cdef int64_t *done_b
        cdef int64_t *retry
        cdef int64_t nretry = 0, nxt = 0, inflight = 0, finished = 0, failed = 0
        cdef int queued = 0
        cdef io_uring_cqe *cqes[MAX_CQES]
        cdef unsigned got, c
        cdef int ret, res, v
        cdef unsigned want
        cdef uint64_t k
        cdef int64_t rem
        if not self.ok:
            raise ValueError("ring is closed")
        if fds.shape[0] != n or lengths.shape[0] != n or addrs.shape[0] != n or results.shape[0] != n:
            raise ValueError("fds, offsets, lengths, addrs and results differ in length")
        if n == 0:
            return 0
        if qd < 1:
            qd = 1
        if <unsigned>qd > self.entries:
            qd = self.entries
        if wait_batch < 1:
            wait_batch = 1
        if submit_batch < 1:
            submit_batch = 1
        done_b = <int64_t *>malloc(n * sizeof(int64_t))
        retry = <int64_t *>malloc(n * sizeof(int64_t))
        if done_b == NULL or retry == NULL:
            free(done_b)
            free(retry)
            raise MemoryError()
        ret = 0
        with nogil:
            for i in range(n):
                done_b[i] = 0
                results[i] = 0
            while finished < n:
                # fill: retries first, then new reads
                while inflight < qd and (nretry > 0 or nxt < n):
                    if nretry > 0:
                        k = <uint64_t>retry[nretry - 1]
                    else:
                        k = <uint64_t>nxt
                    if not self._push(fds, offsets, lengths, addrs, done_b, k, &queued,
                                      submit_batch):
                        break
                    if nretry > 0:
                        nretry -= 1
                    else:
                        nxt += 1
                    inflight += 1
                want = <unsigned>(inflight if inflight < wait_batch else wait_batch)
                ret = io_uring_submit_and_wait(&self.ring, want if want > 0 else 1)
                queued = 0
                if ret < 0 and ret != -EINTR and ret != -EAGAIN:
                    break
                got = io_uring_peek_batch_cqe(&self.ring, cqes, MAX_CQES)
                for c in range(got):
                    k = cqes[c].user_data
                    res = cqes[c].res
                    inflight -= 1
                    if res == -EINTR or res == -EAGAIN:
                        retry[nretry] = <int64_t>k
                        nretry += 1
                        continue
                    if res < 0:
                        results[k] = res
                        failed += 1
                        finished += 1
                        continue
                    done_b[k] += res
                    rem = <int64_t>lengths[k] - done_b[k]
                    if rem > 0:
                        if res == 0:              # end of file before the block's end
                            results[k] = -EIO
                            failed += 1
                            finished += 1
                        else:                     # short read: read the rest
                            retry[nretry] = <int64_t>k
                            nretry += 1
                        continue
                    # refill before verifying: the device gets the next read while this
                    # block's CRC runs, a few reads at a time as fio does (module doc)
                    if (nretry == 0 and nxt < n and inflight < qd and
                            self._push(fds, offsets, lengths, addrs, done_b, <uint64_t>nxt,
                                       &queued, submit_batch)):
                        nxt += 1
                        inflight += 1
                    results[k] = <int32_t>lengths[k]
                    if verify:
                        v = _verify(<const uint8_t *>(<size_t>addrs[k]), lengths[k])
                        if v:
                            results[k] = C_VERIFY_FAILED - v
                            failed += 1
                    finished += 1
                io_uring_cq_advance(&self.ring, got)
        free(done_b)
        free(retry)
        if finished < n:
            raise OSError(-ret, f"io_uring_submit_and_wait: {os.strerror(-ret)}")
        return failed


def probe():
    """None if io_uring works here, else the reason (sysctl, seccomp, old kernel)."""
    try:
        with open("/proc/sys/kernel/io_uring_disabled") as f:
            if f.read().strip() == "2":
                return "io_uring disabled by sysctl kernel.io_uring_disabled=2"
    except OSError:
        pass
    try:
        r = Ring(8)
        r.close()
    except OSError as e:
        return f"io_uring setup failed: {e}"
    return None
