"""Column expressions: vectorised, typed at build time, evaluated with ``pyarrow.compute``.

An expression (``col("price") * 0.908``, ``when(col("qty") > 10, "bulk").otherwise("retail")``)
is a small tree. :meth:`Expr.compile` binds it to an input schema *when the pipeline is built*:
every column is looked up and every operator checks the types of its operands, so a typo or a
type error (a string compared with an int, arithmetic on strings) raises a :class:`TypeError` /
:class:`ColumnNotFoundError` (a ``KeyError``) naming the column and the whole expression before
any data flows. The compiled form is a function ``RecordBatch -> pa.Array`` made of Arrow compute
kernels over whole columns: no Python runs per row.

Semantics
---------
* **Nulls** propagate through arithmetic, comparisons and string functions (SQL). ``&`` / ``|``
  use three-valued (Kleene) logic: ``false & null = false``, ``true | null = true``. A filter keeps
  rows whose predicate is ``true`` (null counts as false). ``when`` treats a null condition as
  false.
* **Arithmetic** ``+ - *`` follows Arrow's type promotion (``int32 + int64 -> int64``,
  ``int + float -> float64``, ``timestamp + duration -> timestamp``, ``timestamp - timestamp ->
  duration``) and is *checked*: an integer overflow raises an error at run time rather than
  wrapping silently.
* **Division** ``/`` is true division and always returns ``float64``. ``//`` and ``%`` follow
  **Python's floor semantics** (``-7 // 2 == -4``, ``-7 % 2 == 1``: the remainder has the sign of
  the divisor; ``a == (a // b) * b + a % b``); on two integers they return an integer, otherwise
  ``float64``. **Division by zero** (``/``, ``//``, ``%``) returns **null** rather than failing the
  step (like Spark outside ANSI mode) - an incremental pipeline should not die on one row.
* **Literals**: Python values are wrapped by :func:`lit` automatically. A string literal compared
  with (or added to) a temporal column is parsed as that column's type (``col("ts") >=
  "2024-01-01"``); a ``timedelta`` literal takes the unit of the timestamp it is combined with.
* **Strings**: ``substr(start, length)`` is 0-based, in characters (code points), like Python
  slicing ``s[start:start + length]``; ``len`` counts characters.
* **Casts** (``cast``) are safe: a value that does not fit (overflow, an unparseable string)
  raises at run time; the cast itself must be one Arrow supports, which is checked at build time.

>>> import pyarrow as pa
>>> e = (col("price") * 2 + 1).alias("p2")
>>> c = e.compile(pa.schema([("price", pa.int64())]))
>>> c.type, c(pa.record_batch({"price": [1, None, 3]})).to_pylist()
(DataType(int64), [3, None, 7])
>>> col("name") > 3  # doctest: +ELLIPSIS
(col("name") > 3)
>>> (col("name") > 3).compile(pa.schema([("name", pa.string())]))
Traceback (most recent call last):
...
TypeError: cannot compare col("name") (string) with 3 (int64) in expression (col("name") > 3)
"""
from __future__ import annotations

import datetime as _dt
import decimal as _decimal
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Value = Union[pa.Array, pa.Scalar]
EvalFn = Callable[[pa.RecordBatch], Value]


class ColumnNotFoundError(KeyError):
    """An expression names a column the stream does not have (raised when the pipeline is built)."""

    def __str__(self) -> str:  # KeyError quotes its message; this one reads as a sentence
        return str(self.args[0]) if self.args else ""


class _TypeFail(TypeError):
    """Internal: a type error found while binding; re-raised with the whole expression."""


class _Missing(KeyError):
    """Internal: an unknown column found while binding."""


# --- type classes ------------------------------------------------------------------------

def _is_null(t: pa.DataType) -> bool:
    return pa.types.is_null(t)


def _is_int(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def _is_float(t: pa.DataType) -> bool:
    return pa.types.is_floating(t)


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _is_bool(t: pa.DataType) -> bool:
    return pa.types.is_boolean(t)


def _is_temporal(t: pa.DataType) -> bool:
    return pa.types.is_temporal(t)


def _kind(t: pa.DataType) -> str:
    if _is_null(t):
        return "null"
    if _is_numeric(t):
        return "numeric"
    if _is_string(t):
        return "string"
    if _is_binary(t):
        return "binary"
    if _is_bool(t):
        return "bool"
    if pa.types.is_duration(t):
        return "duration"
    if _is_temporal(t):
        return "temporal"
    return str(t)


def common_type(types: Sequence[pa.DataType], what: str) -> pa.DataType:
    """The type all of ``types`` convert to without loss of kind (ints widen, int+float -> float64).

    Raises :class:`TypeError` (with ``what`` in the message) when the kinds differ.
    """
    real = [t for t in types if not _is_null(t)]
    if not real:
        return pa.null()
    first = real[0]
    if all(t == first for t in real):
        return first
    kinds = {_kind(t) for t in real}
    if len(kinds) > 1:
        raise _TypeFail(f"{what}: incompatible types {', '.join(str(t) for t in real)}")
    if kinds == {"numeric"} and any(_is_float(t) for t in real):
        return pa.float64()
    try:
        s = pa.unify_schemas([pa.schema([("x", t)]) for t in real], promote_options="permissive")
        return s.field("x").type
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise _TypeFail(f"{what}: incompatible types {', '.join(str(t) for t in real)}") from None


# --- values ------------------------------------------------------------------------------

def _as_array(v: Value, n: int) -> pa.Array:
    if isinstance(v, pa.ChunkedArray):
        return v.combine_chunks()
    if isinstance(v, pa.Array):
        return v
    if not v.is_valid:
        return pa.nulls(n, v.type)
    return pa.repeat(v, n)


def _cast_value(v: Value, t: pa.DataType) -> Value:
    if v.type == t:
        return v
    return v.cast(t) if isinstance(v, pa.Scalar) else pc.cast(v, t)


def _null_where(v: Value, mask: Value) -> Value:
    """``v`` with nulls where ``mask`` is true."""
    return pc.if_else(mask, pa.scalar(None, v.type), v)


def _to_numpy(a: pa.Array, fill) -> np.ndarray:
    if a.null_count:
        a = pc.fill_null(a, fill)
    return a.to_numpy(zero_copy_only=False)


@dataclass
class Compiled:
    """An expression bound to a schema: its Arrow ``type`` and ``fn(batch) -> pa.Array``."""

    expr: "Expr"
    type: pa.DataType
    fn: EvalFn

    def __call__(self, batch: pa.RecordBatch) -> pa.Array:
        v = self.fn(batch)
        return _as_array(v, batch.num_rows)


@dataclass
class _Bound:
    type: pa.DataType
    fn: EvalFn
    proto: Value  # the value on an empty batch (an empty array, or the literal's scalar)
    literal: bool = False


# --- the expression tree -----------------------------------------------------------------

class Expr:
    """A column expression; build with :func:`col`, :func:`lit`, operators and methods."""

    __slots__ = ()

    # -- binding --------------------------------------------------------------------------
    def _bind(self, schema: pa.Schema) -> _Bound:  # pragma: no cover - abstract
        raise NotImplementedError

    def compile(self, schema: pa.Schema, where: str = "") -> Compiled:
        """Bind to ``schema``: check columns and types now, return the vectorised function.

        Raises :class:`ColumnNotFoundError` for an unknown column and :class:`TypeError` for a
        type error; both name the expression (and ``where`` it is used, when given).
        """
        ctx = f" ({where})" if where else ""
        try:
            b = self._bind(schema)
        except _Missing as e:
            raise ColumnNotFoundError(f"{e.args[0]} in expression {self!r}{ctx}") from None
        except _TypeFail as e:
            raise TypeError(f"{e} in expression {self!r}{ctx}") from None
        return Compiled(self, b.type, b.fn)

    def output_name(self) -> Optional[str]:
        """The column name this expression produces by default (its first column, or alias)."""
        return None

    def columns(self) -> set[str]:
        """The input columns this expression reads."""
        return set()

    def alias(self, name: str) -> "Expr":
        """This expression, named ``name`` in a ``select``."""
        return Alias(self, name)

    # -- arithmetic -----------------------------------------------------------------------
    def __add__(self, o): return Arith("+", self, _wrap(o))
    def __radd__(self, o): return Arith("+", _wrap(o), self)
    def __sub__(self, o): return Arith("-", self, _wrap(o))
    def __rsub__(self, o): return Arith("-", _wrap(o), self)
    def __mul__(self, o): return Arith("*", self, _wrap(o))
    def __rmul__(self, o): return Arith("*", _wrap(o), self)
    def __truediv__(self, o): return Arith("/", self, _wrap(o))
    def __rtruediv__(self, o): return Arith("/", _wrap(o), self)
    def __floordiv__(self, o): return Arith("//", self, _wrap(o))
    def __rfloordiv__(self, o): return Arith("//", _wrap(o), self)
    def __mod__(self, o): return Arith("%", self, _wrap(o))
    def __rmod__(self, o): return Arith("%", _wrap(o), self)
    def __neg__(self): return Unary("-", self)
    def __pos__(self): return self

    def abs(self) -> "Expr":
        return Unary("abs", self)

    def round(self, ndigits: int = 0) -> "Expr":
        """Round half to even (like Python's ``round``) to ``ndigits`` decimals."""
        return Func("round", [self], _check_round, lambda a, n: pc.round(a[0], ndigits),
                    params=(ndigits,))

    # -- comparisons ----------------------------------------------------------------------
    def __eq__(self, o): return Compare("==", self, _wrap(o))  # type: ignore[override]
    def __ne__(self, o): return Compare("!=", self, _wrap(o))  # type: ignore[override]
    def __lt__(self, o): return Compare("<", self, _wrap(o))
    def __le__(self, o): return Compare("<=", self, _wrap(o))
    def __gt__(self, o): return Compare(">", self, _wrap(o))
    def __ge__(self, o): return Compare(">=", self, _wrap(o))

    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError(f"the truth value of an expression is unknown until it runs: {self!r} "
                        f"(use & | ~ instead of and/or/not, and `a < b` instead of chained "
                        f"comparisons)")

    def between(self, lo: Any, hi: Any) -> "Expr":
        """``lo <= self <= hi`` (both ends included)."""
        return (self >= lo) & (self <= hi)

    def is_in(self, values: Sequence[Any]) -> "Expr":
        """True when the value is one of ``values``; null when the value is null."""
        return IsIn(self, list(values))

    # -- boolean --------------------------------------------------------------------------
    def __and__(self, o): return Logic("&", self, _wrap(o))
    def __rand__(self, o): return Logic("&", _wrap(o), self)
    def __or__(self, o): return Logic("|", self, _wrap(o))
    def __ror__(self, o): return Logic("|", _wrap(o), self)
    def __invert__(self): return Unary("~", self)

    # -- nulls and types ------------------------------------------------------------------
    def is_null(self) -> "Expr":
        return Func("is_null", [self], lambda ts: pa.bool_(), lambda a, n: pc.is_null(a[0]))

    def is_not_null(self) -> "Expr":
        return Func("is_not_null", [self], lambda ts: pa.bool_(), lambda a, n: pc.is_valid(a[0]))

    def fill_null(self, value: Any) -> "Expr":
        """Replace nulls by ``value`` (an expression or a literal)."""
        return Coalesce([self, _wrap(value)], name="fill_null")

    def cast(self, type_: Any) -> "Expr":
        """Convert to ``type_`` (a ``pa.DataType`` or its name: ``"int64"``, ``"string"``...)."""
        return Cast(self, _as_type(type_))

    # -- namespaces -----------------------------------------------------------------------
    @property
    def str(self) -> "StrNamespace":
        """String functions: ``col("name").str.lower()``."""
        return StrNamespace(self)

    @property
    def dt(self) -> "DtNamespace":
        """Date/time functions: ``col("date_time").dt.epoch_ms()``."""
        return DtNamespace(self)

    # -- aggregates (for group_by(...).agg / window(...).agg) -------------------------------
    def sum(self) -> "AggExpr":
        return AggExpr("sum", self)

    def count(self) -> "AggExpr":
        """Number of non-null values."""
        return AggExpr("count", self)

    def mean(self) -> "AggExpr":
        return AggExpr("avg", self)

    avg = mean

    def min(self) -> "AggExpr":
        return AggExpr("min", self)

    def max(self) -> "AggExpr":
        return AggExpr("max", self)

    def count_distinct(self) -> "AggExpr":
        return AggExpr("count_distinct", self)

    # -- escape hatch ---------------------------------------------------------------------
    def map_batches(self, fn: Callable[[pa.Array], Any], type_: Any) -> "Expr":
        """A vectorised user function ``fn(pa.Array) -> array-like`` of ``type_``."""
        return udf(fn, self, type_=type_)


def _wrap(v: Any) -> Expr:
    if isinstance(v, Expr):
        return v
    if isinstance(v, AggExpr):
        raise TypeError(f"an aggregate ({v!r}) cannot be used inside a row expression")
    return Lit(v)


def _as_type(t: Any) -> pa.DataType:
    if isinstance(t, pa.DataType):
        return t
    if isinstance(t, str):
        aliases = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(),
                   "bool": pa.bool_(), "double": pa.float64(), "utf8": pa.string()}
        if t in aliases:
            return aliases[t]
        if t.startswith("timestamp[") and t.endswith("]"):
            return pa.timestamp(t[10:-1])
        if t.startswith("duration[") and t.endswith("]"):
            return pa.duration(t[9:-1])
        if t.startswith("decimal128(") and t.endswith(")"):
            p, _, sc = t[11:-1].partition(",")
            return pa.decimal128(int(p), int(sc or 0))
        try:
            return pa.type_for_alias(t)
        except (ValueError, KeyError):
            raise TypeError(f"unknown type name {t!r}") from None
    if t is int:
        return pa.int64()
    if t is float:
        return pa.float64()
    if t is str:
        return pa.string()
    if t is bool:
        return pa.bool_()
    raise TypeError(f"not a type: {t!r}")


class Col(Expr):
    __slots__ = ("name",)

    def __init__(self, name: str):
        if not isinstance(name, str):
            raise TypeError(f"col() takes a column name, got {name!r}")
        self.name = name

    def __repr__(self) -> str:
        return f"col({self.name!r})".replace("'", '"')

    def output_name(self) -> Optional[str]:
        return self.name

    def columns(self) -> set[str]:
        return {self.name}

    def _bind(self, schema: pa.Schema) -> _Bound:
        i = schema.get_field_index(self.name)
        if i < 0:
            raise _Missing(f"no column {self.name!r} (the stream has columns {schema.names})")
        t = schema.field(i).type
        name = self.name
        return _Bound(t, lambda b: b.column(name), pa.array([], type=t))


class Lit(Expr):
    __slots__ = ("value", "scalar")

    def __init__(self, value: Any, type_: Any = None):
        if isinstance(value, Expr):
            raise TypeError("lit() of an expression")
        self.value = value
        t = None if type_ is None else _as_type(type_)
        try:
            if isinstance(value, pa.Scalar):
                self.scalar = value if t is None else value.cast(t)
            elif isinstance(value, bool) or t is not None:
                self.scalar = pa.scalar(value, type=t)
            elif isinstance(value, int):
                self.scalar = pa.scalar(value, type=pa.int64())
            elif isinstance(value, float):
                self.scalar = pa.scalar(value, type=pa.float64())
            elif isinstance(value, _decimal.Decimal):
                self.scalar = pa.scalar(value)
            else:
                self.scalar = pa.scalar(value)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as e:
            raise TypeError(f"cannot make a literal of {value!r}: {e}") from None

    def __repr__(self) -> str:
        v = self.value
        if v is None or isinstance(v, (bool, int, float, str)):
            return repr(v).replace("'", '"')
        return f"lit({v!r})"

    def _bind(self, schema: pa.Schema) -> _Bound:
        s = self.scalar
        return _Bound(s.type, lambda b: s, s, literal=True)


def _coerce_literals(a: _Bound, b: _Bound, ea: Expr, eb: Expr) -> tuple[_Bound, _Bound]:
    """Adapt a literal to the type of the other operand where that is unambiguous."""
    def adapt(lit_b: _Bound, lit_e: Expr, other: _Bound) -> _Bound:
        s, t = lit_b.proto, other.type
        if not isinstance(s, pa.Scalar) or not s.is_valid:
            if isinstance(s, pa.Scalar) and not s.is_valid and not _is_null(t):
                n = pa.scalar(None, type=t)
                return _Bound(t, lambda bb: n, n, literal=True)
            return lit_b
        st = s.type
        target = None
        if _is_string(st) and _is_temporal(t):
            target = t
        elif pa.types.is_duration(st) and (pa.types.is_timestamp(t) or pa.types.is_duration(t)):
            target = pa.duration(t.unit)
        elif pa.types.is_timestamp(st) and pa.types.is_timestamp(t):
            target = t
        elif pa.types.is_date(st) and pa.types.is_timestamp(t):
            target = t
        if target is None or target == st:
            return lit_b
        try:
            c = s.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise _TypeFail(f"cannot interpret {lit_e!r} as {target}: {e}") from None
        return _Bound(target, lambda bb: c, c, literal=True)

    if a.literal and not b.literal:
        a = adapt(a, ea, b)
    elif b.literal and not a.literal:
        b = adapt(b, eb, a)
    return a, b


def _describe(e: Expr, t: pa.DataType) -> str:
    return f"{e!r} ({t})"


def _proto_call(what: str, impl: Callable[[], Value]) -> Value:
    try:
        return impl()
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid) as e:
        raise _TypeFail(f"{what}: {e}") from None


class _Binary(Expr):
    """An operator with two operands (arithmetic, comparison, logic)."""

    __slots__ = ("op", "left", "right")

    def __init__(self, op: str, left: Expr, right: Expr):
        self.op, self.left, self.right = op, left, right

    def __repr__(self) -> str:
        return f"({self.left!r} {self.op} {self.right!r})"

    def output_name(self) -> Optional[str]:
        return self.left.output_name() or self.right.output_name()

    def columns(self) -> set[str]:
        return self.left.columns() | self.right.columns()


class Arith(_Binary):
    __slots__ = ()

    def _bind(self, schema: pa.Schema) -> _Bound:
        a, b = self.left._bind(schema), self.right._bind(schema)
        a, b = _coerce_literals(a, b, self.left, self.right)
        ta, tb = a.type, b.type
        op = self.op
        ka, kb = _kind(ta), _kind(tb)
        bad = f"cannot apply '{op}' to {_describe(self.left, ta)} and {_describe(self.right, tb)}"
        for k, e, t in ((ka, self.left, ta), (kb, self.right, tb)):
            if k in ("string", "binary", "bool"):
                raise _TypeFail(f"{bad}: arithmetic on {k} {e!r} is not defined"
                                + (" (use .str.concat for strings)" if k == "string" else ""))
        if op in ("/", "//", "%"):
            if not ((ka in ("numeric", "null")) and (kb in ("numeric", "null"))):
                raise _TypeFail(f"{bad}: '{op}' needs numbers")
            if op in ("//", "%") and (pa.types.is_decimal(ta) or pa.types.is_decimal(tb)):
                raise _TypeFail(f"{bad}: '{op}' is not supported on decimals "
                                f"(cast to float64 or int64 first)")
        fa, fb = a.fn, b.fn
        impl = _ARITH[op]
        proto = _proto_call(bad, lambda: impl(a.proto, b.proto))
        return _Bound(proto.type, lambda batch: impl(fa(batch), fb(batch)), proto,
                      literal=a.literal and b.literal)


def _div(x: Value, y: Value) -> Value:
    x, y = _cast_value(x, pa.float64()), _cast_value(y, pa.float64())
    y = _null_where(y, pc.equal(y, 0.0))
    return pc.divide(x, y)


def _int_or_float(x: Value, y: Value) -> tuple[Value, Value, bool]:
    tx, ty = x.type, y.type
    ints = (_is_int(tx) or _is_null(tx)) and (_is_int(ty) or _is_null(ty))
    if ints:
        t = common_type([tx, ty], "integer division")
        if _is_null(t):
            t = pa.int64()
        return _cast_value(x, t), _cast_value(y, t), True
    return _cast_value(x, pa.float64()), _cast_value(y, pa.float64()), False


def _mod(x: Value, y: Value) -> Value:
    x, y, ints = _int_or_float(x, y)
    y = _null_where(y, pc.equal(y, 0))
    return pc.modulo(x, y)  # floored: the sign of the divisor, like Python


def _floordiv(x: Value, y: Value) -> Value:
    x, y, ints = _int_or_float(x, y)
    y = _null_where(y, pc.equal(y, 0))
    if ints:
        # exact: (x - x mod y) is a multiple of y; divide_checked catches INT_MIN // -1
        return pc.divide_checked(pc.subtract_checked(x, pc.modulo(x, y)), y)
    # numpy's float floor_divide is CPython's algorithm (float.__floordiv__)
    if isinstance(x, pa.Scalar) and isinstance(y, pa.Scalar):
        if not (x.is_valid and y.is_valid):
            return pa.scalar(None, pa.float64())
        return pa.scalar(float(np.floor_divide(x.as_py(), y.as_py())), pa.float64())
    n = len(x) if isinstance(x, pa.Array) else len(y)  # type: ignore[arg-type]
    xa, ya = _as_array(x, n), _as_array(y, n)
    valid = pc.and_(pc.is_valid(xa), pc.is_valid(ya))
    with np.errstate(all="ignore"):
        r = np.floor_divide(_to_numpy(xa, 0.0), _to_numpy(ya, 1.0))
    return pa.array(r, type=pa.float64(), mask=_to_numpy(pc.invert(valid), True))


_ARITH: dict[str, Callable[[Value, Value], Value]] = {
    "+": pc.add_checked,
    "-": pc.subtract_checked,
    "*": pc.multiply_checked,
    "/": _div,
    "//": _floordiv,
    "%": _mod,
}

_CMP = {"==": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal,
        ">": pc.greater, ">=": pc.greater_equal}


class Compare(_Binary):
    __slots__ = ()

    def _bind(self, schema: pa.Schema) -> _Bound:
        a, b = self.left._bind(schema), self.right._bind(schema)
        a, b = _coerce_literals(a, b, self.left, self.right)
        ka, kb = _kind(a.type), _kind(b.type)
        bad = f"cannot compare {_describe(self.left, a.type)} with {_describe(self.right, b.type)}"
        if "null" not in (ka, kb) and ka != kb:
            raise _TypeFail(bad)
        f = _CMP[self.op]
        fa, fb = a.fn, b.fn
        proto = _proto_call(bad, lambda: f(a.proto, b.proto))
        return _Bound(pa.bool_(), lambda batch: f(fa(batch), fb(batch)), proto,
                      literal=a.literal and b.literal)


class Logic(_Binary):
    __slots__ = ()

    def _bind(self, schema: pa.Schema) -> _Bound:
        a, b = self.left._bind(schema), self.right._bind(schema)
        for e, x in ((self.left, a), (self.right, b)):
            if not (_is_bool(x.type) or _is_null(x.type)):
                raise _TypeFail(f"'{self.op}' needs booleans, but {_describe(e, x.type)} is not "
                                f"boolean (compare it, e.g. {e!r} != 0)")
        f = pc.and_kleene if self.op == "&" else pc.or_kleene
        fa, fb = a.fn, b.fn

        def run(batch):
            return f(_cast_value(fa(batch), pa.bool_()), _cast_value(fb(batch), pa.bool_()))
        proto = f(_cast_value(a.proto, pa.bool_()), _cast_value(b.proto, pa.bool_()))
        return _Bound(pa.bool_(), run, proto, literal=a.literal and b.literal)


class Unary(Expr):
    __slots__ = ("op", "arg")

    def __init__(self, op: str, arg: Expr):
        self.op, self.arg = op, arg

    def __repr__(self) -> str:
        if self.op == "abs":
            return f"{self.arg!r}.abs()"
        return f"({self.op}{self.arg!r})"

    def output_name(self) -> Optional[str]:
        return self.arg.output_name()

    def columns(self) -> set[str]:
        return self.arg.columns()

    def _bind(self, schema: pa.Schema) -> _Bound:
        a = self.arg._bind(schema)
        k = _kind(a.type)
        if self.op == "~":
            if k not in ("bool", "null"):
                raise _TypeFail(f"'~' (not) needs a boolean, but {_describe(self.arg, a.type)} "
                                f"is not boolean")
            f = lambda v: pc.invert(_cast_value(v, pa.bool_()))  # noqa: E731
        else:
            if k not in ("numeric", "duration", "null"):
                raise _TypeFail(f"'{self.op}' needs a number, but {_describe(self.arg, a.type)} "
                                f"is not numeric")
            f = pc.negate_checked if self.op == "-" else pc.abs_checked
        fn = a.fn
        proto = _proto_call(f"'{self.op}' of {_describe(self.arg, a.type)}", lambda: f(a.proto))
        return _Bound(proto.type, lambda batch: f(fn(batch)), proto, literal=a.literal)


class Func(Expr):
    """A function of argument expressions: ``check(types) -> result type`` (raising on bad
    types) and ``impl(values, n) -> value`` built from Arrow kernels."""

    __slots__ = ("fname", "args", "check", "impl", "params", "method")

    def __init__(self, fname: str, args: list[Expr], check: Callable, impl: Callable,
                 params: tuple = (), method: bool = True):
        self.fname, self.args, self.check, self.impl = fname, args, check, impl
        self.params, self.method = params, method

    def __repr__(self) -> str:
        ps = ", ".join(repr(p).replace("'", '"') for p in self.params)
        if self.method and self.args:
            head, rest = self.args[0], self.args[1:]
            inner = ", ".join([repr(r) for r in rest] + ([ps] if ps else []))
            return f"{head!r}.{self.fname}({inner})"
        inner = ", ".join([repr(r) for r in self.args] + ([ps] if ps else []))
        return f"{self.fname}({inner})"

    def output_name(self) -> Optional[str]:
        for a in self.args:
            n = a.output_name()
            if n:
                return n
        return None

    def columns(self) -> set[str]:
        out: set[str] = set()
        for a in self.args:
            out |= a.columns()
        return out

    def _bind(self, schema: pa.Schema) -> _Bound:
        bs = [a._bind(schema) for a in self.args]
        res = self.check([b.type for b in bs])
        if isinstance(res, str):  # an error message
            parts = ", ".join(_describe(e, b.type) for e, b in zip(self.args, bs))
            raise _TypeFail(f"{self.fname}() of {parts}: {res}")
        impl = self.impl
        fns = [b.fn for b in bs]
        what = f"{self.fname}() of " + ", ".join(_describe(e, b.type)
                                                 for e, b in zip(self.args, bs))
        proto = _proto_call(what, lambda: impl([b.proto for b in bs], 0))
        t = res if isinstance(res, pa.DataType) else proto.type
        if proto.type != t:
            proto = _cast_value(proto, t)

            def fn(batch, _t=t):
                return _cast_value(impl([f(batch) for f in fns], batch.num_rows), _t)
        else:
            def fn(batch):
                return impl([f(batch) for f in fns], batch.num_rows)
        return _Bound(t, fn, proto, literal=all(b.literal for b in bs))


def _check_round(ts):
    return None if _kind(ts[0]) in ("numeric", "null") else "needs a number"


class Alias(Expr):
    __slots__ = ("arg", "name")

    def __init__(self, arg: Expr, name: str):
        self.arg, self.name = arg, name

    def __repr__(self) -> str:
        return f"{self.arg!r}.alias({self.name!r})".replace("'", '"')

    def output_name(self) -> Optional[str]:
        return self.name

    def columns(self) -> set[str]:
        return self.arg.columns()

    def _bind(self, schema: pa.Schema) -> _Bound:
        return self.arg._bind(schema)


class Cast(Expr):
    __slots__ = ("arg", "to")

    def __init__(self, arg: Expr, to: pa.DataType):
        self.arg, self.to = arg, to

    def __repr__(self) -> str:
        return f"{self.arg!r}.cast({str(self.to)!r})".replace("'", '"')

    def output_name(self) -> Optional[str]:
        return self.arg.output_name()

    def columns(self) -> set[str]:
        return self.arg.columns()

    def _bind(self, schema: pa.Schema) -> _Bound:
        a = self.arg._bind(schema)
        to = self.to
        if a.type == to:
            return a
        try:
            pc.cast(pa.array([], type=a.type), to)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise _TypeFail(f"cannot cast {_describe(self.arg, a.type)} to {to}: {e}") from None
        fn = a.fn

        def run(batch):
            return _cast_value(fn(batch), to)
        proto = _proto_call(f"cast of {self.arg!r} to {to}", lambda: _cast_value(a.proto, to))
        return _Bound(to, run, proto, literal=a.literal)


class IsIn(Expr):
    __slots__ = ("arg", "values")

    def __init__(self, arg: Expr, values: list):
        self.arg, self.values = arg, values

    def __repr__(self) -> str:
        return f"{self.arg!r}.is_in({self.values!r})".replace("'", '"')

    def output_name(self) -> Optional[str]:
        return self.arg.output_name()

    def columns(self) -> set[str]:
        return self.arg.columns()

    def _bind(self, schema: pa.Schema) -> _Bound:
        a = self.arg._bind(schema)
        try:
            vs = pa.array(self.values, type=a.type if not _is_null(a.type) else None)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
            raise _TypeFail(f"values {self.values!r} do not fit the type of "
                            f"{_describe(self.arg, a.type)}: {e}") from None
        fn = a.fn

        def combine(v):
            return _null_where(pc.is_in(v, value_set=vs, skip_nulls=True), pc.is_null(v))
        return _Bound(pa.bool_(), lambda batch: combine(fn(batch)), combine(a.proto),
                      literal=a.literal)


class Coalesce(Expr):
    __slots__ = ("args", "name")

    def __init__(self, args: list[Expr], name: str = "coalesce"):
        if not args:
            raise TypeError("coalesce() needs at least one expression")
        self.args, self.name = args, name

    def __repr__(self) -> str:
        if self.name == "fill_null":
            return f"{self.args[0]!r}.fill_null({self.args[1]!r})"
        return f"coalesce({', '.join(repr(a) for a in self.args)})"

    def output_name(self) -> Optional[str]:
        for a in self.args:
            n = a.output_name()
            if n:
                return n
        return None

    def columns(self) -> set[str]:
        out: set[str] = set()
        for a in self.args:
            out |= a.columns()
        return out

    def _bind(self, schema: pa.Schema) -> _Bound:
        bs = [a._bind(schema) for a in self.args]
        head = next((b for b in bs if not b.literal), None)
        if head is not None:  # literals take the type of a column operand (str -> timestamp...)
            bs = [(_coerce_literals(head, b, self.args[0], e)[1] if b.literal else b)
                  for e, b in zip(self.args, bs)]
        t = common_type([b.type for b in bs], f"{self.name}() of "
                        + ", ".join(_describe(e, b.type) for e, b in zip(self.args, bs)))
        if _is_null(t):
            return bs[0]
        fns = [b.fn for b in bs]

        def combine(vals, n):
            vals = [_cast_value(v, t) for v in vals]
            if len(vals) == 1:
                return vals[0]
            if all(isinstance(v, pa.Scalar) for v in vals):
                return next((v for v in vals if v.is_valid), vals[-1])
            return pc.coalesce(*[_as_array(v, n) for v in vals])
        proto = combine([b.proto for b in bs], 0)
        return _Bound(t, lambda batch: combine([f(batch) for f in fns], batch.num_rows), proto,
                      literal=all(b.literal for b in bs))


class When(Expr):
    """``when(c1, v1).when(c2, v2).otherwise(v)``: the value of the first true condition."""

    __slots__ = ("cases", "default")

    def __init__(self, cases: list[tuple[Expr, Expr]], default: Optional[Expr] = None):
        self.cases, self.default = cases, default

    def when(self, cond: Any, value: Any) -> "When":
        if self.default is not None:
            raise TypeError("when() after otherwise()")
        return When(self.cases + [(_wrap(cond), _wrap(value))], None)

    def otherwise(self, value: Any) -> "When":
        if self.default is not None:
            raise TypeError("otherwise() given twice")
        return When(self.cases, _wrap(value))

    def __repr__(self) -> str:
        s = "".join(f".when({c!r}, {v!r})" for c, v in self.cases)[1:]
        if self.default is not None:
            s += f".otherwise({self.default!r})"
        return s

    def output_name(self) -> Optional[str]:
        for _, v in self.cases:
            n = v.output_name()
            if n:
                return n
        return self.default.output_name() if self.default is not None else None

    def columns(self) -> set[str]:
        out: set[str] = set()
        for c, v in self.cases:
            out |= c.columns() | v.columns()
        if self.default is not None:
            out |= self.default.columns()
        return out

    def _bind(self, schema: pa.Schema) -> _Bound:
        conds = [c._bind(schema) for c, _ in self.cases]
        for (ce, _), cb in zip(self.cases, conds):
            if not (_is_bool(cb.type) or _is_null(cb.type)):
                raise _TypeFail(f"when() condition {_describe(ce, cb.type)} is not boolean")
        vexprs = [v for _, v in self.cases] + ([self.default] if self.default is not None else [])
        vals = [v._bind(schema) for v in vexprs]
        head = next((b for b in vals if not b.literal), None)
        if head is not None:
            vals = [(_coerce_literals(head, b, vexprs[0], e)[1] if b.literal else b)
                    for e, b in zip(vexprs, vals)]
        t = common_type([b.type for b in vals], "when() values "
                        + ", ".join(_describe(e, b.type) for e, b in zip(vexprs, vals)))
        if _is_null(t):
            t = pa.null()
        cfns = [c.fn for c in conds]
        vfns = [v.fn for v in vals]
        has_default = self.default is not None

        def run(batch):
            n = batch.num_rows
            cs = [pc.fill_null(_as_array(_cast_value(f(batch), pa.bool_()), n), False)
                  for f in cfns]
            vs = [_as_array(_cast_value(f(batch), t), n) for f in vfns]
            if not has_default:
                vs.append(pa.nulls(n, t))
            return pc.case_when(pc.make_struct(*cs, field_names=[f"c{i}" for i in range(len(cs))]),
                                *vs)
        return _Bound(t, run, pa.array([], type=t))


# --- namespaces --------------------------------------------------------------------------

def _need(kind_ok: Callable[[pa.DataType], bool], what: str):
    def check(ts):
        if not (kind_ok(ts[0]) or _is_null(ts[0])):
            return f"needs {what}"
        return None
    return check


_STR = _need(_is_string, "a string")


class StrNamespace:
    """String functions (``col("s").str.…``); each needs a string operand."""

    def __init__(self, e: Expr):
        self._e = e

    def _f(self, name, impl, params=(), check=_STR, extra=()):
        return Func(f"str.{name}", [self._e, *extra], check, impl, params)

    def lower(self) -> Expr:
        return self._f("lower", lambda a, n: pc.utf8_lower(_cast_value(a[0], pa.string())))

    def upper(self) -> Expr:
        return self._f("upper", lambda a, n: pc.utf8_upper(_cast_value(a[0], pa.string())))

    def len(self) -> Expr:
        """Length in characters (int64)."""
        return self._f("len", lambda a, n: _cast_value(
            pc.utf8_length(_cast_value(a[0], pa.string())), pa.int64()))

    def contains(self, pattern: str, regex: bool = False) -> Expr:
        """True where the string contains ``pattern`` (literal; a regex with ``regex=True``)."""
        f = pc.match_substring_regex if regex else pc.match_substring
        return self._f("contains", lambda a, n: f(_cast_value(a[0], pa.string()), pattern),
                       (pattern,))

    def starts_with(self, prefix: str) -> Expr:
        return self._f("starts_with",
                       lambda a, n: pc.starts_with(_cast_value(a[0], pa.string()), prefix),
                       (prefix,))

    def ends_with(self, suffix: str) -> Expr:
        return self._f("ends_with",
                       lambda a, n: pc.ends_with(_cast_value(a[0], pa.string()), suffix),
                       (suffix,))

    def substr(self, start: int, length: Optional[int] = None) -> Expr:
        """Characters ``start .. start+length`` (0-based, like ``s[start:start+length]``)."""
        if start < 0 or (length is not None and length < 0):
            raise ValueError("substr(start, length) needs start >= 0 and length >= 0")
        stop = None if length is None else start + length
        params = (start,) if length is None else (start, length)
        return self._f("substr", lambda a, n: pc.utf8_slice_codeunits(
            _cast_value(a[0], pa.string()), start, stop), params)

    def replace(self, pattern: str, replacement: str) -> Expr:
        """Replace every occurrence of the literal ``pattern``."""
        return self._f("replace", lambda a, n: pc.replace_substring(
            _cast_value(a[0], pa.string()), pattern, replacement), (pattern, replacement))

    def strip(self) -> Expr:
        return self._f("strip", lambda a, n: pc.utf8_trim_whitespace(
            _cast_value(a[0], pa.string())))

    def concat(self, *others: Any, sep: str = "") -> Expr:
        """``self ++ sep ++ other ++ ...``; null if any part is null (SQL ``||``)."""
        return concat_str(self._e, *others, sep=sep)


def concat_str(*parts: Any, sep: str = "") -> Expr:
    """Concatenate string expressions (null if any part is null)."""
    es = [_wrap(p) for p in parts]

    def check(ts):
        for t in ts:
            if not (_is_string(t) or _is_null(t)):
                return "needs strings (cast other types with .cast('string'))"
        return pa.string()

    def impl(a, n):
        vals = [_cast_value(v, pa.string()) for v in a]
        if all(isinstance(v, pa.Scalar) for v in vals):
            if not all(v.is_valid for v in vals):
                return pa.scalar(None, pa.string())
            return pa.scalar(sep.join(v.as_py() for v in vals), pa.string())
        return pc.binary_join_element_wise(*vals, sep)
    f = Func("concat_str", es, check, impl, method=False)
    if sep:
        f.fname = f"concat_str[sep={sep!r}]"
    return f


def _ts_to_ms(v: Value) -> Value:
    t = v.type
    if pa.types.is_timestamp(t):
        if t.tz is not None:
            v = _cast_value(v, pa.timestamp(t.unit))
        v = _cast_value(v, pa.timestamp("ms")) if t.unit in ("s",) else v
        unit = v.type.unit
        i = _cast_value(v, pa.int64())
        if unit == "ms":
            return i
        if unit == "us":
            return pc.divide(pc.subtract(i, pc.modulo(i, 1000)), 1000)
        if unit == "ns":
            return pc.divide(pc.subtract(i, pc.modulo(i, 1_000_000)), 1_000_000)
        return i
    if pa.types.is_date32(t):
        return pc.multiply_checked(_cast_value(_cast_value(v, pa.int32()), pa.int64()), 86_400_000)
    if pa.types.is_date64(t):
        return _cast_value(v, pa.int64())
    return v


_UNIT_PER_MS = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}


def duration_to_units(d: Any, t: pa.DataType, what: str) -> int:
    """A window size / lateness (``timedelta`` or int) in the physical units of column type ``t``.

    Timestamps count their own unit, ``date32`` days, integer columns their own values (an int
    must then be given). Raises ``TypeError``/``ValueError`` on a mismatch.
    """
    if isinstance(d, (np.integer,)):
        d = int(d)
    if pa.types.is_integer(t):
        if isinstance(d, _dt.timedelta):
            raise TypeError(f"{what}: the time column is an integer ({t}); give an int in its "
                            f"units, not a timedelta")
        if not isinstance(d, int):
            raise TypeError(f"{what} must be an int, got {d!r}")
        return d
    if pa.types.is_timestamp(t) or pa.types.is_duration(t):
        if isinstance(d, int):
            raise TypeError(f"{what}: give a timedelta for a {t} column (an int would be "
                            f"ambiguous), got {d!r}")
        if not isinstance(d, _dt.timedelta):
            raise TypeError(f"{what} must be a timedelta, got {d!r}")
        us = (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds
        per_s = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}[t.unit]
        num = us * per_s
        if num % 1_000_000:
            raise ValueError(f"{what} {d} is not a whole number of {t.unit}")
        return num // 1_000_000
    if pa.types.is_date32(t):
        if not isinstance(d, _dt.timedelta) or d.seconds or d.microseconds:
            raise ValueError(f"{what} for a date column must be a timedelta of whole days")
        return d.days
    raise TypeError(f"{what}: column type {t} is not a time type (timestamp, date32 or integer)")


def physical_int(a: pa.Array) -> pa.Array:
    """The int64 storage of a timestamp / date / duration / integer column (nulls kept)."""
    t = a.type
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t):
        return a.cast(pa.int64())
    if pa.types.is_date32(t):
        return a.cast(pa.int32()).cast(pa.int64())
    if pa.types.is_integer(t):
        return a.cast(pa.int64()) if t != pa.int64() else a
    raise TypeError(f"column type {t} is not a time type")


def from_physical(a: Value, t: pa.DataType) -> Value:
    """Inverse of :func:`physical_int`."""
    if pa.types.is_date32(t):
        return _cast_value(_cast_value(a, pa.int32()), t)
    return _cast_value(a, t)


def is_time_type(t: pa.DataType) -> bool:
    return (pa.types.is_timestamp(t) or pa.types.is_date32(t) or pa.types.is_integer(t))


class DtNamespace:
    """Date/time functions (``col("date_time").dt.…``)."""

    def __init__(self, e: Expr):
        self._e = e

    def epoch_ms(self) -> Expr:
        """Milliseconds since the Unix epoch (int64) of a timestamp or date."""
        return Func("dt.epoch_ms", [self._e],
                    _need(lambda t: pa.types.is_timestamp(t) or pa.types.is_date(t),
                          "a timestamp or date"),
                    lambda a, n: _ts_to_ms(a[0]))

    def floor(self, every: Any) -> Expr:
        """Round down to a multiple of ``every`` (a ``timedelta``; an int for integer columns)
        counted from the epoch: the start of the tumbling window the value falls in."""
        def check(ts):
            t = ts[0]
            if not (is_time_type(t) or _is_null(t)):
                return "needs a timestamp, date32 or integer time column"
            try:
                duration_to_units(every, t, "floor size")
            except (TypeError, ValueError) as e:
                return str(e)
            return t

        def impl(a, n):
            v = a[0]
            t = v.type
            if _is_null(t):
                return v
            size = duration_to_units(every, t, "floor size")
            if size <= 0:
                raise ValueError("floor size must be positive")
            i = v.cast(pa.int64()) if not pa.types.is_date32(t) else \
                _cast_value(_cast_value(v, pa.int32()), pa.int64())
            f = pc.subtract(i, pc.modulo(i, size))
            return from_physical(f, t)
        return Func("dt.floor", [self._e], check, impl, params=(every,))

    def _part(self, name: str, fn) -> Expr:
        return Func(f"dt.{name}", [self._e],
                    _need(lambda t: pa.types.is_timestamp(t) or pa.types.is_date(t),
                          "a timestamp or date"),
                    lambda a, n: _cast_value(fn(a[0]), pa.int64()))

    def year(self) -> Expr:
        return self._part("year", pc.year)

    def month(self) -> Expr:
        return self._part("month", pc.month)

    def day(self) -> Expr:
        return self._part("day", pc.day)

    def hour(self) -> Expr:
        return self._part("hour", pc.hour)

    def minute(self) -> Expr:
        return self._part("minute", pc.minute)

    def second(self) -> Expr:
        return self._part("second", pc.second)

    def day_of_week(self) -> Expr:
        """Monday = 0 ... Sunday = 6."""
        return self._part("day_of_week", pc.day_of_week)

    def date(self) -> Expr:
        return Func("dt.date", [self._e], _need(pa.types.is_timestamp, "a timestamp"),
                    lambda a, n: _cast_value(a[0], pa.date32()))


# --- constructors ------------------------------------------------------------------------

def col(name: str) -> Expr:
    """The column ``name`` of the stream the expression is applied to."""
    return Col(name)


def lit(value: Any, type_: Any = None) -> Expr:
    """A constant (``type_`` optional: a ``pa.DataType`` or a type name)."""
    return Lit(value, type_)


def when(cond: Any, value: Any) -> When:
    """``when(c, v).when(c2, v2).otherwise(d)`` (SQL ``CASE WHEN``); null where nothing matches
    and there is no ``otherwise``."""
    return When([(_wrap(cond), _wrap(value))])


def coalesce(*exprs: Any) -> Expr:
    """The first non-null of ``exprs``."""
    return Coalesce([_wrap(e) for e in exprs])


def udf(fn: Callable[..., Any], *args: Any, type_: Any) -> Expr:
    """A vectorised user function of whole columns: ``fn(*arrays) -> array-like`` of ``type_``."""
    t = _as_type(type_)
    es = [_wrap(a) for a in args]

    def impl(a, n):
        arrs = [_as_array(v, n) for v in a]
        out = fn(*arrs)
        if isinstance(out, pa.ChunkedArray):
            out = out.combine_chunks()
        if not isinstance(out, pa.Array):
            out = pa.array(out, type=t)
        if len(out) != n:
            raise ValueError(f"udf {getattr(fn, '__name__', fn)} returned {len(out)} values "
                             f"for {n} rows")
        return _cast_value(out, t)
    return Func(f"udf[{getattr(fn, '__name__', 'fn')}]", es, lambda ts: t, impl, method=False)


# --- aggregates --------------------------------------------------------------------------

AGG_KINDS = ("count", "count_all", "sum", "avg", "min", "max", "count_distinct")


class AggExpr:
    """An aggregate over a group: ``sum_(col("price"))``, ``count()``, ``col("x").max()``.

    Used in ``group_by(...).agg(...)`` and ``window(...).agg(...)``; an ``AggExpr`` is not a row
    expression. ``count()`` counts rows; ``count(e)`` non-null values of ``e``.
    """

    __slots__ = ("kind", "arg", "name")

    def __init__(self, kind: str, arg: Optional[Expr], name: Optional[str] = None):
        if kind not in AGG_KINDS:
            raise ValueError(f"unknown aggregate {kind!r} (known: {AGG_KINDS})")
        self.kind, self.arg, self.name = kind, arg, name

    def alias(self, name: str) -> "AggExpr":
        return AggExpr(self.kind, self.arg, name)

    def output_name(self) -> Optional[str]:
        if self.name:
            return self.name
        if self.arg is None:
            return "count"
        base = self.arg.output_name()
        return f"{base}_{self.kind}" if base else None

    def __repr__(self) -> str:
        kind = {"count_all": "count", "sum": "sum_", "min": "min_", "max": "max_"}.get(
            self.kind, self.kind)
        inner = "" if self.arg is None else repr(self.arg)
        s = f"{kind}({inner})"
        return s + (f".alias({self.name!r})" if self.name else "")

    def __bool__(self):
        raise TypeError(f"the truth value of an aggregate is unknown: {self!r}")


def count(e: Any = None) -> AggExpr:
    """``count()``: rows in the group (their total weight); ``count(e)``: non-null values."""
    return AggExpr("count_all", None) if e is None else AggExpr("count", _wrap_col(e))


def sum_(e: Any) -> AggExpr:
    return AggExpr("sum", _wrap_col(e))


def avg(e: Any) -> AggExpr:
    return AggExpr("avg", _wrap_col(e))


mean = avg


def min_(e: Any) -> AggExpr:
    return AggExpr("min", _wrap_col(e))


def max_(e: Any) -> AggExpr:
    return AggExpr("max", _wrap_col(e))


def count_distinct(e: Any) -> AggExpr:
    return AggExpr("count_distinct", _wrap_col(e))


def _wrap_col(e: Any) -> Expr:
    """In an aggregate a bare string names a column (``sum_("price")``)."""
    return Col(e) if isinstance(e, str) else _wrap(e)


__all__ = ["Expr", "Col", "Lit", "When", "AggExpr", "Compiled", "ColumnNotFoundError", "col", "lit",
           "when", "coalesce", "concat_str", "udf", "count", "sum_", "avg", "mean", "min_", "max_",
           "count_distinct", "common_type", "duration_to_units", "physical_int", "from_physical",
           "is_time_type"]
