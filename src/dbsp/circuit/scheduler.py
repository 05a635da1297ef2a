"""The scheduler: one worker's instance of a circuit graph, and the order in which a step
evaluates it.

A :class:`Scheduler` instantiates every node's operator for one worker (inside
:func:`dbsp.trace.spill.use_storage`, so every spine those operators build keeps its state in the
worker's storage) and runs a step in three phases:

1. every strict operator (``z^-1`` and what is built on it) produces its output from the state
   it had at the start of the step;
2. every other operator is evaluated once, in construction order (a valid topological order),
   on the current values of its inputs;
3. every strict operator consumes its input, closing the step.

An error is annotated with the operator and the worker once (``add_note``) and re-raised.
Nested circuits (:mod:`dbsp.operators.recursive`) run a scheduler of their own per iteration.
How the workers' schedulers are driven (threads, processes, hosts) is the runtime's business.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..trace.spill import use_storage
from .graph import Node
from .operator import Operator, WorkerContext

__all__ = ["Scheduler"]


class Scheduler:
    """One worker's operator instances for ``nodes`` plus the step loop (see the module doc).

    ``local_exchanges``: ids of exchange nodes whose input arrives already sharded
    (:mod:`dbsp.runtime.placement`); their operators pass it through.
    """

    def __init__(self, nodes: list[Node], ctx: WorkerContext,
                 local_exchanges: frozenset = frozenset()):
        self.nodes = nodes
        self.ctx = ctx
        with use_storage(ctx.storage):  # every spine the operators build gets this storage
            self.ops: list[Operator] = [n.factory(ctx) for n in nodes]
        for i in local_exchanges:
            self.ops[i].local = True
        self.values: list[Any] = [None] * len(nodes)
        self.timing = np.zeros(len(nodes), dtype=np.float64)

    def step(self) -> None:
        nodes, ops, values = self.nodes, self.ops, self.values
        for i, n in enumerate(nodes):
            if n.strict:
                values[i] = ops[i].output()
        for i, n in enumerate(nodes):
            if n.strict:
                continue
            t0 = time.perf_counter()
            try:
                values[i] = ops[i].eval(*[values[j] for j in n.inputs])
            except Exception as e:
                if getattr(e, "_dbsp_located", False):
                    raise
                e._dbsp_located = True  # type: ignore[attr-defined]
                e.add_note(f"in operator #{n.id} '{n.name}' on worker {self.ctx.worker}")
                raise
            self.timing[i] += time.perf_counter() - t0
        for i, n in enumerate(nodes):
            if n.strict:
                ops[i].consume(values[n.inputs[0]])
        for i in range(len(values)):
            values[i] = None  # release this step's batches

    def feed(self, inputs: dict) -> None:
        """Hand this step's input parts (``{input node: ZSet}``) to the input operators."""
        for node, value in inputs.items():
            self.ops[node].pending = value

    def take_outputs(self) -> dict:
        """``{output node: value}`` of the step just run (the operators let go of them)."""
        outs = {}
        for n in self.nodes:
            if n.kind == "output":
                op = self.ops[n.id]
                outs[n.id], op.last = op.last, None
        return outs

    #: what a driver may ask a worker between steps (``call`` of the runtime's executors)
    CALLS = ("state_rows", "profile", "cpu_seconds")

    def state_rows(self) -> int:
        return sum(op.state_rows() for op in self.ops)

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) of the process this worker runs in, so far (for the
        parallel-efficiency benchmark: a worker process's own cost)."""
        return time.process_time()

    def profile(self) -> np.ndarray:
        """Seconds spent in each operator so far."""
        return self.timing.copy()
