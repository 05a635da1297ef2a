"""Sums and negations of stream values, for both stream kinds (used by linear operators)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..algebra.schema import concat_batches
from ..circuit.types import IndexedType, ZSetType
from ..trace.batch import OrdIndexedZSet, ZSet


def empty_of(type_) -> object:
    if isinstance(type_, IndexedType):
        return OrdIndexedZSet.empty(type_.key, type_.val)
    return ZSet.empty(type_.schema)


def add(type_, values: Sequence[object]) -> object:
    """The sum of values of one stream type (loose for Z-sets, merged for indexed)."""
    vals = [v for v in values if v is not None and len(v)]  # type: ignore[arg-type]
    if not vals:
        return empty_of(type_)
    if len(vals) == 1:
        return vals[0]
    if isinstance(type_, IndexedType):
        m = OrdIndexedZSet.merge(vals)  # type: ignore[arg-type]
        return m if len(m) else empty_of(type_)
    data = concat_batches(type_.schema, [v.data for v in vals])  # type: ignore[attr-defined]
    w = np.concatenate([v.weights for v in vals])  # type: ignore[attr-defined]
    return ZSet(data, w)


def consolidated(type_, value) -> object:
    if isinstance(type_, ZSetType):
        return value.consolidate()
    return value


__all__ = ["empty_of", "add", "consolidated"]
