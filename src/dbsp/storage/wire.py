"""Wire format for batches crossing a process boundary: pickle protocol 5, buffers out of band.

A message is a header ``magic u32, nbuf u32, npickle u64, body u64`` and a body of ``body``
bytes: ``nbuf`` u64 buffer lengths, the pickle bytes, then the buffers, each part starting at a
multiple of 8 bytes (zero padding), so that a receiver reads a message in two reads (header,
body) into one allocation and every buffer is 8-byte aligned in it. Numpy arrays and Arrow
buffers (record batches column by column, see :class:`_Pickler`) travel as raw bytes (no copy
into the pickle stream; one copy into the socket), and are rebuilt over the received memory
without another copy.
"""
from __future__ import annotations

import io
import pickle
import socket
import struct
import traceback
from typing import Any, Optional

import numpy as np
import pyarrow as pa

MAGIC = 0xDB5B0002
_HEAD = struct.Struct("<IIQQ")  # magic, buffers, pickle bytes, body bytes


class WireError(ConnectionError):
    """The peer closed the connection or sent something that is not a message."""


def portable_exception(e: BaseException) -> BaseException:
    """``e`` if it survives pickling (to be sent to another process), else a ``RuntimeError``
    that carries its type, message, notes and traceback as text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        r = RuntimeError(f"{type(e).__name__}: {e}")
        for n in getattr(e, "__notes__", []):
            r.add_note(n)
        r.add_note("".join(traceback.format_exception(e)))
        return r


class _Pickler(pickle.Pickler):
    """Pickle protocol 5, with Arrow record batches by their column buffers.

    A batch of flat columns (fixed-width, boolean, string / binary) travels as its schema (an
    Arrow IPC schema message, built once per schema) and, per column, the null count and the
    buffers that hold its rows, out of band: no copy on this side beyond the socket's, and the
    other side rebuilds every column over the received memory (``Array.from_buffers``). A slice
    sends only its rows' part of each buffer (a worker given half a batch does not receive all
    of it). This costs a few microseconds a column, where Arrow's own pickling rebuilds the
    schema, every field and every array through Python calls (57 us for a 3-column batch of
    2,500 rows) and the IPC stream writer copies every buffer (about 20 us for the same
    batch, 100 us and more for a few hundred KB).

    A string or binary column that is a slice sends its rows' characters and its offsets
    rebased to 0 (a copy of ``n + 1`` integers). Anything else (nested, dictionary or extension
    columns, a column with nulls sliced off a byte boundary) goes as one Arrow IPC stream
    message, which writes just the rows of a slice, read back without a copy.
    """

    def reducer_override(self, obj):
        if isinstance(obj, pa.RecordBatch):
            cols = _flat_columns(obj)
            if cols is not None:
                return _record_batch_from_buffers, (_schema_bytes(obj.schema), obj.num_rows,
                                                    cols)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, obj.schema) as w:
                w.write_batch(obj)
            return _record_batch_from_ipc, (pickle.PickleBuffer(sink.getvalue()),)
        if type(obj) is np.ndarray and obj.dtype.kind in _PLAIN and obj.ndim and \
                obj.flags.c_contiguous:
            # numpy's own reduce pickles the dtype object and goes through its generic path:
            # several times the cost of this for the small arrays of a step
            return _ndarray_from, (pickle.PickleBuffer(obj.view(np.uint8)), obj.dtype.str,
                                   obj.shape)
        return NotImplemented


_PLAIN = frozenset("biufcmM")  # dtype kinds that are plain bytes (no objects, no fields)


def _ndarray_from(buf, dtype: str, shape: tuple) -> np.ndarray:
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def _record_batch_from_ipc(buf) -> "pa.RecordBatch":
    return pa.ipc.open_stream(pa.py_buffer(buf)).read_next_batch()


_SCHEMA_IN: dict = {}    # IPC message -> pa.Schema
_SCHEMA_CACHE = 256      # schemas kept by the receiving side (a pipeline has a few dozen)
_LAST_OUT: tuple = (None, b"")   # the last schema sent and its IPC message


def _schema_bytes(schema: pa.Schema) -> bytes:
    """``schema`` as an Arrow IPC schema message. Serialised every time but for the schema
    object sent last: a lookup by schema costs more than that (hashing a ``pa.Schema`` wraps
    every field and type in Python, ~20 us for three columns, and a step's batches come out of
    kernels with schema objects of their own, so the hash is never reused); the receiving
    side keys its cache by these bytes."""
    global _LAST_OUT
    last = _LAST_OUT
    if last[0] is schema:
        return last[1]
    b = schema.serialize().to_pybytes()
    _LAST_OUT = (schema, b)
    return b


def _schema_of(b: bytes) -> pa.Schema:
    s = _SCHEMA_IN.get(b)
    if s is None:
        if len(_SCHEMA_IN) >= _SCHEMA_CACHE:
            _SCHEMA_IN.clear()
        s = _SCHEMA_IN[b] = pa.ipc.read_schema(pa.py_buffer(b))
    return s


def _flat_columns(batch: pa.RecordBatch) -> Optional[list]:
    """Per column ``(null count, [buffer or None])`` holding just its rows, or None when a
    column is not flat (see :class:`_Pickler`)."""
    out = []
    n = batch.num_rows
    for a in batch.columns:
        t = a.type
        off = a.offset
        bufs = a.buffers()
        nulls = a.null_count
        if pa.types.is_boolean(t) or (pa.types.is_primitive(t) and t.bit_width == 1):
            if off & 7:
                return None
            nb = (n + 7) >> 3
            parts = [None if nulls == 0 or bufs[0] is None else bufs[0].slice(off >> 3, nb),
                     bufs[1].slice(off >> 3, nb)]
        elif pa.types.is_primitive(t) or pa.types.is_decimal(t) or \
                pa.types.is_fixed_size_binary(t):
            if len(bufs) != 2 or (nulls and off & 7):
                return None
            w = t.byte_width
            parts = [None if nulls == 0 or bufs[0] is None else bufs[0].slice(off >> 3,
                                                                            (n + 7) >> 3),
                     bufs[1].slice(off * w, n * w)]
        elif t in _VAR:
            if len(bufs) != 3 or (nulls and off & 7):
                return None
            ow = _VAR[t]
            valid = None if nulls == 0 or bufs[0] is None else bufs[0].slice(off >> 3,
                                                                             (n + 7) >> 3)
            if off == 0:  # the rows' characters only: offsets start at 0 (not a slice)
                end = int.from_bytes(bufs[1].slice(n * ow, ow).to_pybytes(), "little")
                parts = [valid, bufs[1].slice(0, (n + 1) * ow), bufs[2].slice(0, end)]
            else:  # a slice (a worker's rows of a step dealt by key): its offsets rebased
                offs = np.frombuffer(bufs[1], _VAR_DT[ow], n + 1, off * ow)
                start, end = int(offs[0]), int(offs[n])
                parts = [valid, offs - offs[0], bufs[2].slice(start, end - start)]
        else:
            return None
        out.append((nulls, [None if b is None else pickle.PickleBuffer(b) for b in parts]))
    return out


_VAR = {pa.string(): 4, pa.binary(): 4, pa.large_string(): 8, pa.large_binary(): 8}
_VAR_DT = {4: np.dtype("<i4"), 8: np.dtype("<i8")}


def _record_batch_from_buffers(schema: bytes, n: int, cols: list) -> "pa.RecordBatch":
    sch = _schema_of(schema)
    if not cols:  # no column to carry the length (a global aggregate's keys): from_arrays
        # would make it 0 rows long
        return pa.RecordBatch.from_struct_array(pa.StructArray.from_buffers(
            pa.struct([]), n, [None])).replace_schema_metadata(sch.metadata)
    arrays = [pa.Array.from_buffers(f.type, n,
                                    [None if b is None else pa.py_buffer(b) for b in bufs],
                                    null_count=nulls)
              for f, (nulls, bufs) in zip(sch, cols)]
    return pa.RecordBatch.from_arrays(arrays, schema=sch)


def _pad8(n: int) -> int:
    return (n + 7) & ~7


_ZEROS = bytes(8)


def dumps(obj: Any) -> list:
    """``obj`` as a list of byte-like frames ready for ``sendmsg`` (the layout of the module
    doc)."""
    bufs: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=bufs.append).dump(obj)
    payload = out.getbuffer()
    raws = [b.raw() for b in bufs]
    lens = [r.nbytes for r in raws]
    npickle = len(payload)
    frames: list = [b"", struct.pack(f"<{len(lens)}Q", *lens), payload]
    body = 8 * len(lens) + _pad8(npickle)
    if npickle & 7:
        frames.append(_ZEROS[:8 - (npickle & 7)])
    for r, n in zip(raws, lens):
        frames.append(r)
        if n & 7:
            frames.append(_ZEROS[:8 - (n & 7)])
        body += _pad8(n)
    frames[0] = _HEAD.pack(MAGIC, len(lens), npickle, body)
    return frames


def _unpack_body(body: Any, nbuf: int, npickle: int) -> Any:
    """The object of a message whose body (after the header) is ``body``."""
    mv = memoryview(body)
    lens = struct.unpack_from(f"<{nbuf}Q", body) if nbuf else ()
    at = 8 * nbuf
    payload = mv[at:at + npickle]
    at += _pad8(npickle)
    bufs = []
    for n in lens:
        bufs.append(mv[at:at + n])
        at += _pad8(n)
    if at != len(body):
        raise WireError(f"message body of {len(body)} bytes does not match its layout ({at})")
    return pickle.loads(payload, buffers=bufs)


def _head(raw: bytes) -> tuple[int, int, int]:
    magic, nbuf, npickle, body = _HEAD.unpack(raw)
    if magic != MAGIC:
        raise WireError(f"bad message magic {magic:#x}")
    if 8 * nbuf + npickle > body:
        raise WireError(f"bad message header ({nbuf} buffers, {npickle} + {body} bytes)")
    return nbuf, npickle, body


def loads(message: Any) -> Any:
    """The object of one whole message (header and body, as :func:`dumps` frames joined)."""
    mv = memoryview(message).cast("B")
    nbuf, npickle, body = _head(bytes(mv[:_HEAD.size]))
    if len(mv) != _HEAD.size + body:
        raise WireError(f"message of {len(mv)} bytes, its header says {_HEAD.size + body}")
    return _unpack_body(bytearray(mv[_HEAD.size:]), nbuf, npickle)


def send(sock: socket.socket, obj: Any) -> int:
    """Send one message with scatter-gather writes (one ``sendmsg`` for all frames when the
    socket takes it all, which it does for anything up to the socket buffer)."""
    frames = [memoryview(f).cast("B") for f in dumps(obj)]
    total = sum(f.nbytes for f in frames)
    sent = 0
    while frames:
        k = sock.sendmsg(frames[:_IOV_MAX])
        sent += k
        while frames and k >= frames[0].nbytes:
            k -= frames[0].nbytes
            frames.pop(0)
        if k:
            frames[0] = frames[0][k:]
    assert sent == total
    return total


_IOV_MAX = 1024


def _buffer(n: int) -> Any:
    """``n`` writable bytes, not zeroed (a message body is read over all of them at once)."""
    return np.empty(n, np.uint8)


def _recv_exact(sock: socket.socket, n: int, buf: Any = None) -> Any:
    """``n`` bytes from ``sock`` (blocking), in ``buf`` (default: a new bytearray)."""
    buf = bytearray(n) if buf is None else buf
    mv = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(mv[got:], n - got)
        if k == 0:
            raise WireError("connection closed by peer")
        got += k
    return buf


def recv(sock: socket.socket) -> Any:
    """Receive one message (blocking): two reads, the header and the whole body."""
    nbuf, npickle, body = _head(bytes(_recv_exact(sock, _HEAD.size)))
    return _unpack_body(_recv_exact(sock, body, _buffer(body)), nbuf, npickle)


class Receiver:
    """Incremental receive of one message from a non-blocking socket (for ``select`` loops).

    Call :meth:`feed` when the socket is readable; it returns True once the message is complete,
    then :meth:`value` unpickles it.
    """

    __slots__ = ("sock", "_stage", "_buf", "_got", "_head")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._stage = 0  # 0 header, 1 body, 2 done
        self._buf = bytearray(_HEAD.size)
        self._got = 0
        self._head: tuple = ()

    def feed(self) -> bool:
        while True:
            need = len(self._buf) - self._got
            if need:
                try:
                    k = self.sock.recv_into(memoryview(self._buf)[self._got:], need)
                except (BlockingIOError, InterruptedError):
                    return False
                if k == 0:
                    raise WireError("connection closed by peer")
                self._got += k
                if k < need:
                    continue
            if self._stage == 1:
                self._stage = 2
                return True
            self._head = _head(bytes(self._buf))
            self._stage, self._buf, self._got = 1, _buffer(self._head[2]), 0

    def value(self) -> Any:
        nbuf, npickle, _ = self._head
        return _unpack_body(self._buf, nbuf, npickle)


class Sender:
    """Incremental send of one message on a non-blocking socket (for ``select`` loops)."""

    __slots__ = ("sock", "frames", "nbytes")

    def __init__(self, sock: socket.socket, obj: Any):
        self.sock = sock
        self.frames = [memoryview(f).cast("B") for f in dumps(obj)]
        self.nbytes = sum(f.nbytes for f in self.frames)

    def pump(self) -> bool:
        """Write what the socket takes now; True when everything is sent."""
        frames = self.frames
        while frames:
            try:
                k = self.sock.sendmsg(frames[:_IOV_MAX])
            except (BlockingIOError, InterruptedError):
                return False
            while frames and k >= frames[0].nbytes:
                k -= frames[0].nbytes
                frames.pop(0)
            if k:
                frames[0] = frames[0][k:]
        return True
