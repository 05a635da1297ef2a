"""Bad data at run time: the error policy, the error a bad row raises, and where skipped rows go.

A row can fail in an operator: an integer overflow or a failed cast in an expression, a division
by zero, a per-row Python function that raises, a sum or a weight out of the int64 range, a
retraction of a row that was never inserted. What happens then is the circuit's **error policy**:

* ``"raise"`` (the default): the operator raises :class:`RowError`, naming itself, the
  expression and the offending row; the runtime rolls the whole step back on every worker
  (:mod:`dbsp.trace.journal`) and the circuit stays usable for the next step;
* ``"skip_and_report"``: the operator sets the bad rows aside with their reason and carries on
  with the good ones; the runtime gathers them after the step (:class:`ErrorSink`) into the
  circuit's error log (a dead-letter queue, like ``errors.tolerance=all`` with a dead-letter topic
  in Kafka Connect).

**Per input**: an input may have its own policy (``StreamContext.stream(..., errors=...)``). It
governs its rows at push time, and at run time every operator whose rows come from it: an
operator follows the *strictest* policy among the inputs upstream of it (``raise`` is stricter
than ``skip_and_report``), so where rows of a ``raise`` input meet rows of a ``skip_and_report``
one (a join, a union) a bad row raises. An operator that no input with its own policy reaches
follows the pipeline's. (:func:`node_policies` computes this from the graph.)

This module knows no operator: operators find the sink in their
:class:`~dbsp.circuit.operator.WorkerContext` (``ctx.errors``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

import pyarrow as pa

__all__ = ["POLICIES", "RowError", "BadRows", "ErrorSink", "ErrorLog", "ERROR_SCHEMA",
           "ERROR_STREAM_SCHEMA", "DEFAULT_ERROR_CAP", "check_policy", "row_json",
           "node_policies"]

POLICIES = ("raise", "skip_and_report")


def node_policies(nodes: list, input_policy: dict, default: str) -> dict:
    """``{node id: policy}``: each node's strictest upstream input policy (``input_policy``:
    ``{input node id: its policy}``), ``default`` where no input reaches it. Iterated to a fixed
    point, since a delay's input may be built after it."""
    rank = {p: i for i, p in enumerate(POLICIES)}     # raise (0) is the strictest
    pol: dict = {n: p for n, p in input_policy.items()}
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if n.id in input_policy:
                continue
            ups = [pol[i] for i in n.inputs if i in pol]
            if not ups:
                continue
            p = min(ups, key=rank.__getitem__)
            if pol.get(n.id) != p and (n.id not in pol or rank[p] < rank[pol[n.id]]):
                pol[n.id] = p
                changed = True
    return {n.id: pol.get(n.id, default) for n in nodes}


def check_policy(policy: Any, what: str = "errors") -> str:
    if policy not in POLICIES:
        raise ValueError(f"{what} must be one of {POLICIES}, got {policy!r}")
    return policy


def _show_row(row: Any) -> str:
    if isinstance(row, dict):
        return "{" + ", ".join(f"{k}={v!r}" for k, v in row.items()) + "}"
    return repr(row)


class RowError(ValueError):
    """A row failed in an operator. ``operator``, ``reason``, ``row`` (a dict of column values,
    or of key values where the failure is a group's) and ``expression`` (when one is known) say
    where and why; ``step`` is set by the runtime."""

    def __init__(self, operator: str, reason: str, row: Optional[dict] = None,
                 expression: Optional[str] = None):
        self.operator, self.reason, self.row, self.expression = operator, reason, row, expression
        self.step: Optional[int] = None
        msg = f"operator '{operator}'"
        if expression:
            msg += f", expression {expression}"
        if row is not None:
            msg += f", row {_show_row(row)}"
        super().__init__(f"{msg}: {reason}")

    def __reduce__(self):  # crosses process boundaries intact
        return (_rebuild, (self.operator, self.reason, self.row, self.expression, self.step,
                           getattr(self, "__notes__", None)))


def _rebuild(operator, reason, row, expression, step, notes):
    e = RowError(operator, reason, row, expression)
    e.step = step
    if notes:
        for n in notes:
            e.add_note(n)
    return e


@dataclass
class BadRows:
    """Rows an operator set aside in one step: ``rows`` (their columns), the same ``reason`` for
    all, or ``reasons`` one per row."""

    operator: str
    rows: pa.RecordBatch
    weights: Any
    reasons: list[str]
    expression: Optional[str] = None
    worker: int = 0


@dataclass
class ErrorSink:
    """One worker's policy and the rows its operators set aside in the current step."""

    policy: str = "raise"
    reports: list[BadRows] = field(default_factory=list)

    @property
    def skipping(self) -> bool:
        return self.policy == "skip_and_report"

    def report(self, bad: BadRows) -> None:
        self.reports.append(bad)

    def take(self) -> list[BadRows]:
        out, self.reports = self.reports, []
        return out


ERROR_SCHEMA = pa.schema([("step", pa.int64()), ("source", pa.string()),
                          ("reason", pa.string()), ("expression", pa.string()),
                          ("row", pa.string()), ("weight", pa.int64())])
"""Columns of :meth:`ErrorLog.to_arrow`: the step, the input or operator, why, the expression (if
any), the row (``repr`` of its column values as a dict) and its weight."""


ERROR_STREAM_SCHEMA = pa.schema([("step", pa.int64()), ("source", pa.string()),
                                 ("reason", pa.string()), ("expression", pa.string()),
                                 ("row", pa.string()), ("weight", pa.int64())])
"""Columns of the error *stream* (``StreamContext.error_stream``): as :data:`ERROR_SCHEMA`, with
the row as JSON text (:func:`row_json`)."""

#: records an :class:`ErrorLog` keeps by default (older ones are dropped and counted)
DEFAULT_ERROR_CAP = 100_000


def row_json(row: Any) -> str:
    """A bad row as JSON text: an object of its column values (a tuple or list as an array);
    values JSON has no form for (dates, decimals, bytes) as their ``str``."""
    return json.dumps(row, default=str, sort_keys=False, ensure_ascii=False)


class ErrorLog:
    """The dead-letter queue of a circuit: every row set aside under ``skip_and_report`` (at push
    time by an input, at run time by an operator), in order, each once.

    ``records`` are dicts ``{step, source, reason, expression, row, weight}`` (``row`` a dict of
    column values); :attr:`counts` counts them per source, over all time.

    **Bounded**: only the newest ``cap`` records are kept (``None``: all, for tests and short
    runs); older ones are dropped, counted in :attr:`dropped`. Positions are absolute: record
    ``i`` is the ``i``-th ever added, ``len(log)`` is the number ever added, and :meth:`since`
    reads the kept records from a position on (a consumer keeps its position; records dropped
    before it read them are counted by :meth:`missed`). For every bad row without a bound, sink
    the error stream (``StreamContext.error_stream()``) to a file or a table.
    """

    def __init__(self, cap: Optional[int] = DEFAULT_ERROR_CAP) -> None:
        if cap is not None and (not isinstance(cap, int) or cap < 0):
            raise ValueError(f"the error log's cap must be a non-negative int or None, got "
                             f"{cap!r}")
        self.cap = cap
        self.records: list[dict] = []
        self.counts: dict[str, int] = {}
        self.first = 0          # absolute position of records[0]
        self.dropped = 0        # records dropped by the cap

    def add(self, step: int, source: str, reason: str, row: dict, weight: int = 1,
            expression: Optional[str] = None) -> None:
        self.records.append({"step": step, "source": source, "reason": reason,
                             "expression": expression, "row": row, "weight": int(weight)})
        self.counts[source] = self.counts.get(source, 0) + 1
        cap = self.cap
        if cap is not None and len(self.records) > cap + (cap >> 3):  # trim in batches
            self._trim()

    def _trim(self) -> None:
        extra = len(self.records) - self.cap  # type: ignore[operator]
        if extra > 0:
            del self.records[:extra]
            self.first += extra
            self.dropped += extra

    def add_bad(self, step: int, bad: BadRows) -> None:
        rows = bad.rows.to_pylist()
        for i, r in enumerate(rows):
            reason = bad.reasons[i] if len(bad.reasons) > 1 else bad.reasons[0]
            self.add(step, bad.operator, reason, r, int(bad.weights[i]), bad.expression)

    def since(self, pos: int) -> list[dict]:
        """The kept records from absolute position ``pos`` on."""
        if self.cap is not None:
            self._trim()
        return self.records[max(pos - self.first, 0):]

    def missed(self, pos: int) -> int:
        """How many records from position ``pos`` on were dropped before they could be read."""
        return max(self.first - pos, 0)

    def __len__(self) -> int:
        """Records ever added (kept or dropped)."""
        return self.first + len(self.records)

    def to_arrow(self) -> pa.Table:
        """The kept records (see :data:`ERROR_SCHEMA`)."""
        if self.cap is not None:
            self._trim()
        recs = self.records
        return pa.Table.from_arrays(
            [pa.array([r["step"] for r in recs], pa.int64()),
             pa.array([r["source"] for r in recs], pa.string()),
             pa.array([r["reason"] for r in recs], pa.string()),
             pa.array([r["expression"] for r in recs], pa.string()),
             pa.array([repr(r["row"]) for r in recs], pa.string()),
             pa.array([r["weight"] for r in recs], pa.int64())], schema=ERROR_SCHEMA)
