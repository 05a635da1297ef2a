"""Cursors: walking a batch, or all the batches of a spine, key by key and value by value.

The one cursor vocabulary of the project (after differential dataflow / Feldera):
``key_valid``, ``val_valid``, ``key``, ``val``, ``weight``, ``step_key``, ``seek_key``,
``step_val``, ``seek_val``, ``rewind_keys``, ``rewind_vals``. Keys are visited in code order
(:mod:`dbsp.algebra.codes`), the values of a key likewise. Seeks only move forward.

Operators do bulk, vectorised work on whole batches; cursors serve tests, inspection and walks
that are sequential by nature (top-k, rolling windows). They stay cheap anyway: positions are
integers into the batch's arrays, keys and values become Python tuples only when asked for
(:meth:`key`, :meth:`val`), and ``seek_*`` gallops (exponential then binary search, the last
step through ``K.lower_bound``) so a walk of sorted probes costs ``O(log distance)`` per probe.
``keys_between(lo, hi)`` is the vectorised way to read a key range as one batch.

Cursors:

* :class:`OrdZSetCursor` - over an :class:`OrdZSet`: the keys are the rows, each has one value,
  the unit ``()``, whose weight is the row's weight.
* :class:`OrdIndexedZSetCursor` - over an :class:`OrdIndexedZSet`.
* :class:`OrdKeyBatchCursor`, :class:`OrdValBatchCursor` - over the timed batches of
  :mod:`dbsp.trace.timed`; ``weight`` is the sum over times and :meth:`times` lists
  ``(time, weight)`` pairs.

The merging cursor over the batches of a spine snapshot is
:class:`~dbsp.trace.spine_cursor.SpineCursor`. This module knows no batch class: each batch
brings its own cursor (``batch.cursor()``), so the batch modules import their cursors from here
and not the other way round.

``seek_key`` / ``seek_val`` take either a Python tuple of column values or a code (``int`` for
u64 codes, ``bytes`` for var codes), as do ``keys_between`` bounds.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence, Union

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import Code, CodeArray, Codes, KeyCodec

KeyLike = Union[tuple, Code]

__all__ = ["Cursor", "OrdZSetCursor", "OrdIndexedZSetCursor", "OrdKeyBatchCursor",
           "OrdValBatchCursor", "cursor_for", "encode_tuple", "as_code", "row_of"]

_LINEAR = 32  # below this many rows a seek finishes with a Python binary search


class Cursor(Protocol):
    """What every cursor offers."""

    def key_valid(self) -> bool: ...
    def val_valid(self) -> bool: ...
    def key(self) -> tuple: ...
    def val(self) -> tuple: ...
    def weight(self) -> int: ...
    def key_code(self) -> Code: ...
    def step_key(self) -> None: ...
    def seek_key(self, key: KeyLike) -> None: ...
    def step_val(self) -> None: ...
    def seek_val(self, val: KeyLike) -> None: ...
    def rewind_keys(self) -> None: ...
    def rewind_vals(self) -> None: ...


# --- helpers ----------------------------------------------------------------------------------

def encode_tuple(codec: KeyCodec, values: Sequence[Any]) -> Code:
    """The code of one key given as a tuple of column values."""
    if len(values) != len(codec.fields):
        raise ValueError(f"expected {len(codec.fields)} values, got {len(values)}")
    cols = [pa.array([v], type=f.type) for f, v in zip(codec.fields, values)]
    c = codec.encode(cols, 1)
    return Codes.at(c, 0)


def as_code(codec: KeyCodec, k: KeyLike) -> Code:
    if isinstance(k, tuple):
        return encode_tuple(codec, k)
    if isinstance(k, (bytes, bytearray)):
        return bytes(k)
    return int(k)


def _gallop(codes: CodeArray, lo: int, hi: int, target: Code) -> int:
    """First position in ``[lo, hi)`` whose code is ``>= target`` (``hi`` if none), searching
    outwards from ``lo``: ``O(log(answer - lo))``."""
    if lo >= hi or Codes.at(codes, lo) >= target:  # type: ignore[operator]
        return lo
    prev, step = lo, 1  # codes[prev] < target
    while True:
        nxt = prev + step
        if nxt >= hi:
            end = hi
            break
        if Codes.at(codes, nxt) >= target:  # type: ignore[operator]
            end = nxt
            break
        prev, step = nxt, step << 1
    a, b = prev + 1, end
    if b - a > _LINEAR:
        return a + int(K.lower_bound(Codes.slice(codes, a, b), Codes.one(target, like=codes))[0])
    while a < b:
        m = (a + b) >> 1
        if Codes.at(codes, m) < target:  # type: ignore[operator]
            a = m + 1
        else:
            b = m
    return a


def row_of(batch: pa.RecordBatch, i: int) -> tuple:
    return tuple(c[i].as_py() for c in batch.columns)


def _key_range(codes: CodeArray, lo: Optional[Code], hi: Optional[Code]) -> tuple[int, int]:
    n = len(codes)
    a = 0 if lo is None else int(K.lower_bound(codes, Codes.one(lo, like=codes))[0])
    b = n if hi is None else int(K.lower_bound(codes, Codes.one(hi, like=codes))[0])
    return a, max(a, b)


# --- cursors over one batch -------------------------------------------------------------------

class _KeyValCursor:
    """Key and value navigation over an ordered layer of keys whose values are rows
    ``_off[k]:_off[k+1]`` of a value layer (shared by the indexed and the timed cursors)."""

    __slots__ = ("batch", "_kc", "_vc", "_off", "_nk", "_k", "_v", "_vend")

    def __init__(self, batch, key_offsets: np.ndarray):
        self.batch = batch
        self._kc, self._vc, self._off = batch.kcodes, batch.vcodes, key_offsets
        self._nk = batch.num_keys
        self.rewind_keys()

    def _enter_key(self) -> None:
        if self._k < self._nk:
            self._v = int(self._off[self._k])
            self._vend = int(self._off[self._k + 1])
        else:
            self._v = self._vend = 0

    # keys
    def key_valid(self) -> bool:
        return self._k < self._nk

    def key(self) -> tuple:
        return row_of(self.batch.keys, self._k)

    def key_code(self) -> Code:
        return Codes.at(self._kc, self._k)

    @property
    def key_index(self) -> int:
        return self._k

    def step_key(self) -> None:
        if self._k < self._nk:
            self._k += 1
            self._enter_key()

    def seek_key(self, key: KeyLike) -> None:
        self.seek_key_code(as_code(self.batch.kcodec, key))

    def seek_key_code(self, code: Code) -> None:
        k = _gallop(self._kc, self._k, self._nk, code)
        if k != self._k:
            self._k = k
            self._enter_key()

    def rewind_keys(self) -> None:
        self._k = 0
        self._enter_key()

    # values
    def val_valid(self) -> bool:
        return self._v < self._vend

    def val(self) -> tuple:
        return row_of(self.batch.vals, self._v)

    def val_code(self) -> Code:
        return Codes.at(self._vc, self._v)

    def step_val(self) -> None:
        if self._v < self._vend:
            self._v += 1

    def seek_val(self, val: KeyLike) -> None:
        self.seek_val_code(as_code(self.batch.vcodec, val))

    def seek_val_code(self, code: Code) -> None:
        self._v = _gallop(self._vc, self._v, self._vend, code)

    def rewind_vals(self) -> None:
        if self._k < self._nk:
            self._v = int(self._off[self._k])

    def val_range(self) -> tuple[int, int]:
        """Value rows ``[start, end)`` of the current key."""
        if self._k >= self._nk:
            return 0, 0
        return int(self._off[self._k]), int(self._off[self._k + 1])


class OrdIndexedZSetCursor(_KeyValCursor):
    """A cursor over one :class:`OrdIndexedZSet`."""

    __slots__ = ()

    def __init__(self, batch: Any):  # an OrdIndexedZSet
        super().__init__(batch, batch.offsets)

    def weight(self) -> int:
        return int(self.batch.weights[self._v])

    # bulk
    def keys_between(self, lo: Optional[KeyLike] = None,
                     hi: Optional[KeyLike] = None) -> Any:
        """The keys in ``[lo, hi)`` (None: unbounded) with their values, as a zero-copy slice."""
        c = self.batch.kcodec
        a, b = _key_range(self._kc, None if lo is None else as_code(c, lo),
                          None if hi is None else as_code(c, hi))
        return self.batch.slice_keys(a, b)


class OrdZSetCursor:
    """A cursor over one :class:`OrdZSet`: keys are rows, each with the single value ``()``."""

    __slots__ = ("batch", "_kc", "_nk", "_k", "_vdone")

    def __init__(self, batch: Any):  # an OrdZSet
        self.batch = batch
        self._kc = batch.codes
        self._nk = len(batch)
        self.rewind_keys()

    def key_valid(self) -> bool:
        return self._k < self._nk

    def key(self) -> tuple:
        return row_of(self.batch.data, self._k)

    def key_code(self) -> Code:
        return Codes.at(self._kc, self._k)

    @property
    def key_index(self) -> int:
        return self._k

    def step_key(self) -> None:
        if self._k < self._nk:
            self._k += 1
            self._vdone = False

    def seek_key(self, key: KeyLike) -> None:
        self.seek_key_code(as_code(self.batch.codec, key))

    def seek_key_code(self, code: Code) -> None:
        k = _gallop(self._kc, self._k, self._nk, code)
        if k != self._k:
            self._k = k
            self._vdone = False

    def rewind_keys(self) -> None:
        self._k = 0
        self._vdone = False

    def val_valid(self) -> bool:
        return self._k < self._nk and not self._vdone

    def val(self) -> tuple:
        return ()

    def weight(self) -> int:
        return int(self.batch.weights[self._k])

    def step_val(self) -> None:
        self._vdone = True

    def seek_val(self, val: KeyLike = ()) -> None:
        """Values are the unit: every seek target is at or before it (a no-op)."""

    def rewind_vals(self) -> None:
        self._vdone = False

    def keys_between(self, lo: Optional[KeyLike] = None,
                     hi: Optional[KeyLike] = None) -> Any:
        c = self.batch.codec
        a, b = _key_range(self._kc, None if lo is None else as_code(c, lo),
                          None if hi is None else as_code(c, hi))
        return self.batch.slice(a, b)


def cursor_for(batch) -> Any:
    """The cursor of a batch of any kind: every batch brings its own (``batch.cursor()``)."""
    make = getattr(batch, "cursor", None)
    if make is None:
        raise TypeError(f"no cursor for {type(batch).__name__}")
    return make()


# --- cursors over timed batches ---------------------------------------------------------------

class OrdKeyBatchCursor:
    """A cursor over an :class:`~dbsp.trace.timed.OrdKeyBatch`: each key has the single value
    ``()``; :meth:`weight` sums its times, :meth:`times` lists them."""

    def __init__(self, batch):
        self.batch = batch
        self._kc, self._nk = batch.kcodes, batch.num_keys
        self.rewind_keys()

    def key_valid(self) -> bool:
        return self._k < self._nk

    def key(self) -> tuple:
        return row_of(self.batch.keys, self._k)

    def key_code(self) -> Code:
        return Codes.at(self._kc, self._k)

    def step_key(self) -> None:
        if self._k < self._nk:
            self._k += 1
            self._vdone = False

    def seek_key(self, key: KeyLike) -> None:
        self.seek_key_code(as_code(self.batch.kcodec, key))

    def seek_key_code(self, code: Code) -> None:
        k = _gallop(self._kc, self._k, self._nk, code)
        if k != self._k:
            self._k, self._vdone = k, False

    def rewind_keys(self) -> None:
        self._k, self._vdone = 0, False

    def val_valid(self) -> bool:
        return self._k < self._nk and not self._vdone

    def val(self) -> tuple:
        return ()

    def step_val(self) -> None:
        self._vdone = True

    def seek_val(self, val: KeyLike = ()) -> None:
        pass

    def rewind_vals(self) -> None:
        self._vdone = False

    def times(self) -> list[tuple[int, int]]:
        o = self.batch.offsets
        a, b = int(o[self._k]), int(o[self._k + 1])
        return list(zip(self.batch.times[a:b].tolist(), self.batch.weights[a:b].tolist()))

    def weight(self) -> int:
        o = self.batch.offsets
        return int(self.batch.weights[int(o[self._k]):int(o[self._k + 1])].sum())


class OrdValBatchCursor(_KeyValCursor):
    """A cursor over an :class:`~dbsp.trace.timed.OrdValBatch`: :meth:`weight` sums the current
    value's times, :meth:`times` lists them."""

    __slots__ = ("_voff",)

    def __init__(self, batch):
        self._voff = batch.val_offsets
        super().__init__(batch, batch.key_offsets)

    def times(self) -> list[tuple[int, int]]:
        a, b = int(self._voff[self._v]), int(self._voff[self._v + 1])
        return list(zip(self.batch.times[a:b].tolist(), self.batch.weights[a:b].tolist()))

    def weight(self) -> int:
        a, b = int(self._voff[self._v]), int(self._voff[self._v + 1])
        return int(self.batch.weights[a:b].sum())
