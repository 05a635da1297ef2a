"""delay: ``z^-1(a)[t] = a[t-1]``, ``z^-1(a)[0] = 0``; the strict operator that closes cycles.

A delay's output at step ``t`` is what its input was at step ``t-1``, so the scheduler asks for it
(:meth:`DelayOperator.output`) before evaluating anything, and hands it the new input
(:meth:`DelayOperator.consume`) after everything else. :func:`feedback` creates a delay whose input
is connected later, for recursive definitions.
"""
from __future__ import annotations

from ..circuit.operator import Operator
from ._values import empty_of


class DelayOperator(Operator):
    state_attrs = ('value',)

    name = "delay"
    strict = True

    def __init__(self, ctx, type_):
        super().__init__(ctx)
        self.type = type_
        self.value = empty_of(type_)
        self.initial = self.value

    def output(self):
        return self.value

    def consume(self, value) -> None:
        self.value = value if value is not None else empty_of(self.type)

    def clock_start(self) -> None:
        self.value = self.initial

    def savepoint(self):
        return self.value

    def restore(self, saved) -> None:
        self.value = saved

    def state_rows(self) -> int:
        return len(self.value)


def delay(stream):
    c = stream.circuit
    return c.add_node("delay", lambda ctx: DelayOperator(ctx, stream.type), [stream], stream.type,
                      strict=True)


class Feedback:
    """A delayed stream whose input is connected after it is used: ``x = f(z^-1(x))``."""

    def __init__(self, circuit, type_):
        self.circuit = circuit
        self.stream = circuit.add_node("feedback", lambda ctx: DelayOperator(ctx, type_), [],
                                       type_, strict=True)
        self._connected = False

    def connect(self, stream) -> None:
        if self._connected:
            raise RuntimeError("feedback already connected")
        if stream.type != self.stream.type:
            raise TypeError(f"feedback of type {self.stream.type.describe()} connected to "
                            f"{stream.type.describe()}")
        self.circuit.nodes[self.stream.node].inputs = [stream.node]
        self._connected = True


def feedback(circuit, type_) -> Feedback:
    return Feedback(circuit, type_)


__all__ = ["delay", "feedback", "Feedback", "DelayOperator"]
