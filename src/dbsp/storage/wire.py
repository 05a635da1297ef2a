"""Wire format for batches crossing a process boundary: a skeleton and out-of-band buffers.

A message is a header ``magic u32, nbuf u32, nmeta u64, body u64`` and a body of ``body``
bytes: ``nbuf`` u64 buffer lengths, ``nmeta`` bytes of skeleton, then the buffers, each part
starting at a multiple of 8 bytes (zero padding), so that a receiver reads a message in two
reads (header, body) into one allocation and every buffer is 8-byte aligned in it.

*Data messages* (magic :data:`MAGIC`: a step's input, a worker's outputs, an exchange's parts)
carry no pickle. Their skeleton is the message's tree of tuples, lists, dicts and scalars in
:mod:`marshal` form (C-speed both ways), where every Arrow record batch, numpy array, code array
and codec is a node ``(Ellipsis, kind, ...)`` naming the buffers that hold it:

* a record batch is its Arrow IPC record-batch message (``RecordBatch.serialize``: a slice
  writes only its rows; one memcpy, small beside the socket's) read back over the received
  memory by ``pa.ipc.read_record_batch`` with the schema of a per-schema plan (the schema's IPC
  bytes travel with it, the receiver keeps the parsed schema by those bytes); a large batch of
  flat columns (:func:`_flat_columns`) sends its column buffers as they are instead, with no
  copy, and is rebuilt column by column; a batch with dictionary columns goes as an IPC stream;
* a numpy array of plain dtype is its bytes; a :class:`~dbsp.algebra.codes.KeyCodec` its
  schema's IPC bytes (the receiver keeps one codec per schema);
* objects of the layers above (Z-sets, indexed batches) register how they are taken apart and
  put back (:func:`register`);
* anything else (a function, an exception, a checkpoint's state) is pickled where it sits (the
  pickle's bytes and its out-of-band buffers are buffers of the message).

This costs a few microseconds a message where pickling did ~60-80 (its Python callback on every
object, every column's buffers rebuilt one ``Array.from_buffers`` at a time, every codec
rebuilt from its schema). The walk over the skeleton's containers and plain numpy arrays, the
frames' layout and the body's split are native (:mod:`dbsp._native.skeleton`: a Python walk
cost a function call a node, half of a small message's codec); the kinds above (batches,
codecs, registered objects, pickles) stay here. The pickle path (magic :data:`MAGIC_PICKLE`,
:func:`dumps_pickled`) is kept as the reference the tests compare with and for anyone who asks
for it.
"""
from __future__ import annotations

import importlib
import io
import marshal
import pickle
import socket
import struct
import traceback
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from .._native import skeleton as _skeleton
from ..algebra.codes import KeyCodec, VarCodes

MAGIC = 0xDB5B0003         # a skeleton (marshal) and buffers: see the module doc
MAGIC_PICKLE = 0xDB5B0002  # a pickle (protocol 5) and its out-of-band buffers
_HEAD = struct.Struct("<IIQQ")  # magic, buffers, skeleton / pickle bytes, body bytes


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


def _frames(magic: int, meta: Any, raws: list) -> list:
    """The frames of a message: header, buffer lengths, ``meta`` (bytes-like), the buffers
    (byte-like, contiguous), each part padded to 8 bytes. Every frame is a bytes object or a
    flat memoryview of bytes (format ``B``), ready for ``sendmsg``."""
    return _skeleton.frames(magic, meta, raws)


def dumps_pickled(obj: Any) -> list:
    """``obj`` pickled (protocol 5, buffers out of band) as a list of byte-like frames: the
    reference path (see the module doc)."""
    bufs: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=bufs.append).dump(obj)
    return _frames(MAGIC_PICKLE, out.getbuffer(), [b.raw() for b in bufs])


def dumps(obj: Any) -> list:
    """``obj`` as a list of byte-like frames ready for ``sendmsg`` (the layout of the module
    doc)."""
    raws: list = []
    return _frames(MAGIC, marshal.dumps(_enc(obj, raws)), raws)


# -- the skeleton --------------------------------------------------------------------------
# A node (Ellipsis, kind, ...) stands for an object whose bytes are buffers of the message;
# every other tuple, list, dict and scalar is itself. A real tuple that starts with Ellipsis is
# the node (Ellipsis, "t", items...).
_BIG = 256  # a list or tuple longer than this is pickled whole (C beats a Python walk)
#: ``type -> (kind, get)``: objects of the layers above, taken apart by ``get(obj)`` into a
#: tuple of encodable values (None: pickle this one), see :func:`register`
_PARTS: dict = {}
#: ``"module:function" -> make``: ``make(*values)`` puts one back
_MAKE: dict = {}


def register(cls: type, get: Any, make: Any) -> None:
    """Objects of exactly type ``cls`` travel as ``get(obj)`` (a tuple of values this module
    encodes: batches, arrays, codecs, scalars, other registered objects; or None to pickle
    this one) and come back as ``make(*values)``. ``make`` is a module-level function of a
    ``dbsp`` module: the receiving process imports that module if it has not (as pickle finds a
    class by reference), so both sides need not have registered."""
    kind = f"{make.__module__}:{make.__qualname__}"
    if not kind.startswith("dbsp.") or "<" in kind:
        raise ValueError(f"wire.register: make must be a module-level function of a dbsp "
                         f"module, got {kind}")
    _PARTS[cls] = (kind, get)
    _MAKE[kind] = make


def _maker(kind: str) -> Any:
    make = _MAKE.get(kind)
    if make is None:
        mod, _, name = kind.partition(":")
        if not mod.startswith("dbsp.") or not name.isidentifier():
            raise WireError(f"message names an unknown maker {kind!r}")
        make = _MAKE[kind] = getattr(importlib.import_module(mod), name)
    return make


def _enc(o: Any, raws: list) -> Any:
    """The skeleton of ``o``; its buffers are appended to ``raws``. The walk over tuples,
    lists, dicts and the commonest numpy arrays is native (:mod:`dbsp._native.skeleton`);
    every other object comes back to :func:`_enc_object`."""
    return _WALK.encode(o, raws)


def _enc_object(o: Any, raws: list) -> Any:
    """The node of an object that is not an atom nor a container the walk descends into (a
    batch, an array, a registered object; a container too long or keyed by non-atoms)."""
    t = type(o)
    f = _ENC.get(t)
    if f is not None:
        got = f(o, raws)
        if got is not None:
            return got
    else:
        p = _PARTS.get(t)
        if p is not None:
            vals = p[1](o)
            if vals is not None:
                return (..., "o", p[0], _enc(vals, raws))
        elif isinstance(o, np.generic) and o.dtype.kind in _PLAIN:
            return (..., "s", o.dtype.str, o.tobytes())
    return _pickled(o, raws)


def _pickled(o: Any, raws: list) -> tuple:
    """``o`` pickled where it sits: the pickle and its out-of-band buffers are buffers
    ``i .. i + n`` of the message."""
    bufs: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=bufs.append).dump(o)
    i = len(raws)
    raws.append(out.getbuffer())
    raws.extend(b.raw() for b in bufs)
    return (..., "p", i, len(bufs))


def _enc_batch(b: pa.RecordBatch, raws: list) -> Optional[tuple]:
    plan = _plan_out(b.schema)
    if plan is None:  # dictionary columns: an IPC stream (the dictionaries with the batch)
        return None
    sb = plan[0]
    if plan[1] and b.num_rows * b.num_columns > _COLUMNS_FROM:
        cols = _flat_columns(b)
        if cols is not None:  # large: its buffers as they are, no copy
            spec = []
            for nulls, bufs in cols:
                idx = []
                for x in bufs:
                    if x is None:
                        idx.append(None)
                    else:
                        idx.append(len(raws))
                        raws.append(x.raw())
                spec.append((nulls, tuple(idx)))
            return (..., "c", sb, b.num_rows, tuple(spec))
    raws.append(b.serialize())
    return (..., "b", sb, len(raws) - 1)


#: past this many cells a batch of flat columns travels by its column buffers (no copy) rather
#: than as an IPC message (one memcpy of its rows, cheaper to read back below it)
_COLUMNS_FROM = 1 << 16


def _enc_array(a: np.ndarray, raws: list) -> Optional[tuple]:
    dt = a.dtype
    got = _DTYPE_STR.get(dt)
    if got is None:
        if dt.kind not in _PLAIN or dt.fields is not None:
            return None
        # numpy exports no buffer of datetimes and timedeltas: those are viewed as bytes
        got = _DTYPE_STR[dt] = (dt.str, dt.kind in "biufc")
    ds, flat = got
    if flat and a.ndim == 1:   # a step's arrays: no reshaped or viewed copy of the array
        m = memoryview(a)
        if m.c_contiguous:
            raws.append(m.cast("B"))
            return (..., "a", ds, a.shape, len(raws) - 1)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    raws.append(a.reshape(-1).view(np.uint8) if a.ndim else a.reshape(1).view(np.uint8))
    return (..., "a", ds, a.shape, len(raws) - 1)


#: ``dtype -> (dtype.str, its buffer can be exported)`` of the plain dtypes sent (a few; computing the string each time, and
#: parsing it back on the other side, cost more than a small array's bytes)
_DTYPE_STR: dict = {}
#: ``dtype.str -> dtype`` on the receiving side
_DTYPE_OF: dict = {}


def _enc_varcodes(v: VarCodes, raws: list) -> tuple:
    return (..., "v", _enc(v.offsets, raws), _enc(v.data, raws))


def _enc_codec(c: KeyCodec, raws: list) -> tuple:
    b = c.__dict__.get("_ipc")
    if b is None:
        b = c._ipc = pa.schema(c.fields).serialize().to_pybytes()
    return (..., "k", b)


_ENC = {pa.RecordBatch: _enc_batch, np.ndarray: _enc_array, VarCodes: _enc_varcodes,
        KeyCodec: _enc_codec}

_PLANS_OUT: list = []  # [(schema, plan)] of the schemas sent lately, the latest first
_PLANS_CACHE = 16


def _plan_out(schema: pa.Schema) -> Optional[tuple]:
    """``(schema IPC bytes, all columns flat-able)`` for ``schema``, or None when a batch of it
    goes as an IPC stream (dictionary columns). A step's batches come out of kernels with
    schema objects of their own, but a pipeline has few distinct schemas: they are looked up
    among the last few sent by identity, then by ``Schema.equals`` (C++, ~0.1 us; hashing a
    schema wraps every field in Python, ~5 us, and serialising it ~3.5 us)."""
    plans = _PLANS_OUT
    for i, (sch, plan) in enumerate(plans):
        if sch is schema or sch.equals(schema, check_metadata=True):
            if i:
                plans.insert(0, plans.pop(i))
            return plan
    if any(_has_dictionary(f.type) for f in schema):
        plan = None
    else:
        flat = all(pa.types.is_primitive(f.type) or pa.types.is_decimal(f.type)
                   or pa.types.is_fixed_size_binary(f.type) or f.type in _VAR for f in schema)
        plan = (schema.serialize().to_pybytes(), flat)
    plans.insert(0, (schema, plan))
    del plans[_PLANS_CACHE:]
    return plan


def _has_dictionary(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return True
    return any(_has_dictionary(t.field(i).type) for i in range(t.num_fields))


_CODECS_IN: dict = {}  # schema IPC bytes -> KeyCodec


def _codec_of(b: bytes) -> KeyCodec:
    c = _CODECS_IN.get(b)
    if c is None:
        if len(_CODECS_IN) >= _SCHEMA_CACHE:
            _CODECS_IN.clear()
        c = _CODECS_IN[b] = KeyCodec(list(_schema_of(b)))
        c._ipc = b
    return c


def _dec(s: Any, bufs: list) -> Any:
    """The object of skeleton ``s`` over the message's ``bufs`` (the native walk of
    :mod:`dbsp._native.skeleton`; each node goes to its maker in :data:`_DEC`)."""
    return _WALK.decode(s, bufs)


def _dec_batch(s: tuple, bufs: list) -> pa.RecordBatch:
    return pa.ipc.read_record_batch(pa.py_buffer(bufs[s[3]]), _schema_of(s[2]))


def _dec_columns(s: tuple, bufs: list) -> pa.RecordBatch:
    _, _, sb, n, spec = s
    return _record_batch_from_buffers(sb, n, [(nulls, [None if i is None else bufs[i]
                                                        for i in idx]) for nulls, idx in spec])


def _dec_array(s: tuple, bufs: list) -> np.ndarray:
    dt = _DTYPE_OF.get(s[2])
    if dt is None:
        dt = np.dtype(s[2])
        if dt.kind not in _PLAIN or dt.fields is not None:
            raise WireError(f"message names an array of dtype {s[2]!r}")
        if len(_DTYPE_OF) < _SCHEMA_CACHE:
            _DTYPE_OF[s[2]] = dt
    a = np.frombuffer(bufs[s[4]], dtype=dt)
    return a.reshape(s[3]) if len(s[3]) != 1 else a


def _dec_pickled(s: tuple, bufs: list) -> Any:
    i, n = s[2], s[3]
    return pickle.loads(bufs[i], buffers=bufs[i + 1:i + 1 + n])


def _dec_registered(s: tuple, bufs: list) -> Any:
    return _maker(s[2])(*_dec(s[3], bufs))


_DEC = {"b": _dec_batch, "c": _dec_columns, "a": _dec_array, "p": _dec_pickled,
        "o": _dec_registered,
        "t": lambda s, bufs: tuple([_dec(x, bufs) for x in s[2:]]),
        "v": lambda s, bufs: VarCodes(_dec(s[2], bufs), _dec(s[3], bufs)),
        "k": lambda s, bufs: _codec_of(s[2]),
        "s": lambda s, bufs: np.frombuffer(s[3], dtype=s[2])[0]}


#: the native walk, bound to this module's tables (filled as dtypes are first seen)
_WALK = _skeleton.Walker(_enc_object, _BIG, _DTYPE_STR, _DTYPE_OF, _DEC)


def _unpack_body(body: Any, head: tuple) -> Any:
    """The object of a message whose body (after the header) is ``body``; ``head``: its
    header's ``(magic, nbuf, nmeta)``."""
    magic, nbuf, nmeta = head[:3]
    try:
        meta, bufs = _skeleton.split_body(body, nbuf, nmeta)
    except ValueError as e:
        raise WireError(str(e)) from None
    if magic == MAGIC_PICKLE:
        return pickle.loads(meta, buffers=bufs)
    try:
        skeleton = marshal.loads(meta)
        return _dec(skeleton, bufs)
    except (ValueError, EOFError, TypeError, KeyError, IndexError) as e:
        raise WireError(f"bad message skeleton ({type(e).__name__}: {e})") from None


def _head(raw: bytes) -> tuple[int, int, int, int]:
    magic, nbuf, nmeta, body = _HEAD.unpack(raw)
    if magic != MAGIC and magic != MAGIC_PICKLE:
        raise WireError(f"bad message magic {magic:#x}")
    if 8 * nbuf + nmeta > body:
        raise WireError(f"bad message header ({nbuf} buffers, {nmeta} + {body} bytes)")
    return magic, nbuf, nmeta, body


def loads(message: Any) -> Any:
    """The object of one whole message (header and body, as :func:`dumps` frames joined)."""
    mv = memoryview(message).cast("B")
    head = _head(bytes(mv[:_HEAD.size]))
    if len(mv) != _HEAD.size + head[3]:
        raise WireError(f"message of {len(mv)} bytes, its header says {_HEAD.size + head[3]}")
    return _unpack_body(bytearray(mv[_HEAD.size:]), head)


def send(sock: socket.socket, obj: Any) -> int:
    """Send one message with scatter-gather writes (one ``sendmsg`` for all frames when the
    socket takes it all, which it does for anything up to the socket buffer)."""
    frames = dumps(obj)   # bytes and flat memoryviews (see _frames)
    total = sum(map(len, frames))
    sent = 0
    while frames:
        k = sock.sendmsg(frames[:_IOV_MAX])
        sent += k
        if sent == total:  # all of it (the rule for a message that fits the socket buffer)
            break
        while frames and k >= len(frames[0]):
            k -= len(frames[0])
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
    """``n`` bytes from ``sock`` (blocking), in ``buf`` (default: a new bytearray); one
    receive for all of them (``MSG_WAITALL``) where the socket is blocking, not one a segment."""
    buf = bytearray(n) if buf is None else buf
    mv = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(mv[got:], n - got, socket.MSG_WAITALL)
        if k == 0:
            raise WireError("connection closed by peer")
        got += k
    return buf


def recv(sock: socket.socket) -> Any:
    """Receive one message (blocking): two reads, the header and the whole body."""
    head = _head(bytes(_recv_exact(sock, _HEAD.size)))
    return _unpack_body(_recv_exact(sock, head[3], _buffer(head[3])), head)


#: the flag that makes one send or receive return at once on a blocking socket (POSIX)
_NOW = socket.MSG_DONTWAIT


class Receiver:
    """Incremental receive of one message (for ``poll`` loops).

    Call :meth:`feed` when the socket is readable; it returns True once the message is complete,
    then :meth:`value` decodes it. :meth:`feed` never blocks (``MSG_DONTWAIT``), so the socket
    may be blocking, and :meth:`wait` then reads the rest of the message blocking, with no poll
    (a transport that has nothing more to send).
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
                    k = self.sock.recv_into(memoryview(self._buf)[self._got:], need, _NOW)
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
            self._stage, self._buf, self._got = 1, _buffer(self._head[3]), 0

    def wait(self) -> None:
        """Read the rest of the message, blocking (the socket must be blocking): one receive
        for the header and one for the body (``MSG_WAITALL``), where a poll loop makes a poll
        and a receive of each."""
        while True:
            need = len(self._buf) - self._got
            if need:
                k = self.sock.recv_into(memoryview(self._buf)[self._got:], need,
                                        socket.MSG_WAITALL)
                if k == 0:
                    raise WireError("connection closed by peer")
                self._got += k
                continue
            if self._stage == 1:
                self._stage = 2
                return
            if self._stage == 2:
                return
            self._head = _head(bytes(self._buf))
            self._stage, self._buf, self._got = 1, _buffer(self._head[3]), 0

    def value(self) -> Any:
        return _unpack_body(self._buf, self._head)


class Sender:
    """Incremental send of one message (for ``poll`` loops): :meth:`pump` never blocks
    (``MSG_DONTWAIT``), whether the socket is blocking or not."""

    __slots__ = ("sock", "frames", "nbytes")

    def __init__(self, sock: socket.socket, obj: Any):
        self.sock = sock
        self.frames = frames = dumps(obj)   # bytes and flat memoryviews (see _frames)
        self.nbytes = sum(map(len, frames))

    def pump(self) -> bool:
        """Write what the socket takes now; True when everything is sent."""
        frames = self.frames
        while frames:
            try:
                k = self.sock.sendmsg(frames[:_IOV_MAX], (), _NOW)
            except (BlockingIOError, InterruptedError):
                return False
            if k == self.nbytes and len(frames) <= _IOV_MAX:  # all of it at once (the rule)
                frames.clear()
                return True
            while frames and k >= len(frames[0]):
                k -= len(frames[0])
                frames.pop(0)
            if k:
                frames[0] = frames[0][k:]
        return True
