"""The operator interface every node of a circuit implements (one instance per worker).

An operator is *instantiated per worker* from a factory stored in the logical circuit, so every
worker owns its own state. Each step the scheduler calls :meth:`Operator.eval` with the current
values of the input streams (in dependency order). *Strict* operators (``z^-1`` and what is built
on it) instead produce their output from state at the start of a step with :meth:`output` and
consume their input at the end with :meth:`consume`; that is what lets a circuit have cycles.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .errors import ErrorSink


@dataclass
class WorkerContext:
    """What an operator instance knows about where it runs."""

    worker: int = 0
    workers: int = 1
    transport: Any = None  # a dbsp.circuit.exchange.Transport
    storage: Any = None  # the worker's dbsp.trace.spill.SpineStorage, None = in memory
    stats: dict = field(default_factory=dict)
    errors: ErrorSink = field(default_factory=ErrorSink)  # error policy + rows set aside


class Operator:
    """Base class. Subclasses override :meth:`eval` (or :meth:`output` / :meth:`consume`)."""

    strict = False
    name = "operator"

    def __init__(self, ctx: WorkerContext):
        self.ctx = ctx

    def eval(self, *inputs: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    # strict operators
    def output(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def consume(self, value: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # nested circuits: called when an enclosing scope starts / ends an iteration sequence
    def clock_start(self) -> None:
        pass

    def clock_end(self) -> None:
        pass

    # atomic steps: state kept outside spines (spines are journalled, dbsp.trace.journal)
    def savepoint(self) -> Any:
        """What :meth:`restore` needs to put this operator's non-spine state back as it is now
        (None: nothing to save). Called at the start of every step: keep it cheap (references)."""
        return None

    def restore(self, saved: Any) -> None:
        """Undo the step: the state saved by :meth:`savepoint`."""

    def state_rows(self) -> int:
        """Rows of state this operator keeps (for memory reports and GC tests)."""
        return 0

    def fixedpoint(self) -> Optional[bool]:
        """In a nested scope: whether this operator's output would not change any more."""
        return None
