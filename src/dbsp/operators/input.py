"""Input: the stream a user pushes Z-sets into (its handle is the stream itself).

Every push is validated and converted to the input's schema *when it is made*
(:func:`dbsp.algebra.schema.conform`). What happens to a bad row is the input's error policy
(``errors=``, by default the circuit's, see :mod:`dbsp.circuit.errors`): ``"raise"`` refuses the
whole push with an :class:`InputError` naming the input, column and row, leaving the pending
data and the circuit untouched; ``"skip_and_report"`` accepts the good rows and puts each bad
one, with its reason, in the circuit's error log (:meth:`InputStream.push_checked` gives both
parts to a caller that decides for itself). A closed circuit refuses every push
(:class:`~dbsp.circuit.graph.ClosedError`). At the next step
the pending rows are split into one part per worker: by the hash of the key of the exchange the
input feeds (:mod:`dbsp.runtime.placement`), else in contiguous slices (the operators that need
co-located keys re-shard themselves).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from ..algebra.schema import (WEIGHT, InputError, concat_batches, conform, empty_batch, row_list,
                              take)
from ..circuit.errors import check_policy
from ..circuit.exchange import (SORTED_DEAL_ROWS, as_shard_map, deal_batch, deal_sorted,
                                sorted_plan)
from ..circuit.operator import Operator
from ..circuit.types import ZSetType
from ..trace.batch import KeyedZSet, OrdIndexedZSet, ZSet
from ._values import add
from .stream import Stream
from .upsert import upsert_push


#: the bound on the sum of absolute weights one step of one input may carry: below it, no sum of
#: them wraps (2**63, less a margin for the float rounding of the sum); the state's own checks
#: (distinct, aggregate) take over from there
WEIGHT_LIMIT = float(1 << 63) * (1 - 2.0 ** -40)


class InputOperator(Operator):
    name = "input"

    def __init__(self, ctx, schema: pa.Schema):
        super().__init__(ctx)
        self.schema = schema
        self.pending: Optional[ZSet] = None
        #: the value of a step without input (immutable: built once, not looked up per step)
        self._empty = ZSet.empty(schema)
        #: a sliced input's key ``(column names, key schema)``: its rows reach this worker
        #: wherever they lie in the source, and the workers deal them by that key among
        #: themselves here, so the exchanges downstream are local (set by the replica,
        #: :mod:`dbsp.runtime.placement`); None: the rows stay where they arrived
        self.deal_key: Optional[tuple] = None
        self._type = ZSetType(schema)

    def eval(self) -> ZSet:
        z = self.pending if self.pending is not None else self._empty
        self.pending = None
        if self.deal_key is not None and self.ctx.workers > 1:
            return self._deal(z)
        return z

    def _deal(self, z: ZSet) -> ZSet:
        """This worker's rows of ``z`` and every other worker's, by the hash of
        :attr:`deal_key` (every worker takes part in every step, rows or not)."""
        parts = [None] * self.ctx.workers
        if len(z):
            parts = [None if p is None else ZSet(p[0], p[1])
                     for p in deal_batch(z.data, z.weights, self.deal_key, self.ctx.shards)]
        return add(self._type, self.ctx.transport.exchange(self.ctx.worker, parts))


class InputStream(Stream):
    """An input stream; also the handle to push data into it."""

    __slots__ = ("name", "_pending", "_pending_rows", "_key", "_rows_pushed", "errors",
                 "_pending_mass", "_keyed", "_keyed_taken", "_sorted")

    @property
    def policy(self) -> str:
        """This input's error policy: its own ``errors``, else the circuit's."""
        return self.errors or self.circuit.errors

    def set_errors(self, policy: Optional[str]) -> None:
        self.errors = None if policy is None else check_policy(policy)

    def push(self, data: Any, weights: Any = None) -> int:
        """Add rows with weights (default 1) for the next step. Returns the rows accepted.

        ``data``: a pyarrow Table / RecordBatch (a ``__weight`` column gives weights), a pandas
        DataFrame, or an iterable of tuples / dicts. Bad rows: see the module doc.
        """
        self.circuit.check_open("push into")
        if self.policy == "raise":
            return self._accept(*conform(self.name, self.schema, data, weights))
        n, bad = self.push_checked(data, weights)
        log = self.circuit.error_log
        for b in bad:
            log.add(self.circuit.steps, self.name, b.reason, b.row, b.weight)
        return n

    def push_checked(self, data: Any, weights: Any = None) -> tuple[int, list["BadInput"]]:
        """Push the good rows of ``data``; return ``(rows accepted, the bad rows)``. A push
        whose fault is not one row's (a missing column, weights of the wrong length) raises."""
        self.circuit.check_open("push into")
        batch, w, bad = conform_rows(self.name, self.schema, data, weights)
        return self._accept(batch, w), bad

    def _accept(self, batch: pa.RecordBatch, w: np.ndarray, held: bool = False) -> int:
        """Queue a conformed batch for the next step (``held``: its retractions are rows the
        keyed input holds, as an upsert's are: not checked again)."""
        if batch.num_rows:
            # the weights of one step may be summed in any order (consolidation): refuse a push
            # that would let that sum leave int64, rather than wrap (float: no overflow here)
            mass = self._pending_mass + float(np.abs(w.astype(np.float64)).sum())
            if mass >= WEIGHT_LIMIT:
                raise InputError(self.name, f"the weights of this step's rows add up to {mass:.3g}"
                                            f" in absolute value, beyond the int64 range of "
                                            f"weights (step between such pushes)", WEIGHT)
            keyed = self._key.indexed(batch, w) if self._key is not None else None
            if keyed is not None and not held and (w < 0).any():
                batch, w, keyed = self._never_inserted(batch, w, keyed)
                if not batch.num_rows:
                    return 0
            self._pending_mass = mass
            self._pending.append((batch, w))
            self._pending_rows += batch.num_rows
            self._rows_pushed += batch.num_rows
            if keyed is not None:  # a keyed input remembers its current rows (for upsert)
                self._key.record(keyed)
                self._keyed.append(keyed)
        return batch.num_rows

    def _never_inserted(self, batch: pa.RecordBatch, w: np.ndarray, keyed: Any):
        """A keyed input knows its current rows: a retraction of a row it does not hold (as
        many times) is refused (``raise``: an InputError naming the row, nothing applied) or,
        under ``skip_and_report``, every retraction of that row in this push is set aside."""
        old = self._key.trace.lookup(keyed.kcodes)
        total = keyed if old is None else OrdIndexedZSet.merge([old, keyed])
        neg = total.weights < 0
        if not neg.any():
            return batch, w, keyed
        held = total.flatten()
        bad_rows = {_frozen(r) for r in take(held.data, np.flatnonzero(neg))
                    .select(self.schema.names).to_pylist()}
        rows = batch.to_pylist()
        bad = np.array([wi < 0 and _frozen(r) in bad_rows for r, wi in zip(rows, w)], bool)
        reason = "a row was deleted that was never inserted (the keyed input does not hold it)"
        if self.policy == "raise":
            raise InputError(self.name, f"{reason}: {rows[int(np.flatnonzero(bad)[0])]}",
                             row=int(np.flatnonzero(bad)[0]))
        log = self.circuit.error_log
        for i in np.flatnonzero(bad):
            log.add(self.circuit.steps, self.name, reason, tuple(rows[i].values()), int(w[i]))
        keep = np.flatnonzero(~bad)
        batch, w = take(batch, keep), w[keep]
        return batch, w, (self._key.indexed(batch, w) if len(keep) else None)

    def insert(self, data: Any) -> int:
        """Add rows with weight +1."""
        return self.push(data, None)

    def delete(self, data: Any) -> int:
        """Add rows with weight -1 (retract rows inserted before)."""
        self.circuit.check_open("push into")
        if self.policy == "raise":
            batch, w = conform(self.name, self.schema, data, None)
            return self.push(batch, -w)
        if isinstance(data, (pa.Table, pa.RecordBatch)) and WEIGHT in data.schema.names:
            i = data.schema.get_field_index(WEIGHT)
            neg = pa.compute.negate_checked(data.column(i))
            return self.push(data.set_column(i, WEIGHT, neg))
        return self.push(data, -1)

    def upsert(self, data: Any, key: Optional[Sequence[str]] = None) -> int:
        """Insert rows, replacing the current rows with the same ``key`` (the last row of a key
        in ``data`` wins). The key is the one given to ``add_input(..., key=...)``, or set by
        the first upsert that passes one (before any other push): see
        :mod:`dbsp.operators.upsert`."""
        return upsert_push(self, data, key)

    def _step_done(self, applied: bool) -> None:
        """The step that took the pending rows ended: when it was rolled back (not ``applied``),
        a keyed input forgets the rows it recorded for it, so that its current rows stay the
        circuit's."""
        taken, self._keyed_taken = self._keyed_taken, []
        if not applied:
            for ix in reversed(taken):
                self._key.record(ix.neg())

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

    def _split(self, shards: Any, key: Optional[tuple] = None, sort: bool = True) -> list:
        """Take the pending rows: one part per worker of the layout ``shards`` (a
        :class:`~dbsp.circuit.exchange.ShardMap` or a worker count; None where empty), dealt by
        the hash of ``key`` (column names, key schema) when the circuit's placement gives one
        (:mod:`dbsp.runtime.placement`), else contiguous slices. ``sort`` (the runtime's call:
        not when the workers are processes of their own, which would wait for it): a small
        step's rows dealt by key are sorted for the ``index_by`` of that key
        (:func:`~dbsp.circuit.exchange.deal_sorted`, below
        :data:`~dbsp.circuit.exchange.SORTED_DEAL_ROWS` rows a worker)."""
        shards = as_shard_map(shards)
        workers = shards.workers
        parts, self._pending, self._pending_rows = self._pending, [], 0
        self._pending_mass = 0.0
        self._keyed_taken, self._keyed = self._keyed, []
        if not parts:
            return [None] * workers
        data = concat_batches(self.schema, [p[0] for p in parts])
        w = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
        if key is not None and workers > 1 and sort and \
                data.num_rows < SORTED_DEAL_ROWS * workers:
            # the rows sorted once as the index_by that reads them keeps them, and each
            # worker's copied to its own batch in that order (its index_by neither sorts nor
            # gathers them again)
            names = tuple(key[0])
            if self._sorted[0] != key:   # (worked out once per key, not per step)
                # the workers' split hashes the codes of the exchange's key schema: sorted
                # only when the input's own key columns give the same codes (not where a
                # join recodes one side's keys to the other's nullability)
                own = [(self.schema.field(n).type, self.schema.field(n).nullable)
                       for n in names]
                same = own == [(f.type, f.nullable) for f in key[1]]
                self._sorted = (key, sorted_plan(self.schema, names) if same else None)
            plan = self._sorted[1]
            got = None if plan is None else deal_sorted(data, w, plan, shards)
            if got is not None:
                return [None if p is None else KeyedZSet(p[0], p[1], names, p[2], p[3],
                                                         p[4:7])
                        for p in got]
        if key is not None:   # each worker's rows copied to its own batch in one pass
            return [None if p is None else ZSet(p[0], p[1])
                    for p in deal_batch(data, w, key, shards)]
        if workers == 1:
            return [ZSet(data, w)]
        bounds = np.linspace(0, data.num_rows, workers + 1).astype(np.int64)
        out = []
        for i in range(workers):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            out.append(ZSet(data.slice(lo, hi - lo), w[lo:hi]) if hi > lo else None)
        return out


class BadInput:
    """A row refused at push time: its position in the push, why, its values, its weight."""

    __slots__ = ("index", "reason", "row", "weight", "column")

    def __init__(self, index: int, reason: str, row: Any, weight: int, column: Optional[str]):
        self.index, self.reason, self.row, self.weight = index, reason, row, weight
        self.column = column

    def __repr__(self) -> str:
        return f"BadInput(row {self.index}: {self.reason})"


def _frozen(row: dict) -> tuple:
    """A row (a dict of Python values, nested lists and dicts included) as a hashable tuple."""
    def f(v: Any) -> Any:
        if isinstance(v, list):
            return tuple(f(x) for x in v)
        if isinstance(v, dict):
            return tuple((k, f(x)) for k, x in v.items())
        return v
    return tuple(f(v) for v in row.values())


def _rows_of(data: Any) -> Any:
    """``data`` in a form whose rows can be taken by position: a Table, or a list of rows."""
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return data
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a pandas DataFrame
        try:
            return pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            return data.to_dict("records")  # mixed-type columns: find the bad rows one by one
    return list(data)


def conform_rows(name: str, schema: pa.Schema, data: Any,
                 weights: Any = None) -> tuple[pa.RecordBatch, np.ndarray, list[BadInput]]:
    """Like :func:`~dbsp.algebra.schema.conform`, but a row at fault is set aside instead of
    refusing the push: ``(batch of the good rows, their weights, the bad rows)``.

    The fast path is one ``conform``; only when it refuses a row are the rows converted again,
    by bisection (the error path). Faults that are no one row's raise.
    """
    if not isinstance(data, (pa.Table, pa.RecordBatch)) and \
            not (hasattr(data, "to_dict") and hasattr(data, "columns")):
        data = row_list(name, data)  # an iterator is read once
    try:
        batch, w = conform(name, schema, data, weights)
        return batch, w, []
    except InputError as e:
        if e.row is None:
            raise
        first: Optional[InputError] = e
    rows = _rows_of(data)
    n = rows.num_rows if isinstance(rows, pa.Table) else len(rows)
    if weights is not None and not np.isscalar(weights):
        weights = np.asarray(weights)
        if weights.shape != (n,):
            raise InputError(name, f"{len(weights)} weights for {n} rows", WEIGHT)
    bad: list[BadInput] = []
    parts: list[tuple[pa.RecordBatch, np.ndarray]] = []
    orig = np.arange(n, dtype=np.int64)  # position in the push of each row of ``rows``

    def refused_at(i: int, e: InputError, row: Any) -> None:  # row ``i`` of the push
        if isinstance(weights, np.ndarray):
            wt = int(weights[i])
        elif weights is not None:
            wt = int(weights)
        elif isinstance(row, dict) and WEIGHT in row:
            wt = row[WEIGHT]
        else:
            wt = 1
        bad.append(BadInput(i, str(e), row, wt, e.column))

    def refused(lo: int, e: InputError) -> None:  # row ``lo`` of ``rows`` alone is refused
        row = rows.slice(lo, 1).to_pylist()[0] if isinstance(rows, pa.Table) else rows[lo]
        i = int(orig[lo])
        msg = str(e).split(": ", 1)[-1]  # without the location, which was the slice's
        refused_at(i, InputError(name, msg, e.column, i), row)

    def run(lo: int, hi: int, err: Optional[InputError] = None) -> None:
        """Convert rows [lo, hi), bisecting around refused rows: O(b log n) conversions of
        ever smaller slices for b bad rows among n, in row order."""
        if err is None:
            part = rows.slice(lo, hi - lo) if isinstance(rows, pa.Table) else rows[lo:hi]
            wpart = weights[orig[lo:hi]] if isinstance(weights, np.ndarray) else weights
            try:
                parts.append(conform(name, schema, part, wpart))
                return
            except InputError as e:
                if e.row is None:
                    raise
                err = e
        if hi - lo == 1:
            refused(lo, err)
            return
        mid = (lo + hi) // 2
        run(lo, mid)
        run(mid, hi)

    if isinstance(rows, pa.Table):  # nulls in non-null columns: all at once, vectorised
        null = np.zeros(n, dtype=bool)
        for f in schema:
            if not f.nullable and f.name in rows.column_names and rows.column(f.name).null_count:
                m = np.asarray(rows.column(f.name).is_null().to_numpy(zero_copy_only=False))
                for i in np.flatnonzero(m & ~null):
                    e = InputError(name, "null in a column that is not nullable", f.name, int(i))
                    refused_at(int(i), e, rows.slice(int(i), 1).to_pylist()[0])
                null |= m
        if null.any():
            keep = np.flatnonzero(~null)
            rows, orig = rows.take(pa.array(keep)), keep
            n = len(keep)
            first = None

    if n:
        run(0, n, first)
    bad.sort(key=lambda b: b.index)
    if not parts:
        return empty_batch(schema), np.zeros(0, np.int64), bad
    w = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
    return concat_batches(schema, [p[0] for p in parts]), w, bad


def add_input(circuit, name: str, schema: pa.Schema) -> InputStream:
    s = circuit.add_node(f"input:{name}", lambda ctx: InputOperator(ctx, schema), [],
                         ZSetType(schema), kind="input")
    inp = InputStream(circuit, s.node, s.type)
    inp.name = name
    inp._pending = []
    inp._pending_rows = 0
    inp._key = None  # KeyState of a keyed input (dbsp.operators.upsert)
    inp._rows_pushed = 0
    inp.errors = None  # the circuit's policy
    inp._pending_mass = 0.0  # sum of |weight| pending (checked against WEIGHT_LIMIT)
    inp._keyed, inp._keyed_taken = [], []  # KeyState records of the pending / in-flight rows
    inp._sorted = (None, None)  # (placement key, exchange.sorted_plan of it) for _split
    return inp


__all__ = ["InputStream", "InputOperator", "InputError", "BadInput", "add_input",
           "conform_rows"]
