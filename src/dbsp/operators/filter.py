"""filter: keep the rows satisfying a predicate; linear (``filter(p)(a+b) = filter(p)(a) + filter(p)(b)``).

Nulls in the predicate's result count as false (SQL ``WHERE``).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..algebra.schema import take
from ..circuit.operator import Operator
from ..trace.batch import ZSet
from ._rows import handle_bad_rows, isolate


def _mask(value, n: int) -> np.ndarray:
    if isinstance(value, pa.ChunkedArray):
        value = value.combine_chunks()
    if isinstance(value, pa.Array):
        if value.type != pa.bool_():
            raise TypeError(f"filter predicate must return booleans, got {value.type}")
        value = pc.fill_null(value, False).to_numpy(zero_copy_only=False)
    m = np.asarray(value, dtype=bool)
    if m.shape != (n,):
        raise ValueError(f"filter predicate returned {m.shape} values for {n} rows")
    return m


class FilterOperator(Operator):
    passes_empty = True
    name = "filter"

    def __init__(self, ctx, pred: Callable):
        super().__init__(ctx)
        self.pred = pred

    def eval(self, z: ZSet) -> ZSet:
        if len(z) == 0:
            return z
        try:
            m = self._apply(z.data)
        except Exception as e:  # noqa: BLE001 - find the rows at fault (module _rows)
            good, bad = isolate(self._apply, z.data, e)
            if not bad:
                raise
            keep = handle_bad_rows(self, self.pred, z.data, z.weights, bad)
            z = ZSet(take(z.data, keep), z.weights[keep])
            m = np.concatenate([r for _, r in good]) if good else np.zeros(0, dtype=bool)
        if m.all():
            return z
        return ZSet(z.data.filter(pa.array(m)), z.weights[m])

    def _apply(self, batch: pa.RecordBatch) -> np.ndarray:
        return _mask(self.pred(batch), batch.num_rows)


class FilterRowsOperator(FilterOperator):
    name = "filter_rows"

    def _apply(self, batch: pa.RecordBatch) -> np.ndarray:
        rows = zip(*(c.to_pylist() for c in batch.columns))
        return np.fromiter((bool(self.pred(r)) for r in rows), dtype=bool,
                           count=batch.num_rows)


def filter_batches(stream, pred: Callable):
    return stream.circuit.add_node("filter", lambda ctx: FilterOperator(ctx, pred), [stream],
                                   stream.type)


def filter_rows(stream, pred: Callable):
    return stream.circuit.add_node("filter_rows", lambda ctx: FilterRowsOperator(ctx, pred),
                                   [stream], stream.type)


__all__ = ["filter_batches", "filter_rows", "FilterOperator"]
