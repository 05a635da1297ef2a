"""The durable input log and the output log of seed 000 ("Input", "Output", "Input/output
synchronization").

Input log
---------
Recovery replays the input of every step after the checkpoint, so the input of a step - and its
*division into steps* - must be durable before any output of the step is released. Each step's
input is one record, ``<dir>/<step>.log``: for every input that received rows, the rows and their
weights as an Arrow IPC stream, plus the producers' *positions* (an opaque integer per input,
e.g. a sequence number or an offset: a producer asks :meth:`InputLog.position` whether its input
was recorded, and a push at a recorded position is a duplicate to ignore). A record is written
``.mut`` -> fsync -> rename -> fsync of the directory and is checksummed (CRC-32C over the whole
record); a damaged record is an error, never replayed. Records below the oldest checkpoint kept
are trimmed.

*Spans of re-readable sources.* An input whose rows come from a source that can read a range of
its positions again (a deterministic generator by event number, a file by row offset; the
:class:`Rereadable` protocol) is logged by position: the caller says the step's rows of that
input are exactly the source's positions ``[start, end)`` (``spans=`` of :meth:`InputLog.append`)
and the record holds a :class:`Span` - the range, the row count and a CRC-32C of the rows'
content and weights (:func:`rows_crc`, independent of how the rows are chunked or sliced) -
instead of the rows. Recovery re-reads the range and checks the count and the checksum, so a
source that changed under the log is an error naming the input, never silently different input.
The caller declares a span only when the step's rows of the input are exactly the source's
(rows pushed by hand beside them are logged as data).

*Slices read by the workers.* An input whose rows the workers read themselves from a sliced
source (:mod:`dbsp.runtime.slices`: each worker its own pieces, no row through the driver) is
logged the same way, per piece: its position (the source's description: file, row group, row
range) and the row count and :func:`rows_crc` the worker reported having read (``slices=`` of
:meth:`InputLog.append`; :meth:`InputLog.read` gives a :class:`Slices`). Recovery sends the
workers the same pieces with what they must read back as, whatever the number of workers now.

*Group commit.* :meth:`InputLog.append` hands the record to one logger thread and returns at
once: encoding (Arrow IPC, CRC-32C), the write and both fsyncs run there (``os.write``,
``os.fsync`` and the native CRC-32C of large buffers release the GIL) while the circuit computes the
step; :meth:`InputLog.wait` blocks until the record is durable, and the caller releases no
output of the step before that. A failed write or fsync is never retried: the log refuses every
later append (restart to recover) and :meth:`InputLog.wait` raises it.

Output log
----------
:meth:`OutputLog.write` follows 000's ``write(step, output)`` rules: a step already in the log was
produced before and is discarded (with ``check=True``, compared first: a different output is
an :class:`OutputMismatch`); the next step is appended; a step beyond the next is a gap, an
:class:`OutputGap` error. Every row of a record carries its step (a ``__step`` column) so that
consumers can deduplicate.

A record is written ``.mut`` -> rename (atomic against a crash of the process) but fsynced only
by :meth:`OutputLog.sync`, which a checkpoint calls for every step before it is published: the
output of a step after the last checkpoint is re-produced by replaying the (durable) input log,
so it need not be durable yet. After a power loss such a record may be damaged: recovery drops it
and every later one (:meth:`OutputLog.repair`), and the replay writes them again.

Record layout (both logs)::

    magic (8 bytes) | u32 header length | header JSON | Arrow IPC streams | u32 checksum

The checksum covers every byte before it; it is CRC-32C (``header["checksum"] == "crc32c"``;
the SSE4.2 instruction of :mod:`dbsp._native.block`, which releases the GIL on large buffers):
zlib's crc32 over a 20 MB Nexmark step took 40-60 ms of a loaded core, the native CRC-32C 1 ms
unloaded. Records written before it (no ``checksum`` in the header) carry zlib's crc32 and are
still read. The Arrow IPC streams are not copied into one buffer: the IPC writer hands its
pieces (the batch's own buffers for the data) to a collecting sink, and the pieces are
checksummed and written one after the other.
"""
from __future__ import annotations

import glob
import json
import os
import struct
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import numpy as np
import pyarrow as pa

from ..algebra.checksum import content_crc, crc32c, rows_crc
from ..storage.faults import fsync_dir, fsync_path, write_atomic, write_durable

__all__ = ["InputLog", "OutputLog", "read_outputs", "output_steps", "read_output", "LogCorrupt",
           "OutputGap", "OutputMismatch", "WEIGHT", "STEP", "Span", "Slices", "Rereadable",
           "content_crc", "rows_crc"]

WEIGHT = "__weight"
STEP = "__step"
_IN_MAGIC = b"DBSPINLG"
_OUT_MAGIC = b"DBSPOTLG"


class LogCorrupt(RuntimeError):
    """A log record is damaged (bad magic, checksum or layout) or a step is missing."""


class OutputGap(RuntimeError):
    """``write(step)`` for a step beyond the next one: output of a step would be lost."""


class OutputMismatch(RuntimeError):
    """Output re-produced during recovery differs from the output logged the first time."""


class Rereadable(Protocol):
    """A source that can read a range of its positions again (see the module doc).

    ``reread(start, end)`` returns the rows the source gave at positions ``[start, end)`` - a
    pyarrow RecordBatch or Table of the input's columns (a ``__weight`` column gives weights,
    else every row has weight +1) - in the same order. Positions are the source's own (rows of
    a file, event numbers of a generator): only the source interprets them."""

    def reread(self, start: int, end: int) -> Any: ...


@dataclass(frozen=True)
class Span:
    """An input's rows of one step, logged by position: its source's positions ``[start, end)``,
    ``rows`` rows whose :func:`rows_crc` (content and weights) is ``crc``."""

    start: int
    end: int
    rows: int
    crc: int


def _crc(buf: Any, crc: int = 0) -> int:
    return crc32c(buf, crc)


@dataclass(frozen=True)
class Slices:
    """An input's rows of one step read by the workers from a sliced source: the source's
    ``pieces`` (in order), per piece the ``(rows, crc)`` read (``report``), and the rows
    pushed into the input beside them (``pushed``: ``(batch, weights)`` or None)."""

    pieces: tuple
    report: tuple
    pushed: Optional[tuple] = None


class _Pieces:
    """A sink for the Arrow IPC writer that keeps the pieces it is handed (the batch's own
    buffers for the data, small ``bytes`` for metadata and padding) instead of copying them
    into one buffer."""

    closed = False

    def __init__(self) -> None:
        self.parts: list = []
        self.size = 0

    def write(self, b: Any) -> int:
        n = memoryview(b).nbytes
        if n:
            self.parts.append(b)
            self.size += n
        return n

    def flush(self) -> None:
        pass


def _encode(magic: bytes, header: dict, tables: list[tuple[str, pa.Table]]) -> list:
    """The record as a list of buffers (written one after the other, none copied; they refer
    to the tables' memory, which must stay as it is until the record is written)."""
    entries = []
    blobs: list = []
    off = 0
    for name, t in tables:
        sink = _Pieces()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        entries.append({"name": name, "offset": off, "length": sink.size, "rows": t.num_rows})
        off += sink.size
        blobs.extend(sink.parts)
    header = dict(header, tables=entries, checksum="crc32c")
    hb = json.dumps(header).encode()
    head = magic + struct.pack("<I", len(hb)) + hb
    crc = _crc(head)
    for b in blobs:
        crc = _crc(b, crc)
    return [head, *blobs, struct.pack("<I", crc)]


def _decode(magic: bytes, path: str, tables: bool = True) -> tuple[dict, dict[str, pa.Table]]:
    """``(header, {name: table})`` of a record, its checksum checked (``tables=False``: only
    checked, the Arrow streams are not read)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise LogCorrupt(f"log record {path} is missing") from None
    if len(data) < len(magic) + 8 or data[:len(magic)] != magic:
        raise LogCorrupt(f"{path}: not a dbsp log record")
    (crc,) = struct.unpack("<I", data[-4:])
    (hl,) = struct.unpack("<I", data[len(magic):len(magic) + 4])
    h0 = len(magic) + 4
    try:
        header = json.loads(data[h0:h0 + hl])
        if not isinstance(header, dict):
            raise ValueError("not an object")
    except ValueError:
        raise LogCorrupt(f"{path}: damaged header (the record is damaged)") from None
    view = memoryview(data)[:-4]
    ok = (_crc(view) == crc) if header.get("checksum") == "crc32c" else \
        (zlib.crc32(view) == crc)
    if not ok:
        raise LogCorrupt(f"{path}: checksum mismatch (the record is damaged)")
    if not tables:
        return header, {}
    base = h0 + hl
    whole = pa.py_buffer(data)
    out = {}
    for e in header["tables"]:
        buf = whole.slice(base + e["offset"], e["length"])  # no copy
        out[e["name"]] = pa.ipc.open_stream(buf).read_all()
    return header, out


class _StepLog:
    """Numbered records ``<dir>/<step:012d>.log``, contiguous from :attr:`first` to
    :attr:`end` (exclusive)."""

    magic = b""

    def __init__(self, directory: str):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        for p in glob.glob(os.path.join(directory, "*.mut")):
            os.unlink(p)
        steps = sorted(int(os.path.basename(p)[:-4])
                       for p in glob.glob(os.path.join(directory, "*.log")))
        if steps and steps != list(range(steps[0], steps[-1] + 1)):
            missing = sorted(set(range(steps[0], steps[-1] + 1)) - set(steps))
            raise LogCorrupt(f"{directory}: steps {missing[:5]} are missing from the log")
        self.first = steps[0] if steps else 0
        self.end = steps[-1] + 1 if steps else 0
        self._lock = threading.Lock()

    def path(self, step: int) -> str:
        return os.path.join(self.dir, f"{step:012d}.log")

    def trim(self, below: int) -> int:
        """Remove the records of steps ``< below``, but never the last record: it carries the
        log's end (and the input log's recorded positions) across a restart."""
        n = 0
        with self._lock:
            while self.first < min(below, self.end - 1):
                try:
                    os.unlink(self.path(self.first))
                except FileNotFoundError:
                    pass
                self.first += 1
                n += 1
        if n:
            fsync_dir(self.dir)
        return n

    def start_at(self, step: int) -> None:
        """An empty log continues at ``step`` (the step of the checkpoint it follows)."""
        with self._lock:
            if self.end > self.first:
                raise ValueError(f"{self.dir}: the log is not empty")
            self.first = self.end = step


class InputLog(_StepLog):
    """The durable input log (see the module doc)."""

    magic = _IN_MAGIC

    def __init__(self, directory: str):
        super().__init__(directory)
        self._positions: dict[str, int] = {}   # recorded durably
        self._appended: dict[str, int] = {}    # after the last append (durable or not yet)
        self._before: dict[str, int] = {}      # before the last append
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pending: dict[int, Future] = {}
        self.failed: Optional[BaseException] = None
        if self.end > self.first:
            self._positions = dict(self.read(self.end - 1)[1])
        self._appended = dict(self._positions)

    def append(self, step: int, parts: dict[str, Optional[tuple]], positions: dict,
               meta: Optional[dict] = None, wait: bool = True,
               spans: Optional[dict[str, tuple[int, int]]] = None,
               slices: Optional[dict[str, dict]] = None) -> None:
        """Record step ``step``'s input durably: ``{input: (RecordBatch, weights) | None}``
        and the producers' positions after it. ``spans``: ``{input: (start, end)}``, the
        inputs whose rows this step are exactly their re-readable source's positions
        ``[start, end)`` (logged as a :class:`Span`, see the module doc). ``slices``: ``{input:
        {"pieces": [...], "report": [(rows, crc), ...]}}``, the pieces the workers read
        themselves (:attr:`dbsp.runtime.circuit.Circuit.last_slices`). ``wait=False``:
        return at once, the record is written and fsynced on the logger thread; :meth:`wait`
        for it before releasing any output of the step."""
        if self.failed is not None:
            raise LogCorrupt(f"{self.dir}: an earlier write of the input log failed "
                             f"({self.failed}); restart to recover") from self.failed
        if step != self.end:
            raise LogCorrupt(f"{self.dir}: appending step {step}, the log ends at {self.end}")
        pos = dict(self._appended)
        pos.update({k: int(v) for k, v in positions.items()})
        with self._lock:
            self._before = self._appended
            self._appended = pos
            if self.end == self.first:
                self.first = step
            self.end = step + 1
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="dbsp-input-log")
        self._pending[step] = self._pool.submit(self._write, step, dict(parts), pos, meta,
                                                dict(spans or {}), dict(slices or {}))
        if wait:
            self.wait(step)

    def _write(self, step: int, parts: dict, pos: dict, meta: Optional[dict],
               spans: dict, slices: dict) -> None:
        try:
            tables = []
            logged_spans = {}
            for name, p in sorted(parts.items()):
                if p is None:
                    continue
                batch, w = p
                span = spans.get(name)
                if span is not None:
                    logged_spans[name] = {"start": int(span[0]), "end": int(span[1]),
                                          "rows": batch.num_rows, "crc": rows_crc(batch, w)}
                    continue
                t = pa.Table.from_batches([batch]).append_column(
                    WEIGHT, pa.array(np.asarray(w, dtype=np.int64)))
                tables.append((name, t))
            header = {"step": step, "positions": pos, "meta": meta or {}}
            if logged_spans:
                header["spans"] = logged_spans
            if slices:
                header["slices"] = {
                    name: {"pieces": list(sl["pieces"]),
                           "report": [[int(r), int(c)] for r, c in sl["report"]]}
                    for name, sl in slices.items()}
            data = _encode(self.magic, header, tables)
            write_durable(self.path(step), data, kill_before_fsync="input-log-before-fsync",
                          kill_before_rename="input-log-before-rename")
        except BaseException as e:
            self.failed = e
            raise
        with self._lock:
            self._positions = pos

    def wait(self, step: Optional[int] = None) -> None:
        """Block until the record of ``step`` (default: every record appended) is durable;
        raise the error of its write."""
        steps = sorted(self._pending) if step is None else \
            [s for s in sorted(self._pending) if s <= step]
        for s in steps:
            f = self._pending.pop(s)
            f.result()

    def retract(self, step: int) -> None:
        """Remove the record of ``step``, the last one: its step failed and was rolled back
        (its input was not applied and no output of it exists), so it must not be replayed."""
        self.wait()
        with self._lock:
            if step != self.end - 1:
                raise LogCorrupt(f"{self.dir}: retracting step {step}, the log ends at "
                                 f"{self.end - 1}")
            os.unlink(self.path(step))
            self.end = step
            if self.first > self.end:
                self.first = self.end
            self._positions = self._appended = self._before
        fsync_dir(self.dir)

    def close(self) -> None:
        """Wait for the records being written (their errors are not raised here) and stop the
        logger thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._pending.clear()

    def read(self, step: int) -> tuple[dict[str, Any], dict[str, int], dict]:
        """``({input: (RecordBatch, weights) | Span}, positions, meta)`` of a logged step (a
        :class:`Span` for an input logged by position: re-read it from its source)."""
        if not self.first <= step < self.end:
            raise LogCorrupt(f"{self.dir}: step {step} is not in the log "
                             f"(steps {self.first}..{self.end - 1})")
        if step in self._pending:
            self.wait(step)
        header, tables = _decode(self.magic, self.path(step))
        if header["step"] != step:
            raise LogCorrupt(f"{self.path(step)}: holds step {header['step']}")
        parts: dict[str, Any] = {}
        for name, t in tables.items():
            w = t.column(WEIGHT).to_numpy()
            data = t.drop_columns([WEIGHT]).combine_chunks().to_batches()
            batch = data[0] if data else pa.RecordBatch.from_pylist([], schema=t.schema)
            parts[name] = (batch, w)
        for name, sp in header.get("spans", {}).items():
            parts[name] = Span(int(sp["start"]), int(sp["end"]), int(sp["rows"]), int(sp["crc"]))
        for name, sl in header.get("slices", {}).items():
            parts[name] = Slices(tuple(sl["pieces"]), tuple(tuple(r) for r in sl["report"]),
                                 parts.get(name))
        return parts, header["positions"], header.get("meta", {})

    def position(self, name: str) -> Optional[int]:
        """The last position recorded durably for input ``name`` (None: nothing recorded)."""
        return self._positions.get(name)


class OutputLog(_StepLog):
    """The output log (see the module doc); ``check``: compare re-produced output with the
    logged output."""

    magic = _OUT_MAGIC

    def __init__(self, directory: str, check: bool = False):
        super().__init__(directory)
        self.check = check
        self.discarded = 0
        self.synced = self.first  # records below this step are durable
        self.failed: Optional[BaseException] = None

    def sync(self, upto: Optional[int] = None) -> int:
        """Make the records of the steps below ``upto`` (default: all) durable: fsync each
        record not synced yet, then the directory. Returns the records fsynced."""
        if self.failed is not None:
            raise LogCorrupt(f"{self.dir}: an earlier fsync of the output log failed "
                             f"({self.failed}); restart to recover") from self.failed
        with self._lock:
            end = self.end if upto is None else min(upto, self.end)
            start = max(self.synced, self.first)
        try:
            for s in range(start, end):
                fsync_path(self.path(s))
            if end > start:
                fsync_dir(self.dir)
        except OSError as e:  # never retried over: the kernel may have dropped the pages
            self.failed = e
            raise
        with self._lock:
            self.synced = max(self.synced, end)
        return max(0, end - start)

    def repair(self, start: int) -> int:
        """Drop the records from the first damaged one at or after step ``start`` on (records
        after the last checkpoint, never fsynced: a power loss may have torn them; the replay
        writes them again). Returns the records dropped."""
        bad = None
        for s in range(max(start, self.first), self.end):
            try:
                header, _ = _decode(self.magic, self.path(s), tables=False)  # checksum
                if header["step"] != s:
                    raise LogCorrupt(f"{self.path(s)}: holds step {header['step']}")
            except (LogCorrupt, ValueError, KeyError, pa.ArrowInvalid):
                bad = s
                break
        if bad is None:
            return 0
        n = 0
        with self._lock:
            for s in range(bad, self.end):
                try:
                    os.unlink(self.path(s))
                except FileNotFoundError:
                    pass
                n += 1
            self.end = bad
            if self.first > self.end:
                self.first = self.end
            self.synced = min(self.synced, bad)
        fsync_dir(self.dir)
        return n

    def write(self, step: int, outputs: dict[str, pa.Table]) -> bool:
        """Log ``{output: delta table with a __weight column}`` as step ``step`` (000's
        rules). Returns True if appended, False if discarded as already produced."""
        if step < self.end:
            if self.check and step >= self.first:
                _, old = self.read(step)
                for name in set(old) | set(outputs):
                    a = old.get(name)
                    b = outputs.get(name)
                    if _canon(a) != _canon(b):
                        raise OutputMismatch(f"output {name!r} of step {step} differs from the "
                                             f"output logged before")
            self.discarded += 1
            return False
        if step > self.end:
            raise OutputGap(f"{self.dir}: output of step {step} written, but the log ends at "
                            f"step {self.end - 1} (steps in between would be lost)")
        tables = []
        for name, t in sorted(outputs.items()):
            if t is None or t.num_rows == 0:
                continue
            tables.append((name, t.append_column(STEP, pa.array(np.full(t.num_rows, step,
                                                                        np.int64)))))
        data = _encode(self.magic, {"step": step}, tables)
        write_atomic(self.path(step), data, kill_before_rename="output-log-before-record")
        with self._lock:
            if self.end == self.first:
                self.first = step
            self.end = step + 1
        return True

    def read(self, step: int) -> tuple[int, dict[str, pa.Table]]:
        """``(step, {output: table with __weight and __step})`` of a logged step."""
        if not self.first <= step < self.end:
            raise LogCorrupt(f"{self.dir}: step {step} is not in the log "
                             f"(steps {self.first}..{self.end - 1})")
        header, tables = _decode(self.magic, self.path(step))
        return header["step"], tables


def _canon(t: Optional[pa.Table]) -> list:
    if t is None or t.num_rows == 0:
        return []
    if STEP in t.column_names:
        t = t.drop_columns([STEP])
    return sorted(map(tuple, (r.values() for r in t.to_pylist())), key=repr)


def output_steps(directory: str) -> tuple[int, int]:
    """``(first, end)``: the steps an output log directory holds, read-only (``(0, 0)`` when
    it is empty or missing)."""
    steps = [int(os.path.basename(p)[:-4]) for p in glob.glob(os.path.join(directory, "*.log"))]
    return (min(steps), max(steps) + 1) if steps else (0, 0)


def read_output(directory: str, step: int) -> dict[str, pa.Table]:
    """``{output: table with __weight and __step}`` of one step of an output log directory,
    read-only (for consumers such as the Structured Streaming source)."""
    header, tables = _decode(_OUT_MAGIC, os.path.join(directory, f"{step:012d}.log"))
    if header["step"] != step:
        raise LogCorrupt(f"{directory}: record {step} holds step {header['step']}")
    return tables


def read_outputs(directory: str) -> list[tuple[int, dict[str, pa.Table]]]:
    """Every record of an output log directory, in step order, read-only (for consumers and
    checkers: nothing is removed)."""
    steps = sorted(int(os.path.basename(p)[:-4])
                   for p in glob.glob(os.path.join(directory, "*.log")))
    out = []
    for s in steps:
        header, tables = _decode(_OUT_MAGIC, os.path.join(directory, f"{s:012d}.log"))
        if header["step"] != s:
            raise LogCorrupt(f"{directory}: record {s} holds step {header['step']}")
        out.append((s, tables))
    return out
