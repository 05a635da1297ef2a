"""plus and minus: ``(a + b)[t] = a[t] + b[t]``, ``(a - b)[t] = a[t] - b[t]``; linear.

The operand streams must have the same type (same column names and types).
"""
from __future__ import annotations

from ..circuit.operator import Operator
from . import _values


def _check_same(streams) -> None:
    t0 = streams[0].type
    for s in streams[1:]:
        if s.type != t0:
            raise TypeError(f"cannot add streams of different types: {t0.describe()} and "
                            f"{s.type.describe()} ({t0} vs {s.type})")


class PlusOperator(Operator):
    passes_empty = True
    name = "plus"

    def __init__(self, ctx, type_, signs):
        super().__init__(ctx)
        self.type, self.signs = type_, signs

    def eval(self, *values):
        vals = [v if s > 0 else v.neg() for v, s in zip(values, self.signs)]
        return _values.add(self.type, vals)


def plus(first, *others):
    streams = [first, *others]
    _check_same(streams)
    signs = [1] * len(streams)
    return first.circuit.add_node("plus", lambda ctx: PlusOperator(ctx, first.type, signs),
                                  streams, first.type)


def minus(a, b):
    _check_same([a, b])
    return a.circuit.add_node("minus", lambda ctx: PlusOperator(ctx, a.type, [1, -1]), [a, b],
                              a.type)


__all__ = ["plus", "minus", "PlusOperator"]
