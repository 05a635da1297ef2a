"""Exactly-once for replicas that run elsewhere: worker processes of the launcher, Spark barrier
tasks. Recovery by generations, and the fence that keeps an old generation from writing.

A *generation* is one start of the W replicas: a mesh and a coordinator whose
:class:`~dbsp.runtime.socket_transport.MeshAuth` carries the generation number (the mesh admits
no peer of another generation). :class:`DurableJob` is the driver: it is the ``build`` of the
fault-tolerance :class:`~dbsp.ft.coordinator.Coordinator`, so when a step fails because a
replica died (:class:`~dbsp.runtime.process.WorkerDied`: a killed process, a Spark task or
executor lost, which aborts the whole barrier job), the coordinator closes that generation and
builds the next: the fence moves on, the replicas are started again (a new barrier job, new
processes), every one of them reloads the last committed checkpoint from the shared storage
directory, and the input log replays the steps after it; the output log discards what it holds
already (seed 000's ``write(step, output)`` rules), so the output stays exactly-once.

The fence
---------
``<storage>/GENERATION`` holds the current generation (written durably, ``.mut`` -> fsync ->
rename, before a generation starts). Everything that publishes checks that it is still the
current generation just before it writes, else raises :class:`Fenced`:

* the driver, before every append to the input log and the output log, and before every write of
  the checkpoint catalog (publish and gc: :class:`~dbsp.checkpoint.CheckpointStore`'s
  ``before_publish``);
* every replica, before every operation the driver asks of it between steps (capture, write,
  load or release of checkpoint state: :func:`fenced_apply` wraps them), so a replica of an old
  generation cannot write a checkpoint file.

The check and the write are two system calls, not one atomic operation: the fence stops a
replica or a driver that was left behind (a zombie task Spark has not killed yet, a driver
that lost its storage lock), it is not a lock. The driver also holds the storage directory's
exclusive lock (:class:`~dbsp.storage.lock.DirectoryLock`) for the life of the job.

Layout changes
--------------
:meth:`DurableJob.change_layout` (the launcher's :meth:`LauncherJob.relayout`, Spark's
``SparkDurableJob.relayout``) is seed 000's cold layout change between two generations: the
last checkpoint of the old layout, the old replicas stopped, the next generation started on the
new worker count and placement; the checkpoint store resizes the shard map and every new
replica loads the state of the shards it now owns (:mod:`dbsp.checkpoint.reshard`), and a
checkpoint in the new layout is committed before any input. A change of placement alone (the
same worker count on other hosts, or another version of the package: a rolling upgrade) loads
each replica's state as it is and commits at once, so the catalog records the new hosts and
versions (``layout["hosts"]``, ``layout["versions"]``).

Layout of the storage directory: the checkpoint store's (``checkpoints.json``, ``ckpt-*``,
``worker-<w>/`` for replica ``w``'s files; the driver's own files, its output views, go to
``worker-<W>/``), the logs under ``ft/`` (``ft/input``, ``ft/output``), and ``GENERATION``. It
must be one directory that every replica and the driver see (a local path on one host, a shared
file system across hosts).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Optional, Protocol, Sequence

from ..checkpoint import CheckpointStore
from ..runtime.circuit import Circuit
from ..runtime.process import WorkerDied
from ..runtime.launcher import (Coordinator, build_outputs, per_worker, pipeline_spec,
                                resolve_pipeline, spawn_workers)
from ..runtime.socket_transport import MeshAuth
from ..storage.config import as_storage_config
from ..storage.faults import write_durable
from ..storage.lock import DirectoryLock
from ..trace.spill import SpineStorage
from .coordinator import CancelToken
from .coordinator import Coordinator as FtCoordinator
from .durable import DurableCircuit

__all__ = ["Fence", "Fenced", "fenced_apply", "Generation", "DurableJob", "LauncherGeneration",
           "LauncherJob", "launch_durable", "GENERATION_FILE"]

log = logging.getLogger("dbsp.ft")

GENERATION_FILE = "GENERATION"


class Fenced(RuntimeError):
    """A replica or driver of an old generation tried to write a checkpoint or a log."""


class Fence:
    """The generation fence of a storage directory (see the module doc)."""

    def __init__(self, root: str):
        self.root = os.fspath(root)
        self.path = os.path.join(self.root, GENERATION_FILE)

    def current(self) -> int:
        """The current generation (0: none started yet)."""
        try:
            with open(self.path, "rb") as f:
                text = f.read().decode().strip()
        except FileNotFoundError:
            return 0
        try:
            return int(text)
        except ValueError:
            raise Fenced(f"{self.path} holds {text[:40]!r}, not a generation number") from None

    def advance(self) -> int:
        """Start the next generation (durably) and return it: from now on every older one is
        fenced."""
        g = self.current() + 1
        write_durable(self.path, f"{g}\n".encode())
        return g

    def check(self, generation: int, what: str = "write") -> None:
        """Raise :class:`Fenced` unless ``generation`` is the current one."""
        now = self.current()
        if now != generation:
            raise Fenced(f"{what} refused: generation {generation} is fenced off by generation "
                         f"{now} in {self.path}")


def fenced_apply(sched: Any, root: str, generation: int, fn: Callable, args: tuple) -> Any:
    """On a replica: ``fn(sched, *args)`` if ``generation`` is still the current one (module
    level: it travels by reference to the worker)."""
    Fence(root).check(generation, f"worker {sched.ctx.worker}: {getattr(fn, '__name__', fn)}")
    return fn(sched, *args)


class Generation(Protocol):
    """What starting a generation of replicas gives: a coordinator (the rendezvous and the
    circuit's executor) whose workers are on their way, the pids of the replicas once they
    registered (``coordinator.info[w]["pid"]``), and a way to end it."""

    coordinator: Coordinator

    def close(self, failed: bool) -> None: ...


class _Executor:
    """The circuit's executor for one generation: the coordinator's step / call, and ``apply``
    behind the fence."""

    def __init__(self, gen: Generation, root: str, generation: int, driver_storage: Any):
        self.gen = gen
        self.coordinator = gen.coordinator
        self.root = root
        self.generation = generation
        self.driver_storage = driver_storage

    def attach(self, nodes, workers: int, local) -> "_Executor":
        self.coordinator.executor(nodes, workers, local)
        return self

    @property
    def broken(self) -> Optional[BaseException]:
        return self.coordinator.broken

    @property
    def info(self) -> dict:
        """What each replica registered with (host, address, version): the layout's hosts."""
        return self.coordinator.info

    def step(self, inputs: list[dict], check=None) -> list[dict]:
        return self.coordinator.step(inputs, check)

    def call(self, name: str) -> list:
        return self.coordinator.call(name)

    def apply(self, fn: Callable, *args: Any) -> list:
        return self.coordinator.apply(fenced_apply, self.root, self.generation, fn, args)

    def apply_background(self, fn: Callable, *args: Any) -> Any:
        return self.coordinator.apply_background(fenced_apply, self.root, self.generation, fn,
                                                 args)

    def close(self) -> None:
        self.gen.close(failed=self.coordinator.broken is not None)


class DurableJob:
    """A pipeline on W remote replicas with exactly-once output and recovery by generations.

    ``pipeline``: ``build(circuit) -> {name: output}`` (or its ``module:function`` name).
    ``storage``: the shared directory (see the module doc). ``start(auth, storage)``: starts
    the replicas of the generation of ``auth`` and returns a :class:`Generation` (the launcher's
    :class:`LauncherGeneration`, :func:`dbsp.spark.spark_generation`). ``checkpoint_every`` /
    ``checkpoint_seconds``: when to checkpoint; ``max_restarts``: replica deaths in a row
    before giving up. ``sliced``: ``{input: SlicedSource}``, inputs the replicas read
    themselves (:mod:`dbsp.runtime.slices`; a step's input names ``SourceStep(k)`` for them).
    ``clock``: the driver's wall clock for ``checkpoint_seconds`` (every generation's
    :attr:`DurableCircuit.clock <dbsp.ft.durable.DurableCircuit.clock>`; tests move one by hand).

    Drive it with :meth:`run` (the fault-tolerance coordinator: ``read(step, token)`` gives
    each step's input) or step it by hand: :meth:`open` gives the current generation's
    :class:`DurableCircuit`, and :meth:`restart` moves to the next.
    """

    def __init__(self, pipeline: Any, workers: int, storage: Any,
                 start: Callable[[MeshAuth, str], Generation], *,
                 checkpoint_every: Optional[int] = None,
                 checkpoint_seconds: Optional[float] = None, keep_checkpoints: int = 2,
                 max_restarts: int = 5, check_output: bool = False,
                 sliced: Optional[dict] = None, clock: Callable[[], float] = time.time):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if storage is None:
            raise ValueError("a durable job needs storage=: a directory every replica and the "
                             "driver see (its checkpoints and logs)")
        self.build_fn = resolve_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
        self.workers = workers
        self.config = as_storage_config(storage)
        self.root = os.path.realpath(self.config.dir)
        os.makedirs(self.root, exist_ok=True)
        self.lock = DirectoryLock(self.root)
        self.fence = Fence(self.root)
        self.start = start
        self.checkpoint_every = checkpoint_every
        self.checkpoint_seconds = checkpoint_seconds
        self.keep = keep_checkpoints
        self.max_restarts = max_restarts
        self.check_output = check_output
        self.clock = clock
        #: inputs the replicas read from sliced sources: ``{input: SlicedSource}``
        self.sliced = dict(sliced or {})
        base = MeshAuth.new()
        self._job, self._secret = base.job, base.secret
        #: the driver's own files (output views in checkpoints), beside the replicas' parts
        self.driver_storage = SpineStorage(self.config, workers)
        self.generation = 0
        self.durable: Optional[DurableCircuit] = None
        self.outputs: dict = {}
        self.gen: Optional[Generation] = None
        #: seconds from starting each generation to its replicas standing on the mesh
        self.startup_seconds: list[float] = []
        #: seconds from a generation's failure to the next one recovered (checkpoint + replay)
        self.recovery_seconds: list[float] = []
        #: per generation opened, what its recovery did: ``generation`` and
        #: :attr:`DurableCircuit.recovery <dbsp.ft.durable.DurableCircuit.open>` (the
        #: checkpoint step restored, the logged steps and sliced pieces replayed, the next step)
        self.recoveries: list[dict] = []
        self.ft: Optional[FtCoordinator] = None
        self.closed = False

    # -- generations ---------------------------------------------------------------------------
    def build(self) -> DurableCircuit:
        """Start the next generation: advance the fence, start the replicas, and return its
        durable circuit (not opened)."""
        self.durable = None
        g = self.fence.advance()
        self.generation = g
        auth = MeshAuth(self._job, g, self._secret)
        t0 = time.perf_counter()
        gen = self.start(auth, self.root)
        self.gen = gen
        ex = _Executor(gen, self.root, g, self.driver_storage)
        circuit = Circuit(workers=self.workers, executor=ex.attach)
        fence = self.fence

        def check(what: str) -> None:
            fence.check(g, f"driver of generation {g}: {what}")

        try:
            self.outputs = build_outputs(circuit, self.build_fn)
            circuit.slice_inputs(*self.sliced)
            store = CheckpointStore(self.root, circuit.fingerprint(), keep=self.keep,
                                    before_publish=lambda: check("checkpoint catalog"))
            # the layout to resume in, before the replicas start: the last checkpoint's shard
            # map, resized (moving the fewest shards) when the worker count changed; the start
            # gives it to every replica. Without it the generation took the default map of W
            # workers and a layout change moved more than it must (2 -> 3: 0.53 of the state
            # instead of 0.31; the minimum is 1/3)
            store.prepare(circuit)
            circuit.start()  # the rendezvous: every replica on the mesh
        except BaseException:
            gen.close(failed=True)
            raise
        self.startup_seconds.append(time.perf_counter() - t0)

        self.durable = DurableCircuit(circuit, store, os.path.join(self.root, "ft"),
                                      checkpoint_every=self.checkpoint_every,
                                      checkpoint_seconds=self.checkpoint_seconds,
                                      check_output=self.check_output, background=True,
                                      fence=check,
                                      # a dead replica ends this generation: the job starts the
                                      # next one (run), not the circuit its workers in place
                                      max_restarts=0, clock=self.clock)
        for name, src in self.sliced.items():
            self.durable.sliced(name, src)
        self.durable.on_open = lambda rec: self.recoveries.append({"generation": g, **rec})
        return self.durable

    def open(self) -> DurableCircuit:
        """The current generation's durable circuit, recovered (the first one started)."""
        if self.durable is None:
            self.build()
        return self.durable.open()  # type: ignore[union-attr]

    def restart(self) -> DurableCircuit:
        """End the current generation (failed) and recover in the next."""
        t0 = time.perf_counter()
        if self.durable is not None:
            try:  # a checkpoint being written finishes (or fails) before the replicas stop,
                # so that a nearly written one is not lost (replays stay short); its safety
                # does not depend on it: a stopped generation's writer gets no results and
                # publishes nothing, and the next store's clean-up waits for a publish
                self.durable.wait_checkpoint()
            except Exception:  # the broken generation's own errors are not news
                pass
            try:
                self.durable.circuit.close()
            except Exception:
                pass
        self.durable = None
        d = self.open()
        self.recovery_seconds.append(time.perf_counter() - t0)
        return d

    def change_layout(self, workers: int,
                      start: Optional[Callable[[MeshAuth, str], Generation]] = None) -> dict:
        """A cold layout change (seed 000, "Layout changes"): checkpoint and stop the current
        generation, start the next one on ``workers`` replicas (started by ``start``, default
        the job's own), whose workers load the state of the shards they now own (only
        reassigned shards' state moves, :mod:`dbsp.checkpoint.reshard`) and commit a checkpoint
        in the new layout before any input is processed. With the same worker count only the
        placement changes (other hosts, another version of the package): the state is loaded as
        it is, nothing moves, and a checkpoint records the new placement at once. Pending
        input is refused (push it after the change).

        Returns what changed: ``from_workers``, ``to_workers``, ``hosts`` before and after,
        ``moved_fraction`` of the stored rows (0 when the shards stayed), ``seconds``."""
        if self.ft is not None:
            raise RuntimeError("this durable job is driven by run(): stop it (.ft.stop(step)) "
                               "and close its loop before changing the layout")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        t0 = time.perf_counter()
        before = {"workers": self.workers, "hosts": None}
        d = self.durable
        if d is not None:
            pending = [n for n, inp in d.circuit.inputs.items() if inp.pending_rows]
            if pending:
                raise RuntimeError(f"input {', '.join(pending)} has rows pending: step before "
                                   f"changing the layout (no input is processed during a "
                                   f"layout change)")
            if d.opened and d.circuit.failed is None:
                before["hosts"] = d.circuit.worker_hosts()
            d.close()  # the last checkpoint of the old layout, the replicas stopped
            self.durable = None
        self.workers = workers
        if start is not None:
            self.start = start
        self.driver_storage = SpineStorage(self.config, workers)
        d = self.open()  # the next generation: prepare (resized map), restore, commit
        if d.layout_change is None:  # same shards, new placement: record it at once too
            d.checkpoint(wait=True)
        change = dict(d.layout_change or {})
        moved = change.get("moved_fraction")
        return {**change, "from_workers": before["workers"], "to_workers": workers,
                "hosts_before": before["hosts"], "hosts_after": d.circuit.worker_hosts(),
                "moved_fraction": 0.0 if moved is None else moved,
                "step": d.step_no, "seconds": time.perf_counter() - t0}

    def pids(self) -> dict[int, int]:
        """The current generation's replica processes by worker (from their registration)."""
        if self.gen is None:
            return {}
        return {w: i["pid"] for w, i in self.gen.coordinator.info.items()}

    # -- driving -------------------------------------------------------------------------------
    def run(self, read: Callable[[int, CancelToken], Any]) -> FtCoordinator:
        """Run the step loop of :class:`~dbsp.ft.coordinator.Coordinator` on its own thread:
        ``read(step, token)`` -> this step's input or None; a replica death makes a new
        generation. Stop it with ``.stop(step)``; :meth:`close` afterwards."""
        if self.ft is not None:
            raise RuntimeError("this durable job runs already")

        def build() -> DurableCircuit:
            if self.durable is not None and not self.durable.opened:  # built, not yet run
                return self.durable
            return self.build()

        self.ft = _Ft(self, build, read, self.max_restarts)
        return self.ft

    @property
    def restarts(self) -> int:
        """Generations started after the first (one per failure, including failures while a
        generation was forming or recovering)."""
        return max(self.generation - 1, 0)

    def report(self) -> dict:
        """The driver's account of the job: the current ``generation``, ``restarts``,
        ``startup_seconds`` and ``recovery_seconds`` per generation, and ``recoveries`` (what
        each generation restored and replayed, :attr:`recoveries`)."""
        return {"generation": self.generation, "workers": self.workers,
                "restarts": self.restarts, "startup_seconds": list(self.startup_seconds),
                "recovery_seconds": list(self.recovery_seconds),
                "recoveries": [dict(r) for r in self.recoveries]}

    def close(self) -> None:
        """Stop (a last checkpoint when the generation is healthy), end the replicas, unlock."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.ft is not None:
                self.ft.close()
            elif self.durable is not None:
                self.durable.close()
            d = self.ft.durable if self.ft is not None else self.durable
            if d is not None and d.store is not None:  # the replicas stopped: no orphan left
                d.store.close()
        finally:
            self.durable = None
            self.lock.release()

    def __enter__(self) -> "DurableJob":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Ft(FtCoordinator):
    """The fault-tolerance coordinator for :class:`DurableJob`: a replica that dies while the
    next generation forms or recovers makes one more generation (up to ``max_restarts``), and
    each recovery is timed."""

    def __init__(self, job: DurableJob, build, read, max_restarts):
        self.job = job
        super().__init__(build, read, max_restarts)

    def _restart(self) -> None:
        t0 = time.perf_counter()
        for attempt in range(self.max_restarts + 1):
            try:
                if self.durable is not None:
                    self.durable.circuit.close()
            except Exception:  # the broken generation's own errors are not news
                pass
            try:
                self.durable = self.build().open()
                break
            except WorkerDied as e:
                if attempt == self.max_restarts:
                    raise
                log.warning("generation %d failed while recovering (%s); starting the next",
                            self.job.generation, e)
                self.durable = self.job.durable  # closed at the top of the next round
        self.job.recovery_seconds.append(time.perf_counter() - t0)


class LauncherGeneration:
    """One generation on local worker processes (``python -m dbsp.cli worker``): the
    :class:`Generation` of :func:`launch_durable`. ``python``, ``hosts``, ``env``: per worker
    (or one for all), see :func:`~dbsp.runtime.launcher.spawn_workers`."""

    def __init__(self, auth: MeshAuth, root: str, workers: int, spec: str, timeout: float,
                 python: Any = None, hosts: Optional[list] = None, env: Any = None,
                 sliced: Sequence[str] = ()):
        self.coordinator = Coordinator(workers, auth, "127.0.0.1:0", spec,
                                       {"storage": root, "sliced": list(sliced)}, timeout)
        self.procs = spawn_workers(self.coordinator.address, workers, auth, python, hosts, env)

    def close(self, failed: bool) -> None:
        self.coordinator.close()
        for p in self.procs:
            if failed:  # what is left of a broken generation
                p.kill()
            try:
                p.wait(timeout=30)
            except Exception:
                p.kill()
                p.wait()


class LauncherJob(DurableJob):
    """A :class:`DurableJob` on worker processes of the launcher (:func:`launch_durable`),
    whose layout changes name the new placement: :meth:`relayout`."""

    def __init__(self, spec: str, workers: int, storage: Any, timeout: float, python: Any,
                 hosts: Optional[list], env: Any, **kw: Any):
        self.spec, self.timeout = spec, timeout
        self.placement = self._placement(workers, python, hosts, env)
        super().__init__(spec, workers, storage, self._starter(workers, self.placement), **kw)

    @staticmethod
    def _placement(workers: int, python: Any, hosts: Optional[list], env: Any) -> dict:
        return {"python": per_worker(python, workers, "python"),
                "hosts": per_worker(None if hosts is None else list(hosts), workers, "hosts"),
                "env": per_worker(env, workers, "env")}

    def _starter(self, workers: int, placement: dict) -> Callable[[MeshAuth, str], Generation]:
        def start(auth: MeshAuth, root: str) -> LauncherGeneration:
            return LauncherGeneration(auth, root, workers, self.spec, self.timeout,
                                      placement["python"], placement["hosts"],
                                      placement["env"], list(self.sliced))
        return start

    def relayout(self, workers: Optional[int] = None, *, hosts: Optional[list] = None,
                 python: Any = None, env: Any = None) -> dict:
        """A cold layout change (:meth:`DurableJob.change_layout`) to ``workers`` processes
        (default: as many as now) placed by ``hosts`` / ``python`` / ``env`` (per worker, see
        :func:`~dbsp.runtime.launcher.spawn_workers`; default: the launcher's defaults)."""
        W = self.workers if workers is None else workers
        self.placement = self._placement(W, python, hosts, env)
        return self.change_layout(W, self._starter(W, self.placement))


def launch_durable(pipeline: Any, workers: int, storage: Any, *, timeout: float = 120.0,
                   python: Any = None, hosts: Optional[list] = None, env: Any = None,
                   **kw: Any) -> LauncherJob:
    """A :class:`DurableJob` on ``workers`` local processes (the launcher): ``pipeline`` must
    be importable by name (``module:function``). Per worker (a list of ``workers``, or one
    for all): ``python`` (interpreter), ``hosts`` (the address it listens on for its peers,
    which its checkpoints record as its host), ``env`` (variables to add). ``kw``:
    :class:`DurableJob`'s options. :meth:`LauncherJob.relayout` changes workers and
    placement."""
    return LauncherJob(pipeline_spec(pipeline), workers, storage, timeout, python, hosts, env,
                       **kw)
