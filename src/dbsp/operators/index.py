"""index_by / flatten: between Z-sets of rows and indexed Z-sets ``key -> value``; linear."""
from __future__ import annotations

from typing import Optional, Sequence

import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import codec_for
from ..circuit.operator import Operator
from ..circuit.types import IndexedType, ZSetType
from ..trace.batch import KeyedZSet, OrdIndexedZSet, keep_exports


class IndexOperator(Operator):
    name = "index_by"
    passes_empty = True

    def __init__(self, ctx, key: list[str], type_: IndexedType):
        super().__init__(ctx)
        self.key, self.type = key, type_
        self._key = tuple(key)
        self._schema = None  # the input schema the codecs below were worked out for
        self._plan: tuple = ()

    def plan(self, z) -> Optional[tuple]:
        """``(value column names, key codec, value codec, native plan)`` for the rows of ``z``
        (non-empty), worked out once per input schema, not per step (a lookup hashes the
        schema); None when the columns do not split into key and values (:meth:`eval` then lets
        :meth:`OrdIndexedZSet.from_loose` raise, naming the column). The native plan (None
        when a codec's codes are not u64 read from the columns' buffers) is the arguments of
        :func:`~dbsp.algebra.kernels.index_rows` but the batch and the weights."""
        s = z.schema
        if s is not self._schema and s != self._schema:
            vnames = [n for n in s.names if n not in self.key]
            if len(vnames) + len(self.key) != len(s.names) or any(k not in s.names
                                                                 for k in self.key):
                return None
            kc, vc = codec_for(s, self.key), codec_for(s, vnames)
            native = None
            if kc._native_plan is not None and vc._native_plan is not None:
                kidx = [s.get_field_index(n) for n in self.key]
                vidx = [s.get_field_index(n) for n in vnames]
                native = (kidx, kc._native_plan, vidx, vc._native_plan,
                          pa.schema([s.field(i) for i in kidx]),
                          pa.schema([s.field(i) for i in vidx]))
            self._schema = s
            self._plan = (vnames, kc, vc, native)
        return self._plan

    def eval(self, z):
        if len(z) == 0:
            return OrdIndexedZSet.empty(self.type.key, self.type.val)
        p = self.plan(z)
        if p is None:
            return OrdIndexedZSet.from_loose(z, self.key)  # raises naming the column
        vnames, kc, vc, native = p
        if type(z) is KeyedZSet and z.key == self._key:
            # the driver's split sorted and consolidated the rows by this key already
            return OrdIndexedZSet.from_keyed(z, vnames, kc, vc)
        if native is not None:
            # integer / temporal columns: encoded, sorted (a large batch by the radix sort),
            # consolidated and gathered in one native call from one export of the batch (None:
            # a null, a weight sum to check: the general path below)
            views: list = []  # (the exports of the batches built, kept for the trace's reads)
            got = K.index_rows(z.data, native[0], native[1], native[2], native[3], z.weights,
                               native[4], native[5], views=views, sort=K.sort_consolidate)
            if got is not None:
                keys, kcodes, offsets, vals, vcodes, w = got
                if not len(w):
                    return OrdIndexedZSet.empty(self.type.key, self.type.val)
                return keep_exports(OrdIndexedZSet(keys, kcodes, offsets, vals, vcodes, w, kc,
                                                   vc), *views)
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
