"""consolidate: sort and merge duplicate rows of each delta (a no-op on the Z-set's value)."""
from __future__ import annotations

from ..circuit.operator import Operator


class ConsolidateOperator(Operator):
    name = "consolidate"

    def eval(self, z):
        return z.consolidate()


def consolidate(stream):
    return stream.circuit.add_node("consolidate", ConsolidateOperator, [stream], stream.type)


__all__ = ["consolidate"]
