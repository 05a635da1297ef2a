"""dbsp: incremental view maintenance (DBSP) for Python.

Describe a query once; every step, dbsp turns a batch of input changes (a Z-set: rows with
integer weights, +1 insert, -1 delete) into the exact changes of every output, doing work
proportional to the change.

The package, bottom up:

* ``dbsp._native`` (Cython, ``src/_native``): key codes, radix sort + consolidation, k-way
  merge, galloping seek, join expansion, hashing; the slab buffer pool, block checksums,
  io_uring reads. Typed, GIL released.
* :mod:`dbsp.algebra`: schemas and input validation, normalized key codes, the kernel contract
  (:mod:`~dbsp.algebra.kernels_ref` specifies what the native kernels compute).
* :mod:`dbsp.trace`: batches (``ZSet``, ``OrdZSet``, ``OrdIndexedZSet``, timed batches) over
  Arrow record batches, batches in layer files (``FileOrdZSet``, ``FileOrdIndexedZSet``), cursors,
  streaming merges, and the spine (the LSM trace of operator state).
* :mod:`dbsp.storage`: layer files, storage backends (mmap, io_uring, pread), buffer pool, and
  ``StorageConfig`` / the memory accountant: ``Circuit(storage=StorageConfig(dir,
  memory_budget_bytes=...))`` keeps state beyond the budget on disk.
* :mod:`dbsp.circuit` and :mod:`dbsp.operators`: the circuit (one replica per worker, stepping
  in lockstep) and one module per operator.
* :mod:`dbsp.runtime`: exchange transports (in-process, sockets) and worker processes.
* :mod:`dbsp.api`: the fluent API (``StreamContext``, column expressions, windows).
* :mod:`dbsp.nexmark`, :mod:`dbsp.cli`: the Nexmark benchmark and the ``dbsp`` command.
* :mod:`dbsp.testing`: the naive reference model every operator is tested against.

>>> import pyarrow as pa
>>> from dbsp import StreamContext, col, sum_
>>> ctx = StreamContext()
>>> sales = ctx.stream(pa.schema([("shop", pa.string()), ("amount", pa.int64())]), name="sales")
>>> totals = sales.filter(col("amount") > 0).group_by("shop").agg(total=sum_("amount")).collect()
>>> _ = sales.insert([("a", 5), ("a", 7), ("b", 1)]); _ = ctx.step()
>>> sorted(totals.delta_dict().items())
[(('a', 12), 1), (('b', 1), 1)]
>>> _ = sales.delete([("a", 7)]); _ = ctx.step()
>>> sorted(totals.delta_dict().items())
[(('a', 5), 1), (('a', 12), -1)]
"""

__version__ = "0.1.0"

from .algebra.schema import WEIGHT, InputError  # noqa: E402
from .api import (StreamContext, avg, coalesce, col, count, count_distinct,  # noqa: E402
                  hopping, lit, max_, min_, session, sum_, tumbling, when)
from .circuit.graph import CircuitError  # noqa: E402
from .runtime.circuit import Circuit  # noqa: E402
from .storage.config import StorageConfig  # noqa: E402
from .trace.batch import OrdIndexedZSet, OrdZSet, ZSet  # noqa: E402

__all__ = ["Circuit", "CircuitError", "InputError", "WEIGHT", "ZSet", "OrdZSet", "OrdIndexedZSet",
           "StorageConfig",
           "StreamContext", "col", "lit", "when", "coalesce", "count", "sum_", "avg", "min_",
           "max_", "count_distinct", "tumbling", "hopping", "session"]
