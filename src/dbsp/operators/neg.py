"""neg: ``(-a)[t] = -a[t]``, every weight negated; linear."""
from __future__ import annotations

from ..circuit.operator import Operator


class NegOperator(Operator):
    passes_empty = True
    name = "neg"

    def eval(self, value):
        return value.neg()


def neg(stream):
    return stream.circuit.add_node("neg", NegOperator, [stream], stream.type)


__all__ = ["neg", "NegOperator"]
