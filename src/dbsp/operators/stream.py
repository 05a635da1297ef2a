"""Streams: the edges of a circuit, and the verbs that add operators to it.

This is the operator layer's face: each verb is a method here and an operator module there, so
the circuit layer below knows no operator (a graph makes its stream handles through
:func:`make_stream`, given to it by whoever builds the graph).

``Stream`` carries Z-sets over a schema; ``IndexedStream`` carries indexed Z-sets (key -> values),
made by :meth:`Stream.index_by`. Each verb appends one operator (see :mod:`dbsp.operators`, one
module per operator) and returns the new stream. Vectorised functions (taking and returning Arrow
record batches / arrays) are the fast path; the ``*_rows`` variants call a Python function per
row and are much slower.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import pyarrow as pa

from ..circuit.types import IndexedType, ZSetType
from .aggregate import aggregate
from .consolidate import consolidate
from .delay import delay
from .differentiate import differentiate
from .distinct import distinct
from .exchange import shard
from .filter import filter_batches, filter_rows
from .flat_map import flat_map_batches, flat_map_rows
from .index import flatten, index_by
from .integrate import integrate
from .join import antijoin, join, left_join, semijoin
from .lookup_join import lookup_join
from .map import map_batches, map_rows
from .neg import neg
from .output import output
from .plus import minus, plus
from .topk import topk, topk_prefilter


def make_stream(circuit, node: int, type_):
    """The handle of node ``node``'s stream in ``circuit``: indexed or not, by its type."""
    if isinstance(type_, IndexedType):
        return IndexedStream(circuit, node, type_)
    return Stream(circuit, node, type_)


class _Base:
    __slots__ = ("circuit", "node", "type")

    def __init__(self, circuit, node: int, type_):
        self.circuit = circuit
        self.node = node
        self.type = type_

    def __repr__(self) -> str:
        return f"<{type(self).__name__} #{self.node} {self.type.describe()}>"

    # -- linear, both kinds ---------------------------------------------------------------
    def plus(self, *others: "_Base"):
        """``a + b + ...`` (Z-set sum)."""
        return plus(self, *others)

    def minus(self, other: "_Base"):
        """``a - b``."""
        return minus(self, other)

    def neg(self):
        """``-a``: every weight negated."""
        return neg(self)

    def delay(self):
        """``z^-1(a)``: the previous step's value (empty at the first step)."""
        return delay(self)

    def integrate(self):
        """``I(a)[t] = sum(a[0..t])`` as a consolidated batch each step."""
        return integrate(self)

    def differentiate(self):
        """``D(a) = a - z^-1(a)``."""
        return differentiate(self)

    def output(self, name: Optional[str] = None, view: bool = True):
        """An :class:`~dbsp.operators.output.OutputHandle` collecting this stream.

        ``view=True`` also maintains the integrated view (all deltas so far).
        """
        return output(self, name, view)


class Stream(_Base):
    """A stream of Z-sets over :attr:`schema`."""

    __slots__ = ()

    @property
    def schema(self) -> pa.Schema:
        return self.type.schema

    # -- linear ---------------------------------------------------------------------------
    def map(self, fn: Callable[[pa.RecordBatch], Any], schema: Any = None):
        """Vectorised map: ``fn(batch) -> RecordBatch | Table | dict of arrays`` (same row count).

        ``schema`` is the output schema (inferred from a trial on an empty batch when omitted).
        """
        return map_batches(self, fn, schema)

    def map_rows(self, fn: Callable[[tuple], tuple], schema: Any):
        """Per-row map (slow path): ``fn(row_tuple) -> row_tuple`` of ``schema``."""
        return map_rows(self, fn, schema)

    def filter(self, pred: Callable[[pa.RecordBatch], Any]):
        """Keep rows where the vectorised predicate ``pred(batch) -> bool array`` is true."""
        return filter_batches(self, pred)

    def filter_rows(self, pred: Callable[[tuple], bool]):
        """Per-row filter (slow path)."""
        return filter_rows(self, pred)

    def flat_map(self, fn: Callable[[pa.RecordBatch], Any], schema: Any):
        """Vectorised flat map: ``fn(batch) -> (out_batch, parent)`` where ``parent[i]`` is the
        input row that output row ``i`` comes from (its weight is inherited)."""
        return flat_map_batches(self, fn, schema)

    def flat_map_rows(self, fn: Callable[[tuple], Sequence[tuple]], schema: Any):
        """Per-row flat map (slow path): ``fn(row) -> iterable of rows``."""
        return flat_map_rows(self, fn, schema)

    def index_by(self, key: Sequence[str]) -> "IndexedStream":
        """Index rows by the ``key`` columns: ``key -> remaining columns``."""
        return index_by(self, key)

    def consolidate(self) -> "Stream":
        """Sort and consolidate each delta (loose Z-sets become :class:`OrdZSet`)."""
        return consolidate(self)

    # -- non-linear -----------------------------------------------------------------------
    def distinct(self) -> "Stream":
        """``distinct(a)``: every row with positive weight, with weight 1 (incremental)."""
        return distinct(self)

    def shard(self) -> "Stream":
        """Re-shard rows by the hash of the whole row (exchange between workers)."""
        return shard(self)

    def topk_prefilter(self, key: Sequence[str], first: str, k: int) -> Stream:
        """The rows of an insert-only stream that may still enter a top ``k`` per ``key``
        ordered by ``first`` ascending first (for an append-only :meth:`topk`; see
        :class:`~dbsp.operators.topk.TopKPrefilterOperator`)."""
        return topk_prefilter(self, key, first, k)


class IndexedStream(_Base):
    """A stream of indexed Z-sets ``key -> value``."""

    __slots__ = ()

    @property
    def key_schema(self) -> pa.Schema:
        return self.type.key

    @property
    def val_schema(self) -> pa.Schema:
        return self.type.val

    def flatten(self) -> Stream:
        """Rows ``key ++ value``."""
        return flatten(self)

    def shard(self) -> "IndexedStream":
        """Re-shard by key hash so that each key lives on one worker."""
        return shard(self)

    def join(self, other: "IndexedStream", fn: Optional[Callable] = None,
             schema: Any = None, watermarks: Any = None, band: Any = None) -> Stream:
        """Incremental inner join on the key.

        Output rows are ``key ++ left values ++ right values`` (right columns whose names clash
        get the suffix ``_right``), or ``fn(keys, left_vals, right_vals) -> RecordBatch`` of
        ``schema`` (vectorised over all matched pairs). ``watermarks``: ``(left, right)``
        watermark streams of the leading key column; each side's state is then dropped below
        the other side's watermark (:mod:`dbsp.operators.join`). ``band``: ``(left, right)``,
        each None or ``(value column, other side's watermark)``: band GC (the module doc).
        """
        return join(self, other, fn, schema, watermarks, band)

    def left_join(self, other: "IndexedStream", fn: Optional[Callable] = None,
                  schema: Any = None, watermarks: Any = None) -> Stream:
        """Left outer join: unmatched left rows get nulls for the right columns."""
        return left_join(self, other, fn, schema, watermarks)

    def lookup_join(self, other: "IndexedStream") -> Stream:
        """Each change of this stream joined with ``other`` as it is at that step (a lookup /
        processing-time temporal join: ``Δa ⋈ I(b)``, past output not revised when ``other``
        changes; this side is not stored). Rows as :meth:`join`'s."""
        return lookup_join(self, other)

    def semijoin(self, other: "IndexedStream", watermarks: Any = None) -> Stream:
        """Left rows whose key is present (positive weight) on the right."""
        return semijoin(self, other, watermarks)

    def antijoin(self, other: "IndexedStream", watermarks: Any = None) -> Stream:
        """Left rows whose key is absent on the right."""
        return antijoin(self, other, watermarks)

    def aggregate(self, aggs: dict, positive: bool = False, filtered: Sequence = ()) -> Stream:
        """Group by the key and aggregate values: ``{"out": ("sum", "price"), ...}``.

        Built-ins: count (``("count", None)`` counts rows, ``("count", col)`` non-null values),
        sum, min, max, avg, count_distinct; or an :class:`~dbsp.operators.aggregate.Aggregator`.
        Output rows are ``key ++ aggregates``, one per key with a non-zero total weight.
        ``positive``: the input is a multiset (SQL), so a group whose total weight would become
        negative (a row deleted that was never inserted) is an error, or under
        ``skip_and_report`` its rows are set aside (Z-set algebra allows it: off by default).
        ``filtered``: value columns derived from a condition column per step
        (:class:`~dbsp.operators.aggregate.Filtered`), named in ``aggs`` like value columns.
        """
        return aggregate(self, aggs, positive, filtered)

    def topk(self, k: int, order_by: Sequence[str], descending: Any = False,
             rank: Optional[str] = None, append_only: bool = False) -> Stream:
        """The first ``k`` values of each key by ``order_by`` (optionally with a rank column);
        ``descending``: one bool, or one per ``order_by`` column; ``append_only``: the input
        never deletes (state: each key's top ``k`` only; a deletion is an error)."""
        return topk(self, k, order_by, descending, rank, append_only)


__all__ = ["Stream", "IndexedStream", "ZSetType", "IndexedType", "make_stream"]
