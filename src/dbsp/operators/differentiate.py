"""differentiate: ``D(a)[t] = a[t] - a[t-1]`` (``D(a) = a - z^-1(a)``); inverse of integrate."""
from __future__ import annotations

from ..circuit.operator import Operator
from ._values import add, empty_of


class DifferentiateOperator(Operator):
    state_attrs = ('prev',)

    name = "differentiate"

    def __init__(self, ctx, type_):
        super().__init__(ctx)
        self.type = type_
        self.prev = empty_of(type_)

    def eval(self, value):
        out = add(self.type, [value, self.prev.neg()])
        self.prev = value
        return out

    def clock_start(self) -> None:
        self.prev = empty_of(self.type)

    def state_rows(self) -> int:
        return len(self.prev)


def differentiate(stream):
    return stream.circuit.add_node("differentiate",
                                   lambda ctx: DifferentiateOperator(ctx, stream.type),
                                   [stream], stream.type)


__all__ = ["differentiate", "DifferentiateOperator"]
