"""Spine: the LSM of batches that holds one piece of operator state (a trace).

A spine is the sum of its batches (:class:`~dbsp.trace.batch.OrdZSet` or
:class:`~dbsp.trace.batch.OrdIndexedZSet`). Operators insert one consolidated delta per step and
probe the accumulated state (:meth:`Spine.lookup`, :meth:`Spine.weights_of`, a
:class:`~dbsp.trace.spine_cursor.SpineCursor`); background threads merge batches so that their number
stays logarithmic in the state size. :mod:`dbsp.trace.timed` holds the timed batch types.

Goals
-----
* ``insert`` costs work proportional to the delta and returns at once; merging is amortised and
  runs on background threads (the native merge releases the GIL).
* Reading is never blocked by a merge and always sees a consistent state.
* Memory for the merge backlog is bounded: when the merger falls behind, ``insert`` waits.
* Watermark GC: rows below a key bound disappear from readers at once and from memory lazily.

Design
------
*Levels.* A batch of ``n`` rows sits at level ``floor(log_F(n / B))`` (``F`` = ``fanout``, 4 by
default; ``B`` = ``base_rows``, 256), level 0 for every batch under ``B * F`` rows. Without the
floor, a small state (an aggregate's few hundred rows per step, retracted and re-inserted) is
spread over up to ``F - 1`` batches at each of the tiny levels 0..4, and every probe pays a
fixed cost per batch: the linear aggregate of ``bench_workload`` held 7 batches for 100 keys.
With the floor those batches merge four at a time (a few hundred rows: cheap) and the state
stays in 1-4 batches; at 100 bids a step the workload's step took 0.76-0.83 of the time (A/B
interleaved in one process).

A level that holds ``F`` or more *loose* batches (batches not being merged) owes a merge: the merger
takes up to ``max_merge`` of its oldest loose batches, merges them in one k-way merge, and files the
result at the level of its size (usually one up, lower when retractions cancel). At rest every level
holds fewer than ``F`` batches, so a spine of ``N`` rows holds at most ``(F - 1) * log_F(N)``
batches and every row is merged about ``log_F(N / delta)`` times. Several merges of one spine (even
of one level) may run at once: Z-set addition is commutative, so the order in which batches are
combined never matters. When the merger falls behind, a level collects more than ``F`` batches and
one wider merge (up to ``max_merge``, 16) takes them: per row it costs about what the tree of 4-way
merges it replaces would (measured: 4-way 25M rows/s, 16-way 13M/s, 64-way 8.5M/s on 10K-row
batches), and the cap keeps each merge short and the memory it holds small.

*Threads.* One :class:`Merger` per process (:func:`default_merger`) serves every spine, with
:func:`default_threads` worker threads (``DBSP_MERGER_THREADS``; by default one per 4 cores,
1 to 4). A spine that owes a merge marks itself *dirty* with the merger; an idle worker picks,
over all dirty spines, the pending merge with the fewest input rows (shortest job first: small
merges unblock inserts soonest), claims its inputs, merges without any lock held, then swaps the
output in. With two or more threads, one always stays free for merges below ``big_rows`` (1M),
so a multi-second top-level merge never holds up the small ones. A merge of fewer than
``inline_rows`` input rows (8192; ``DBSP_SPINE_INLINE_ROWS``) runs in the inserting thread
instead: such a merge is one native call of tens of microseconds, less than waking the merger
and the GIL handoffs back and forth while the step runs (the merge's Python glue holds the GIL
wherever it runs, so the step waited for it anyway). On the join + average workload's 100-row
steps every merge is that small (callgrind, the merges of 300 foreground steps: 623K
instructions a merge before the one-call native merge, 394K after, half of it the merge loop).
A merge that reads a batch in a layer file stays on the merger (its block reads would wait in
the step), and so does every merge of a spine with a ``merge_fn`` (storage: a merge into a file
may wait for disk space, which must never block the step).
A spine given an explicit merger sends it every merge. ``Spine.with_own_thread`` gives
a spine a private thread; ``background=False`` merges in the inserting thread (the synchronous
behaviour, for comparisons and after :meth:`close`). Lock order: merger lock, then spine lock; a
spine never takes the merger lock while holding its own.

*Measured* (``bench/micro/bench_spine.py``, a shared 2-core machine, native kernels). Inserting
1,000 prebuilt 10K-row batches: every insert returns in under 22 ms in the background (p99 13 ms)
against 204 ms (p99 41 ms) when merging in ``insert``. Sustained rows/s, though, is not better
(4.2M/s with one merger thread, 3.5M/s with two, 5.4M/s in the foreground), nor end-to-end when
the inserting thread builds each delta first (3.9 s against 2.9 s for 10M rows, the background
run ending with one more top-level merge): a merge is a chain of native calls glued by Python,
and numpy / Arrow steps in it (``np.repeat``, ``RecordBatch.take``) hold the GIL, so it runs
2-4x slower beside a busy foreground thread. ``DBSP_SPINE_BACKGROUND=0`` makes foreground
merging the default for every spine. For 8 spines sharing the
merger, two threads gave 28M rows/s, a thread per spine 20M/s, one shared thread 14M/s. A
process-wide pool, not a thread per spine: threads stay bounded however many spines a circuit
has, and no spine needs closing. One thread per 4 cores because, with the foreground busy on
2 cores, a second merger thread lost 30% (oversubscription plus the GIL).

*Snapshots.* Batches being merged stay visible until the merge output replaces them, in one
step under the spine lock, so readers see the same sum before and after. :meth:`Spine.batches`
returns an immutable tuple (cached until the next change); holding it pins those batches.

*Backpressure.* A batch *waits* when it is loose at a level that owes a merge; at rest nothing
waits. When more than ``max_loose`` batches wait (64 by default), ``insert`` blocks until the
merger has claimed enough of them. Batches being merged do not count (Feldera learned to count
loose batches, not all batches, feldera#6866), so the bound never blocks a spine that is merely
large. Time spent blocked is in :attr:`Spine.stats`.

*GC hooks.* :meth:`Spine.truncate_keys_below` sets a monotone key bound: readers see every batch
cut to its keys ``>= bound`` (a zero-copy prefix slice, since keys are sorted) and merges drop
the rows, which frees their memory. :meth:`Spine.retain_values` sets a row filter applied lazily
by merges (readers may see filtered rows until a merge drops them).

Invariants
----------
* The state (the sum of the snapshot, above the key bound) changes only by ``insert``,
  ``clear``, ``truncate_keys_below`` and (lazily) ``retain_values``, never by a merge.
* Every stored batch is consolidated and non-empty; stored batches are never modified.
* A merge failure leaves its inputs in place (the state stays right); the error is raised by the
  next ``insert``/``flush``/``wait_merges`` and the spine stops merging in the background.
* Inside a step, ``insert`` and ``clear`` are recorded in the thread's
  :class:`~dbsp.trace.journal.StepJournal`, so that a failed step can be undone exactly.
* ``generation`` counts the changes of the state (a non-empty ``insert``, ``clear``,
  ``restore``, a key bound raised or put back; merges do not count): a reader that keeps a copy
  of the state (the aggregate's flat table of live rows) knows it is stale when the count moved
  past the one it saw after its own last insert.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.checked import WeightOverflowError
from ..algebra.codes import CodeArray, Codes
from ..storage.memory import release_free_memory
from ..storage.osthreads import name_os_thread
from .batch import OrdIndexedZSet, OrdZSet, merge_batches
from .key_filter import attach_filter
from .journal import current_journal
from .spill import current_storage
from .spine_cursor import SpineCursor

Batch = Union[OrdZSet, OrdIndexedZSet]  # or any batch with the batch-probe interface
log = logging.getLogger("dbsp.trace.spine")
KeyBound = Union[int, bytes]
RowFilter = Callable[[Batch], np.ndarray]

__all__ = ["Spine", "SpineImage", "arrow_bytes", "Batch", "Merger", "MergeStats", "SpineMergeError",
           "default_merger",
           "default_threads", "shutdown_default_merger", "merge_batches"]


@dataclass(frozen=True)
class SpineImage:
    """What a checkpoint keeps of a spine (:meth:`Spine.image`): its stored batches, uncut and
    immutable (a merge in flight is represented by its inputs), and its key bound. The batches
    sum to the spine's state at the moment of the image whatever merges finish later."""

    batches: tuple
    key_bound: Optional[Any] = None
    #: the spine imaged (a checkpoint swaps the file copies of in-memory batches into it)
    source: Any = field(default=None, compare=False, repr=False)

    @property
    def rows(self) -> int:
        return sum(len(b) for b in self.batches)


class SpineMergeError(RuntimeError):
    """A background merge of this spine failed (the original exception is the ``__cause__``)."""


@dataclass
class MergeStats:
    """Merge counters of one spine (for the profile)."""

    merges: int = 0             # merges completed
    batches_merged: int = 0     # input batches consumed by those merges
    rows_in: int = 0            # rows read by merges
    rows_out: int = 0           # rows written by merges
    merge_seconds: float = 0.0  # wall time inside merges (background or foreground)
    inserts: int = 0
    rows_inserted: int = 0
    blocked_inserts: int = 0    # inserts that waited for the merger (backpressure)
    blocked_seconds: float = 0.0
    max_waiting: int = 0        # most batches ever waiting for a merge

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def arrow_bytes(b: Batch) -> int:
    """The bytes of an in-memory batch's rows as one flat Arrow record batch (key and value
    columns side by side, no codes, offsets or weights): an indexed batch's key columns count
    once per row, as a flat table repeats them."""
    if getattr(b, "indexed", False):
        nk = b.num_keys
        keys = b.keys.nbytes * len(b) // nk if nk else 0  # type: ignore[union-attr]
        return keys + b.vals.nbytes  # type: ignore[union-attr]
    data = getattr(b, "data", None)
    return 0 if data is None else data.nbytes


def _in_memory(b: Batch) -> Batch:
    return b.to_memory() if getattr(b, "is_file", False) else b  # type: ignore[union-attr]


def _level(n: int, fanout: int, base_rows: int = 1) -> int:
    """The level of a batch of ``n`` rows: how often ``fanout`` divides ``n // base_rows``."""
    lvl = 0
    n //= base_rows
    while n >= fanout:
        n //= fanout
        lvl += 1
    return lvl


def _key_codes(b: Batch) -> CodeArray:
    return b.kcodes if isinstance(b, OrdIndexedZSet) else b.codes


def _cut_below(b: Batch, bound: Optional[KeyBound]) -> Batch:
    """``b`` without its keys below ``bound`` (a zero-copy prefix slice)."""
    if bound is None:
        return b
    cut = getattr(b, "cut_below", None)  # the batch-probe interface (file batches too)
    if cut is not None:
        return cut(bound)
    kc = _key_codes(b)
    n = len(kc)
    if n == 0:
        return b
    first = Codes.at(kc, 0)
    if first >= bound:  # type: ignore[operator]
        return b
    i = int(K.lower_bound(kc, Codes.one(bound, like=kc))[0])
    if isinstance(b, OrdIndexedZSet):
        return b.slice_keys(i, n)
    return b.slice(i, n)


#: a merge of at least this many bytes of in-memory input, and at least half the largest merge
#: of the process so far, first returns the allocators' free pages to the kernel
#: (:func:`~dbsp.storage.memory.release_free_memory`). Such a merge is where the process's memory
#: peaks (its inputs, its output and the rest of the state at once), and under the throughput
#: malloc policy freed heap stays resident. Smaller merges do not trim: the trimmed pages are
#: faulted in again by the steps that follow, and ``malloc_trim`` holds each arena's lock while
#: the step allocates. Trimming before every merge of 1M rows or more cost ``bench_count_max``
#: (merges of 1M rows, ~40 MB) 0.74-0.79x its events/s in an interleaved A/B at load 3.6; the
#: join+avg workload's top-level merge of 9.3M rows is ~280 MB.
TRIM_BYTES = 128 << 20

#: a background spine runs an owed merge of fewer input rows than this in the inserting thread
#: (``Spine(inline_rows=)``, ``DBSP_SPINE_INLINE_ROWS``; 0: every merge on the merger): see
#: *Threads* in the module doc. Measured (``bench/operators/profile_inline_rows.py``, 2 shared
#: vCPUs at load 8, each value in a fresh process, alternating, medians): the 100-row step of
#: join + average, whose merges are of 256-8K rows and then 16K+ (7 in 1,000 steps), costs
#: 255 / 261 / 242 / 233 / 242 us wall and 400 / 347 / 322 / 298 / 315 us whole-process CPU at
#: 0 / 1K / 4K / 8K / 32K (0 against 8K: process CPU lower at 8K in 5 of 5 pairs; at 32K the
#: 16K-row merges join the step: its mean wall 736 -> 793 us); ``bench_fixed_cost.py`` agrees
#: (8K against 0: wall lower in 4 of 5 pairs). The join + average rate (10M bids, 11K-event
#: steps, whose small spines' merges are of 512-2K rows, the bid traces' of 8K+) does not move
#: (1.04 / 1.07M events/s at 0, 1.00 / 1.10M at 8K, 1.01 / 1.09M at 32K).
INLINE_ROWS = 8192
_largest_merge = 0


def _fixed_row_bytes(b: Batch) -> Optional[int]:
    """An upper bound of the bytes in memory a row of ``b``'s kind takes (columns, validity,
    codes, offsets, weights, a key filter) when all its columns are fixed-width; None when some
    column is not (or ``b`` is not an in-memory batch type). A fact of the spine's schema:
    computed once per spine."""
    if isinstance(b, OrdIndexedZSet):
        types = list(b.keys.schema.types) + list(b.vals.schema.types)
    elif isinstance(b, OrdZSet):
        types = list(b.data.schema.types)
    else:
        return None
    width = 0
    for t in types:
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t)
                or pa.types.is_boolean(t) or pa.types.is_decimal(t)):
            return None
        width += (t.bit_width + 7) // 8 + 1  # (+ its validity bit, generously)
    # var codes of fixed columns hold at most their bytes again plus an offset; two code
    # arrays (key, value), offsets, weights, a Bloom filter's bits
    return 2 * width + 64


def _merge_trims(inputs: Sequence[Batch], rows: int, row_bytes: Optional[int]) -> bool:
    """Whether a merge of ``inputs`` (``rows`` rows, at most ``row_bytes`` bytes a row when not
    None) first trims the allocators (:func:`_trims_before` on their bytes in memory, counted
    exactly only when cheap upper bounds reach :data:`TRIM_BYTES`)."""
    if row_bytes is not None and rows * row_bytes + 4096 * len(inputs) < TRIM_BYTES:
        return False
    if sum(getattr(b, "nbytes_upper", 0) for b in inputs) < TRIM_BYTES:
        return False
    return _trims_before(sum(getattr(b, "nbytes_in_memory", 0) for b in inputs))


def _trims_before(nbytes: int) -> bool:
    global _largest_merge
    if nbytes < TRIM_BYTES or 2 * nbytes < _largest_merge:
        return False
    _largest_merge = max(_largest_merge, nbytes)
    return True


class _Job:
    __slots__ = ("id", "epoch", "inputs", "rows")

    def __init__(self, id_: int, epoch: int, inputs: list, rows: Optional[int] = None):
        self.id, self.epoch, self.inputs = id_, epoch, inputs
        self.rows = sum(len(b) for b in inputs) if rows is None else rows


# --- the merger -------------------------------------------------------------------------------

class Merger:
    """A pool of background threads that run the merges of every spine attached to it.

    Threads start when the first merge is owed and are daemons, so a spine never has to be
    closed for the process to exit. :meth:`pause` stops new merges from starting (merges in
    flight finish), e.g. while a checkpoint lists batches; :meth:`resume` restarts them.
    """

    def __init__(self, threads: int = 1, name: str = "dbsp-merger", big_rows: int = 1_000_000):
        if threads < 1:
            raise ValueError("a merger needs at least one thread")
        self.threads = threads
        self.name = name
        self.big_rows = big_rows
        self._init_state()

    def _init_state(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._dirty: dict[int, Spine] = {}
        self._workers: list[threading.Thread] = []
        self._stopping = False
        self._paused = False
        self._pid = os.getpid()
        self.busy = 0  # merges running now
        self._big = 0  # merges of at least big_rows rows running now

    def __repr__(self) -> str:
        return f"Merger({self.name}, threads={self.threads}, running={len(self._workers)})"

    # -- called by spines ----------------------------------------------------------------
    def _notify(self, spine: "Spine") -> None:
        if self._pid != os.getpid():  # forked: the parent's threads do not exist here
            self._init_state()
        with self._cv:
            if self._stopping:
                raise RuntimeError(f"merger {self.name} is shut down")
            self._dirty[id(spine)] = spine
            if not self._workers:
                for i in range(self.threads):
                    t = threading.Thread(target=self._run, name=f"{self.name}-{i}", daemon=True)
                    self._workers.append(t)
                    t.start()
            self._cv.notify()

    def _forget(self, spine: "Spine") -> None:
        with self._cv:
            self._dirty.pop(id(spine), None)

    # -- control -------------------------------------------------------------------------
    def pause(self) -> None:
        with self._cv:
            self._paused = True

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    def shutdown(self, wait: bool = True) -> None:
        """Stop the threads (merges in flight finish first when ``wait``)."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
            workers = list(self._workers)
        if wait:
            for t in workers:
                if t is not threading.current_thread():
                    t.join()

    # -- the worker loop -----------------------------------------------------------------
    def _pick(self) -> Optional[tuple["Spine", _Job]]:
        # With several threads, one always stays free for small merges: a big merge (seconds)
        # must not hold up the small ones that unblock inserts (head-of-line blocking).
        big_ok = self.threads == 1 or self._big < self.threads - 1
        while True:
            best: Optional[tuple[int, Spine]] = None
            for sid, sp in list(self._dirty.items()):
                cost = sp._peek_cost()
                if cost is None:
                    del self._dirty[sid]
                elif (cost < self.big_rows or big_ok) and (best is None or cost < best[0]):
                    best = (cost, sp)
            if best is None:
                return None
            job = best[1]._claim()
            if job is not None:
                return best[1], job

    def _run(self) -> None:
        name_os_thread()
        while True:
            with self._cv:
                while True:
                    if self._stopping:
                        return
                    task = None if self._paused else self._pick()
                    if task is not None:
                        break
                    self._cv.wait()
                self.busy += 1
                big = task[1].rows >= self.big_rows
                self._big += big
            spine, job = task
            try:
                more = spine._run_job(job)
            finally:
                with self._cv:
                    self.busy -= 1
                    self._big -= big
                    if big:
                        self._cv.notify_all()  # a big merge may have been held back
            if more:
                try:
                    self._notify(spine)
                except RuntimeError:  # shut down meanwhile
                    return


_default: Optional[Merger] = None
_default_lock = threading.Lock()


def default_threads() -> int:
    """``DBSP_MERGER_THREADS``, else one merger thread per 4 cores, between 1 and 4 (see the
    module doc for the measurements behind it)."""
    env = os.environ.get("DBSP_MERGER_THREADS")
    if env:
        return max(1, int(env))
    return max(1, min(4, (os.cpu_count() or 1) // 4))


def default_merger() -> Merger:
    """The process-wide merger (:func:`default_threads` threads), created on demand."""
    global _default
    with _default_lock:
        if _default is None or _default._stopping:
            _default = Merger(default_threads())
        return _default


def shutdown_default_merger(wait: bool = True) -> None:
    global _default
    with _default_lock:
        m, _default = _default, None
    if m is not None:
        m.shutdown(wait)


_spines: "weakref.WeakSet[Spine]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # Threads do not survive fork: batches claimed by a parent's merge go back to their levels,
    # locks are recreated (a parent thread may have held one at the fork).
    global _default_lock
    _default_lock = threading.Lock()
    if _default is not None:
        _default._init_state()
    for sp in list(_spines):
        sp._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --- the spine --------------------------------------------------------------------------------

class Spine:
    """An LSM trace of :class:`OrdZSet` or :class:`OrdIndexedZSet` batches (see the module doc).

    ``fanout``: batches per level before a merge (>= 2). ``max_loose``: batches that may wait
    for a merge before ``insert`` blocks. ``max_merge``: most batches one merge combines.
    ``base_rows``: batches of fewer than ``base_rows * fanout`` rows share level 0 (see *Levels*).
    ``background``: merge on the merger's threads or in ``insert`` (default: background unless
    ``DBSP_SPINE_BACKGROUND=0``). ``merger``: the :class:`Merger` to use (default: the
    process-wide one).

    Hooks for storage (spilling batches to layer files): ``merge_fn`` replaces
    :func:`merge_batches` (e.g. a streaming merge that writes a file); ``on_change(spine)`` is
    called, without the spine lock, after the set of batches changed (insert, merge, clear,
    compact, replace); :meth:`loose_batches` and :meth:`replace_batch` let a spiller swap a
    batch for an equal one. ``storage`` (a :class:`~dbsp.trace.spill.SpineStorage`;
    default: the one of the worker whose operators are being built, see
    :func:`~dbsp.trace.spill.use_storage`) installs both hooks: streaming merges into
    layer files and the process's memory accountant.
    """

    _job_ids = itertools.count(1)

    def __init__(self, fanout: int = 4, name: str = "trace", *, max_loose: int = 64,
                 max_merge: int = 16, base_rows: int = 256,
                 background: Optional[bool] = None,
                 inline_rows: Optional[int] = None,
                 merger: Optional[Merger] = None,
                 merge_fn: Optional[Callable[[Sequence[Batch]], Batch]] = None,
                 on_change: Optional[Callable[["Spine"], None]] = None,
                 storage: Any = None):
        if fanout < 2:
            raise ValueError("fanout must be at least 2")
        if max_loose < 1:
            raise ValueError("max_loose must be at least 1")
        self.fanout = fanout
        self.name = name
        self.max_loose = max_loose
        self.max_merge = max(max_merge, 2)
        if base_rows < 1:
            raise ValueError("base_rows must be at least 1")
        self.base_rows = base_rows
        if background is None:  # an explicit merger means background merging
            background = merger is not None or os.environ.get("DBSP_SPINE_BACKGROUND", "1") != "0"
        self.background = background
        if inline_rows is None:  # an explicit merger gets every merge
            inline_rows = 0 if merger is not None else \
                int(os.environ.get("DBSP_SPINE_INLINE_ROWS", INLINE_ROWS))
        if inline_rows < 0:
            raise ValueError("inline_rows must be at least 0")
        self.inline_rows = inline_rows
        self._merger = merger
        self._own_merger = False
        self._cv = threading.Condition(threading.Lock())
        self._levels: dict[int, list[Batch]] = {}   # loose batches per level, oldest first
        self._inflight: dict[int, _Job] = {}          # claimed by a running merge, still visible
        self._snapshot: Optional[tuple[Batch, ...]] = None
        self._consolidated: Optional[tuple[tuple, Optional[Batch]]] = None
        self._epoch = 0
        self.generation = 0  # changes of the state (see the module doc's invariants)
        self._key_bound: Optional[KeyBound] = None   # readers cut below it at once
        self._gc_bound: Optional[KeyBound] = None    # merges free rows below it (committed)
        self._retain: Optional[RowFilter] = None
        self._error: Optional[BaseException] = None
        # a merge found a weight out of int64 (WeightOverflowError): its inputs stay loose (their
        # sum is the state, exactly) and no merge runs until the state changes again
        self._merge_blocked = False
        self._proto: Optional[Batch] = None
        self._row_bytes: Optional[int] = -1  # _fixed_row_bytes of its batches, once known
        # point probes of this Z-set trace have begun (weights_of, also a view's overflow check
        # of each step): large batches get a key filter from then on (dbsp.trace.key_filter); a
        # trace never probed by row never pays for one
        self._filtered = False
        if storage is None:
            storage = current_storage()
        self.storage = storage
        if storage is not None:
            mf, oc = storage.hooks(self)
            merge_fn, on_change = merge_fn or mf, on_change or oc
        self._merge_fn = merge_fn
        self._on_change = on_change
        self.stats = MergeStats()
        _spines.add(self)

    def __repr__(self) -> str:
        return (f"Spine({self.name!r}, {self.num_batches} batches, {len(self)} rows, "
                f"fanout={self.fanout})")

    # -- writing --------------------------------------------------------------------------
    def insert(self, batch: Batch) -> None:
        """Add a consolidated batch. Returns once it is filed; merging happens in the background
        (blocks only while more than ``max_loose`` batches wait for the merger)."""
        # (every worker's operators call this once a step per spine: the helpers that are a
        # line each are written out here)
        if self._error is not None:
            self._raise_error()
        if self._proto is None:
            self._proto = batch
        n = len(batch)
        if n == 0:
            return
        if self._filtered:
            attach_filter(batch)  # a large batch only: its step already paid O(n) to make it
        journal = current_journal()
        if journal is not None:  # a step that may be rolled back (dbsp.trace.journal)
            journal.inserted(self, batch)
        f = self.fanout
        with self._cv:
            self.generation += 1
            self._levels.setdefault(_level(n, f, self.base_rows), []).append(batch)
            self._merge_blocked = False
            self._snapshot = None  # (_changed)
            st = self.stats
            st.inserts += 1
            st.rows_inserted += n
            waiting = 0  # (_waiting)
            for bs in self._levels.values():
                k = len(bs)
                if k >= f:
                    waiting += k
            if waiting > st.max_waiting:
                st.max_waiting = waiting
        if self._on_change is not None:
            self._fire_change()
        if not waiting:
            return
        if not self.background:
            self._merge_in_foreground()
            return
        if self.inline_rows and self._merge_fn is None and not self._get_merger()._paused \
                and not self._merge_small_inline():
            self._raise_error()
            return
        self._get_merger()._notify(self)
        with self._cv:
            if self._waiting() <= self.max_loose or self._error is not None:
                return
            t0 = time.perf_counter()
            while self._waiting() > self.max_loose and self._error is None and self.background \
                    and not self._merge_blocked:
                self._cv.wait()
            self.stats.blocked_inserts += 1
            self.stats.blocked_seconds += time.perf_counter() - t0
        self._raise_error()

    def clear(self) -> None:
        """Drop every batch (merges in flight are discarded when they finish)."""
        journal = current_journal()
        with self._cv:
            if journal is not None:
                journal.cleared(self, self._batches_locked())
            self._levels.clear()
            self._inflight.clear()
            self._epoch += 1
            self.generation += 1
            self._merge_blocked = False
            self._changed()
            self._cv.notify_all()
        self._fire_change()

    def image(self) -> SpineImage:
        """The spine's state now, for a checkpoint: the stored batches (loose ones and the
        inputs of merges in flight, uncut by the key bound) and the key bound. Cheap: no batch
        is copied; holding the image pins its batches."""
        with self._cv:
            raw = [b for bs in self._levels.values() for b in bs]
            for job in self._inflight.values():
                raw.extend(job.inputs)
            self._raise_error()
            return SpineImage(tuple(raw), self._key_bound, self)

    def restore(self, image: SpineImage) -> None:
        """Replace the state with ``image``'s batches and key bound (merges in flight are
        discarded); the merge policy then files and merges them as usual."""
        with self._cv:
            self._levels.clear()
            self._inflight.clear()
            self._epoch += 1
            self.generation += 1
            self._merge_blocked = False
            for b in image.batches:
                if len(b):
                    self._levels.setdefault(self.level_of(len(b)), []).append(b)
                    if self._proto is None:
                        self._proto = b
            self._key_bound = self._gc_bound = image.key_bound
            self._changed()
            waiting = self._waiting()
            self._cv.notify_all()
        self._fire_change()
        if waiting and self.background:
            self._get_merger()._notify(self)

    def loose_batches(self) -> list[Batch]:
        """The stored batches no merge is using now (uncut by the key bound), e.g. to spill."""
        with self._cv:
            return [b for bs in self._levels.values() for b in bs]

    def replace_batch(self, old: Batch, new: Batch) -> bool:
        """Swap the loose batch ``old`` for ``new``, which must hold the same rows (its copy in a
        layer file, say). False, and nothing changes, if ``old`` is no longer loose (merged or
        being merged)."""
        with self._cv:
            found = next(((bs, i) for bs in self._levels.values()
                          for i, b in enumerate(bs) if b is old), None)
            if found is None:
                return False
            bs, i = found
            bs[i] = new
            self._changed()
        self._fire_change()
        return True

    def _fire_change(self, background: bool = False) -> None:
        cb = self._on_change
        if cb is None:
            return
        if not background:
            cb(self)
            return
        try:
            cb(self)
        except Exception:  # noqa: BLE001 - a merger thread must survive a failing observer
            log.exception("on_change of spine %r failed", self.name)

    def truncate_keys_below(self, bound: Union[KeyBound, CodeArray]) -> None:
        """Forget every row whose key code is below ``bound`` (an int for u64 codes, bytes for var
        codes, or a one-row code array). Readers stop seeing them now; merges free them. The bound
        only rises: a lower bound than the current one is ignored."""
        bound = Codes.as_code(bound)
        journal = current_journal()
        with self._cv:
            if self._key_bound is None or bound > self._key_bound:  # type: ignore[operator]
                dropped = False
                if journal is not None:
                    # inside a step that may be rolled back: readers see the new bound now,
                    # merges free rows only once the step commits (commit_key_bound)
                    journal.bound_raised(self, self._key_bound)
                else:
                    self._gc_bound = bound
                    dropped = self._drop_cut_locked()
                self._key_bound = bound
                self.generation += 1
                self._changed()
            else:
                return
        if dropped:
            self._fire_change()

    def commit_key_bound(self) -> None:
        """The step that raised the key bound stands: merges may now free the rows below it."""
        with self._cv:
            self._gc_bound = self._key_bound
            dropped = self._drop_cut_locked()
        if dropped:
            self._fire_change()

    def _drop_cut_locked(self) -> bool:
        """Forget the stored batches whose every key is below the committed GC bound (a merge of
        them would output nothing), so their memory goes now and not at their next merge, which
        for a large batch behind a watermark may never come. Merges in flight keep theirs."""
        bound = self._gc_bound
        if bound is None:
            return False
        return self._drop_locked(lambda b: not len(_cut_below(b, bound)))

    def _drop_locked(self, dead: Callable[[Batch], bool]) -> bool:
        """Forget the stored batches (not those being merged) for which ``dead(batch)``."""
        dropped = False
        for lvl in list(self._levels):
            bs = self._levels[lvl]
            keep = [b for b in bs if not dead(b)]
            if len(keep) != len(bs):
                dropped = True
                if keep:
                    self._levels[lvl] = keep
                else:
                    del self._levels[lvl]
        if dropped:
            self._changed()
            self._cv.notify_all()  # fewer batches wait: blocked inserts may go on
        return dropped

    def restore_key_bound(self, bound: Optional[KeyBound]) -> None:
        """Undo a rolled-back step's raise of the key bound (the rows below the new bound were
        never freed: merges cut at the committed bound only), so readers see them again."""
        with self._cv:
            self._key_bound = bound
            self.generation += 1
            self._changed()

    @property
    def key_bound(self) -> Optional[KeyBound]:
        return self._key_bound

    @property
    def row_filter(self) -> Optional[RowFilter]:
        """The row filter merges apply (:meth:`retain_values`), or None."""
        return self._retain

    def retain_values(self, keep: Optional[RowFilter],
                      dead: Optional[Callable[[Batch], bool]] = None) -> None:
        """Set the row filter merges apply: ``keep(batch)`` returns a bool mask over the batch's
        value rows (rows of an :class:`OrdZSet`); rows where it is false are dropped when their
        batch is next merged (lazily: readers may see them until then). ``None`` removes it.

        ``dead(batch)``: True when ``keep`` would drop every row of a stored batch, told
        cheaply (e.g. from a bound of the batch's column kept with the batch). Such batches are
        forgotten now, as a committed key bound forgets the batches below it: a batch behind
        the bound frees its memory at once, not at its next merge (which, for a large batch
        on a high level, may never come)."""
        with self._cv:
            self._retain = keep
            self.generation += 1
            dropped = keep is not None and dead is not None and self._drop_locked(dead)
        if dropped:
            self._fire_change()

    # -- merging --------------------------------------------------------------------------
    def _get_merger(self) -> Merger:
        m = self._merger
        if m is None or (m._stopping and not self._own_merger):
            m = self._merger = default_merger()
        return m

    def _changed(self) -> None:
        self._snapshot = None

    def _waiting(self) -> int:
        f, n = self.fanout, 0
        for bs in self._levels.values():  # a plain loop: runs on every insert
            k = len(bs)
            if k >= f:
                n += k
        return n

    def _pending_level(self) -> Optional[tuple[int, int]]:
        """(cost, level) of the cheapest merge owed, under the lock."""
        if self._merge_blocked:
            return None
        best = None
        for lvl, bs in self._levels.items():
            if len(bs) >= self.fanout:
                cost = sum(len(b) for b in bs[:self.max_merge])
                if best is None or cost < best[0]:
                    best = (cost, lvl)
        return best

    def _peek_cost(self) -> Optional[int]:
        with self._cv:
            if self._error is not None or not self.background:
                return None
            p = self._pending_level()
            return None if p is None else p[0]

    def _claim(self, background: bool = True, max_rows: Optional[int] = None) -> Optional[_Job]:
        """Claim the cheapest merge owed (None if none, or if it has ``max_rows`` rows or more)."""
        with self._cv:
            if self._error is not None or self.background != background:
                return None
            p = self._pending_level()
            if p is None or (max_rows is not None and p[0] >= max_rows):
                return None
            return self._claim_locked(p)

    def _claim_locked(self, p: tuple[int, int]) -> _Job:
        """Claim the merge ``p`` (a ``(cost, level)`` of :meth:`_pending_level`), under the lock."""
        bs = self._levels[p[1]]
        inputs, rest = bs[:self.max_merge], bs[self.max_merge:]
        if rest:
            self._levels[p[1]] = rest
        else:
            del self._levels[p[1]]
        job = _Job(next(Spine._job_ids), self._epoch, inputs, p[0])
        self._inflight[job.id] = job
        self._cv.notify_all()  # fewer batches wait: blocked inserts may go on
        return job

    def _run_job(self, job: _Job) -> bool:
        """Merge a claimed job and swap its output in. True if the spine owes another merge."""
        try:
            with self._cv:
                bound, keep = self._gc_bound, self._retain
            t0 = time.perf_counter()
            rb = self._row_bytes
            if rb == -1:
                rb = self._row_bytes = _fixed_row_bytes(job.inputs[0])
            if _merge_trims(job.inputs, job.rows, rb):
                release_free_memory()
            out = self._merge(job.inputs, bound, keep)
            if out is not None and self._filtered:
                attach_filter(out)  # on this (merger) thread, before the batch is visible
            dt = time.perf_counter() - t0
        except WeightOverflowError:
            # not a broken spine: the batches are right, only their sum does not fit int64. The
            # error is raised where the state is read (inside a step, which is rolled back); a
            # rollback's insert (or any later insert) lets the merges run again.
            with self._cv:
                if job.epoch == self._epoch and self._inflight.pop(job.id, None) is not None:
                    for b in job.inputs:
                        self._levels.setdefault(self.level_of(len(b)), []).append(b)
                self._merge_blocked = True
                self._changed()
                self._cv.notify_all()
            return False
        except BaseException as e:  # noqa: BLE001 - reported to the inserting thread
            with self._cv:
                self._error = e  # inputs stay in flight: still visible, the state is right
                self._cv.notify_all()
            return False
        with self._cv:
            if job.epoch == self._epoch and self._inflight.pop(job.id, None) is not None:
                if out is not None and len(out):
                    self._levels.setdefault(self.level_of(len(out)), []).append(out)
                self._changed()
                s = self.stats
                s.merges += 1
                s.batches_merged += len(job.inputs)
                s.rows_in += job.rows
                s.rows_out += len(out) if out is not None else 0
                s.merge_seconds += dt
            self._cv.notify_all()
            more = self.background and self._pending_level() is not None
        job.inputs = []  # the merger's reference to the job must not keep the inputs alive
        self._fire_change(background=True)
        return more

    def _merge(self, inputs: Sequence[Batch], bound: Optional[KeyBound],
               keep: Optional[RowFilter]) -> Optional[Batch]:
        if bound is None and keep is None:  # stored batches are non-empty
            return inputs[0] if len(inputs) == 1 else (self._merge_fn or merge_batches)(inputs)
        parts = []
        for b in inputs:
            cut = _cut_below(b, bound)
            if keep is not None and len(cut):
                cut = _in_memory(cut).filter_rows(keep(_in_memory(cut)))  # type: ignore[union-attr]
            if len(cut):
                parts.append(cut)
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        return (self._merge_fn or merge_batches)(parts)

    def _merge_in_foreground(self) -> None:
        while True:
            job = self._claim(background=False)
            if job is None:
                return
            self._run_job(job)
            self._raise_error()

    def _merge_small_inline(self) -> bool:
        """Run, in the inserting thread, the owed merges of fewer than ``inline_rows`` input rows
        (a background spine; see *Threads* in the module doc). True if a larger merge is still
        owed (for the merger)."""
        while True:
            with self._cv:
                if self._error is not None or not self.background:
                    return False
                p = self._pending_level()
                if p is None:
                    return False
                if p[0] >= self.inline_rows or any(
                        getattr(b, "is_file", False) for b in self._levels[p[1]][:self.max_merge]):
                    return True  # (a merge reading layer files stays off the step)
                job = self._claim_locked(p)
            more = self._run_job(job)
            self._raise_error()
            if not more:
                return False

    def wait_merges(self, timeout: Optional[float] = None) -> bool:
        """Wait until no merge is owed or running. False on timeout; raises a merge failure."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while (self._inflight or self._pending_level() is not None) \
                    and self._error is None and self.background:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        self._raise_error()
        return True

    def flush(self) -> tuple[Batch, ...]:
        """Finish every owed merge (in the background, waiting for it) and return the snapshot."""
        if not self.background:
            self._merge_in_foreground()
        self.wait_merges()
        return self.batches()

    def compact(self) -> Optional[Batch]:
        """Merge everything into one batch now (applying the GC hooks); returns it (None if
        empty). For checkpoints and tests: it costs a full merge."""
        self.wait_merges()
        with self._cv:
            inputs = [b for bs in self._levels.values() for b in bs]
            epoch, bound, keep = self._epoch, self._gc_bound, self._retain
        t0 = time.perf_counter()
        out = self._merge(inputs, bound, keep) if inputs else None
        dt = time.perf_counter() - t0
        with self._cv:
            current = [b for bs in self._levels.values() for b in bs]
            if epoch == self._epoch and not self._inflight and len(current) == len(inputs) \
                    and all(a is b for a, b in zip(current, inputs)):
                self._levels.clear()
                if out is not None and len(out):
                    self._levels[self.level_of(len(out))] = [out]
                self._changed()
                if len(inputs) > 1:
                    self.stats.merges += 1
                    self.stats.batches_merged += len(inputs)
                    self.stats.rows_in += sum(len(b) for b in inputs)
                    self.stats.rows_out += len(out) if out is not None else 0
                    self.stats.merge_seconds += dt
                done = True
            else:
                done = False
        if done:
            self._fire_change()
            return out
        return self.compact()  # changed meanwhile: try again

    def close(self) -> None:
        """Stop merging in the background: wait for this spine's merges, detach it from the
        merger (stopping the merger's thread if the spine owns it). The spine stays usable;
        later inserts merge in the inserting thread."""
        if self._merger is not None:
            self._merger._forget(self)
        with self._cv:
            while self._inflight and self._error is None:
                self._cv.wait()
            self.background = False
            self._cv.notify_all()
        if self._merger is not None and self._own_merger:
            self._merger.shutdown()

    @classmethod
    def with_own_thread(cls, *args, **kwargs) -> "Spine":
        """A spine with a private one-thread merger (stopped by :meth:`close`)."""
        sp = cls(*args, merger=Merger(1, name=f"dbsp-merger:{kwargs.get('name', 'trace')}"),
                 **kwargs)
        sp._own_merger = True
        return sp

    def _raise_error(self) -> None:
        e = self._error
        if e is not None:
            raise SpineMergeError(f"a merge of spine {self.name!r} failed: {e!r}") from e

    def _reset_after_fork(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        for job in self._inflight.values():
            for b in job.inputs:
                self._levels.setdefault(self.level_of(len(b)), []).append(b)
        self._inflight.clear()
        self._epoch += 1

    # -- reading --------------------------------------------------------------------------
    def batches(self) -> tuple[Batch, ...]:
        """An immutable snapshot of the state: the batches, largest first, cut to the key bound.
        Merges finishing later do not change it."""
        snap = self._snapshot
        if snap is not None:
            return snap
        with self._cv:
            return self._batches_locked()

    def _batches_locked(self) -> tuple[Batch, ...]:
        if self._snapshot is None:
            raw = [b for bs in self._levels.values() for b in bs]
            for job in self._inflight.values():
                raw.extend(job.inputs)
            raw.sort(key=len, reverse=True)
            if self._key_bound is not None:
                raw = [c for c in (_cut_below(b, self._key_bound) for b in raw) if len(c)]
            self._snapshot = tuple(raw)
        return self._snapshot

    def cursor(self):
        """A merging :class:`~dbsp.trace.spine_cursor.SpineCursor` over the current snapshot."""
        return SpineCursor(self.batches())

    def __len__(self) -> int:
        """Rows stored, summed over batches (an upper bound on the consolidated size)."""
        return sum(len(b) for b in self.batches())

    def memory(self) -> dict:
        """What the state costs: ``rows`` stored (over all batches), ``batches``,
        ``memory_bytes`` (in-memory batches whole, plus the filters and indexes file batches keep
        resident: ``resident_bytes``), ``file_bytes`` (layer files on disk), ``memory_rows`` (rows of in-memory
        batches) and ``arrow_bytes``: what those in-memory rows take as a plain Arrow record
        batch (:func:`arrow_bytes`), the yardstick ``memory_bytes`` compares to."""
        out = dict(rows=0, batches=0, memory_bytes=0, resident_bytes=0, file_bytes=0,
                   memory_rows=0, arrow_bytes=0)
        for b in self.batches():
            n = len(b)
            out["rows"] += n
            out["batches"] += 1
            out["memory_bytes"] += b.nbytes_in_memory
            if getattr(b, "is_file", False):
                out["file_bytes"] += b.file_bytes  # type: ignore[union-attr]
                out["resident_bytes"] += b.nbytes_in_memory
            else:
                out["memory_rows"] += n
                out["arrow_bytes"] += arrow_bytes(b)
        return out

    @property
    def num_batches(self) -> int:
        return len(self.batches())

    @property
    def num_waiting(self) -> int:
        """Batches waiting for a merge (the backpressure count)."""
        with self._cv:
            return self._waiting()

    @property
    def num_merging(self) -> int:
        """Merges running now."""
        with self._cv:
            return len(self._inflight)

    def level_of(self, n: int) -> int:
        """The level a batch of ``n`` rows is filed at."""
        return _level(n, self.fanout, self.base_rows)

    def level_sizes(self) -> dict[int, list[int]]:
        """Rows of the loose batches per level (for inspection and the profile)."""
        with self._cv:
            return {lvl: [len(b) for b in bs] for lvl, bs in sorted(self._levels.items())}

    def consolidated(self) -> Optional[Batch]:
        """All the state as one batch (None when empty).

        The merged result replaces the spine's batches when no merge is running, so calling this
        every step (as ``integrate`` does) merges the new batches into one, not the whole state.
        """
        bs = self.batches()
        if not bs:
            return None
        cached = self._consolidated
        if cached is not None and cached[0] is bs:
            return cached[1]
        if len(bs) == 1:  # callers read its arrays: a batch in a layer file is read in
            out: Optional[Batch] = _in_memory(bs[0])
        else:
            t0 = time.perf_counter()
            m = merge_batches(bs)
            out = m if len(m) else None
            dt = time.perf_counter() - t0
            with self._cv:
                if self._snapshot is bs and not self._inflight:
                    self._levels.clear()
                    if out is not None:
                        self._levels[self.level_of(len(out))] = [out]
                    self._changed()
                    s = self.stats
                    s.merges += 1
                    s.batches_merged += len(bs)
                    s.rows_in += sum(len(b) for b in bs)
                    s.rows_out += len(out) if out is not None else 0
                    s.merge_seconds += dt
                    self._consolidated = (self._batches_locked(), out)
                    swapped = True
                else:
                    swapped = False
            if swapped:
                self._fire_change()
                return out
        self._consolidated = (bs, out)
        return out

    def lookup(self, probe: CodeArray) -> Optional[OrdIndexedZSet]:
        """The consolidated rows of the sorted distinct key codes ``probe`` (indexed traces only).

        Keys absent from the trace (or whose rows cancel out) are missing from the result.
        Returns None when nothing matches.
        """
        if len(probe) == 0:
            return None
        bs = self.batches()
        for b in bs:
            if not getattr(b, "indexed", isinstance(b, OrdIndexedZSet)):
                raise TypeError("lookup needs an indexed trace (OrdIndexedZSet batches)")
            pre = getattr(b, "prefetch_keys", None)
            if pre is not None:  # file batches start their reads now, all overlapping
                pre(probe)
        parts = []
        for b in bs:
            match = getattr(b, "match", None)
            if match is not None:
                m = match(probe)
                if m is not None:
                    parts.append(m[0].select_keys(m[2]))
                continue
            _, bi = K.intersect(probe, b.kcodes)
            if len(bi):
                parts.append(b.select_keys(bi))
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        m = OrdIndexedZSet.merge(parts)
        return m if len(m) else None

    def weights_of(self, codes: CodeArray) -> np.ndarray:
        """The total weight of each of the sorted distinct row codes (Z-set traces only), summed
        modulo 2**64 (:meth:`weight_parts` gives the addends, to check the sum)."""
        out = np.zeros(len(codes), np.int64)
        for p in self.weight_parts(codes):
            out += p
        return out

    def weight_parts(self, codes: CodeArray) -> list[np.ndarray]:
        """Per batch, the weight of each of the sorted distinct row codes (0 where absent)."""
        parts: list[np.ndarray] = []
        self._filtered = True
        if len(codes) == 0:
            return parts
        for b in self.batches():
            if getattr(b, "indexed", isinstance(b, OrdIndexedZSet)):
                raise TypeError("weights_of needs a Z-set trace (OrdZSet batches)")
            rw = getattr(b, "row_weights", None)
            if rw is not None:
                parts.append(np.asarray(rw(codes), np.int64))
                continue
            out = np.zeros(len(codes), np.int64)
            ai, bi = K.intersect(codes, b.codes)
            if len(ai):
                out[ai] = b.weights[bi]
            parts.append(out)
        return parts
