"""Nexmark: the auction-house streaming benchmark, as inputs and expected outputs.

* :mod:`dbsp.nexmark.generator` -- :class:`NexmarkGenerator`, a seeded, vectorised generator of
  ``person`` / ``auction`` / ``bid`` events as Arrow record batches (chunk-invariant: any split
  of the event range yields the same events).
* :mod:`dbsp.nexmark.source` -- :class:`GeneratorProcesses`, the generator run as a source
  would: in processes of its own, chunks handed over as Arrow IPC in shared memory, read
  zero-copy, in event order.
* :mod:`dbsp.nexmark.reference` -- the queries' precise definitions, their from-scratch results
  computed with DuckDB (:func:`reference_results`, ``pip install dbsp[verify]``) and
  :func:`compare_results` to check an engine's output against them.
* :mod:`dbsp.nexmark.queries` -- q0-q22 written with the fluent API (:data:`queries.QUERIES`),
  as a user would write them.
* :mod:`dbsp.nexmark.cli` -- ``dbsp nexmark``: every query timed end to end (generator
  processes in the loop) and push + step, per worker count, with its own peak RSS, verified against DuckDB.

>>> from dbsp.nexmark import NexmarkGenerator
>>> batch = NexmarkGenerator(seed=0).generate(0, 50)
>>> batch.person.num_rows, batch.auction.num_rows, batch.bid.num_rows
(1, 3, 46)
"""

from .generator import (
    AUCTION_SCHEMA,
    BID_SCHEMA,
    PERSON_SCHEMA,
    NexmarkBatch,
    NexmarkConfig,
    NexmarkGenerator,
    collect_tables,
)
from .reference import QUERIES, QUERY_SCHEMAS, compare_results, reference_results

__all__ = [
    "AUCTION_SCHEMA",
    "BID_SCHEMA",
    "PERSON_SCHEMA",
    "QUERIES",
    "QUERY_SCHEMAS",
    "NexmarkBatch",
    "NexmarkConfig",
    "NexmarkGenerator",
    "collect_tables",
    "compare_results",
    "reference_results",
]
