"""flat_map: each row becomes zero or more rows, which inherit its weight; linear.

The vectorised function returns ``(out_batch, parent)`` where ``parent[i]`` is the index of the
input row that output row ``i`` comes from.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pyarrow as pa

from ..algebra.schema import as_schema, concat_batches
from ..circuit.operator import Operator
from ..circuit.types import ZSetType
from ..trace.batch import ZSet
from ._rows import handle_bad_rows, isolate
from ._util import to_record_batch


class FlatMapOperator(Operator):
    passes_empty = True
    name = "flat_map"

    def __init__(self, ctx, fn: Callable, schema: pa.Schema):
        super().__init__(ctx)
        self.fn, self.schema = fn, schema

    def eval(self, z: ZSet) -> ZSet:
        if len(z) == 0:
            return ZSet.empty(self.schema)
        try:
            out, parent = self._apply(z.data)
        except Exception as e:  # noqa: BLE001 - find the rows at fault (module _rows)
            good, bad = isolate(self._apply, z.data, e)
            if not bad:
                raise
            handle_bad_rows(self, self.fn, z.data, z.weights, bad)
            out = concat_batches(self.schema, [r[0] for _, r in good])
            parent = np.concatenate([r[1] + lo for lo, r in good]) if good else \
                np.zeros(0, np.int64)
        return ZSet(out, z.weights[parent])

    def _apply(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
        res = self.fn(batch)
        if not (isinstance(res, tuple) and len(res) == 2):
            raise TypeError("flat_map function must return (batch, parent_indices)")
        out = to_record_batch(res[0], self.schema, "flat_map function")
        parent = np.asarray(res[1], dtype=np.int64)
        if len(parent) != out.num_rows:
            raise ValueError(f"flat_map function returned {out.num_rows} rows but "
                             f"{len(parent)} parent indices")
        if len(parent) and (parent.min() < 0 or parent.max() >= batch.num_rows):
            raise ValueError("flat_map parent index out of range")
        return out, parent


class FlatMapRowsOperator(FlatMapOperator):
    name = "flat_map_rows"

    def _apply(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray]:
        out_rows: list[tuple] = []
        parent: list[int] = []
        for i, r in enumerate(zip(*(c.to_pylist() for c in batch.columns))):
            for o in self.fn(r):
                out_rows.append(tuple(o))
                parent.append(i)
        cols = list(zip(*out_rows)) if out_rows else [[] for _ in self.schema]
        arrays = [pa.array(list(c), type=f.type) for c, f in zip(cols, self.schema)]
        data = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        return data, np.asarray(parent, dtype=np.int64)


def flat_map_batches(stream, fn: Callable, schema: Any):
    s = as_schema(schema)
    return stream.circuit.add_node("flat_map", lambda ctx: FlatMapOperator(ctx, fn, s), [stream],
                                   ZSetType(s))


def flat_map_rows(stream, fn: Callable, schema: Any):
    s = as_schema(schema)
    return stream.circuit.add_node("flat_map_rows", lambda ctx: FlatMapRowsOperator(ctx, fn, s),
                                   [stream], ZSetType(s))


__all__ = ["flat_map_batches", "flat_map_rows"]
