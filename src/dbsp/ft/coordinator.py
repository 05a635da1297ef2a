"""The coordinator / worker loop of seed 000 ("Coordinator/worker synchronization"): a step loop
with a Run / Pause / Paused / Stop / Stopped state machine and a cancellation token, periodic
checkpoints, and the restart of a pipeline whose worker died.

A :class:`Coordinator` runs a :class:`~dbsp.ft.durable.DurableCircuit` on a thread of its own:

* ``Run``: ``read(step, token)`` gives the step's input (``{input name: (RecordBatch, weights)}``
  or rows for ``push``, or :class:`~dbsp.runtime.slices.SourceStep` for an input the workers
  read from a sliced source; None when there is none yet or the token was cancelled); the circuit
  steps on it (input logged, output logged), and checkpoints follow the durable circuit's
  ``checkpoint_every`` / ``checkpoint_seconds``;
* :meth:`Coordinator.pause` sets ``Pause`` and cancels the token, so a ``read`` blocked waiting
  for input returns; the loop then parks in ``Paused(step)`` and ``pause`` returns that step -
  every worker of the (lockstepped) circuit is at that common step boundary;
* :meth:`Coordinator.resume` goes back to ``Run`` with a fresh token;
* :meth:`Coordinator.stop` (``Stop(x)``) runs up to step ``x`` and stops (``Stopped``).

*Restart.* A worker process that dies is replaced by the durable circuit itself (see
:mod:`dbsp.ft.durable`), counted in :attr:`Coordinator.restarts`. Past its ``max_restarts``,
``build()`` makes the durable circuit (graph, inputs, outputs) afresh: when a step fails because
a worker process died (:class:`~dbsp.runtime.process.WorkerDied`), the coordinator logs a
warning, counts it, closes the broken circuit and builds and opens a new one: recovery restores the last checkpoint and replays the logged input, which
includes the failed step (its input was logged before it ran). The user's ``read`` is asked for
step ``n`` again only if step ``n`` was never logged.
"""
from __future__ import annotations

import enum
import logging
import threading
from typing import Any, Callable, Optional

from ..runtime.process import WorkerDied
from ..runtime.slices import SourceStep
from ..storage.osthreads import name_os_thread

__all__ = ["Coordinator", "State", "CancelToken"]

log = logging.getLogger("dbsp.ft")


class State(enum.Enum):
    RUN = "run"
    PAUSE = "pause"
    PAUSED = "paused"
    STOP = "stop"
    STOPPED = "stopped"


class CancelToken:
    """Cancelled by :meth:`Coordinator.pause`: a ``read`` waiting for input should return."""

    def __init__(self) -> None:
        self._ev = threading.Event()

    def cancel(self) -> None:
        self._ev.set()

    @property
    def cancelled(self) -> bool:
        return self._ev.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Sleep up to ``timeout``; True if cancelled meanwhile."""
        return self._ev.wait(timeout)


class Coordinator:
    """See the module doc. ``build()`` -> a DurableCircuit (not opened); ``read(step, token)``
    -> this step's input or None; ``max_restarts``: worker deaths tolerated in a row."""

    def __init__(self, build: Callable[[], Any], read: Callable[[int, CancelToken], Any],
                 max_restarts: int = 5):
        self.build = build
        self.read = read
        self.max_restarts = max_restarts
        self._restarts = 0  # of durable circuits replaced before the current one
        self.durable = build().open()
        self._cv = threading.Condition()
        self.state = State.RUN
        self._stop_at: Optional[int] = None
        self._token = CancelToken()
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, name="dbsp-coordinator", daemon=True)
        self._thread.start()

    @property
    def restarts(self) -> int:
        """Worker processes that died and were replaced (by the durable circuit itself, or by
        building a new one)."""
        return self._restarts + self.durable.restarts

    @property
    def step(self) -> int:
        """The next step to run."""
        return self.durable.step_no

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        name_os_thread()
        try:
            while True:
                with self._cv:
                    if self.state is State.PAUSE:
                        self.state = State.PAUSED
                        self._cv.notify_all()
                    while self.state is State.PAUSED:
                        self._cv.wait()
                    if self.state is State.STOP:
                        if self.step == self._stop_at:
                            break
                        if self.step > self._stop_at:  # type: ignore[operator]
                            raise RuntimeError(f"asked to stop at step {self._stop_at}, "
                                               f"already at step {self.step}")
                    token = self._token
                data = self.read(self.step, token)
                if data is None:
                    continue
                self._run_step(data)
        except BaseException as e:  # reported by pause / stop / join
            self.error = e
        finally:
            with self._cv:
                self.state = State.STOPPED
                self._cv.notify_all()

    def _run_step(self, data: dict) -> None:
        deaths = 0
        while True:
            before = self.durable.step_no
            c = self.durable.circuit
            slices = {}
            for name, rows in data.items():
                if isinstance(rows, SourceStep):
                    slices[name] = rows.step
                elif isinstance(rows, tuple):
                    c.inputs[name].put_pending(*rows)
                else:
                    c.inputs[name].push(rows)
            try:
                self.durable.step(slices=slices or None)
                return
            except WorkerDied as e:
                deaths += 1
                self._restarts += 1
                log.warning("a worker process died in step %d (%s); restarting from the last "
                            "checkpoint (restart %d)", self.durable.step_no, e, self.restarts)
                if deaths > self.max_restarts:
                    raise
                # the step's input was logged (the replay runs it again), or the step even
                # finished and the death surfaced in the checkpoint after it
                logged = self.durable.input_log.end > before
                self._restart()
                if logged:
                    return

    def _restart(self) -> None:
        old = self.durable
        self._restarts += old.restarts
        try:
            old.circuit.close()
        except Exception:  # the broken circuit's own errors are not news
            pass
        self.durable = self.build().open()

    # -- control -----------------------------------------------------------------------------
    def pause(self) -> int:
        """Pause at a step boundary; returns the step the pipeline paused before."""
        with self._cv:
            if self.state is State.RUN:
                self.state = State.PAUSE
                self._token.cancel()
            while self.state is State.PAUSE:
                self._cv.wait()
            self._raise()
            return self.step

    def resume(self) -> None:
        with self._cv:
            if self.state is State.PAUSED:
                self._token = CancelToken()
                self.state = State.RUN
                self._cv.notify_all()

    def stop(self, step: Optional[int] = None) -> int:
        """Run up to step ``step`` (default: pause now) and stop; returns the final step."""
        if step is None:
            step = self.pause()
        with self._cv:
            self._stop_at = step
            self.state = State.STOP
            self._cv.notify_all()
        self._thread.join()
        self._raise()
        return self.step

    def close(self) -> None:
        """Stop (if running) and close the durable circuit (a last checkpoint)."""
        if self._thread.is_alive():
            self.stop()
        self.durable.close()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error
