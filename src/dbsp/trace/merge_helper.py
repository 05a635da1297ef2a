"""File merges in a helper process, so that a background merge never holds the step's GIL.

Why
---
A streaming merge into a file (:func:`dbsp.trace.merge_stream.merge_stream`) is a loop of native
calls (block reads, the k-way merge, block encoding, checksums) glued by Python: numpy and Arrow
steps and the writer's bookkeeping hold the GIL. On a background merger thread that glue competes
with the step for the one interpreter lock: on the join + average workload with its state on disk
(``bench/workloads/bench_storage.py``) the same file merges ran 1.9x slower beside the step than
alone, and the step waited for the lock. A helper process has an interpreter of its own: the
merger thread hands it the job and waits on a socket with the GIL released, so the merge runs on
another core while the step runs here.

Design
------
One helper per worker storage, forked when the circuit is built (:func:`start_helper`) and
stopped when it closes; storage used outside a circuit merges in its thread. A fork starts at
once and shares the parent's loaded modules (an interpreter started afresh took ~0.2 s of a core
to import dbsp: a third of a 1M-event benchmark run). The helper never touches what the parent's other threads held at the fork: it
builds a :class:`~dbsp.storage.manager.WorkerStorage` of the same config and worker with its own
backend and pool (the storage module resets its per-process caches in a forked child), skips the
temporaries cleanup (the files are the parent's), and runs only the merge code.

A job is ``(name, parts)``: file parts travel as ``(path, k0, k1)`` (the helper opens the file
read-only, never deleting it); in-memory parts as their sizes only, and the helper asks the
parent for their rows one merge round at a time (pieces pickled with protocol 5, buffers out of
band through :mod:`dbsp.storage.wire`; the merger thread serves them), so the helper never holds
a copy of a whole batch: shipping whole parts made its peak RSS grow by 96 MB on the 4x-budget
test. The helper merges them with the same
``merge_stream`` into a new file in the worker's directory (``*.mut``, renamed when complete) and
answers its path; the parent opens that file as its own (deleted when unreferenced, like every
merge output) and counts it. The parent reserves the disk space before sending, so the
disk-space gate stays one per process.

Only merges whose output goes to a file and that have at least ``merge_process_rows`` input rows
go to the helper: below that, shipping the parts and the round trip cost more than the GIL does.

Failure: if the helper dies or answers an error, the merge runs in the merger thread instead (the
state is never at risk: inputs stay in place until an output replaces them) and the helper is not
used again in this process; the error is logged once.

Memory: the helper shares the parent's pages until either writes them. What it adds is its
anonymous private memory (``Private_Dirty``): one merge's rounds (``merge_round_bytes`` times
about three), a 16-block pool, and the inherited pages it writes: its allocations land in the
free slots of inherited heap pages and touched objects get their reference counts written, so
about 40 MB of the parent's heap is copied in its first merge; measured 57-66 MiB at its peak on
the 4x-budget test (23-45 MiB on the 1M-event storage benchmark) (``tests/storage/test_larger_than_memory.py``). The parent freezes its
objects for the fork (``gc.freeze``) so the helper's collector never walks, and copies, the
whole inherited heap. ``merge_process_rows=None`` trades that memory back for the GIL fight.
The budget bounds the parent's batches; the helper's share is part of the fixed overhead reported by
``tests/storage/test_larger_than_memory.py``.
"""
from __future__ import annotations

import atexit
import dataclasses
import gc
import logging
import os
import socket
import sys
import threading
import traceback
from typing import Any, Optional, Sequence

from ..storage import wire
from ..storage.manager import WorkerStorage
from .file_batch import BatchFile
from .merge_stream import merge_stream

log = logging.getLogger("dbsp.storage")

__all__ = ["MergeHelper", "HelperFailed", "helper_for", "helpers_stats", "start_helper",
           "stop_helpers"]


class MergeHelper:
    """The parent's handle on one helper process (thread-safe: one job at a time)."""

    def __init__(self, config: Any, worker: int):
        self.config = config
        self.worker = worker
        self.failed = False
        self.jobs = 0
        self._lock = threading.Lock()
        parent, child = socket.socketpair()
        sys.stdout.flush()
        sys.stderr.flush()
        # the helper's garbage collector must not walk the objects it inherits: a collection
        # writes every tracked object's header, copying on write the parent's whole heap
        # (measured: 70 MB of private pages in the helper without the freeze)
        gc.freeze()
        try:
            pid = os.fork()
        except BaseException:
            gc.unfreeze()
            parent.close()
            child.close()
            raise
        if pid != 0:
            gc.unfreeze()
        else:  # the helper: serve until the parent goes away, never return
            code = 0
            try:
                parent.close()
                # the sockets of helpers forked before this one: a copy held here would keep
                # them from seeing their parent close (the start lock is held by the forking
                # thread, so read the table without it)
                for other in list(_helpers.values()):
                    other.sock.close()
                _helpers.clear()
                _serve(child, config, worker)
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        child.close()
        self.pid = pid
        self.sock = parent

    def _fail(self, e: BaseException) -> None:
        if not self.failed:
            log.warning("merge helper of worker %d failed (%s); merges run in the merger "
                        "thread from now on", self.worker, e)
        self.failed = True

    def merge(self, parts: Sequence, name: str) -> Optional[str]:
        """Merge ``parts`` into a new file; its path (None if everything cancelled). Raises
        :class:`HelperFailed` when the helper cannot do it (the caller merges itself).

        While the helper merges, this thread serves its requests for pieces of the in-memory
        parts (``("piece", part, lo, hi)`` -> the rows ``lo:hi``): the helper holds one round of
        pieces at a time, never a copy of whole batches."""
        descs = [("file", b.path, b.k0, b.k1) if getattr(b, "is_file", False) else
                 ("mem", len(b), b.num_keys, b.nbytes_in_memory, bool(b.indexed)) for b in parts]
        with self._lock:
            if self.failed:
                raise HelperFailed("merge helper not available")
            try:
                wire.send(self.sock, ("merge", name, descs))
                while True:
                    reply = wire.recv(self.sock)
                    if reply[0] != "piece":
                        break
                    _, i, lo, hi = reply
                    b = parts[i]
                    wire.send(self.sock, ("piece", b.row_slice(lo, hi) if b.indexed
                                          else b.slice(lo, hi)))
            except (OSError, wire.WireError) as e:
                self._fail(e)
                raise HelperFailed(str(e)) from None
        if reply[0] == "err":
            self._fail(reply[1])
            raise HelperFailed(str(reply[1]))
        self.jobs += 1
        return reply[1]

    def stats(self) -> dict:
        """``private_peak_bytes``: the helper's peak anonymous private memory (its own
        allocations and copied-on-write pages; sampled every 8 merge rounds and after each job),
        what it adds to the machine's memory beyond the parent's."""
        with self._lock:
            if self.failed:
                return {}
            wire.send(self.sock, ("stats",))
            return wire.recv(self.sock)[1]

    def close(self) -> None:
        """Stop the helper (it exits when its socket closes) and reap it."""
        self.failed = True
        try:  # shutdown reaches the helper even if another process holds a copy of the socket
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


class HelperFailed(RuntimeError):
    """The helper could not run a merge (the caller merges in its own thread)."""


_helpers: dict = {}
_helpers_lock = threading.Lock()


def start_helper(config: Any, worker: int) -> Optional[MergeHelper]:
    """Start (once per process, directory and worker) the merge helper of a worker; None when
    the config turns helpers off or it cannot start. A circuit calls this when it is built."""
    if config is None or config.merge_process_rows is None:
        return None
    key = (os.getpid(), config.dir, worker)
    with _helpers_lock:
        h = _helpers.get(key)
        if h is None:
            try:
                h = _helpers[key] = MergeHelper(config, worker)
            except OSError as e:  # fork refused (process limits, memory)
                log.warning("cannot start a merge helper (%s); merges run in the merger thread", e)
                return None
    return h


def helper_for(storage: Any) -> Optional[MergeHelper]:
    """The running helper of ``storage``'s worker in this process; None when none was started
    (the circuit starts them when it is built: a merge still finishing after its circuit closed
    must not start one again), after it failed, or when the config turns helpers off."""
    with _helpers_lock:
        h = _helpers.get((os.getpid(), storage.config.dir, storage.worker))
    return h if h is not None and not h.failed else None


def helpers_stats() -> list[dict]:
    """Statistics of this process's helpers (see :meth:`MergeHelper.stats`), with their jobs."""
    with _helpers_lock:
        hs = [h for (pid, _, _), h in _helpers.items() if pid == os.getpid()]
    return [dict(h.stats(), jobs=h.jobs, worker=h.worker) for h in hs if not h.failed]


def stop_helpers(config: Any = None) -> None:
    """Stop this process's helpers of ``config``'s directory (a circuit closing), or all of
    them (``None``: at exit)."""
    with _helpers_lock:
        keys = [k for k in _helpers if k[0] == os.getpid() and
                (config is None or k[1] == config.dir)]
        hs = [_helpers.pop(k) for k in keys]
    for h in hs:
        h.close()


atexit.register(stop_helpers)


# --- the helper's side ------------------------------------------------------------------------------

class _RemoteBatch:
    """An in-memory part of a job, read from the parent a piece at a time (the helper's side of
    :meth:`MergeHelper.merge`)."""

    is_file = False

    def __init__(self, sock: socket.socket, i: int, n: int, keys: int, nbytes: int,
                 indexed: bool):
        self.sock, self.i, self.n = sock, i, n
        self.num_keys, self.nbytes_in_memory, self.indexed = keys, nbytes, indexed

    def __len__(self) -> int:
        return self.n

    def iter_pieces(self, rows: int):
        rows = max(int(rows), 1)
        for lo in range(0, self.n, rows):
            wire.send(self.sock, ("piece", self.i, lo, min(lo + rows, self.n)))
            yield wire.recv(self.sock)[1]


def _open_part(i: int, desc, storage, sock):
    if desc[0] == "mem":
        return _RemoteBatch(sock, i, *desc[1:])
    _, path, k0, k1 = desc
    return BatchFile(path, storage.backend, delete=False).batch()._view(k0, k1)


def _private_dirty() -> int:
    """Bytes of anonymous memory this process wrote (its own allocations and the pages it
    copied on write): what a forked helper adds to the machine's memory. Its RSS would also
    count the parent's pages it merely maps (libraries, modules, data it reads)."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) * 1024
    return 0


class _Memory:
    """The helper's peak private memory, sampled every few merge rounds and after each job
    (reading ``smaps_rollup`` costs ~1 ms)."""

    EVERY = 8

    def __init__(self):
        self.peak = _private_dirty()
        self.rounds = 0

    def sample(self) -> None:
        self.peak = max(self.peak, _private_dirty())

    def on_round(self) -> None:
        self.rounds += 1
        if self.rounds % self.EVERY == 0:
            self.sample()


def _serve(sock: socket.socket, config: Any, worker: int) -> None:
    # a merge reads its inputs in order: 16 blocks of pool are plenty (not the parent's cache)
    storage = WorkerStorage(dataclasses.replace(config, cache_bytes=0), worker, helper=True)
    mem = _Memory()
    while True:
        try:
            msg = wire.recv(sock)
        except (wire.WireError, OSError):
            return  # the parent is gone
        if msg[0] == "stats":
            mem.sample()
            try:
                wire.send(sock, ("ok", {"private_peak_bytes": mem.peak, "pid": os.getpid()}))
            except (OSError, wire.WireError):
                return
            continue
        try:
            _, name, descs = msg
            parts = [_open_part(i, d, storage, sock) for i, d in enumerate(descs)]
            del msg, descs
            path = merge_stream(parts, storage, name=name, to_file=True, reserve=False,
                                open_output=False, on_round=mem.on_round)
            del parts
            mem.sample()
            wire.send(sock, ("ok", path))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            try:
                wire.send(sock, ("err", wire.portable_exception(e)))
            except (OSError, wire.WireError):
                return  # the parent is gone (exited mid-merge): nothing to report to
