"""Parquet and Arrow IPC files as a sliced source: every worker reads its own row groups.

:class:`FileSlices` lists a set of files (paths, or a directory read as a ``pyarrow.dataset``
of one format) and cuts them into *units*: the row groups of a Parquet file, the record
batches of an Arrow IPC file. Step ``k`` is a run of consecutive units (``units_per_step``,
default: one file per step) or the units a function names (``steps(k) -> unit indices``). Its
pieces (:meth:`FileSlices.pieces`) describe each unit by position - ``{"file": path, "group":
g, "start": first row of the file, "end": row after the last}`` - and the runtime deals them to
the workers by index (:mod:`dbsp.runtime.slices`), so worker ``w`` of ``W`` reads only units
``w, w + W, ...`` of the step, with no row passing through the driver. A durable circuit logs
those positions with each piece's row count and checksum, so recovery reads the same rows again
and a file changed under the log is an error.

Only the driver lists the files (their footers: no data); a worker is sent a
:class:`FileReader` (the format and the columns), never the listing. Files must be visible at
the same path wherever the workers run (a shared or object-store-backed file system).

>>> import tempfile, os, pyarrow as pa, pyarrow.parquet as pq
>>> d = tempfile.mkdtemp()
>>> pq.write_table(pa.table({"k": [1, 2, 3, 4]}), os.path.join(d, "a.parquet"), row_group_size=2)
>>> src = FileSlices(d)
>>> [(p["group"], p["start"], p["end"]) for p in src.pieces(0)]
[(0, 0, 2), (1, 2, 4)]
>>> src.read(src.pieces(0)[1]).column("k").to_pylist()
[3, 4]
>>> src.pieces(1) is None
True
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any, Callable, Optional, Sequence, Union

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["FileSlices", "FileReader"]

_FORMATS = ("parquet", "arrow")


def _format_of(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext in (".parquet", ".pq"):
        return "parquet"
    if ext in (".arrow", ".feather", ".ipc"):
        return "arrow"
    raise ValueError(f"{path}: cannot tell the format from the name (give format='parquet' "
                     f"or 'arrow')")


class _OpenFiles:
    """The files this process read pieces of lately, kept open (their footers parsed): a
    worker reads several pieces of a step's file, and opening it (a memory map or a file
    handle, the footer read and parsed) cost more than reading an Arrow piece (~70 of ~100 us
    a piece). A file is known by its path, inode, size and modification time, so one
    replaced or rewritten under the same name is opened afresh; and by the thread reading it
    (a reader object is not shared between threads)."""

    KEEP = 8

    def __init__(self):
        self._open: OrderedDict = OrderedDict()  # key -> (closable, reader)
        self._lock = threading.Lock()

    def get(self, fmt: str, path: str) -> Any:
        st = os.stat(path)
        key = (fmt, path, st.st_ino, st.st_size, st.st_mtime_ns, threading.get_ident())
        with self._lock:
            got = self._open.get(key)
            if got is not None:
                self._open.move_to_end(key)
                return got[1]
        if fmt == "parquet":
            r = pq.ParquetFile(path)
            got = (r, r)
        else:
            # the reader over a buffer of the whole map, not over the map as a file: opened
            # from a file, Arrow reads the footer through its I/O thread pool (3 thread
            # handoffs a file, 285 us of CPU to open one and read 8 batches of a step's file,
            # against 0 and 140-155 us this way; the batches are zero-copy either way)
            f = pa.memory_map(path)
            got = (f, pa.ipc.open_file(f.read_buffer()))
        with self._lock:
            self._open[key] = got
            while len(self._open) > self.KEEP:
                # (batches read from a closed memory map keep its memory alive)
                self._open.popitem(last=False)[1][0].close()
        return got[1]


_OPEN_FILES = _OpenFiles()


class FileReader:
    """Reads one piece of a :class:`FileSlices` (what a worker is sent: no listing)."""

    def __init__(self, format: str, columns: Optional[Sequence[str]] = None):
        if format not in _FORMATS:
            raise ValueError(f"format must be one of {_FORMATS}, got {format!r}")
        self.format = format
        self.columns = None if columns is None else list(columns)

    def read(self, piece: dict) -> pa.Table:
        path, g = piece["file"], int(piece["group"])
        f = _OPEN_FILES.get(self.format, path)
        if self.format == "parquet":
            t = f.read_row_group(g, columns=self.columns)
        else:
            t = pa.Table.from_batches([f.get_batch(g)])
            if self.columns is not None:
                t = t.select(self.columns)
        n = int(piece["end"]) - int(piece["start"])
        if t.num_rows != n:
            raise ValueError(f"{path} unit {g} has {t.num_rows} rows, the listing found {n}: "
                             f"the file changed since it was listed")
        return t


class FileSlices:
    """Parquet or Arrow IPC files as a sliced source (see the module doc).

    ``paths``: a list of files (in that order), or a directory (its files of the format, in
    name order, recursively). ``format``: ``"parquet"`` or ``"arrow"`` (default: from the
    names). ``columns``: read only these. ``units_per_step``: consecutive units (row groups /
    record batches, across files) per step (default: each file is one step); or ``steps``: a
    function ``k -> unit indices`` of step ``k`` (an empty or None result: no step ``k``)."""

    def __init__(self, paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]], *,
                 format: Optional[str] = None, columns: Optional[Sequence[str]] = None,
                 units_per_step: Optional[int] = None,
                 steps: Optional[Callable[[int], Optional[Sequence[int]]]] = None):
        if units_per_step is not None and steps is not None:
            raise ValueError("give units_per_step or steps, not both")
        if units_per_step is not None and units_per_step < 1:
            raise ValueError(f"units_per_step must be >= 1, got {units_per_step}")
        if isinstance(paths, (str, os.PathLike)) and os.path.isdir(paths):
            files = self._listdir(os.fspath(paths), format)
        elif isinstance(paths, (str, os.PathLike)):
            files = [os.fspath(paths)]
        else:
            files = [os.fspath(p) for p in paths]
        if not files:
            raise ValueError(f"no {format or 'Parquet or Arrow'} files in {paths!r}")
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(
                f"FileSlices: {len(missing)} of {len(files)} inputs not found or not files: "
                f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
        fmt = format or _format_of(files[0])
        self.reader_ = FileReader(fmt, columns)
        self.format = fmt
        self.files = [os.path.abspath(f) for f in files]
        self.units: list[dict] = []  # in order: {"file", "group", "start", "end"}
        self._file_units: list[list[int]] = []
        for f in self.files:
            mine = []
            try:
                ranges = self._row_ranges(f)
            except (pa.ArrowException, OSError) as e:
                raise ValueError(f"FileSlices: {f} cannot be read as {fmt}: {e}") from e
            for g, (lo, hi) in enumerate(ranges):
                mine.append(len(self.units))
                self.units.append({"file": f, "group": g, "start": lo, "end": hi})
            self._file_units.append(mine)
        self.units_per_step = units_per_step
        self.steps_fn = steps

    @staticmethod
    def _listdir(d: str, format: Optional[str]) -> list[str]:
        out = []
        for root, _, names in os.walk(d):
            for n in names:
                if n.startswith((".", "_")):
                    continue
                p = os.path.join(root, n)
                try:
                    f = _format_of(p)
                except ValueError:
                    continue
                if format is None or f == format:
                    out.append(p)
        return sorted(out)

    def _row_ranges(self, path: str) -> list[tuple[int, int]]:
        if self.format == "parquet":
            md = pq.ParquetFile(path).metadata
            sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        else:
            with pa.memory_map(path) as f:  # (over a buffer: see _OpenFiles.get)
                r = pa.ipc.open_file(f.read_buffer())
                sizes = [r.get_batch(g).num_rows for g in range(r.num_record_batches)]
        out, lo = [], 0
        for n in sizes:
            out.append((lo, lo + n))
            lo += n
        return out

    @property
    def schema(self) -> pa.Schema:
        """The first file's schema (its ``columns`` only): what ``ctx.stream(FileSlices(...))``
        takes as the stream's schema (``__weight``, if present, gives weights)."""
        f = self.files[0]
        if self.format == "parquet":
            sch = pq.ParquetFile(f).schema_arrow
        else:
            with pa.memory_map(f) as m:
                sch = pa.ipc.open_file(m.read_buffer()).schema
        cols = self.reader_.columns
        names = [n for n in (cols if cols is not None else sch.names) if n != "__weight"]
        return pa.schema([sch.field(n) for n in names])

    @property
    def rows(self) -> int:
        """Rows in all the files."""
        return sum(u["end"] - u["start"] for u in self.units)

    def step_count(self) -> int:
        """How many steps the source has (with ``steps=``: those before the first empty one)."""
        k = 0
        while self.pieces(k) is not None:
            k += 1
        return k

    def pieces(self, step: int) -> Optional[list[dict]]:
        """The units of step ``step`` (see the class doc), None past the last step."""
        if step < 0:
            return None
        if self.steps_fn is not None:
            idx = self.steps_fn(step)
            if not idx:
                return None
            return [dict(self.units[i]) for i in idx]
        if self.units_per_step is None:
            if step >= len(self._file_units):
                return None
            return [dict(self.units[i]) for i in self._file_units[step]]
        lo = step * self.units_per_step
        if lo >= len(self.units):
            return None
        return [dict(u) for u in self.units[lo:lo + self.units_per_step]]

    def read(self, piece: dict) -> pa.Table:
        return self.reader_.read(piece)

    def reader(self) -> FileReader:
        """What a worker is sent to read pieces (the listing stays here)."""
        return self.reader_
