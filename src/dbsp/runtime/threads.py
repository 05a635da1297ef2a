"""Worker replicas as threads of one process, and the transport between them.

``runtime="threads"``: worker 0 steps inline in the driver's thread; with W > 1 the workers
``1..W-1`` are one persistent thread each, stepping in lockstep with the driver: each waits on
a lock of its own that the driver releases to start a step, and releases another when done (a
handoff of two C-level locks a worker and step, where a barrier of W + 1 parties is a Python
condition variable that every party, the driver idling in it too, enters twice a step). In
large steps native kernels run in parallel; the Python glue between them shares the GIL. Exchanges meet in an
:class:`InProcTransport`: parts are passed by reference (zero copy), and the workers meet at a
:class:`Gate` (C-level locks: one wake-up a waiting worker, where ``threading.Barrier`` is a
condition variable whose woken waiters then contend for its lock).

*Small steps* (fewer than :data:`SERIAL_ROWS` input rows on every worker) run every worker in
the driver's thread, one at a time, each a greenlet (a C stack of its own, switched in user
space): a worker runs until it must wait, at an exchange's gate or at the end of its step, and
then switches to the next one. Run on their threads side by side, two workers of a small step
overlap only in short native kernels, and every release of the GIL there (every ``with nogil``
of ours, every Arrow import or export) wakes the other worker, then waits to take it back: two
context switches (a lock round trip between two threads costs 13-17 us of CPU on the 2-core VM,
mostly system time), and the interpreter's working set moved to the other core, for kernels of
a few microseconds. Handing a lock (a *baton*) from thread to thread at the gates only, as this
runtime did before, still paid a kernel wake-up and a cold core at every gate: join_avg's
10K-event steps cost 1.47-1.68x the CPU of one worker with the baton, 1.13-1.38x as greenlets
(``bench/workloads/_efficiency.py``). Per-worker state that must not be shared lives in context
variables (each greenlet has its own context), not in ``threading.local``.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Optional, Sequence

from greenlet import getcurrent, greenlet

from ..circuit.exchange import TransportAborted
from ..circuit.scheduler import Scheduler
from ..storage.osthreads import name_os_thread

__all__ = ["ThreadPool", "InProcTransport", "Gate", "SERIAL_ROWS"]

#: input rows a worker and step below which the workers of a step run one at a time in the
#: driver's thread (module doc; ``ThreadPool(serial_rows=)``, ``DBSP_THREADS_SERIAL_ROWS``, 0:
#: never): the same bound as the native kernels' ``NOGIL_MIN`` (``hashing.pyx``), under which a
#: kernel's loop is cheaper than a hand-off of the GIL
SERIAL_ROWS = 1 << 14


class Gate:
    """A reusable barrier of ``n`` threads, each with its own number ``0..n-1``, made of C-level
    locks: every thread but the last to arrive blocks on a lock of its own; the last opens
    every other's (one wake-up each, and the woken thread goes straight on: no shared
    condition lock to contend for on the way out, as ``threading.Barrier`` has, and a few
    bytecodes where that runs a hundred lines of Python). A thread's lock is opened once a
    round and taken once a round, so a thread already in the next round cannot be let
    through by this one's opening.

    :meth:`abort` wakes every waiter and makes every later :meth:`wait` raise
    ``threading.BrokenBarrierError`` (a gate is not reused after an abort: make a new one).

    ``serial``: the waiters are greenlets of one thread (a small step, see the module doc): one
    that must wait switches back to the loop that runs them (its parent greenlet) until its
    lock is open, instead of blocking the thread."""

    __slots__ = ("n", "_mutex", "_arrived", "_locks", "_broken", "serial")

    def __init__(self, n: int, serial: bool = False):
        if n < 1:
            raise ValueError(f"Gate: n must be >= 1, got {n}")
        self.n = n
        self._mutex = threading.Lock()
        self._arrived = 0
        self._locks = [threading.Lock() for _ in range(n)]
        for lk in self._locks:
            lk.acquire()
        self._broken = False
        self.serial = serial

    def wait(self, me: int) -> None:
        """Block thread ``me`` until all ``n`` threads have called :meth:`wait` this round."""
        if self._broken:
            raise threading.BrokenBarrierError
        with self._mutex:
            self._arrived += 1
            last = self._arrived == self.n
            if last:
                self._arrived = 0
        if last:
            locks = self._locks
            for i in range(self.n):
                if i != me:
                    try:
                        locks[i].release()
                    except RuntimeError:  # abort() opened it meanwhile
                        if not self._broken:
                            raise
            return
        lock = self._locks[me]
        if self.serial:  # the other workers run (in this thread) until this one may go on
            while not lock.acquire(False):
                getcurrent().parent.switch()
        else:
            lock.acquire()
        if self._broken:
            raise threading.BrokenBarrierError

    def abort(self) -> None:
        self._broken = True
        for lk in self._locks:
            try:
                lk.release()
            except RuntimeError:  # open already (its thread was let through)
                pass


class InProcTransport:
    """Exchange between threads of one process, through shared mailboxes and a barrier
    (implements :class:`dbsp.circuit.exchange.Transport`).

    Two mailboxes, used by turns (each worker counts its exchanges; all count alike): a worker
    posts its parts in the mailbox of this turn, waits once at the barrier, and reads what the
    others posted. It posts in the same mailbox again only two exchanges later, after passing
    the barrier of the exchange in between, which every other worker reached only once done
    reading this one: so one barrier an exchange, not two (one to post, one to free the box)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._serial = False
        self.reset()

    def _wait(self, worker: int) -> None:
        try:
            self._barrier.wait(worker)
        except threading.BrokenBarrierError:
            raise TransportAborted("another worker failed during an exchange") from None

    def exchange(self, worker: int, parts: Sequence[Any]) -> list[Any]:
        if self.workers == 1:
            return [parts[0]]
        if len(parts) != self.workers:
            raise ValueError(f"{len(parts)} parts for {self.workers} workers")
        turn = self._turns[worker]
        self._turns[worker] = turn + 1
        box = self._boxes[turn & 1]
        box[worker] = parts
        self._wait(worker)
        return [box[src][worker] for src in range(self.workers)]

    def all_gather(self, worker: int, value: Any) -> list[Any]:
        return self.exchange(worker, [value] * self.workers)

    def abort(self) -> None:
        self._barrier.abort()

    def set_serial(self, serial: bool) -> None:
        """Whether the workers of the coming exchanges are greenlets of one thread (see
        :class:`Gate`). Between steps only."""
        self._serial = self._barrier.serial = serial

    def reset(self) -> None:
        """A fresh barrier and mailboxes (at the start, and after an aborted step, when every
        worker has left it)."""
        self._barrier = Gate(self.workers, self._serial)
        self._boxes: list[list[Any]] = [[None] * self.workers for _ in range(2)]
        self._turns = [0] * self.workers


#: what a worker's greenlet hands the loop of :meth:`ThreadPool._step_serial` when its step is
#: over (a worker waiting at a gate switches back with nothing)
_STEP_DONE = object()


class ThreadPool:
    """W replicas in one process: worker 0 inline in the caller's thread, the others one
    persistent thread each, stepping in lockstep with it; a step of fewer than ``serial_rows``
    input rows on every worker runs them one at a time in the caller's thread, as greenlets
    (see the module doc; 0: never; None: ``DBSP_THREADS_SERIAL_ROWS``, else
    :data:`SERIAL_ROWS`)."""

    def __init__(self, replicas: list[Scheduler], transport: Any,
                 serial_rows: Optional[int] = None):
        self.replicas = replicas
        self.transport = transport
        n = len(replicas)
        self._errors: list[Optional[BaseException]] = [None] * n
        self._stop = False
        self.broken: Optional[BaseException] = None  # a rollback that failed
        self._threads: list[threading.Thread] = []
        # small steps as greenlets, where the transport's gates can switch them (in-process
        # exchanges only)
        if serial_rows is None:
            serial_rows = int(os.environ.get("DBSP_THREADS_SERIAL_ROWS", SERIAL_ROWS))
        self.serial_rows = serial_rows if isinstance(transport, InProcTransport) else 0
        self._serial = False
        # the workers' greenlets of small steps, kept from step to step (see _step_serial), and
        # the thread they belong to
        self._gls: Optional[list] = None
        self._gl_thread: Optional[int] = None
        # worker i >= 1 steps once each time the driver releases _go[i] and releases _done[i]
        # when it has; between steps the driver holds both
        self._go = [threading.Lock() for _ in range(n)]
        self._done = [threading.Lock() for _ in range(n)]
        for i in range(1, n):
            self._go[i].acquire()
            self._done[i].acquire()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True,
                                          name=f"dbsp-worker-{i}") for i in range(1, n)]
        for t in self._threads:
            t.start()

    def _run(self, i: int) -> None:
        name_os_thread()
        go, done = self._go[i], self._done[i]
        while True:
            go.acquire()
            if self._stop:
                done.release()
                return
            self._step_one(i)
            done.release()

    def _step_one(self, i: int) -> None:
        try:
            self.replicas[i].step()
        except BaseException as e:  # reported by the driver
            self._errors[i] = e
            try:
                self.transport.abort()  # wake the workers waiting in an exchange
            except Exception:
                pass

    def _step_serial(self) -> None:
        """Every worker's step in this thread, one greenlet each, run in turns: each runs until
        it waits at a gate (it switches back here) or its step is over.

        The greenlets live from step to step (:meth:`_serial_worker`), made again only for
        another thread (a greenlet runs in the thread that made it) or after one ended: a new
        greenlet costs CPython a frame stack of its own, a 16 KiB ``mmap`` whose pages fault in
        and a ``munmap`` when the greenlet is gone (strace of 200 two-worker steps of join_avg:
        400 of each; a bare loop of two workers' turns cost 23.6 us a step with new greenlets
        and 3.1 us with kept ones on the 2-core VM). A worker's greenlet switches back here with
        :data:`_STEP_DONE` when its step is over, with nothing when it waits at a gate."""
        reps = self.replicas
        gls = self._gls
        if gls is None or self._gl_thread != threading.get_ident() or \
                any(g.dead for g in gls):
            gls = self._gls = [greenlet(self._serial_worker) for _ in reps]
            self._gl_thread = threading.get_ident()
        me = getcurrent()
        for g in gls:
            g.parent = me  # (where a worker switches back to: whoever runs this step)
        # a worker's operator clock must not count the others' turns while it waited at a gate
        discount = [getattr(r, "discount", None) for r in reps]
        clock = Scheduler.clock
        left: list = [None] * len(gls)  # when each worker switched out
        live: Sequence[int] = range(len(gls))
        while live:
            waiting = []
            for i in live:
                if left[i] is not None and discount[i] is not None:
                    discount[i](clock() - left[i])
                if gls[i].switch(i) is not _STEP_DONE:
                    waiting.append(i)
                left[i] = clock()
            live = waiting

    def _serial_worker(self, i: int) -> None:
        """The body of worker ``i``'s greenlet (:meth:`_step_serial`): one step each time the
        driver's loop switches to it after the last one ended."""
        while True:
            self._step_one(i)
            getcurrent().parent.switch(_STEP_DONE)

    def step(self, inputs: list[dict], check=None) -> list[dict]:
        """Run one step on every replica; ``check(outputs)`` may refuse it before it commits
        (it is then rolled back like a step that failed)."""
        replicas = self.replicas
        for r, inp in zip(replicas, inputs):
            r.feed(inp)
        if not self._threads:
            try:
                replicas[0].step()
            except BaseException:
                self.rollback()
                raise
        else:
            self._errors = [None] * len(self.replicas)
            serial = max(_rows(inp) for inp in inputs) < self.serial_rows
            if serial != self._serial:
                self._serial = serial
                self.transport.set_serial(serial)
            if serial:
                self._step_serial()
            else:
                for go in self._go[1:]:
                    go.release()
                self._step_one(0)
                for done in self._done[1:]:
                    done.acquire()
            errs = [e for e in self._errors if e is not None]
            if errs:
                self.rollback()
                real = [e for e in errs if not isinstance(e, TransportAborted)]
                raise (real or errs)[0]
        outs = [replicas[0].take_outputs()] if len(replicas) == 1 else \
            [r.take_outputs() for r in replicas]
        if check is not None:
            try:
                check(outs)
            except BaseException:
                self.rollback()
                raise
        for r in replicas:
            r.commit()
        return outs

    def rollback(self) -> None:
        """Undo the failed step on every replica and make the transport usable again."""
        try:
            for r in self.replicas:
                r.rollback()
            reset = getattr(self.transport, "reset", None)
            if reset is not None:
                reset()
        except BaseException as e:
            self.broken = e

    def call(self, name: str) -> list:
        return [getattr(r, name)() for r in self.replicas]

    def apply(self, fn, *args) -> list:
        """``fn(replica, *args)`` for every replica, in order (between steps)."""
        return [r.apply(fn, *args) for r in self.replicas]

    def close(self) -> None:
        for r in self.replicas:  # merges in flight finish before the circuit is closed
            r.close()
        self._gls = None  # (each idle greenlet is ended where it waits)
        if not self._threads:
            return
        self._stop = True
        for go in self._go[1:]:
            go.release()
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []


def _rows(inputs: Any) -> int:
    """Input rows of one worker's step (``{input node: ZSet}``; anything else counts 0)."""
    n = 0
    if isinstance(inputs, dict):
        for v in inputs.values():
            n += len(v)
    return n
