"""The storage runtime of a circuit: per-worker directories, the block cache, the memory
accountant and the disk-space gate that storage-aware spines use.

Goals
-----
* State larger than memory: spines keep small batches in memory and put large ones in layer files
  (:mod:`dbsp.trace.file_batch`), so a circuit's memory stays near its budget whatever the size
  of its state.
* One budget for the whole process: a :class:`MemoryAccountant` sums the in-memory batches of
  every spine that shares a :class:`~dbsp.storage.config.StorageConfig` in this process; when the
  sum passes the budget it *spills* batches to files, the largest first, instead of letting
  memory grow.
* A full disk stalls, never fails: a merge that writes a file first reserves the space it may
  need (the size of its inputs) and waits, with backoff and a log line, until the file system
  has it.

Design
------
:class:`WorkerStorage` is what ``WorkerContext.storage`` holds (one per worker; with the processes
runtime each worker process builds its own after the fork). It owns ``<dir>/worker-<i>/``
(temporaries ``*.mut`` left by a crash are removed when it is opened), names new files uniquely
(``b-<uuid>.dbsp``: immutable once written, so a checkpoint can list them), and shares with the
other workers of the process one backend (:func:`dbsp.storage.backend.make_backend` with a
``config.cache`` slab pool) and one accountant.

Spines find their storage through the ``storage=`` argument or, when built inside
:meth:`use_storage` (``Replica`` wraps operator construction in it), the worker's storage: every
operator's state becomes storage-aware without each operator passing it along.

The accountant tracks bytes, not rows: each spine reports the ``nbytes_in_memory`` of its
in-memory batches whenever its set of batches changes, and file batches report their resident
filter and index bytes. ``relieve`` (called after inserts and merges) spills loose in-memory
batches of at least ``min_spill_bytes`` over all spines, the coldest per byte first (``hits``:
keys that probes found in the batch, summed into merge outputs) and among equally cold ones the
largest, until usage is back under 80% of the budget; a thread that finds another spilling waits
for it. So a trace that every step probes (a join's small side) stays in memory while a large
trace that probes rarely reach goes to disk.

*Allocators.* Freed memory that the allocators keep counts in the RSS as much as live state:
glibc raises its mmap threshold dynamically (so large freed arrays stay in the heap), keeps an
arena per thread, and Arrow's mimalloc pool caches freed segments; on the larger-than-memory
workload that was 60-100 MiB above a 32 MiB budget. With ``limit_allocators`` (the default) the
first :class:`WorkerStorage` of a process sets glibc's mmap threshold to 256 KiB (fixed: large
arrays are mapped and unmapped), its trim threshold to 1 MiB, at most 2 arenas, and makes the
system allocator Arrow's default pool: peak RSS then tracks live memory, at a cost of about 20% in
step time (figures in ``tests/storage/test_larger_than_memory.py`` and
``bench/workloads/bench_storage.py``). This is the *bounded* policy of
:mod:`dbsp.runtime.memory`, which takes precedence over its throughput policy in that process.

Invariants
----------
* Spilling never changes a spine's state: the file holds exactly the batch it replaces, swapped
  in under the spine lock only if the batch is still there (otherwise the file is dropped).
* ``reserved`` disk bytes are released when the reserving merge ends, whatever its outcome.
"""
from __future__ import annotations

import contextlib
import glob
import logging
import os
import threading
import time
import uuid
import weakref
from typing import Any, Iterator, Optional

from . import config as _config
from .config import StorageConfig, as_storage_config

__all__ = ["WorkerStorage", "MemoryAccountant", "current_storage", "use_storage",
           "accountant_for", "backend_for"]

log = logging.getLogger("dbsp.storage")

_MAX_BACKOFF = 2.0
_NOT_DONE = object()
_LOW_WATER = 0.8

_tls = threading.local()


def current_storage() -> Optional["WorkerStorage"]:
    """The storage of the operators being built in this thread (see :func:`use_storage`)."""
    return getattr(_tls, "storage", None)


@contextlib.contextmanager
def use_storage(storage: Optional["WorkerStorage"]) -> Iterator[None]:
    """Spines created inside this block (in this thread) default to ``storage``."""
    prev = getattr(_tls, "storage", None)
    _tls.storage = storage
    try:
        yield
    finally:
        _tls.storage = prev


# --- process-wide registries (rebuilt after a fork) -----------------------------------------------

_lock = threading.Lock()
_accountants: dict = {}
_backends: dict = {}
_pid = os.getpid()


def _check_fork() -> None:
    global _pid, _lock
    if os.getpid() != _pid:  # a forked child: the parent's threads and rings are not ours
        _pid = os.getpid()
        _lock = threading.Lock()
        _accountants.clear()
        _backends.clear()


def accountant_for(config: StorageConfig) -> "MemoryAccountant":
    """The accountant of every spine of this process that uses ``config``."""
    _check_fork()
    with _lock:
        a = _accountants.get(config)
        if a is None:
            a = _accountants[config] = MemoryAccountant(config.batch_budget, config)
        return a


def backend_for(config: StorageConfig):
    """The backend (and slab pool) that every file batch of this process using ``config``
    reads through."""
    _check_fork()
    with _lock:
        key = (config.backend, config.cache, config.block_size)
        be = _backends.get(key)
        if be is None:
            from .backend import make_backend
            if config.backend == "mmap":
                be = make_backend("mmap")
            else:
                be = make_backend(config.backend, budget=config.cache,
                                  slot_size=config.block_size)
            _backends[key] = be
        return be


# --- the memory accountant ------------------------------------------------------------------------

class MemoryAccountant:
    """Sums in-memory state over the spines of a process and spills when it passes the budget
    (see the module doc)."""

    def __init__(self, budget: int, config: Optional[StorageConfig] = None):
        self.budget = int(budget)
        self.config = config
        self.min_spill_bytes = config.spill_floor if config is not None else 0
        self._lock = threading.Lock()
        self._spill_lock = threading.Lock()
        self._spines: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._cells: dict[int, list] = {}
        self.batch_bytes = 0     # in-memory batches of registered spines
        self.merging_bytes = 0   # ... of which inputs of running merges
        self.peak_loose_bytes = 0
        self._spilling = threading.local()
        self.resident_bytes = 0  # filters and indexes of open batch files
        self.peak_bytes = 0
        self.spills = 0
        self.spilled_bytes = 0
        self.spill_seconds = 0.0

    def __repr__(self) -> str:
        return (f"MemoryAccountant(used={self.used}, budget={self.budget}, spills={self.spills}, "
                f"spines={len(self._spines)})")

    @property
    def used(self) -> int:
        return self.batch_bytes + self.resident_bytes

    def register(self, spine: Any) -> None:
        """Count ``spine``'s in-memory batches from now on (and forget them when it goes)."""
        cell = [0, 0]
        with self._lock:
            self._spines.add(spine)
            self._cells[id(spine)] = cell
        weakref.finalize(spine, self._forget, id(spine), cell)

    def _forget(self, key: int, cell: list) -> None:
        with self._lock:
            self.batch_bytes -= cell[0]
            self.merging_bytes -= cell[1]
            cell[0] = cell[1] = 0
            self._cells.pop(key, None)

    def recount(self, spine: Any) -> None:
        """Update the bytes of ``spine``'s in-memory batches: all of its snapshot, and apart
        the inputs of its running merges (which no spill can free; the merge frees them)."""
        with self._lock:
            cell = self._cells.get(id(spine))
            if cell is None:
                return
            total = loose = 0
            for b in spine.batches():
                if not getattr(b, "is_file", False):
                    total += b.nbytes_in_memory
            for b in spine.loose_batches():
                if not getattr(b, "is_file", False):
                    loose += b.nbytes_in_memory
            merging = max(total - loose, 0)
            self.batch_bytes += total - cell[0]
            self.merging_bytes += merging - cell[1]
            cell[0], cell[1] = total, merging
            u = self.batch_bytes + self.resident_bytes
            if u > self.peak_bytes:
                self.peak_bytes = u
            if self.batch_bytes - self.merging_bytes > self.peak_loose_bytes:
                self.peak_loose_bytes = self.batch_bytes - self.merging_bytes

    def add(self, batch_delta: int = 0, resident_delta: int = 0) -> None:
        with self._lock:
            self.batch_bytes += batch_delta
            self.resident_bytes += resident_delta
            u = self.batch_bytes + self.resident_bytes
            if u > self.peak_bytes:
                self.peak_bytes = u

    def over(self) -> bool:
        return self.used > self.budget

    def relieve(self) -> int:
        """Spill loose in-memory batches, largest first over all spines, until usage is under
        80% of the budget or nothing is left to spill. A thread that finds another spilling waits
        for it, then checks again: memory does not grow while spills are under way. Returns the
        bytes this call spilled."""
        if not self.over() or getattr(self._spilling, "on", False):
            return 0  # under budget, or re-entered from a spill's own change notification
        freed = 0
        with self._spill_lock:
            t0 = time.perf_counter()
            self._spilling.on = True
            try:
                target = int(self.budget * _LOW_WATER)
                for _ in range(1000):  # a failed spill (merged meanwhile) just lists again
                    if self.used <= target:
                        break
                    cands = []
                    for sp in list(self._spines):
                        owing = _owing_levels(sp)
                        for b in sp.loose_batches():
                            if getattr(b, "is_file", False):
                                continue
                            nb = b.nbytes_in_memory
                            if nb >= self.min_spill_bytes and nb > 0:
                                heat = getattr(b, "hits", 0) / nb
                                soon = sp.level_of(len(b)) in owing
                                cands.append((heat > 0, soon, heat, -nb, id(b), b, sp))
                    if not cands:
                        break
                    # batches no probe ever read first, and of those the ones a merge will take
                    # soon last (the merge frees them, often into a file); then the coldest per
                    # byte, then the largest. A probed batch spilled costs block reads in every
                    # later step that probes it; a cold one owed a merge costs one write (measured
                    # on the storage workload: with "soon" first, the join's auction trace, probed
                    # by every step's bids, went to disk whenever a merge of the bid trace ran)
                    cands.sort(key=lambda c: c[:5])
                    for _, _, _, nb, _, b, sp in cands:
                        nb = -nb
                        if self.used <= target:
                            break
                        if spill(sp, b):
                            freed += nb
                            self.spills += 1
                            self.spilled_bytes += nb
            finally:
                self._spilling.on = False
                self.spill_seconds += time.perf_counter() - t0
        return freed

    def room_for(self, heat: float) -> int:
        """Bytes a new in-memory batch of ``heat`` (hits per byte) may take: what is free
        plus what :meth:`relieve` would spill before it (colder loose batches)."""
        room = self.budget - self.used
        for sp in list(self._spines):
            for b in sp.loose_batches():
                if getattr(b, "is_file", False):
                    continue
                nb = b.nbytes_in_memory
                if nb >= self.min_spill_bytes and getattr(b, "hits", 0) / max(nb, 1) < heat:
                    room += nb
        return room

    def stats(self) -> dict:
        return {"budget": self.budget, "used": self.used, "batch_bytes": self.batch_bytes,
                "merging_bytes": self.merging_bytes, "peak_loose_bytes": self.peak_loose_bytes,
                "resident_bytes": self.resident_bytes, "peak_bytes": self.peak_bytes,
                "spills": self.spills, "spilled_bytes": self.spilled_bytes,
                "spill_seconds": self.spill_seconds, "spines": len(self._spines)}


def _owing_levels(spine: Any) -> set:
    """Levels of ``spine`` whose loose batches wait for a merge."""
    return {lvl for lvl, sizes in spine.level_sizes().items() if len(sizes) >= spine.fanout}


def spill(spine: Any, batch: Any) -> bool:
    """Write the loose in-memory ``batch`` of ``spine`` to a file and swap the file batch in.
    False if the spine merged it meanwhile (the new file is then dropped)."""
    from ..trace.file_batch import write_batch
    st = spine.storage
    with st.reserve_disk(batch.nbytes_in_memory, f"spill of {spine.name}"):
        fb = write_batch(st, batch, spine.name)
    if fb is None:
        return False
    fb.hits = getattr(batch, "hits", 0)
    return spine.replace_batch(batch, fb)


# --- disk space -------------------------------------------------------------------------------------

_disk_lock = threading.Lock()
_reserved = 0


def reserved_bytes() -> int:
    """Disk bytes reserved by merges running now (in this process)."""
    return _reserved


# --- per-worker storage -----------------------------------------------------------------------------

class WorkerStorage:
    """One worker's view of the storage: its directory, file names, the shared backend and
    accountant, and the disk-space gate (see the module doc)."""

    def __init__(self, config: Any, worker: int = 0, helper: bool = False):
        config = as_storage_config(config)
        if config is None:
            raise ValueError("WorkerStorage needs a StorageConfig or a directory")
        self.config: StorageConfig = config
        self.worker = worker
        self.dir = os.path.join(config.dir, f"worker-{worker}")
        os.makedirs(self.dir, exist_ok=True)
        self.removed_temporaries = 0
        # (a merge helper process shares the parent's directory: its temporaries are live)
        for p in ([] if helper else glob.glob(os.path.join(self.dir, "*.mut"))):
            try:
                os.unlink(p)
                self.removed_temporaries += 1
            except FileNotFoundError:
                pass
        self.accountant = accountant_for(config)
        if config.limit_allocators:
            from ..runtime.memory import limit_allocator_retention
            limit_allocator_retention()
        self.disk_waits = 0
        self.disk_wait_seconds = 0.0
        self.files_written = 0
        self.bytes_written = 0
        self._prepare()

    def _prepare(self) -> None:
        """Pay the one-time costs of writing and reading files now, at circuit start, not in
        the first merge of a running step: importing the file modules, the Bloom parameters of
        the configured rate (a numeric search, ~15 ms) and the backend with its slab pool (ring
        set-up, one aligned allocation). Measured in the first spilling step of the storage
        workload: about 30% of its file-merge time was these."""
        from ..trace import file_batch, merge_stream  # noqa: F401
        from . import reader, writer  # noqa: F401
        from .format import bloom_params
        if self.config.bloom_fpr is not None:
            bloom_params(self.config.bloom_fpr)
        self.backend  # noqa: B018 - built and cached per process

    def __repr__(self) -> str:
        return f"WorkerStorage({self.dir!r}, budget={self.config.memory_budget_bytes})"

    def __reduce__(self):  # a worker process rebuilds its own (own accountant, own backend)
        return (WorkerStorage, (self.config, self.worker))

    @property
    def backend(self):
        return backend_for(self.config)

    def new_path(self) -> str:
        """A fresh, unique file name in this worker's directory."""
        return os.path.join(self.dir, f"b-{uuid.uuid4().hex}.dbsp")

    # -- the spine hooks ------------------------------------------------------------------------
    def hooks(self, spine: Any):
        """``(merge_fn, on_change)`` that make ``spine`` storage-aware (see the module doc):
        a merge whose output fits beside the memory in use (and is below ``min_file_rows``)
        stays in memory, any other streams into a new file; every change recounts the spine's
        memory and lets the accountant spill."""
        self.accountant.register(spine)
        ref = weakref.ref(spine)
        acct = self.accountant

        def merge_fn(parts):
            from ..trace.merge_stream import merge_stream, sum_batches
            sp = ref()
            name = sp.name if sp is not None else ""
            files = any(getattr(b, "is_file", False) for b in parts)
            size = sum(b.file_bytes if getattr(b, "is_file", False) else b.nbytes_in_memory
                       for b in parts)
            # the output stays in memory when it fits beside what is there, counting as room
            # the colder batches the accountant would spill first (so a trace every step probes
            # stays in memory and cold ones go to disk); large merges always stream to a file
            heat = sum(getattr(b, "hits", 0) for b in parts) / max(size, 1)
            rows = sum(len(b) for b in parts)
            to_file = rows >= self.config.min_file_rows or size > acct.room_for(heat)
            out = _NOT_DONE
            if to_file and self.config.merge_process_rows is not None and \
                    rows >= self.config.merge_process_rows:
                out = self._merge_in_helper(parts, name, size)
            if out is _NOT_DONE:  # in this thread: small, in memory, or no helper to take it
                if not to_file and not files and size <= self.config.round_bytes:
                    out = sum_batches(parts)  # small: one native merge (holds ~3x its input)
                else:  # in bounded rounds, into a file or (when it fits) into memory
                    out = merge_stream(parts, self, name=name, to_file=to_file)  # None: cancelled
            if out is not None:  # the output is as hot as its inputs were
                out.hits = sum(getattr(b, "hits", 0) for b in parts)
            return out

        def on_change(sp):
            acct.recount(sp)
            if acct.over():
                acct.relieve()

        return merge_fn, on_change

    def _merge_in_helper(self, parts, name: str, size: int):
        """Merge ``parts`` into a file in this worker's merge helper process (see
        :mod:`dbsp.storage.merge_process`); ``_NOT_DONE`` when no helper can take it now."""
        from .merge_process import HelperFailed, helper_for
        h = helper_for(self)
        if h is None:
            return _NOT_DONE
        with self.reserve_disk(size, f"merge of {name or 'a spine'}"):
            try:
                path = h.merge(parts, name)
            except HelperFailed:
                return _NOT_DONE
        if path is None:
            return None
        from ..trace.file_batch import batch_codecs, open_written
        return open_written(self, path, *batch_codecs(parts[0]))

    def writer_options(self) -> dict:
        c = self.config
        return {"block_size": c.block_size, "compression": c.compression,
                "bloom_fpr": c.bloom_fpr, "durable": c.durable, "index_fanout": c.index_fanout}

    @contextlib.contextmanager
    def reserve_disk(self, nbytes: int, what: str = "merge") -> Iterator[None]:
        """Wait until the disk has ``nbytes`` (plus ``min_free_bytes`` and what other merges
        reserved) free, hold that reservation for the block, release it afterwards."""
        global _reserved
        nbytes = max(int(nbytes), 0)
        delay = 0.01
        waited = 0.0
        logged = False
        while True:
            with _disk_lock:
                free = _config.free_space(self.dir)
                if free - _reserved - nbytes >= self.config.min_free_bytes:
                    _reserved += nbytes
                    break
            if not logged:
                log.warning("%s in %s waits for disk space: needs %d B plus %d B kept free, "
                            "%d B available (%d B reserved by other merges)", what, self.dir,
                            nbytes, self.config.min_free_bytes, free, _reserved)
                logged = True
            self.disk_waits += 1
            time.sleep(delay)
            waited += delay
            delay = min(delay * 2, _MAX_BACKOFF)
        if logged:
            self.disk_wait_seconds += waited
            log.warning("%s in %s resumed after waiting %.2f s for disk space", what, self.dir,
                        waited)
        try:
            yield
        finally:
            with _disk_lock:
                _reserved -= nbytes

    def stats(self) -> dict:
        d = {"dir": self.dir, "files_written": self.files_written,
             "bytes_written": self.bytes_written, "disk_waits": self.disk_waits,
             "disk_wait_seconds": self.disk_wait_seconds}
        d.update({f"memory_{k}": v for k, v in self.accountant.stats().items()})
        return d
