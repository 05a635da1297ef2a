"""Inputs that the workers read themselves: each worker its own slice of a partitioned source.

Rows pushed into a circuit's input travel through the driver: it splits them and sends each
worker its share. A *sliced source* is read where the workers run instead, and no row crosses
the driver. The source says which *pieces* make step ``k`` (:meth:`SlicedSource.pieces`: small
descriptions such as ``{"file": ..., "group": 3, "start": 3000, "end": 4000}``, the row groups of
Parquet files or the record batches of Arrow IPC files); the driver deals them to the workers by
index (:func:`deal_pieces`: worker ``w`` of ``W`` gets pieces ``w, w + W, ...``) and sends each
worker only the descriptions; each worker reads its pieces (:meth:`SlicedSource.read`) into its
replica's input, where the workers deal them by key among themselves (below).

An input read this way is *unplaced* by the driver: its rows reach a worker wherever they lie in
the source. The placement (:mod:`dbsp.runtime.placement`, which deals an input by the key of its
first exchange and makes that exchange local) has the workers deal such an input instead: in
the input's step each worker deals the rows it read by that key and swaps them with the others,
once, before any operator sorts them. Such inputs are named when the circuit is built
(:meth:`dbsp.runtime.circuit.Circuit.slice_inputs`, ``launch(sliced=...)``): every replica
computes the same placement.

The step's request carries, per worker, one :class:`SliceRead` per input under the key
:data:`SLICES`; the worker's :class:`SliceReader` reads the pieces, conforms them to the input's
schema, feeds them beside any rows the driver sent, and reports per piece ``(rows, crc)`` (the
:func:`~dbsp.algebra.checksum.rows_crc` of what it read) in its reply under the same key. A
durable circuit logs that report as the step's division of input (:mod:`dbsp.ft.logs`), and its
replay sends the logged pieces with their expected ``(rows, crc)``: a piece that reads back
different raises :class:`SliceMismatch` on the worker.

A source may also live only on the workers (:class:`LocalSource`: a name the worker resolves in
its own table), such as the partition of a Spark DataFrame that a barrier task receives in its
iterator (:mod:`dbsp.spark`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

import numpy as np
import pyarrow as pa

from ..algebra.checksum import rows_crc
from ..algebra.schema import (InputError, concat_batches, conform, empty_batch, exact_batch,
                              null_column)
from ..trace.batch import ZSet

__all__ = ["SlicedSource", "SourceStep", "SliceRead", "SliceReader", "SliceMismatch", "SliceError",
           "LocalSource", "SLICES", "deal_pieces", "gather_report"]

#: key of a worker's step request (``{input node: SliceRead}``) and reply (``{input node:
#: [(rows, crc), ...]}``) that carries the slices it reads itself
SLICES = "__slices"


class SlicedSource(Protocol):
    """A source the workers read by pieces (see the module doc).

    ``pieces(step)``: the pieces of step ``step`` (JSON-able, small), None when the source has
    no such step. ``read(piece)``: the rows of one piece (a pyarrow Table or RecordBatch of the
    input's columns; a ``__weight`` column gives weights, else +1 each), the same rows in the
    same order every time it is asked (a table without rows or columns: nothing). Optional ``reader()``: a light object with the same
    ``read`` to ship to the workers instead of the source itself."""

    def pieces(self, step: int) -> Optional[Sequence[Any]]: ...

    def read(self, piece: Any) -> Any: ...


@dataclass(frozen=True)
class SourceStep:
    """In a step's input (``{input name: SourceStep(k)}``, as a durable job's ``read`` returns
    it): input ``name`` reads step ``k`` of its sliced source, every worker its own pieces."""

    step: int


@dataclass(frozen=True)
class LocalSource:
    """A source known only to the workers, by ``name`` (each worker resolves it in the table it
    was started with: :class:`SliceReader`'s ``local``)."""

    name: str


class SliceError(RuntimeError):
    """A worker could not read a piece of a sliced source (the message names the input and the
    piece)."""


class SliceMismatch(SliceError):
    """A piece read again (a replay) differs from what the input log recorded of it."""


@dataclass(frozen=True)
class SliceRead:
    """What one worker reads for one input in one step: ``pieces`` of ``source`` (a
    :class:`SlicedSource`'s reader or a :class:`LocalSource`); ``expect``, per piece, the
    ``(rows, crc)`` a replay must find again (None: a live step); ``checksum``: report the
    crc of each piece (a durable circuit logs it)."""

    name: str
    source: Any
    pieces: tuple
    expect: Optional[tuple] = None
    checksum: bool = True


def deal_pieces(pieces: Sequence[Any], workers: int) -> list[list[int]]:
    """The indices of ``pieces`` each of ``workers`` workers reads: worker ``w`` gets ``w, w +
    W, w + 2W, ...``."""
    return [list(range(w, len(pieces), workers)) for w in range(workers)]


def gather_report(reports: Sequence[Optional[list]], n: int, workers: int) -> list:
    """Per piece (in the source's order) the ``(rows, crc)`` the workers reported (worker ``w``
    reported its pieces ``w, w + W, ...`` in that order)."""
    out: list = [None] * n
    for w, rep in enumerate(reports):
        for j, r in enumerate(rep or ()):
            out[w + j * workers] = tuple(r)
    return out


def _conform_piece(name: str, schema: pa.Schema, data: Any, piece: Any):
    """:func:`conform` of a piece, its error naming the piece (the row: the piece's)."""
    try:
        return conform(name, schema, data, None)
    except InputError as e:
        raise InputError(name, f"{e.reason} (in {piece!r})", e.column, e.row) from None


class SliceReader:
    """A worker's side: reads the :class:`SliceRead` of a step request into its inputs.

    ``inputs``: ``{input node: (name, schema)}`` of the worker's circuit; ``local``: the sources
    only this worker knows (``{name: source}``, see :class:`LocalSource`)."""

    def __init__(self, inputs: dict, local: Optional[dict] = None):
        self.inputs = inputs
        self.local = dict(local or {})

    def _source(self, src: Any) -> Any:
        if isinstance(src, LocalSource):
            try:
                return self.local[src.name]
            except KeyError:
                raise KeyError(f"this worker has no local source {src.name!r} (it has: "
                               f"{sorted(self.local)})") from None
        return src

    def resolve(self, feed: dict) -> dict:
        """Read the slices of ``feed`` (a step request's ``{input node: ZSet}``, with the
        :data:`SLICES` entry) into it, in place; returns ``{input node: [(rows, crc), ...]}``."""
        reads = feed.pop(SLICES, None)
        if not reads:
            return {}
        report = {}
        for node, sr in reads.items():
            name, schema = self.inputs[node]
            src = self._source(sr.source)
            crcs = sr.checksum or sr.expect is not None
            batches, weights, rep = [], [], []
            unchecked = []  # (piece, its batch): taken as read, nulls checked once below
            for i, piece in enumerate(sr.pieces):
                try:
                    data = src.read(piece)
                except Exception as e:
                    raise SliceError(f"input '{name}': reading {piece!r}: "
                                     f"{type(e).__name__}: {e}") from None
                if data.num_rows == 0 and data.num_columns == 0:  # nothing, not even columns
                    batch, w = empty_batch(schema), np.zeros(0, np.int64)
                else:
                    batch, w = exact_batch(data, schema), None
                    if batch is None:
                        batch, w = _conform_piece(name, schema, data, piece)
                    else:
                        unchecked.append((piece, batch))
                if crcs:
                    crc = rows_crc(batch, np.ones(batch.num_rows, np.int64) if w is None else w)
                else:
                    crc = 0
                if sr.expect is not None:
                    rows0, crc0 = sr.expect[i]
                    if batch.num_rows != rows0 or crc != crc0:
                        raise SliceMismatch(
                            f"input '{name}': {piece!r} read again gave {batch.num_rows} rows "
                            f"(checksum {crc:#010x}), the input log recorded {rows0} rows "
                            f"(checksum {int(crc0):#010x}): the source changed under the log")
                rep.append((batch.num_rows, crc))
                if batch.num_rows:
                    batches.append(batch)
                    weights.append(w)
            report[node] = rep
            if not batches:
                continue
            have = feed.get(node)  # (rows the driver sent: conformed when pushed)
            if have is not None:
                batches.insert(0, have.data)
                weights.insert(0, have.weights)
            data = batches[0] if len(batches) == 1 else concat_batches(schema, batches)
            if unchecked and null_column(schema, data) is not None:
                for piece, b in unchecked:  # (the piece, column and row at fault)
                    _conform_piece(name, schema, b, piece)
            if all(x is None for x in weights):
                w = np.ones(data.num_rows, np.int64)
            elif len(weights) == 1:
                w = weights[0]
            else:
                w = np.concatenate([np.ones(b.num_rows, np.int64) if x is None else x
                                    for b, x in zip(batches, weights)])
            feed[node] = ZSet(data, w)
        return report

