"""integrate: ``I(a)[t] = a[0] + ... + a[t]``, kept in a spine, output consolidated each step.

``integrate`` is linear and time-invariant; its output is the whole accumulated state, so it costs
``O(state)`` per step: operators that only need to *probe* the accumulated state (join, distinct,
aggregate) keep a trace instead and never call this.
"""
from __future__ import annotations

from ..circuit.operator import Operator
from ..trace.spine import Spine
from ._values import consolidated, empty_of


class IntegrateOperator(Operator):
    state_attrs = ('trace',)

    name = "integrate"

    def __init__(self, ctx, type_):
        super().__init__(ctx)
        self.type = type_
        self.trace = Spine(name="integrate")

    def eval(self, delta):
        d = consolidated(self.type, delta)
        if len(d):
            self.trace.insert(d)
        v = self.trace.consolidated()
        return v if v is not None else empty_of(self.type)

    def clock_start(self) -> None:
        self.trace.clear()

    def state_rows(self) -> int:
        return len(self.trace)


def integrate(stream):
    return stream.circuit.add_node("integrate", lambda ctx: IntegrateOperator(ctx, stream.type),
                                   [stream], stream.type)


__all__ = ["integrate", "IntegrateOperator"]
