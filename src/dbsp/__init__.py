"""dbsp: incremental view maintenance (DBSP) for Python.

Describe a query once; every step, dbsp turns a batch of input changes (a Z-set: rows with
integer weights, +1 insert, -1 delete) into the exact changes of every output, doing work
proportional to the change.

The package, bottom up (imports only go down; ``lint-imports`` checks it):

* ``dbsp._native`` (Cython, ``src/_native``): key codes, radix sort + consolidation, k-way
  merge, galloping seek, join expansion, hashing; the slab buffer pool, block checksums,
  io_uring reads. Typed, GIL released.
* :mod:`dbsp.algebra`: key codes, kernels, schemas and input validation, the type system, time
  helpers.
* :mod:`dbsp.storage`: layer files, storage backends (mmap, io_uring, pread), buffer pool, the
  per-worker directory and disk gate, ``StorageConfig``. Knows no batch or spine.
* :mod:`dbsp.trace`: batches (``ZSet``, ``OrdZSet``, ``OrdIndexedZSet``, timed batches) over
  Arrow record batches, batches in layer files, cursors, streaming merges, the spine (the LSM
  trace of operator state) and the spilling policy that keeps it within a memory budget.
* :mod:`dbsp.circuit`: the circuit graph, the scheduler of one worker, the exchange's sharding
  function and transport interface. Knows no operator and no process.
* :mod:`dbsp.operators`: one module per operator, and the stream verbs that add them.
* :mod:`dbsp.runtime`: ``Circuit`` running on W replicas (threads or processes), transports,
  input placement.
* :mod:`dbsp.checkpoint`: the storage directory's checkpoint catalog; saving / restoring a
  circuit's state (spines as lists of immutable batch files), gc, fingerprint.
* :mod:`dbsp.ft`: the durable input log, the output log, exactly-once stepping and recovery
  (restore the last checkpoint + replay the logged input), the coordinator loop.
* :mod:`dbsp.api`: the fluent API (``StreamContext``, column expressions, windows) and
  ``durable(circuit)``.
* :mod:`dbsp.nexmark`, :mod:`dbsp.cli`: the Nexmark benchmark and the ``dbsp`` command.
* :mod:`dbsp.testing`: the naive reference model every operator is tested against, and the
  crash harness (``python -m dbsp.testing.crash``).

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

from ._version import __version__  # noqa: E402

from .algebra.schema import WEIGHT, InputError  # noqa: E402
from .api import (StreamContext, avg, coalesce, col, count, count_distinct,  # noqa: E402
                  hopping, lit, max_, min_, session, sum_, try_divide, tumbling, when)
from .api.durable import durable  # noqa: E402
from .circuit.errors import RowError  # noqa: E402
from .circuit.graph import CircuitError, ClosedError  # noqa: E402
from .runtime.circuit import Circuit  # noqa: E402
from .storage.config import StorageConfig  # noqa: E402
from .trace.batch import OrdIndexedZSet, OrdZSet, ZSet  # noqa: E402

__all__ = ["__version__", "Circuit", "CircuitError", "ClosedError", "RowError", "InputError",
           "WEIGHT", "ZSet", "OrdZSet", "OrdIndexedZSet",
           "StorageConfig", "durable",
           "StreamContext", "col", "lit", "when", "coalesce", "try_divide", "count", "sum_", "avg", "min_",
           "max_", "count_distinct", "tumbling", "hopping", "session"]
