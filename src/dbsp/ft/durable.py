"""Exactly-once stepping: a circuit with a checkpoint store, an input log and an output log
(seed 000, "Fault tolerance").

A :class:`DurableCircuit` wraps a :class:`~dbsp.runtime.circuit.Circuit` whose graph is built.
:meth:`DurableCircuit.open` recovers: it restores the last checkpoint (or a named one) and replays
every step the input log holds after it, writing the outputs to the output log, which discards
what it already holds. Then each :meth:`DurableCircuit.step`

1. takes the pending input of every input and hands it (with the producers' positions) to the
   input log, whose logger thread writes and fsyncs it while the circuit computes;
2. runs the circuit on exactly that input;
3. waits until the step's input record is durable - the division of input into steps is fixed
   before any output of the step is released - then writes every output's delta to the output
   log as step ``n`` (fsynced in bulk before the next checkpoint is published: output after the
   last checkpoint is re-produced by replay);
4. every ``checkpoint_every`` steps (or ``checkpoint_seconds``), takes a checkpoint: the state is
   captured at this step boundary and written on a background thread (in worker processes and
   remote replicas, on a thread of each worker) while the circuit steps on; once published,
   the input log is trimmed below the oldest checkpoint kept. The cadence counts from the last
   committed checkpoint's step, across recoveries too: :meth:`DurableCircuit.open` counts the
   replayed steps as steps since that checkpoint, and a replay of ``checkpoint_every`` steps or
   more commits a checkpoint before any new input. So with ``checkpoint_every = n`` a recovery
   replays at most ``2 n`` steps however often its replicas die (``n`` plus the steps run while
   the checkpoint after them was written in the background, which a death may cut short).
   ``checkpoint_seconds`` follows the same rule by the wall clock: it counts from the time the
   last committed checkpoint was taken (recorded in the catalog), and a recovery that ends past
   it commits a checkpoint before any new input: a recovery replays the steps of about
   ``checkpoint_seconds`` (plus a background write a death cut short), however often the
   replicas die.

Resuming with another number of workers is a cold layout change (seed 000, "Layout changes"): the
store re-shards the checkpoint's state for the new workers (each loads the shards it now owns,
see :mod:`dbsp.checkpoint.reshard`), and :meth:`DurableCircuit.open` commits a checkpoint in the
new layout at once, before it replays or processes any input (a crash in between redoes the
change from the old checkpoint). Replay needs no particular layout: the input log holds each
step's whole input, and an output is the same Z-set whatever the number of workers.

*A worker process that dies* (:class:`~dbsp.runtime.process.WorkerDied`, e.g. ``kill -9``) in a
step or a checkpoint costs the caller a warning and a counter (:attr:`DurableCircuit.restarts`,
in :meth:`DurableCircuit.report`), nothing more: the circuit's workers are rebuilt
(:meth:`~dbsp.runtime.circuit.Circuit.restart`), the last checkpoint is restored and the input
log replayed - the failed step included, its input was logged before it ran - so the step returns
as if nothing had happened (its output is the same: the replay is deterministic, and output
already logged is discarded). More than ``max_restarts`` deaths in a row raise.

*Re-readable sources* (:class:`~dbsp.ft.logs.Rereadable`, given with :meth:`rereadable`):
``step(spans={input: (start, end)})`` says the step's rows of an input are its source's
positions ``[start, end)``; the input log then records the range, the row count and a checksum
of the rows instead of the rows (:class:`~dbsp.ft.logs.Span`), and the replay re-reads the
range, conforms it to the input's schema and checks both: a source that changed under the log
is a :class:`RecoveryError` naming the input and the step.

*Sliced sources* (:mod:`dbsp.runtime.slices`, given with :meth:`sliced`): the workers read
their own pieces of a step (``step(slices={input: k})``), no row passes through this process.
The step runs first and its record is written after it, before any output of the step is
released: it holds each piece's position and the row count and checksum the worker reported
(:class:`~dbsp.ft.logs.Slices`). The replay sends the same pieces, dealt over the workers there
are now, with what each must read back as: a piece that reads back different, or cannot be
read, is a :class:`RecoveryError` naming the input, the step and the piece.

Graceful shutdown is the case with nothing to replay: :meth:`close` takes a last checkpoint
(``checkpoint_on_close``) and waits for the one being written.

The checkpoint store is anything with :class:`StateStore`'s methods (the checkpoint layer's
:class:`dbsp.checkpoint.CheckpointStore`; this layer does not import it), or a function
``circuit -> store`` called at :meth:`open`, once the circuit's graph is complete (a store checks
the circuit's fingerprint when it opens).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Protocol

from ..algebra.schema import conform
from ..runtime.process import WorkerDied
from ..runtime.slices import SliceError
from ..storage.osthreads import name_os_thread
from .logs import InputLog, OutputLog, Rereadable, Slices, Span, rows_crc

log = logging.getLogger("dbsp.ft")

__all__ = ["DurableCircuit", "StateStore", "RecoveryError"]


class RecoveryError(RuntimeError):
    """The input log cannot bring the restored checkpoint up to date."""


class StateStore(Protocol):
    """What :class:`DurableCircuit` needs of a checkpoint store."""

    checkpoints: list

    def restore(self, circuit: Any, name: Any = None) -> Any: ...

    def begin(self, circuit: Any, step: int, at: Optional[float] = None) -> Any: ...

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
                 fence: Optional[Callable[[str], None]] = None, max_restarts: int = 5,
                 clock: Callable[[], float] = time.time):
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
        # checkpoints are written beside the next steps (worker processes write their own
        # state on a thread of their own); a remote executor must say so (background=True:
        # dbsp.ft.remote's replicas write on a thread and the writer polls for the results)
        remote = getattr(circuit, "remote", False)
        self.background = (not remote) if background is None else background
        #: ``fence(what)`` raises when this circuit may no longer write its logs (a replica
        #: of an old generation, :mod:`dbsp.ft.remote`); called before every append
        self.fence = fence
        self.max_restarts = max_restarts
        #: the wall clock of the time cadence (``checkpoint_seconds``), also recorded in each
        #: checkpoint (:attr:`~dbsp.checkpoint.CheckpointInfo.time`): a wall clock, because the
        #: age of a checkpoint taken by an earlier process must be read after a restart
        self.clock = clock
        #: worker processes that died and were replaced (the pipeline went on)
        self.restarts = 0
        self.step_no = 0
        self.opened = False
        self.replayed = 0
        self.recovery_seconds = 0.0
        self.last_checkpoint: Any = None
        #: a checkpoint is due, being captured or being written (True from before the step
        #: count reaches its step until it is published or has failed): until then the step
        #: count may already be past :attr:`last_checkpoint` while the state on disk is not
        self.checkpointing = False
        self.pauses: list[float] = []
        self._since = 0
        self._t_last = clock()
        self._writer: Optional[threading.Thread] = None
        self._writer_error: Optional[BaseException] = None
        #: a step's input record that could not be made durable: no step runs any more
        self.failed: Optional[BaseException] = None
        self.on_replay: Optional[Callable[[int, dict], None]] = None
        #: what the last :meth:`open` did (see :meth:`open`); ``on_open(recovery)`` is told too
        self.recovery: Optional[dict] = None
        self.on_open: Optional[Callable[[dict], None]] = None
        #: the layout change :meth:`open` made (see the module doc), else None
        self.layout_change: Optional[dict] = None
        #: inputs logged by position: ``{input: Rereadable}`` (see :meth:`rereadable`)
        self.sources: dict[str, Rereadable] = {}
        #: inputs the workers read from sliced sources: ``{input: SlicedSource}``
        self.sliced_sources: dict[str, Any] = {}
        # the pushed rows of a sliced step a dead worker interrupted before it was logged
        self._retry: Optional[dict] = None

    def sliced(self, name: str, source: Any) -> None:
        """Input ``name``'s rows come (in the steps that say so, ``step(slices={name: k})``)
        from the sliced ``source`` (:class:`~dbsp.runtime.slices.SlicedSource`), each worker
        reading its own pieces; recovery reads the logged pieces again (give the source again
        before :meth:`open` when resuming). Before the circuit starts, this also names the input
        as sliced (:meth:`~dbsp.runtime.circuit.Circuit.slice_inputs`)."""
        if name not in self.circuit.inputs:
            raise KeyError(f"sliced: the circuit has no input {name!r} (inputs: "
                           f"{sorted(self.circuit.inputs)})")
        if name not in self.circuit.sliced:
            self.circuit.slice_inputs(name)
        self.sliced_sources[name] = source

    def _read_slices(self, slices: dict) -> None:
        """Queue ``{input: source step}`` on the circuit (with checksums: they are logged)."""
        for name, k in slices.items():
            src = self.sliced_sources.get(name)
            if src is None:
                raise ValueError(f"step(slices=...): input {name!r} has no sliced source "
                                 f"(sliced(name, source) first)")
            self.circuit.read_slices(name, src, int(k), checksum=True)

    def rereadable(self, name: str, source: Rereadable) -> None:
        """Input ``name``'s rows come (in the steps that say so with ``spans=``) from
        ``source``, which can read them again by position: the input log records positions for
        them, and recovery re-reads them from ``source`` (give it again before :meth:`open`
        when resuming)."""
        if name not in self.circuit.inputs:
            raise KeyError(f"rereadable: the circuit has no input {name!r} (inputs: "
                           f"{sorted(self.circuit.inputs)})")
        if not callable(getattr(source, "reread", None)):
            raise TypeError(f"rereadable: the source of input {name!r} has no reread(start, "
                            f"end) method")
        self.sources[name] = source

    def _replay_input(self, step: int) -> dict:
        """``{input: (batch, weights)}`` of a logged step, spans read again from their
        sources."""
        parts, _, _ = self.input_log.read(step)
        for name, p in parts.items():
            if isinstance(p, Span):
                parts[name] = self._reread(name, step, p)
        return parts

    def _reread(self, name: str, step: int, span: Span) -> tuple:
        """The rows of ``span`` (input ``name``, step ``step``) read again from the input's
        source, checked against the log."""
        src = self.sources.get(name)
        where = f"input '{name}', step {step}: positions [{span.start}, {span.end})"
        if src is None:
            raise RecoveryError(f"{where} were logged by position, but no re-readable source is "
                                f"given for the input (rereadable(name, source) before open)")
        inp = self.circuit.inputs[name]
        try:
            data = src.reread(span.start, span.end)
        except Exception as e:
            raise RecoveryError(f"{where} cannot be read again from the source: "
                                f"{type(e).__name__}: {e}") from e
        batch, w = conform(name, inp.schema, data, None)
        if batch.num_rows != span.rows:
            raise RecoveryError(f"{where} read again gave {batch.num_rows} rows, the input log "
                                f"recorded {span.rows}: the source changed under the log")
        if rows_crc(batch, w) != span.crc:
            raise RecoveryError(f"{where} read again differ from the rows the input log "
                                f"recorded (checksum of their content and weights): the source "
                                f"changed under the log")
        return batch, w

    def _replay_slices(self, name: str, step: int, sl: Slices) -> None:
        src = self.sliced_sources.get(name)
        if src is None:
            raise RecoveryError(f"input '{name}', step {step}: read by the workers from a "
                                f"sliced source, but none is given for the input (sliced(name, "
                                f"source) before open)")
        self.circuit.read_slices(name, src, pieces=sl.pieces, expect=sl.report, checksum=True)

    # -- recovery ----------------------------------------------------------------------------
    def open(self, checkpoint: Any = None) -> "DurableCircuit":
        """Restore checkpoint ``checkpoint`` (default: the latest) and replay the logged input
        after it. Idempotent. What it did is :attr:`recovery`: ``checkpoint_step`` (the step of
        the checkpoint restored, None without one), ``replayed_steps`` (the logged steps run
        again after it), ``replayed_pieces`` (the pieces of sliced sources the workers read
        again and checked against their logged checksums), ``step`` (the next step),
        ``seconds``, ``checkpoint_age`` (the wall seconds, by :attr:`clock`, since the restored
        checkpoint was taken, at the end of the replay) and ``checkpointed`` (the step of the
        checkpoint committed at the end of a replay of ``checkpoint_every`` steps or more, or
        when ``checkpoint_age`` reached ``checkpoint_seconds``, else None)."""
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
            info = self._publish(self._begin())
        log = self.input_log
        if log.end == log.first:  # empty: continue at the checkpoint
            log.start_at(max(start, log.end))
        if log.first > start:
            raise RecoveryError(f"the input log starts at step {log.first}, after checkpoint "
                                f"step {start}: steps {start}..{log.first - 1} are lost")
        if log.end < start:
            raise RecoveryError(f"the input log ends at step {log.end - 1}, before checkpoint "
                                f"step {start}")
        self.output_log.repair(start)  # records after the checkpoint a power loss tore
        if self.output_log.end == self.output_log.first and self.output_log.end < start:
            self.output_log.start_at(start)
        self.step_no = start
        pieces = 0
        # the next step's input is read (and re-read from its sources) on a thread while the
        # circuit runs this one: reading, checksums and IPC decoding release the GIL
        pool = ThreadPoolExecutor(1, thread_name_prefix="dbsp-replay-read") \
            if log.end - start > 1 else None
        try:
            ahead = None
            for s in range(start, log.end):
                parts = ahead.result() if ahead is not None else self._replay_input(s)
                ahead = pool.submit(self._replay_input, s + 1) \
                    if pool is not None and s + 1 < log.end else None
                for name, inp in c.inputs.items():
                    inp.take_pending()
                    p = parts.get(name)
                    if isinstance(p, Slices):
                        self._replay_slices(name, s, p)
                        pieces += len(p.pieces)
                        p = p.pushed
                    if p is not None:
                        inp.put_pending(*p, record_keys=True)
                try:
                    c.step()
                except SliceError as e:
                    raise RecoveryError(f"step {s}: {e}") from e
                self._write_outputs(s)
                if self.on_replay is not None:
                    self.on_replay(s, parts)
                self.step_no = s + 1
                self.replayed += 1
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        # the cadence counts from the restored checkpoint, not from this open: a generation
        # killed every few steps would otherwise push the next checkpoint further out each
        # time and replay ever more. A replay of ``checkpoint_every`` steps or more ends with a
        # checkpoint, committed before any new input (the next death replays none of it).
        # The time cadence too counts from when the restored checkpoint was taken (its wall
        # time is in the catalog), or without one from when the first logged step was: a
        # generation killed more often than every ``checkpoint_seconds`` would otherwise never
        # checkpoint again. Past due after the replay, a checkpoint comes before new input.
        self._since = self.step_no - start
        now = self.clock()
        self._t_last = min(now, self._taken(now))  # (a clock set back: count from now)
        age = now - self._t_last
        recovery_checkpoint = None
        if (self.checkpoint_every is not None and self._since >= self.checkpoint_every) or \
                (self.checkpoint_seconds is not None and age >= self.checkpoint_seconds):
            recovery_checkpoint = self._checkpoint_now()
        self.recovery_seconds = time.perf_counter() - t0
        self.opened = True
        self.recovery = {"checkpoint_step": None if self.last_checkpoint is None else start,
                         "replayed_steps": self.step_no - start, "replayed_pieces": pieces,
                         "step": self.step_no, "seconds": self.recovery_seconds,
                         "checkpoint_age": age,
                         "checkpointed": None if recovery_checkpoint is None
                         else recovery_checkpoint.step}
        if self.on_open is not None:
            self.on_open(self.recovery)
        return self

    def _taken(self, now: float) -> float:
        """The wall time the cadence counts from at open: when the last committed checkpoint was
        taken; without one, when the first logged step was written (the job has run since,
        maybe over several deaths); with neither, ``now``."""
        if self.last_checkpoint is not None:
            return float(self.last_checkpoint.time)
        log = self.input_log
        if log.end > log.first:
            try:
                return os.stat(log.path(log.first)).st_mtime
            except OSError:
                pass
        return now

    # -- stepping ----------------------------------------------------------------------------
    def recorded_position(self, name: str) -> Optional[int]:
        """The last producer position recorded for input ``name`` (see :mod:`.logs`)."""
        return self.input_log.position(name)

    def step(self, positions: Optional[dict] = None, meta: Optional[dict] = None,
             spans: Optional[dict[str, tuple[int, int]]] = None,
             slices: Optional[dict[str, int]] = None) -> int:
        """Log this step's pending input (with ``positions``), run it, log its output.
        ``spans``: ``{input: (start, end)}`` for inputs whose pending rows are exactly their
        re-readable source's positions ``[start, end)`` (see :meth:`rereadable`). ``slices``:
        ``{input: k}``, the input also gets step ``k`` of its sliced source (see
        :meth:`sliced`). Returns the step number run. A worker process that dies meanwhile is
        replaced (see the module doc)."""
        if spans:
            unknown = [n for n in spans if n not in self.sources]
            if unknown:
                raise ValueError(f"step(spans=...): input {unknown[0]!r} has no re-readable "
                                 f"source (rereadable(name, source) first)")
        if slices:
            unknown = [n for n in slices if n not in self.sliced_sources]
            if unknown:
                raise ValueError(f"step(slices=...): input {unknown[0]!r} has no sliced source "
                                 f"(sliced(name, source) first)")
        deaths = 0
        while not self.opened:  # pending input waits for the recovery's replay
            pending = {n: inp.take_pending() for n, inp in self.circuit.inputs.items()}
            try:
                self.open()
            except WorkerDied as e:
                deaths += 1
                if deaths > self.max_restarts:
                    raise
                self._restart(e)
            finally:
                for n, p in pending.items():
                    if p is not None:
                        self.circuit.inputs[n].put_pending(*p)
        s = self.step_no
        while True:
            try:
                if not self.opened:
                    self.open()
                if self.step_no > s:  # the step was logged, and replayed by the recovery
                    return s
                if self._retry is not None:  # a step a death cut short before it was logged
                    pending, self._retry = self._retry, None
                    for n, p in pending.items():
                        if p is not None:
                            self.circuit.inputs[n].put_pending(*p)
                if slices:
                    self._read_slices(slices)
                return self._step(positions, meta, spans)
            except WorkerDied as e:
                deaths += 1
                if deaths > self.max_restarts:
                    raise
                if self.input_log.end <= s and self._retry is None:
                    # the death surfaced before the step's input was logged (e.g. from the
                    # background checkpoint of the step before): its pending rows are the only
                    # copy, and the restart drops pending input, so keep them for the re-run
                    self._retry = {n: inp.take_pending() for n, inp in self.circuit.inputs.items()}
                self._restart(e)

    def _restart(self, e: BaseException) -> None:
        """Replace the workers after one died: wait for the logged input to be durable, rebuild
        the workers; the next :meth:`open` restores the last checkpoint and replays the log."""
        self.restarts += 1
        log.warning("a worker process died at step %d (%s); restarting the workers from the "
                    "last checkpoint and replaying the input log (restart %d)",
                    self.step_no, e, self.restarts)
        t, self._writer = self._writer, None
        if t is not None:
            t.join()
        self._writer_error = None
        self.input_log.wait()  # raises if the input is not durable: then nothing to replay
        self.circuit.restart()
        self.opened = False

    def _step(self, positions: Optional[dict], meta: Optional[dict],
              spans: Optional[dict] = None) -> int:
        self.open()
        self._raise_writer_error()
        if self.failed is not None:
            raise RecoveryError(f"the input log of step {self.step_no - 1} could not be made "
                                f"durable ({self.failed}); restart to recover from the last "
                                f"checkpoint") from self.failed
        c = self.circuit
        parts = {name: inp.take_pending() for name, inp in c.inputs.items()}
        s = self.step_no
        if c.slices_pending:
            return self._step_sliced(s, parts, positions, meta, spans)
        try:
            if self.fence is not None:
                self.fence("input log")
            self.input_log.append(s, parts, positions or {}, meta, wait=False, spans=spans)
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
        try:
            self.input_log.wait(s)  # no output of the step before its input is durable
        except BaseException as e:
            self.failed = e  # the state holds a step whose input is not durable
            raise
        return self._finish_step(s)

    def _step_sliced(self, s: int, parts: dict, positions: Optional[dict],
                     meta: Optional[dict], spans: Optional[dict]) -> int:
        """A step whose workers read slices: run it, then log it (with what the workers
        read), and only then release its output."""
        c = self.circuit
        if self.fence is not None:
            self.fence("input log")
        for name, p in parts.items():
            if p is not None:
                c.inputs[name].put_pending(*p)
        try:
            c.step()
        except WorkerDied:
            self._retry = parts  # nothing logged: the step runs again after the recovery
            raise
        try:
            if self.fence is not None:
                self.fence("input log")
            self.input_log.append(s, parts, positions or {}, meta, wait=True, spans=spans,
                                  slices=c.last_slices)
        except BaseException as e:
            self.failed = e  # the state holds a step whose input is not durable
            raise
        return self._finish_step(s)

    def _finish_step(self, s: int) -> int:
        """After step ``s`` ran and its input is durable: release its output, count it, and
        take the checkpoint that is due."""
        self._write_outputs(s)
        self._since += 1
        due = self._due()
        if due:
            self.checkpointing = True  # before the step count says a step past the last one
        self.step_no = s + 1
        if due:
            self.checkpoint(wait=not self.background)
        return s

    def _write_outputs(self, step: int) -> None:
        outs = {}
        # a replayed step the output log holds already is discarded there: not converted
        discard = step < self.output_log.end and not self.output_log.check
        for h in self.circuit.outputs:
            d = h.delta()
            if len(d) and not discard:
                outs[h.name] = d.to_arrow()
        if self.fence is not None and step >= self.output_log.end:  # an append
            self.fence("output log")
        self.output_log.write(step, outs)

    def _due(self) -> bool:
        if self.checkpoint_every is not None and self._since >= self.checkpoint_every:
            return True
        if self.checkpoint_seconds is None or \
                self.clock() - self._t_last < self.checkpoint_seconds:
            return False
        # a periodic checkpoint while the last one is still being written waits for it to
        # finish rather than making the step wait
        w = self._writer
        return w is None or not w.is_alive()

    # -- checkpoints -------------------------------------------------------------------------
    def checkpoint(self, wait: bool = True) -> Any:
        """Checkpoint at this step boundary. ``wait=False``: return once the state is captured
        (the pause), write it on a background thread (a previous one is waited for first).
        Returns the published checkpoint (``wait``) or None."""
        try:
            self.open()
            self.wait_checkpoint()
        except BaseException:
            self.checkpointing = False  # (set by _finish_step when this checkpoint came due)
            raise
        if wait:
            return self._checkpoint_now()
        pc = self._begin()
        self._writer = threading.Thread(target=self._write_bg, args=(pc,),
                                        name="dbsp-checkpoint", daemon=True)
        self._writer.start()
        return None

    def _begin(self) -> Any:
        """Capture the state at this step boundary (the pause); the cadence restarts here.
        :attr:`checkpointing` from here until :meth:`_publish` ends (or this fails)."""
        self.checkpointing = True
        t0 = time.perf_counter()
        now = self.clock()
        try:
            pc = self.store.begin(self.circuit, self.step_no, at=now)
        except BaseException:
            self.checkpointing = False
            raise
        self.pauses.append(time.perf_counter() - t0)
        self._since = 0
        self._t_last = now
        return pc

    def _checkpoint_now(self) -> Any:
        """Capture and publish a checkpoint at this step boundary (no writer running)."""
        return self._publish(self._begin())

    def _write_bg(self, pc: Any) -> None:
        name_os_thread()
        try:
            self._publish(pc)
        except BaseException as e:  # raised by the next step / checkpoint
            self._writer_error = e

    def _publish(self, pc: Any) -> Any:
        try:
            try:
                self.output_log.sync(pc.step)  # replay starts at the checkpoint: output
            except BaseException:              # before it must be durable before it is published
                pc.abort()
                raise
            info = pc.finish()
            self.last_checkpoint = info
        finally:
            self.checkpointing = False
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
        if e is None:
            return
        died = e.__cause__ if not isinstance(e, WorkerDied) else e
        if isinstance(died, WorkerDied):
            # a replica died while the checkpoint was written: the previous checkpoint stands,
            # and the death is handled as any other (a new generation recovers from it)
            log.warning("%s", e)
            raise died
        raise e

    def close(self) -> None:
        """Graceful shutdown: wait for a checkpoint being written, take a last one (nothing to
        replay on restart), close the circuit."""
        try:
            if self.opened and self.circuit.failed is None:
                try:
                    self.wait_checkpoint()
                    if self.checkpoint_on_close and (self.last_checkpoint is None or
                                                     self.last_checkpoint.step != self.step_no):
                        self.checkpoint(wait=True)
                except WorkerDied as e:
                    # the logs hold every step: the next open replays from the last
                    # checkpoint, so a replica lost after the last step loses nothing
                    log.warning("no checkpoint on close at step %d: %s; the next open replays "
                                "the logged steps after the last checkpoint (%s)",
                                self.step_no, e, None if self.last_checkpoint is None
                                else self.last_checkpoint.step)
        finally:
            self.input_log.close()
            store = self.store
            self.circuit.close(before_unlock=store.close if store is not None else None)

    def report(self) -> dict:
        cp = self.last_checkpoint
        return {"step": self.step_no,
                "last_checkpoint": None if cp is None else
                {"name": cp.name, "step": cp.step, "bytes": cp.bytes, "time": cp.time},
                "checkpoints": 0 if self.store is None else len(self.store.checkpoints),
                "replayed_steps": self.replayed,
                "worker_restarts": self.restarts,
                "recovery_seconds": self.recovery_seconds,
                "recovery": self.recovery,
                "input_log": {"first": self.input_log.first, "end": self.input_log.end},
                "output_log": {"first": self.output_log.first, "end": self.output_log.end,
                               "discarded": self.output_log.discarded},
                "max_pause_seconds": max(self.pauses) if self.pauses else 0.0,
                "layout_change": self.layout_change}

