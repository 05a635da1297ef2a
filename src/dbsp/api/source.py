"""Sources of the fluent API and the input batching modes (how many rows go into one step).

A source is either *pushed* (``ctx.stream(schema)``: the user calls ``push`` / ``insert`` /
``delete`` between steps) or *replayed* (a pyarrow Table, a list or iterator of RecordBatches, a
pandas DataFrame): the context takes the next chunk of every replayed source at each step, as
its batching mode says:

* :class:`FixedBatching` ``(rows)``: exactly ``rows`` rows per step (the last chunk may be short);
  ``no_batching()`` is ``FixedBatching(1)``;
* :class:`AdaptiveBatching` ``(max_rows, max_delay)``: as many rows as are available, up to
  ``max_rows``, waiting at most ``max_delay`` for more - whichever comes first. Rows in memory
  (a table) are always available, so this takes ``max_rows`` at a time; an iterator (which may
  block, like a socket or a generator reading a file) is read by a background thread into a
  bounded queue, and a step takes what has arrived by the deadline.

*Re-readable sources.* A source that can give a range of its rows again by position (a replayed
table by row offset; any source given with ``ctx.stream(..., reread=...)``, e.g. a generator by
event number) has ``reread(start, end)`` (the :class:`dbsp.ft.Rereadable` protocol): in a durable
pipeline the input log then records the positions of each step's rows, not the rows (see
:mod:`dbsp.ft.logs`), and recovery reads them again.

The default is ``AdaptiveBatching(max_rows=65536, max_delay=0.1 s)``. Chunks are validated by
the input (:func:`dbsp.algebra.schema.conform`). A bad row never takes the good rows of its
chunk with it: they are accepted either way. Under the input's error policy ``"raise"`` the step
then raises an :class:`~dbsp.algebra.schema.InputError` naming the input, the column and the row
of the source (the bad rows are in ``error.rejected_rows``; the good ones join the next step);
under ``"skip_and_report"`` the bad rows go to the error log and the step runs.
"""
from __future__ import annotations

import datetime as _dt
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import pyarrow as pa

from ..algebra.schema import InputError, as_schema, columns_to_table, from_polars, is_columns, \
    is_polars
from ..storage.osthreads import name_os_thread


@dataclass(frozen=True)
class FixedBatching:
    """A fixed number of rows per step."""

    rows: int

    def __post_init__(self):
        if not isinstance(self.rows, int) or self.rows < 1:
            raise ValueError(f"FixedBatching needs rows >= 1, got {self.rows!r}")


@dataclass(frozen=True)
class AdaptiveBatching:
    """At most ``max_rows`` per step, waiting at most ``max_delay`` (seconds or a timedelta)."""

    max_rows: int = 65536
    max_delay: Any = 0.1

    def __post_init__(self):
        if not isinstance(self.max_rows, int) or self.max_rows < 1:
            raise ValueError(f"AdaptiveBatching needs max_rows >= 1, got {self.max_rows!r}")
        if self.delay_seconds < 0:
            raise ValueError("AdaptiveBatching needs max_delay >= 0")

    @property
    def delay_seconds(self) -> float:
        d = self.max_delay
        return d.total_seconds() if isinstance(d, _dt.timedelta) else float(d)


def no_batching() -> FixedBatching:
    """One row per step (the note's ``NoBatching``)."""
    return FixedBatching(1)


DEFAULT_BATCHING = AdaptiveBatching()

_END = object()


def _is_pandas(x: Any) -> bool:
    return type(x).__module__.startswith("pandas") and type(x).__name__ == "DataFrame"


def _looks_like_schema(x: Any) -> bool:
    if isinstance(x, dict) and is_columns(x):
        return False  # a dict of columns is data
    if isinstance(x, (pa.Schema, dict)):
        return True
    if isinstance(x, (list, tuple)) and x and all(
            isinstance(f, pa.Field) or (isinstance(f, tuple) and len(f) == 2
                                        and isinstance(f[0], str)) for f in x):
        return True
    return False


class Source:
    """A source bound to a circuit input."""

    finite = False
    schema: pa.Schema

    def __init__(self, name: str, schema: pa.Schema):
        self.name, self.schema = name, schema
        self.input: Any = None  # the core InputStream, set by the context
        self.rows_in = 0
        #: ``(start, end)``: the positions the last :meth:`feed` pushed, when they are all of
        #: this step's rows of a re-readable source (else None); taken by the context
        self.span: Optional[tuple[int, int]] = None

    @property
    def exhausted(self) -> bool:
        return True

    def feed(self) -> int:
        """Push this step's chunk into the input; the rows pushed."""
        return 0

    def close(self) -> None:
        pass


class PushSource(Source):
    """``ctx.stream(schema)``: data comes from ``push``/``insert``/``delete``."""


class SlicedFeed(Source):
    """``ctx.stream(sliced_source)``: a source the workers read themselves
    (:mod:`dbsp.runtime.slices`, e.g. :class:`dbsp.connectors.slices.FileSlices`): each
    :meth:`feed` takes the source's next step, whose pieces (Parquet row groups, Arrow IPC
    record batches) the context deals to the workers (:meth:`Circuit.read_slices
    <dbsp.runtime.circuit.Circuit.read_slices>`). Its position is the next step of the source; a durable pipeline logs each step's
    pieces with what the workers read of them, and resumes after the logged steps."""

    finite = True

    def __init__(self, name: str, schema: pa.Schema, source: Any):
        super().__init__(name, schema)
        self.source = source
        self.next_step = 0
        #: the source's step the last :meth:`feed` took (None: none), taken by the context
        self.taken: Optional[int] = None
        self._known: Optional[tuple[int, bool]] = None  # (step, whether it exists)

    def _exists(self, k: int) -> bool:
        if self._known is None or self._known[0] != k:
            self._known = (k, self.source.pieces(k) is not None)
        return self._known[1]

    @property
    def exhausted(self) -> bool:
        return not self._exists(self.next_step)

    def feed(self) -> int:
        if self.taken is None and self._exists(self.next_step):
            self.taken = self.next_step
            self.next_step += 1
        return 0  # (the workers read the rows: counted after the step, rows_in)

    def untake(self) -> None:
        """The step that took the source's step failed before it ran: take it again next."""
        if self.taken is not None:
            self.next_step, self.taken = self.taken, None

    @property
    def position(self) -> int:
        return self.next_step

    def skip_to(self, position: int) -> None:
        """Resume after the source's steps a restored pipeline's input log recorded."""
        self.next_step, self.taken = int(position), None


def is_sliced_source(x: Any) -> bool:
    """Whether ``x`` is a :class:`~dbsp.runtime.slices.SlicedSource` (``pieces`` and ``read``),
    not data or a schema."""
    return callable(getattr(x, "pieces", None)) and callable(getattr(x, "read", None)) and \
        not isinstance(x, (pa.Table, pa.RecordBatch, pa.Schema))


class ReplaySource(Source):
    """A finite (or not) sequence of record batches replayed in steps."""

    finite = True

    def __init__(self, name: str, schema: pa.Schema, batches: Iterator[pa.RecordBatch],
                 batching: Any, in_memory: bool, table: Optional[pa.Table] = None):
        super().__init__(name, schema)
        self.batching = batching
        self._table = table  # the rows, when in memory: re-readable by row offset
        self._it = batches
        self._buf: list[pa.RecordBatch] = []  # rows taken from the iterator, not yet fed
        self._buf_rows = 0
        self._done = False
        self._offset = 0  # source rows fed so far (for error messages)
        self._thread: Optional[threading.Thread] = None
        self._q: Optional[queue.Queue] = None
        self._error: Optional[BaseException] = None
        if isinstance(batching, AdaptiveBatching) and not in_memory:
            self._q = queue.Queue(maxsize=64)
            self._thread = threading.Thread(target=self._reader, name=f"dbsp-source-{name}",
                                            daemon=True)
            self._stop = False
            self._thread.start()

    # -- background reader (adaptive batching over an iterator) -------------------------------
    def _reader(self) -> None:
        name_os_thread()
        assert self._q is not None
        try:
            for b in self._it:
                while True:
                    if self._stop:
                        return
                    try:
                        self._q.put(b, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # reported by the next step
            self._error = e
        self._q.put(_END)

    def _take_queue(self, want: int, deadline: float) -> None:
        assert self._q is not None
        while self._buf_rows < want and not self._done:
            timeout = deadline - time.monotonic()
            try:
                b = self._q.get(timeout=max(timeout, 0)) if timeout > 0 else self._q.get_nowait()
            except queue.Empty:
                return
            if b is _END:
                self._done = True
                if self._error is not None:
                    raise self._error
                return
            self._add(b)

    def _take_iter(self, want: int) -> None:
        while self._buf_rows < want and not self._done:
            try:
                b = next(self._it)
            except StopIteration:
                self._done = True
                return
            self._add(b)

    def _add(self, b: Any) -> None:
        if isinstance(b, pa.Table):
            for rb in b.to_batches():
                self._add(rb)
            return
        if _is_pandas(b):
            b = pa.RecordBatch.from_pandas(b, preserve_index=False)
        elif is_polars(b) or is_columns(b):
            t = from_polars(b) if is_polars(b) else columns_to_table(self.name, b)
            for rb in t.to_batches():
                self._add(rb)
            return
        if not isinstance(b, pa.RecordBatch):
            raise TypeError(f"source '{self.name}' yielded {type(b).__name__}; a source yields "
                            f"pyarrow RecordBatches / Tables or pandas DataFrames")
        if b.num_rows:
            self._buf.append(b)
            self._buf_rows += b.num_rows

    @property
    def exhausted(self) -> bool:
        return self._done and self._buf_rows == 0

    def _chunk(self, n: int) -> Optional[pa.Table]:
        if self._buf_rows == 0:
            return None
        taken, got = [], 0
        while self._buf and got < n:
            b = self._buf[0]
            k = min(b.num_rows, n - got)
            taken.append(b.slice(0, k))
            got += k
            if k == b.num_rows:
                self._buf.pop(0)
            else:
                self._buf[0] = b.slice(k)
        self._buf_rows -= got
        return pa.Table.from_batches(taken)

    def feed(self) -> int:
        bt = self.batching
        if isinstance(bt, FixedBatching):
            want = bt.rows
            if self._q is not None:
                self._take_queue(want, float("inf"))
            else:
                self._take_iter(want)
        else:
            want = bt.max_rows
            if self._q is not None:
                self._take_queue(want, time.monotonic() + bt.delay_seconds)
            else:
                self._take_iter(want)
        chunk = self._chunk(want)
        self.span = None
        if chunk is None:
            return 0
        base = self._offset
        self._offset += chunk.num_rows
        n, bad = self.input.push_checked(chunk)
        self.rows_in += n
        if not bad and self._table is not None:
            self.span = (base, self._offset)
        if bad:
            if self.input.policy == "skip_and_report":
                log = self.input.circuit.error_log
                for b in bad:
                    log.add(self.input.circuit.steps, self.name,
                            f"{b.reason} (row {base + b.index} of the source)", b.row, b.weight)
            else:
                b = bad[0]
                e = InputError(self.name, f"{b.reason.split(': ', 1)[-1]} (row {base + b.index} "
                                          f"of the source; the good rows of its chunk go to the "
                                          f"next step)", b.column, base + b.index)
                e.rejected_rows = [x.row for x in bad]  # type: ignore[attr-defined]
                raise e
        if self._buf_rows == 0 and self._q is None:
            self._take_iter(1)  # learn now whether the source is drained (no empty last step)
        return n

    @property
    def position(self) -> int:
        """Source rows fed so far (an input log records it: recovery re-reads from here)."""
        return self._offset

    def skip_to(self, position: int) -> None:
        """Drop the source's rows before ``position`` (fed before a restart and already in
        the input log or a checkpoint), so that the next feed starts there."""
        n = position - self._offset
        if n < 0:
            raise ValueError(f"source '{self.name}' is at row {self._offset}, cannot go back "
                             f"to row {position}")
        if n == 0:
            return
        if self._q is not None:
            self._take_queue(n, float("inf"))
        else:
            self._take_iter(n)
        chunk = self._chunk(n)
        got = 0 if chunk is None else chunk.num_rows
        if got < n:
            raise ValueError(f"source '{self.name}' has {self._offset + got} rows; the input "
                             f"log recorded {position} fed")
        self._offset += got
        if self._buf_rows == 0 and self._q is None:
            self._take_iter(1)

    @property
    def rereadable(self) -> bool:
        return self._table is not None

    def reread(self, start: int, end: int) -> pa.Table:
        """Rows ``[start, end)`` of the source again (a source whose rows are in memory)."""
        if self._table is None:
            raise TypeError(f"source '{self.name}' reads an iterator: it cannot read rows again")
        if not 0 <= start <= end <= self._table.num_rows:
            raise ValueError(f"source '{self.name}' has {self._table.num_rows} rows; rows "
                             f"[{start}, {end}) asked for")
        return self._table.slice(start, end - start)

    def close(self) -> None:
        if self._thread is not None:
            self._stop = True


class _Reread:
    """A function ``(start, end) -> rows`` as a :class:`dbsp.ft.Rereadable`."""

    def __init__(self, fn: Any):
        self.reread = fn


def as_rereadable(x: Any) -> Any:
    """``x`` (an object with ``reread(start, end)``, or such a function) as a re-readable
    source; a clear error for anything else."""
    if callable(getattr(x, "reread", None)):
        return x
    if callable(x):
        return _Reread(x)
    raise TypeError(f"reread= must be a function (start, end) -> rows or an object with a "
                    f"reread(start, end) method, got {type(x).__name__}")


def make_source(name: str, data: Any, schema: Any, batching: Any) -> Source:
    """A :class:`Source` for what ``ctx.stream`` was given (see the module doc)."""
    if _looks_like_schema(data):
        if schema is not None:
            raise TypeError("ctx.stream: give a schema as the source or as schema=, not both")
        return PushSource(name, as_schema(data))
    if data is None:
        if schema is None:
            raise TypeError("ctx.stream needs a source (a schema, table, batches, iterator or "
                            "DataFrame)")
        return PushSource(name, as_schema(schema))
    if _is_pandas(data):
        data = pa.Table.from_pandas(data, preserve_index=False)
    elif is_polars(data):
        data = from_polars(data)
    elif is_columns(data):
        data = columns_to_table(name, data)
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        s = as_schema(schema) if schema is not None else as_schema(data.schema)
        return ReplaySource(name, s, iter(data.to_batches()), batching, in_memory=True,
                            table=data)
    if isinstance(data, (list, tuple)):
        if data and not all(isinstance(b, (pa.RecordBatch, pa.Table)) for b in data):
            raise TypeError("ctx.stream: a list source must hold RecordBatches or Tables "
                            "(to push rows, create the stream from a schema and insert them)")
        if not data and schema is None:
            raise TypeError("ctx.stream: an empty list needs schema=")
        s = as_schema(schema) if schema is not None else as_schema(data[0].schema)
        return ReplaySource(name, s, iter(data), batching, in_memory=True)
    if hasattr(data, "__iter__") or hasattr(data, "__next__"):
        it = iter(data)
        if schema is not None:
            return ReplaySource(name, as_schema(schema), it, batching, in_memory=False)
        try:
            first = next(it)
        except StopIteration:
            raise TypeError("ctx.stream: an empty iterator needs schema=") from None
        if _is_pandas(first):
            first = pa.RecordBatch.from_pandas(first, preserve_index=False)
        elif is_polars(first):
            first = from_polars(first)
        elif is_columns(first):
            first = columns_to_table(name, first)
        if not isinstance(first, (pa.RecordBatch, pa.Table)):
            raise TypeError(f"ctx.stream: an iterator source must yield RecordBatches, Tables "
                            f"or DataFrames, got {type(first).__name__}")

        def chain(first=first, it=it):
            yield first
            yield from it
        return ReplaySource(name, as_schema(first.schema), chain(), batching, in_memory=False)
    raise TypeError(f"ctx.stream: unsupported source {type(data).__name__} (a schema, pyarrow "
                    f"Table / RecordBatches, an iterator of batches, or a pandas DataFrame)")


__all__ = ["FixedBatching", "AdaptiveBatching", "no_batching", "DEFAULT_BATCHING", "Source",
           "PushSource", "ReplaySource", "make_source", "as_rereadable"]
