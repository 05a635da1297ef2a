"""Row checksums: a CRC-32C of a batch's content that does not depend on how it is chunked.

:func:`content_crc` folds a RecordBatch or Table column by column; :func:`rows_crc` adds the
weights. Two batches with the same rows in the same order have the same value however they are
chunked, sliced or padded, and whatever lies under nulls. The input log records it for rows
logged by position (:class:`dbsp.ft.logs.Span`), and a worker that reads its own slice of a
source reports it (:mod:`dbsp.runtime.slices`) so that a replay can check the rows it reads
again. The CRC is the SSE4.2 instruction of :mod:`dbsp._native.block` (it releases the GIL on
large buffers).
"""
from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._native import block as _nb

__all__ = ["content_crc", "rows_crc", "crc32c"]


def crc32c(buf: Any, crc: int = 0) -> int:
    """CRC-32C of the bytes of ``buf`` (anything with the buffer protocol), continuing ``crc``."""
    return _nb.crc32c(memoryview(buf).cast("B"), crc)


def _zero(t: pa.DataType) -> Any:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.scalar("", t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.scalar(b"", t)
    if pa.types.is_boolean(t):
        return pa.scalar(False, t)
    return pa.scalar(0, t)


def _fixed_width(t: pa.DataType) -> int:
    """Bytes per value of a fixed-width type with one values buffer (0: another layout)."""
    if t.num_buffers != 2 or pa.types.is_boolean(t):
        return 0
    try:
        w = t.bit_width
    except ValueError:
        return 0
    return w // 8 if w and w % 8 == 0 else 0


def _column_crc(col: pa.ChunkedArray, crc: int) -> int:
    """Fold a column's values into ``crc``: its length, then (with nulls) its validity, then
    its values' lengths (strings and binaries), then its values. Each part is its own CRC
    stream over the chunks, so the value does not depend on the chunking; values are read
    from the arrays' buffers without copying where the layout allows (fixed-width values, the
    bytes of strings), independent of the arrays' offsets and of what lies under nulls."""
    t = col.type
    if isinstance(t, pa.ExtensionType):
        col = pa.chunked_array([c.storage for c in col.chunks], type=t.storage_type)
        t = t.storage_type
    crc = crc32c(struct.pack("<q", len(col)), crc)
    nulls = col.null_count > 0
    strings = pa.types.is_string(t) or pa.types.is_binary(t)
    large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    width = _fixed_width(t)
    if not (strings or large or width or pa.types.is_boolean(t)):
        # another layout (nested, dictionary, ...): the Arrow IPC form of the whole column
        # (which normalises offsets; null slots are written as they are)
        a = pa.concat_arrays(col.chunks) if col.num_chunks != 1 else col.chunk(0)
        sink = pa.BufferOutputStream()
        rb = pa.RecordBatch.from_arrays([a], ["c"])
        with pa.ipc.new_stream(sink, rb.schema) as wr:
            wr.write_batch(rb)
        return crc32c(sink.getvalue(), crc)
    c_valid = c_lens = c_vals = 0
    for a in col.chunks:
        n = len(a)
        if n == 0:
            continue
        if nulls:
            c_valid = crc32c(a.is_valid().to_numpy(zero_copy_only=False).view(np.uint8), c_valid)
            if a.null_count:
                a = pc.fill_null(a, _zero(t))  # what lies under a null is not content
        if pa.types.is_boolean(t):
            c_vals = crc32c(a.to_numpy(zero_copy_only=False).view(np.uint8), c_vals)
            continue
        bufs = a.buffers()
        off = a.offset
        if width:
            c_vals = crc32c(memoryview(bufs[1])[off * width:(off + n) * width], c_vals)
            continue
        ot = np.int64 if large else np.int32
        offs = np.frombuffer(bufs[1], dtype=ot, count=off + n + 1)[off:]
        c_lens = crc32c(np.diff(offs), c_lens)  # n * 4 or 8 bytes: small beside the values
        if bufs[2] is not None and offs[-1] > offs[0]:
            c_vals = crc32c(memoryview(bufs[2])[int(offs[0]):int(offs[-1])], c_vals)
    return crc32c(struct.pack("<III", c_valid, c_lens, c_vals), crc)


def rows_crc(batch: Any, weights: Any) -> int:
    """:func:`content_crc` of ``batch`` followed by its weights (int64): what a :class:`Span`
    (:mod:`dbsp.ft.logs`) records of the rows it stands for."""
    w = np.ascontiguousarray(weights, dtype=np.int64)
    return crc32c(w.view(np.uint8), content_crc(batch))


def content_crc(data: Any) -> int:
    """CRC-32C of the content of ``data`` (a RecordBatch or Table): column by column, each
    column's values in row order (:func:`_column_crc`). Two batches with the same rows in the
    same order have the same value however they are chunked, sliced or padded, and whatever
    lies under nulls."""
    if isinstance(data, pa.RecordBatch):
        cols = [pa.chunked_array([c], type=c.type) for c in data.columns]
    else:
        cols = list(data.columns)
    crc = crc32c(struct.pack("<q", len(cols)))
    for col in cols:
        crc = _column_crc(col, crc)
    return crc
