"""The logical circuit: a graph of operator nodes, built once, then instantiated per worker.

A :class:`Graph` is built through stream verbs (:mod:`dbsp.operators.stream`) as a list of
:class:`Node` s; each node holds a *factory* for its operator, the ids of its inputs and its
stream type. Because nodes are appended only after their inputs exist, construction order is a
valid evaluation order; cycles go through strict nodes (``z^-1``), whose output comes from state
at the start of a step and whose input (possibly defined later: a feedback edge) is consumed at
the end. The :class:`~dbsp.circuit.scheduler.Scheduler` runs one worker's instance of the graph.

This layer knows no operator and no process: a graph makes the handle of a new node's stream
through the ``make_stream`` function it is given (the operator layer's stream classes), and the
runnable circuit (:class:`dbsp.runtime.circuit.Circuit`, a graph with inputs, outputs and
workers) lives in the runtime layer above.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .operator import Operator, WorkerContext

__all__ = ["Node", "Graph", "CircuitError", "ClosedError", "Factory"]

Factory = Callable[[WorkerContext], Operator]


@dataclass
class Node:
    id: int
    name: str
    factory: Factory
    inputs: list[int]
    type: Any
    strict: bool = False
    kind: str = "op"  # "input", "output", "op"
    #: facts about the operator the planner reads (``index_key``, ``exchange``): see
    #: :mod:`dbsp.runtime.placement`
    info: dict = field(default_factory=dict)


class CircuitError(RuntimeError):
    """A step failed; the message names the operator and the worker."""


class ClosedError(CircuitError):
    """The circuit (or the pipeline) was closed: nothing can be pushed or stepped any more."""


class Graph:
    """A circuit's node list under construction.

    ``make_stream(graph, node_id, type)`` returns the handle of a new node's stream (the stream
    classes of the operator layer); ``workers`` is the number of replicas the graph will run on
    (operators may plan for it, e.g. pre-aggregate before an exchange); ``outputs`` are the
    output handles built on it. Subclasses that run (the runtime's ``Circuit``) freeze the graph
    by overriding :attr:`running`.
    """

    def __init__(self, make_stream: Callable[["Graph", int, Any], Any], name: str = "circuit",
                 workers: int = 1):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.name = name
        self.workers = workers
        self.nodes: list[Node] = []
        self.outputs: list[Any] = []
        self._make_stream = make_stream
        self.closed = False

    def check_open(self, what: str = "use") -> None:
        """Raise :class:`ClosedError` when the circuit was closed."""
        if self.closed:
            raise ClosedError(f"circuit '{self.name}' is closed; cannot {what} it")

    @property
    def running(self) -> bool:
        """Whether the graph is frozen (operators cannot be added any more)."""
        return False

    def add_node(self, name: str, factory: Factory, inputs: list[Any], type_: Any,
                 strict: bool = False, kind: str = "op"):
        """Append a node fed by the streams ``inputs``; returns the handle of its stream."""
        if self.running:
            raise RuntimeError(f"circuit '{self.name}' is running; operators cannot be added now")
        for s in inputs:
            if s.circuit is not self:
                raise ValueError(f"stream {s} belongs to another circuit")
        node = Node(len(self.nodes), name, factory, [s.node for s in inputs], type_, strict, kind)
        self.nodes.append(node)
        return self._make_stream(self, node.id, type_)
