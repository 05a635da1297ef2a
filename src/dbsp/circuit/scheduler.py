"""The scheduler: one worker's instance of a circuit graph, and the order in which a step
evaluates it.

A :class:`Scheduler` instantiates every node's operator for one worker (inside
:func:`dbsp.trace.spill.use_storage`, so every spine those operators build keeps its state in the
worker's storage) and runs a step in three phases:

1. every strict operator (``z^-1`` and what is built on it) produces its output from the state
   it had at the start of the step;
2. every other operator is evaluated once, in construction order (a valid topological order),
   on the current values of its inputs; an operator that declares
   :attr:`~dbsp.circuit.operator.Operator.passes_empty` and whose inputs are all empty is not
   called: its value is the empty value it returned the first time its inputs were empty
   (values are immutable), so an idle part of a circuit costs a length check per operator;
3. every strict operator consumes its input, closing the step.

*Fusion.* When the scheduler is built, an operator whose one input comes from an operator that
feeds nothing else (one input itself, not strict, not an input or output node) is offered that
upstream operator (:meth:`~dbsp.circuit.operator.Operator.fuse_input`); if it accepts, the
upstream operator is not evaluated any more and its input is wired straight to the operator
that absorbed it (e.g. ``index_by`` into a linear aggregate, which then groups the rows itself
without consolidating them by value).

An error is annotated with the operator and the worker once (``add_note``) and re-raised.

*The native loop.* The plan (strict nodes, the evaluation order with each node's bound ``eval``
and input slots, the cache of empty values) is worked out once, at the first step, into a
:class:`dbsp._native.step.StepPlan`, which runs the three phases as a C loop; :meth:`Scheduler._step_ref`
is its Python twin (``Scheduler.native = False`` runs it instead; the tests hold the two
equal on random graphs). Each operator's time goes to :attr:`Scheduler.timing`, by the
monotonic clock (:data:`CLOCK` ``= "wall"``) or the stepping thread's CPU clock (``"thread"``,
for measurements that must not count another thread's work).

A top-level step (``atomic=True``) is a transaction: it runs inside a
:class:`~dbsp.trace.journal.StepJournal` (every spine insert and clear of this worker) after a
:meth:`~dbsp.circuit.operator.Operator.savepoint` of the operators with state outside spines.
The runtime, once every worker has answered, calls :meth:`Scheduler.commit` (drops the journal)
or :meth:`Scheduler.rollback` (undoes the journal, restores the savepoints, forgets this step's
values and outputs), so a failed step leaves every worker's state as it was before it.
Nested circuits (:mod:`dbsp.operators.recursive`) run a scheduler of their own per iteration.
How the workers' schedulers are driven (threads, processes, hosts) is the runtime's business.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from .._native.step import StepPlan
from ..trace.journal import StepJournal, use_journal
from ..trace.spill import use_storage
from .exchange import exchange_source
from .graph import Node
from .operator import Operator, WorkerContext, spines_of
from .types import IndexedType, ZSetType

__all__ = ["Scheduler", "ERRORS", "CLOCK"]

#: the clock each operator's time is read with: ``"wall"`` (monotonic) or ``"thread"`` (the
#: stepping thread's CPU time); read when a scheduler builds its plan (its first step)
CLOCK = "wall"

#: the key of a worker's outputs under which it hands over the rows it set aside
#: (:class:`~dbsp.circuit.errors.BadRows`)
ERRORS = "__errors__"

_ZSET_TYPES = (ZSetType, IndexedType)
_NOTHING_SAVED: list = []  # the savepoints of a scheduler with no operator keeping any


class Scheduler:
    """One worker's operator instances for ``nodes`` plus the step loop (see the module doc).

    ``local_exchanges``: ids of exchange nodes whose input arrives already sharded
    (:mod:`dbsp.runtime.placement`); their operators pass it through. It also names the sliced
    inputs whose rows the workers deal among themselves: each such input's operator gets the
    key of its local exchanges (``deal_key``).
    """

    #: run the step through the native plan (False: the Python twin, :meth:`_step_ref`)
    native = True

    def __init__(self, nodes: list[Node], ctx: WorkerContext,
                 local_exchanges: frozenset = frozenset(), atomic: bool = False):
        self.nodes = nodes
        self.ctx = ctx
        with use_storage(ctx.storage):  # every spine the operators build gets this storage
            self.ops: list[Operator] = [n.factory(ctx) for n in nodes]
        for i in local_exchanges:
            if nodes[i].kind == "input":  # a sliced input: its key is set below
                continue
            self.ops[i].local = True
            got = exchange_source(nodes, nodes[i])
            if got is not None and got[0] in local_exchanges:  # a sliced input: dealt here
                self.ops[got[0]].deal_key = got[1]
        for n, op in zip(nodes, self.ops):  # per-input error policies (dbsp.circuit.errors)
            p = n.info.get("errors")
            if p is not None and p != ctx.errors.policy:
                op.policy = p
        inputs = self._fuse(nodes)
        self.values: list[Any] = [None] * len(nodes)
        self.timing = np.zeros(len(nodes), dtype=np.float64)
        self.atomic = atomic
        #: operators keeping state outside spines (they override ``savepoint``)
        self._saving = [op for op in self.ops if type(op).savepoint is not Operator.savepoint]
        self._journal: StepJournal | None = None
        self._saved: list[Any] | None = None
        self._own_journal = StepJournal()
        self._in_journal = use_journal(self._own_journal)
        #: per node: None when it must always run, else its cached empty value (False until the
        #: first step whose inputs were all empty)
        by_id = {n.id: n for n in nodes}
        self._empty_out: list[Any] = [
            False if (not n.strict and ins and op.passes_empty
                      and all(isinstance(getattr(by_id.get(j), "type", None), _ZSET_TYPES)
                              for j in ins)) else None
            for n, op, ins in zip(nodes, self.ops, inputs)]
        # the step's plan, worked out once: strict nodes; the others in construction order with
        # their input node ids; each strict node with the node it consumes
        self._strict = [i for i, n in enumerate(nodes) if n.strict]
        self._order = [(i, tuple(inputs[i]), len(inputs[i])) for i, n in enumerate(nodes)
                       if not n.strict and i not in self._fused]
        self._consumers = [(i, n.inputs[0]) for i, n in enumerate(nodes) if n.strict]
        self._outputs = [i for i, n in enumerate(nodes) if n.kind == "output"]
        self._plan: StepPlan | None = None  # built at the first native step

    def _fuse(self, nodes: list[Node]) -> list[list[int]]:
        """Offer each operator the upstream operator that feeds only it (see the module doc);
        returns every node's inputs after fusion and sets :attr:`_fused` (the absorbed
        nodes)."""
        inputs = [list(n.inputs) for n in nodes]
        uses = [0] * len(nodes)
        for n in nodes:
            for j in n.inputs:
                uses[j] += 1
        self._fused: set[int] = set()
        for i, n in enumerate(nodes):
            if n.strict or n.kind != "op" or len(inputs[i]) != 1:
                continue
            j = inputs[i][0]
            up = nodes[j]
            if up.strict or up.kind != "op" or len(inputs[j]) != 1 or uses[j] != 1:
                continue
            if self.ops[i].fuse_input(self.ops[j]):
                inputs[i] = inputs[j]
                self._fused.add(j)
        return inputs

    def step(self) -> None:
        if not self.atomic:
            self._step()
            return
        if self._journal is not None:
            self.commit()  # a step the runtime did not roll back is final
        saving = self._saving
        self._saved = [op.savepoint() for op in saving] if saving else _NOTHING_SAVED
        self._journal = self._own_journal  # emptied by every commit and rollback: reused
        with self._in_journal:
            self._step()

    def commit(self) -> None:
        """The last step stands (every worker finished it)."""
        if self._journal is not None:
            self._journal.commit()
        self._journal, self._saved = None, None

    def rollback(self) -> None:
        """Undo the last step: every spine change and every operator's saved state; forget its
        values, pending inputs and outputs."""
        journal, saved = self._journal, self._saved
        self._journal, self._saved = None, None
        if journal is not None:
            journal.rollback()
        if saved is not None:
            for op, sv in zip(self._saving, saved):
                op.restore(sv)
        for i in range(len(self.values)):
            self.values[i] = None
        for n in self.nodes:
            op = self.ops[n.id]
            if n.kind == "input":
                op.pending = None
            elif n.kind == "output":
                op.last = None
        self.ctx.errors.take()

    def savepoint(self) -> list:
        """The saved state of every operator of this (nested) scheduler that keeps some."""
        return [op.savepoint() for op in self._saving]

    def restore(self, saved: list) -> None:
        for op, sv in zip(self._saving, saved):
            op.restore(sv)

    def _step(self) -> None:
        if not self.native:
            self._step_ref()
            return
        plan = self._plan
        if plan is None:
            plan = self._plan = self._build_plan()
        try:
            plan.run(self.values)
        except Exception as e:
            if plan.at >= 0 and not getattr(e, "_dbsp_located", False):
                self._locate(e, plan.at)
            raise

    def _build_plan(self) -> StepPlan:
        """The native plan of :meth:`_step_ref`'s loop (bound methods taken now, at the first
        step: an operator's ``eval`` is fixed once it has run)."""
        ops = self.ops
        return StepPlan([(i, ops[i].output, ops[i].consume, j) for i, j in self._consumers],
                        [(i, ops[i].eval, ins) for i, ins, _ in self._order],
                        self._empty_out, [n.name for n in self.nodes], self.timing, CLOCK)

    def _locate(self, e: BaseException, i: int) -> None:
        n = self.nodes[i]
        e._dbsp_located = True  # type: ignore[attr-defined]
        e.add_note(f"in operator #{n.id} '{n.name}' on worker {self.ctx.worker}")

    def _step_ref(self) -> None:
        """The step loop in Python: the reference twin of the native plan (see the module
        doc)."""
        ops, values, empty_out, timing = self.ops, self.values, self._empty_out, self.timing
        for i in self._strict:
            values[i] = ops[i].output()
        clock = time.thread_time if CLOCK == "thread" else time.perf_counter
        # one clock read per evaluated operator: its time runs from the end of the previous
        # evaluation (the idle checks of operators skipped in between, well under a
        # microsecond each, are counted with it)
        t0 = clock()
        for i, ins, k in self._order:
            eo = empty_out[i]
            idle = eo is not None
            if idle:  # a plain loop: no generator frame per operator and step
                for j in ins:
                    a = values[j]
                    if a is not None and len(a):
                        idle = False
                        break
            if idle and eo is not False:
                values[i] = eo
                continue
            try:
                if k == 1:
                    v = ops[i].eval(values[ins[0]])
                elif k == 2:
                    v = ops[i].eval(values[ins[0]], values[ins[1]])
                else:
                    v = ops[i].eval(*[values[j] for j in ins])
            except Exception as e:
                if not getattr(e, "_dbsp_located", False):
                    self._locate(e, i)
                raise
            values[i] = v
            t1 = clock()
            timing[i] += t1 - t0
            t0 = t1
            if idle:
                if len(v):
                    n = self.nodes[i]
                    raise RuntimeError(f"operator #{n.id} '{n.name}' declares passes_empty "
                                       f"but returned {len(v)} rows for empty inputs")
                empty_out[i] = v
        for i, j in self._consumers:
            ops[i].consume(values[j])
        for i in range(len(values)):
            values[i] = None  # release this step's batches

    def feed(self, inputs: dict) -> None:
        """Hand this step's input parts (``{input node: ZSet}``) to the input operators."""
        for node, value in inputs.items():
            self.ops[node].pending = value

    def take_outputs(self) -> dict:
        """``{output node: value}`` of the step just run (the operators let go of them)."""
        outs: dict = {}
        ops = self.ops
        for i in self._outputs:
            op = ops[i]
            outs[i], op.last = op.last, None
        errors = self.ctx.errors
        bad = errors.take() if errors.reports else None
        if bad:
            for b in bad:
                b.worker = self.ctx.worker
            outs[ERRORS] = bad
        return outs

    #: what a driver may ask a worker between steps (``call`` of the runtime's executors)
    CALLS = ("state_rows", "state_memory", "profile", "cpu_seconds", "layout", "wait_merges")

    # -- checkpoints (see dbsp.circuit.operator: Stateful) ---------------------------------
    def checkpoint_state(self) -> dict:
        """``{node id: state}`` of every stateful operator, at a step boundary."""
        return {i: op.checkpoint_state() for i, op in enumerate(self.ops) if op.state_attrs}

    def restore_state(self, state: dict) -> None:
        """Put back a state made by :meth:`checkpoint_state` (operators freshly built)."""
        want = {i for i, op in enumerate(self.ops) if op.state_attrs}
        if set(state) != want:
            raise ValueError(f"worker {self.ctx.worker}: checkpoint has state for operators "
                             f"{sorted(state)}, the circuit for {sorted(want)}")
        for i in sorted(want):
            self.ops[i].restore_state(state[i])

    def spines(self) -> list:
        """Every spine of this worker's operators (nested circuits included)."""
        return [sp for op in self.ops for sp in spines_of(op)]

    def close(self) -> None:
        """Wait for this worker's merges in flight and stop merging in the background (so that
        no merge writes a file after the circuit is closed)."""
        for sp in self.spines():
            sp.close()

    def apply(self, fn, *args):
        """``fn(self, *args)`` on this worker (the runtime's ``apply``: upper layers hand a
        module-level function, which a worker process receives by reference)."""
        return fn(self, *args)

    def state_rows(self) -> int:
        return sum(op.state_rows() for op in self.ops)

    def state_memory(self) -> list[dict]:
        """Each operator's :meth:`~dbsp.circuit.operator.Operator.state_memory`, by node id."""
        return [op.state_memory() for op in self.ops]

    def layout(self) -> dict:
        """The shard map this worker's exchanges shard by (``ShardMap.to_dict``)."""
        return self.ctx.shards.to_dict()

    @staticmethod
    def clock() -> float:
        """A reading of the clock operators are timed by (:data:`CLOCK`), in seconds."""
        return time.thread_time() if CLOCK == "thread" else time.perf_counter()

    def discount(self, seconds: float) -> None:
        """Take ``seconds`` off the time of the operator being evaluated now: the time this
        worker's step was switched out at an exchange while the other workers of the thread ran
        (a small step of the threads runtime), which its clock counted. Nothing outside an
        operator's evaluation (or in the Python step loop, which does not say where it is)."""
        plan = self._plan
        if plan is not None and plan.at >= 0:
            self.timing[plan.at] -= seconds

    def wait_merges(self) -> None:
        """Wait until none of this worker's spines owes or runs a merge (for benchmarks that
        charge a run the merges its own steps made owed, no more, no fewer)."""
        for sp in self.spines():
            sp.wait_merges()

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) of the process this worker runs in, so far (for the
        parallel-efficiency benchmark: a worker process's own cost)."""
        return time.process_time()

    def profile(self) -> np.ndarray:
        """Seconds spent in each operator so far."""
        return self.timing.copy()
