"""The launcher: one circuit on W worker processes, on this machine or on hosts given by address.

A *pipeline* is a function ``build(circuit) -> {name: output handle}`` (or one output handle)
that adds inputs to a :class:`~dbsp.runtime.circuit.Circuit` and derives its outputs. Every
worker runs ``build`` on a circuit of its own, so all replicas are identical (which the exchange
relies on); the driver runs it too, only to know the inputs and outputs.

The pieces:

* :class:`Coordinator` (the driver's side): a rendezvous server. Each worker dials it and passes
  the mesh handshake (:class:`~dbsp.runtime.socket_transport.MeshAuth`: same job, generation and
  secret); once all ``W`` workers registered the address they listen on, the coordinator sends
  everyone the list, the workers build the authenticated TCP mesh among themselves
  (:func:`~dbsp.runtime.socket_transport.tcp_mesh`) and report ready. From then on the
  coordinator is the circuit's executor: each step it sends every worker its part of the input
  and gathers the outputs (the request/reply protocol of :mod:`dbsp.runtime.process`); data
  between workers goes over the mesh, never through the driver. Steps are atomic as in the
  embedded runtimes: when a step fails on any worker (or the driver's output check refuses it),
  the coordinator rolls it back everywhere - every worker listens on a fresh port
  (``remesh_listen``), the coordinator hands out the addresses, the workers build a new
  authenticated mesh (the failed step aborted the old one) and undo the step (``remesh``) - and
  the circuit goes on with the next step. The error policy (``errors=``) is the pipeline's.
* :func:`serve_worker` (``dbsp worker --coordinator HOST:PORT --worker I``): one worker.
* :func:`launch`: a :class:`Job` with the coordinator and, unless ``spawn=False``, ``W`` local
  worker processes started with ``python -m dbsp.cli worker`` (the job's credentials travel in
  the environment variable ``DBSP_MESH_AUTH``, never on a command line). With ``spawn=False``
  the caller starts ``job.worker_command(i)`` on each host.

The pipeline reaches a spawned worker as ``module:function`` (it must be importable there; the
driver's ``sys.path`` is handed on to local workers), or as the function object itself when the
worker is started in-process by another launcher (Spark ships it in the task's closure).
"""
from __future__ import annotations

import importlib
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional, Sequence, Union

from .._version import __version__, formats, incompatibility
from ..circuit.errors import check_policy
from ..circuit.exchange import ShardMap, TransportAborted
from ..circuit.scheduler import Scheduler
from ..storage import wire
from ..storage.config import as_storage_config
from ..storage.memory import tune_malloc
from .circuit import Circuit, make_worker_context
from .placement import plan
from .process import WorkerDied, arrived, reply_order, serve_replica
from .slices import SliceReader
from .socket_transport import MeshAuth, accept_peers, dial, tcp_mesh

__all__ = ["Coordinator", "VersionMismatch", "Job", "launch", "serve_worker", "spawn_workers", "build_outputs",
           "pipeline_spec", "per_worker", "resolve_pipeline", "AUTH_ENV"]

#: the directory this package was loaded from (a worker reports it: which code it runs)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: environment variable holding a worker's credentials (``MeshAuth.to_text()``)
AUTH_ENV = "DBSP_MESH_AUTH"

Pipeline = Union[str, Callable[[Circuit], Any]]


def pipeline_spec(pipeline: Pipeline) -> str:
    """``module:qualname`` of a pipeline function, checked to import back to the same object."""
    if isinstance(pipeline, str):
        resolve_pipeline(pipeline)
        return pipeline
    mod, name = getattr(pipeline, "__module__", None), getattr(pipeline, "__qualname__", "")
    if mod is None or mod == "__main__" or "<" in name:
        raise ValueError(
            f"pipeline {pipeline!r} cannot be found by a worker process: give a function "
            f"defined at the top level of an importable module (not __main__, not a lambda), "
            f"or its 'module:function' name")
    spec = f"{mod}:{name}"
    if resolve_pipeline(spec) is not pipeline:
        raise ValueError(f"pipeline {spec} does not import back to the function given")
    return spec


def resolve_pipeline(spec: str) -> Callable[[Circuit], Any]:
    """The function named ``module:qualname``."""
    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise ValueError(f"pipeline {spec!r} is not of the form 'module:function'")
    try:
        obj: Any = importlib.import_module(mod)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"pipeline {spec!r} cannot be imported: {e}") from None
    if not callable(obj):
        raise ValueError(f"pipeline {spec!r} is not a function")
    return obj


def build_outputs(circuit: Circuit, build: Callable[[Circuit], Any]) -> dict:
    """Run ``build`` on ``circuit``; its outputs by name."""
    out = build(circuit)
    if isinstance(out, dict):
        outs = dict(out)
    elif hasattr(out, "_gather"):
        outs = {"output": out}
    else:
        raise TypeError(f"pipeline {build!r} returned {type(out).__name__}: it must return an "
                        f"output handle or a dict of them by name")
    for k, v in outs.items():
        if not hasattr(v, "_gather"):
            raise TypeError(f"pipeline output {k!r} is a {type(v).__name__}, not an output "
                            f"handle (call .output() on the stream)")
    return outs


class PolledApply:
    """The results of :meth:`Coordinator.apply_background`, in worker order: :meth:`result`
    asks every worker (``bg_result``, between steps) until each has finished."""

    POLL_SECONDS = 0.02

    def __init__(self, co: "Coordinator"):
        self.co = co
        self._result: Optional[list] = None

    def result(self) -> list:
        if self._result is not None:
            return self._result
        while True:
            with self.co._lock:
                self.co._send({w: ("bg_result",) for w in self.co.ctrl})
                replies = self.co._replies()
            if all(r is not None for r in replies):
                break
            time.sleep(self.POLL_SECONDS)
        errs = [r[1] for r in replies if r[0] == "err"]
        if errs:
            raise errs[0]
        self._result = [r[1] for r in replies]
        return self._result


class VersionMismatch(RuntimeError):
    """A worker runs a package whose formats (wire protocol, checkpoint, layer files) this
    driver cannot work with (:func:`dbsp._version.incompatibility`): the generation is not
    formed."""


class Coordinator:
    """The driver's side of a launch: rendezvous, then the executor of the circuit's steps.

    ``listen``: ``host:port`` to listen on (port 0: any). ``advertise``: the host workers dial
    (default: the listening host). ``settings``: sent to every worker with the mesh
    (``storage``).
    """

    def __init__(self, workers: int, auth: MeshAuth, listen: str = "127.0.0.1:0",
                 pipeline: Optional[str] = None, settings: Optional[dict] = None,
                 timeout: float = 120.0, advertise: Optional[str] = None,
                 watch: Optional[Callable[[], None]] = None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.auth = auth
        self.pipeline = pipeline
        self.settings = dict(settings or {})
        self.timeout = timeout
        host, port = listen.rsplit(":", 1)
        self._listener = socket.create_server((host, int(port)))
        self.address = f"{advertise or host}:{self._listener.getsockname()[1]}"
        self.ctrl: dict[int, socket.socket] = {}
        self.info: dict[int, dict] = {}
        self._late: Optional[int] = None  # the worker that replied last (process.reply_order)
        self.mesh_seconds = 0.0
        #: the formats this driver speaks (:func:`dbsp._version.formats`): a worker whose
        #: formats do not interoperate with them is refused (:class:`VersionMismatch`)
        self.formats = formats()
        #: called while waiting for workers; raises to give up (their launcher failed)
        self.watch = watch
        # one request / reply exchange at a time: a checkpoint writer polls its background
        # apply from another thread between the steps
        self._lock = threading.RLock()

    def connect(self) -> None:
        """Wait for all workers, hand out the mesh, wait until it stands."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout
        W = self.workers

        def want(w: int) -> Optional[str]:
            return None if 0 <= w < W else f"worker {w} is not in 0..{W - 1}"

        try:
            self.ctrl = dict(sorted(accept_peers(self._listener, self.auth, want, W, deadline,
                                                 what="coordinator", watch=self.watch).items()))
        finally:
            self._listener.close()
        addresses = [""] * W
        for w, s in self.ctrl.items():
            s.settimeout(max(1.0, deadline - time.monotonic()))
            msg = self._recv(w)
            if msg[0] != "register":
                raise RuntimeError(f"worker {w} sent {msg[0]!r} instead of registering")
            addresses[w] = msg[1]
            self.info[w] = msg[2]
        self._check_versions()
        for w, s in self.ctrl.items():
            wire.send(s, ("mesh", addresses, self.pipeline, self.settings))
        for w in self.ctrl:
            msg = self._recv(w)
            if msg[0] != "ready":
                raise RuntimeError(f"worker {w} could not join the mesh: {msg[1]}") \
                    from (msg[1] if isinstance(msg[1], BaseException) else None)
        for s in self.ctrl.values():
            s.settimeout(None)
        self.mesh_seconds = time.perf_counter() - t0

    def _check_versions(self) -> None:
        """Refuse to form a generation whose members cannot interoperate: each worker's formats
        against this driver's (so, through it, against each other's). Different package
        versions with the same formats (a rolling upgrade) are fine."""
        for w, info in sorted(self.info.items()):
            why = incompatibility(self.formats, info.get("formats"))
            if why is None:
                continue
            err = VersionMismatch(
                f"worker {w} on host {info.get('address') or info.get('host', '?')} runs dbsp "
                f"{info.get('version', '?')}, the driver dbsp {__version__}: they cannot work "
                f"together ({why}; the driver's formats {self.formats}, the worker's "
                f"{info.get('formats')}); the generation is not formed")
            for s in self.ctrl.values():  # the workers stop waiting for the mesh
                try:
                    wire.send(s, ("err", err))
                except OSError:
                    pass
            raise err

    def _recv(self, w: int) -> Any:
        try:
            return wire.recv(self.ctrl[w])
        except (wire.WireError, OSError) as e:
            raise WorkerDied(f"worker {w} ({self.info.get(w, {}).get('host', '?')}) is gone: "
                             f"{e}") from None

    # -- executor interface of Circuit ----------------------------------------------------
    def executor(self, nodes, workers: int, local) -> "Coordinator":
        if workers != self.workers:
            raise ValueError(f"circuit has {workers} workers, coordinator {self.workers}")
        if not self.ctrl:
            self.connect()
        return self

    def _send(self, msgs: dict) -> None:
        for w, m in msgs.items():
            try:
                wire.send(self.ctrl[w], m)
            except OSError:
                raise WorkerDied(f"worker {w} is gone") from None

    def _replies(self) -> list:
        if len(self.ctrl) != self.workers:  # closed (or never formed): no reply is no answer
            raise WorkerDied(f"the generation's {self.workers} workers were stopped (the "
                             f"coordinator is closed): a request or a background result "
                             f"cannot be answered")
        got, died = {}, {}
        for i, w in enumerate(reply_order(self.ctrl, self._late)):
            if i and not arrived(self.ctrl[w]):
                self._late = w  # came after the one read first: read it first next time
            try:
                got[w] = self._recv(w)
            except WorkerDied as e:
                died[w] = e
        if died:
            raise died[min(died)]
        replies = [got[w] for w in self.ctrl]
        errs = [r[1] for r in replies if r[0] == "err"]
        if errs:
            real = [e for e in errs if not isinstance(e, TransportAborted)]
            raise (real or errs)[0]
        return [r[1] for r in replies]

    #: set when rolling a failed step back failed too (a worker died, the mesh could not be
    #: rebuilt): the circuit cannot continue
    broken: Optional[BaseException] = None

    def step(self, inputs: list[dict], check=None) -> list[dict]:
        """One step on every worker; a failure (or ``check(outputs)`` refusing it) rolls it
        back on every worker before the error is raised. Workers commit a step when the next
        one starts."""
        with self._lock:
            return self._step(inputs, check)

    def _step(self, inputs: list[dict], check=None) -> list[dict]:
        self._send({w: ("step", inputs[w]) for w in self.ctrl})
        try:
            outs = self._replies()
            if check is not None:
                check(outs)
            return outs
        except WorkerDied as e:
            self.broken = e
            raise
        except BaseException:
            self.rollback()
            raise

    def rollback(self) -> None:
        """Undo the failed step on every worker over a new mesh (see the module doc)."""
        with self._lock:
            self._rollback()

    def _rollback(self) -> None:
        try:
            self._send({w: ("remesh_listen",) for w in self.ctrl})
            addresses = self._replies()
            self._send({w: ("remesh", addresses) for w in self.ctrl})
            self._replies()
        except BaseException as e:
            self.broken = e

    def apply(self, fn: Callable, *args: Any) -> list:
        """``fn(replica, *args)`` on every worker between steps (``fn`` a module-level function:
        it travels by reference), results in worker order."""
        with self._lock:
            self._send({w: ("apply", fn, args) for w in self.ctrl})
            return self._replies()

    def apply_background(self, fn: Callable, *args: Any) -> "PolledApply":
        """Start ``fn(replica, *args)`` on a thread of every worker and return at once; the
        workers go on stepping meanwhile (``fn`` must be safe beside a step, as a checkpoint's
        write is). :meth:`PolledApply.result` asks the workers for the results between steps
        until all are in. One at a time: wait for the previous result first."""
        with self._lock:
            self._send({w: ("apply_bg", fn, args) for w in self.ctrl})
            self._replies()
        return PolledApply(self)

    def call(self, name: str) -> list:
        if name not in Scheduler.CALLS:
            raise ValueError(f"unknown call {name!r} (known: {', '.join(Scheduler.CALLS)})")
        with self._lock:
            self._send({w: ("call", name) for w in self.ctrl})
            return self._replies()

    def close(self) -> None:
        for s in self.ctrl.values():
            try:
                wire.send(s, ("stop",))
            except OSError:
                pass
            s.close()
        self.ctrl = {}
        try:
            self._listener.close()
        except OSError:
            pass


def serve_worker(coordinator: str, auth: MeshAuth, worker: int,
                 build: Optional[Callable[[Circuit], Any]] = None, listen_host: str = "127.0.0.1",
                 advertise_host: Optional[str] = None, timeout: float = 120.0,
                 on_ready: Optional[Callable[[], None]] = None,
                 info: Optional[dict] = None, sources: Optional[dict] = None) -> None:
    """Run worker ``worker`` of the job of ``auth`` until the coordinator says stop.

    Dials the coordinator, listens for its peers on ``listen_host`` (an ephemeral port), joins
    the mesh, builds the pipeline (``build``, else the one the coordinator names) and serves
    steps. Raises if the handshake is refused or the mesh cannot be formed in ``timeout``.
    The worker registers with its pid, host name and the host its peers dial (``address``: the
    host a checkpoint's layout records for it), the package version it runs and where that
    package was loaded from (``code``), plus ``info``. ``sources``: sliced sources only this
    worker knows, by name (:class:`~dbsp.runtime.slices.LocalSource`: e.g. a Spark task's
    partition).
    """
    deadline = time.monotonic() + timeout
    ctrl = dial(coordinator, auth, worker, deadline)
    transport = None
    try:
        listener = socket.create_server((listen_host, 0))
        address = f"{advertise_host or listen_host}:{listener.getsockname()[1]}"
        wire.send(ctrl, ("register", address,
                         {**(info or {}), "pid": os.getpid(), "host": socket.gethostname(),
                          "address": advertise_host or listen_host, "version": __version__,
                          "formats": formats(), "code": _PACKAGE_DIR}))
        msg = wire.recv(ctrl)
        if msg[0] == "err":
            raise msg[1]
        if msg[0] != "mesh":
            raise RuntimeError(f"coordinator sent {msg[0]!r} instead of the mesh")
        _, addresses, spec, settings = msg
        try:
            if build is None:
                if spec is None:
                    raise ValueError("the coordinator named no pipeline and none was given")
                build = resolve_pipeline(spec)
            W = len(addresses)
            # the allocator policy an embedded circuit's start applies (its worker processes
            # inherit it through the fork): without it every step's large arrays come from
            # fresh mmaps whose pages fault in
            tune_malloc()
            circuit = Circuit(workers=W, errors=settings.get("errors", "raise"))
            build_outputs(circuit, build)
            circuit.slice_inputs(*settings.get("sliced", ()))
            circuit.mark_policies()
            local = plan(circuit.nodes, W, circuit.unplaced()).local_exchanges
            reader = SliceReader({inp.node: (n, inp.schema) for n, inp in circuit.inputs.items()},
                                 sources)
            transport = tcp_mesh(worker, addresses, auth, listener=listener,
                                 timeout=max(1.0, deadline - time.monotonic()))
            storage = settings.get("storage")
            cfg = None if storage is None else as_storage_config(storage).share(W)
            layout = settings.get("layout")
            shards = None if layout is None else ShardMap.from_dict(layout)
            replica = Scheduler(circuit.nodes,
                                make_worker_context(cfg, worker, W, transport,
                                                    errors=circuit.errors, shards=shards),
                                local, atomic=True)
        except BaseException as e:
            wire.send(ctrl, ("err", wire.portable_exception(e)))
            raise
        wire.send(ctrl, ("ready",))
        if on_ready is not None:
            on_ready()
        pending: dict = {}

        def remesh_listen(msg, old):
            """Rollback, phase 1: a fresh listening port for the new mesh."""
            lst = socket.create_server((listen_host, 0))
            pending["listener"] = lst
            return f"{advertise_host or listen_host}:{lst.getsockname()[1]}", None

        def remesh(msg, old):
            """Rollback, phase 2: the new mesh, then undo the failed step."""
            old.close()
            new = tcp_mesh(worker, msg[1], auth, listener=pending.pop("listener"),
                           timeout=timeout)
            replica.ctx.transport = new
            replica.rollback()
            return None, new

        serve_replica(ctrl, replica, transport,
                      {"remesh_listen": remesh_listen, "remesh": remesh}, reader=reader)
    finally:
        if transport is not None:
            transport.close()
        ctrl.close()


def per_worker(value: Any, workers: int, what: str) -> list:
    """``value`` for each of ``workers`` workers: a list of that length as it is, anything else
    (one value, None) repeated."""
    if isinstance(value, (list, tuple)):
        if len(value) != workers:
            raise ValueError(f"{what}: {len(value)} given for {workers} workers ({value!r})")
        return list(value)
    return [value] * workers


def spawn_workers(coordinator: str, workers: int, auth: MeshAuth,
                  python: Union[None, str, Sequence[Optional[str]]] = None,
                  hosts: Optional[Sequence[str]] = None,
                  env: Union[None, dict, Sequence[Optional[dict]]] = None) -> list[subprocess.Popen]:
    """Start ``workers`` local worker processes (``python -m dbsp.cli worker``) that dial
    ``coordinator``; their credentials travel in :data:`AUTH_ENV`, the driver's ``sys.path`` in
    ``PYTHONPATH``.

    Per worker (one value for all, or a list of ``workers``): ``python``, the interpreter;
    ``hosts``, the address it listens on for its peers (e.g. 127.0.0.1 and 127.0.0.2: two hosts
    on one machine), which is the host its checkpoints record; ``env``, variables to add (a
    ``PYTHONPATH`` given goes before the driver's, e.g. another version of the package)."""
    pythons = per_worker(python, workers, "python")
    addrs = per_worker(None if hosts is None else list(hosts), workers, "hosts")
    envs = per_worker(env, workers, "env")
    base = dict(os.environ)
    base[AUTH_ENV] = auth.to_text()
    path = os.pathsep.join(p for p in sys.path if p)
    procs = []
    for i in range(workers):
        e = dict(base)
        extra = dict(envs[i] or {})
        e["PYTHONPATH"] = os.pathsep.join(x for x in (extra.pop("PYTHONPATH", None), path) if x)
        e.update(extra)
        cmd = [pythons[i] or sys.executable, "-m", "dbsp.cli", "worker",
               "--coordinator", coordinator, "--worker", str(i)]
        if addrs[i] is not None:
            cmd += ["--listen", addrs[i]]
        procs.append(subprocess.Popen(cmd, env=e, stdin=subprocess.DEVNULL))
    return procs


class Job:
    """A launched pipeline: ``inputs`` and ``outputs`` by name, ``step()``, ``close()``.

    Push rows into ``job.inputs[name]`` as into any circuit input, call :meth:`step`, read
    ``job.outputs[name]`` (``to_dict()``, ``delta()``, ``view_dict()``).
    """

    def __init__(self, pipeline: Pipeline, workers: int, listen: str, advertise: Optional[str],
                 spawn: bool, python: str, storage: Any, timeout: float,
                 auth: Optional[MeshAuth] = None, errors: str = "raise",
                 layout: Optional[ShardMap] = None, sliced: Sequence[str] = ()):
        self.auth = auth or MeshAuth.new()
        build = resolve_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
        self.spec = pipeline_spec(pipeline)
        settings = {"storage": os.fspath(storage) if storage is not None else None,
                    "errors": check_policy(errors),
                    "layout": None if layout is None else layout.to_dict(),
                    "sliced": list(sliced)}
        self.coordinator = Coordinator(workers, self.auth, listen, self.spec, settings, timeout,
                                       advertise)
        self.circuit = Circuit(workers=workers, executor=self.coordinator.executor,
                               errors=errors)
        if layout is not None:  # the workers have it from the start (settings)
            self.circuit.set_layout(layout)
        self.outputs = build_outputs(self.circuit, build)
        self.circuit.slice_inputs(*sliced)
        self.inputs = self.circuit.inputs
        self.procs: list[subprocess.Popen] = []
        self.python = python
        if spawn:
            self.procs = spawn_workers(self.coordinator.address, workers, self.auth, python)
        if spawn:  # else the first step waits for the workers the caller starts
            try:
                self.coordinator.connect()
            except BaseException:
                self.close()
                raise

    def worker_command(self, i: int) -> str:
        """The shell command that starts worker ``i`` on a host (its credentials included: keep
        it secret)."""
        return (f"{AUTH_ENV}={self.auth.to_text()} dbsp worker --coordinator "
                f"{shlex.quote(self.coordinator.address)} --worker {i}")

    def read_slices(self, name: str, source: Any, step: int) -> int:
        """The next step, input ``name`` also gets step ``step`` of the sliced ``source``
        (:mod:`dbsp.runtime.slices`): every worker reads its own pieces, no row passes through
        this process. Returns the number of pieces (0: the source has no such step)."""
        return self.circuit.read_slices(name, source, step)

    def step(self) -> None:
        self.circuit.step()

    def close(self) -> None:
        self.circuit.close()
        self.coordinator.close()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def launch(pipeline: Pipeline, workers: int = 2, *, listen: str = "127.0.0.1:0",
           advertise: Optional[str] = None, spawn: bool = True, python: Optional[str] = None,
           storage: Any = None, timeout: float = 120.0, errors: str = "raise",
           layout: Optional[ShardMap] = None, sliced: Sequence[str] = ()) -> Job:
    """Run ``pipeline`` on ``workers`` worker processes joined by the authenticated mesh.

    ``spawn=True`` starts them here (``python -m dbsp.cli worker``); ``spawn=False`` waits (up to
    ``timeout`` seconds, so start them from another thread or host first) for workers started
    with :meth:`Job.worker_command` on hosts that reach ``advertise`` (default: the host of
    ``listen``); the first :meth:`Job.step` waits for them. ``storage``: a directory each worker
    spills its state under (its own ``worker-i`` part). ``errors``: the pipeline's error policy
    (:mod:`dbsp.circuit.errors`). ``layout``: the :class:`~dbsp.circuit.exchange.ShardMap` keys
    are sharded by (default: the dynamic map of ``workers``), e.g. one resized from a
    checkpoint's. ``sliced``: inputs the workers read themselves from sliced sources
    (:meth:`Job.read_slices`, :mod:`dbsp.runtime.slices`). Returns the running :class:`Job` (a
    context manager).
    """
    return Job(pipeline, workers, listen, advertise, spawn, python or sys.executable, storage,
               timeout, errors=errors, layout=layout, sliced=sliced)
