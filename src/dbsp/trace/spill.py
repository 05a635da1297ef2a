"""The spilling policy: which in-memory batches of which spines go to layer files, and when.

Goals
-----
* State larger than memory: spines keep small batches in memory and put large ones in layer files
  (:mod:`dbsp.trace.file_batch`), so a circuit's memory stays near its budget whatever the size
  of its state.
* One budget for the whole process: a :class:`MemoryAccountant` sums the in-memory batches of
  every spine that shares a :class:`~dbsp.storage.config.StorageConfig` in this process; when the
  sum passes the budget it *spills* batches to files, the coldest first, instead of letting
  memory grow.

Design
------
:class:`SpineStorage` is what ``WorkerContext.storage`` holds (one per worker; with the processes
runtime each worker process builds its own after the fork): a
:class:`~dbsp.storage.manager.WorkerStorage` (directory, file names, backend, disk gate) plus the
process's accountant and the spine hooks. Spines find it through the ``storage=`` argument or,
when built inside :func:`use_storage` (the scheduler wraps operator construction in it), the
worker's storage: every operator's state becomes storage-aware without each operator passing it
along.

The accountant tracks bytes, not rows: each spine reports the ``nbytes_in_memory`` of its
in-memory batches whenever its set of batches changes, and file batches report their resident
filter and index bytes. ``relieve`` (called after inserts and merges) spills loose in-memory
batches of at least ``min_spill_bytes`` over all spines, the coldest per byte first (``hits``:
keys that probes found in the batch, summed into merge outputs) and among equally cold ones the
largest, until usage is back under 80% of the budget; a thread that finds another spilling waits
for it. So a trace that every step probes (a join's small side) stays in memory while a large
trace that probes rarely reach goes to disk. Merges whose output goes to a file and that are
large enough run in the worker's merge helper process (:mod:`dbsp.trace.merge_helper`).

Invariants
----------
* Spilling never changes a spine's state: the file holds exactly the batch it replaces, swapped
  in under the spine lock only if the batch is still there (otherwise the file is dropped).
"""
from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import Any, Iterator, Optional

from ..storage.config import StorageConfig
from ..storage.manager import WorkerStorage, check_fork, on_fork

from .file_batch import batch_codecs, open_written, write_batch
from .merge_helper import HelperFailed, helper_for
from .merge_stream import merge_stream, sum_batches

__all__ = ["SpineStorage", "MemoryAccountant", "accountant_for", "current_storage",
           "use_storage", "spill"]

_NOT_DONE = object()
_LOW_WATER = 0.8

_tls = threading.local()
_lock = threading.Lock()
_accountants: dict = {}


def _forget_accountants() -> None:
    global _lock
    _lock = threading.Lock()
    _accountants.clear()


on_fork(_forget_accountants)


def current_storage() -> Optional["SpineStorage"]:
    """The storage of the operators being built in this thread (see :func:`use_storage`)."""
    return getattr(_tls, "storage", None)


@contextlib.contextmanager
def use_storage(storage: Optional["SpineStorage"]) -> Iterator[None]:
    """Spines created inside this block (in this thread) default to ``storage``."""
    prev = getattr(_tls, "storage", None)
    _tls.storage = storage
    try:
        yield
    finally:
        _tls.storage = prev


def accountant_for(config: StorageConfig) -> "MemoryAccountant":
    """The accountant of every spine of this process that uses ``config``."""
    check_fork()
    with _lock:
        a = _accountants.get(config)
        if a is None:
            a = _accountants[config] = MemoryAccountant(config.batch_budget, config)
        return a


class MemoryAccountant:
    """Sums in-memory state over the spines of a process and spills when it passes the budget
    (see the module doc)."""

    def __init__(self, budget: int, config: Optional[StorageConfig] = None):
        self.budget = int(budget)
        self.config = config
        self.min_spill_bytes = config.spill_floor if config is not None else 0
        # re-entrant: a batch file's finaliser (``add``) or a spine's (``_forget``) may run on
        # the thread that holds the lock, when a collection starts inside ``recount``
        self._lock = threading.RLock()
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
    st = spine.storage
    with st.reserve_disk(batch.nbytes_in_memory, f"spill of {spine.name}"):
        fb = write_batch(st, batch, spine.name)
    if fb is None:
        return False
    fb.hits = getattr(batch, "hits", 0)
    return spine.replace_batch(batch, fb)


class SpineStorage(WorkerStorage):
    """A worker's storage as its spines use it: the :class:`~dbsp.storage.manager.WorkerStorage`
    plus the process's :class:`MemoryAccountant` and the hooks that make a spine storage-aware
    (see the module doc)."""

    def __init__(self, config: Any, worker: int = 0, helper: bool = False):
        super().__init__(config, worker, helper)
        self.accountant = accountant_for(self.config)

    def hooks(self, spine: Any):
        """``(merge_fn, on_change)`` that make ``spine`` storage-aware (see the module doc):
        a merge whose output fits beside the memory in use (and is below ``min_file_rows``)
        stays in memory, any other streams into a new file; every change recounts the spine's
        memory and lets the accountant spill."""
        self.accountant.register(spine)
        ref = weakref.ref(spine)
        acct = self.accountant

        def merge_fn(parts):
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

    def write_file(self, batch, name: str = ""):
        """Write in-memory ``batch`` to a new file (a checkpoint's write; None for an empty
        batch): in the worker's merge helper process when it has at least
        ``merge_process_rows`` rows - a merge of one part is a copy - so the encoding does not
        hold this process's GIL beside the steps; else in this thread."""
        rows = len(batch)
        if rows and self.config.merge_process_rows is not None and \
                rows >= self.config.merge_process_rows and \
                not getattr(batch, "is_file", False):
            out = self._merge_in_helper([batch], name, batch.nbytes_in_memory)
            if out is not _NOT_DONE:
                return out
        return write_batch(self, batch, name)

    def _merge_in_helper(self, parts, name: str, size: int):
        """Merge ``parts`` into a file in this worker's merge helper process (see
        :mod:`dbsp.trace.merge_helper`); ``_NOT_DONE`` when no helper can take it now."""
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
        return open_written(self, path, *batch_codecs(parts[0]))

    def stats(self) -> dict:
        d = super().stats()
        d.update({f"memory_{k}": v for k, v in self.accountant.stats().items()})
        return d
