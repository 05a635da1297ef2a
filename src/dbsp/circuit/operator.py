"""The operator interface every node of a circuit implements (one instance per worker).

An operator is *instantiated per worker* from a factory stored in the logical circuit, so every
worker owns its own state. Each step the scheduler calls :meth:`Operator.eval` with the current
values of the input streams (in dependency order). *Strict* operators (``z^-1`` and what is built
on it) instead produce their output from state at the start of a step with :meth:`output` and
consume their input at the end with :meth:`consume`; that is what lets a circuit have cycles.

*State for checkpoints.* An operator names the attributes that hold its state in
:attr:`Stateful.state_attrs`; :meth:`Stateful.checkpoint_state` returns them at a step boundary,
each spine as its :class:`~dbsp.trace.spine.SpineImage` (the immutable batches and the key bound),
each nested stateful object (an aggregate's versioned rows, a nested circuit's scheduler) as its
own state, every other value as it is (values held between steps are never mutated in place:
a step replaces them). :meth:`Stateful.restore_state` puts such a state back into a freshly built
operator (spines refilled in place, so they keep their storage hooks). What to do with the state -
write the batches to files, pickle the rest, fsync, publish - is the checkpoint layer's business
(:mod:`dbsp.checkpoint`); operators do not know it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .errors import ErrorSink
from .exchange import ShardMap, as_shard_map
from ..trace.spine import Spine, SpineImage


@dataclass
class WorkerContext:
    """What an operator instance knows about where it runs."""

    worker: int = 0
    workers: int = 1
    transport: Any = None  # a dbsp.circuit.exchange.Transport
    storage: Any = None  # the worker's dbsp.trace.spill.SpineStorage, None = in memory
    stats: dict = field(default_factory=dict)
    errors: ErrorSink = field(default_factory=ErrorSink)  # error policy + rows set aside
    #: the layout: which worker owns each shard of the key hash (:class:`ShardMap`); None =
    #: the default layout of ``workers`` workers
    shards: Optional[ShardMap] = None

    def __post_init__(self) -> None:
        self.shards = as_shard_map(self.workers if self.shards is None else self.shards)
        if self.shards.workers != self.workers:
            raise ValueError(f"worker {self.worker}: layout {self.shards!r} is for "
                             f"{self.shards.workers} workers, the circuit has {self.workers}")


class NestedState(dict):
    """The state of a nested stateful object inside an operator's state (a marker type)."""


def capture(value: Any) -> Any:
    """A value's checkpoint form: spine -> :class:`SpineImage`, stateful object -> its
    :class:`NestedState`, list / tuple / dict -> elementwise, anything else as it is."""
    if isinstance(value, Spine):
        return value.image()
    if hasattr(value, "checkpoint_state"):
        return NestedState(value.checkpoint_state())
    if isinstance(value, (list, tuple)):
        return type(value)(capture(v) for v in value)
    if isinstance(value, dict):
        return {k: capture(v) for k, v in value.items()}
    return value


def _holds_state(v: Any) -> bool:
    return isinstance(v, (SpineImage, NestedState))


def restore(current: Any, saved: Any, where: str = "state") -> Any:
    """Put ``saved`` (made by :func:`capture`) back into ``current``; returns the new value."""
    if isinstance(saved, SpineImage):
        if not isinstance(current, Spine):
            raise TypeError(f"{where}: the checkpoint holds a spine, the circuit has "
                            f"{type(current).__name__}")
        current.restore(saved)
        return current
    if isinstance(saved, NestedState):
        if not hasattr(current, "restore_state"):
            raise TypeError(f"{where}: the checkpoint holds nested state, the circuit has "
                            f"{type(current).__name__}")
        current.restore_state(dict(saved))
        return current
    if isinstance(saved, dict) and not isinstance(saved, NestedState) \
            and isinstance(current, dict) and any(_holds_state(v) for v in saved.values()):
        if set(current) != set(saved):
            raise ValueError(f"{where}: keys {sorted(map(str, saved))} in the checkpoint, "
                             f"{sorted(map(str, current))} in the circuit")
        return {k: restore(current[k], v, f"{where}[{k!r}]") for k, v in saved.items()}
    if isinstance(saved, (list, tuple)) and isinstance(current, (list, tuple)) \
            and any(_holds_state(v) for v in saved):
        if len(current) != len(saved):
            raise ValueError(f"{where}: {len(saved)} items in the checkpoint, "
                             f"{len(current)} in the circuit")
        return type(current)(restore(c, v, f"{where}[{i}]")
                             for i, (c, v) in enumerate(zip(current, saved)))
    return saved


def spines_of(value: Any) -> list:
    """Every spine in a stateful value (an operator, a scheduler, a list ...), nested ones too."""
    if isinstance(value, Spine):
        return [value]
    if hasattr(value, "spines"):
        return value.spines()
    if isinstance(value, Stateful):
        return [sp for a in value.state_attrs for sp in spines_of(getattr(value, a))]
    if isinstance(value, (list, tuple)):
        return [sp for v in value for sp in spines_of(v)]
    if isinstance(value, dict):
        return [sp for v in value.values() for sp in spines_of(v)]
    return []


MEMORY_FIELDS = ("rows", "batches", "memory_bytes", "resident_bytes", "file_bytes", "memory_rows",
                 "arrow_bytes")


def sum_memory(parts) -> dict:
    """Field-wise sum of :meth:`Spine.memory`-shaped dicts (all zero for none)."""
    out = dict.fromkeys(MEMORY_FIELDS, 0)
    for p in parts:
        for k in MEMORY_FIELDS:
            out[k] += p[k]
    return out


class Stateful:
    """An object whose state a checkpoint saves: the attributes named in :attr:`state_attrs`."""

    #: attributes that hold state between steps (empty: nothing to save)
    state_attrs: tuple[str, ...] = ()

    def checkpoint_state(self) -> dict:
        """This object's state at a step boundary (see the module doc)."""
        return {a: capture(getattr(self, a)) for a in self.state_attrs}

    def restore_state(self, state: dict) -> None:
        """Put a state made by :meth:`checkpoint_state` back (into a freshly built object)."""
        missing = set(self.state_attrs) - set(state)
        extra = set(state) - set(self.state_attrs)
        if missing or extra:
            raise ValueError(f"{type(self).__name__}: checkpoint state has attributes "
                             f"{sorted(state)}, expected {sorted(self.state_attrs)}")
        for a in self.state_attrs:
            setattr(self, a, restore(getattr(self, a), state[a], f"{type(self).__name__}.{a}"))


class Operator(Stateful):
    """Base class. Subclasses override :meth:`eval` (or :meth:`output` / :meth:`consume`) and
    name their state in :attr:`state_attrs`."""

    strict = False
    name = "operator"
    #: this operator's error policy where it is not the worker's: the strictest policy of the
    #: inputs its rows come from (set by the scheduler from ``Node.info["errors"]``; see
    #: :mod:`dbsp.circuit.errors`)
    policy: Optional[str] = None
    #: ``eval`` on inputs that are all empty returns an empty value and changes no state (linear
    #: operators, joins, aggregates): the scheduler then reuses that value and skips the call
    passes_empty = False

    def __init__(self, ctx: WorkerContext):
        self.ctx = ctx

    @property
    def skipping(self) -> bool:
        """Whether a bad row here is set aside (``skip_and_report``) rather than raised."""
        p = self.policy
        return self.ctx.errors.skipping if p is None else p == "skip_and_report"

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

    def state_memory(self) -> dict:
        """What this operator's spines (nested ones included) cost: the sums of
        :meth:`~dbsp.trace.spine.Spine.memory` (rows, batches, memory / file / Arrow bytes)."""
        return sum_memory(sp.memory() for sp in spines_of(self))

    def fuse_input(self, upstream: "Operator") -> bool:
        """Plan-time fusion of a linear chain: ``upstream`` feeds only this operator (one input
        each, nothing else reads its stream). Return True to take over its work: the scheduler
        then no longer evaluates ``upstream`` and hands this operator ``upstream``'s input
        instead (this operator must compute on it what it would have computed on ``upstream``'s
        output, e.g. skip building a batch it does not need). Default: no fusion."""
        return False

    def fixedpoint(self) -> Optional[bool]:
        """In a nested scope: whether this operator's output would not change any more."""
        return None
