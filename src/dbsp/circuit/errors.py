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

This module knows no operator: operators find the sink in their
:class:`~dbsp.circuit.operator.WorkerContext` (``ctx.errors``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import pyarrow as pa

__all__ = ["POLICIES", "RowError", "BadRows", "ErrorSink", "ErrorLog", "ERROR_SCHEMA",
           "check_policy"]

POLICIES = ("raise", "skip_and_report")


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


class ErrorLog:
    """The dead-letter queue of a circuit: every row set aside under ``skip_and_report`` (at push
    time by an input, at run time by an operator), in order, each once.

    ``records`` are dicts ``{step, source, reason, expression, row, weight}`` (``row`` a dict of
    column values); :meth:`since` reads the ones after a position (a consumer keeps its
    position); :attr:`counts` counts them per source.
    """

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.counts: dict[str, int] = {}

    def add(self, step: int, source: str, reason: str, row: dict, weight: int = 1,
            expression: Optional[str] = None) -> None:
        self.records.append({"step": step, "source": source, "reason": reason,
                             "expression": expression, "row": row, "weight": int(weight)})
        self.counts[source] = self.counts.get(source, 0) + 1

    def add_bad(self, step: int, bad: BadRows) -> None:
        rows = bad.rows.to_pylist()
        for i, r in enumerate(rows):
            reason = bad.reasons[i] if len(bad.reasons) > 1 else bad.reasons[0]
            self.add(step, bad.operator, reason, r, int(bad.weights[i]), bad.expression)

    def since(self, pos: int) -> list[dict]:
        return self.records[pos:]

    def __len__(self) -> int:
        return len(self.records)

    def to_arrow(self) -> pa.Table:
        recs = self.records
        return pa.Table.from_arrays(
            [pa.array([r["step"] for r in recs], pa.int64()),
             pa.array([r["source"] for r in recs], pa.string()),
             pa.array([r["reason"] for r in recs], pa.string()),
             pa.array([r["expression"] for r in recs], pa.string()),
             pa.array([repr(r["row"]) for r in recs], pa.string()),
             pa.array([r["weight"] for r in recs], pa.int64())], schema=ERROR_SCHEMA)
