"""Helpers shared by operator modules: output schemas, batch conversion, key bounds for GC."""
from __future__ import annotations

from typing import Any

import pyarrow as pa

from ..algebra.codes import KeyCodec
from ..algebra.schema import as_schema, empty_batch
from ..algebra.time import from_physical


def to_record_batch(value: Any, schema: pa.Schema | None, what: str) -> pa.RecordBatch:
    """Coerce a user function's result (RecordBatch, Table, dict of arrays) to ``schema``."""
    if isinstance(value, pa.Table):
        value = value.combine_chunks()
        value = value.to_batches()[0] if value.num_rows else empty_batch(value.schema)
    elif isinstance(value, dict):
        value = pa.RecordBatch.from_pydict(
            {k: (v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v)
             for k, v in value.items()})
    if not isinstance(value, pa.RecordBatch):
        raise TypeError(f"{what} must return a RecordBatch, Table or dict of arrays, "
                        f"got {type(value).__name__}")
    if schema is not None and value.schema != schema:
        if value.schema.names != schema.names:
            raise TypeError(f"{what} returned columns {value.schema.names}, "
                            f"expected {schema.names}")
        cols = []
        for f, c in zip(schema, value.columns):
            cols.append(c if c.type == f.type else c.cast(f.type))
        value = pa.RecordBatch.from_arrays(cols, schema=schema)
    return value


def infer_schema(fn, in_schema: pa.Schema, schema: Any, what: str) -> pa.Schema:
    if schema is not None:
        return as_schema(schema)
    out = to_record_batch(fn(empty_batch(in_schema)), None, what)
    return as_schema(out.schema)


def key_prefix_bound(kcodec: KeyCodec, first: int):
    """The smallest key code whose leading column is ``first`` (in the physical units of its
    type: an int for u64 codes, bytes for variable-length codes): ``truncate_keys_below`` of it
    drops every key with a smaller leading column, whatever its other columns."""
    value = from_physical(pa.array([first], pa.int64()), kcodec.fields[0].type)
    prefix = KeyCodec(kcodec.fields[:1]).encode_reference([value]).row(0)
    if kcodec.u64:
        return int.from_bytes(prefix, "big") << (8 * (kcodec.width - len(prefix)))
    return prefix
