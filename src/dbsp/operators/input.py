"""Input: the stream a user pushes Z-sets into (its handle is the stream itself).

Every push is validated and converted to the input's schema *when it is made*
(:func:`dbsp.algebra.schema.conform`); a refused push raises :class:`InputError` naming the
input, column and row, and leaves the pending data and the circuit untouched. At the next step
the pending rows are split into one part per worker: by the hash of the key of the exchange the
input feeds (:mod:`dbsp.runtime.placement`), else in contiguous slices (the operators that need
co-located keys re-shard themselves).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa

from ..algebra.schema import InputError, conform, concat_batches, take
from ..circuit.exchange import deal
from ..circuit.operator import Operator
from ..circuit.types import ZSetType
from ..trace.batch import ZSet
from .stream import Stream
from .upsert import upsert_push


class InputOperator(Operator):
    name = "input"

    def __init__(self, ctx, schema: pa.Schema):
        super().__init__(ctx)
        self.schema = schema
        self.pending: Optional[ZSet] = None

    def eval(self) -> ZSet:
        z = self.pending if self.pending is not None else ZSet.empty(self.schema)
        self.pending = None
        return z


class InputStream(Stream):
    """An input stream; also the handle to push data into it."""

    __slots__ = ("name", "_pending", "_pending_rows", "_key", "_rows_pushed")

    def push(self, data: Any, weights: Any = None) -> int:
        """Add rows with weights (default 1) for the next step. Returns the rows accepted.

        ``data``: a pyarrow Table / RecordBatch (a ``__weight`` column gives weights), a pandas
        DataFrame, or an iterable of tuples / dicts.
        """
        batch, w = conform(self.name, self.schema, data, weights)
        if batch.num_rows:
            keyed = self._key.indexed(batch, w) if self._key is not None else None
            self._pending.append((batch, w))
            self._pending_rows += batch.num_rows
            self._rows_pushed += batch.num_rows
            if keyed is not None:  # a keyed input remembers its current rows (for upsert)
                self._key.record(keyed)
        return batch.num_rows

    def insert(self, data: Any) -> int:
        """Add rows with weight +1."""
        return self.push(data, None)

    def delete(self, data: Any) -> int:
        """Add rows with weight -1 (retract rows inserted before)."""
        batch, w = conform(self.name, self.schema, data, None)
        return self.push(batch, -w)

    def upsert(self, data: Any, key: Optional[Sequence[str]] = None) -> int:
        """Insert rows, replacing the current rows with the same ``key`` (the last row of a key
        in ``data`` wins). The key is the one given to ``add_input(..., key=...)``, or set by
        the first upsert that passes one (before any other push): see
        :mod:`dbsp.operators.upsert`."""
        return upsert_push(self, data, key)

    @property
    def pending_rows(self) -> int:
        return self._pending_rows

    def take_pending(self) -> Optional[tuple[pa.RecordBatch, np.ndarray]]:
        """Take the rows pushed for the next step as one ``(batch, weights)`` (None if none):
        for an input log, which hands them back with :meth:`put_pending`."""
        parts, self._pending, self._pending_rows = self._pending, [], 0
        if not parts:
            return None
        data = concat_batches(self.schema, [p[0] for p in parts])
        w = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
        return data, w

    def put_pending(self, batch: pa.RecordBatch, weights: np.ndarray,
                    record_keys: bool = False) -> None:
        """Make ``(batch, weights)`` the next step's input as it is: rows logged or taken by
        :meth:`take_pending`. A keyed input's key state recorded them when they were pushed;
        ``record_keys``: record them now (rows replayed from a log into a restored input)."""
        if batch.schema != self.schema:
            raise InputError(f"input '{self.name}': logged rows have schema {batch.schema}, "
                             f"the input {self.schema}")
        if len(weights) != batch.num_rows:
            raise InputError(f"input '{self.name}': {batch.num_rows} rows, {len(weights)} "
                             f"weights")
        weights = np.asarray(weights, dtype=np.int64)
        if record_keys and self._key is not None and batch.num_rows:
            self._key.record(self._key.indexed(batch, weights))
        self._pending.append((batch, weights))
        self._pending_rows += batch.num_rows

    def _split(self, workers: int, key: Optional[tuple] = None) -> list:
        """Take the pending rows: one part per worker (None where empty), dealt by the hash of
        ``key`` (column names, key schema) when the circuit's placement gives one
        (:mod:`dbsp.runtime.placement`), else contiguous slices."""
        parts, self._pending, self._pending_rows = self._pending, [], 0
        if not parts:
            return [None] * workers
        data = concat_batches(self.schema, [p[0] for p in parts])
        w = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
        if key is not None:
            return [ZSet(take(data, idx), w[idx]) if len(idx) else None
                    for idx in deal(data, key, workers)]
        bounds = np.linspace(0, data.num_rows, workers + 1).astype(np.int64)
        out = []
        for i in range(workers):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            out.append(ZSet(data.slice(lo, hi - lo), w[lo:hi]) if hi > lo else None)
        return out


def add_input(circuit, name: str, schema: pa.Schema) -> InputStream:
    s = circuit.add_node(f"input:{name}", lambda ctx: InputOperator(ctx, schema), [],
                         ZSetType(schema), kind="input")
    inp = InputStream(circuit, s.node, s.type)
    inp.name = name
    inp._pending = []
    inp._pending_rows = 0
    inp._key = None  # KeyState of a keyed input (dbsp.operators.upsert)
    inp._rows_pushed = 0
    return inp


__all__ = ["InputStream", "InputOperator", "InputError", "add_input"]
