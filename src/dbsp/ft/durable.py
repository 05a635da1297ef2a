"""Exactly-once stepping: a circuit with a checkpoint store, an input log and an output log
(seed 000, "Fault tolerance").

A :class:`DurableCircuit` wraps a :class:`~dbsp.runtime.circuit.Circuit` whose graph is built.
:meth:`DurableCircuit.open` recovers: it restores the last checkpoint (or a named one) and replays
every step the input log holds after it, writing the outputs to the output log, which discards
what it already holds. Then each :meth:`DurableCircuit.step`

1. takes the pending input of every input and records it (with the producers' positions) in the
   input log, durably: the division of input into steps is fixed before any output of the step
   exists;
2. runs the circuit on exactly that input;
3. writes every output's delta to the output log as step ``n``;
4. every ``checkpoint_every`` steps (or ``checkpoint_seconds``), takes a checkpoint: the state is
   captured at this step boundary and written (in the threads runtime) on a background thread
   while the circuit steps on; once published, the input log is trimmed below the oldest
   checkpoint kept.

Resuming with another number of workers is a cold layout change (seed 000, "Layout changes"): the
store re-shards the checkpoint's state for the new workers (each loads the shards it now owns,
see :mod:`dbsp.checkpoint.reshard`), and :meth:`DurableCircuit.open` commits a checkpoint in the
new layout at once, before it replays or processes any input (a crash in between redoes the
change from the old checkpoint). Replay needs no particular layout: the input log holds each
step's whole input, and an output is the same Z-set whatever the number of workers.

Graceful shutdown is the case with nothing to replay: :meth:`close` takes a last checkpoint
(``checkpoint_on_close``) and waits for the one being written.

The checkpoint store is anything with :class:`StateStore`'s methods (the checkpoint layer's
:class:`dbsp.checkpoint.CheckpointStore`; this layer does not import it), or a function
``circuit -> store`` called at :meth:`open`, once the circuit's graph is complete (a store checks
the circuit's fingerprint when it opens).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Optional, Protocol

from .logs import InputLog, OutputLog

__all__ = ["DurableCircuit", "StateStore", "RecoveryError"]


class RecoveryError(RuntimeError):
    """The input log cannot bring the restored checkpoint up to date."""


class StateStore(Protocol):
    """What :class:`DurableCircuit` needs of a checkpoint store."""

    checkpoints: list

    def restore(self, circuit: Any, name: Any = None) -> Any: ...

    def begin(self, circuit: Any, step: int) -> Any: ...

    def close(self) -> Any: ...

    # optional: ``prepare(circuit, name)`` gives the circuit the checkpoint's layout before its
    # workers start; ``layout_change`` (set by ``restore``) says the layout changed


class DurableCircuit:
    """See the module doc. ``root``: the directory of the logs (``<root>/input``,
    ``<root>/output``). ``check_output``: compare replayed output with the logged output."""

    def __init__(self, circuit: Any, store: Any, root: str, *,
                 checkpoint_every: Optional[int] = None,
                 checkpoint_seconds: Optional[float] = None,
                 check_output: bool = False, background: Optional[bool] = None,
                 checkpoint_on_close: bool = True,
                 fence: Optional[Callable[[str], None]] = None):
        if checkpoint_every is not None and checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1 step, got {checkpoint_every}")
        if checkpoint_seconds is not None and checkpoint_seconds <= 0:
            raise ValueError(f"checkpoint_seconds must be > 0, got {checkpoint_seconds}")
        self.circuit = circuit
        self._store_factory = store if callable(store) else None
        self.store: Any = None if callable(store) else store
        self.root = root
        self.checkpoint_every = checkpoint_every
        self.checkpoint_seconds = checkpoint_seconds
        self.checkpoint_on_close = checkpoint_on_close
        self.input_log = InputLog(os.path.join(root, "input"))
        self.output_log = OutputLog(os.path.join(root, "output"), check=check_output)
        # writing a checkpoint beside running steps needs workers reachable between steps
        # from another thread: the threads runtime (not remote replicas: one control socket)
        remote = getattr(circuit, "remote", False)
        self.background = (not remote and (circuit.runtime == "threads" or circuit.workers == 1)) \
            if background is None else background
        #: ``fence(what)`` raises when this circuit may no longer write its logs (a replica
        #: of an old generation, :mod:`dbsp.ft.remote`); called before every append
        self.fence = fence
        self.step_no = 0
        self.opened = False
        self.replayed = 0
        self.recovery_seconds = 0.0
        self.last_checkpoint: Any = None
        self.pauses: list[float] = []
        self._since = 0
        self._t_last = time.monotonic()
        self._writer: Optional[threading.Thread] = None
        self._writer_error: Optional[BaseException] = None
        self.on_replay: Optional[Callable[[int, dict], None]] = None
        #: the layout change :meth:`open` made (see the module doc), else None
        self.layout_change: Optional[dict] = None

    # -- recovery ----------------------------------------------------------------------------
    def open(self, checkpoint: Any = None) -> "DurableCircuit":
        """Restore checkpoint ``checkpoint`` (default: the latest) and replay the logged input
        after it. Idempotent."""
        if self.opened:
            return self
        t0 = time.perf_counter()
        c = self.circuit
        if self.store is None:
            self.store = self._store_factory(c)
        prepare = getattr(self.store, "prepare", None)
        if prepare is not None and not c.running:
            prepare(c, checkpoint)
        c.start()
        info = self.store.restore(c, checkpoint)
        start = info.step if info is not None else 0
        self.last_checkpoint = info
        self.layout_change = getattr(self.store, "layout_change", None)
        if self.layout_change is not None:  # the new layout's first commit, before any input
            self.step_no = start
            info = self._publish(self.store.begin(c, start))
        log = self.input_log
        if log.end == log.first:  # empty: continue at the checkpoint
            log.start_at(max(start, log.end))
        if log.first > start:
            raise RecoveryError(f"the input log starts at step {log.first}, after checkpoint "
                                f"step {start}: steps {start}..{log.first - 1} are lost")
        if log.end < start:
            raise RecoveryError(f"the input log ends at step {log.end - 1}, before checkpoint "
                                f"step {start}")
        if self.output_log.end == self.output_log.first and self.output_log.end < start:
            self.output_log.start_at(start)
        self.step_no = start
        for s in range(start, log.end):
            parts, _, _ = log.read(s)
            for name, inp in c.inputs.items():
                inp.take_pending()
                if name in parts:
                    inp.put_pending(*parts[name], record_keys=True)
            c.step()
            self._write_outputs(s)
            if self.on_replay is not None:
                self.on_replay(s, parts)
            self.step_no = s + 1
            self.replayed += 1
        self.recovery_seconds = time.perf_counter() - t0
        self.opened = True
        return self

    # -- stepping ----------------------------------------------------------------------------
    def recorded_position(self, name: str) -> Optional[int]:
        """The last producer position recorded for input ``name`` (see :mod:`.logs`)."""
        return self.input_log.position(name)

    def step(self, positions: Optional[dict] = None, meta: Optional[dict] = None) -> int:
        """Log this step's pending input (with ``positions``), run it, log its output.
        Returns the step number run."""
        self.open()
        self._raise_writer_error()
        c = self.circuit
        parts = {name: inp.take_pending() for name, inp in c.inputs.items()}
        s = self.step_no
        try:
            if self.fence is not None:
                self.fence("input log")
            self.input_log.append(s, parts, positions or {}, meta)
        except BaseException:
            for name, p in parts.items():  # not recorded: the rows stay pending
                if p is not None:
                    c.inputs[name].put_pending(*p)
            raise
        for name, p in parts.items():
            if p is not None:
                c.inputs[name].put_pending(*p)
        try:
            c.step()
        except BaseException:
            if c.failed is None:  # rolled back: the input was not applied, nothing to replay
                self.input_log.retract(s)
            raise
        self._write_outputs(s)
        self.step_no = s + 1
        self._since += 1
        if self._due():
            self.checkpoint(wait=not self.background)
        return s

    def _write_outputs(self, step: int) -> None:
        outs = {}
        for h in self.circuit.outputs:
            d = h.delta()
            if len(d):
                outs[h.name] = d.to_arrow()
        if self.fence is not None and step >= self.output_log.end:  # an append
            self.fence("output log")
        self.output_log.write(step, outs)

    def _due(self) -> bool:
        if self.checkpoint_every is not None and self._since >= self.checkpoint_every:
            return True
        return self.checkpoint_seconds is not None and \
            time.monotonic() - self._t_last >= self.checkpoint_seconds

    # -- checkpoints -------------------------------------------------------------------------
    def checkpoint(self, wait: bool = True) -> Any:
        """Checkpoint at this step boundary. ``wait=False``: return once the state is captured
        (the pause), write it on a background thread (a previous one is waited for first).
        Returns the published checkpoint (``wait``) or None."""
        self.open()
        self.wait_checkpoint()
        t0 = time.perf_counter()
        pc = self.store.begin(self.circuit, self.step_no)
        self.pauses.append(time.perf_counter() - t0)
        self._since = 0
        self._t_last = time.monotonic()
        if wait:
            return self._publish(pc)
        self._writer = threading.Thread(target=self._write_bg, args=(pc,),
                                        name="dbsp-checkpoint", daemon=True)
        self._writer.start()
        return None

    def _write_bg(self, pc: Any) -> None:
        try:
            self._publish(pc)
        except BaseException as e:  # raised by the next step / checkpoint
            self._writer_error = e

    def _publish(self, pc: Any) -> Any:
        info = pc.finish()
        self.last_checkpoint = info
        oldest = self.store.checkpoints[0].step if self.store.checkpoints else 0
        self.input_log.trim(oldest)
        return info

    def wait_checkpoint(self) -> None:
        """Wait for the checkpoint being written (if any); raise its error."""
        t = self._writer
        if t is not None:
            t.join()
            self._writer = None
        self._raise_writer_error()

    def _raise_writer_error(self) -> None:
        e, self._writer_error = self._writer_error, None
        if e is not None:
            raise e

    def close(self) -> None:
        """Graceful shutdown: wait for a checkpoint being written, take a last one (nothing to
        replay on restart), close the circuit."""
        try:
            if self.opened and self.circuit.failed is None:
                self.wait_checkpoint()
                if self.checkpoint_on_close and (self.last_checkpoint is None or
                                                 self.last_checkpoint.step != self.step_no):
                    self.checkpoint(wait=True)
        finally:
            store = self.store
            self.circuit.close(before_unlock=store.close if store is not None else None)

    def report(self) -> dict:
        cp = self.last_checkpoint
        return {"step": self.step_no,
                "last_checkpoint": None if cp is None else
                {"name": cp.name, "step": cp.step, "bytes": cp.bytes, "time": cp.time},
                "checkpoints": 0 if self.store is None else len(self.store.checkpoints),
                "replayed_steps": self.replayed,
                "recovery_seconds": self.recovery_seconds,
                "input_log": {"first": self.input_log.first, "end": self.input_log.end},
                "output_log": {"first": self.output_log.first, "end": self.output_log.end,
                               "discarded": self.output_log.discarded},
                "max_pause_seconds": max(self.pauses) if self.pauses else 0.0,
                "layout_change": self.layout_change}

