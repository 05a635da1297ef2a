"""index_by / flatten: between Z-sets of rows and indexed Z-sets ``key -> value``; linear."""
from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from ..algebra.codes import codec_for
from ..circuit.operator import Operator
from ..circuit.types import IndexedType, ZSetType
from ..trace.batch import OrdIndexedZSet


class IndexOperator(Operator):
    name = "index_by"
    passes_empty = True

    def __init__(self, ctx, key: list[str], type_: IndexedType):
        super().__init__(ctx)
        self.key, self.type = key, type_
        self._schema = None  # the input schema the codecs below were worked out for
        self._plan: tuple = ()

    def eval(self, z):
        if len(z) == 0:
            return OrdIndexedZSet.empty(self.type.key, self.type.val)
        s = z.schema
        if s != self._schema:  # once per input schema, not per step (a lookup hashes it)
            vnames = [n for n in s.names if n not in self.key]
            if len(vnames) + len(self.key) != len(s.names) or any(k not in s.names
                                                                 for k in self.key):
                return OrdIndexedZSet.from_loose(z, self.key)  # raises naming the column
            self._schema = s
            self._plan = (vnames, codec_for(s, self.key), codec_for(s, vnames))
        vnames, kc, vc = self._plan
        return OrdIndexedZSet.from_loose(z, self.key, vnames, kc, vc)


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
