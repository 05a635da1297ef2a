"""index_by / flatten: between Z-sets of rows and indexed Z-sets ``key -> value``; linear."""
from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from ..circuit.operator import Operator
from ..circuit.types import IndexedType, ZSetType
from ..trace.batch import OrdIndexedZSet


class IndexOperator(Operator):
    name = "index_by"
    passes_empty = True

    def __init__(self, ctx, key: list[str], type_: IndexedType):
        super().__init__(ctx)
        self.key, self.type = key, type_

    def eval(self, z):
        if len(z) == 0:
            return OrdIndexedZSet.empty(self.type.key, self.type.val)
        return OrdIndexedZSet.from_loose(z, self.key)


class FlattenOperator(Operator):
    name = "flatten"
    passes_empty = True

    def eval(self, ix: OrdIndexedZSet):
        return ix.flatten()


def index_by(stream, key: Sequence[str]):
    key = [key] if isinstance(key, str) else list(key)
    schema = stream.schema
    for k in key:
        if k not in schema.names:
            raise KeyError(f"cannot index by {k!r}: no such column (columns: {schema.names})")
    if len(set(key)) != len(key):
        raise ValueError(f"duplicate key columns {key}")
    t = IndexedType(pa.schema([schema.field(k) for k in key]),
                    pa.schema([f for f in schema if f.name not in key]))
    out = stream.circuit.add_node(f"index_by{key}", lambda ctx: IndexOperator(ctx, key, t),
                                  [stream], t)
    stream.circuit.nodes[out.node].info["index_key"] = tuple(key)
    return out


def flatten(stream):
    return stream.circuit.add_node("flatten", FlattenOperator, [stream],
                                   ZSetType(stream.type.flat_schema))


__all__ = ["index_by", "flatten"]
