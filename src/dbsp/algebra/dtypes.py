"""The type system of column values: type classes, kinds, widening, type names.

Every column is an Arrow type. The engine reasons about types in *kinds* (``kind_of``):
``numeric`` (ints, floats, decimals), ``string``, ``binary``, ``bool``, ``duration``, ``temporal``
(timestamps, dates, times) and ``null`` (a value of no type: a bare ``None``). Two values of the
same kind can meet in one column; :func:`common_type` says in which type (ints widen, an int meets
a float in ``float64``). Values of different kinds never convert silently.

The column expressions (:mod:`dbsp.api.expr`) check their operands with these functions when a
pipeline is built, and operators that widen types (join keys of two integer types) use
:func:`common_type`; :func:`as_type` turns the type names users write (``"int64"``,
``"timestamp[ms]"``, ``int``) into Arrow types.

>>> import pyarrow as pa
>>> common_type([pa.int32(), pa.int64()], "join key")
DataType(int64)
>>> common_type([pa.int64(), pa.float32()], "sum")
DataType(double)
>>> common_type([pa.int64(), pa.string()], "coalesce")
Traceback (most recent call last):
...
dbsp.algebra.dtypes.TypeMismatch: coalesce: incompatible types int64, string
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["TypeMismatch", "is_null", "is_int", "is_float", "is_numeric", "is_string",
           "is_binary", "is_bool", "is_temporal", "kind_of", "KINDS", "common_type", "as_type",
           "cast_value"]

Value = Union[pa.Array, pa.ChunkedArray, pa.Scalar]


class TypeMismatch(TypeError):
    """Types that do not go together (different kinds, or no common Arrow type)."""


def is_null(t: pa.DataType) -> bool:
    """The type of a bare ``None``: it meets any other type."""
    return pa.types.is_null(t)


def is_int(t: pa.DataType) -> bool:
    """A signed or unsigned integer type."""
    return pa.types.is_integer(t)


def is_float(t: pa.DataType) -> bool:
    return pa.types.is_floating(t)


def is_numeric(t: pa.DataType) -> bool:
    """An integer, floating-point or decimal type."""
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def is_string(t: pa.DataType) -> bool:
    """``string`` or ``large_string``."""
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def is_binary(t: pa.DataType) -> bool:
    """``binary`` or ``large_binary``."""
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def is_bool(t: pa.DataType) -> bool:
    return pa.types.is_boolean(t)


def is_temporal(t: pa.DataType) -> bool:
    """A timestamp, date, time or duration type."""
    return pa.types.is_temporal(t)


KINDS = ("null", "numeric", "string", "binary", "bool", "duration", "temporal")


def kind_of(t: pa.DataType) -> str:
    """The kind of ``t``: one of :data:`KINDS`, or the type's own name for any other type
    (lists, structs...: a kind of their own)."""
    if is_null(t):
        return "null"
    if is_numeric(t):
        return "numeric"
    if is_string(t):
        return "string"
    if is_binary(t):
        return "binary"
    if is_bool(t):
        return "bool"
    if pa.types.is_duration(t):
        return "duration"
    if is_temporal(t):
        return "temporal"
    return str(t)


def common_type(types: Sequence[pa.DataType], what: str) -> pa.DataType:
    """The type all of ``types`` convert to without loss of kind (ints widen, int+float -> float64).

    Null types are ignored (``null`` alone gives ``null``). Raises :class:`TypeMismatch` (a
    ``TypeError``, with ``what`` in the message) when the kinds differ or Arrow has no common type.
    """
    real = [t for t in types if not is_null(t)]
    if not real:
        return pa.null()
    first = real[0]
    if all(t == first for t in real):
        return first
    kinds = {kind_of(t) for t in real}
    if len(kinds) > 1:
        raise TypeMismatch(f"{what}: incompatible types {', '.join(str(t) for t in real)}")
    if kinds == {"numeric"} and any(is_float(t) for t in real):
        return pa.float64()
    try:
        s = pa.unify_schemas([pa.schema([("x", t)]) for t in real], promote_options="permissive")
        return s.field("x").type
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise TypeMismatch(f"{what}: incompatible types {', '.join(str(t) for t in real)}") \
            from None


_ALIASES = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_(),
            "double": pa.float64(), "utf8": pa.string()}
_PY_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


def as_type(t: Any) -> pa.DataType:
    """A ``pa.DataType`` from a type, a type name (``"int64"``, ``"int"``, ``"timestamp[ms]"``,
    ``"duration[us]"``, ``"decimal128(10, 2)"``, any Arrow alias) or a Python type (``int``,
    ``float``, ``str``, ``bool``). Raises ``TypeError`` naming what it could not read."""
    if isinstance(t, pa.DataType):
        return t
    if isinstance(t, str):
        if t in _ALIASES:
            return _ALIASES[t]
        try:
            if t.startswith("timestamp[") and t.endswith("]"):
                return pa.timestamp(t[10:-1])
            if t.startswith("duration[") and t.endswith("]"):
                return pa.duration(t[9:-1])
            if t.startswith("decimal128(") and t.endswith(")"):
                p, _, sc = t[11:-1].partition(",")
                return pa.decimal128(int(p), int(sc or 0))
            return pa.type_for_alias(t)
        except (ValueError, KeyError, pa.ArrowInvalid):
            raise TypeError(f"unknown type name {t!r}") from None
    if isinstance(t, type) and t in _PY_TYPES:
        return _PY_TYPES[t]
    raise TypeError(f"not a type: {t!r}")


def cast_value(v: Value, t: pa.DataType) -> Value:
    """``v`` (an array or a scalar) as type ``t``; ``v`` itself when it has that type already.
    Safe: a value that does not fit raises."""
    if v.type == t:
        return v
    return v.cast(t) if isinstance(v, pa.Scalar) else pc.cast(v, t)
