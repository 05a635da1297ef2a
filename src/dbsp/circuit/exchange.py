"""The exchange: where a key lives, and how workers hand each other the rows that live elsewhere.

One home for the concept, below the operators and the runtime:

* **the sharding function** :func:`shard_rows`: a key lives on worker ``hash(code) % W``
  (:func:`dbsp.algebra.kernels.shard` over the key's normalized code, the same in every process);
  the exchange operator (:mod:`dbsp.operators.exchange`) and the driver's input placement
  (:mod:`dbsp.runtime.placement`) both ask it, so they always agree;
* **dealing rows** :func:`deal`: the rows of a record batch for each worker, by the hash of some
  of its columns encoded as the exchange after ``index_by`` encodes them;
* **the transport interface** :class:`Transport`: how W worker replicas swap parts. All workers
  call it in the same order (the circuits are identical and step in lockstep), so a call is
  identified by its sequence number. Implementations live in the runtime: threads of one process
  (:class:`dbsp.runtime.threads.InProcTransport`), a socket mesh between processes or hosts
  (:class:`dbsp.runtime.socket_transport.SocketTransport`).
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import CodeArray, codec_for

__all__ = ["Transport", "TransportAborted", "shard_rows", "deal"]


class Transport(Protocol):
    """What the exchange operator needs from the runtime."""

    workers: int

    def exchange(self, worker: int, parts: Sequence[Any]) -> list[Any]:
        """Send ``parts[j]`` to worker ``j``; return the parts every worker sent to ``worker``."""

    def all_gather(self, worker: int, value: Any) -> list[Any]:
        """Every worker's ``value``, in worker order."""

    def abort(self) -> None:
        """Wake every worker blocked in the transport with an error (a worker failed)."""


class TransportAborted(RuntimeError):
    """Another worker failed while this one waited in an exchange."""


def shard_rows(codes: CodeArray, workers: int) -> list[np.ndarray]:
    """The row indices (ascending) of ``codes`` that go to each of ``workers`` workers: the one
    definition of "where a key lives" that exchanges and the driver's input placement share."""
    dest = K.shard(codes, workers)
    return [np.flatnonzero(dest == w) for w in range(workers)]


def deal(data: pa.RecordBatch, key: tuple, workers: int) -> list[np.ndarray]:
    """Row indices of ``data`` for each worker, by the hash of ``key`` = ``(column names, key
    schema)`` as the exchange after ``index_by(names)`` computes it."""
    names, schema = key
    cols = data.select(list(names)).columns
    return shard_rows(codec_for(schema).encode(cols, data.num_rows), workers)
