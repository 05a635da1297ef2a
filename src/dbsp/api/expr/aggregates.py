"""Aggregate expressions: what ``group_by(...).agg(...)`` and ``window(...).agg(...)`` compute.

``sum_(col("price"))``, ``count()``, ``col("x").max()``, ``avg("price").alias("mean_price")``:
an :class:`AggExpr` names an aggregate kind and its argument (a row expression). It is not a row
expression itself: using one inside ``col(...) + ...`` raises. The stream API compiles the
argument against the stream's schema and hands the kind to the aggregate operators
(:mod:`dbsp.operators.aggregate`, :mod:`dbsp.operators.window`), which state the maths.

SQL's ``HAVING``: in an expression (``count() > 1``, ``sum_("v") / count()``) an aggregate
becomes an :class:`AggRef`, a reference to the output column of the ``agg(...)`` that computes
it. ``group_by("k").agg(n=count()).filter(count() > 1)`` is ``filter(col("n") > 1)``
(:func:`resolve_aggregates`); an aggregate that no ``agg(...)`` before it computes is refused
with an error saying how to write the filter.

>>> from dbsp.api.expr import col
>>> sum_("price"), count(), (col("x") * 2).max().alias("top")
(sum_(col("price")), count(), max_((col("x") * 2)).alias('top'))
>>> sum_("price").output_name(), count().output_name()
('price_sum', 'count')
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import pyarrow as pa

from .tree import Col, Expr, _Bound, _wrap, extension

AGG_KINDS = ("count", "count_all", "sum", "avg", "min", "max", "count_distinct")


@extension("aggregate")
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

    def signature(self) -> tuple:
        """What the aggregate computes, without its name (two aggregates with the same
        signature give the same column)."""
        return (self.kind, repr(self.arg))

    # in an expression an aggregate stands for its output column (HAVING; see AggRef)
    def _ref(self) -> "AggRef":
        return AggRef(self)

    def __gt__(self, o): return self._ref() > o
    def __ge__(self, o): return self._ref() >= o
    def __lt__(self, o): return self._ref() < o
    def __le__(self, o): return self._ref() <= o
    def __eq__(self, o): return self._ref() == o  # type: ignore[override]
    def __ne__(self, o): return self._ref() != o  # type: ignore[override]
    def __add__(self, o): return self._ref() + o
    def __radd__(self, o): return o + self._ref()
    def __sub__(self, o): return self._ref() - o
    def __rsub__(self, o): return o - self._ref()
    def __mul__(self, o): return self._ref() * o
    def __rmul__(self, o): return o * self._ref()
    def __truediv__(self, o): return self._ref() / o
    def __rtruediv__(self, o): return o / self._ref()
    __hash__ = object.__hash__

    def between(self, lo: Any, hi: Any) -> Expr:
        return self._ref().between(lo, hi)

    def is_null(self) -> Expr:
        return self._ref().is_null()

    def is_not_null(self) -> Expr:
        return self._ref().is_not_null()


@extension("aggregate_ref")
class AggRef(Expr):
    """An aggregate used in a row expression: the output column of the ``agg(...)`` computing it.

    :func:`resolve_aggregates` replaces it by that column in a ``filter`` / ``select`` /
    ``with_columns`` right after an ``agg``; bound anywhere else, it raises a ``TypeError``
    saying how to write the expression.
    """

    __slots__ = ("agg",)

    def __init__(self, agg: AggExpr):
        self.agg = agg

    def __repr__(self) -> str:
        return repr(self.agg)

    def output_name(self) -> Optional[str]:
        return self.agg.output_name()

    def _bind(self, schema: pa.Schema) -> _Bound:
        raise TypeError(
            f"{self.agg!r} is an aggregate, and this stream is not the output of an agg(...) "
            f"that computes it. To filter groups on an aggregate (SQL HAVING), compute it in "
            f"agg(...) and use its output column: group_by(...).agg(n={self.agg!r})"
            f".filter(col('n') > ...)")


def _rebuild(e: Any, fn: Callable[[Expr], Optional[Expr]]) -> Any:
    """``e`` with every sub-expression ``x`` for which ``fn(x)`` is not None replaced by it
    (expressions, lists and tuples of them; other values as they are)."""
    if isinstance(e, (list, tuple)):
        out = [_rebuild(x, fn) for x in e]
        return out if isinstance(e, list) else tuple(out)
    if not isinstance(e, Expr):
        return e
    r = fn(e)
    if r is not None:
        return r
    slots = [s for c in type(e).__mro__ for s in getattr(c, "__slots__", ())]
    changed = {}
    for s in slots:
        if not hasattr(e, s):
            continue
        v = getattr(e, s)
        nv = _rebuild(v, fn)
        if nv is not v and not (isinstance(v, (list, tuple)) and list(nv) == list(v)
                                and all(a is b for a, b in zip(nv, v))):
            changed[s] = nv
    if not changed:
        return e
    new = object.__new__(type(e))
    for s in slots:
        if hasattr(e, s):
            object.__setattr__(new, s, changed.get(s, getattr(e, s)))
    return new


def has_aggregates(e: Any) -> bool:
    """Whether the expression refers to an aggregate (an :class:`AggRef`)."""
    found = []

    def visit(x: Expr):
        if isinstance(x, AggRef):
            found.append(x)
            return x
        return None
    _rebuild(e, visit)
    return bool(found)


def resolve_aggregates(e: Any, outputs: dict[str, AggExpr], where: str) -> Any:
    """``e`` with every aggregate replaced by the output column of ``outputs`` (name ->
    aggregate of the ``agg(...)`` before) that computes it; ``TypeError`` for one that none
    computes."""
    if isinstance(e, AggExpr):
        e = AggRef(e)
    by_sig = {}
    for name, a in outputs.items():
        by_sig.setdefault(a.signature(), name)

    def sub(x: Expr):
        if not isinstance(x, AggRef):
            return None
        name = by_sig.get(x.agg.signature())
        if name is None:
            have = ", ".join(f"{n}={a!r}" for n, a in outputs.items())
            raise TypeError(f"{where}: the aggregate {x.agg!r} is not computed by the agg(...) "
                            f"before it ({have}); add it there, e.g. agg(..., "
                            f"x={x.agg!r}), and filter on col('x')")
        return Col(name)
    return _rebuild(e, sub)


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


__all__ = ["AGG_KINDS", "AggExpr", "AggRef", "resolve_aggregates", "has_aggregates", "count", "sum_", "avg", "mean", "min_", "max_",
           "count_distinct"]
