"""Circuits: the logical graph of operators, its per-worker replicas, and stepping.

A :class:`Circuit` is built once, through :class:`~dbsp.circuit.stream.Stream` methods, as a list
of nodes; each node holds a *factory* for its operator, the ids of its inputs and its stream type.
Because nodes are appended only after their inputs exist, construction order is a valid
evaluation order; cycles go through strict nodes (``z^-1``), whose output comes from state at the
start of a step and whose input (possibly defined later: a feedback edge) is consumed at the end.

On the first :meth:`Circuit.step` the graph is frozen and instantiated ``workers`` times (one
replica per worker, each with its own operator state). With ``storage=`` (a directory or a
:class:`~dbsp.storage.config.StorageConfig`) every worker gets a
:class:`~dbsp.storage.manager.WorkerStorage` in its :class:`WorkerContext`, and every spine its
operators build keeps state beyond the memory budget in layer files (:mod:`dbsp.storage`).
A step then:

1. validates nothing more (pushes were validated when made) and splits every input's pending rows
   into one contiguous slice per worker;
2. runs every replica through the node list (``runtime="threads"``: W threads stepping in
   lockstep, exchanges meeting in an in-process transport; ``runtime="processes"``: W forked
   worker processes exchanging over a socket mesh, see :mod:`dbsp.runtime.process`);
3. gathers the outputs of all workers into the output handles.

An error in any worker aborts the transport (so no worker hangs), and the step raises it.
"""
from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..algebra.schema import as_schema
from .operator import Operator, WorkerContext
from .types import IndexedType, ZSetType

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
    #: :mod:`dbsp.circuit.placement`
    info: dict = field(default_factory=dict)


class CircuitError(RuntimeError):
    """A step failed; the message names the operator and the worker."""


class Replica:
    """One worker's instance of a circuit: operator instances plus the step loop."""

    def __init__(self, nodes: list[Node], ctx: WorkerContext,
                 local_exchanges: frozenset = frozenset()):
        from ..storage.manager import use_storage
        self.nodes = nodes
        self.ctx = ctx
        with use_storage(ctx.storage):  # every spine the operators build gets this storage
            self.ops: list[Operator] = [n.factory(ctx) for n in nodes]
        for i in local_exchanges:  # their input arrives sharded (dbsp.circuit.placement)
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

    #: what a driver may ask a replica between steps (:meth:`call` of the executors)
    CALLS = ("state_rows", "profile")

    def state_rows(self) -> int:
        return sum(op.state_rows() for op in self.ops)

    def profile(self) -> np.ndarray:
        """Seconds spent in each operator so far."""
        return self.timing.copy()


def make_worker_context(storage_config: Any, w: int, workers: int,
                        transport: Any, storage: Any = None) -> WorkerContext:
    """A worker's context, with its own :class:`~dbsp.storage.manager.WorkerStorage` when the
    circuit has storage (``storage`` when the circuit built it already; else built here, where
    the worker runs: in a process runtime, after the fork)."""
    if storage is None and storage_config is not None:
        from ..storage.manager import WorkerStorage
        from ..storage.merge_process import start_helper
        storage = WorkerStorage(storage_config, w)
        start_helper(storage_config, w)
    return WorkerContext(w, workers, transport, storage)


class Circuit:
    """A circuit under construction, then running on ``workers`` replicas.

    >>> import pyarrow as pa, dbsp
    >>> c = dbsp.Circuit()
    >>> t = c.add_input("t", pa.schema([("x", pa.int64())]))
    >>> out = t.filter(lambda b: pa.compute.greater(b["x"], 1)).output()
    >>> _ = t.insert([(1,), (2,), (3,)]); c.step()
    >>> sorted(out.to_dict().items())
    [((2,), 1), ((3,), 1)]
    """

    def __init__(self, workers: int = 1, name: str = "circuit", transport: Any = None,
                 runtime: str = "threads", storage: Any = None):
        from ..storage.config import as_storage_config
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if runtime not in ("threads", "processes"):
            raise ValueError(f"runtime must be 'threads' or 'processes', got {runtime!r}")
        self.runtime = runtime
        self.workers = workers
        self.storage = as_storage_config(storage)
        self._worker_storage: dict = {}
        if self.storage is not None:
            import os
            os.makedirs(self.storage.dir, exist_ok=True)
            if not self._worker_processes:  # worker processes build their own, after the fork
                # set up now, not in the first step: merge helpers (forked before the storage
                # opens its ring and pool, which a helper builds for itself), then each worker's
                # storage (imports, Bloom parameters, backend: ~40 ms that otherwise land in the
                # first step)
                from ..storage.manager import WorkerStorage
                from ..storage.merge_process import start_helper
                for w in range(workers):
                    start_helper(self.storage, w)
                self._worker_storage = {w: WorkerStorage(self.storage, w)
                                        for w in range(workers)}
        self.name = name
        self.nodes: list[Node] = []
        self.inputs: dict[str, Any] = {}
        self.outputs: list[Any] = []
        self._transport = transport
        self._replicas: Optional[list[Replica]] = None
        self._executor: Any = None
        self._placement: Any = None
        self.steps = 0
        self._broken: Optional[BaseException] = None

    # -- construction ---------------------------------------------------------------------
    def add_node(self, name: str, factory: Factory, inputs: list[Any], type_: Any,
                 strict: bool = False, kind: str = "op"):
        from .stream import make_stream
        if self._executor is not None:
            raise RuntimeError(f"circuit '{self.name}' is running; operators cannot be added now")
        for s in inputs:
            if s.circuit is not self:
                raise ValueError(f"stream {s} belongs to another circuit")
        node = Node(len(self.nodes), name, factory, [s.node for s in inputs], type_, strict, kind)
        self.nodes.append(node)
        return make_stream(self, node.id, type_)

    def add_input(self, name: str, schema: Any, key: Optional[Sequence[str]] = None):
        """A new input stream of Z-sets over ``schema``; push data with its methods.

        ``key``: columns by which the input remembers its current rows, so that
        :meth:`~dbsp.operators.input.InputStream.upsert` can replace them.
        """
        from ..operators.input import add_input
        if name in self.inputs:
            raise ValueError(f"an input named '{name}' exists already")
        schema = as_schema(schema)
        state = None
        if key is not None:  # validated before the input exists
            from ..operators.upsert import KeyState
            state = KeyState(name, schema, key)
        s = add_input(self, name, schema)
        s._key = state
        self.inputs[name] = s
        return s

    def recursive(self, fn: Callable, *inputs: Any, **kw: Any):
        """The least fixed point ``x = fn(x, *inputs)`` at every step, by a nested circuit
        (see :mod:`dbsp.operators.recursive`)."""
        from ..operators.recursive import recursive
        return recursive(self, fn, *inputs, **kw)

    # -- running --------------------------------------------------------------------------
    @property
    def _worker_processes(self) -> bool:
        """Whether the workers run in processes of their own (one worker runs here)."""
        return self.runtime == "processes" and self.workers > 1

    @property
    def running(self) -> bool:
        return self._executor is not None

    def _start(self) -> None:
        from ..runtime.memory import tune_malloc
        from .placement import plan
        tune_malloc()
        self._placement = plan(self.nodes, self.workers)
        local = self._placement.local_exchanges
        if self._worker_processes:
            from ..runtime.process import ProcessPool
            # each worker process has its own accountant: it gets an equal share of the budget
            cfg = None if self.storage is None else self.storage.share(self.workers)
            self._executor = ProcessPool(self.nodes, self.workers,
                                         functools.partial(make_worker_context, cfg), local)
            return
        from ..runtime.exchange import InProcTransport
        transport = self._transport or InProcTransport(self.workers)
        self._replicas = [Replica(self.nodes,
                                  make_worker_context(self.storage, w, self.workers, transport,
                                                      self._worker_storage.get(w)), local)
                          for w in range(self.workers)]
        self._executor = _ThreadPool(self._replicas, transport)

    def step(self) -> None:
        """Run one step: feed pending input, update all state, fill the output handles."""
        if self._broken is not None:
            raise CircuitError(f"circuit '{self.name}' failed in an earlier step and cannot "
                               f"continue: {self._broken}") from self._broken
        if self._executor is None:
            self._start()
        W = self.workers
        per_worker: list[dict] = [{} for _ in range(W)]
        keys = self._placement.input_keys
        for inp in self.inputs.values():
            for w, part in enumerate(inp._split(W, keys.get(inp.node))):
                if part is not None:
                    per_worker[w][inp.node] = part
        try:
            outs = self._executor.step(per_worker)
        except BaseException as e:
            self._broken = e
            raise
        for out in self.outputs:
            out._gather([o.get(out.node) for o in outs])
        self.steps += 1

    def state_rows(self) -> int:
        """Rows of operator state over all workers."""
        if self._executor is None:
            return 0
        if self._replicas is None:
            return int(sum(self._executor.call("state_rows")))
        return sum(r.state_rows() for r in self._replicas)

    def storage_stats(self) -> dict:
        """Memory accountant and file counters of this process's workers (threads runtime; empty
        without storage or before the first step)."""
        if self.storage is None or self._replicas is None:
            return {}
        out: dict = {"workers": [r.ctx.storage.stats() for r in self._replicas]}
        out["memory"] = self._replicas[0].ctx.storage.accountant.stats()
        return out

    def profile(self) -> list[dict]:
        """Seconds spent in each operator, summed over workers (for ``dbsp profile``)."""
        if self._executor is None:
            return []
        if self._replicas is None:
            timing = sum(self._executor.call("profile"))
            return [{"id": n.id, "name": n.name, "seconds": float(timing[n.id])}
                    for n in self.nodes]
        tot = sum(r.timing for r in self._replicas)
        return [{"id": n.id, "name": n.name, "seconds": float(tot[n.id]),
                 "state_rows": sum(r.ops[n.id].state_rows() for r in self._replicas)}
                for n in self.nodes]

    def close(self) -> None:
        """Stop the workers (threads or processes). The circuit cannot step afterwards."""
        if self._executor is not None:
            self._executor.close()
            self._broken = self._broken or RuntimeError(f"circuit '{self.name}' was closed")
        if self.storage is not None:
            from ..storage.merge_process import stop_helpers
            stop_helpers(self.storage)

    def __enter__(self) -> "Circuit":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


class _ThreadPool:
    """W replicas in one process: inline for one worker, else one persistent thread each,
    stepping in lockstep with the driver."""

    def __init__(self, replicas: list[Replica], transport: Any):
        self.replicas = replicas
        self.transport = transport
        n = len(replicas)
        self._errors: list[Optional[BaseException]] = [None] * n
        self._stop = False
        self._threads: list[threading.Thread] = []
        if n > 1:
            self._go = threading.Barrier(n + 1)
            self._done = threading.Barrier(n + 1)
            self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True,
                                              name=f"dbsp-worker-{i}") for i in range(n)]
            for t in self._threads:
                t.start()

    def _run(self, i: int) -> None:
        while True:
            try:
                self._go.wait()
            except threading.BrokenBarrierError:
                return
            if self._stop:
                return
            try:
                self.replicas[i].step()
            except BaseException as e:  # reported by the driver
                self._errors[i] = e
                try:
                    self.transport.abort()
                except Exception:
                    pass
            try:
                self._done.wait()
            except threading.BrokenBarrierError:
                return

    def step(self, inputs: list[dict]) -> list[dict]:
        for r, inp in zip(self.replicas, inputs):
            r.feed(inp)
        if not self._threads:
            self.replicas[0].step()
        else:
            self._errors = [None] * len(self.replicas)
            self._go.wait()
            self._done.wait()
            errs = [e for e in self._errors if e is not None]
            if errs:
                from ..runtime.exchange import TransportAborted
                real = [e for e in errs if not isinstance(e, TransportAborted)]
                raise (real or errs)[0]
        return [r.take_outputs() for r in self.replicas]

    def call(self, name: str) -> list:
        return [getattr(r, name)() for r in self.replicas]

    def close(self) -> None:
        if not self._threads:
            return
        self._stop = True
        try:
            self._go.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []


__all__ = ["Circuit", "CircuitError", "Node", "Replica", "ZSetType", "IndexedType"]
