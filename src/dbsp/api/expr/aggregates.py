"""Aggregate expressions: what ``group_by(...).agg(...)`` and ``window(...).agg(...)`` compute.

``sum_(col("price"))``, ``count()``, ``col("x").max()``, ``avg("price").alias("mean_price")``:
an :class:`AggExpr` names an aggregate kind and its argument (a row expression). It is not a row
expression itself: using one inside ``col(...) + ...`` raises. The stream API compiles the
argument against the stream's schema and hands the kind to the aggregate operators
(:mod:`dbsp.operators.aggregate`, :mod:`dbsp.operators.window`), which state the maths.

>>> from dbsp.api.expr import col
>>> sum_("price"), count(), (col("x") * 2).max().alias("top")
(sum_(col("price")), count(), max_((col("x") * 2)).alias('top'))
>>> sum_("price").output_name(), count().output_name()
('price_sum', 'count')
"""
from __future__ import annotations

from typing import Any, Optional

from .tree import Col, Expr, _wrap, extension

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


__all__ = ["AGG_KINDS", "AggExpr", "count", "sum_", "avg", "mean", "min_", "max_",
           "count_distinct"]
