"""The expression tree: column expressions, typed at build time, evaluated with ``pyarrow.compute``.

An expression (``col("price") * 0.908``, ``when(col("qty") > 10, "bulk").otherwise("retail")``)
is a small tree. :meth:`Expr.compile` binds it to an input schema *when the pipeline is built*:
every column is looked up and every operator checks the types of its operands (with the type
system of :mod:`dbsp.algebra.dtypes`), so a typo or a type error (a string compared with an int,
arithmetic on strings) raises a :class:`TypeError` / :class:`ColumnNotFoundError` (a
``KeyError``) naming the column and the whole expression before any data flows. The compiled form
is a function ``RecordBatch -> pa.Array`` made of Arrow compute kernels over whole columns: no
Python runs per row.

This module holds the nodes (:class:`Col`, :class:`Lit`, arithmetic / comparison / logic,
:class:`Unary`, :class:`Func`, :class:`Cast`, :class:`IsIn`, :class:`Coalesce`, :class:`When`,
:class:`Alias`) and the constructors ``col``, ``lit``, ``when``, ``coalesce``, ``udf``. The
modules beside it build on it: :mod:`.strings` (the ``.str`` namespace, ``concat_str``),
:mod:`.datetime` (the ``.dt`` namespace) and :mod:`.aggregates` (``sum_``, ``count``...). They
import this module, never the reverse: each plugs its class into :class:`Expr` (the ``.str`` /
``.dt`` properties, the aggregate methods ``.sum()``...) with :func:`extension` when it is
imported, and the package :mod:`dbsp.api.expr` imports them all.

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
  ``float64``. **Division by zero** (``/``, ``//``, ``%``) is an error, as in ANSI SQL and
  Spark 4's default (ANSI mode): a number is right or an error, never a silent null. At run time
  the row is a :class:`~dbsp.circuit.errors.RowError` under ``errors="raise"`` (the step rolls
  back) or an error-stream record under ``"skip_and_report"``; a literal zero divisor is refused
  when the pipeline is built. :func:`try_divide` is the null-on-zero division (Spark's
  ``try_divide``).
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

import decimal as _decimal
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, TYPE_CHECKING, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...algebra.dtypes import (TypeMismatch, as_type, cast_value, common_type, is_bool, is_int,
                               is_null, is_string, is_temporal, kind_of)

if TYPE_CHECKING:  # the extensions import this module; these names are for annotations only
    from .aggregates import AggExpr
    from .datetime import DtNamespace
    from .strings import StrNamespace

Value = Union[pa.Array, pa.Scalar]
EvalFn = Callable[[pa.RecordBatch], Value]


class ColumnNotFoundError(KeyError):
    """An expression names a column the stream does not have (raised when the pipeline is built)."""

    def __str__(self) -> str:  # KeyError quotes its message; this one reads as a sentence
        return str(self.args[0]) if self.args else ""


class _Missing(KeyError):
    """Internal: an unknown column found while binding."""


# --- extensions --------------------------------------------------------------------------

_EXTENSIONS: dict[str, Callable[..., Any]] = {}


def extension(name: str) -> Callable[[type], type]:
    """Class decorator: make the class the extension ``name`` of every expression.

    ``"str"`` and ``"dt"``: a namespace class built from the expression (``Expr.str``,
    ``Expr.dt``); ``"aggregate"``: the aggregate class built from ``(kind, expression)``
    (``Expr.sum()``...); ``"aggregate_ref"``: the expression :func:`_wrap` makes of an aggregate
    used inside a row expression (a reference to an ``agg(...)`` output column).
    """
    def register(cls: type) -> type:
        _EXTENSIONS[name] = cls
        return cls
    return register


def _extension(name: str) -> Callable[..., Any]:
    try:
        return _EXTENSIONS[name]
    except KeyError:  # only if this module is loaded without its package
        raise RuntimeError(f"expression extension {name!r} is not loaded (import dbsp.api.expr)") \
            from None


# --- values ------------------------------------------------------------------------------

def _as_array(v: Value, n: int) -> pa.Array:
    if isinstance(v, pa.ChunkedArray):
        return v.combine_chunks()
    if isinstance(v, pa.Array):
        return v
    if not v.is_valid:
        return pa.nulls(n, v.type)
    return pa.repeat(v, n)


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

    def explain(self, batch: pa.RecordBatch) -> str:
        """This expression, for error messages."""
        return repr(self.expr)


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
        except TypeMismatch as e:
            raise TypeError(f"{e} in expression {self!r}{ctx}") from None
        return Compiled(self, b.type, b.fn)

    def children(self) -> tuple["Expr", ...]:
        """The sub-expressions this one reads (none for a column or a literal)."""
        return ()

    def output_name(self) -> Optional[str]:
        """The column name this expression produces by default: the first name among its
        sub-expressions (a column's own name, an alias)."""
        for c in self.children():
            n = c.output_name()
            if n:
                return n
        return None

    def columns(self) -> set[str]:
        """The input columns this expression reads."""
        out: set[str] = set()
        for c in self.children():
            out |= c.columns()
        return out

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
        return Cast(self, as_type(type_))

    # -- namespaces -----------------------------------------------------------------------
    @property
    def str(self) -> "StrNamespace":
        """String functions: ``col("name").str.lower()``."""
        return _extension("str")(self)

    @property
    def dt(self) -> "DtNamespace":
        """Date/time functions: ``col("date_time").dt.epoch_ms()``."""
        return _extension("dt")(self)

    # -- aggregates (for group_by(...).agg / window(...).agg) -------------------------------
    def sum(self) -> "AggExpr":
        return _extension("aggregate")("sum", self)

    def count(self) -> "AggExpr":
        """Number of non-null values."""
        return _extension("aggregate")("count", self)

    def mean(self) -> "AggExpr":
        return _extension("aggregate")("avg", self)

    avg = mean

    def min(self) -> "AggExpr":
        return _extension("aggregate")("min", self)

    def max(self) -> "AggExpr":
        return _extension("aggregate")("max", self)

    def count_distinct(self) -> "AggExpr":
        return _extension("aggregate")("count_distinct", self)

    # -- escape hatch ---------------------------------------------------------------------
    def map_batches(self, fn: Callable[[pa.Array], Any], type_: Any) -> "Expr":
        """A vectorised user function ``fn(pa.Array) -> array-like`` of ``type_``."""
        return udf(fn, self, type_=type_)


def _wrap(v: Any) -> Expr:
    if isinstance(v, Expr):
        return v
    agg = _EXTENSIONS.get("aggregate")
    if agg is not None and isinstance(v, agg):
        # a reference to an aggregate's output column: resolved after an agg(...) (HAVING),
        # refused with an explanation anywhere else (see AggRef)
        return _extension("aggregate_ref")(v)
    return Lit(v)


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
        t = None if type_ is None else as_type(type_)
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
            if isinstance(s, pa.Scalar) and not s.is_valid and not is_null(t):
                n = pa.scalar(None, type=t)
                return _Bound(t, lambda bb: n, n, literal=True)
            return lit_b
        st = s.type
        target = None
        if is_string(st) and is_temporal(t):
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
            raise TypeMismatch(f"cannot interpret {lit_e!r} as {target}: {e}") from None
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
        raise TypeMismatch(f"{what}: {e}") from None


class _Binary(Expr):
    """An operator with two operands (arithmetic, comparison, logic)."""

    __slots__ = ("op", "left", "right")

    def __init__(self, op: str, left: Expr, right: Expr):
        self.op, self.left, self.right = op, left, right

    def __repr__(self) -> str:
        return f"({self.left!r} {self.op} {self.right!r})"

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)


class Arith(_Binary):
    __slots__ = ()

    def _bind(self, schema: pa.Schema) -> _Bound:
        a, b = self.left._bind(schema), self.right._bind(schema)
        a, b = _coerce_literals(a, b, self.left, self.right)
        ta, tb = a.type, b.type
        op = self.op
        ka, kb = kind_of(ta), kind_of(tb)
        bad = f"cannot apply '{op}' to {_describe(self.left, ta)} and {_describe(self.right, tb)}"
        for k, e, t in ((ka, self.left, ta), (kb, self.right, tb)):
            if k in ("string", "binary", "bool"):
                raise TypeMismatch(f"{bad}: arithmetic on {k} {e!r} is not defined"
                                + (" (use .str.concat for strings)" if k == "string" else ""))
        if op in ("/", "//", "%"):
            if not ((ka in ("numeric", "null")) and (kb in ("numeric", "null"))):
                raise TypeMismatch(f"{bad}: '{op}' needs numbers")
            if op in ("//", "%") and (pa.types.is_decimal(ta) or pa.types.is_decimal(tb)):
                raise TypeMismatch(f"{bad}: '{op}' is not supported on decimals "
                                f"(cast to float64 or int64 first)")
            if b.literal and isinstance(b.proto, pa.Scalar) and b.proto.is_valid \
                    and b.proto.as_py() == 0:
                raise ValueError(f"division by zero in {self!r}: the divisor {self.right!r} is 0 "
                                 f"(try_divide gives a null instead)")
        fa, fb = a.fn, b.fn
        impl = _ARITH[op]
        proto = _proto_call(bad, lambda: impl(a.proto, b.proto))
        return _Bound(proto.type, lambda batch: impl(fa(batch), fb(batch)), proto,
                      literal=a.literal and b.literal)


def _refuse_zero(x: Value, y: Value) -> None:
    """A zero divisor of a non-null dividend is an error (ANSI SQL, and Spark 4's default); a
    null on either side gives null, as any operator on a null does."""
    if isinstance(y, pa.Scalar):
        if not (y.is_valid and y.as_py() == 0):
            return
        zero = x.is_valid if isinstance(x, pa.Scalar) else x.null_count < len(x)
    elif isinstance(x, pa.Scalar):
        zero = x.is_valid and pc.any(pc.equal(y, 0)).as_py() is True
    else:
        zero = pc.any(pc.and_(pc.equal(y, 0), pc.is_valid(x))).as_py() is True
    if zero:
        raise ZeroDivisionError("division by zero")


def _div(x: Value, y: Value) -> Value:
    x, y = cast_value(x, pa.float64()), cast_value(y, pa.float64())
    _refuse_zero(x, y)
    return pc.divide(x, y)


def _div_or_null(x: Value, y: Value) -> Value:
    x, y = cast_value(x, pa.float64()), cast_value(y, pa.float64())
    y = _null_where(y, pc.equal(y, 0.0))
    return pc.divide(x, y)


def _int_or_float(x: Value, y: Value) -> tuple[Value, Value, bool]:
    tx, ty = x.type, y.type
    ints = (is_int(tx) or is_null(tx)) and (is_int(ty) or is_null(ty))
    if ints:
        t = common_type([tx, ty], "integer division")
        if is_null(t):
            t = pa.int64()
        return cast_value(x, t), cast_value(y, t), True
    return cast_value(x, pa.float64()), cast_value(y, pa.float64()), False


def _mod(x: Value, y: Value) -> Value:
    x, y, ints = _int_or_float(x, y)
    _refuse_zero(x, y)
    return pc.modulo(x, y)  # floored: the sign of the divisor, like Python


def _floordiv(x: Value, y: Value) -> Value:
    x, y, ints = _int_or_float(x, y)
    _refuse_zero(x, y)
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
        ka, kb = kind_of(a.type), kind_of(b.type)
        bad = f"cannot compare {_describe(self.left, a.type)} with {_describe(self.right, b.type)}"
        if "null" not in (ka, kb) and ka != kb:
            raise TypeMismatch(bad)
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
            if not (is_bool(x.type) or is_null(x.type)):
                raise TypeMismatch(f"'{self.op}' needs booleans, but {_describe(e, x.type)} is not "
                                f"boolean (compare it, e.g. {e!r} != 0)")
        f = pc.and_kleene if self.op == "&" else pc.or_kleene
        fa, fb = a.fn, b.fn

        def run(batch):
            return f(cast_value(fa(batch), pa.bool_()), cast_value(fb(batch), pa.bool_()))
        proto = f(cast_value(a.proto, pa.bool_()), cast_value(b.proto, pa.bool_()))
        return _Bound(pa.bool_(), run, proto, literal=a.literal and b.literal)


class Unary(Expr):
    __slots__ = ("op", "arg")

    def __init__(self, op: str, arg: Expr):
        self.op, self.arg = op, arg

    def __repr__(self) -> str:
        if self.op == "abs":
            return f"{self.arg!r}.abs()"
        return f"({self.op}{self.arg!r})"

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def _bind(self, schema: pa.Schema) -> _Bound:
        a = self.arg._bind(schema)
        k = kind_of(a.type)
        if self.op == "~":
            if k not in ("bool", "null"):
                raise TypeMismatch(f"'~' (not) needs a boolean, but {_describe(self.arg, a.type)} "
                                f"is not boolean")
            f = lambda v: pc.invert(cast_value(v, pa.bool_()))  # noqa: E731
        else:
            if k not in ("numeric", "duration", "null"):
                raise TypeMismatch(f"'{self.op}' needs a number, but {_describe(self.arg, a.type)} "
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

    def children(self) -> tuple[Expr, ...]:
        return tuple(self.args)

    def _bind(self, schema: pa.Schema) -> _Bound:
        bs = [a._bind(schema) for a in self.args]
        res = self.check([b.type for b in bs])
        if isinstance(res, str):  # an error message
            parts = ", ".join(_describe(e, b.type) for e, b in zip(self.args, bs))
            raise TypeMismatch(f"{self.fname}() of {parts}: {res}")
        impl = self.impl
        fns = [b.fn for b in bs]
        what = f"{self.fname}() of " + ", ".join(_describe(e, b.type)
                                                 for e, b in zip(self.args, bs))
        proto = _proto_call(what, lambda: impl([b.proto for b in bs], 0))
        t = res if isinstance(res, pa.DataType) else proto.type
        if proto.type != t:
            proto = cast_value(proto, t)

            def fn(batch, _t=t):
                return cast_value(impl([f(batch) for f in fns], batch.num_rows), _t)
        else:
            def fn(batch):
                return impl([f(batch) for f in fns], batch.num_rows)
        return _Bound(t, fn, proto, literal=all(b.literal for b in bs))


def need(kind_ok: Callable[[pa.DataType], bool], what: str) -> Callable:
    """A :class:`Func` type check: the first operand must satisfy ``kind_ok`` (or be null);
    the result type is then the implementation's."""
    def check(ts):
        if not (kind_ok(ts[0]) or is_null(ts[0])):
            return f"needs {what}"
        return None
    return check


def _check_round(ts):
    return None if kind_of(ts[0]) in ("numeric", "null") else "needs a number"


class Alias(Expr):
    __slots__ = ("arg", "name")

    def __init__(self, arg: Expr, name: str):
        self.arg, self.name = arg, name

    def __repr__(self) -> str:
        return f"{self.arg!r}.alias({self.name!r})".replace("'", '"')

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def output_name(self) -> Optional[str]:
        return self.name

    def _bind(self, schema: pa.Schema) -> _Bound:
        return self.arg._bind(schema)


class Cast(Expr):
    __slots__ = ("arg", "to")

    def __init__(self, arg: Expr, to: pa.DataType):
        self.arg, self.to = arg, to

    def __repr__(self) -> str:
        return f"{self.arg!r}.cast({str(self.to)!r})".replace("'", '"')

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def _bind(self, schema: pa.Schema) -> _Bound:
        a = self.arg._bind(schema)
        to = self.to
        if a.type == to:
            return a
        try:
            pc.cast(pa.array([], type=a.type), to)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise TypeMismatch(f"cannot cast {_describe(self.arg, a.type)} to {to}: {e}") from None
        fn = a.fn

        def run(batch):
            return cast_value(fn(batch), to)
        proto = _proto_call(f"cast of {self.arg!r} to {to}", lambda: cast_value(a.proto, to))
        return _Bound(to, run, proto, literal=a.literal)


class IsIn(Expr):
    __slots__ = ("arg", "values")

    def __init__(self, arg: Expr, values: list):
        self.arg, self.values = arg, values

    def __repr__(self) -> str:
        return f"{self.arg!r}.is_in({self.values!r})".replace("'", '"')

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def _bind(self, schema: pa.Schema) -> _Bound:
        a = self.arg._bind(schema)
        try:
            vs = pa.array(self.values, type=a.type if not is_null(a.type) else None)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
            raise TypeMismatch(f"values {self.values!r} do not fit the type of "
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

    def children(self) -> tuple[Expr, ...]:
        return tuple(self.args)

    def _bind(self, schema: pa.Schema) -> _Bound:
        bs = [a._bind(schema) for a in self.args]
        head = next((b for b in bs if not b.literal), None)
        if head is not None:  # literals take the type of a column operand (str -> timestamp...)
            bs = [(_coerce_literals(head, b, self.args[0], e)[1] if b.literal else b)
                  for e, b in zip(self.args, bs)]
        t = common_type([b.type for b in bs], f"{self.name}() of "
                        + ", ".join(_describe(e, b.type) for e, b in zip(self.args, bs)))
        if is_null(t):
            return bs[0]
        fns = [b.fn for b in bs]

        def combine(vals, n):
            vals = [cast_value(v, t) for v in vals]
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
            if not (is_bool(cb.type) or is_null(cb.type)):
                raise TypeMismatch(f"when() condition {_describe(ce, cb.type)} is not boolean")
        vexprs = [v for _, v in self.cases] + ([self.default] if self.default is not None else [])
        vals = [v._bind(schema) for v in vexprs]
        head = next((b for b in vals if not b.literal), None)
        if head is not None:
            vals = [(_coerce_literals(head, b, vexprs[0], e)[1] if b.literal else b)
                    for e, b in zip(vexprs, vals)]
        t = common_type([b.type for b in vals], "when() values "
                        + ", ".join(_describe(e, b.type) for e, b in zip(vexprs, vals)))
        if is_null(t):
            t = pa.null()
        cfns = [c.fn for c in conds]
        vfns = [v.fn for v in vals]
        has_default = self.default is not None

        def run(batch):
            n = batch.num_rows
            cs = [pc.fill_null(_as_array(cast_value(f(batch), pa.bool_()), n), False)
                  for f in cfns]
            vs = [_as_array(cast_value(f(batch), t), n) for f in vfns]
            if not has_default:
                vs.append(pa.nulls(n, t))
            return pc.case_when(pc.make_struct(*cs, field_names=[f"c{i}" for i in range(len(cs))]),
                                *vs)
        return _Bound(t, run, pa.array([], type=t))


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


def try_divide(x: Any, y: Any) -> Expr:
    """``x / y`` as ``float64``, null where ``y`` is 0 (Spark's ``try_divide``; plain ``/`` makes
    a zero divisor an error)."""
    def check(ts):
        if not all(kind_of(t) in ("numeric", "null") for t in ts):
            return "needs numbers"
        return pa.float64()
    return Func("try_divide", [_wrap(x), _wrap(y)], check,
                lambda a, n: _div_or_null(a[0], a[1]), method=False)


def udf(fn: Callable[..., Any], *args: Any, type_: Any) -> Expr:
    """A vectorised user function of whole columns: ``fn(*arrays) -> array-like`` of ``type_``."""
    t = as_type(type_)
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
        return cast_value(out, t)
    return Func(f"udf[{getattr(fn, '__name__', 'fn')}]", es, lambda ts: t, impl, method=False)


__all__ = ["Expr", "Col", "Lit", "Arith", "Compare", "Logic", "Unary", "Func", "Alias", "Cast",
           "IsIn", "Coalesce", "When", "Compiled", "ColumnNotFoundError", "Value", "EvalFn",
           "col", "lit", "when", "coalesce", "try_divide", "udf", "extension", "need"]
