"""Bad rows in row-wise operators (map, filter, flat_map): find them, then raise or set them aside.

A vectorised function runs on the whole delta; when it raises, the operator looks for the rows
at fault by bisection (run the two halves, recurse into a half that fails, down to single
rows): ``O(b log n)`` calls for ``b`` bad rows among ``n``, and nothing at all on the fast path
(one ``try``). The results of the slices that succeeded are the output of the good rows, so a
row-wise function gives exactly what it would have given on the good rows alone.

Under the error policy ``"raise"`` the first bad row becomes a
:class:`~dbsp.circuit.errors.RowError` naming the operator, the expression (when the function
can say which one failed: ``fn.explain(row_batch)``) and the row; under ``"skip_and_report"``
the bad rows go to the worker's :class:`~dbsp.circuit.errors.ErrorSink`.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import pyarrow as pa

from ..circuit.errors import BadRows, RowError

__all__ = ["isolate", "handle_bad_rows", "reason_of"]


def reason_of(e: BaseException) -> str:
    msg = str(e).split("\n")[0]
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def isolate(fn: Callable[[pa.RecordBatch], Any], batch: pa.RecordBatch,
            first_error: Optional[BaseException] = None
            ) -> tuple[list[tuple[int, Any]], list[tuple[int, BaseException]]]:
    """Run ``fn`` over slices of ``batch``: ``(good pieces [(offset, result)] in row order,
    bad rows [(row, exception)])``. ``first_error`` is what ``fn(batch)`` raised already."""
    good: list[tuple[int, Any]] = []
    bad: list[tuple[int, BaseException]] = []

    def run(lo: int, hi: int, err: Optional[BaseException]) -> None:
        if err is None:
            try:
                good.append((lo, fn(batch.slice(lo, hi - lo))))
                return
            except Exception as e:  # noqa: BLE001 - any failure of a user function is a row's
                err = e
        if hi - lo == 1:
            bad.append((lo, err))
            return
        mid = (lo + hi) // 2
        run(lo, mid, None)
        run(mid, hi, None)

    run(0, batch.num_rows, first_error)
    return good, bad


def _explain(fn: Any, row: pa.RecordBatch) -> Optional[str]:
    explain = getattr(fn, "explain", None)
    if explain is not None:
        try:
            return explain(row)
        except Exception:  # noqa: BLE001 - a description is best effort
            return None
    name = getattr(fn, "__qualname__", None)
    return None if name is None else f"function {name}"


def handle_bad_rows(op: Any, fn: Any, batch: pa.RecordBatch, weights: np.ndarray,
                    bad: list[tuple[int, BaseException]]) -> np.ndarray:
    """Raise for the first bad row (policy ``raise``) or report them all; returns the indices of
    the good rows."""
    rows = np.array([i for i, _ in bad], dtype=np.int64)
    first_row = batch.slice(int(rows[0]), 1)
    expr = _explain(fn, first_row)
    if not op.skipping:
        i, e = bad[0]
        raise RowError(op.name, reason_of(e), first_row.to_pylist()[0], expr) from e
    op.ctx.errors.report(BadRows(op.name, batch.take(pa.array(rows)), weights[rows],
                                 [reason_of(e) for _, e in bad], expr))
    keep = np.ones(batch.num_rows, dtype=bool)
    keep[rows] = False
    return np.flatnonzero(keep)
