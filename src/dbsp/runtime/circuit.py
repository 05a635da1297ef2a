"""The runnable circuit: a graph with inputs and outputs, run on W worker replicas in lockstep.

A :class:`Circuit` is a :class:`~dbsp.circuit.graph.Graph` (built through the stream verbs of
:mod:`dbsp.operators.stream`) plus its input and output handles, its workers and its storage.
On the first :meth:`Circuit.step` the graph is frozen and instantiated ``workers`` times (one
:class:`~dbsp.circuit.scheduler.Scheduler` per worker, each with its own operator state). With
``storage=`` (a directory or a :class:`~dbsp.storage.config.StorageConfig`) every worker gets a
:class:`~dbsp.trace.spill.SpineStorage` in its :class:`~dbsp.circuit.operator.WorkerContext`, and
every spine its operators build keeps state beyond the memory budget in layer files
(:mod:`dbsp.storage`). A step then:

1. validates nothing more (pushes were validated when made) and splits every input's pending rows
   into one contiguous slice per worker;
2. runs every replica through the node list (``runtime="threads"``: W threads stepping in
   lockstep, exchanges meeting in an in-process transport, see :mod:`dbsp.runtime.threads`;
   ``runtime="processes"``: worker 0 here and W-1 forked worker processes exchanging over a
   socket mesh, see :mod:`dbsp.runtime.process`);
3. gathers the outputs of all workers into the output handles, and the rows operators set
   aside under ``errors="skip_and_report"`` into :attr:`Circuit.error_log`.

A step is atomic. An error in any worker aborts the transport (so no worker hangs); then every
worker rolls the step back (:meth:`~dbsp.circuit.scheduler.Scheduler.rollback`: state as before
the step), the transport is made usable again, and the step raises the error, with the step's
input (which was not applied) in ``error.rejected_input`` (``{input name: pa.Table}`` with a
``__weight`` column). The next step works. Only a worker process that died, or a rollback that
failed, leaves the circuit unusable, and then every later step says so.

:meth:`Circuit.close` is final and idempotent: every later push or step raises
:class:`~dbsp.circuit.graph.ClosedError`.

A circuit with storage holds the directory's exclusive lock
(:class:`~dbsp.storage.lock.DirectoryLock`) from construction to :meth:`Circuit.close`. For the
checkpoint layer above it offers, between steps: :meth:`Circuit.apply` (a function run on every
worker, in the worker's own process), :meth:`Circuit.driver_state` / :meth:`restore_driver_state`
(the state this process keeps besides the workers': keyed inputs, output views, the step count)
and :meth:`Circuit.fingerprint` (what a checkpoint must match to be restored into this circuit).

*Layout.* Where a key lives is the circuit's :attr:`Circuit.layout`, a
:class:`~dbsp.circuit.exchange.ShardMap` (by default the dynamic map of ``workers`` workers):
every worker's exchanges and the driver's input placement shard by it. A checkpoint records it
(:meth:`Circuit.layout_info`, with the host of each worker); a circuit resumed from a checkpoint
takes the checkpoint's map (:meth:`Circuit.set_layout`, before the workers start), resized when
the worker count changed (:mod:`dbsp.checkpoint.reshard` then moves the state).
"""
from __future__ import annotations

import functools
import hashlib
import os
import socket
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pyarrow as pa

from ..algebra.schema import WEIGHT, as_schema
from ..circuit.errors import (DEFAULT_ERROR_CAP, ErrorLog, ErrorSink, RowError, check_policy,
                              node_policies)
from ..circuit.exchange import ShardMap, as_shard_map
from ..circuit.graph import CircuitError, ClosedError, Graph
from ..circuit.operator import WorkerContext, sum_memory
from ..circuit.scheduler import ERRORS, Scheduler
from ..operators.input import add_input
from ..operators.recursive import recursive
from ..operators.stream import make_stream
from ..operators.upsert import KeyState
from ..storage.config import as_storage_config
from ..storage.lock import DirectoryLock
from ..storage.memory import tune_malloc
from ..trace.merge_helper import start_helper, stop_helpers
from ..trace.spill import SpineStorage
from .placement import plan
from .process import ProcessPool, WorkerDied
from .slices import SLICES, SliceRead, SliceReader, deal_pieces, gather_report
from .threads import InProcTransport, ThreadPool


def make_worker_context(storage_config: Any, w: int, workers: int,
                        transport: Any, storage: Any = None,
                        errors: str = "raise", shards: Optional[ShardMap] = None
                        ) -> WorkerContext:
    """A worker's context, with its own :class:`~dbsp.trace.spill.SpineStorage` when the
    circuit has storage (``storage`` when the circuit built it already; else built here, where
    the worker runs: in a process runtime, after the fork). ``shards``: the layout (default:
    the dynamic map of ``workers`` workers)."""
    if storage is None and storage_config is not None:
        storage = SpineStorage(storage_config, w)
        start_helper(storage_config, w)
    return WorkerContext(w, workers, transport, storage, errors=ErrorSink(errors),
                         shards=shards)


def set_worker_layout(sched: Scheduler, layout: dict) -> None:
    """Give a worker (in its own process: run through ``apply``) the layout ``layout``
    (:meth:`ShardMap.to_dict`), before its first step."""
    shards = ShardMap.from_dict(layout)
    if shards.workers != sched.ctx.workers:
        raise ValueError(f"worker {sched.ctx.worker}: layout for {shards.workers} workers, the "
                         f"circuit has {sched.ctx.workers}")
    sched.ctx.shards = shards


def _per_row(m: dict) -> dict:
    r = m["memory_rows"]
    m["bytes_per_row"] = round((m["memory_bytes"] - m["resident_bytes"]) / r, 1) if r else None
    m["arrow_bytes_per_row"] = round(m["arrow_bytes"] / r, 1) if r else None
    return m


class Circuit(Graph):
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
                 runtime: str = "threads", storage: Any = None, errors: str = "raise",
                 executor: Any = None, error_cap: Optional[int] = DEFAULT_ERROR_CAP):
        """``executor``: runs the replicas somewhere else, a callable ``(nodes, workers, local
        exchanges) -> executor`` (an object with ``step(per_worker_inputs) -> per_worker_outputs``,
        ``call(name)`` and ``close()``), such as the launcher's coordinator
        (:mod:`dbsp.runtime.launcher`); this circuit then only splits input and gathers
        output, and ``runtime`` and ``storage`` are the remote workers' business."""
        super().__init__(make_stream, name, workers)
        #: what an operator does with a row that fails: ``"raise"`` or ``"skip_and_report"``
        #: (see :mod:`dbsp.circuit.errors`); fixed when the circuit starts
        self.errors = check_policy(errors)
        #: rows set aside under ``skip_and_report``, by every operator and every input
        self.error_log = ErrorLog(error_cap)
        self._executor_factory = executor
        if executor is not None and storage is not None:
            raise ValueError("a circuit with a remote executor has no storage of its own: give "
                             "the storage to the workers")
        if runtime not in ("threads", "processes"):
            raise ValueError(f"runtime must be 'threads' or 'processes', got {runtime!r}")
        self.runtime = runtime
        #: where each key lives (see the module doc); fixed once the workers start
        self.layout: ShardMap = as_shard_map(workers)
        self.storage = as_storage_config(storage)
        self._worker_storage: dict = {}
        self._lock: Optional[DirectoryLock] = None
        if self.storage is not None:
            os.makedirs(self.storage.dir, exist_ok=True)
            # before anything in the directory is touched (worker storage removes temporaries)
            self._lock = DirectoryLock(self.storage.dir)
            if not self._worker_processes:  # worker processes build their own, after the fork
                # set up now, not in the first step: merge helpers (forked before the storage
                # opens its ring and pool, which a helper builds for itself), then each worker's
                # storage (imports, Bloom parameters, backend: ~40 ms that otherwise land in the
                # first step)
                for w in range(workers):
                    start_helper(self.storage, w)
                self._worker_storage = {w: SpineStorage(self.storage, w)
                                        for w in range(workers)}
        self.inputs: dict[str, Any] = {}
        self._transport = transport
        self._replicas: Optional[list[Scheduler]] = None
        self._executor: Any = None
        self._placement: Any = None
        self._viewed: list = []
        self.steps = 0
        self._broken: Optional[BaseException] = None
        # small state of the layers above (name -> (get, set)), saved with the driver's state
        self._state_hooks: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {}
        self._initial: Optional[dict] = None  # driver_state() before the first step
        #: inputs the workers read themselves from sliced sources (:meth:`slice_inputs`)
        self.sliced: set[str] = set()
        self._slice_reads: dict[str, tuple] = {}  # input -> (source, pieces, expect, checksum)
        #: per input read from a sliced source in the last step: ``{"pieces": [...],
        #: "report": [(rows, crc) per piece]}``
        self.last_slices: dict[str, dict] = {}

    # -- construction ---------------------------------------------------------------------
    def add_input(self, name: str, schema: Any, key: Optional[Sequence[str]] = None):
        """A new input stream of Z-sets over ``schema``; push data with its methods.

        ``key``: columns by which the input remembers its current rows, so that
        :meth:`~dbsp.operators.input.InputStream.upsert` can replace them.
        """
        if name in self.inputs:
            raise ValueError(f"an input named '{name}' exists already")
        schema = as_schema(schema)
        state = None
        if key is not None:  # validated before the input exists
            state = KeyState(name, schema, key)
        s = add_input(self, name, schema)
        s._key = state
        self.inputs[name] = s
        return s

    def slice_inputs(self, *names: str) -> None:
        """Inputs ``names`` will (also) be read by the workers themselves from sliced sources
        (:meth:`read_slices`): the driver's placement leaves them out (see
        :mod:`dbsp.runtime.slices`). Only before the workers start."""
        unknown = [n for n in names if n not in self.inputs]
        if unknown:
            raise KeyError(f"slice_inputs: no input named {unknown[0]!r} (inputs: "
                           f"{', '.join(self.inputs)})")
        if self._executor is not None and not set(names) <= self.sliced:
            raise CircuitError(f"circuit '{self.name}' is running: name its sliced inputs "
                               f"before the first step")
        self.sliced.update(names)

    def unplaced(self) -> frozenset:
        """Node ids of the inputs read from sliced sources (:meth:`slice_inputs`)."""
        return frozenset(self.inputs[n].node for n in self.sliced)

    def read_slices(self, name: str, source: Any, step: Optional[int] = None, *,
                    pieces: Optional[Sequence] = None, expect: Optional[Sequence] = None,
                    checksum: bool = False) -> int:
        """The next step, input ``name`` also gets step ``step`` of ``source`` (a
        :class:`~dbsp.runtime.slices.SlicedSource`): its pieces dealt to the workers by index,
        each worker reading its own (remote workers read them where they run; the embedded
        runtimes read them here). ``pieces`` instead of ``step``: those pieces (a replay);
        ``expect``: per piece the ``(rows, crc)`` they must read back as; ``checksum``: have
        the workers report each piece's crc (:attr:`last_slices`). Returns the number of
        pieces (0: the source has no step ``step``; nothing is read)."""
        self.check_open("read slices into")
        if name not in self.sliced:
            raise ValueError(f"input {name!r} is not read from a sliced source: name it with "
                             f"slice_inputs({name!r}) (launch(sliced=[...])) before the first "
                             f"step")
        if name in self._slice_reads:
            raise ValueError(f"input {name!r} has a sliced read pending already: step first")
        if pieces is None:
            if step is None:
                raise ValueError("read_slices: give the source's step or its pieces")
            got = source.pieces(step)
            if got is None:
                return 0
            pieces = list(got)
        pieces = list(pieces)
        if expect is not None and len(expect) != len(pieces):
            raise ValueError(f"read_slices: {len(expect)} expectations for {len(pieces)} pieces")
        if pieces:
            self._slice_reads[name] = (source, pieces, None if expect is None else list(expect),
                                       checksum)
        return len(pieces)

    @property
    def slices_pending(self) -> bool:
        """Whether sliced reads are pending for the next step (:meth:`read_slices`)."""
        return bool(self._slice_reads)

    def _slice_requests(self, reads: dict) -> list[dict]:
        """Per worker ``{input node: SliceRead}`` of ``reads`` (the pending reads)."""
        W = self.workers
        out: list[dict] = [{} for _ in range(W)]
        for name, (source, pieces, expect, checksum) in reads.items():
            node = self.inputs[name].node
            reader = source.reader() if hasattr(source, "reader") else source
            for w, idx in enumerate(deal_pieces(pieces, W)):
                if idx:
                    out[w][node] = SliceRead(name, reader, tuple(pieces[i] for i in idx),
                                             None if expect is None else
                                             tuple(expect[i] for i in idx), checksum)
        return out

    def recursive(self, fn: Callable, *inputs: Any, **kw: Any):
        """The least fixed point ``x = fn(x, *inputs)`` at every step, by a nested circuit
        (see :mod:`dbsp.operators.recursive`)."""
        return recursive(self, fn, *inputs, **kw)

    # -- running --------------------------------------------------------------------------
    @property
    def _worker_processes(self) -> bool:
        """Whether the workers run in processes of their own (one worker runs here)."""
        return self.runtime == "processes" and self.workers > 1

    @property
    def _separate_workers(self) -> bool:
        """Whether the workers run apart from this driver (processes of their own, the
        launcher's or Spark's replicas): the driver's split then does not sort small steps for
        them (``InputStream._split``): each sorts its own part, side by side, where a sort here
        would keep them all waiting, and a sorted part's codes would be encoded again on
        arrival anyway."""
        return self._worker_processes or self.remote

    @property
    def remote(self) -> bool:
        """Whether the replicas run elsewhere, behind an ``executor`` (launcher, Spark)."""
        return self._executor_factory is not None

    @property
    def running(self) -> bool:
        return self._executor is not None

    def mark_policies(self) -> None:
        """Note on every node the error policy its operator follows (``Node.info["errors"]``:
        the strictest of its upstream inputs', :func:`~dbsp.circuit.errors.node_policies`)."""
        pols = node_policies(self.nodes, {s.node: s.policy for s in self.inputs.values()},
                             self.errors)
        for n in self.nodes:
            n.info["errors"] = pols[n.id]

    def set_layout(self, shards: ShardMap) -> None:
        """Shard keys by ``shards`` (a :class:`ShardMap` for this circuit's worker count), e.g.
        the layout a checkpoint recorded. Only before the workers start."""
        if not isinstance(shards, ShardMap):
            raise TypeError(f"layout must be a ShardMap, got {type(shards).__name__}")
        if shards.workers != self.workers:
            raise ValueError(f"circuit '{self.name}' has {self.workers} workers, the layout "
                             f"{shards!r} is for {shards.workers}")
        if self._executor is not None and shards != self.layout:
            raise CircuitError(f"circuit '{self.name}' is running: its layout cannot change "
                               f"(change it at a restart, from a checkpoint)")
        self.layout = shards

    def _worker_info(self) -> Optional[dict]:
        """What remote workers registered with (pid, host, address, version), by worker."""
        info = getattr(self._executor, "info", None)
        if isinstance(info, dict) and len(info) == self.workers:
            return info
        return None

    def worker_hosts(self) -> list[str]:
        """The host each worker runs on: the address its peers dial (remote workers), else
        this host's name (the embedded runtimes)."""
        info = self._worker_info()
        if info is not None:
            return [str(info[w].get("address") or info[w].get("host", "?"))
                    for w in range(self.workers)]
        return [socket.gethostname()] * self.workers

    def layout_info(self) -> dict:
        """The layout as a checkpoint records it: the shard map, each worker's host and (remote
        workers) the package version each ran."""
        out = {"shards": self.layout.to_dict(), "hosts": self.worker_hosts()}
        info = self._worker_info()
        if info is not None:
            out["versions"] = [info[w].get("version") for w in range(self.workers)]
        return out

    def _start(self) -> None:
        tune_malloc()
        #: the output handles that keep a view (their weights are checked before a step commits)
        self._viewed = [out for out in self.outputs if out.keep_view]
        self.mark_policies()
        self._placement = plan(self.nodes, self.workers, self.unplaced())
        local = self._placement.local_exchanges
        if self._executor_factory is not None:
            self._executor = self._executor_factory(self.nodes, self.workers, local)
            if self.layout != as_shard_map(self.workers):  # remote workers start with the default
                self._executor.apply(set_worker_layout, self.layout.to_dict())
            return
        if self._worker_processes:
            # each worker process has its own accountant: it gets an equal share of the budget
            cfg = None if self.storage is None else self.storage.share(self.workers)
            self._executor = ProcessPool(self.nodes, self.workers,
                                         functools.partial(make_worker_context, cfg,
                                                           errors=self.errors,
                                                           shards=self.layout), local)
            return
        transport = self._transport or InProcTransport(self.workers)
        self._replicas = [Scheduler(self.nodes,
                                    make_worker_context(self.storage, w, self.workers, transport,
                                                        self._worker_storage.get(w),
                                                        self.errors, self.layout),
                                    local, atomic=True)
                          for w in range(self.workers)]
        self._executor = ThreadPool(self._replicas, transport)

    def _started(self) -> None:
        if self._initial is None and self.steps == 0:
            self._initial = self.driver_state()  # what restart() goes back to

    def step(self) -> None:
        """Run one step: feed pending input, update all state, fill the output handles.

        Atomic: when it raises, no state changed (see the module doc)."""
        if self.closed:
            self.check_open("step")
        if self._broken is not None:
            raise CircuitError(f"circuit '{self.name}' failed in an earlier step and cannot "
                               f"continue: {self._broken}") from self._broken
        if self._executor is None:
            self._start()
            self._started()
        W = self.workers
        per_worker: list[dict] = [{}] if W == 1 else [{} for _ in range(W)]
        keys = self._placement.input_keys
        taken: dict[str, list] = {}
        for inp in self.inputs.values():
            if not (inp._pending or inp._keyed or inp._pending_mass):
                continue  # nothing pushed (what _split would take is nothing): no part
            for w, part in enumerate(inp._split(self.layout, keys.get(inp.node),
                                                sort=not self._separate_workers)):
                if part is not None:
                    per_worker[w][inp.node] = part
                    taken.setdefault(inp.name, []).append(part)
        reads = self._slice_reads
        if reads:
            self._slice_reads = {}
        local_reports: list = []
        if reads:
            requests = self._slice_requests(reads)
            if self.remote:  # each worker reads its pieces where it runs
                for w, r in enumerate(requests):
                    if r:
                        per_worker[w][SLICES] = r
            else:  # the embedded runtimes: this process reads every worker's pieces
                reader = SliceReader({inp.node: (n, inp.schema)
                                      for n, inp in self.inputs.items()})
                try:
                    for w, r in enumerate(requests):
                        per_worker[w][SLICES] = r
                        local_reports.append(reader.resolve(per_worker[w]))
                except BaseException:
                    for inp in self.inputs.values():
                        inp._step_done(False)
                    raise
        try:
            outs = self._executor.step(per_worker,
                                       self._check_outputs if self._viewed else None)
        except WorkerDied as e:
            self._broken = e
            raise
        except BaseException as e:
            for inp in self.inputs.values():
                inp._step_done(False)
            if self._executor.broken is not None:  # the rollback itself failed
                self._broken = self._executor.broken
                e.add_note(f"rolling the step back failed too ({self._executor.broken!r}): "
                           f"circuit '{self.name}' cannot continue")
                raise
            if isinstance(e, RowError):
                e.step = self.steps
            e.rejected_input = {n: _as_table(ps) for n, ps in taken.items()}  # type: ignore
            e.add_note(f"step {self.steps} of circuit '{self.name}' was rolled back: no state "
                       f"changed and its input was not applied (error.rejected_input)")
            raise
        for inp in self.inputs.values():
            if inp._keyed_taken:  # (the others have nothing to let go of)
                inp._step_done(True)
        if reads or self.last_slices:
            self.last_slices = {}  # a new dict (a caller may hold the last one)
        if reads:
            reports = local_reports or [o.pop(SLICES, {}) for o in outs]
            for name, (_, pieces, _, _) in reads.items():
                node = self.inputs[name].node
                self.last_slices[name] = {
                    "pieces": pieces,
                    "report": gather_report([r.get(node) for r in reports], len(pieces), W)}
        if W == 1:
            o = outs[0]
            for out in self.outputs:
                out._gather([o.get(out.node)])
        else:
            for out in self.outputs:
                out._gather([o.get(out.node) for o in outs])
        for o in outs:
            if ERRORS in o:
                for bad in o[ERRORS]:
                    self.error_log.add_bad(self.steps, bad)
        self.steps += 1

    def _check_outputs(self, outs: list) -> None:
        """Before a step commits: no output view's weight leaves int64."""
        for out in self._viewed:
            out.check([o.get(out.node) for o in outs])

    @property
    def failed(self) -> Optional[BaseException]:
        """The error of a failed step (the circuit cannot step any more), else None."""
        return self._broken

    def restart(self) -> None:
        """Replace every worker after a worker process died (:attr:`failed`): the others are
        stopped and new workers built from the graph, with empty state; the step count, output
        views and keyed inputs go back to their state before the first step and pending input
        is dropped. The layer above then restores a checkpoint into the new workers and replays
        its input log (:mod:`dbsp.ft`)."""
        self.check_open("restart")
        for out in self.outputs:  # (no thread of ours inside Arrow while new workers fork)
            out._join_fold()
        ex, self._executor, self._replicas = self._executor, None, None
        if ex is not None:
            try:
                ex.close()
            except Exception:  # the broken workers' own errors are not news
                pass
        self._broken = None
        self._slice_reads = {}
        self._start()
        if self._initial is not None:
            self.restore_driver_state(self._initial)

    # -- for the checkpoint layer ---------------------------------------------------------
    def start(self) -> None:
        """Freeze the graph and build the workers now (else the first step does it)."""
        if self._executor is None:
            self._start()
            self._started()

    def apply(self, fn: Callable, *args: Any) -> list:
        """``fn(scheduler, *args)`` on every worker between steps, in its own process (``fn``
        must be a module-level function: worker processes receive it by reference). Returns
        the results in worker order."""
        self.start()
        return self._executor.apply(fn, *args)

    def apply_background(self, fn: Callable, *args: Any) -> Any:
        """Like :meth:`apply`, but in worker processes ``fn`` runs on a thread of each worker
        beside the next steps; returns a handle whose ``result()`` waits for the results (in
        the threads runtime ``fn`` runs when ``result()`` is called, on the caller's thread).
        ``fn`` must be safe to run beside a step (a checkpoint's write is)."""
        self.start()
        if hasattr(self._executor, "apply_background"):
            return self._executor.apply_background(fn, *args)
        return _Deferred(lambda: self._executor.apply(fn, *args))

    def add_state_hook(self, name: str, get: Callable[[], Any],
                       set_: Callable[[Any], None]) -> None:
        """Save ``get()`` (small, picklable) with every checkpoint and hand it to ``set_`` on
        restore: the state a layer above keeps about this circuit (e.g. a context's counters)."""
        self._state_hooks[name] = (get, set_)

    def driver_state(self) -> dict:
        """What this process keeps besides the workers' operators, in the form of
        :func:`dbsp.circuit.operator.capture`: keyed inputs' rows, output views, steps."""
        return {"steps": self.steps,
                "keys": {n: s._key.checkpoint_state() for n, s in self.inputs.items()
                         if s._key is not None},
                "outputs": {h.node: h.checkpoint_state() for h in self.outputs},
                "hooks": {n: get() for n, (get, _) in self._state_hooks.items()}}

    def restore_driver_state(self, state: dict) -> None:
        """Put back a :meth:`driver_state` (pending input is dropped)."""
        keys = {n for n, s in self.inputs.items() if s._key is not None}
        if set(state["keys"]) != keys or \
                set(state["outputs"]) != {h.node for h in self.outputs}:
            raise ValueError(f"circuit '{self.name}': the checkpoint's keyed inputs / outputs "
                             f"do not match this circuit's")
        for n, st in state["keys"].items():
            self.inputs[n]._key.restore_state(st)
        for h in self.outputs:
            h.restore_state(state["outputs"][h.node])
        for inp in self.inputs.values():
            inp.take_pending()
        for n, v in state.get("hooks", {}).items():
            if n in self._state_hooks:
                self._state_hooks[n][1](v)
        self.steps = int(state["steps"])

    def driver_storage(self) -> Any:
        """A worker storage of this process (worker 0's), for files the driver writes."""
        self.start()
        if self._replicas is not None:
            return self._replicas[0].ctx.storage
        if self.remote:  # the remote executor keeps a storage of the driver's own, if any
            return getattr(self._executor, "driver_storage", None)
        return self._executor.replica.ctx.storage

    def fingerprint(self) -> str:
        """A digest of the circuit's shape (nodes, their kinds, inputs and types, nested
        circuits by name): a checkpoint is restored only into a circuit with the same
        fingerprint. The worker count is not part of it: it is the layout's business (a
        checkpoint of another worker count is re-sharded, :mod:`dbsp.checkpoint.reshard`)."""
        h = hashlib.sha256()
        for n in self.nodes:
            h.update(f"{n.id}|{n.name}|{n.kind}|{n.strict}|{n.inputs}|{n.type!r}\n".encode())
        for name, s in sorted(self.inputs.items()):
            h.update(f"input {name} {s.node} keyed={s._key is not None}\n".encode())
        for o in self.outputs:
            h.update(f"output {o.name} {o.node} view={o.keep_view}\n".encode())
        return h.hexdigest()[:32]

    def state_rows(self) -> int:
        """Rows of operator state over all workers."""
        if self._executor is None:
            return 0
        if self._replicas is None:
            return int(sum(self._executor.call("state_rows")))
        return sum(r.state_rows() for r in self._replicas)

    def memory(self) -> list[dict]:
        """Bytes of state per operator, summed over workers: one entry per node that holds state
        (and per output keeping a view), with :meth:`~dbsp.trace.spine.Spine.memory`'s fields
        plus ``bytes_per_row`` (in-memory bytes over in-memory rows) beside
        ``arrow_bytes_per_row`` (the same rows as a plain Arrow record batch)."""
        if self._executor is None:
            per_worker: list = []
        elif self._replicas is None:
            per_worker = self._executor.call("state_memory")
        else:
            per_worker = [r.state_memory() for r in self._replicas]
        out = []
        for n in self.nodes:
            m = sum_memory(w[n.id] for w in per_worker)
            if m["batches"]:
                out.append(_per_row({"id": n.id, "name": n.name, **m}))
        for h in self.outputs:
            if h.keep_view:
                out.append(_per_row({"id": h.node, "name": f"view:{h.name}", **h.memory()}))
        return out

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

    def close(self, before_unlock: Optional[Callable[[], None]] = None) -> None:
        """Stop the workers (threads or processes; merges in flight finish first). Final and
        idempotent: every later push or step raises :class:`~dbsp.circuit.graph.ClosedError`.
        ``before_unlock``: called once everything has stopped, while the storage directory is
        still locked (a checkpoint store's final clean-up)."""
        if self.closed:
            return
        self.closed = True
        for out in self.outputs:
            out._join_fold()  # (a view's fold in flight may write the storage directory)
        if self._executor is not None:
            self._executor.close()
        if self.storage is not None:
            stop_helpers(self.storage)
        if before_unlock is not None and self._lock is not None and self._lock.held:
            before_unlock()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> "Circuit":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


class _Deferred:
    """A call made when its result is asked for (:meth:`Circuit.apply_background`)."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn

    def result(self) -> Any:
        return self.fn()


def _as_table(parts: list) -> pa.Table:
    """ZSet parts of one input as one table with a ``__weight`` column."""
    t = pa.Table.from_batches([p.data for p in parts])
    return t.append_column(WEIGHT, pa.array(np.concatenate([p.weights for p in parts]),
                                            pa.int64()))


__all__ = ["Circuit", "CircuitError", "ClosedError", "make_worker_context"]
