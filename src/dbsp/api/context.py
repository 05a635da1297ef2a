"""StreamContext: the entry point of the fluent API (the design note's ``StreamEnvironment``).

A context owns a :class:`~dbsp.runtime.circuit.Circuit` and its configuration - workers, runtime
(threads or processes), the storage directory (kept for the storage layer), the default input
batching - and the sources and sinks of the pipeline. Build the pipeline from
:meth:`StreamContext.stream`; run it with :meth:`step` (one step) or :meth:`execute` (until every
replayed source is drained).

>>> import pyarrow as pa
>>> from dbsp.api import StreamContext, col, sum_
>>> ctx = StreamContext()
>>> bids = ctx.stream(pa.table({"auction": [1, 1, 2], "price": [10, 20, 5]}), name="bids")
>>> out = (bids.filter(col("price") > 6)
...            .group_by("auction").agg(total=sum_(col("price") * 2))
...            .collect())
>>> ctx.execute().steps
1
>>> out.rows()
[(1, 60)]

A step feeds every replayed source's next chunk (and what was pushed into push sources), runs the
circuit once - every output then holds the change this step caused - reads the per-input
statistics (late rows, watermarks) and calls the ``for_each`` sinks.

Bad data follows the error policy (``errors=``, per pipeline, and per input in :meth:`stream`;
see :mod:`dbsp.circuit.errors`): ``"raise"`` (default) refuses a bad push, or rolls a failing
step back (no state changes; the circuit keeps working) and raises an error naming the input or
the operator, the expression and the row; ``"skip_and_report"`` puts every bad row, with its
reason, source and step, in :attr:`StreamContext.errors` (counted in :meth:`report`) and
carries on with the good ones. The log keeps the newest ``error_cap`` records (100 000 by
default; the dropped ones are counted in :meth:`report`); :meth:`StreamContext.error_stream` is
the same records as a stream of the circuit, to sink like any output.

>>> ctx = StreamContext(errors="skip_and_report")
>>> s = ctx.stream({"k": pa.int64(), "v": pa.int64()})
>>> out = s.select("k", q=col("v") * 2**62).collect()
>>> s.insert([(1, 1), (2, "x"), (3, 5)])
2
>>> _ = ctx.step(); out.rows()
[(1, 4611686018427387904)]
>>> [(e["source"], e["row"]) for e in ctx.errors.records]
[('input0', (2, 'x')), ('map', {'k': 3, 'v': 5})]

``close()`` is final and idempotent, and ``with StreamContext() as ctx:`` closes on exit; after
it every push, step or new stream raises :class:`~dbsp.circuit.graph.ClosedError`.

Fault tolerance
---------------
With ``storage=`` and ``checkpoint_every=`` (steps) or ``checkpoint_seconds=``, or
``durable=True``, the pipeline is exactly-once (:mod:`dbsp.ft`): every step's input is logged
durably before the step runs, every output delta goes to the output log
(``<storage>/ft/output``) under its step number, and checkpoints (:mod:`dbsp.checkpoint`) are
taken periodically and by :meth:`StreamContext.checkpoint`. A context opened on a directory
that holds checkpoints *resumes*: at the first step it restores the latest checkpoint (or
``resume_from=``) and replays the logged input after it; replayed sources skip the rows already
fed, and a push with a ``position=`` the input log already recorded is ignored as a duplicate.
:meth:`StreamContext.report` shows the last checkpoint, its step and size.

Rows of a *re-readable* source are logged by position, not copied into the log: a replayed
table (by row offset), or a pushed stream made with ``ctx.stream(schema, reread=fn)`` whose
pushes say which positions they carry (``push(rows, span=(start, end))``; ``fn(start, end)``
gives those rows again, e.g. a deterministic generator by event number). Recovery re-reads the
logged ranges and checks them (row count and content checksum, :mod:`dbsp.ft.logs`). A step
whose rows of an input are not exactly the spans pushed (rows pushed without a span beside them,
spans that are not contiguous) logs that input's rows as data.
"""
from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any, Optional

import pyarrow as pa
import pyarrow.compute as pc

from ..algebra.schema import as_schema
from ..algebra.time import from_physical
from ..checkpoint import CheckpointStore
from ..ft import DurableCircuit
from ..circuit.errors import (DEFAULT_ERROR_CAP, ERROR_STREAM_SCHEMA, ErrorLog, check_policy,
                              row_json)
from ..circuit.graph import ClosedError
from ..operators.watermark import watermark
from ..runtime.circuit import Circuit
from .sink import ForEach
from .source import DEFAULT_BATCHING, AdaptiveBatching, FixedBatching, PushSource, SlicedFeed, \
    Source, as_rereadable, is_sliced_source, make_source
from .stream import DataStream, TimeInfo


class SourceStream(DataStream):
    """A stream made by :meth:`StreamContext.stream`; also the handle to push rows into it."""

    def __init__(self, ctx, core, time, name, source: Source, input_stream):
        super().__init__(ctx, core, time, name)
        self.source = source
        self.input = input_stream

    def push(self, data: Any, weights: Any = None, position: Optional[int] = None,
             span: Optional[tuple[int, int]] = None) -> int:
        """Add rows (weights default to 1) for the next step; see
        :meth:`dbsp.operators.input.InputStream.push`. ``position``: the producer's position
        after these rows (a sequence number, an offset); in a durable pipeline it is recorded
        with the step, and a push at a position already recorded is a duplicate delivery,
        ignored (returns 0). ``span``: ``(start, end)``, these rows are the stream's re-readable
        source's positions ``[start, end)`` (a stream made with ``reread=``; see the module
        doc): a durable pipeline logs the positions instead of the rows."""
        if position is not None:
            rec = self.ctx.recorded_position(self.name)
            pend = self.ctx._positions.get(self.name)
            if (rec is not None and position <= rec) or (pend is not None and position <= pend):
                return 0
        if span is not None and getattr(self.source, "reread_fn", None) is None:
            raise ValueError(f"stream '{self.name}': push(span=...) needs a stream made with "
                             f"reread= (a source that can read its rows again)")
        n = self._counted(self.input.push(data, weights))
        if position is not None:
            self.ctx._positions[self.name] = int(position)
        self.ctx._note_span(self.name, span)
        return n

    def insert(self, data: Any) -> int:
        self.ctx._note_span(self.name, None)
        return self._counted(self.input.insert(data))

    def delete(self, data: Any) -> int:
        """Retract rows inserted before (weight -1)."""
        self.ctx._note_span(self.name, None)
        return self._counted(self.input.delete(data))

    def upsert(self, data: Any) -> int:
        """Insert rows, replacing the current rows with the same key (the stream must have been
        made with ``key=``; see :mod:`dbsp.operators.upsert`)."""
        self.ctx._note_span(self.name, None)
        return self._counted(self.input.upsert(data))

    def _counted(self, n: int) -> int:
        self.source.rows_in += n
        return n

    @property
    def late_rows(self) -> int:
        """Rows dropped so far because they arrived behind the watermark."""
        return self.ctx.late_rows.get(self.name, 0)

    @property
    def watermark(self) -> Any:
        """The current watermark (a value of the time column's type), or None."""
        return self.ctx.watermarks.get(self.name)

    def late(self) -> DataStream:
        """The rows dropped as late, as a stream (a dead-letter queue to collect if wanted)."""
        w = self.ctx._wm.get(self.name)
        if w is None:
            raise ValueError(f"stream '{self.name}' has no event time (give time= and lateness=)")
        return DataStream(self.ctx, w.late)


class StreamContext:
    """Builds and runs a pipeline (see the module doc).

    ``workers``: replicas stepping in lockstep (keys are sharded among them). ``runtime``:
    ``"threads"`` or ``"processes"``. ``storage``: a directory (created if missing) or a
    :class:`~dbsp.storage.config.StorageConfig`: state beyond the memory budget goes to layer
    files there (``None`` keeps everything in memory).
    ``batching``: the default :class:`FixedBatching` / :class:`AdaptiveBatching` of replayed
    sources. ``errors``: the error policy, ``"raise"`` or ``"skip_and_report"`` (module doc).
    ``circuit``: add the streams to this :class:`~dbsp.runtime.circuit.Circuit` instead of a
    new one, e.g. in a launcher or Spark pipeline function ``build(circuit)``, whose replicas
    run elsewhere (push and step through whoever runs it; no storage here).
    ``error_cap``: records the error log (:attr:`errors`) keeps, the newest (``None``: all).
    """

    def __init__(self, workers: int = 1, *, storage: Any = None,
                 batching: Any = None, runtime: str = "threads", name: str = "pipeline",
                 checkpoint_every: Optional[int] = None,
                 checkpoint_seconds: Optional[float] = None, durable: Optional[bool] = None,
                 keep_checkpoints: int = 2, resume_from: Any = None,
                 check_output: bool = False, errors: str = "raise",
                 circuit: Optional[Circuit] = None,
                 error_cap: Optional[int] = DEFAULT_ERROR_CAP):
        if circuit is not None:  # streams added to a circuit built elsewhere (its own runtime)
            if storage is not None or durable or checkpoint_every or checkpoint_seconds:
                raise ValueError("StreamContext(circuit=...): storage and checkpoints belong to "
                                 "whoever runs that circuit (e.g. dbsp.ft.remote), not here")
            workers = circuit.workers
        if durable is None:
            durable = checkpoint_every is not None or checkpoint_seconds is not None
        if durable and storage is None:
            raise ValueError("checkpoints need storage=: a directory (or StorageConfig) for the "
                             "checkpoints and the input and output logs")
        self.circuit = circuit if circuit is not None else \
            Circuit(workers=workers, name=name, runtime=runtime, storage=storage,
                    errors=check_policy(errors), error_cap=error_cap)
        self._err_input: Any = None          # the error stream's input (error_stream)
        self._err_stream: Optional[DataStream] = None
        self._err_pos = 0                    # error log records fed to it so far
        self.error_stream_missed = 0         # records the cap dropped before they were fed
        self.workers = workers
        self.storage_config = self.circuit.storage
        self.storage = self.storage_config.dir if self.storage_config is not None else None
        self.batching = _check_batching(batching) if batching is not None else DEFAULT_BATCHING
        self.sources: dict[str, Source] = {}
        self._streams: dict[str, SourceStream] = {}
        self._sinks: list[ForEach] = []
        self._wm: dict[str, Any] = {}        # name -> Watermarked
        self._stats: dict[str, Any] = {}     # name -> stats output handle
        self.late_rows: dict[str, int] = {}  # name -> rows dropped as late
        self._wm_raw: dict[str, Optional[int]] = {}
        self.steps = 0
        self.seconds = 0.0
        self._positions: dict[str, int] = {}
        # this step's spans of re-readable rows per input (None: rows that are not a span)
        self._spans: dict[str, Optional[tuple[int, int]]] = {}
        self.resume_from = resume_from
        self.durable: Optional[DurableCircuit] = None
        self.circuit.add_state_hook("context", self._get_state, self._set_state)
        if durable:
            root = self.storage_config.dir
            self.durable = DurableCircuit(
                self.circuit,
                lambda c: CheckpointStore(root, c.fingerprint(), keep=keep_checkpoints),
                os.path.join(root, "ft"), checkpoint_every=checkpoint_every,
                checkpoint_seconds=checkpoint_seconds, check_output=check_output)

    def __repr__(self) -> str:
        return (f"<StreamContext {self.circuit.name!r} workers={self.workers} "
                f"sources={list(self.sources)} steps={self.steps}>")

    # -- building -------------------------------------------------------------------------
    def stream(self, source: Any = None, name: Optional[str] = None, *, schema: Any = None,
               time: Optional[str] = None, lateness: Any = None, batching: Any = None,
               key: Any = None, errors: Optional[str] = None,
               reread: Any = None, sliced: bool = False) -> SourceStream:
        """A new input stream.

        ``source``: a schema (a ``pa.Schema``, dict or list of ``(name, type)``: push rows through
        the returned stream), or data replayed in steps - a pyarrow Table / RecordBatch, a list or
        iterator of RecordBatches, a pandas DataFrame. ``time`` names the event-time column and
        ``lateness`` how late a row may be (a ``timedelta`` for timestamps, an int for integer
        times; default 0): rows behind the watermark are dropped and counted
        (:attr:`late_rows`). ``batching`` overrides the context's batching for this source.
        ``key`` (columns) makes the input remember its rows by key, for
        :meth:`SourceStream.upsert`. ``errors`` overrides the pipeline's error policy for the
        rows of this input, at push time and at run time in every operator they reach (where
        they meet rows of an input with another policy, e.g. in a join, the stricter one holds:
        ``raise``; :mod:`dbsp.circuit.errors`).
        ``reread``: for a pushed stream, a function ``(start, end) -> rows`` (or an object with
        such a ``reread`` method) giving again the rows pushed with ``span=(start, end)``; a
        durable pipeline then logs positions instead of those rows (see the module doc).

        A *sliced* source (:class:`~dbsp.runtime.slices.SlicedSource`, e.g.
        :class:`dbsp.connectors.slices.FileSlices` over Parquet or Arrow IPC files) is read by
        pieces: each step takes the source's next step, its pieces (row groups, record batches)
        dealt to the workers (worker ``w`` of ``W`` pieces ``w, w + W, ...``), the input left
        out of the driver's key placement (:mod:`dbsp.runtime.slices`; this embedded context's
        process reads every worker's pieces, remote workers read their own). Its schema is the
        source's ``schema`` (or ``schema=``). A durable pipeline logs each step's pieces with
        the rows and checksum read, and recovery reads them again. ``sliced=True`` with a
        schema declares such an input without its source, in a pipeline function run on
        remote workers (``StreamContext(circuit=c)`` in ``build(c)`` for the launcher or
        Spark): the job then feeds it (``job.read_slices(name, source, k)``) and every worker
        reads its own pieces where it runs, no row passing through the driver.
        """
        self.circuit.check_open("add a stream to")
        if self.circuit.running:
            raise RuntimeError("the pipeline is running; streams cannot be added now")
        name = name or f"input{len(self.sources)}"
        if name in self.sources:
            raise ValueError(f"a stream named {name!r} exists already")
        bt = _check_batching(batching) if batching is not None else self.batching
        if is_sliced_source(source):
            sch = schema if schema is not None else getattr(source, "schema", None)
            if sch is None:
                raise TypeError(f"ctx.stream({name!r}): a sliced source without a schema "
                                f"attribute needs schema=")
            src: Source = SlicedFeed(name, as_schema(sch), source)
        else:
            src = make_source(name, source, schema, bt)
        if reread is not None:
            if not isinstance(src, PushSource):
                raise TypeError(f"ctx.stream({name!r}): reread= is for a pushed stream (a "
                                f"schema as the source); a replayed table is re-readable as it is")
            src.reread_fn = as_rereadable(reread)  # type: ignore[attr-defined]
        keys = None if key is None else ([key] if isinstance(key, str) else list(key))
        inp = self.circuit.add_input(name, src.schema, key=keys) if keys is not None else \
            self.circuit.add_input(name, src.schema)
        src.input = inp
        inp.set_errors(errors)
        if sliced and not isinstance(src, SlicedFeed):
            if not isinstance(src, PushSource):
                raise TypeError(f"ctx.stream({name!r}, sliced=True): give a schema (the job "
                                f"feeds the pieces) or a sliced source, not data")
            self.circuit.slice_inputs(name)
        if isinstance(src, SlicedFeed):  # read by the workers: out of the driver's placement
            if self.durable is not None:
                self.durable.sliced(name, source)
            else:
                self.circuit.slice_inputs(name)
        if self.durable is not None:
            rr = getattr(src, "reread_fn", None) or \
                (src if getattr(src, "rereadable", False) else None)
            if rr is not None:
                self.durable.rereadable(name, rr)
        self.sources[name] = src
        if lateness is not None and time is None:
            raise TypeError("lateness= needs time= (the event-time column)")
        core, tinfo = inp, None
        if time is not None:
            if lateness is None:  # no lateness: zero in the column's own units
                t = src.schema.field(time).type if time in src.schema.names else None
                lateness = timedelta(0) if t is not None and not pa.types.is_integer(t) else 0
            w = self._add_watermark(inp, time, lateness, name)
            core, tinfo = w.data, TimeInfo(time, w.watermark, name)
        s = SourceStream(self, core, tinfo, name, src, inp)
        self._streams[name] = s
        return s

    def _add_watermark(self, core, time: str, lateness: Any, name: str):
        w = watermark(core, time, lateness)
        self._wm[name] = w
        self._stats[name] = w.stats.output(name=f"__stats:{name}", view=False)
        self.late_rows[name] = 0
        self._wm_raw[name] = None
        return w

    def _watermark(self, stream: DataStream, time: str, lateness: Any, name: str) -> DataStream:
        if name in self._wm or name in self.sources:
            raise ValueError(f"a stream named {name!r} has a watermark already; pass name=")
        w = self._add_watermark(stream._s, time, lateness, name)
        return DataStream(self, w.data, TimeInfo(time, w.watermark, name), name)

    # -- running --------------------------------------------------------------------------
    @property
    def drained(self) -> bool:
        """Whether every replayed source has fed all its rows."""
        return all(s.exhausted for s in self.sources.values())

    @property
    def errors(self) -> ErrorLog:
        """Every row set aside under ``skip_and_report`` (inputs and operators), in order (the
        newest ``error_cap`` of them; see :class:`~dbsp.circuit.errors.ErrorLog`)."""
        return self.circuit.error_log

    def error_stream(self, name: str = "errors") -> DataStream:
        """The bad rows as a stream of the circuit: one row per record of :attr:`errors`, with
        the columns of :data:`~dbsp.circuit.errors.ERROR_STREAM_SCHEMA` (``step``, ``source``:
        the input or operator, ``reason``, ``expression``, ``row``: the bad row as JSON text,
        ``weight``: its weight). Filter it, aggregate it, ``collect()`` it or sink it
        (``for_each``, files) like any stream.

        The stream is an input of the circuit fed by the context: the rows an input refused at
        push time enter with the step they were pushed for; the rows an operator set aside at
        run time are known once that step has finished on every worker, so they enter with the
        *next* step (every record enters exactly once, in order). Records the log's cap dropped
        before they could be fed are counted in ``report()["errors"]["stream_missed"]``. Call it
        before the first step (it adds an input). Not with ``durable=True`` yet (the replayed
        input log would hold the error rows besides the rows that cause them again)."""
        if self._err_stream is not None:
            return self._err_stream
        self.circuit.check_open("add the error stream to")
        if self.circuit.running:
            raise RuntimeError("the pipeline is running; error_stream() must be called before "
                               "the first step")
        if self.durable is not None:
            raise ValueError("error_stream() is not supported with durable=True / checkpoints "
                             "yet: read ctx.errors instead")
        self._err_input = self.circuit.add_input("__errors__", ERROR_STREAM_SCHEMA)
        self._err_pos = len(self.errors)
        self._err_stream = DataStream(self, self._err_input, None, name)
        return self._err_stream

    def _feed_errors(self) -> None:
        """Push the error log's records not yet in the error stream into its input."""
        log = self.errors
        recs = log.since(self._err_pos)
        self.error_stream_missed += log.missed(self._err_pos)
        self._err_pos = len(log)
        if not recs:
            return
        cols = [pa.array([r["step"] for r in recs], pa.int64()),
                pa.array([r["source"] for r in recs], pa.string()),
                pa.array([r["reason"] for r in recs], pa.string()),
                pa.array([r["expression"] for r in recs], pa.string()),
                pa.array([row_json(r["row"]) for r in recs], pa.string()),
                pa.array([r["weight"] for r in recs], pa.int64())]
        self._err_input.insert(pa.RecordBatch.from_arrays(cols, schema=ERROR_STREAM_SCHEMA))

    @property
    def closed(self) -> bool:
        return self.circuit.closed

    def open(self) -> "StreamContext":
        """Build the pipeline now; in a durable pipeline, restore the last checkpoint (or
        ``resume_from``) and replay the logged input after it (else the first step does)."""
        d = self.durable
        if d is None:
            self.circuit.start()
            return self
        if d.opened:
            return self
        extra = {}
        d.on_replay = lambda s, parts: self._after_step(sinks=False)
        pending = {n: inp.take_pending() for n, inp in self.circuit.inputs.items()}
        d.open(self.resume_from)
        for n, p in pending.items():  # pushed before the pipeline opened: after the replay
            if p is not None:
                self.circuit.inputs[n].put_pending(*p)
        self.steps = d.step_no
        # replayed sources continue after the rows the input log recorded as fed
        last = d.input_log.end - 1
        if last >= d.input_log.first:
            _, positions, meta = d.input_log.read(last)
            extra = meta.get("sources", {})
        for name, s in self.sources.items():
            if name in extra and hasattr(s, "skip_to"):
                s.skip_to(int(extra[name]))
        return self

    def _get_state(self) -> dict:
        return {"late_rows": dict(self.late_rows), "wm_raw": dict(self._wm_raw),
                "rows_in": {n: s.rows_in for n, s in self.sources.items()}}

    def _set_state(self, st: dict) -> None:
        self.late_rows.update(st["late_rows"])
        self._wm_raw.update(st["wm_raw"])
        for n, r in st["rows_in"].items():
            if n in self.sources:
                self.sources[n].rows_in = r

    def recorded_position(self, name: str) -> Optional[int]:
        """The last producer position the input log recorded for stream ``name`` (None: none;
        always None in a pipeline that is not durable)."""
        if self.durable is None:
            return None
        self.open()
        return self.durable.recorded_position(name)

    def checkpoint(self, wait: bool = True) -> Any:
        """Take a checkpoint now (see the module doc); returns its
        :class:`~dbsp.checkpoint.CheckpointInfo` (None with ``wait=False``: written in the
        background)."""
        if self.durable is None:
            raise RuntimeError("this pipeline is not durable: give StreamContext(storage=..., "
                               "checkpoint_every=... or durable=True)")
        self.open()
        return self.durable.checkpoint(wait=wait)

    def step(self) -> bool:
        """Run one step. Returns whether some replayed source still has rows.

        Atomic: when it raises (policy ``raise``), no state changed and the next step works."""
        self.circuit.check_open("step")
        t0 = time.perf_counter()
        if self.durable is not None:
            self.open()
        for s in self.sources.values():
            s.feed()
        slices = {}
        for n, s in self.sources.items():  # sliced sources: the step of theirs each took
            if isinstance(s, SlicedFeed) and s.taken is not None:
                slices[n] = s.taken
        try:
            self._step_fed(slices)
        except BaseException:
            for n in slices:  # not run: the next step takes the same pieces
                self.sources[n].untake()  # type: ignore[attr-defined]
            raise
        for n in slices:
            s = self.sources[n]
            s.taken = None  # type: ignore[attr-defined]
            last = self.circuit.last_slices.get(n)
            if last is not None:
                s.rows_in += sum(int(r[0]) for r in last["report"])
        self._after_step()
        self.seconds += time.perf_counter() - t0
        return not self.drained

    def _step_fed(self, slices: dict[str, int]) -> None:
        """The step proper, once the sources fed it (``slices``: ``{input: step of its sliced
        source}``)."""
        err_pos, err_missed = self._err_pos, self.error_stream_missed
        if self._err_input is not None:
            self._feed_errors()
        if self.durable is not None:
            meta = {"sources": {n: s.position for n, s in self.sources.items()
                                if hasattr(s, "position")}}
            positions, self._positions = self._positions, {}
            for n, s in self.sources.items():
                if s.span is not None:
                    self._note_span(n, s.span)
                    s.span = None
            noted, self._spans = self._spans, {}
            spans = {n: sp for n, sp in noted.items()
                     if sp is not None and n in self.durable.sources}
            try:
                self.durable.step(positions, meta, spans, slices=slices or None)
            except BaseException:
                self._spans = noted  # the rows stay pending for the next step, and so do these
                raise
            # (a worker process that died was replaced and the log replayed: the replay
            # counted its steps again)
            self.steps = self.durable.step_no - 1
        else:
            try:
                for n, k in slices.items():
                    self.circuit.read_slices(n, self.sources[n].source, k)  # type: ignore
                self.circuit.step()
            except BaseException:
                # the step's input was not applied: feed its error records again next time
                self._err_pos, self.error_stream_missed = err_pos, err_missed
                raise

    def _note_span(self, name: str, span: Optional[tuple[int, int]]) -> None:
        """Rows of this step for input ``name``: the positions ``span`` of its re-readable
        source, or (None) rows that are not; a step's spans of one input must join up."""
        if name in self._spans:
            old = self._spans[name]
            span = (old[0], span[1]) if old is not None and span is not None and \
                span[0] == old[1] else None
        elif span is not None and span[0] > span[1]:
            raise ValueError(f"stream '{name}': span {span} ends before it starts")
        self._spans[name] = span

    def _after_step(self, sinks: bool = True) -> None:
        self.steps += 1
        for name, h in self._stats.items():
            z = h.delta_loose()
            if len(z):
                late = z.data.column(0).to_numpy(zero_copy_only=False)
                wms = z.data.column(1)
                self.late_rows[name] += int((late * z.weights).sum())
                if wms.null_count < len(wms):
                    self._wm_raw[name] = pc.max(wms).as_py()
        if sinks:
            for sink in self._sinks:
                sink.fire()

    def execute(self, max_steps: Optional[int] = None) -> "StreamContext":
        """Step until every replayed source is drained (at least once when something was
        pushed, or when there are no replayed sources). Returns the context."""
        self.circuit.check_open("execute")
        n = 0
        pending = any(getattr(s.input, "pending_rows", 0) for s in self.sources.values())
        if self.drained and not pending and any(s.finite for s in self.sources.values()):
            return self
        while True:
            more = self.step()
            n += 1
            if not more or (max_steps is not None and n >= max_steps):
                return self

    # -- reports --------------------------------------------------------------------------
    @property
    def watermarks(self) -> dict[str, Any]:
        """The current watermark of every stream with an event time, as a value of its time
        column's type (None before any row)."""
        out = {}
        for name, raw in self._wm_raw.items():
            w = self._wm[name]
            out[name] = None if raw is None else \
                from_physical(pa.array([raw], pa.int64()), w.time_type)[0].as_py()
        return out

    def state_rows(self) -> int:
        """Rows of operator state over all workers (traces of joins, aggregates, windows...)."""
        return self.circuit.state_rows()

    def memory(self) -> list[dict]:
        """Bytes of state per operator (and per output view), summed over workers, beside the
        raw Arrow size of the rows held: :meth:`dbsp.runtime.circuit.Circuit.memory`."""
        return self.circuit.memory()

    def report(self) -> dict:
        """Steps, time, and per input: rows in, late rows dropped, watermark; state rows and
        ``memory``: bytes of state per operator beside the Arrow size of its rows."""
        wms = self.watermarks
        inputs = {}
        for name, s in self.sources.items():
            inputs[name] = {"rows": s.rows_in, "late_rows": self.late_rows.get(name, 0),
                            "watermark": wms.get(name)}
        for name in self._wm:
            if name not in inputs:
                inputs[name] = {"late_rows": self.late_rows[name], "watermark": wms.get(name)}
        counts = self.errors.counts
        for name in inputs:
            inputs[name]["bad_rows"] = counts.get(name, 0)
        out = {"steps": self.steps, "seconds": self.seconds, "workers": self.workers,
               "inputs": inputs, "state_rows": self.state_rows() if not self.closed else 0,
               "memory": self.memory() if not self.closed else [],
               "errors": {"policy": self.circuit.errors, "rows": len(self.errors),
                          "by_source": dict(counts), "kept": len(self.errors.records),
                          "dropped": self.errors.dropped,
                          "stream_missed": self.error_stream_missed}}
        if self.durable is not None:
            out["fault_tolerance"] = self.durable.report()
            out["last_checkpoint"] = out["fault_tolerance"]["last_checkpoint"]
        return out

    def close(self) -> None:
        """Stop the pipeline: final and idempotent (every later push or step raises
        :class:`~dbsp.circuit.graph.ClosedError`); a durable one first takes a last checkpoint
        (a restart then has nothing to replay)."""
        if self.circuit.closed:
            return
        for s in self.sources.values():
            s.close()
        if self.durable is not None:
            self.durable.close()
        else:
            self.circuit.close()

    def __enter__(self) -> "StreamContext":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_batching(b: Any):
    if isinstance(b, (FixedBatching, AdaptiveBatching)):
        return b
    if isinstance(b, int):
        return FixedBatching(b)
    raise TypeError(f"batching must be FixedBatching(rows), AdaptiveBatching(max_rows, "
                    f"max_delay) or an int (rows per step), got {b!r}")


__all__ = ["StreamContext", "SourceStream", "PushSource", "ClosedError"]
