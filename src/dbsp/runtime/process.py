"""Worker processes: W replicas of a circuit, worker 0 in the driver and the others forked,
exchanging batches over a socket mesh.

Threads share one interpreter, so only the GIL-free parts of a step (native kernels, Arrow and
numpy loops) run in parallel. Forked processes run *everything* in parallel, at the price of
copying each step's input to the workers and their output back (pickle protocol 5 with the
buffers out of band: one ``memcpy``-speed copy each way). The exchange between workers uses the
same :class:`~dbsp.runtime.socket_transport.SocketTransport` as replicas on separate hosts.

Protocol on each driver <-> worker control socket (one request, one reply):

* ``("step", {input_node: ZSet | None})`` -> ``("ok", {output_node: value})`` (empty outputs
  left out) or ``("err", exc)``
* ``("call", name)`` -> ``("ok", value)``: ``state_rows``, ``profile``
* ``("rollback", peer_ids)`` + the new mesh sockets (``SCM_RIGHTS``) -> ``("ok", None)``: undo the
  last step (it failed somewhere) and exchange over a fresh mesh from now on (an aborted step
  leaves the old one closed or holding half-sent messages)
* ``("apply", fn, args)`` -> ``("ok", fn(replica, *args))``: ``fn`` a module-level function
  (pickled by reference), e.g. a checkpoint layer's save / load of the worker's state
* ``("apply_bg", fn, args)`` -> ``("ok", None)`` at once: ``fn(replica, *args)`` runs on a thread
  of the worker beside its steps (e.g. writing a checkpoint's state) and its result, ``("ok",
  value)`` or ``("err", exc)``, comes on the worker's second socket, the *background* one; a
  worker without one (a launched replica: one connection to its driver) keeps the result until
  the driver asks for it:
* ``("bg_result",)`` -> ``("ok", None)`` while the last ``apply_bg`` runs, then ``("ok",
  result)`` with its result as above
* ``("stop",)`` -> the worker exits

The driver's requests and their replies are one exchange at a time (a lock): a thread other than
the stepping one (a checkpoint writer) may ``apply`` between steps.

A step is atomic: a worker commits it when the next step starts, or rolls it back when the
driver says so (:meth:`dbsp.circuit.scheduler.Scheduler.rollback`).

A worker that dies (killed, crashed) closes its sockets: the driver's next reply read fails and
the step raises :class:`~dbsp.circuit.graph.CircuitError`; the other workers see their
transport aborted.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import traceback
from typing import Any, Callable, Optional

from ..circuit.exchange import TransportAborted
from ..circuit.scheduler import Scheduler
from ..storage import wire
from ..storage.wire import portable_exception
from .slices import SLICES
from .socket_transport import SocketTransport, socketpair_mesh
from . import wire_types  # noqa: F401  (batches cross processes by their buffers)


class WorkerDied(RuntimeError):
    """A worker process exited or closed its connection in the middle of a step."""


def _worker_main(nodes, w: int, workers: int, ctrl: socket.socket, peers, make_ctx,
                 local: frozenset, bg: Optional[socket.socket] = None) -> None:
    transport = SocketTransport(w, peers, workers)
    serve_replica(ctrl, Scheduler(nodes, make_ctx(w, workers, transport), local, atomic=True),
                  transport, bg=bg)


def _run_bg(bg: socket.socket, replica: Scheduler, fn, args) -> None:
    try:
        reply = ("ok", replica.apply(fn, *args))
    except BaseException as e:  # reported to the driver
        reply = ("err", portable_exception(e))
    try:
        wire.send(bg, reply)
    except OSError:
        pass


def _run_boxed(box: list, replica: Scheduler, fn, args) -> None:
    try:
        box.append(("ok", replica.apply(fn, *args)))
    except BaseException as e:  # reported to the driver when it asks
        box.append(("err", portable_exception(e)))


def serve_replica(ctrl: socket.socket, replica: Scheduler, transport: Any,
                  handlers: Optional[dict] = None,
                  bg: Optional[socket.socket] = None, reader: Any = None) -> None:
    """A worker's loop: answer the driver's requests on ``ctrl`` (the protocol of the module
    doc) until it says stop or goes away. An error in a step aborts ``transport`` (so the
    other workers stop waiting in an exchange) and is sent to the driver; a ``rollback`` brings
    a fresh mesh (its sockets passed over ``ctrl``) and undoes the failed step.

    ``handlers``: more commands, ``name -> fn(msg, transport) -> (reply, new transport or
    None)`` (the launcher's workers rebuild their TCP mesh this way). ``bg``: the socket of
    ``apply_bg`` results (None: the driver asks for them with ``bg_result``). ``reader``: a
    :class:`~dbsp.runtime.slices.SliceReader` that reads the slices a step names (a step's
    :data:`~dbsp.runtime.slices.SLICES`) into its input; its report goes back with the
    outputs under the same key."""
    running: Optional[threading.Thread] = None
    box: list = []  # the last apply_bg's result, without a background socket
    while True:
        try:
            msg = wire.recv(ctrl)
        except (wire.WireError, OSError):
            return
        cmd = msg[0]
        if cmd == "stop":
            replica.close()
            return
        try:
            if cmd == "step":
                feed = msg[1]
                report = None
                if SLICES in feed:
                    if reader is None:
                        raise ValueError("this worker cannot read slices of a source (it was "
                                         "started without a slice reader)")
                    report = reader.resolve(feed)
                replica.feed(feed)
                replica.step()
                outs = _nonempty(replica.take_outputs())
                if report:
                    outs[SLICES] = report
                wire.send(ctrl, ("ok", outs))
            elif cmd == "call":
                wire.send(ctrl, ("ok", _call(replica, msg[1])))
            elif cmd == "rollback":
                ids = msg[1]
                _, fds, _, _ = socket.recv_fds(ctrl, 1, len(ids))
                transport.close()
                transport = SocketTransport(
                    replica.ctx.worker, {v: socket.socket(fileno=fd) for v, fd in zip(ids, fds)},
                    replica.ctx.workers)
                replica.ctx.transport = transport
                replica.rollback()
                wire.send(ctrl, ("ok", None))
            elif cmd == "apply":
                wire.send(ctrl, ("ok", replica.apply(msg[1], *msg[2])))
            elif handlers is not None and cmd in handlers:
                reply, new = handlers[cmd](msg, transport)
                if new is not None:
                    transport = new
                    replica.ctx.transport = new
                wire.send(ctrl, ("ok", reply))
            elif cmd == "apply_bg":
                if running is not None:
                    running.join()  # one at a time: results arrive in order
                if bg is not None:
                    running = threading.Thread(target=_run_bg,
                                               args=(bg, replica, msg[1], msg[2]),
                                               name="dbsp-apply-bg", daemon=True)
                else:
                    box = []
                    running = threading.Thread(target=_run_boxed,
                                               args=(box, replica, msg[1], msg[2]),
                                               name="dbsp-apply-bg", daemon=True)
                running.start()
                wire.send(ctrl, ("ok", None))
            elif cmd == "bg_result":
                if bg is not None or running is None:
                    raise ValueError("no background apply to report on")
                wire.send(ctrl, ("ok", None if running.is_alive() else box[0]))
            else:
                wire.send(ctrl, ("err", ValueError(f"unknown command {cmd!r}")))
        except BaseException as e:  # reported to the driver
            try:
                transport.abort()
            except Exception:
                pass
            try:
                wire.send(ctrl, ("err", portable_exception(e)))
            except OSError:
                return


def reply_order(workers, late: Optional[int]) -> list:
    """The order to read one reply from each of ``workers``: ``late`` (the worker whose reply
    came last the time before) first. A driver blocked on the last worker to answer finds the
    others' replies waiting and sleeps once a request; reading in worker order, it sleeps and is
    woken (a wake-up costs it tens of microseconds of CPU, and cold caches after) once for every
    worker that answers after the one before it."""
    order = list(workers)
    if late is not None and len(order) > 1 and late in order and order[0] != late:
        order.remove(late)
        order.insert(0, late)
    return order


def arrived(sock: socket.socket) -> bool:
    """Whether ``sock`` has something to read now (or failed: the read will say how)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) is not None
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def _nonempty(outs: dict) -> dict:
    """A step's outputs without the empty ones: the driver reads a missing output as nothing
    (as a worker whose output operator did not run), and an empty batch still costs its schema
    and a column of buffers each way."""
    return {k: v for k, v in outs.items()
            if not (hasattr(v, "weights") and len(v) == 0)}


def _call(replica, name: str) -> Any:
    if name not in replica.CALLS:
        raise ValueError(f"unknown call {name!r} (known: {', '.join(replica.CALLS)})")
    return getattr(replica, name)()


def _locked(method: Callable) -> Callable:
    def run(self, *args, **kw):
        with self._lock:
            return method(self, *args, **kw)
    run.__doc__, run.__name__ = method.__doc__, method.__name__
    return run


class BackgroundApply:
    """The results of :meth:`ProcessPool.apply_background`, in worker order
    (:meth:`result` waits for them)."""

    def __init__(self, pool: "ProcessPool", local: threading.Thread, box: list):
        self.pool, self.local, self.box = pool, local, box
        self._result: Optional[list] = None

    def result(self) -> list:
        if self._result is not None:
            return self._result
        self.local.join()
        replies, died = [], None
        for w, s in self.pool.bg.items():
            try:
                replies.append(wire.recv(s))
            except (wire.WireError, OSError):
                died = died or WorkerDied(f"worker process {w} (pid {self.pool.pids[w]}) died "
                                          f"during a background apply")
        if died is not None:
            raise died
        kind, mine = self.box[0]
        errs = ([mine] if kind == "err" else []) + [r[1] for r in replies if r[0] == "err"]
        if errs:
            raise errs[0]
        self._result = [mine] + [r[1] for r in replies]
        return self._result


class ProcessPool:
    """The driver's side: runs worker 0 itself, forks workers ``1..W-1``, sends them each step
    and collects their outputs.

    Worker 0 stepping in the driver process saves a process and the copy of its input and
    output; it exchanges with the others over the same socket mesh. The driver sends the other
    workers their step before running its own, so all replicas start together.
    """

    def __init__(self, nodes, workers: int, make_ctx, local: frozenset = frozenset()):
        self.workers = workers
        mesh = socketpair_mesh(workers)
        self.ctrl: dict[int, socket.socket] = {}
        self.bg: dict[int, socket.socket] = {}
        self.pids: dict[int, int] = {}
        self._late: Optional[int] = None  # the worker that replied last (see reply_order)
        self._lock = threading.RLock()  # one request / reply exchange at a time
        for w in range(1, workers):
            parent, child = socket.socketpair()
            bg_parent, bg_child = socket.socketpair()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # worker
                code = 0
                try:
                    parent.close()
                    bg_parent.close()
                    for c in list(self.ctrl.values()) + list(self.bg.values()):
                        c.close()
                    for v, socks in enumerate(mesh):
                        if v != w:
                            for s in socks.values():
                                s.close()
                    _worker_main(nodes, w, workers, child, mesh[w], make_ctx, local, bg_child)
                except BaseException:
                    traceback.print_exc()
                    code = 1
                finally:
                    os._exit(code)
            child.close()
            bg_child.close()
            self.ctrl[w] = parent
            self.bg[w] = bg_parent
            self.pids[w] = pid
        for v, socks in enumerate(mesh):  # the driver keeps worker 0's mesh sockets only
            if v != 0:
                for s in socks.values():
                    s.close()
        self.broken: BaseException | None = None  # a rollback that failed
        self.transport = SocketTransport(0, mesh[0], workers)
        self.replica = Scheduler(nodes, make_ctx(0, workers, self.transport), local, atomic=True)

    def _send(self, msgs: dict) -> None:
        for w, m in msgs.items():
            try:
                wire.send(self.ctrl[w], m)
            except OSError:
                raise WorkerDied(f"worker process {w} (pid {self.pids[w]}) is gone") from None

    def _replies(self, local_error: BaseException | None = None) -> list[Any]:
        """Every forked worker's reply (all are read, so none is left on a socket); raises the
        first real error: a dead worker, then an error of the driver's own worker, then one a
        worker reported (an aborted exchange only when there is nothing else)."""
        got, died = {}, {}
        for i, w in enumerate(reply_order(self.ctrl, self._late)):
            sock = self.ctrl[w]
            if i and not arrived(sock):
                self._late = w  # came after the one read first: read it first next time
            try:
                got[w] = wire.recv(sock)
            except (wire.WireError, OSError):
                died[w] = WorkerDied(f"worker process {w} (pid {self.pids[w]}) died during "
                                     f"the step")
        if died:
            raise died[min(died)]
        replies = [got[w] for w in self.ctrl]
        errs = ([local_error] if local_error is not None else []) + \
            [r[1] for r in replies if r[0] == "err"]
        if errs:
            real = [e for e in errs if not isinstance(e, TransportAborted)]
            raise (real or errs)[0]
        return [r[1] for r in replies]

    @_locked
    def step(self, inputs: list[dict], check=None) -> list[dict]:
        """One step on every worker; ``check(outputs)`` may refuse it before it commits (the
        workers commit a step when the next one starts)."""
        self._send({w: ("step", inputs[w]) for w in self.ctrl})
        r = self.replica
        r.feed(inputs[0])
        try:
            r.step()
        except BaseException as e:  # wake the workers waiting on an exchange, then report
            self.transport.abort()
            try:
                self._replies(e)  # raises: e, or a worse error from the others
            except WorkerDied:
                raise
            except BaseException:
                self.rollback()
                raise
            raise
        try:
            replies = self._replies()
        except WorkerDied:
            raise
        except BaseException:
            self.rollback()
            raise
        outs = [r.take_outputs()] + replies
        if check is not None:
            try:
                check(outs)
            except BaseException:
                self.rollback()
                raise
        r.commit()
        return outs

    @_locked
    def rollback(self) -> None:
        """Undo the failed step on every worker, over a fresh socket mesh (see the module doc)."""
        try:
            self._rollback()
        except BaseException as e:
            self.broken = e

    def _rollback(self) -> None:
        mesh = socketpair_mesh(self.workers)
        for w, c in self.ctrl.items():
            ids = sorted(mesh[w])
            try:
                wire.send(c, ("rollback", ids))
                socket.send_fds(c, [b"m"], [mesh[w][v].fileno() for v in ids])
            except OSError:
                raise WorkerDied(f"worker process {w} (pid {self.pids[w]}) is gone") from None
        for v, socks in enumerate(mesh):
            if v != 0:
                for s in socks.values():
                    s.close()
        self.transport.close()
        self.transport = SocketTransport(0, mesh[0], self.workers)
        self.replica.ctx.transport = self.transport
        self.replica.rollback()
        self._replies()

    @_locked
    def call(self, name: str) -> list[Any]:
        mine = _call(self.replica, name)  # refuses an unknown name before asking the others
        self._send({w: ("call", name) for w in self.ctrl})
        return [mine] + self._replies()

    @_locked
    def apply(self, fn, *args) -> list[Any]:
        """``fn(replica, *args)`` on every worker (the forked ones concurrently with this
        process's own), in worker order."""
        self._send({w: ("apply", fn, args) for w in self.ctrl})
        try:
            mine = self.replica.apply(fn, *args)
        except BaseException as e:
            self._replies(e)
            raise
        return [mine] + self._replies()

    def apply_background(self, fn, *args) -> BackgroundApply:
        """Start ``fn(replica, *args)`` on a thread of every worker (this process's own too)
        and return at once; the workers go on stepping meanwhile (``fn`` must be safe beside a
        step, as a checkpoint's write is). One at a time: wait for the previous result."""
        box: list = []

        def local() -> None:
            try:
                box.append(("ok", self.replica.apply(fn, *args)))
            except BaseException as e:  # raised by result()
                box.append(("err", e))

        with self._lock:
            self._send({w: ("apply_bg", fn, args) for w in self.ctrl})
            self._replies()
        t = threading.Thread(target=local, name="dbsp-apply-bg", daemon=True)
        t.start()
        return BackgroundApply(self, t, box)

    def close(self) -> None:
        self.replica.close()
        for c in self.ctrl.values():
            try:
                wire.send(c, ("stop",))
            except OSError:
                pass
            c.close()
        for c in self.bg.values():
            c.close()
        for pid in self.pids.values():
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.transport.close()
        self.ctrl, self.bg, self.pids = {}, {}, {}
