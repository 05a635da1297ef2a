"""Worker replicas as threads of one process, and the transport between them.

``runtime="threads"``: one worker steps inline in the driver's thread; W > 1 workers are one
persistent thread each, stepping in lockstep with the driver through two barriers. Native
kernels run in parallel; the Python glue between them shares the GIL. Exchanges meet in an
:class:`InProcTransport`: parts are passed by reference (zero copy).
"""
from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

from ..circuit.exchange import TransportAborted
from ..circuit.scheduler import Scheduler

__all__ = ["ThreadPool", "InProcTransport"]


class InProcTransport:
    """Exchange between threads of one process, through a shared mailbox and a barrier
    (implements :class:`dbsp.circuit.exchange.Transport`)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._box: list[list[Any]] = [[None] * workers for _ in range(workers)]
        self._barrier = threading.Barrier(workers)

    def _wait(self) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            raise TransportAborted("another worker failed during an exchange") from None

    def exchange(self, worker: int, parts: Sequence[Any]) -> list[Any]:
        if self.workers == 1:
            return [parts[0]]
        if len(parts) != self.workers:
            raise ValueError(f"{len(parts)} parts for {self.workers} workers")
        self._box[worker] = list(parts)
        self._wait()
        got = [self._box[src][worker] for src in range(self.workers)]
        self._wait()  # everyone has read before the mailbox is reused
        return got

    def all_gather(self, worker: int, value: Any) -> list[Any]:
        return self.exchange(worker, [value] * self.workers)

    def abort(self) -> None:
        self._barrier.abort()

    def reset(self) -> None:
        """After an aborted step (every worker has left it): a fresh barrier and mailbox."""
        self._barrier = threading.Barrier(self.workers)
        self._box = [[None] * self.workers for _ in range(self.workers)]


class ThreadPool:
    """W replicas in one process: inline for one worker, else one persistent thread each,
    stepping in lockstep with the driver."""

    def __init__(self, replicas: list[Scheduler], transport: Any):
        self.replicas = replicas
        self.transport = transport
        n = len(replicas)
        self._errors: list[Optional[BaseException]] = [None] * n
        self._stop = False
        self.broken: Optional[BaseException] = None  # a rollback that failed
        self._threads: list[threading.Thread] = []
        if n > 1:
            self._go = threading.Barrier(n + 1)
            self._done = threading.Barrier(n + 1)
            self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True,
                                              name=f"dbsp-worker-{i}") for i in range(n)]
            for t in self._threads:
                t.start()

    def _run(self, i: int) -> None:
        while True:
            try:
                self._go.wait()
            except threading.BrokenBarrierError:
                return
            if self._stop:
                return
            try:
                self.replicas[i].step()
            except BaseException as e:  # reported by the driver
                self._errors[i] = e
                try:
                    self.transport.abort()
                except Exception:
                    pass
            try:
                self._done.wait()
            except threading.BrokenBarrierError:
                return

    def step(self, inputs: list[dict], check=None) -> list[dict]:
        """Run one step on every replica; ``check(outputs)`` may refuse it before it commits
        (it is then rolled back like a step that failed)."""
        for r, inp in zip(self.replicas, inputs):
            r.feed(inp)
        if not self._threads:
            try:
                self.replicas[0].step()
            except BaseException:
                self.rollback()
                raise
        else:
            self._errors = [None] * len(self.replicas)
            self._go.wait()
            self._done.wait()
            errs = [e for e in self._errors if e is not None]
            if errs:
                self.rollback()
                real = [e for e in errs if not isinstance(e, TransportAborted)]
                raise (real or errs)[0]
        outs = [r.take_outputs() for r in self.replicas]
        if check is not None:
            try:
                check(outs)
            except BaseException:
                self.rollback()
                raise
        for r in self.replicas:
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
        if not self._threads:
            return
        self._stop = True
        try:
            self._go.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []
