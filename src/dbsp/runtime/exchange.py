"""Exchange transports: how W worker replicas hand each other batches.

The exchange operator (:mod:`dbsp.operators.exchange`) re-shards a stream by key hash: every
worker splits its batch into one part per worker, hands the parts to the transport, and receives
one part from every worker. All workers call the transport in the same order (the circuits are
identical and step in lockstep), so a call is identified by its sequence number.

Implementations:

* :class:`InProcTransport` – threads of one process; parts are passed by reference (zero copy).
* a TCP transport (Arrow IPC over a socket mesh) is what the Spark runtime uses between hosts.
"""
from __future__ import annotations

import threading
from typing import Any, Protocol, Sequence


class Transport(Protocol):
    workers: int

    def exchange(self, worker: int, parts: Sequence[Any]) -> list[Any]:
        """Send ``parts[j]`` to worker ``j``; return the parts every worker sent to ``worker``."""

    def all_gather(self, worker: int, value: Any) -> list[Any]:
        """Every worker's ``value``, in worker order."""

    def abort(self) -> None:
        """Wake every worker blocked in the transport with an error (a worker failed)."""


class TransportAborted(RuntimeError):
    """Another worker failed while this one waited in an exchange."""


class InProcTransport:
    """Exchange between threads of one process, through a shared mailbox and a barrier."""

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
        self._barrier = threading.Barrier(self.workers)
