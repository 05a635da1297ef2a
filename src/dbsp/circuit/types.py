"""Stream types: what flows on an edge of a circuit."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


@dataclass(frozen=True)
class ZSetType:
    """A stream of Z-sets (:class:`~dbsp.trace.batch.ZSet`, loose or consolidated) over ``schema``."""

    schema: pa.Schema

    def describe(self) -> str:
        return f"ZSet{self.schema.names}"


@dataclass(frozen=True)
class IndexedType:
    """A stream of :class:`~dbsp.trace.batch.OrdIndexedZSet` keyed by ``key``, with values ``val``."""

    key: pa.Schema
    val: pa.Schema

    def describe(self) -> str:
        return f"Indexed{self.key.names}->{self.val.names}"

    @property
    def flat_schema(self) -> pa.Schema:
        return pa.schema(list(self.key) + list(self.val))
