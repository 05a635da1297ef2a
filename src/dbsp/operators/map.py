"""map: apply a function to every row; linear, so it runs on deltas directly.

``map(f)(a) = sum over rows r of a: a[r] * {f(r)}``. The vectorised form takes the whole delta as
an Arrow record batch and returns the mapped batch (same row count); weights pass through.

>>> import pyarrow as pa, pyarrow.compute as pc, dbsp
>>> c = dbsp.Circuit()
>>> t = c.add_input("t", [("x", pa.int64())])
>>> out = t.map(lambda b: {"y": pc.multiply(b["x"], 10)}).output()
>>> _ = t.insert([(1,), (2,)]); c.step(); sorted(out.to_dict())
[(10,), (20,)]
"""
from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa

from ..algebra.schema import as_schema, concat_batches
from ..circuit.operator import Operator
from ..circuit.types import ZSetType
from ..trace.batch import ZSet
from ._rows import handle_bad_rows, isolate
from ._util import infer_schema, to_record_batch


class MapOperator(Operator):
    passes_empty = True
    name = "map"

    def __init__(self, ctx, fn: Callable, schema: pa.Schema):
        super().__init__(ctx)
        self.fn, self.schema = fn, schema

    def eval(self, z: ZSet) -> ZSet:
        if len(z) == 0:
            return ZSet.empty(self.schema)
        try:
            return ZSet(self._apply(z.data), z.weights)
        except Exception as e:  # noqa: BLE001 - find the rows at fault (module _rows)
            good, bad = isolate(self._apply, z.data, e)
            if not bad:
                raise
            keep = handle_bad_rows(self, self.fn, z.data, z.weights, bad)
            return ZSet(concat_batches(self.schema, [r for _, r in good]), z.weights[keep])

    def _apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        out = to_record_batch(self.fn(batch), self.schema, "map function")
        if out.num_rows != batch.num_rows:
            raise ValueError(f"map function returned {out.num_rows} rows for {batch.num_rows}")
        return out


class MapRowsOperator(MapOperator):
    name = "map_rows"

    def _apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        rows = [self.fn(r) for r in zip(*(c.to_pylist() for c in batch.columns))]
        cols = list(zip(*rows)) if rows else [[] for _ in self.schema]
        arrays = [pa.array(list(c), type=f.type) for c, f in zip(cols, self.schema)]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def map_batches(stream, fn: Callable, schema: Any):
    out_schema = infer_schema(fn, stream.schema, schema, "map function")
    return stream.circuit.add_node("map", lambda ctx: MapOperator(ctx, fn, out_schema), [stream],
                                   ZSetType(out_schema))


def map_rows(stream, fn: Callable, schema: Any):
    out_schema = as_schema(schema)
    return stream.circuit.add_node("map_rows", lambda ctx: MapRowsOperator(ctx, fn, out_schema),
                                   [stream], ZSetType(out_schema))


__all__ = ["map_batches", "map_rows", "MapOperator"]
